#include "planner/validator.hpp"

#include <vector>

#include "planner/simulator.hpp"
#include "schedule/schedule.hpp"

namespace dash {
namespace {

// Every job of head h covers one key/value tile of head_problem(h) and exactly the query tiles its mask sees, each
// once, and every such tile has its job. Head numbers and tile bounds are the plan's problem's (the maximum one for
// a varlen batch).
std::string check_coverage(const ExpandedSchedule& s, const HeadProblem& head_problem) {
  const TiledProblem& p = s.plan.problem;
  const int n = p.num_kv_tiles();
  const int m = p.num_q_tiles();
  std::vector<char> job_seen(static_cast<size_t>(p.num_heads()) * n, 0);
  std::vector<int> visit_stamp(static_cast<size_t>(m), -1);
  for (int j = 0; j < static_cast<int>(s.jobs.size()); ++j) {
    const Job& job = s.jobs[j].job;
    const std::string name = "job (head " + std::to_string(job.head) + ", kv tile " + std::to_string(job.kv_tile) + ")";
    if (job.head < 0 || job.head >= p.num_heads() || job.kv_tile < 0 || job.kv_tile >= n)
      return name + " is out of range";
    const TiledProblem h = head_problem(job.head);
    if (job.kv_tile >= h.num_kv_tiles()) return name + " lies past its head's key/value tiles";
    char& seen = job_seen[static_cast<size_t>(job.head) * n + job.kv_tile];
    if (seen) return name + " is scheduled twice";
    seen = 1;
    if (job.q_begin != h.q_begin(job.kv_tile) || job.q_end != h.q_end(job.kv_tile) ||
        job.num_steps != job.q_end - job.q_begin) {
      return name + " does not cover the query tiles its mask sees";
    }
    for (int k = s.jobs[j].first_step; k < s.job_end_step(j); ++k) {
      const int v = s.steps[k].q_tile;
      if (v < job.q_begin || v >= job.q_end) {
        return name + " visits query tile " + std::to_string(v) + " outside its range";
      }
      if (visit_stamp[v] == j) return name + " visits query tile " + std::to_string(v) + " twice";
      visit_stamp[v] = j;
    }
  }
  for (int head = 0; head < p.num_heads(); ++head) {
    const int head_tiles = head_problem(head).num_kv_tiles();
    for (int k = 0; k < head_tiles; ++k) {
      if (!job_seen[static_cast<size_t>(head) * n + k]) {
        return "job (head " + std::to_string(head) + ", kv tile " + std::to_string(k) + ") is never scheduled";
      }
    }
  }
  return {};
}

std::string check_ranks(const ExpandedSchedule& s) {
  std::vector<std::vector<char>> taken(static_cast<size_t>(s.num_dq_tiles));
  for (int t = 0; t < s.num_dq_tiles; ++t) taken[t].assign(static_cast<size_t>(s.contributions[t]), 0);
  for (const Step& step : s.steps) {
    auto& ranks = taken[step.dq_tile];
    const std::string tile = "dQ tile " + std::to_string(step.dq_tile);
    if (step.rank < 0 || step.rank >= static_cast<int>(ranks.size())) {
      return tile + " gets rank " + std::to_string(step.rank) + " outside [0, " + std::to_string(ranks.size()) + ")";
    }
    if (ranks[step.rank]) return tile + " gets rank " + std::to_string(step.rank) + " twice";
    ranks[step.rank] = 1;
  }
  for (int t = 0; t < s.num_dq_tiles; ++t) {
    for (size_t r = 0; r < taken[t].size(); ++r) {
      if (!taken[t][r]) return "dQ tile " + std::to_string(t) + " never gets rank " + std::to_string(r);
    }
  }
  return {};
}

// Dynamic dispatch: every wait must point to an earlier unit, or to an earlier step of the same job.
std::string check_waits_point_backward(const ExpandedSchedule& s) {
  std::vector<int> job_of_step(s.steps.size());
  for (int j = 0; j < static_cast<int>(s.jobs.size()); ++j) {
    for (int k = s.jobs[j].first_step; k < s.job_end_step(j); ++k) job_of_step[k] = j;
  }
  std::vector<std::vector<int>> by_rank(static_cast<size_t>(s.num_dq_tiles));
  for (int t = 0; t < s.num_dq_tiles; ++t) by_rank[t].assign(static_cast<size_t>(s.contributions[t]), -1);
  for (size_t k = 0; k < s.steps.size(); ++k) by_rank[s.steps[k].dq_tile][s.steps[k].rank] = static_cast<int>(k);
  for (size_t k = 0; k < s.steps.size(); ++k) {
    const Step& step = s.steps[k];
    if (step.rank == 0) continue;
    const int pred = by_rank[step.dq_tile][step.rank - 1];
    const int job = job_of_step[k];
    const int pred_job = job_of_step[pred];
    const bool earlier_unit = s.jobs[pred_job].unit < s.jobs[job].unit;
    const bool earlier_in_job = pred_job == job && pred < static_cast<int>(k);
    if (!earlier_unit && !earlier_in_job) {
      return "unit " + std::to_string(s.jobs[job].unit) + " waits on unit " + std::to_string(s.jobs[pred_job].unit) +
             " (dQ tile " + std::to_string(step.dq_tile) + ", rank " + std::to_string(step.rank) +
             "), which dynamic dispatch may start later";
    }
  }
  return {};
}

// The checks after coverage: ranks, deadlock freedom, the lemma. They read only the steps, contributions,
// dispatch and CTA count.
ValidationReport validate_orders(const ExpandedSchedule& s) {
  ValidationReport report;
  report.ordered = sums_in_order(s.plan);
  if (report.ordered) report.rank_error = check_ranks(s);
  if (!report.rank_error.empty()) return report;

  if (report.ordered && s.plan.dispatch == Dispatch::kDynamic) {
    report.deadlock_error = check_waits_point_backward(s);
    if (!report.deadlock_error.empty()) return report;
  }
  const CostModel unit_costs{};
  const SimulationResult sim = simulate(s, unit_costs);
  if (!sim.completed) {
    report.deadlock_error = sim.stuck;
    return report;
  }
  report.dag = analyze_dag(s, sim.cta_jobs, unit_costs);
  if (!report.dag.acyclic) {
    report.deadlock_error = "the DAG has a cycle: " + report.dag.cycle;
    return report;
  }
  report.deadlock_free = true;
  return report;
}

}  // namespace

std::string ValidationReport::summary() const {
  if (!coverage_error.empty()) return "coverage: " + coverage_error;
  if (!rank_error.empty()) return "ranks: " + rank_error;
  if (!deadlock_free) return "deadlock: " + deadlock_error;
  return "valid";
}

ValidationReport validate_schedule(const ExpandedSchedule& s) {
  return validate_schedule(s, [&](int) { return s.plan.problem; });
}

ValidationReport validate_schedule(const ExpandedSchedule& s, const HeadProblem& head_problem) {
  const std::string coverage_error = check_coverage(s, head_problem);
  if (coverage_error.empty()) return validate_orders(s);
  ValidationReport report;
  report.coverage_error = coverage_error;
  return report;
}

}  // namespace dash
