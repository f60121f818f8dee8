// The walk of a plan: the jobs each work unit holds and the visit each job makes at each step, built on the schedule's
// three functions (schedule.hpp: make_job, q_tile_at, rank_of) and their varlen fitting (varlen.hpp). The kernels'
// tile scheduler (kernels/sm90/bwd_tile_scheduler.cuh), the emulator and the planner's expansion
// (planner/expanded_schedule.cpp) all walk a plan through these, so what the planner proves and the emulator runs is
// what the kernels run; only the order in which units reach a CTA (static or dynamic dispatch) is each one's own.
// Invariants: a unit's jobs come in sub order, invalid ones skipped; a varlen job's visits and ranks follow the plan
// fitted to its sequence, while its dQ tile keeps the maximum problem's numbering (varlen.hpp).
#pragma once

#include "schedule/host_device.hpp"
#include "schedule/plan.hpp"
#include "schedule/schedule.hpp"
#include "schedule/varlen.hpp"

namespace dash {

// What a job does at one step.
struct Visit {
  int q_tile;   // virtual query tile visited
  int dq_tile;  // dQ tile (and semaphore) the partial is summed into
  int rank;     // position in that tile's summation order, or kUnordered
};

// Visit `step` of `job`: the query tile and its rank from `job_plan` (for_each_job_of_unit's), the dQ tile numbered in
// `problem`, the plan's (the maximum problem of a varlen plan).
DASH_HOST_DEVICE Visit visit_at(const TiledProblem& problem, const SchedulePlan& job_plan, const Job& job, int step) {
  const int v = q_tile_at(job_plan, job, step);
  return Visit{v, problem.dq_tile_index(job.head, v), rank_of(job_plan, job, v)};
}

// Calls on_job(job, job_plan) for each valid job of work unit `unit` of a dense plan; job_plan is the plan.
template <class OnJob>
DASH_HOST_DEVICE void for_each_job_of_unit(const SchedulePlan& plan, int unit, OnJob&& on_job) {
  for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
    const Job job = make_job(plan, unit, sub);
    if (job.valid) on_job(job, plan);
  }
}

// The same for a varlen plan, whose unit `unit` belongs to a sequence of `lengths` (varlen_sequence_of_unit): its jobs
// fitted to the sequence (make_varlen_job), and job_plan the plan fitted to it (sequence_plan).
template <class OnJob>
DASH_HOST_DEVICE void for_each_varlen_job_of_unit(const SchedulePlan& plan, int unit, SequenceLengths lengths,
                                                  OnJob&& on_job) {
  const SchedulePlan fitted = sequence_plan(plan, lengths);
  for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
    const Job job = make_varlen_job(plan, unit, sub, lengths);
    if (job.valid) on_job(job, fitted);
  }
}

}  // namespace dash
