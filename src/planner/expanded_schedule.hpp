// A schedule enumerated on the host: every job of every work unit and every step of every job, as
// the schedule functions define them. The validator, simulator, DAG model and emulator all consume it.
#pragma once

#include <functional>
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
  std::vector<int> contributions;  // per dQ tile: how many contributions the mask implies
  int num_dq_tiles = 0;

  int job_end_step(int job) const { return jobs[job].first_step + jobs[job].job.num_steps; }
};

ExpandedSchedule expand_schedule(const SchedulePlan& plan);

// The tiles head `head` covers: the plan's problem for a dense batch, its sequence's for a varlen batch
// (schedule/varlen.hpp), whose heads are the maximum problem's.
using HeadProblem = std::function<TiledProblem(int head)>;

// Job `sub` of unit `unit` (valid == false when the unit has none), and the plan whose q_tile_at and rank_of give
// its visits: make_job and the plan itself for a dense batch; for a varlen batch make_varlen_job and the plan
// fitted to the unit's sequence.
struct UnitJob {
  Job job;
  SchedulePlan visits;
};
using UnitJobs = std::function<UnitJob(int unit, int sub)>;

// The expansion both kinds of batch share: the plan's units, with their jobs from `unit_jobs` and each dQ tile's
// contributions from its head's problem.
ExpandedSchedule expand_schedule(const SchedulePlan& plan, const HeadProblem& head_problem, const UnitJobs& unit_jobs);

// The jobs each CTA runs, in order, when the dispatch is static (empty lists for dynamic dispatch,
// whose assignment depends on timing: see SimulationResult::cta_jobs).
std::vector<std::vector<int>> static_cta_jobs(const ExpandedSchedule& schedule);

}  // namespace dash
