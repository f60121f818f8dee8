// Varlen plans (planner/varlen_plan.hpp, schedule/varlen.hpp): a sequence at the maximum lengths runs exactly the
// plan's jobs; every admitted schedule's plan, fitted to every pair of small lengths (0 included) and to adversarial
// length vectors at the kernels' tile shapes, passes the validator; the refusals say why; what auto runs under
// the hint lengths_fill_maxima; and the same checks catch a corrupted order and a dropped job.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "planner/schedule_plan.hpp"
#include "planner/varlen_plan.hpp"

namespace dash {
namespace {

constexpr Schedule kDeterministic[] = {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst,
                                       Schedule::kShift, Schedule::kSymmetricShift};
constexpr Schedule kEverySchedule[] = {Schedule::kAscending, Schedule::kDescending,     Schedule::kShortestFirst,
                                       Schedule::kShift,     Schedule::kSymmetricShift, Schedule::kNondeterministic};

TiledProblem problem(int sequences, int heads_kv, int group_size, int group_splits, int max_q, int max_k, bool causal,
                     TileShape tiles) {
  TiledProblem p{};
  p.batch = sequences;
  p.heads_kv = heads_kv;
  p.group_size = group_size;
  p.group_splits = group_splits;
  p.seqlen_q = max_q;
  p.seqlen_k = max_k;
  p.block_q = tiles.block_q;
  p.block_kv = tiles.block_kv;
  p.causal = causal;
  return p;
}

// Whether `schedule` applies to the mask at all (shift: full; symmetric shift: causal).
bool fits_mask(Schedule schedule, bool causal) {
  return !(schedule == Schedule::kShift && causal) && !(schedule == Schedule::kSymmetricShift && !causal);
}

// The validator's verdict on the plan fitted to `lengths`.
std::string verdict(const VarlenPlan& plan, const std::vector<SequenceLengths>& lengths) {
  return validate_varlen_schedule(expand_varlen_schedule(plan, lengths), lengths).summary();
}

VarlenPlan planned(const TiledProblem& p, Schedule schedule, int sms) {
  const VarlenPlanResult result =
      plan_varlen_schedule(p, /*keys_within_queries=*/true, /*lengths_fill_maxima=*/true, schedule, sms);
  EXPECT_TRUE(result.ok()) << schedule_name(schedule) << ": " << result.rejected;
  return result.plan;
}

bool same_job(const Job& a, const Job& b) {
  return a.head == b.head && a.kv_tile == b.kv_tile && a.q_begin == b.q_begin && a.q_end == b.q_end &&
         a.num_steps == b.num_steps && a.lane == b.lane && a.wave_size == b.wave_size && a.earlier == b.earlier &&
         a.wave_shorts == b.wave_shorts && a.rect_begin == b.rect_begin && a.is_short == b.is_short &&
         a.valid == b.valid;
}

TEST(Varlen, SequencesAtTheMaximumLengthsRunThePlansJobs) {
  const TileShape tiles{16, 32};
  for (const bool causal : {false, true}) {
    for (const int max_len : {96, 130, 200}) {  // even and odd key/value tile counts, ragged tiles
      for (const int sms : {3, 5, 132}) {       // heads straddling waves, and one wave
        const TiledProblem p = problem(3, 2, 2, 1, max_len, max_len, causal, tiles);
        for (const Schedule schedule : kEverySchedule) {
          if (!fits_mask(schedule, causal)) continue;
          const VarlenPlan plan = planned(p, schedule, sms);
          const SequenceLengths full{max_len, max_len};
          for (int unit = 0; unit < plan.plan.num_units; ++unit) {
            for (int sub = 0; sub < plan.plan.jobs_per_unit; ++sub) {
              const Job expected = make_job(plan.plan, unit, sub);
              const Job fitted = make_varlen_job(plan.plan, unit, sub, full);
              ASSERT_TRUE(same_job(expected, fitted)) << schedule_name(schedule) << " unit " << unit << " sub " << sub;
            }
          }
        }
      }
    }
  }
}

// The lengths where tiles begin and end: 0, 1 and one either side of every multiple of both tile sizes.
std::vector<int> edge_lengths(int max_len, TileShape tiles) {
  std::vector<int> lengths{0, 1};
  for (int t = tiles.block_q; t <= max_len + 1; t += tiles.block_q) {
    for (const int len : {t - 1, t, t + 1}) lengths.push_back(len);
  }
  lengths.push_back(max_len);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  lengths.erase(std::remove_if(lengths.begin(), lengths.end(), [&](int l) { return l > max_len; }), lengths.end());
  return lengths;
}

// Every pair of edge lengths (admitted by the plan) for the middle sequence, the others at the maximum and at 0, so
// that the fitted head shares waves with full and empty neighbours: the theorems' claim, checked by enumeration.
TEST(Varlen, EveryPairOfEdgeLengthsIsValidForEveryAdmittedSchedule) {
  const TileShape tiles{16, 32};
  const int max_len = 3 * 32 + 5;
  const std::vector<int> lengths = edge_lengths(max_len, tiles);
  int checked = 0;
  for (const bool causal : {false, true}) {
    for (const int sms : {4, 7}) {
      const TiledProblem p = problem(3, 1, 2, 1, max_len, max_len, causal, tiles);
      for (const Schedule schedule : kEverySchedule) {
        if (!fits_mask(schedule, causal)) continue;
        const VarlenPlan plan = planned(p, schedule, sms);
        ASSERT_TRUE(prove_varlen_plan(plan).ok()) << schedule_name(schedule);
        for (const int q : lengths) {
          for (const int k : lengths) {
            const std::vector<SequenceLengths> vec{{max_len, max_len}, {q, k}, {0, 0}};
            if (!check_varlen_lengths(plan, vec).empty()) continue;  // keys past queries: not admitted
            ASSERT_EQ(verdict(plan, vec), "valid") << schedule_name(schedule) << (causal ? " causal" : " full")
                                                   << " sms " << sms << " lengths " << q << ", " << k;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 2000);
}

// The dynamic schedules need no promise: every pair, keys longer than queries included, under windows too.
TEST(Varlen, DynamicSchedulesAreValidForEveryPairWithoutPromise) {
  const TileShape tiles{16, 32};
  const int max_len = 2 * 32 + 3;
  const std::vector<int> lengths = edge_lengths(max_len, tiles);
  for (const SlidingWindow window : {SlidingWindow{}, SlidingWindow{20, -1}, SlidingWindow{10, 7}}) {
    for (const bool causal : {false, true}) {
      TiledProblem p = problem(2, 1, 2, 2, max_len, max_len, causal, tiles);
      p.window = window;
      for (const Schedule schedule :
           {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst, Schedule::kNondeterministic}) {
        const VarlenPlanResult result = plan_varlen_schedule(p, false, true, schedule, 5);
        ASSERT_TRUE(result.ok()) << result.rejected;
        ASSERT_TRUE(prove_varlen_plan(result.plan).ok());
        for (const int q : lengths) {
          for (const int k : lengths) {
            const std::vector<SequenceLengths> vec{{q, k}, {k, q}};
            ASSERT_EQ(verdict(result.plan, vec), "valid") << schedule_name(schedule) << " " << q << ", " << k;
          }
        }
      }
    }
  }
}

// Length vectors that stress the fitting at the kernels' tile shapes: all empty, one long among many empty, lengths
// one past tile multiples, and random ones; every schedule, with GQA and heads straddling waves.
std::vector<std::vector<SequenceLengths>> adversarial(int sequences, int max_len, uint64_t seed) {
  std::vector<std::vector<SequenceLengths>> vectors;
  vectors.emplace_back(sequences, SequenceLengths{0, 0});
  std::vector<SequenceLengths> one_long(sequences, SequenceLengths{0, 0});
  one_long[sequences / 2] = {max_len, max_len};
  vectors.push_back(one_long);
  std::vector<SequenceLengths> past_multiples;
  for (int b = 0; b < sequences; ++b) {
    const int len = std::min(max_len, (b % 9) * 64 + 1);
    past_multiples.push_back({len, len});
  }
  vectors.push_back(past_multiples);
  std::vector<SequenceLengths> ones(sequences, SequenceLengths{1, 1});
  vectors.push_back(ones);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int> length(0, max_len);
  for (int draw = 0; draw < 4; ++draw) {
    std::vector<SequenceLengths> random;
    for (int b = 0; b < sequences; ++b) {
      const int q = length(rng);
      random.push_back({q, std::uniform_int_distribution<int>(0, q)(rng)});  // keys within queries
    }
    vectors.push_back(random);
  }
  return vectors;
}

// Every head dim's tiles, d = 192's 64x96 and d = 256's 64x80 among them (block_kv not a multiple of block_q), where
// the planner refuses symmetric shift by name.
TEST(Varlen, AdversarialLengthsAtKernelTilesAreValid) {
  for (const int head_dim : {64, 128, 192, 256}) {
    const TileShape tiles = backward_tile_shape(head_dim);
    for (const bool causal : {false, true}) {
      const int max_len = 1000;
      const TiledProblem p = problem(12, 2, 4, 2, max_len, max_len, causal, tiles);
      for (const Schedule schedule : kEverySchedule) {
        if (!fits_mask(schedule, causal)) continue;
        if (schedule == Schedule::kSymmetricShift && tiles.block_kv % tiles.block_q != 0) {
          EXPECT_NE(plan_varlen_schedule(p, true, true, schedule, 132)
                        .rejected.find("symmetric-shift needs block_kv to be a multiple of block_q"),
                    std::string::npos);
          continue;
        }
        for (const int sms : {132, 17}) {
          const VarlenPlan plan = planned(p, schedule, sms);
          ASSERT_TRUE(prove_varlen_plan(plan).ok());
          for (const auto& lengths : adversarial(p.batch, max_len, 7 + sms)) {
            ASSERT_EQ(verdict(plan, lengths), "valid") << schedule_name(schedule) << " hd " << head_dim;
          }
        }
      }
    }
  }
}

TEST(Varlen, RefusesWhatIsNotProvenForEveryLength) {
  const TileShape tiles{16, 32};
  const TiledProblem full = problem(2, 1, 1, 1, 128, 128, false, tiles);
  const TiledProblem causal = problem(2, 1, 1, 1, 128, 128, true, tiles);
  EXPECT_NE(plan_varlen_schedule(full, false, true, Schedule::kShift, 4).rejected.find("seqlen_k <= seqlen_q"),
            std::string::npos);
  EXPECT_NE(
      plan_varlen_schedule(causal, false, true, Schedule::kSymmetricShift, 4).rejected.find("seqlen_k <= seqlen_q"),
      std::string::npos);
  TiledProblem windowed = causal;
  windowed.window = {40, -1};
  EXPECT_NE(plan_varlen_schedule(windowed, true, true, Schedule::kSymmetricShift, 4).rejected.find("sliding window"),
            std::string::npos);
  const TiledProblem tall_q = problem(2, 1, 1, 1, 512, 512, false, TileShape{64, 32});
  EXPECT_NE(plan_varlen_schedule(tall_q, true, true, Schedule::kShift, 4).rejected.find("block_q <= block_kv"),
            std::string::npos);
  // Tiles whose block_kv is not a multiple of block_q (d = 192's 64x96, d = 256's 64x80): symmetric shift is refused
  // with the rule, and auto never picks it.
  const VarlenPlan by_hand{
      make_schedule_plan(problem(2, 1, 1, 1, 1000, 1000, true, TileShape{64, 128}), Schedule::kSymmetricShift, 4).plan,
      true};
  for (const int block_kv : {96, 80}) {
    SCOPED_TRACE(block_kv);
    const TiledProblem uneven = problem(2, 1, 1, 1, 1000, 1000, true, TileShape{64, block_kv});
    EXPECT_NE(plan_varlen_schedule(uneven, true, true, Schedule::kSymmetricShift, 4)
                  .rejected.find("symmetric-shift needs block_kv to be a multiple of block_q, and the backward's "
                                 "tiles at this head dim are 64x" +
                                 std::to_string(block_kv)),
              std::string::npos);
    VarlenPlan uneven_by_hand = by_hand;
    uneven_by_hand.plan.problem.block_kv = block_kv;
    EXPECT_NE(prove_varlen_plan(uneven_by_hand).summary.find("multiple of block_q"), std::string::npos);
    for (const bool promise : {false, true}) {
      EXPECT_EQ(plan_varlen_schedule(uneven, promise, true, Schedule::kAuto, 4).plan.plan.kind,
                Schedule::kShortestFirst);
    }
  }
  // auto falls back to ascending where its choice (shift, full mask) is refused without the promise.
  EXPECT_EQ(plan_varlen_schedule(full, false, true, Schedule::kAuto, 4).plan.plan.kind, Schedule::kAscending);
  EXPECT_EQ(plan_varlen_schedule(full, true, true, Schedule::kAuto, 4).plan.plan.kind, Schedule::kShift);
  // A plan built by hand around the refusal is not proven either.
  const VarlenPlan unpromised{make_schedule_plan(full, Schedule::kShift, 4).plan, false};
  EXPECT_EQ(prove_varlen_plan(unpromised).summary.rfind("varlen: shift", 0), 0U);
}

TEST(Varlen, AutoRunsShortestFirstUnderTheFullMaskWhenSomeSequenceMustBeShorter) {
  const TileShape tiles{16, 32};
  const TiledProblem full = problem(2, 1, 1, 1, 128, 128, false, tiles);
  const auto auto_schedule = [](const TiledProblem& p, bool promise, bool fill) {
    const VarlenPlanResult result = plan_varlen_schedule(p, promise, fill, Schedule::kAuto, 4);
    EXPECT_TRUE(result.ok()) << result.rejected;
    return result.plan.plan.kind;
  };
  EXPECT_EQ(auto_schedule(full, true, /*fill=*/true), Schedule::kShift);
  EXPECT_EQ(auto_schedule(full, true, /*fill=*/false), Schedule::kShortestFirst);
  EXPECT_EQ(auto_schedule(full, false, /*fill=*/false), Schedule::kShortestFirst);
  EXPECT_NE(std::string(choose_varlen_auto(full, false, 4).reason).find("shortest-first"), std::string::npos);
  EXPECT_NE(std::string(choose_varlen_auto(full, false, 4).reason).find("shorter than the maxima"), std::string::npos);
  // Under the causal mask or a window auto's choice is the dense one whatever the hint.
  const TiledProblem causal = problem(2, 1, 1, 1, 128, 128, true, tiles);
  TiledProblem windowed = full;
  windowed.window = {40, 8};
  for (const TiledProblem& p : {causal, windowed}) {
    for (const bool fill : {false, true}) {
      EXPECT_EQ(choose_varlen_auto(p, fill, 4).schedule, choose_schedule(p, 4));
      EXPECT_EQ(auto_schedule(p, true, fill), choose_schedule(p, 4));
    }
  }
  // Explicit schedules are planned as requested under either hint.
  for (const bool fill : {false, true}) {
    for (Schedule schedule : kEverySchedule) {
      const TiledProblem& p = fits_mask(schedule, false) ? full : causal;
      const VarlenPlanResult result = plan_varlen_schedule(p, true, fill, schedule, 4);
      EXPECT_TRUE(result.ok()) << schedule_name(schedule) << ": " << result.rejected;
      EXPECT_EQ(result.plan.plan.kind, schedule);
    }
  }
}

TEST(Varlen, LengthsFromCuSeqlensAndTheirAdmission) {
  std::string error;
  const std::vector<SequenceLengths> lengths = lengths_from_cu_seqlens({0, 100, 100, 3100}, {0, 90, 90, 3000}, &error);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_EQ(lengths.size(), 3U);
  EXPECT_EQ(lengths[2].seqlen_q, 3000);
  EXPECT_EQ(lengths[2].seqlen_k, 2910);
  EXPECT_TRUE(lengths_from_cu_seqlens({0, 5, 4}, {0, 5, 6}, &error).empty());
  EXPECT_NE(error.find("decrease"), std::string::npos);
  EXPECT_TRUE(lengths_from_cu_seqlens({1, 5}, {0, 5}, &error).empty());
  EXPECT_TRUE(lengths_from_cu_seqlens({0, 5}, {0, 5, 6}, &error).empty());

  const TiledProblem p = problem(3, 1, 1, 1, 3000, 3000, true, TileShape{64, 128});
  const VarlenPlan plan = planned(p, Schedule::kSymmetricShift, 132);
  EXPECT_EQ(check_varlen_lengths(plan, lengths), "");
  EXPECT_NE(check_varlen_lengths(plan, {{1, 2}, {0, 0}, {5, 5}}).find("seqlen_k 2 > seqlen_q 1"), std::string::npos);
  EXPECT_NE(check_varlen_lengths(plan, {{3001, 2}, {0, 0}, {5, 5}}).find("exceeds"), std::string::npos);
  EXPECT_NE(check_varlen_lengths(plan, {{1, 1}}).find("3 sequences"), std::string::npos);
}

// Negative controls: the checks that pass the plans above catch a corrupted order and a dropped job.
TEST(Varlen, TheSameChecksCatchABrokenPlan) {
  const TileShape tiles{16, 32};
  const TiledProblem p = problem(2, 1, 1, 1, 101, 101, true, tiles);
  const std::vector<SequenceLengths> lengths{{101, 70}, {33, 33}};
  for (const Schedule schedule : kDeterministic) {
    if (!fits_mask(schedule, true)) continue;
    const VarlenPlan plan = planned(p, schedule, 3);
    ExpandedSchedule expanded = expand_varlen_schedule(plan, lengths);
    ASSERT_EQ(validate_varlen_schedule(expanded, lengths).summary(), "valid");
    // Corrupted order: a dQ tile's first two contributions swap ranks, so the first waits on the second (under
    // dynamic dispatch on a later unit).
    ExpandedSchedule swapped = expanded;
    Step* first = nullptr;
    Step* second = nullptr;
    for (Step& step : swapped.steps) {
      if (step.rank == 0 && first == nullptr && expanded.contributions[step.dq_tile] > 1) first = &step;
    }
    ASSERT_NE(first, nullptr);
    for (Step& step : swapped.steps) {
      if (step.dq_tile == first->dq_tile && step.rank == 1) second = &step;
    }
    ASSERT_NE(second, nullptr);
    ExpandedSchedule duplicated = swapped;
    std::swap(first->rank, second->rank);
    if (plan.plan.dispatch == Dispatch::kDynamic) {  // a static swap may still be deadlock-free: another order
      EXPECT_EQ(validate_varlen_schedule(swapped, lengths).summary().rfind("deadlock", 0), 0U)
          << schedule_name(schedule) << ": " << validate_varlen_schedule(swapped, lengths).summary();
    }
    // Corrupted order: two contributions of one dQ tile under rank 0.
    for (Step& step : duplicated.steps) {
      if (step.dq_tile == first->dq_tile && step.rank == 1) step.rank = 0;
    }
    EXPECT_EQ(validate_varlen_schedule(duplicated, lengths).summary().rfind("ranks", 0), 0U) << schedule_name(schedule);
    // A dropped job.
    ExpandedSchedule dropped = expanded;
    dropped.jobs.erase(dropped.jobs.begin());
    EXPECT_EQ(validate_varlen_schedule(dropped, lengths).summary().rfind("coverage", 0), 0U) << schedule_name(schedule);
  }
}

}  // namespace
}  // namespace dash
