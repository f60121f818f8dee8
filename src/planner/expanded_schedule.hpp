// A schedule enumerated on the host: every job of every work unit and every step of every job, as
// the schedule functions define them. The validator, simulator, DAG model and emulator all consume it.
#pragma once

#include <functional>
#include <vector>

#include "schedule/job_walk.hpp"
#include "schedule/plan.hpp"

namespace dash {

// A job's visit at one step (schedule/job_walk.hpp).
using Step = Visit;

struct ExpandedJob {
  Job job;
  int unit;
  int first_step;  // steps of this job: [first_step, first_step + job.num_steps)
};

struct ExpandedSchedule {
  SchedulePlan plan{};
  std::vector<ExpandedJob> jobs;    // valid jobs only, in unit order
  std::vector<int> unit_first_job;  // jobs of unit u: [unit_first_job[u], unit_first_job[u + 1])
  std::vector<Step> steps;
  std::vector<int> contributions;  // per dQ tile: how many contributions the mask implies
  int num_dq_tiles = 0;

  int job_end_step(int job) const { return jobs[job].first_step + jobs[job].job.num_steps; }
};

ExpandedSchedule expand_schedule(const SchedulePlan& plan);

// The tiles head `head` covers: the plan's problem for a dense batch, its sequence's for a varlen batch
// (schedule/varlen.hpp), whose heads are the maximum problem's.
using HeadProblem = std::function<TiledProblem(int head)>;

// Calls on_job(job, job_plan) for each valid job of unit `unit`, job_plan the plan whose q_tile_at and rank_of give its
// visits: for_each_job_of_unit for a dense batch, for_each_varlen_job_of_unit for a varlen one (job_walk.hpp).
using OnJob = std::function<void(const Job& job, const SchedulePlan& job_plan)>;
using UnitJobs = std::function<void(int unit, const OnJob& on_job)>;

// The expansion both kinds of batch share: the plan's units, with their jobs from `unit_jobs` and each dQ tile's
// contributions from its head's problem.
ExpandedSchedule expand_schedule(const SchedulePlan& plan, const HeadProblem& head_problem, const UnitJobs& unit_jobs);

// The jobs each CTA runs, in order, when the dispatch is static (empty lists for dynamic dispatch,
// whose assignment depends on timing: see SimulationResult::cta_jobs).
std::vector<std::vector<int>> static_cta_jobs(const ExpandedSchedule& schedule);

}  // namespace dash
