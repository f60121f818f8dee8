// The validator's checks (validator.hpp) run straight from a plan's schedule functions, with no
// ExpandedSchedule: the same findings, worded the same and found in the same order, for any plan.
//
// It walks the visits in the expansion's order (units ascending, then jobs, then steps) once per check,
// calling make_job, q_tile_at and rank_of as the kernels do, and keeps only what each check needs: one bit
// per tile visit for the rank permutation, a few integers per dQ tile, per query tile and per CTA. The
// expansion keeps dozens of bytes per visit; this keeps one bit. Deadlock freedom under static dispatch is
// decided by running the CTAs' semaphore waits to completion (a token game without time): by the argument
// in validator.hpp every maximal execution runs the same steps, so this one stops where the simulator
// stops, at the same step of each CTA.
//
// prove_plan() (plan_proof.hpp) falls back on it when its faster sufficient conditions do not hold.
#pragma once

#include <string>

#include "schedule/plan.hpp"

namespace dash {

// validate_schedule(expand_schedule(plan)).summary(): "valid", or the first finding ("coverage: ...",
// "ranks: ...", "deadlock: ..."). Needs plan.num_ctas >= 1 and a dispatch of the enum.
std::string streamed_validation_summary(const SchedulePlan& plan);

// Schedule functions other than schedule.hpp's, for tests: each check must find what it is there to find,
// worded as the validator words it, whatever the functions return.
class ScheduleFunctions {
 public:
  virtual ~ScheduleFunctions() = default;
  virtual Job job(const SchedulePlan& plan, int unit, int sub) const = 0;
  virtual int q_tile(const SchedulePlan& plan, const Job& job, int step) const = 0;
  virtual int rank(const SchedulePlan& plan, const Job& job, int v) const = 0;
};

// The same checks enumerating `functions` in place of make_job, q_tile_at and rank_of.
std::string streamed_validation_summary(const SchedulePlan& plan, const ScheduleFunctions& functions);

}  // namespace dash
