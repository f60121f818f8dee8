#include "planner/expanded_schedule.hpp"

#include "schedule/job_walk.hpp"

namespace dash {

ExpandedSchedule expand_schedule(const SchedulePlan& plan) {
  return expand_schedule(
      plan, [&](int) { return plan.problem; },
      [&](int unit, const OnJob& on_job) { for_each_job_of_unit(plan, unit, on_job); });
}

ExpandedSchedule expand_schedule(const SchedulePlan& plan, const HeadProblem& head_problem, const UnitJobs& unit_jobs) {
  ExpandedSchedule out;
  out.plan = plan;
  const TiledProblem& p = plan.problem;
  out.num_dq_tiles = p.batch * p.heads_q() * p.real_q_tiles();
  out.contributions.assign(static_cast<size_t>(out.num_dq_tiles), 0);
  for (int head = 0; head < p.num_heads(); ++head) {
    const TiledProblem h = head_problem(head);
    for (int v = 0; v < h.num_q_tiles(); ++v) out.contributions[p.dq_tile_index(head, v)] = h.num_contributors(v);
  }
  out.unit_first_job.reserve(static_cast<size_t>(plan.num_units) + 1);
  for (int unit = 0; unit < plan.num_units; ++unit) {
    out.unit_first_job.push_back(static_cast<int>(out.jobs.size()));
    unit_jobs(unit, [&](const Job& job, const SchedulePlan& job_plan) {
      out.jobs.push_back({job, unit, static_cast<int>(out.steps.size())});
      for (int step = 0; step < job.num_steps; ++step) out.steps.push_back(visit_at(p, job_plan, job, step));
    });
  }
  out.unit_first_job.push_back(static_cast<int>(out.jobs.size()));
  return out;
}

std::vector<std::vector<int>> static_cta_jobs(const ExpandedSchedule& schedule) {
  const SchedulePlan& plan = schedule.plan;
  std::vector<std::vector<int>> cta_jobs(static_cast<size_t>(plan.num_ctas));
  if (plan.dispatch != Dispatch::kStatic) return cta_jobs;
  for (int cta = 0; cta < plan.num_ctas; ++cta) {
    for (int i = 0; i < static_unit_count(plan, cta); ++i) {
      const int unit = static_unit(plan, cta, i);
      for (int j = schedule.unit_first_job[unit]; j < schedule.unit_first_job[unit + 1]; ++j)
        cta_jobs[cta].push_back(j);
    }
  }
  return cta_jobs;
}

}  // namespace dash
