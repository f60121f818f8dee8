// Common layer (dash_common): Status and the names of its codes (dash/status.hpp). The switch names every code
// and has no default (-Werror=switch); the return after it answers only a value cast from outside the enum.
#include "dash/status.hpp"

#include <string>

namespace dash {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid-argument";
    case StatusCode::kNotSupported:
      return "not-supported";
    case StatusCode::kNotAvailable:
      return "not-available";
    case StatusCode::kNoDevice:
      return "no-device";
    case StatusCode::kUnsupportedDevice:
      return "unsupported-device";
    case StatusCode::kWorkspaceTooSmall:
      return "workspace-too-small";
    case StatusCode::kScheduleRejected:
      return "schedule-rejected";
    case StatusCode::kCudaError:
      return "cuda-error";
    case StatusCode::kWaitTimeout:
      return "wait-timeout";
    case StatusCode::kSeqlenExceedsMax:
      return "seqlen-exceeds-max";
    case StatusCode::kRowIndexInvalid:
      return "row-index-invalid";
    case StatusCode::kCuSeqlensInvalid:
      return "cu-seqlens-invalid";
  }
  return "unknown-status";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace dash
