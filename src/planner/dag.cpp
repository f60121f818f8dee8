#include "planner/dag.hpp"

#include <algorithm>

namespace dash {

DagAnalysis analyze_dag(const ExpandedSchedule& s, const std::vector<std::vector<int>>& cta_jobs,
                        const CostModel& costs) {
  const size_t num_steps = s.steps.size();
  // Chain position (depth) and chain predecessor of every step.
  std::vector<int> depth(num_steps, -1);
  std::vector<int> chain_pred(num_steps, -1);
  for (const auto& jobs : cta_jobs) {
    int position = 0;
    int previous = -1;
    for (int j : jobs) {
      for (int k = s.jobs[j].first_step; k < s.job_end_step(j); ++k) {
        depth[k] = position++;
        chain_pred[k] = previous;
        previous = k;
      }
    }
  }
  // Order predecessor: the contribution of rank - 1 to the same dQ tile.
  std::vector<int> order_pred(num_steps, -1);
  std::vector<int> order_succ(num_steps, -1);
  {
    std::vector<std::vector<std::pair<int, int>>> by_tile(static_cast<size_t>(s.num_dq_tiles));
    for (size_t k = 0; k < num_steps; ++k) {
      if (s.steps[k].rank >= 0) by_tile[s.steps[k].dq_tile].push_back({s.steps[k].rank, static_cast<int>(k)});
    }
    for (auto& list : by_tile) {
      std::sort(list.begin(), list.end());
      for (size_t i = 1; i < list.size(); ++i) {
        if (list[i].first != list[i - 1].first + 1) continue;  // not a permutation: the validator reports it
        order_pred[list[i].second] = list[i - 1].second;
        order_succ[list[i - 1].second] = list[i].second;
      }
    }
  }

  DagAnalysis out;
  std::vector<int> chain_succ(num_steps, -1);
  std::vector<int> indegree(num_steps, 0);
  for (size_t k = 0; k < num_steps; ++k) {
    if (chain_pred[k] >= 0) {
      chain_succ[chain_pred[k]] = static_cast<int>(k);
      ++indegree[k];
    }
    if (order_pred[k] >= 0) {
      ++indegree[k];
      ++out.order_edges;
      const int from = order_pred[k];
      if (depth[from] >= depth[k]) {
        if (out.violation_examples.size() < kMaxViolationExamples) {
          out.violation_examples.push_back({s.steps[k].dq_tile, s.steps[from].rank, depth[from], depth[k]});
        }
        ++out.lemma_violations;
      }
    }
  }
  // Longest path in topological order. reduce_end[k] = end of step k's reduce node.
  std::vector<double> reduce_end(num_steps, 0.0);
  std::vector<int> ready;
  size_t assigned = 0;
  for (size_t k = 0; k < num_steps; ++k) {
    if (depth[k] < 0) continue;
    ++assigned;
    if (indegree[k] == 0) ready.push_back(static_cast<int>(k));
  }
  size_t processed = 0;
  while (!ready.empty()) {
    const int k = ready.back();
    ready.pop_back();
    ++processed;
    const double compute_end = (chain_pred[k] >= 0 ? reduce_end[chain_pred[k]] : 0.0) + costs.compute;
    const double reduce_start = std::max(compute_end, order_pred[k] >= 0 ? reduce_end[order_pred[k]] : 0.0);
    reduce_end[k] = reduce_start + costs.reduce;
    out.critical_path = std::max(out.critical_path, reduce_end[k]);
    for (int next : {chain_succ[k], order_succ[k]}) {
      if (next >= 0 && --indegree[next] == 0) ready.push_back(next);
    }
  }
  out.acyclic = processed == assigned && assigned == num_steps;
  if (!out.acyclic) {
    for (size_t k = 0; k < num_steps; ++k) {
      if (depth[k] < 0 || indegree[k] > 0) {
        out.cycle = "step on dQ tile " + std::to_string(s.steps[k].dq_tile) + " with rank " +
                    std::to_string(s.steps[k].rank) + " never becomes ready";
        break;
      }
    }
  }
  return out;
}

}  // namespace dash
