// A schedule enumerated on the host: every job of every work unit and every step of every job, as
// the schedule functions define them. The validator, simulator, DAG model and emulator all consume it.
#pragma once

#include <vector>

#include "schedule/plan.hpp"

namespace dash {

struct Step {
  int q_tile;   // virtual query tile visited
  int dq_tile;  // dQ tile (and semaphore) the partial is summed into
  int rank;     // position in that tile's summation order, or kUnordered
};

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
  std::vector<int> contributions;   // per dQ tile: how many contributions the mask implies
  int num_dq_tiles = 0;

  int job_end_step(int job) const { return jobs[job].first_step + jobs[job].job.num_steps; }
};

ExpandedSchedule expand_schedule(const SchedulePlan& plan);

// The jobs each CTA runs, in order, when the dispatch is static (empty lists for dynamic dispatch,
// whose assignment depends on timing: see SimulationResult::cta_jobs).
std::vector<std::vector<int>> static_cta_jobs(const ExpandedSchedule& schedule);

}  // namespace dash
