#include "planner/compare.hpp"

#include "planner/expanded_schedule.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/validator.hpp"

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
  const SimulationResult sim = simulate(expanded, costs);
  report.valid = true;
  report.critical_path = validation.dag.critical_path;
  report.lemma_violations = validation.dag.lemma_violations;
  report.makespan = sim.makespan;
  report.bubble_fraction = sim.bubble_fraction;
  return report;
}

Comparison compare_schedules(const TiledProblem& problem, int num_sms, const CostModel& costs) {
  Comparison out;
  out.problem = problem;
  out.num_sms = num_sms;
  out.costs = costs;
  out.auto_choice = choose_schedule(problem, num_sms);
  const ScheduleReport* best = nullptr;
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kAuto) continue;
    out.schedules.push_back(evaluate_schedule(problem, schedule, num_sms, costs));
  }
  for (const ScheduleReport& r : out.schedules) {
    if (!r.valid || r.schedule == Schedule::kNondeterministic) continue;
    if (!best || r.makespan < best->makespan) best = &r;
  }
  if (best) out.recommended = best->schedule;
  return out;
}

}  // namespace dash
