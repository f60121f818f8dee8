// The "proven on the CPU before it runs on the GPU" rule of the API: every schedule plan passes the
// validator (coverage, rank permutation, deadlock freedom) before its first launch. Results are
// cached per plan, so a training loop that repeats shapes pays the proof once.
#pragma once

#include "dash/status.hpp"
#include "schedule/plan.hpp"

namespace dash {

// kOk if `plan` was proven safe (now or earlier); kScheduleRejected with the validator's finding if not.
Status prove_schedule(const SchedulePlan& plan);

}  // namespace dash
