// Tests of the CPU emulator: every deterministic schedule gives bitwise-identical gradients under
// random timing and matches the float64 reference, under sliding windows and softcap too; the nondeterministic
// schedule is caught; the key/value-ordered schedules do not depend on the SM count; a plan that cannot
// finish is reported, and a plan of another shape or window is refused.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/emulator.hpp"
#include "emulator_test_constants.hpp"
#include "planner/schedule_plan.hpp"
#include "schedule/schedule.hpp"

namespace dash {
namespace {

constexpr int kRuns = 5;
constexpr int kDelayUs = 20;

struct Case {
  const char* name;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  bool causal;
  int sms;
  int group_splits;  // 0: choose_group_splits
  SlidingWindow window{};
};

AttentionShape shape_of(const Case& c) {
  AttentionShape s;
  s.batch = c.batch;
  s.heads_q = c.heads_q;
  s.heads_kv = c.heads_kv;
  s.seqlen_q = c.seqlen_q;
  s.seqlen_k = c.seqlen_k;
  s.head_dim = kHeadDim;
  s.causal = c.causal;
  s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  return s;
}

EmulatorOptions options(int delay_us = kDelayUs) {
  EmulatorOptions o;
  o.runs = kRuns;
  o.max_delay_us = delay_us;
  return o;
}

const Case kCases[] = {
    {"full_3sms", 1, 2, 2, 192, 192, false, 3, 0},
    {"causal_ragged_odd_kv_tiles_7sms", 1, 2, 2, 200, 200, true, 7, 0},
    {"full_sq_lt_sk_ragged", 2, 1, 1, 150, 224, false, 5, 0},
    {"causal_sq_gt_sk_empty_rows", 1, 2, 2, 256, 160, true, 4, 0},
    {"causal_sq_lt_sk", 1, 2, 2, 96, 224, true, 3, 0},
    {"gqa_causal_splits1", 1, 4, 2, 160, 160, true, 5, 1},
    {"gqa_causal_splits2", 1, 4, 2, 160, 160, true, 5, 2},
    {"gqa_full_splits2_odd", 1, 4, 1, 224, 224, false, 7, 2},
    {"full_132sms", 2, 9, 9, 256, 256, false, 132, 0},
    {"causal_132sms", 3, 12, 12, 256, 256, true, 132, 0},
    // Sliding windows: a causal band that symmetric shift folds (16x32 tiles: a slope of 2), one whose
    // triangle has a middle tile and ragged lengths, two-sided, GQA with seqlen_q > seqlen_k, a right bound
    // of 0 (the causal band of seqlen_q < seqlen_k) and a right bound that hides the first rows.
    {"causal_window_folded", 1, 2, 2, 256, 256, true, 5, 0, {63, -1}},
    {"causal_window_ragged_middle", 2, 2, 2, 250, 230, true, 7, 0, {40, -1}},
    {"two_sided_window", 1, 2, 2, 200, 224, false, 4, 0, {30, 20}},
    {"gqa_causal_window_sq_gt_sk", 1, 4, 2, 192, 160, true, 5, 1, {50, -1}},
    {"window_right_0_sq_lt_sk", 1, 2, 1, 96, 224, false, 3, 0, {25, 0}},
    {"window_hides_first_rows", 2, 2, 2, 224, 96, false, 4, 0, {-1, 10}},
};

class DeterministicSchedules : public testing::TestWithParam<Case> {};

// Every deterministic schedule that plans `problem` on `sms` SMs completes, keeps its bits over the runs and is within
// the float32 tolerance of the inputs' float64 reference; ascending, descending and shortest-first apply to every
// shape, shift or symmetric shift to most.
void expect_deterministic_schedules_match_reference(const EmulatorInputs& inputs, const TiledProblem& problem,
                                                    int sms) {
  int emulated = 0;
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kAuto || schedule == Schedule::kNondeterministic) continue;
    const PlanResult planned = make_schedule_plan(problem, schedule, sms);
    if (!planned.ok()) continue;
    SCOPED_TRACE(std::string(schedule_name(schedule)));
    const EmulationResult r = emulate(inputs, planned.plan, options());
    ASSERT_TRUE(r.completed) << r.error;
    EXPECT_EQ(r.runs, kRuns);
    EXPECT_TRUE(r.bitwise_identical);
    EXPECT_LT(r.max_rel_error(), kFloat32Tolerance)
        << "dq " << r.error_vs_reference.dq << " dk " << r.error_vs_reference.dk << " dv " << r.error_vs_reference.dv;
    ++emulated;
  }
  EXPECT_GE(emulated, 3);
}

TEST_P(DeterministicSchedules, BitwiseIdenticalAcrossRunsAndMatchReference) {
  const Case& c = GetParam();
  const AttentionShape shape = shape_of(c);
  expect_deterministic_schedules_match_reference(make_emulator_inputs(shape, /*seed=*/7, c.window),
                                                 make_emulator_problem(shape, kSmallTiles, c.group_splits, c.window),
                                                 c.sms);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeterministicSchedules, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& param) { return std::string(param.param.name); });

// The windows of the GPU tests (kernels/test_sm90_variants.cpp) at the kernels' own tiles (backward_tile_shape of
// head dims 64, 128, 192 and 256: 128x128, 64x128 and the key split's 64x96 and 64x80), with the schedules the API
// runs under a window: rows that see no key, keys that no row sees (key/value tiles whose jobs have no step),
// seqlen_q != seqlen_k both ways with GQA, the diagonal alone.
TEST(Emulator, TheGpuTestsWindowsAtTheKernelsTiles) {
  const Case cases[] = {
      {"rows_without_keys", 1, 2, 2, 400, 100, false, 4, 0, {20, 5}},
      {"keys_without_rows", 1, 2, 2, 128, 1000, false, 4, 0, {50, 10}},
      {"causal_sq_gt_sk_mqa", 2, 4, 1, 777, 300, true, 6, 0, {100, -1}},
      {"two_sided_sq_lt_sk_gqa", 1, 4, 2, 300, 777, false, 5, 0, {200, 30}},
      {"diagonal", 1, 2, 2, 257, 257, false, 3, 0, {0, 0}},
  };
  for (const int head_dim : {64, 128, 192, 256}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " at the tiles of head dim " + std::to_string(head_dim));
      const AttentionShape shape = shape_of(c);
      const EmulatorInputs inputs = make_emulator_inputs(shape, /*seed=*/13, c.window);
      const TiledProblem problem =
          make_emulator_problem(shape, backward_tile_shape(head_dim), c.group_splits, c.window);
      ASSERT_TRUE(problem.windowed() || problem.causal);
      for (Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst}) {
        SCOPED_TRACE(std::string(schedule_name(schedule)));
        const PlanResult planned = make_schedule_plan(problem, schedule, c.sms);
        ASSERT_TRUE(planned.ok()) << planned.rejected;
        if (std::string(c.name) == "keys_without_rows") {
          int stepless = 0;
          for (int unit = 0; unit < planned.plan.num_units; ++unit) {
            stepless += make_job(planned.plan, unit, 0).num_steps == 0;
          }
          EXPECT_GT(stepless, 0) << "the case is there for key/value tiles no row sees";
        }
        const EmulationResult r = emulate(inputs, planned.plan, options());
        ASSERT_TRUE(r.completed) << r.error;
        EXPECT_TRUE(r.bitwise_identical);
        EXPECT_LT(r.max_rel_error(), kFloat32Tolerance) << "dq " << r.error_vs_reference.dq << " dk "
                                                        << r.error_vs_reference.dk << " dv " << r.error_vs_reference.dv;
      }
    }
  }
}

// d = 192's 64x96 and d = 256's 64x80 tiles, whose block_kv is not a multiple of block_q: every schedule the planner
// accepts, and the one auto picks, keeps its bits over timings and matches the float64 reference on ragged lengths
// (inside one tile, one short of or past either tile: 1, 63, 95, 97, 191 at 64x96 and 1, 63, 79, 81, 159 at 64x80;
// 1000, 11 or 13 key/value tiles, an odd count), seqlen_q != seqlen_k both ways, GQA, the causal mask, a causal and a
// two-sided window; symmetric shift is refused by name wherever the mask would otherwise admit it.
TEST(Emulator, EveryAcceptedScheduleAtTheTilesOfHeadDims192And256) {
  struct Tiles {
    int head_dim, block_kv;
    int lengths[8][2];
  };
  const Tiles cases[] = {
      {192, 96, {{1, 1}, {63, 95}, {97, 63}, {95, 97}, {191, 191}, {1000, 1000}, {1000, 191}, {97, 1000}}},
      {256, 80, {{1, 1}, {63, 79}, {81, 63}, {79, 81}, {159, 159}, {1000, 1000}, {1000, 159}, {81, 1000}}},
  };
  const SlidingWindow masks[] = {{-1, -1}, {150, -1}, {70, 40}};
  for (const Tiles& t : cases) {
    const TileShape tiles = backward_tile_shape(t.head_dim);
    ASSERT_EQ(tiles.block_q, 64);
    ASSERT_EQ(tiles.block_kv, t.block_kv);
    int emulated = 0;
    int shift_emulated = 0;
    int refused_symmetric = 0;
    for (const auto& [seqlen_q, seqlen_k] : t.lengths) {
      for (const bool causal : {false, true}) {
        for (const SlidingWindow& window : masks) {
          const Case c{"uneven_tiles", 1, 4, 2, seqlen_q, seqlen_k, causal, 7, 0, window};
          const AttentionShape shape = shape_of(c);
          const TiledProblem problem = make_emulator_problem(shape, tiles, 0, window);
          const EmulatorInputs inputs = make_emulator_inputs(shape, /*seed=*/19, window);
          const Schedule chosen = choose_schedule(problem, c.sms);
          for (Schedule schedule : kAllSchedules) {
            if (schedule == Schedule::kAuto || schedule == Schedule::kNondeterministic) continue;
            SCOPED_TRACE(std::string(schedule_name(schedule)) + " head_dim " + std::to_string(t.head_dim) + " sq " +
                         std::to_string(seqlen_q) + " sk " + std::to_string(seqlen_k) + (causal ? " causal" : " full") +
                         " window " + std::to_string(window.left) + "," + std::to_string(window.right));
            const PlanResult planned = make_schedule_plan(problem, schedule, c.sms);
            if (schedule == chosen) {
              ASSERT_TRUE(planned.ok()) << "auto picked a refused schedule: " << planned.rejected;
            }
            if (schedule == Schedule::kSymmetricShift && problem.causal) {
              EXPECT_NE(planned.rejected.find("symmetric-shift needs block_kv to be a multiple of block_q"),
                        std::string::npos)
                  << planned.rejected;
              ++refused_symmetric;
            }
            if (!planned.ok()) continue;
            const EmulationResult r = emulate(inputs, planned.plan, options(5));
            ASSERT_TRUE(r.completed) << r.error;
            EXPECT_TRUE(r.bitwise_identical);
            EXPECT_LT(r.max_rel_error(), kFloat32Tolerance)
                << "dq " << r.error_vs_reference.dq << " dk " << r.error_vs_reference.dk << " dv "
                << r.error_vs_reference.dv;
            ++emulated;
            shift_emulated += schedule == Schedule::kShift;
          }
        }
      }
    }
    // Ascending, descending and shortest-first everywhere; shift on the full masks whose query tiles outnumber a
    // wave.
    EXPECT_GT(emulated, 3 * 8 * 2 * 3) << "head_dim " << t.head_dim;
    EXPECT_GT(shift_emulated, 0) << "head_dim " << t.head_dim;
    EXPECT_GT(refused_symmetric, 0) << "head_dim " << t.head_dim;
  }
}

// Softcap (Gemma 2's cap of the scaled scores, here at 0.5, where scores of about +-1 bend hard): every deterministic
// schedule keeps its bits and matches the float64 reference of the capped attention, and differs from the uncapped
// one by far more than the tolerance, so the comparison would catch an emulator that ignored the cap.
TEST(Emulator, SoftcapSchedulesMatchTheCappedReference) {
  const Case cases[] = {
      {"causal_softcap", 1, 2, 2, 200, 200, true, 5, 0},
      {"window_softcap_gqa", 1, 4, 2, 224, 192, false, 4, 0, {40, 20}},
  };
  constexpr float kSoftcap = 0.5f;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    AttentionShape shape = shape_of(c);
    shape.softmax_scale = 1.0f;  // scores of order 1 with inputs in [-1, 1] and 64 dims: past the cap
    const EmulatorInputs uncapped = make_emulator_inputs(shape, /*seed=*/21, c.window);
    shape.softcap = kSoftcap;
    const EmulatorInputs inputs = make_emulator_inputs(shape, /*seed=*/21, c.window);
    double largest = 0.0, apart = 0.0;
    for (size_t i = 0; i < inputs.ref_dq.size(); ++i) {
      largest = std::max(largest, std::abs(inputs.ref_dq[i]));
      apart = std::max(apart, std::abs(inputs.ref_dq[i] - uncapped.ref_dq[i]));
    }
    EXPECT_GT(apart, 100 * kFloat32Tolerance * largest) << "the cap must change dQ";
    expect_deterministic_schedules_match_reference(
        inputs, make_emulator_problem(shape, kSmallTiles, c.group_splits, c.window), c.sms);
  }
}

TEST(Emulator, PaperScheduleAppliesWhereExpected) {
  // Guards the suite above against silently skipping the DASH schedules.
  const AttentionShape full = shape_of(kCases[0]);
  const AttentionShape causal = shape_of(kCases[1]);
  EXPECT_TRUE(make_schedule_plan(make_emulator_problem(full, kSmallTiles), Schedule::kShift, 3).ok());
  EXPECT_TRUE(make_schedule_plan(make_emulator_problem(causal, kSmallTiles), Schedule::kSymmetricShift, 7).ok());
  for (const Case& c : kCases) {
    if (std::string(c.name).rfind("causal_window", 0) != 0) continue;
    const TiledProblem band = make_emulator_problem(shape_of(c), kSmallTiles, c.group_splits, c.window);
    EXPECT_TRUE(band.windowed()) << c.name;
    EXPECT_TRUE(make_schedule_plan(band, Schedule::kSymmetricShift, c.sms).ok()) << c.name;
  }
}

TEST(Emulator, NondeterministicScheduleIsCaught) {
  // Eight key/value tiles on eight CTAs: every dQ tile sums eight partials in arrival order, and long
  // random delays reorder them, so the fp32 bits change from run to run (with two partials they could
  // not: a + b == b + a).
  const Case c{"nondeterministic", 1, 2, 2, 256, 256, false, 8, 0};
  const AttentionShape shape = shape_of(c);
  const PlanResult planned =
      make_schedule_plan(make_emulator_problem(shape, kSmallTiles), Schedule::kNondeterministic, c.sms);
  ASSERT_TRUE(planned.ok());
  const EmulationResult r = emulate(shape, planned.plan, options(/*delay_us=*/200));
  ASSERT_TRUE(r.completed) << r.error;
  EXPECT_FALSE(r.bitwise_identical);
  EXPECT_LT(r.max_rel_error(), kFloat32Tolerance);
}

TEST(Emulator, KvOrderedSchedulesDoNotDependOnSmCount) {
  // Their summation orders depend on key/value tile indices only, so two GPUs with different SM counts
  // give the same bits (at a fixed group split: the split decides how dK/dV are summed).
  const Case c{"gqa_causal", 1, 4, 2, 200, 200, true, 0, 2};
  const AttentionShape shape = shape_of(c);
  const EmulatorInputs inputs = make_emulator_inputs(shape, /*seed=*/11);
  for (Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst}) {
    SCOPED_TRACE(std::string(schedule_name(schedule)));
    std::vector<EmulationResult> results;
    for (int sms : {3, 132}) {
      const PlanResult planned =
          make_schedule_plan(make_emulator_problem(shape, kSmallTiles, c.group_splits), schedule, sms);
      ASSERT_TRUE(planned.ok());
      results.push_back(emulate(inputs, planned.plan, options()));
      ASSERT_TRUE(results.back().completed) << results.back().error;
      EXPECT_TRUE(results.back().bitwise_identical);
      EXPECT_LT(results.back().max_rel_error(), kFloat32Tolerance);
    }
    EXPECT_EQ(results[0].run_hashes[0], results[1].run_hashes[0]);
    EXPECT_EQ(results[0].gradients.dq, results[1].gradients.dq);
    EXPECT_EQ(results[0].gradients.dk, results[1].gradients.dk);
    EXPECT_EQ(results[0].gradients.dv, results[1].gradients.dv);
  }
}

TEST(Emulator, MissingCtaIsReportedAsDeadlock) {
  // Shift needs all CTAs resident: drop the last one and the lanes before it wait for its rank-0
  // contribution to query tile 3 forever. The emulator must say so instead of hanging.
  const Case c{"shift", 1, 1, 1, 128, 128, false, 4, 0};
  const AttentionShape shape = shape_of(c);
  PlanResult planned = make_schedule_plan(make_emulator_problem(shape, kSmallTiles), Schedule::kShift, c.sms);
  ASSERT_TRUE(planned.ok());
  planned.plan.num_units -= 1;
  EmulatorOptions o = options(0);
  o.wait_timeout_s = 0.2;
  const EmulationResult r = emulate(shape, planned.plan, o);
  EXPECT_FALSE(r.completed);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
}

TEST(Emulator, RejectsPlanOfAnotherShape) {
  const AttentionShape shape = shape_of(kCases[0]);
  AttentionShape other = shape;
  other.seqlen_k = shape.seqlen_k / 2;
  const PlanResult planned = make_schedule_plan(make_emulator_problem(other, kSmallTiles), Schedule::kAscending, 3);
  EXPECT_THROW(emulate(shape, planned.plan, options()), std::invalid_argument);
  EmulatorOptions one_run = options();
  one_run.runs = 1;
  const PlanResult right = make_schedule_plan(make_emulator_problem(shape, kSmallTiles), Schedule::kAscending, 3);
  EXPECT_THROW(emulate(shape, right.plan, one_run), std::invalid_argument);
  // A plan of the shape under a window, run on inputs without it (or with another one).
  const PlanResult windowed =
      make_schedule_plan(make_emulator_problem(shape, kSmallTiles, 0, SlidingWindow{20, 5}), Schedule::kAscending, 3);
  ASSERT_TRUE(windowed.ok());
  EXPECT_THROW(emulate(make_emulator_inputs(shape, 1), windowed.plan, options()), std::invalid_argument);
  EXPECT_THROW(emulate(make_emulator_inputs(shape, 1, SlidingWindow{20, 6}), windowed.plan, options()),
               std::invalid_argument);
  EXPECT_NO_THROW(emulate(make_emulator_inputs(shape, 1, SlidingWindow{20, 5}), windowed.plan, options()));
}

}  // namespace
}  // namespace dash
