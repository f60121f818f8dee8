// Checks that need the CUDA runtime: whether the current device can run the kernels, and whether a pointer
// refers to memory the GPU can reach. The decision on device properties is a pure function, so it can be
// tested without a GPU.
#pragma once

#include "dash/status.hpp"

namespace dash {

// kOk for a compute capability 9.0 device; kUnsupportedDevice naming the device and its capability otherwise.
Status check_device_properties(int device, const char* name, int major, int minor);

// kOk if `p` is device, managed or registered host memory; kInvalidArgument if it is null or host memory
// CUDA does not know (the kernels would fault on it); kCudaError if the runtime cannot tell. `name` names
// the argument in the message. Call it only after check_current_device() succeeded.
Status check_device_pointer(const void* p, const char* name);

}  // namespace dash
