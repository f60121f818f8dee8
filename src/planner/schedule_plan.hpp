// Planner layer (host only): turns an attention shape into a SchedulePlan, checking each schedule's
// preconditions and saying which one fails, and picks the schedule that `auto` stands for.
#pragma once

#include <string>

#include "dash/types.hpp"
#include "schedule/mask.hpp"
#include "schedule/plan.hpp"

namespace dash {

// The tiled problem the backward kernel runs for `shape` (tile sizes from tile_config.hpp), under the shape's
// mask: causal and its sliding window (window_left, window_right) in the canonical form of canonical_mask()
// (mask.hpp), so that a window that reduces to the full or causal mask plans exactly as that mask does.
// group_splits = 0 picks choose_group_splits().
TiledProblem make_tiled_problem(const AttentionShape& shape, int group_splits = 0);
// The same with `window` in place of the shape's window fields (the planner's and the emulator's tests).
TiledProblem make_tiled_problem(const AttentionShape& shape, SlidingWindow window, int group_splits = 0);

// How many parts to split each GQA query-head group into: the fewest that still give at least
// kTargetJobs jobs (each part costs one fp32 dK/dV reduction in the postprocess kernel). The target is
// a fixed number, not the device's SM count, because the split fixes the order in which dK and dV
// are summed: results must not depend on which GPU runs them.
int choose_group_splits(int batch, int heads_kv, int group_size, int num_kv_tiles);
// Two waves of a 132-SM H100/H200.
inline constexpr long long kTargetJobs = 264;

struct PlanResult {
  SchedulePlan plan{};
  std::string rejected;  // empty when the schedule's preconditions hold; else the one that failed
  bool ok() const { return rejected.empty(); }
};

// Why symmetric shift cannot run on `problem`'s tiles, or empty: its consecutive key/value tiles' causal ranges must
// start block_kv / block_q query tiles apart, a whole number (false at d = 192's 64x96 and d = 256's 64x80 tiles).
// Dense and varlen plans refuse with this one message.
std::string symmetric_shift_tile_refusal(const TiledProblem& problem);

// The plan of `schedule` for `problem` on `num_sms` persistent CTAs. kAuto, or a value outside the enum, is
// rejected (resolve kAuto with plan_schedule() or choose_schedule()).
PlanResult make_schedule_plan(const TiledProblem& problem, Schedule schedule, int num_sms);

// What Schedule::kAuto runs: the schedule measured fastest for the problem's class (mask, query
// heads per job, tile shape, key/value tiles per head), if its preconditions hold, else one that
// always applies; and why, in a sentence for `dash-attn plan` (measurements in schedule_plan.cpp).
struct AutoChoice {
  Schedule schedule;
  const char* reason;
};
AutoChoice choose_auto(const TiledProblem& problem, int num_sms);
inline Schedule choose_schedule(const TiledProblem& problem, int num_sms) {
  return choose_auto(problem, num_sms).schedule;
}

// make_schedule_plan, resolving kAuto first.
PlanResult plan_schedule(const TiledProblem& problem, Schedule schedule, int num_sms);

}  // namespace dash
