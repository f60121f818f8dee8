// The device checks of the public API: check_current_device(), current_device_info() and the helpers in
// api/device.hpp. They return a Status instead of leaving a CUDA error behind, so a failed check never
// poisons a later, unrelated cudaGetLastError() of the caller. Device properties are read once per device
// ordinal into one process-wide DeviceInfoCache; every later call costs cudaGetDevice and a lookup.
#include "api/device.hpp"

#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

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

// "12.2" for the version number 12020.
std::string cuda_version_text(int version) {
  constexpr int kMajor = 1000;
  constexpr int kMinor = 10;
  return std::to_string(version / kMajor) + "." + std::to_string(version % kMajor / kMinor);
}

}  // namespace

Status check_device_count(cudaError_t count_error, const char* error_string, int count, int driver_version,
                          int runtime_version) {
  if (count_error == cudaSuccess && count > 0) return Status::success();
  // Without libcuda the runtime answers cudaErrorInsufficientDriver as it does for an old driver; only the
  // driver version (0 when no driver is loaded) tells the two apart.
  if (driver_version == 0) {
    return {StatusCode::kNoDevice,
            "no NVIDIA driver is installed (cudaDriverGetVersion found none); DASH needs a "
            "driver that supports CUDA " +
                cuda_version_text(runtime_version) + " or newer"};
  }
  if (count_error == cudaErrorInsufficientDriver) {
    return {StatusCode::kNoDevice,
            "the NVIDIA driver is too old: it supports CUDA up to " + cuda_version_text(driver_version) +
                ", but DASH was built with the CUDA " + cuda_version_text(runtime_version) +
                " runtime; update the driver to one for CUDA " + cuda_version_text(runtime_version) + " or newer"};
  }
  if (count_error == cudaErrorNoDevice || count_error == cudaSuccess) {
    return {StatusCode::kNoDevice, "no CUDA device is visible (the driver, for CUDA " +
                                       cuda_version_text(driver_version) +
                                       ", found none; check CUDA_VISIBLE_DEVICES and that a GPU is attached)"};
  }
  return {StatusCode::kNoDevice, std::string("no CUDA device is usable (cudaGetDeviceCount: ") +
                                     (error_string != nullptr ? error_string : "unknown error") + ")"};
}

Status check_device_properties(int device, const char* name, int major, int minor) {
  if (major == kRequiredComputeMajor && minor == kRequiredComputeMinor) return Status::success();
  std::ostringstream message;
  message << "DASH kernels need a Hopper GPU (compute capability " << kRequiredComputeMajor << "."
          << kRequiredComputeMinor << "); device " << device << " '" << (name != nullptr ? name : "") << "' is "
          << major << "." << minor;
  return {StatusCode::kUnsupportedDevice, message.str()};
}

Status DeviceInfoCache::find_or_read(int device, const DeviceInfo** info) {
  std::lock_guard lock(mutex_);
  if (const auto it = by_device_.find(device); it != by_device_.end()) {
    *info = &it->second;
    return Status::success();
  }
  DeviceInfo read{};
  if (Status s = read_(device, &read); !s.ok()) return s;
  *info = &by_device_.emplace(device, std::move(read)).first->second;
  return Status::success();
}

namespace {

// kOk if the runtime sees a device; otherwise check_device_count()'s diagnosis of why it sees none.
Status check_any_device() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count > 0) return Status::success();
  static_cast<void>(cudaGetLastError());  // the Status reports it
  // Neither query can fail: both only read a version (0 for the driver when there is none).
  int driver_version = 0;
  int runtime_version = 0;
  static_cast<void>(cudaDriverGetVersion(&driver_version));
  static_cast<void>(cudaRuntimeGetVersion(&runtime_version));
  return check_device_count(error, cudaGetErrorString(error), count, driver_version, runtime_version);
}

Status read_device_info(int device, DeviceInfo* info) {
  const RelaxedCaptureMode relaxed;  // once per device, and maybe under a capture (device.hpp)
  if (Status s = check_any_device(); !s.ok()) return s;
  cudaDeviceProp properties{};
  if (const cudaError_t error = cudaGetDeviceProperties(&properties, device); error != cudaSuccess) {
    return {StatusCode::kCudaError, take_cuda_error("cudaGetDeviceProperties(" + std::to_string(device) + ")", error)};
  }
  info->index = device;
  info->multiprocessor_count = properties.multiProcessorCount;
  info->compute_major = properties.major;
  info->compute_minor = properties.minor;
  info->name = properties.name;
  return Status::success();
}

// The current device's kept DeviceInfo, whatever its compute capability.
Status current_device(const DeviceInfo** info) {
  static DeviceInfoCache devices(read_device_info);
  int device = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) {
    std::string failure = take_cuda_error("cudaGetDevice", error);
    // Without a usable device cudaGetDevice fails too; the device count says why there is none.
    if (Status s = check_any_device(); !s.ok()) return s;
    return {StatusCode::kCudaError, std::move(failure)};
  }
  return devices.find_or_read(device, info);
}

}  // namespace

Status usable_current_device(const DeviceInfo** info) {
  if (Status s = current_device(info); !s.ok()) return s;
  const DeviceInfo& device = **info;
  if (Status s = check_device_properties(device.index, device.name.c_str(), device.compute_major, device.compute_minor);
      !s.ok()) {
    return s;
  }
  // Binds the device's primary context to this thread. A thread that has made no runtime call that needs
  // a context (torch's autograd device threads run a backward so) has none current, and the driver call
  // that encodes the TMA descriptors then fails (CUDA_ERROR_INVALID_CONTEXT) where a launch would have
  // bound it. cudaSetDevice of the current device costs well under a microsecond.
  if (const cudaError_t error = cudaSetDevice(device.index); error != cudaSuccess) {
    return {StatusCode::kCudaError, take_cuda_error("cudaSetDevice(" + std::to_string(device.index) + ")", error)};
  }
  return Status::success();
}

Status check_current_device() {
  const DeviceInfo* info = nullptr;
  return usable_current_device(&info);
}

Status current_device_info(DeviceInfo* info) {
  if (info == nullptr) return {StatusCode::kInvalidArgument, "current_device_info: info must not be null"};
  const DeviceInfo* kept = nullptr;
  if (Status s = current_device(&kept); !s.ok()) return s;
  *info = *kept;
  return Status::success();
}

RelaxedCaptureMode::RelaxedCaptureMode() : previous_(cudaStreamCaptureModeRelaxed) {
  // Exchanging a thread's mode cannot fail for a valid mode; a failure leaves the mode as it was.
  if (cudaThreadExchangeStreamCaptureMode(&previous_) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    previous_ = cudaStreamCaptureModeRelaxed;
  }
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (previous_ == cudaStreamCaptureModeRelaxed) return;  // nothing was exchanged, or relaxed before
  if (cudaThreadExchangeStreamCaptureMode(&previous_) != cudaSuccess) static_cast<void>(cudaGetLastError());
}

Status capture_advice(Status status, cudaStream_t stream) {
  if (status.code() != StatusCode::kCudaError) return status;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return status;
  }
  if (capture == cudaStreamCaptureStatusNone) return status;
  return {StatusCode::kCudaError,
          status.message() +
              " (the stream was being captured into a CUDA graph, and a device's first call does "
              "one-time work that the capture may refuse: make one call on the device before "
              "capturing)"};
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
