// Event-driven simulation of persistent CTAs executing a schedule in the paper's DAG model: each step
// is a compute of cost c followed by a reduce of cost r into its dQ tile, and the reduce may start
// only when every lower-ranked contribution to that tile has been reduced (plus an optional latency
// when the previous contributor ran on another CTA, modelling a cross-SM signal through L2).
//
// Two extensions past the paper, both off by default (then the model is the paper's): a fixed cost per
// job (loading K/V, storing dK/dV) and jitter, each compute lasting c (1 + jitter u) with u uniform on
// [-sqrt 3, sqrt 3] (mean 0, variance 1), drawn from (seed, step) so that a simulation is reproducible.
// On the GPU no two tile visits take the same time (memory traffic, clocks, the other CTAs), and a
// static schedule cannot rebalance what a dynamic dispatcher absorbs: the paper's equal costs hide that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/expanded_schedule.hpp"

namespace dash {

struct CostModel {
  double compute = 1.0;         // c: one tile's compute
  double reduce = 0.25;         // r: one dQ tile's serialized reduction
  double signal_latency = 0.0;  // delay before another CTA sees a released semaphore
  double job_overhead = 0.0;    // fixed cost at the start of each job
  double jitter = 0.0;          // coefficient of variation of each compute, in [0, 0.5]
  uint64_t seed = 0;            // draws of the jitter
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
  std::string stuck;  // when not completed: who waits on what
  double makespan = 0.0;
  double busy = 0.0;                           // total job overhead + compute + reduce time
  double bubble_fraction = 0.0;                // 1 - busy / (num_ctas * makespan)
  std::vector<std::vector<int>> cta_jobs;      // jobs each CTA ran, in order
  std::vector<std::vector<Segment>> timeline;  // per CTA, when recorded
};

SimulationResult simulate(const ExpandedSchedule& schedule, const CostModel& costs, bool record_timeline = false);

}  // namespace dash
