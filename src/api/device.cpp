// The device checks of the public API: check_current_device() and the helpers in api/device.hpp. They
// return a Status instead of leaving a CUDA error behind, so a failed check never poisons a later,
// unrelated cudaGetLastError() of the caller.
#include "api/device.hpp"

#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

#include "api/limits.hpp"
#include "dash/attention.hpp"

namespace dash {
namespace {

// "call: error string". A failed runtime call also records itself as the thread's last error; that is cleared,
// since the Status built from this text now reports the error.
std::string take_cuda_error(const std::string& call, cudaError_t error) {
  static_cast<void>(cudaGetLastError());
  return call + ": " + cudaGetErrorString(error);
}

}  // namespace

Status check_device_properties(int device, const char* name, int major, int minor) {
  if (major == kRequiredComputeMajor && minor == kRequiredComputeMinor) return Status::success();
  std::ostringstream message;
  message << "DASH kernels need a Hopper GPU (compute capability " << kRequiredComputeMajor << "."
          << kRequiredComputeMinor << "); device " << device << " '" << (name != nullptr ? name : "") << "' is "
          << major << "." << minor;
  return {StatusCode::kUnsupportedDevice, message.str()};
}

Status check_current_device() {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return {StatusCode::kNoDevice, "no CUDA device is visible (" + take_cuda_error("cudaGetDeviceCount", error) + ")"};
  }
  if (count == 0) return {StatusCode::kNoDevice, "no CUDA device is visible (cudaGetDeviceCount found 0 devices)"};
  int device = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) {
    return {StatusCode::kCudaError, take_cuda_error("cudaGetDevice", error)};
  }
  cudaDeviceProp properties{};
  if (const cudaError_t error = cudaGetDeviceProperties(&properties, device); error != cudaSuccess) {
    return {StatusCode::kCudaError, take_cuda_error("cudaGetDeviceProperties(" + std::to_string(device) + ")", error)};
  }
  return check_device_properties(device, properties.name, properties.major, properties.minor);
}

Status check_device_pointer(const void* p, const char* name) {
  if (p == nullptr) return {StatusCode::kInvalidArgument, std::string(name) + " must not be null"};
  cudaPointerAttributes attributes{};
  if (const cudaError_t error = cudaPointerGetAttributes(&attributes, p); error != cudaSuccess) {
    return {StatusCode::kCudaError, take_cuda_error("cudaPointerGetAttributes(" + std::string(name) + ")", error)};
  }
  if (attributes.type == cudaMemoryTypeUnregistered) {
    std::ostringstream message;
    message << name << " (" << p << ") is host memory unknown to CUDA; it must point to device, managed or "
            << "registered host memory";
    return {StatusCode::kInvalidArgument, message.str()};
  }
  return Status::success();
}

}  // namespace dash
