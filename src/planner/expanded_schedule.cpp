#include "planner/expanded_schedule.hpp"

#include "schedule/schedule.hpp"

namespace dash {

ExpandedSchedule expand_schedule(const SchedulePlan& plan) {
  ExpandedSchedule out;
  out.plan = plan;
  const TiledProblem& p = plan.problem;
  out.num_dq_tiles = p.batch * p.heads_q() * p.real_q_tiles();
  out.contributions.assign(static_cast<size_t>(out.num_dq_tiles), 0);
  for (int head = 0; head < p.num_heads(); ++head) {
    for (int v = 0; v < p.num_q_tiles(); ++v) out.contributions[p.dq_tile_index(head, v)] = p.num_contributors(v);
  }
  out.unit_first_job.reserve(static_cast<size_t>(plan.num_units) + 1);
  for (int unit = 0; unit < plan.num_units; ++unit) {
    out.unit_first_job.push_back(static_cast<int>(out.jobs.size()));
    for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
      const Job job = make_job(plan, unit, sub);
      if (!job.valid) continue;
      out.jobs.push_back({job, unit, static_cast<int>(out.steps.size())});
      for (int step = 0; step < job.num_steps; ++step) {
        const int v = q_tile_at(plan, job, step);
        out.steps.push_back({v, p.dq_tile_index(job.head, v), rank_of(plan, job, v)});
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
      for (int j = schedule.unit_first_job[unit]; j < schedule.unit_first_job[unit + 1]; ++j) cta_jobs[cta].push_back(j);
    }
  }
  return cta_jobs;
}

}  // namespace dash
