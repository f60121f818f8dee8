// The one entry point to every schedule: run-time dispatch on plan.kind over the schedule families.
// Used unchanged by the CPU planner, validator and emulator and by the GPU kernels.
#pragma once

#include "schedule/kv_order_schedules.hpp"
#include "schedule/plan.hpp"
#include "schedule/shift_schedules.hpp"

namespace dash {

// Each switch below names every Schedule and has no default (-Werror=switch holds them to that): a new
// schedule must be given its own functions rather than silently run another's. kAuto never reaches a plan
// (make_schedule_plan refuses it), and neither does a value outside the enum (the API validates the
// schedule first); such a plan gets no jobs, so the validator's coverage check refuses it before any launch.

// Job `sub` (0 or 1) of work unit `unit`. Check job.valid: a unit may hold fewer jobs than
// plan.jobs_per_unit.
DASH_HOST_DEVICE Job make_job(const SchedulePlan& plan, int unit, int sub) {
  switch (plan.kind) {
    case Schedule::kAscending:
      return AscendingSchedule::make_job(plan, unit);
    case Schedule::kDescending:
      return DescendingSchedule::make_job(plan, unit);
    case Schedule::kShortestFirst:
      return ShortestFirstSchedule::make_job(plan, unit);
    case Schedule::kShift:
      return ShiftSchedule::make_job(plan, unit);
    case Schedule::kSymmetricShift:
      return SymmetricShiftSchedule::make_job(plan, unit, sub);
    case Schedule::kNondeterministic:
      return NondeterministicSchedule::make_job(plan, unit);
    case Schedule::kAuto:
      break;
  }
  return Job{};  // valid == false: no job
}

// The (virtual) query tile `job` visits at `step`, for step in [0, job.num_steps).
DASH_HOST_DEVICE int q_tile_at(const SchedulePlan& plan, const Job& job, int step) {
  switch (plan.kind) {
    case Schedule::kAscending:
      return AscendingSchedule::q_tile_at(job, step);
    case Schedule::kDescending:
      return DescendingSchedule::q_tile_at(job, step);
    case Schedule::kShortestFirst:
      return ShortestFirstSchedule::q_tile_at(job, step);
    case Schedule::kShift:
      return ShiftSchedule::q_tile_at(plan, job, step);
    case Schedule::kSymmetricShift:
      return SymmetricShiftSchedule::q_tile_at(plan, job, step);
    case Schedule::kNondeterministic:
      return NondeterministicSchedule::q_tile_at(plan, job, step);
    case Schedule::kAuto:
      break;
  }
  return -1;  // never reached: make_job gives such a plan no job to ask about
}

// Position of `job`'s partial dQ for query tile v in that tile's summation order, or kUnordered.
DASH_HOST_DEVICE int rank_of(const SchedulePlan& plan, const Job& job, int v) {
  switch (plan.kind) {
    case Schedule::kAscending:
      return AscendingSchedule::rank_of(plan, job, v);
    case Schedule::kDescending:
      return DescendingSchedule::rank_of(plan, job, v);
    case Schedule::kShortestFirst:
      return ShortestFirstSchedule::rank_of(plan, job, v);
    case Schedule::kShift:
      return ShiftSchedule::rank_of(job, v);
    case Schedule::kSymmetricShift:
      return SymmetricShiftSchedule::rank_of(plan, job, v);
    case Schedule::kNondeterministic:
      return kUnordered;
    case Schedule::kAuto:
      break;
  }
  return -1;  // never reached: make_job gives such a plan no job to ask about
}

// Whether gradients under `schedule` are bitwise identical from run to run: every schedule but the
// nondeterministic one, and auto, which only ever resolves to a deterministic schedule (choose_schedule).
DASH_HOST_DEVICE constexpr bool is_deterministic(Schedule schedule) {
  switch (schedule) {
    case Schedule::kAuto:
    case Schedule::kAscending:
    case Schedule::kDescending:
    case Schedule::kShortestFirst:
    case Schedule::kShift:
    case Schedule::kSymmetricShift:
      return true;
    case Schedule::kNondeterministic:
      break;
  }
  return false;
}

// Whether the plan sums every dQ tile in a fixed order (ranks 0, 1, ...): its schedule is deterministic (a plan
// of kAuto, which make_schedule_plan never makes, has no jobs and no order). Then the rank-0 contribution can
// store instead of add, so the dQ accumulator needs no zeroing; unordered sums need it zeroed.
DASH_HOST_DEVICE bool sums_in_order(const SchedulePlan& plan) {
  return plan.kind != Schedule::kAuto && is_deterministic(plan.kind);
}

// Work units of CTA `cta` under static dispatch: units cta, cta + num_ctas, ...
DASH_HOST_DEVICE int static_unit_count(const SchedulePlan& plan, int cta) {
  return cta < plan.num_units ? (plan.num_units - 1 - cta) / plan.num_ctas + 1 : 0;
}
DASH_HOST_DEVICE int static_unit(const SchedulePlan& plan, int cta, int i) { return cta + i * plan.num_ctas; }

}  // namespace dash
