// Public API: the status type every DASH entry point returns.
// Entry points never throw and never abort on bad input; they return a Status whose message names the
// offending argument and the rule it broke.
#pragma once

#include <string>
#include <utility>

namespace dash {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,    // a pointer, size, stride or value breaks the API's contract
  kNotSupported,       // valid, but outside what this build supports (head dim, dtype)
  kNotAvailable,       // the library was built without the kernels this call needs
  kNoDevice,           // no CUDA device can be used: no driver, a driver older than the runtime, or none visible
  kUnsupportedDevice,  // the current device is not a Hopper (compute capability 9.0) GPU
  kWorkspaceTooSmall,  // the workspace is null or smaller than the size query returned
  kScheduleRejected,   // the requested schedule's preconditions fail for this shape
  kCudaError,          // a CUDA runtime call failed
  kWaitTimeout,        // an earlier backward on the device gave up its dQ order (its dQ is wrong); reported once
  kSeqlenExceedsMax,   // an earlier varlen call on the device had a sequence longer than its max_seqlen (its rows
                       // are NaN); reported once
  kRowIndexInvalid,    // an earlier merge_partial on the device had a row_index outside its accumulators or naming a
                       // row twice (its accumulators are NaN); reported once
  kCuSeqlensInvalid,   // an earlier varlen call on the device had cu_seqlens not starting at 0, decreasing or ending
                       // past the total (all its outputs are NaN); reported once
};

// Short stable name of a code, e.g. "invalid-argument".
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status success() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid-argument: q is null", or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace dash
