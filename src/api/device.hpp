// Checks that need the CUDA runtime: whether the current device can run the kernels, and whether a pointer
// refers to memory the GPU can reach. The decisions on what the runtime reported (device count, driver
// version, device properties) are pure functions, so every outcome can be tested without a GPU.
//
// Each device's properties are read once per process (DeviceInfoCache): an entry is made only from a read
// that succeeded and is never changed or removed, so a hit needs no runtime call but cudaGetDevice.
#pragma once

#include <driver_types.h>

#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>

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

// kOk if `p` is device, managed or registered host memory; kInvalidArgument if it is null or host memory
// CUDA does not know (the kernels would fault on it); kCudaError if the runtime cannot tell. `name` names
// the argument in the message. Call it only after check_current_device() succeeded.
Status check_device_pointer(const void* p, const char* name);

}  // namespace dash
