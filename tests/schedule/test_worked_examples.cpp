// The worked examples of the research notes (paper-notes.md sections 3.1-3.4), checked exactly: which
// query tile every CTA visits at every step, each dQ tile's summation order, and the DAG-model makespan.
// Tiles are one row each (block_q = 1), so the indices below are the notes' KV/Q indices.
#include <algorithm>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "planner/expanded_schedule.hpp"
#include "planner/simulator.hpp"
#include "schedule_test_support.hpp"

namespace dash {
namespace {

using testing::abstract_problem;
using testing::accumulation_order;
using testing::cta_visits;
using testing::must_plan;

using KvQ = std::pair<int, int>;  // (key/value tile, query tile) of one visit

std::vector<KvQ> kv_q_pairs(const std::vector<testing::Visit>& visits) {
  std::vector<KvQ> out;
  for (const testing::Visit& v : visits) out.push_back({v.kv, v.q});
  return out;
}

TEST(WorkedExamples, Shift4x4StepTableAndOrders) {
  const SchedulePlan plan = must_plan(abstract_problem(1, 4, 4, false), Schedule::kShift, 4);
  ASSERT_EQ(plan.num_ctas, 4);
  const ExpandedSchedule s = expand_schedule(plan);
  const auto visits = cta_visits(s, static_cta_jobs(s));
  // Step table of the notes: CTA j owns KV j and visits Q (j + step) mod 4 with wait value `step`.
  const int table[4][4] = {{0, 1, 2, 3}, {1, 2, 3, 0}, {2, 3, 0, 1}, {3, 0, 1, 2}};  // [step][cta]
  for (int cta = 0; cta < 4; ++cta) {
    ASSERT_EQ(visits[cta].size(), 4u);
    for (int step = 0; step < 4; ++step) {
      EXPECT_EQ(visits[cta][step].kv, cta);
      EXPECT_EQ(visits[cta][step].q, table[step][cta]) << "cta " << cta << " step " << step;
      EXPECT_EQ(visits[cta][step].rank, step) << "cta " << cta << " step " << step;
    }
  }
  EXPECT_EQ(accumulation_order(s, 0, 0), (std::vector<int>{0, 3, 2, 1}));
  EXPECT_EQ(accumulation_order(s, 0, 1), (std::vector<int>{1, 0, 3, 2}));
  EXPECT_EQ(accumulation_order(s, 0, 2), (std::vector<int>{2, 1, 0, 3}));
  EXPECT_EQ(accumulation_order(s, 0, 3), (std::vector<int>{3, 2, 1, 0}));
  // Zero stalls for any reduce cost: every CTA waits only for the one that held the tile a step before.
  for (double r : {0.25, 0.5, 1.0, 3.0}) {
    const SimulationResult sim = simulate(s, CostModel{1.0, r, 0.0});
    ASSERT_TRUE(sim.completed) << sim.stuck;
    EXPECT_DOUBLE_EQ(sim.makespan, 4 * (1.0 + r));
    EXPECT_DOUBLE_EQ(sim.bubble_fraction, 0.0);
  }
}

TEST(WorkedExamples, Shift3KvBy5QWaitTable) {
  const SchedulePlan plan = must_plan(abstract_problem(1, 3, 5, false), Schedule::kShift, 3);
  const ExpandedSchedule s = expand_schedule(plan);
  // wait[q][kv] from the notes: rows Q0..Q4, columns KV0..KV2.
  const int wait[5][3] = {{0, 2, 1}, {1, 0, 2}, {2, 1, 0}, {2, 1, 0}, {2, 1, 0}};
  int checked = 0;
  for (const ExpandedJob& ej : s.jobs) {
    for (int k = ej.first_step; k < ej.first_step + ej.job.num_steps; ++k) {
      const Step& step = s.steps[k];
      EXPECT_EQ(step.rank, wait[step.q_tile][ej.job.kv_tile]) << "Q" << step.q_tile << " KV" << ej.job.kv_tile;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 15);
  EXPECT_EQ(accumulation_order(s, 0, 0), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(accumulation_order(s, 0, 1), (std::vector<int>{1, 0, 2}));
  for (int q = 2; q < 5; ++q) EXPECT_EQ(accumulation_order(s, 0, q), (std::vector<int>{2, 1, 0})) << "Q" << q;
  const SimulationResult sim = simulate(s, CostModel{1.0, 0.25, 0.0});
  ASSERT_TRUE(sim.completed) << sim.stuck;
  EXPECT_DOUBLE_EQ(sim.makespan, 5 * 1.25);
}

TEST(WorkedExamples, SymmetricShift8x8Stride1) {
  const SchedulePlan plan = must_plan(abstract_problem(1, 8, 8, true), Schedule::kSymmetricShift, 4);
  ASSERT_EQ(plan.num_ctas, 4);
  const ExpandedSchedule s = expand_schedule(plan);
  const auto visits = cta_visits(s, static_cta_jobs(s));
  const std::vector<std::vector<KvQ>> expected = {
      {{0, 3}, {0, 4}, {0, 5}, {0, 6}, {0, 7}, {0, 0}, {0, 1}, {0, 2}, {7, 7}},
      {{1, 4}, {1, 5}, {1, 6}, {1, 7}, {1, 3}, {1, 1}, {1, 2}, {6, 7}, {6, 6}},
      {{2, 5}, {2, 6}, {2, 7}, {2, 3}, {2, 4}, {2, 2}, {5, 7}, {5, 6}, {5, 5}},
      {{3, 6}, {3, 7}, {3, 3}, {3, 4}, {3, 5}, {4, 7}, {4, 6}, {4, 5}, {4, 4}},
  };
  for (int cta = 0; cta < 4; ++cta) {
    EXPECT_EQ(visits[cta].size(), 9u) << "every CTA does n + 1 visits";
    EXPECT_EQ(kv_q_pairs(visits[cta]), expected[cta]) << "cta " << cta;
  }
  const std::vector<std::vector<int>> orders = {{0},
                                                {1, 0},
                                                {2, 1, 0},
                                                {0, 3, 2, 1},
                                                {1, 0, 3, 2, 4},
                                                {2, 1, 0, 3, 4, 5},
                                                {3, 2, 1, 0, 4, 5, 6},
                                                {3, 2, 1, 0, 4, 5, 6, 7}};
  for (int q = 0; q < 8; ++q) EXPECT_EQ(accumulation_order(s, 0, q), orders[q]) << "Q" << q;
  for (double r : {0.25, 1.0}) {
    const SimulationResult sim = simulate(s, CostModel{1.0, r, 0.0});
    ASSERT_TRUE(sim.completed) << sim.stuck;
    EXPECT_DOUBLE_EQ(sim.makespan, 9 * (1.0 + r));
    EXPECT_DOUBLE_EQ(sim.bubble_fraction, 0.0);
  }
}

TEST(WorkedExamples, SymmetricShiftStride2TwoHeads) {
  const SchedulePlan plan = must_plan(abstract_problem(2, 4, 8, true, 2), Schedule::kSymmetricShift, 4);
  ASSERT_EQ(plan.num_ctas, 4);
  const ExpandedSchedule s = expand_schedule(plan);
  const auto visits = cta_visits(s, static_cta_jobs(s));
  const std::vector<KvQ> cta0 = {{0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6}, {0, 7}, {0, 0}, {0, 1}, {3, 7}, {3, 6}};
  const std::vector<KvQ> cta1 = {{1, 3}, {1, 4}, {1, 5}, {1, 6}, {1, 7}, {1, 2}, {2, 7}, {2, 6}, {2, 5}, {2, 4}};
  // CTAs 2 and 3 do the same for head 1.
  for (int cta = 0; cta < 4; ++cta) {
    EXPECT_EQ(kv_q_pairs(visits[cta]), cta % 2 == 0 ? cta0 : cta1) << "cta " << cta;
    for (const testing::Visit& v : visits[cta]) EXPECT_EQ(v.head, cta / 2) << "cta " << cta;
  }
  for (double r : {0.25, 1.0}) {
    const SimulationResult sim = simulate(s, CostModel{1.0, r, 0.0});
    ASSERT_TRUE(sim.completed) << sim.stuck;
    EXPECT_DOUBLE_EQ(sim.makespan, 10 * (1.0 + r));
  }
}

TEST(WorkedExamples, FullAscendingStaircaseVersusShift) {
  const CostModel costs{1.0, 0.5, 0.0};
  const TiledProblem problem = abstract_problem(1, 4, 4, false);
  const ExpandedSchedule ascending = expand_schedule(must_plan(problem, Schedule::kAscending, 4));
  const SimulationResult sim = simulate(ascending, costs, true);
  ASSERT_TRUE(sim.completed) << sim.stuck;
  EXPECT_DOUBLE_EQ(sim.makespan, 7.5);
  // The start-up staircase: CTA j's first reduce starts at 1 + 0.5 j (it waits for KV0..KV j-1 on Q0).
  for (int cta = 0; cta < 4; ++cta) {
    const auto& segments = sim.timeline[cta];
    const auto first_reduce = std::find_if(segments.begin(), segments.end(),
                                           [](const Segment& seg) { return seg.kind == SegmentKind::kReduce; });
    ASSERT_NE(first_reduce, segments.end());
    EXPECT_DOUBLE_EQ(first_reduce->start, 1.0 + 0.5 * cta) << "cta " << cta;
  }
  const ExpandedSchedule shift = expand_schedule(must_plan(problem, Schedule::kShift, 4));
  EXPECT_DOUBLE_EQ(simulate(shift, costs).makespan, 6.0);
}

TEST(WorkedExamples, CausalDescending) {
  // KV j visits Q m-1 down to Q j, and every query tile sums KV0, KV1, ... in order.
  const ExpandedSchedule small = expand_schedule(must_plan(abstract_problem(1, 4, 4, true), Schedule::kDescending, 4));
  for (const ExpandedJob& ej : small.jobs) {
    std::vector<int> q;
    for (int k = ej.first_step; k < ej.first_step + ej.job.num_steps; ++k) q.push_back(small.steps[k].q_tile);
    std::vector<int> expected;
    for (int v = 3; v >= ej.job.kv_tile; --v) expected.push_back(v);
    EXPECT_EQ(q, expected) << "KV" << ej.job.kv_tile;
  }
  for (int v = 0; v < 4; ++v) {
    std::vector<int> expected;
    for (int kv = 0; kv <= v; ++kv) expected.push_back(kv);
    EXPECT_EQ(accumulation_order(small, 0, v), expected) << "Q" << v;
  }
  const CostModel costs{1.0, 0.25, 0.0};
  const ExpandedSchedule one = expand_schedule(must_plan(abstract_problem(1, 8, 8, true), Schedule::kDescending, 8));
  const ExpandedSchedule two = expand_schedule(must_plan(abstract_problem(2, 8, 8, true), Schedule::kDescending, 8));
  EXPECT_DOUBLE_EQ(simulate(one, costs).makespan, 10.0);
  EXPECT_DOUBLE_EQ(simulate(two, costs).makespan, 13.0);
  EXPECT_DOUBLE_EQ(13.0, 2 * 9 * 1.25 / 2 + 7 * 0.25);
}

// The notes (3.6) give 15.0 for shortest-first with n = 8 and 2 heads. That figure interleaves the two
// heads' tiles as FA3's L2-section scheduler does; this schedule dispatches head-major (all of head 0's
// units, then head 1's), which gives 16.25. Symmetric shift needs 11.25 = 2 (n + 1)(c + r) / 2 either way.
TEST(WorkedExamples, ShortestFirstIsHeadMajor) {
  const CostModel costs{1.0, 0.25, 0.0};
  const TiledProblem p = abstract_problem(2, 8, 8, true);
  EXPECT_DOUBLE_EQ(simulate(expand_schedule(must_plan(p, Schedule::kShortestFirst, 8)), costs).makespan, 16.25);
  EXPECT_DOUBLE_EQ(simulate(expand_schedule(must_plan(p, Schedule::kSymmetricShift, 8)), costs).makespan, 11.25);
}

}  // namespace
}  // namespace dash
