// Faults the kernels detect and report through the device (kernels/kernel_params.hpp, FaultRecord): a dQ ordering
// wait that gave up, a varlen sequence longer than the call's maximum, varlen offsets out of order, and a merge's
// row_index outside its accumulators or naming a row twice. None can be seen on the host when the call is made (the
// wait happens on the device; cu_seqlens and row_index stay there), so the kernels poison the outputs they cannot
// vouch for with NaN and fill their device's record, and the host reports the record at the start of the next call
// on the device, from any thread: kWaitTimeout, kSeqlenExceedsMax, kCuSeqlensInvalid or kRowIndexInvalid, once.
//
// The bound of a dQ ordering wait: a backward's dQ writer waits for other CTAs' contributions to each dQ tile; a wait
// that outlives its bound (CTAs of a static schedule kept off their SMs by other kernels) gives up the order for the
// rest of its launch, which then ends instead of hanging the stream.
//
// Invariants: one record per device, in host-mapped memory, allocated on the device's first call and kept for the
// process's life; the device writes it only while its kind is kNone, and only the host clears the kind.
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

// The status describing what `record` holds, which it then clears: kWaitTimeout, kSeqlenExceedsMax, kCuSeqlensInvalid
// or kRowIndexInvalid with a message naming what happened and what to do; kOk if it holds nothing. `device` names the
// device in the message.
Status take_fault(kernels::FaultRecord& record, int device);

// *record: `device`'s record, made on the first call for the device (a CUDA call, hence kCudaError if it fails). The
// allocation is made in the relaxed stream-capture mode, so that a process's first call may be captured into a CUDA
// graph. Thread-safe; later calls make no CUDA call.
Status device_fault_record(int device, kernels::FaultRecord** record);

}  // namespace dash
