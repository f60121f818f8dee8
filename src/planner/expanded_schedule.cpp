#include "planner/expanded_schedule.hpp"

#include "schedule/schedule.hpp"

namespace dash {

ExpandedSchedule expand_schedule(const SchedulePlan& plan) {
  return expand_schedule(
      plan, [&](int) { return plan.problem; },
      [&](int unit, int sub) {
        return UnitJob{make_job(plan, unit, sub), plan};
      });
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
    for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
      const UnitJob unit_job = unit_jobs(unit, sub);
      const Job& job = unit_job.job;
      if (!job.valid) continue;
      out.jobs.push_back({job, unit, static_cast<int>(out.steps.size())});
      for (int step = 0; step < job.num_steps; ++step) {
        const int v = q_tile_at(unit_job.visits, job, step);
        out.steps.push_back({v, p.dq_tile_index(job.head, v), rank_of(unit_job.visits, job, v)});
      }
    }
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
