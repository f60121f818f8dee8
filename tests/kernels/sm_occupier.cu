// SmOccupier (sm_occupier.hpp): one CTA per held SM, spinning on a flag in mapped host memory. Each CTA reports
// with plain stores to a slot of its own (system-scope atomics on host memory are not promised over PCIe).
#include <chrono>
#include <string>
#include <thread>

#include <cuda_runtime.h>

#include "sm_occupier.hpp"

namespace dash::testing {
namespace {

constexpr int kThreads = 32;
constexpr unsigned kSleepNs = 2000;

// Mapped host memory: [0] release, then per CTA: started, then per CTA: left on its time bound.
constexpr int kRelease = 0;
int started_slot(int cta) { return 1 + cta; }
__host__ __device__ int timed_out_slot(int cta, int ctas) { return 1 + ctas + cta; }
int flag_count(int ctas) { return 1 + 2 * ctas; }

__device__ unsigned long long global_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void occupy_kernel(volatile int* flags, unsigned long long hold_ns) {
  extern __shared__ unsigned char shared[];
  if (threadIdx.x != 0) return;
  shared[0] = 1;  // the allocation is what holds the SM; touch it so nothing is optimized away
  flags[1 + blockIdx.x] = 1;
  __threadfence_system();
  const unsigned long long begin = global_ns();
  while (flags[kRelease] == 0) {
    if (global_ns() - begin > hold_ns) {
      flags[timed_out_slot(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x))] = 1;
      __threadfence_system();
      return;
    }
    __nanosleep(kSleepNs);
  }
}

std::string error_text(cudaError_t error, const char* what) {
  cudaGetLastError();
  return std::string(what) + ": " + cudaGetErrorString(error);
}

template <class Done>
bool wait_for(const std::chrono::steady_clock::time_point deadline, const Done& done) {
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

std::chrono::steady_clock::time_point after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

std::string SmOccupier::unavailable_reason() { return {}; }

std::string SmOccupier::start(int sms, double hold_seconds, double start_seconds) {
  if (running_ || host_flags_ != nullptr) return "this SmOccupier was started already";
  int device = 0;
  int shared_optin = 0;
  int multiprocessors = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return error_text(e, "cudaGetDevice");
  if (cudaError_t e = cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      e != cudaSuccess) {
    return error_text(e, "cudaDeviceGetAttribute");
  }
  if (cudaError_t e = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess) {
    return error_text(e, "cudaDeviceGetAttribute");
  }
  if (sms < 1 || sms >= multiprocessors) {
    return "cannot hold " + std::to_string(sms) + " of " + std::to_string(multiprocessors) + " SMs";
  }
  void* host = nullptr;
  const int flags = flag_count(sms);
  if (cudaError_t e = cudaHostAlloc(&host, static_cast<size_t>(flags) * sizeof(int), cudaHostAllocMapped);
      e != cudaSuccess) {
    return error_text(e, "cudaHostAlloc");
  }
  host_flags_ = static_cast<volatile int*>(host);
  for (int i = 0; i < flags; ++i) host_flags_[i] = 0;
  ctas_ = sms;
  void* device_pointer = nullptr;
  if (cudaError_t e = cudaHostGetDevicePointer(&device_pointer, host, 0); e != cudaSuccess) {
    return error_text(e, "cudaHostGetDevicePointer");
  }
  device_flags_ = static_cast<int*>(device_pointer);
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
    return error_text(e, "cudaStreamCreateWithFlags");
  }
  if (cudaError_t e = cudaFuncSetAttribute(occupy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_optin);
      e != cudaSuccess) {
    return error_text(e, "cudaFuncSetAttribute");
  }
  const auto hold_ns = static_cast<unsigned long long>(hold_seconds * 1e9);
  occupy_kernel<<<sms, kThreads, static_cast<size_t>(shared_optin), stream_>>>(device_flags_, hold_ns);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return error_text(e, "occupy_kernel launch");
  running_ = true;
  if (!wait_for(after(start_seconds), [&] { return count(started_slot(0)) == sms; })) {
    const int started = count(started_slot(0));
    release();
    return "only " + std::to_string(started) + " of " + std::to_string(sms) + " occupying CTAs started within " +
           std::to_string(start_seconds) + " s (is another process using the GPU?)";
  }
  return {};
}

int SmOccupier::count(int first) const {
  int set = 0;
  for (int cta = 0; cta < ctas_; ++cta) set += host_flags_[first + cta] != 0;
  return set;
}

bool SmOccupier::holding() const {
  return running_ && host_flags_[kRelease] == 0 && count(timed_out_slot(0, ctas_)) == 0 &&
         cudaStreamQuery(stream_) == cudaErrorNotReady;
}

bool SmOccupier::release(double seconds) {
  if (!running_) return true;
  host_flags_[kRelease] = 1;
  const bool left = wait_for(after(seconds), [&] { return cudaStreamQuery(stream_) != cudaErrorNotReady; });
  if (left) running_ = false;
  return left;
}

SmOccupier::~SmOccupier() {
  // The CTAs leave on their own time bound at the latest: waiting past it is not needed to free safely, but the
  // memory they read must outlive them.
  if (running_ && !release()) cudaStreamSynchronize(stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (host_flags_ != nullptr) cudaFreeHost(const_cast<int*>(host_flags_));
}

}  // namespace dash::testing
