// The paper's DAG model of the backward pass, built from an expanded schedule and the jobs each CTA
// runs. Every step is a compute node (weight c) followed by a reduce node (weight r); a CTA's steps
// form a chain; zero-weight order edges link consecutive contributions of each dQ tile.
//
// The critical path is the longest weighted path; a cycle means the schedule can deadlock. The
// paper's lemma: an order edge u -> v leaves the critical path of parallel isomorphic chains
// unchanged iff depth(u) <= depth(v), where depth is a step's position along its chain.
#pragma once

#include <string>
#include <vector>

#include "planner/expanded_schedule.hpp"
#include "planner/simulator.hpp"

namespace dash {

struct OrderEdge {
  int dq_tile;
  int from_rank;   // the edge runs from this rank's contribution to the next one
  int from_depth;
  int to_depth;
};

struct DagAnalysis {
  bool acyclic = false;
  std::string cycle;                 // when not acyclic: a step on a cycle
  double critical_path = 0.0;        // longest path (signal latency not modelled)
  long long order_edges = 0;
  long long lemma_violations = 0;    // order edges with depth(u) > depth(v)
  std::vector<OrderEdge> violation_examples;  // the first few
};

inline constexpr int kMaxViolationExamples = 8;

DagAnalysis analyze_dag(const ExpandedSchedule& schedule, const std::vector<std::vector<int>>& cta_jobs,
                        const CostModel& costs);

}  // namespace dash
