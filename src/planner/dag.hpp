// The paper's DAG model of the backward pass, built from an expanded schedule and the jobs each CTA
// runs. Every step is a compute node (weight c) followed by a reduce node (weight r); a CTA's steps
// form a chain; zero-weight order edges link consecutive contributions of each dQ tile.
//
// The critical path is the longest weighted path; a cycle means the schedule can deadlock. The
// paper's lemma: an order edge u -> v (from the end of u's reduce to the start of v's) leaves the
// critical path of parallel isomorphic chains unchanged iff depth(u) <= depth(v) for the DAG depths of
// those two nodes. With positive compute cost that holds iff u sits strictly earlier on its chain than
// v; an edge between steps at the same chain position (two CTAs reaching one dQ tile together) or
// pointing backwards is a violation.
#pragma once

#include <string>
#include <vector>

#include "planner/expanded_schedule.hpp"
#include "planner/simulator.hpp"

namespace dash {

struct OrderEdge {
  int dq_tile;
  int from_rank;      // the edge runs from this rank's contribution to the next one
  int from_position;  // chain positions of the two steps
  int to_position;
};

struct DagAnalysis {
  bool acyclic = false;
  std::string cycle;           // when not acyclic: a step on a cycle
  double critical_path = 0.0;  // longest path (signal latency not modelled)
  long long order_edges = 0;
  long long lemma_violations = 0;             // order edges with position(u) >= position(v)
  std::vector<OrderEdge> violation_examples;  // the first few
};

inline constexpr int kMaxViolationExamples = 8;

DagAnalysis analyze_dag(const ExpandedSchedule& schedule, const std::vector<std::vector<int>>& cta_jobs,
                        const CostModel& costs);

}  // namespace dash
