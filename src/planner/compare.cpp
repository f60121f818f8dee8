// Planner layer: evaluates each schedule of one shape in the DAG model (validity, simulated makespan and
// bubbles, critical path) and recommends one (compare.hpp).
#include "planner/compare.hpp"

#include <vector>

#include "planner/dag.hpp"
#include "planner/expanded_schedule.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/validator.hpp"
#include "schedule/schedule.hpp"

namespace dash {

ScheduleReport evaluate_schedule(const TiledProblem& problem, Schedule schedule, int num_sms, const CostModel& costs) {
  ScheduleReport report;
  report.schedule = schedule;
  const PlanResult planned = make_schedule_plan(problem, schedule, num_sms);
  if (!planned.ok()) {
    report.reason = planned.rejected;
    return report;
  }
  const ExpandedSchedule expanded = expand_schedule(planned.plan);
  const ValidationReport validation = validate_schedule(expanded);
  report.deadlock_free = validation.deadlock_free;
  if (!validation.ok()) {
    report.reason = validation.summary();
    return report;
  }
  report.valid = true;
  simulate_into(&report, expanded, costs);
  return report;
}

void simulate_into(ScheduleReport* report, const ExpandedSchedule& expanded, const CostModel& costs) {
  // With jitter one draw is one possible run: the makespan is the mean over kJitterSamples seeds.
  const int samples = costs.jitter > 0.0 ? kJitterSamples : 1;
  for (int i = 0; i < samples; ++i) {
    CostModel draw = costs;
    draw.seed = costs.seed + static_cast<uint64_t>(i);
    const SimulationResult sim = simulate(expanded, draw);
    report->makespan += sim.makespan / samples;
    report->bubble_fraction += sim.bubble_fraction / samples;
  }
  // The validator's DAG uses its own unit costs; the critical path must use the caller's c and r (and,
  // under dynamic dispatch, the CTA assignment those costs produce), without latency, overhead or jitter.
  const CostModel instant{costs.compute, costs.reduce};
  const std::vector<std::vector<int>> cta_jobs =
      expanded.plan.dispatch == Dispatch::kStatic ? static_cta_jobs(expanded) : simulate(expanded, instant).cta_jobs;
  const DagAnalysis dag = analyze_dag(expanded, cta_jobs, instant);
  report->critical_path = dag.critical_path;
  report->lemma_violations = dag.lemma_violations;
}

Schedule recommended_schedule(const std::vector<ScheduleReport>& reports, Schedule auto_choice, Schedule fallback) {
  const ScheduleReport* best = nullptr;
  for (const ScheduleReport& r : reports) {
    if (!r.valid || !is_deterministic(r.schedule)) continue;
    const bool better =
        !best || r.makespan < best->makespan || (r.makespan == best->makespan && r.schedule == auto_choice);
    if (better) best = &r;
  }
  return best ? best->schedule : fallback;
}

Comparison compare_schedules(const TiledProblem& problem, int num_sms, const CostModel& costs) {
  Comparison out;
  out.problem = problem;
  out.num_sms = num_sms;
  out.costs = costs;
  const AutoChoice choice = choose_auto(problem, num_sms);
  out.auto_choice = choice.schedule;
  out.auto_reason = choice.reason;
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kAuto) continue;
    out.schedules.push_back(evaluate_schedule(problem, schedule, num_sms, costs));
  }
  out.recommended = recommended_schedule(out.schedules, out.auto_choice, out.recommended);
  return out;
}

}  // namespace dash
