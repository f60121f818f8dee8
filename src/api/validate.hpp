// Validation the API's entry points share beyond the public validate() overloads of dash/attention.hpp.
// Like them, it never touches the GPU, and each failure names the argument and the rule.
#pragma once

#include "dash/attention.hpp"

namespace dash {

// kOk if `schedule` is one of kAllSchedules; kInvalidArgument naming its raw value otherwise (a Schedule cast
// from an out-of-range int must not reach the planner).
Status check_schedule(Schedule schedule);

}  // namespace dash
