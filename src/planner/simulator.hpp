// Event-driven simulation of persistent CTAs executing a schedule in the paper's DAG model: each step
// is a compute of cost c followed by a reduce of cost r into its dQ tile, and the reduce may start
// only when every lower-ranked contribution to that tile has been reduced (plus an optional latency
// when the previous contributor ran on another CTA, modelling a cross-SM signal through L2).
#pragma once

#include <string>
#include <vector>

#include "planner/expanded_schedule.hpp"

namespace dash {

struct CostModel {
  double compute = 1.0;         // c: one tile's compute
  double reduce = 0.25;         // r: one dQ tile's serialized reduction
  double signal_latency = 0.0;  // delay before another CTA sees a released semaphore
};

enum class SegmentKind : unsigned char { kCompute, kWait, kReduce };

struct Segment {
  double start;
  double end;
  SegmentKind kind;
  int job;
};

struct SimulationResult {
  bool completed = false;
  std::string stuck;                       // when not completed: who waits on what
  double makespan = 0.0;
  double busy = 0.0;                       // total compute + reduce time
  double bubble_fraction = 0.0;            // 1 - busy / (num_ctas * makespan)
  std::vector<std::vector<int>> cta_jobs;  // jobs each CTA ran, in order
  std::vector<std::vector<Segment>> timeline;  // per CTA, when recorded
};

SimulationResult simulate(const ExpandedSchedule& schedule, const CostModel& costs, bool record_timeline = false);

}  // namespace dash
