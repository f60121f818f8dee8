// Helpers shared by the schedule and planner tests: abstract tiled problems with one row per tile
// (so tile indices are the paper's KV/Q indices), plans that must succeed, and readable views of an
// expanded schedule (what each CTA visits, and the order in which each dQ tile is summed).
#pragma once

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "planner/expanded_schedule.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/simulator.hpp"
#include "schedule/schedule.hpp"

namespace dash::testing {

// Every schedule a plan can be made of (auto is resolved before planning).
inline constexpr Schedule kSchedules[] = {Schedule::kAscending, Schedule::kDescending,     Schedule::kShortestFirst,
                                          Schedule::kShift,     Schedule::kSymmetricShift, Schedule::kNondeterministic};

// An attention shape with heads_q = heads_kv * group.
inline AttentionShape make_shape(int batch, int heads_kv, int group, int seqlen_q, int seqlen_k, int head_dim,
                                 bool causal) {
  AttentionShape shape;
  shape.batch = batch;
  shape.heads_kv = heads_kv;
  shape.heads_q = heads_kv * group;
  shape.seqlen_q = seqlen_q;
  shape.seqlen_k = seqlen_k;
  shape.head_dim = head_dim;
  shape.causal = causal;
  return shape;
}

// `heads` independent heads of n_kv key/value tiles and m_q query tiles. With stride s, a key/value
// tile spans s query rows, as with the 64x128 tiles of head dim 128.
inline TiledProblem abstract_problem(int heads, int n_kv, int m_q, bool causal, int stride = 1) {
  TiledProblem p{};
  p.batch = 1;
  p.heads_kv = heads;
  p.group_size = 1;
  p.group_splits = 1;
  p.seqlen_q = m_q;
  p.seqlen_k = n_kv * stride;
  p.block_q = 1;
  p.block_kv = stride;
  p.causal = causal;
  return p;
}

// The plan of a schedule whose preconditions are expected to hold.
inline SchedulePlan must_plan(const TiledProblem& problem, Schedule schedule, int num_sms) {
  const PlanResult result = make_schedule_plan(problem, schedule, num_sms);
  EXPECT_TRUE(result.ok()) << result.rejected;
  return result.plan;
}

// One visit of a CTA: key/value tile kv of schedule head `head` adds its partial dQ of query tile q.
struct Visit {
  int head;
  int kv;
  int q;
  int rank;
  bool operator==(const Visit&) const = default;
};

// The visits of each CTA in execution order, given the jobs each CTA ran.
inline std::vector<std::vector<Visit>> cta_visits(const ExpandedSchedule& s,
                                                  const std::vector<std::vector<int>>& cta_jobs) {
  std::vector<std::vector<Visit>> out(cta_jobs.size());
  for (size_t cta = 0; cta < cta_jobs.size(); ++cta) {
    for (int j : cta_jobs[cta]) {
      const Job& job = s.jobs[j].job;
      for (int k = s.jobs[j].first_step; k < s.job_end_step(j); ++k) {
        out[cta].push_back({job.head, job.kv_tile, s.steps[k].q_tile, s.steps[k].rank});
      }
    }
  }
  return out;
}

// The key/value tiles whose partials dQ tile (head, q) sums, in summation (rank) order.
inline std::vector<int> accumulation_order(const ExpandedSchedule& s, int head, int q) {
  std::vector<std::pair<int, int>> by_rank;
  for (const ExpandedJob& ej : s.jobs) {
    if (ej.job.head != head) continue;
    for (int k = ej.first_step; k < ej.first_step + ej.job.num_steps; ++k) {
      if (s.steps[k].q_tile == q) by_rank.push_back({s.steps[k].rank, ej.job.kv_tile});
    }
  }
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<int> kv;
  for (const auto& [rank, tile] : by_rank) kv.push_back(tile);
  return kv;
}

// Every (schedule head, key/value tile, query tile) with its rank, sorted: the whole summation order
// of a schedule independent of how jobs are laid out or dispatched.
inline std::vector<Visit> all_ranks(const ExpandedSchedule& s) {
  std::vector<Visit> out;
  out.reserve(s.steps.size());
  for (const ExpandedJob& ej : s.jobs) {
    for (int k = ej.first_step; k < ej.first_step + ej.job.num_steps; ++k) {
      out.push_back({ej.job.head, ej.job.kv_tile, s.steps[k].q_tile, s.steps[k].rank});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Visit& a, const Visit& b) { return std::tie(a.head, a.kv, a.q) < std::tie(b.head, b.kv, b.q); });
  return out;
}

// Index into s.steps of the visit of key/value tile `kv` (of head 0) to query tile `q` (for corrupting
// an expansion in validator tests).
inline int step_of(const ExpandedSchedule& s, int kv, int q) {
  for (const ExpandedJob& ej : s.jobs) {
    if (ej.job.head != 0 || ej.job.kv_tile != kv) continue;
    for (int k = ej.first_step; k < ej.first_step + ej.job.num_steps; ++k) {
      if (s.steps[k].q_tile == q) return k;
    }
  }
  ADD_FAILURE() << "KV" << kv << " never visits Q" << q;
  return 0;
}

inline void swap_ranks(ExpandedSchedule& s, int q, int kv_a, int kv_b) {
  std::swap(s.steps[step_of(s, kv_a, q)].rank, s.steps[step_of(s, kv_b, q)].rank);
}

}  // namespace dash::testing
