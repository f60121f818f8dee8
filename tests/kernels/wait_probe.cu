// semaphore_wait_outcome (wait_probe.hpp): the kernels' own wait_semaphore in a one-thread kernel.
#include <cuda_runtime.h>

#include <string>

#include "kernels/sm90/primitives.cuh"
#include "wait_probe.hpp"

namespace dash::testing {
namespace {

__global__ void semaphore_wait_kernel(const int* semaphore, int expected, long long bound_ns) {
  sm90::wait_semaphore(semaphore, expected, bound_ns);
}

}  // namespace

std::string wait_probe_unavailable_reason() { return {}; }

std::string semaphore_wait_outcome(int value, int expected, long long bound_ns) {
  int* semaphore = nullptr;
  if (const cudaError_t e = cudaMalloc(&semaphore, sizeof(int)); e != cudaSuccess) return cudaGetErrorName(e);
  cudaError_t outcome = cudaMemcpy(semaphore, &value, sizeof(int), cudaMemcpyHostToDevice);
  if (outcome == cudaSuccess) {
    semaphore_wait_kernel<<<1, 1>>>(semaphore, expected, bound_ns);
    outcome = cudaGetLastError();
  }
  if (outcome == cudaSuccess) outcome = cudaDeviceSynchronize();
  cudaFree(semaphore);
  return cudaGetErrorName(outcome);
}

}  // namespace dash::testing
