// Ordering waits that gave up (kernels/kernel_params.hpp, WaitTimeoutRecord). A backward's dQ writer waits for other
// CTAs' contributions to each dQ tile; a wait that outlives its bound (CTAs of a static schedule kept off their SMs
// by other kernels) gives up the order for the rest of its launch, which then ends with a wrong dQ instead of hanging
// the stream, and the first such wait fills its device's record. The host reads the record without a CUDA call or a
// synchronization, at the start of every backward on the device, and reports it there as kWaitTimeout, once.
//
// Invariants: one record per device, in host-mapped memory, allocated on the device's first backward and kept for
// the process's life; the device writes it only while `filled` is 0, and only the host clears `filled`.
#pragma once

#include "dash/status.hpp"
#include "kernels/kernel_params.hpp"

namespace dash {

// The variable that bounds a dQ ordering wait, in seconds; without it 10 minutes (wait_timeouts.cpp says why).
inline constexpr const char* kWaitTimeoutVariable = "DASH_WAIT_TIMEOUT_SECONDS";
// The longest bound it may set, one day: far past any real wait, and well inside the record's milliseconds.
inline constexpr double kMaxWaitTimeoutSeconds = 86400.0;

// *bound_ns from the variable's text: null for the default; otherwise a whole number of seconds or a decimal in
// (0, kMaxWaitTimeoutSeconds], at least a millisecond. kInvalidArgument naming the variable and the rule otherwise.
Status parse_wait_timeout(const char* text, long long* bound_ns);

// The process's bound: parse_wait_timeout of the variable as it was at the first call.
Status wait_bound_ns(long long* bound_ns);

// kWaitTimeout describing what `record` holds, which it then clears; kOk if it holds nothing. `device` names the
// device in the message.
Status take_wait_timeout(kernels::WaitTimeoutRecord& record, int device);

// *record: `device`'s record, made on the first call for the device (a CUDA call, hence kCudaError if it fails).
// Thread-safe; later calls make no CUDA call.
Status device_wait_timeout_record(int device, kernels::WaitTimeoutRecord** record);

}  // namespace dash
