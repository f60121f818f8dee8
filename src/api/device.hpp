// Checks that need the CUDA runtime: whether the current device can run the kernels, and whether a pointer
// refers to memory the GPU can reach. The decisions on what the runtime reported (device count, driver
// version, device properties) are pure functions, so every outcome can be tested without a GPU.
//
// Each device's properties are read once per process (DeviceInfoCache): an entry is made only from a read
// that succeeded and is never changed or removed, so a hit needs no runtime call but cudaGetDevice.
//
// CUDA graph capture: a process's first call may be captured. The one-time work of a device's first call (reading
// its properties, allocating its fault record, loading kernels) is made in the relaxed capture mode
// (RelaxedCaptureMode), where the runtime runs it outside the capture instead of refusing it and invalidating the
// capture; a step that fails under capture says to make one call before capturing (capture_advice).
#pragma once

#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <driver_types.h>

#include "dash/attention.hpp"
#include "dash/status.hpp"

namespace dash {

// kOk if cudaGetDeviceCount returned `count_error` == cudaSuccess and `count` > 0. Otherwise kNoDevice with
// a message that tells the cases apart: no driver installed (`driver_version` 0, as cudaDriverGetVersion
// reports it), a driver older than the runtime this library was built with (`runtime_version`, from
// cudaRuntimeGetVersion; versions are 1000 * major + 10 * minor), no device visible, or another failure
// (quoting `error_string`).
Status check_device_count(cudaError_t count_error, const char* error_string, int count, int driver_version,
                          int runtime_version);

// kOk for a compute capability 9.0 device; kUnsupportedDevice naming the device and its capability otherwise.
Status check_device_properties(int device, const char* name, int major, int minor);

// DeviceInfo by device ordinal, each read by `read` at most once while it succeeds. Thread-safe.
class DeviceInfoCache {
 public:
  using Reader = std::function<Status(int device, DeviceInfo* info)>;
  explicit DeviceInfoCache(Reader read) : read_(std::move(read)) {}

  // Points *info at the kept DeviceInfo of `device`, reading it first if no call has yet read it. A failed
  // read keeps nothing (the next call reads again) and returns the reader's status. The pointer stays valid
  // for the cache's life.
  Status find_or_read(int device, const DeviceInfo** info);

 private:
  Reader read_;
  std::mutex mutex_;  // held during a read, so concurrent first calls on one device read it once
  std::unordered_map<int, DeviceInfo> by_device_;  // references to elements survive rehashing
};

// The current device from the process's DeviceInfoCache, which must be able to run the kernels: the status of
// check_current_device(), and on success *info pointing at the kept DeviceInfo.
Status usable_current_device(const DeviceInfo** info);

// Sets the calling thread's stream-capture mode to relaxed for its life, and back after: the runtime calls made
// meanwhile are not refused because a stream (of this or, in the global mode, of another thread) is being captured.
// Stream work made meanwhile is captured as always; only one-time work that is not stream work runs outside.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_;
};

// `status`, and if it is kCudaError while `stream` is being captured into a CUDA graph, with the advice to make one
// call on the device before capturing (the first call's one-time work is what a capture can refuse).
Status capture_advice(Status status, cudaStream_t stream);

// kOk if `p` is device, managed or registered host memory; kInvalidArgument if it is null or host memory
// CUDA does not know (the kernels would fault on it); kCudaError if the runtime cannot tell. `name` names
// the argument in the message. Call it only after check_current_device() succeeded.
Status check_device_pointer(const void* p, const char* name);

}  // namespace dash
