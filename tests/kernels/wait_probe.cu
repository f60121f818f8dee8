// semaphore_wait_outcome (wait_probe.hpp): the kernels' own wait_semaphore in a one-thread kernel.
#include <chrono>
#include <string>

#include <cuda_runtime.h>

#include "kernels/sm90/primitives.cuh"
#include "wait_probe.hpp"

namespace dash::testing {
namespace {

__global__ void semaphore_wait_kernel(const int* semaphore, int expected, const int* abandoned, long long bound_ns,
                                      int* in_order) {
  *in_order = sm90::wait_semaphore(semaphore, expected, abandoned, bound_ns) ? 1 : 0;
}

}  // namespace

std::string wait_probe_unavailable_reason() { return {}; }

WaitOutcome semaphore_wait_outcome(int value, int expected, int abandoned, long long bound_ns) {
  WaitOutcome outcome;
  int* words = nullptr;  // the semaphore, the abandoned flag, the kernel's answer
  if (const cudaError_t e = cudaMalloc(&words, 3 * sizeof(int)); e != cudaSuccess) {
    outcome.error = cudaGetErrorName(e);
    return outcome;
  }
  const int initial[3] = {value, abandoned, -1};
  cudaError_t error = cudaMemcpy(words, initial, sizeof(initial), cudaMemcpyHostToDevice);
  const auto begin = std::chrono::steady_clock::now();
  if (error == cudaSuccess) {
    semaphore_wait_kernel<<<1, 1>>>(words, expected, words + 1, bound_ns, words + 2);
    error = cudaGetLastError();
  }
  if (error == cudaSuccess) error = cudaDeviceSynchronize();
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  int answer = -1;
  if (error == cudaSuccess) error = cudaMemcpy(&answer, words + 2, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(words);
  outcome.error = cudaGetErrorName(error);
  outcome.in_order = answer == 1;
  return outcome;
}

}  // namespace dash::testing
