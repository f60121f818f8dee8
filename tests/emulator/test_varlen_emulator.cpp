// Tests of the emulator on varlen batches (emulate_varlen): every schedule, its plan made from the maximum lengths
// alone, runs adversarial length vectors (all empty, one long among empty ones, lengths one past tile multiples,
// random) with bitwise-identical gradients across timings that match the float64 reference per sequence; a
// sequence at the maximum lengths gives the dense emulation's bits; the nondeterministic schedule and a plan
// missing a unit are caught; inputs outside the plan are refused.
#include <cmath>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "emulator/emulator.hpp"
#include "emulator_test_constants.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/varlen_plan.hpp"

namespace dash {
namespace {

constexpr int kRuns = 4;
constexpr int kMaxLen = 160;

AttentionShape max_shape(int sequences, bool causal) {
  AttentionShape s;
  s.batch = sequences;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.seqlen_q = kMaxLen;
  s.seqlen_k = kMaxLen;
  s.head_dim = kHeadDim;
  s.causal = causal;
  s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  return s;
}

EmulatorOptions options(int delay_us) {
  EmulatorOptions o;
  o.runs = kRuns;
  o.max_delay_us = delay_us;
  return o;
}

struct LengthCase {
  const char* name;
  std::vector<SequenceLengths> lengths;  // seqlen_k <= seqlen_q: admitted by every plan
};

std::vector<LengthCase> length_cases() {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> length(0, kMaxLen);
  std::vector<SequenceLengths> random;
  for (int b = 0; b < 5; ++b) {
    const int q = length(rng);
    random.push_back({q, std::uniform_int_distribution<int>(0, q)(rng)});
  }
  return {
      {"all_empty", {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}}},
      {"one_long_many_empty", {{0, 0}, {0, 0}, {kMaxLen, kMaxLen}, {0, 0}, {0, 0}}},
      {"one_past_tile_multiples", {{1, 1}, {17, 17}, {33, 33}, {65, 33}, {129, 97}}},
      {"shorter_than_a_tile", {{1, 1}, {15, 3}, {2, 0}, {31, 31}, {5, 5}}},
      {"random", random},
  };
}

class VarlenSchedules : public testing::TestWithParam<bool> {};  // causal or full

TEST_P(VarlenSchedules, AdversarialLengthsAreBitwiseIdenticalAndMatchTheReference) {
  const bool causal = GetParam();
  const AttentionShape shape = max_shape(5, causal);
  const TiledProblem problem = make_emulator_problem(shape, kSmallTiles, /*group_splits=*/2);
  int emulated = 0;
  for (const LengthCase& lengths : length_cases()) {
    const EmulatorInputs inputs = make_varlen_emulator_inputs(shape, lengths.lengths, /*seed=*/5);
    for (const Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst,
                                    Schedule::kShift, Schedule::kSymmetricShift}) {
      const VarlenPlanResult planned =
          plan_varlen_schedule(problem, /*keys_within_queries=*/true, /*lengths_fill_maxima=*/true, schedule, 5);
      if (!planned.ok()) continue;  // shift under the causal mask, symmetric shift under the full one
      ASSERT_TRUE(prove_varlen_plan(planned.plan).ok());
      SCOPED_TRACE(std::string(lengths.name) + " " + std::string(schedule_name(schedule)));
      const EmulationResult r = emulate_varlen(inputs, planned.plan, options(20));
      ASSERT_TRUE(r.completed) << r.error;
      EXPECT_TRUE(r.bitwise_identical);
      EXPECT_LT(r.max_rel_error(), kFloat32Tolerance)
          << "dq " << r.error_vs_reference.dq << " dk " << r.error_vs_reference.dk << " dv " << r.error_vs_reference.dv;
      ++emulated;
    }
  }
  EXPECT_EQ(emulated, 4 * static_cast<int>(length_cases().size()));
}

INSTANTIATE_TEST_SUITE_P(Masks, VarlenSchedules, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& param) { return param.param ? "causal" : "full"; });

// d = 192's 64x96 and d = 256's 64x80 tiles (block_kv not a multiple of block_q) on ragged vectors (empty, 1, inside
// one tile, one short of or past either tile, 1000, keys within and past the queries): every schedule the varlen
// planner admits, and auto under either hint, is proven for every length and keeps its bits across timings; symmetric
// shift is refused by name.
TEST(VarlenEmulator, RaggedLengthsAtTheTilesOfHeadDims192And256) {
  struct Tiles {
    int head_dim;
    std::vector<SequenceLengths> within, past;
  };
  const Tiles cases[] = {
      {192,
       {{1, 1}, {63, 63}, {95, 95}, {97, 97}, {191, 191}, {1000, 1000}, {0, 0}, {1000, 97}, {191, 63}},
       {{1, 95}, {63, 1000}, {97, 191}, {1000, 1}, {0, 97}}},
      {256,
       {{1, 1}, {63, 63}, {79, 79}, {81, 81}, {159, 159}, {1000, 1000}, {0, 0}, {1000, 81}, {159, 63}},
       {{1, 79}, {63, 1000}, {81, 159}, {1000, 1}, {0, 81}}},
  };
  for (const Tiles& t : cases) {
    const TileShape tiles = backward_tile_shape(t.head_dim);
    ASSERT_NE(tiles.block_kv % tiles.block_q, 0) << "head_dim " << t.head_dim;
    std::set<Schedule> emulated;
    for (const bool causal : {false, true}) {
      for (const SlidingWindow window : {SlidingWindow{}, SlidingWindow{130, -1}}) {
        for (const bool promise : {true, false}) {
          const std::vector<SequenceLengths>& lengths = promise ? t.within : t.past;
          AttentionShape shape = max_shape(static_cast<int>(lengths.size()), causal);
          shape.seqlen_q = shape.seqlen_k = 1000;
          const TiledProblem problem = make_emulator_problem(shape, tiles, /*group_splits=*/2, window);
          const EmulatorInputs inputs = make_varlen_emulator_inputs(shape, lengths, /*seed=*/7, window);
          for (const Schedule schedule : kAllSchedules) {
            if (schedule == Schedule::kNondeterministic) continue;
            for (const bool fill : {true, false}) {
              if (schedule != Schedule::kAuto && !fill) continue;  // the hint only steers auto
              SCOPED_TRACE(std::string(schedule_name(schedule)) + " head_dim " + std::to_string(t.head_dim) +
                           (causal ? " causal" : " full") + " window " + std::to_string(window.left) +
                           (promise ? " keys within queries" : " keys past queries") +
                           (fill ? "" : ", lengths below the maxima"));
              const VarlenPlanResult planned = plan_varlen_schedule(problem, promise, fill, schedule, 9);
              if (schedule == Schedule::kAuto) {
                ASSERT_TRUE(planned.ok()) << planned.rejected;
                EXPECT_NE(planned.plan.plan.kind, Schedule::kSymmetricShift);
              }
              if (schedule == Schedule::kSymmetricShift && causal && promise && window.left < 0) {
                EXPECT_NE(planned.rejected.find("symmetric-shift needs block_kv to be a multiple of block_q"),
                          std::string::npos)
                    << planned.rejected;
              }
              if (!planned.ok()) continue;
              ASSERT_TRUE(prove_varlen_plan(planned.plan).ok()) << prove_varlen_plan(planned.plan).summary;
              const EmulationResult r = emulate_varlen(inputs, planned.plan, options(5));
              ASSERT_TRUE(r.completed) << r.error;
              EXPECT_TRUE(r.bitwise_identical);
              EXPECT_LT(r.max_rel_error(), kFloat32Tolerance)
                  << "dq " << r.error_vs_reference.dq << " dk " << r.error_vs_reference.dk << " dv "
                  << r.error_vs_reference.dv;
              emulated.insert(planned.plan.plan.kind);
            }
          }
        }
      }
    }
    EXPECT_EQ(emulated, (std::set<Schedule>{Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst,
                                            Schedule::kShift}))
        << "head_dim " << t.head_dim;
  }
}

// The dynamic schedules take any lengths: keys past queries, under the causal mask and a sliding window.
TEST(VarlenEmulator, DynamicSchedulesTakeKeysLongerThanQueries) {
  const AttentionShape shape = max_shape(3, true);
  const SlidingWindow window{40, -1};
  const std::vector<SequenceLengths> lengths{{20, 150}, {0, 33}, {160, 1}};
  const EmulatorInputs inputs = make_varlen_emulator_inputs(shape, lengths, 3, window);
  const TiledProblem problem = make_emulator_problem(shape, kSmallTiles, 1, window);
  for (const Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst}) {
    const VarlenPlanResult planned = plan_varlen_schedule(problem, false, true, schedule, 4);
    ASSERT_TRUE(planned.ok()) << planned.rejected;
    const EmulationResult r = emulate_varlen(inputs, planned.plan, options(20));
    ASSERT_TRUE(r.completed) << r.error;
    EXPECT_TRUE(r.bitwise_identical);
    EXPECT_LT(r.max_rel_error(), kFloat32Tolerance) << schedule_name(schedule);
  }
}

// A batch of sequences at the maximum lengths is the dense batch: the same bits, every schedule.
TEST(VarlenEmulator, FullLengthSequencesGiveTheDenseBits) {
  for (const bool causal : {false, true}) {
    const AttentionShape shape = max_shape(2, causal);
    const std::vector<SequenceLengths> full(2, SequenceLengths{kMaxLen, kMaxLen});
    const EmulatorInputs dense = make_emulator_inputs(shape, 9);
    const EmulatorInputs varlen = make_varlen_emulator_inputs(shape, full, 9);
    const TiledProblem problem = make_emulator_problem(shape, kSmallTiles, 1);
    for (const Schedule schedule :
         {Schedule::kAscending, Schedule::kShortestFirst, Schedule::kShift, Schedule::kSymmetricShift}) {
      const VarlenPlanResult planned = plan_varlen_schedule(problem, true, true, schedule, 3);
      if (!planned.ok()) continue;
      const EmulationResult a = emulate(dense, planned.plan.plan, options(0));
      const EmulationResult b = emulate_varlen(varlen, planned.plan, options(0));
      ASSERT_TRUE(a.completed && b.completed) << a.error << b.error;
      EXPECT_EQ(a.run_hashes[0], b.run_hashes[0]) << schedule_name(schedule);
    }
  }
}

TEST(VarlenEmulator, NondeterministicScheduleIsCaught) {
  // As in test_emulator.cpp: eight key/value tiles per sequence on eight CTAs, long random delays.
  AttentionShape shape = max_shape(2, false);
  shape.seqlen_q = shape.seqlen_k = 256;
  const std::vector<SequenceLengths> lengths{{256, 256}, {3, 250}};
  const EmulatorInputs inputs = make_varlen_emulator_inputs(shape, lengths, 1);
  const VarlenPlanResult planned =
      plan_varlen_schedule(make_emulator_problem(shape, kSmallTiles), false, true, Schedule::kNondeterministic, 8);
  ASSERT_TRUE(planned.ok());
  const EmulationResult r = emulate_varlen(inputs, planned.plan, options(200));
  ASSERT_TRUE(r.completed) << r.error;
  EXPECT_FALSE(r.bitwise_identical);
  EXPECT_LT(r.max_rel_error(), kFloat32Tolerance);
}

TEST(VarlenEmulator, BrokenPlanIsReported) {
  // Shift with its last unit dropped: the lanes of its wave wait for a rank that never comes.
  const AttentionShape shape = max_shape(2, false);
  const std::vector<SequenceLengths> lengths{{70, 70}, {kMaxLen, kMaxLen}};
  const EmulatorInputs inputs = make_varlen_emulator_inputs(shape, lengths, 2);
  VarlenPlanResult planned =
      plan_varlen_schedule(make_emulator_problem(shape, kSmallTiles), true, true, Schedule::kShift, 4);
  ASSERT_TRUE(planned.ok()) << planned.rejected;
  planned.plan.plan.num_units -= 1;
  EmulatorOptions o = options(0);
  o.wait_timeout_s = 0.2;
  const EmulationResult r = emulate_varlen(inputs, planned.plan, o);
  EXPECT_FALSE(r.completed);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
}

TEST(VarlenEmulator, RefusesInputsOutsideThePlan) {
  const AttentionShape shape = max_shape(2, true);
  const TiledProblem problem = make_emulator_problem(shape, kSmallTiles);
  const VarlenPlanResult planned = plan_varlen_schedule(problem, true, true, Schedule::kSymmetricShift, 4);
  ASSERT_TRUE(planned.ok()) << planned.rejected;
  const EmulatorInputs keys_past_queries = make_varlen_emulator_inputs(shape, {{10, 20}, {5, 5}}, 1);
  EXPECT_THROW(emulate_varlen(keys_past_queries, planned.plan, options(0)), std::invalid_argument);
  EXPECT_THROW(emulate(keys_past_queries, planned.plan.plan, options(0)), std::invalid_argument);
  EXPECT_THROW(emulate_varlen(make_emulator_inputs(shape, 1), planned.plan, options(0)), std::invalid_argument);
  EXPECT_THROW(make_varlen_emulator_inputs(shape, {{1, 1}}, 1), std::invalid_argument);
}

}  // namespace
}  // namespace dash
