// Common layer (dash_common): the names of the public types of dash/types.hpp (dtype_name, schedule_name and
// parse_schedule) and packed_strides. Each switch names every enumerator and has no default (-Werror=switch);
// the return after it answers only a value cast from outside the enum.
#include <optional>
#include <string>
#include <string_view>

#include "dash/types.hpp"

namespace dash {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
  }
  return "unknown-dtype";
}

std::string_view schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::kAuto:
      return "auto";
    case Schedule::kAscending:
      return "ascending";
    case Schedule::kDescending:
      return "descending";
    case Schedule::kShortestFirst:
      return "shortest-first";
    case Schedule::kShift:
      return "shift";
    case Schedule::kSymmetricShift:
      return "symmetric-shift";
    case Schedule::kNondeterministic:
      return "nondeterministic";
  }
  return "unknown-schedule";
}

std::optional<Schedule> parse_schedule(std::string_view name) {
  for (Schedule s : kAllSchedules) {
    if (schedule_name(s) == name) return s;
  }
  return std::nullopt;
}

Status parse_schedule(std::string_view name, Schedule* schedule) {
  if (schedule == nullptr) return {StatusCode::kInvalidArgument, "parse_schedule: output pointer is null"};
  if (const auto parsed = parse_schedule(name)) {
    *schedule = *parsed;
    return Status::success();
  }
  std::string valid;
  for (Schedule s : kAllSchedules) valid += (valid.empty() ? "" : ", ") + std::string(schedule_name(s));
  return {StatusCode::kInvalidArgument, "unknown schedule '" + std::string(name) + "' (valid: " + valid + ")"};
}

Strides packed_strides(int64_t seqlen, int64_t heads, int64_t head_dim) {
  return Strides{seqlen * heads * head_dim, heads * head_dim, head_dim, 1};
}

}  // namespace dash
