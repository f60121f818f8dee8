// Compares every schedule on one shape in the DAG model and recommends one: what `dash-attn plan` prints.
#pragma once

#include <string>
#include <vector>

#include "planner/simulator.hpp"
#include "schedule/plan.hpp"

namespace dash {

// Simulations averaged per schedule when the cost model has jitter (seeds seed, seed + 1, ...).
inline constexpr int kJitterSamples = 8;

struct ScheduleReport {
  Schedule schedule;
  bool valid = false;  // preconditions hold and the validator proved the plan safe
  std::string reason;  // why not, when !valid
  bool deadlock_free = false;
  double critical_path = 0.0;    // DAG longest path (no signal latency)
  double makespan = 0.0;         // event-driven simulation with the cost model (the mean of kJitterSamples
  double bubble_fraction = 0.0;  // draws when it has jitter)
  long long lemma_violations = 0;
};

struct Comparison {
  TiledProblem problem{};
  int num_sms = 0;
  CostModel costs;
  std::vector<ScheduleReport> schedules;        // every schedule but auto, in kAllSchedules order
  Schedule recommended = Schedule::kAscending;  // deterministic schedule with the smallest makespan
  Schedule auto_choice = Schedule::kAscending;  // what Schedule::kAuto runs on the GPU
  std::string auto_reason;                      // why (the measured class it falls in)
};

ScheduleReport evaluate_schedule(const TiledProblem& problem, Schedule schedule, int num_sms, const CostModel& costs);
Comparison compare_schedules(const TiledProblem& problem, int num_sms, const CostModel& costs);

// The makespan and bubbles (the mean of kJitterSamples draws with jitter), critical path and lemma violations of
// a valid expanded schedule, into `report`: evaluate_schedule's measurements, also for schedules planned
// otherwise (varlen batches fitted to their lengths).
void simulate_into(ScheduleReport* report, const ExpandedSchedule& expanded, const CostModel& costs);

// The deterministic valid schedule with the smallest makespan; ties go to the schedule auto runs, so that plan
// and the GPU default agree whenever they can. `fallback` when no deterministic schedule is valid.
Schedule recommended_schedule(const std::vector<ScheduleReport>& reports, Schedule auto_choice, Schedule fallback);

}  // namespace dash
