// prove_plan (and the streamed validator it falls back on) against the expanding validator: the same report
// ("valid" or the same first finding, word for word) on random plans of every schedule, including heads that
// straddle waves, GQA splits, ragged lengths, odd tile counts, seqlen_q != seqlen_k and sliding windows, on
// small SM counts and several thread counts, both by the schedules' structure and by enumeration; on
// plans corrupted field by field (or planned for another window) and on plans the planner rejects, which must
// still be caught. Also checks the facts the
// proof's reductions rest on (validator.hpp, shift_proof.hpp, kv_order_proof.hpp): the schedule functions ignore
// a job's head, each head owns its block of dQ tiles, heads with the same first wave start have the same jobs,
// heads fall into few classes, and every plan the planner makes meets the structural hypotheses (all schedules
// but symmetric shift under a window) or the fast conditions (all), so the proof's work does not grow with batch
// and heads.
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "planner/expanded_schedule.hpp"
#include "planner/kv_order_proof.hpp"
#include "planner/plan_proof.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/shift_proof.hpp"
#include "planner/streamed_validator.hpp"
#include "planner/validator.hpp"
#include "schedule/schedule.hpp"
#include "schedule_test_support.hpp"

namespace dash {
namespace {

using testing::abstract_problem;
using testing::kSchedules;
using testing::make_shape;
using testing::must_plan;
using testing::step_of;
using testing::swap_ranks;

std::string describe(const SchedulePlan& plan) {
  const TiledProblem& p = plan.problem;
  return std::string(schedule_name(plan.kind)) + (plan.dispatch == Dispatch::kStatic ? " static" : " dynamic") +
         " b=" + std::to_string(p.batch) + " hkv=" + std::to_string(p.heads_kv) + " g=" + std::to_string(p.group_size) +
         "/" + std::to_string(p.group_splits) + " sq=" + std::to_string(p.seqlen_q) +
         " sk=" + std::to_string(p.seqlen_k) + " bq=" + std::to_string(p.block_q) +
         " bkv=" + std::to_string(p.block_kv) + (p.causal ? " causal" : " full") +
         " ctas=" + std::to_string(plan.num_ctas) + " units=" + std::to_string(plan.num_units) +
         " jobs/unit=" + std::to_string(plan.jobs_per_unit);
}

std::string full_report(const SchedulePlan& plan) { return validate_schedule(expand_schedule(plan)).summary(); }

// The enumerating proof, also for the shift schedules, with up to `threads` chunks per class whatever its size,
// so that small plans exercise the cuts and the joins.
ProofOptions in_chunks(int threads) {
  ProofOptions options;
  options.by_structure = false;
  options.max_threads = threads;
  options.min_visits_per_chunk = 1;
  return options;
}

// Random tiled problems, small enough to expand: many heads of few tiles, or few heads of more, with the
// kernels' tile shapes (via make_tiled_problem) or one row per tile (abstract problems with stride 1 or 2).
std::vector<TiledProblem> random_problems(unsigned seed, int count) {
  std::mt19937 rng(seed);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int groups[] = {1, 2, 4, 8};
  std::vector<TiledProblem> out;
  for (int i = 0; i < count; ++i) {
    if (i % 4 == 3) {
      TiledProblem p =
          abstract_problem(uniform(1, 12), uniform(1, 17), uniform(1, 40), uniform(0, 1) == 1, uniform(1, 2));
      p.batch = uniform(1, 3);
      out.push_back(p);
      continue;
    }
    const int seqlen_q = uniform(1, 2500);
    // A third square, a third ragged with seqlen_q > seqlen_k, a third the other way.
    const int seqlen_k = i % 3 == 0 ? seqlen_q : uniform(1, 2500);
    const int group = groups[uniform(0, 3)];
    out.push_back(
        make_tiled_problem(make_shape(uniform(1, 3), uniform(1, 6), group, seqlen_q, seqlen_k,
                                      uniform(0, 1) == 0 ? 64 : 128, uniform(0, 1) == 1),
                           uniform(0, 1) == 0 ? 0 : group));  // the planner's GQA split, or one job per query head
  }
  return out;
}

bool is_shift_schedule(Schedule schedule) {
  return schedule == Schedule::kShift || schedule == Schedule::kSymmetricShift;
}

// SM counts that put heads across wave boundaries: few, odd, or the H100/H200 ones.
int random_sms(std::mt19937& rng) {
  const int named[] = {1, 2, 3, 7, 13, 78, 114, 132};
  return std::uniform_int_distribution<int>(0, 1)(rng) == 0 ? named[std::uniform_int_distribution<int>(0, 7)(rng)]
                                                            : std::uniform_int_distribution<int>(1, 150)(rng);
}

TEST(PlanProof, AgreesWithTheExpandingValidatorOnEveryPlannedSchedule) {
  std::mt19937 rng(20261201);
  int proven = 0;
  int straddling = 0;
  for (const TiledProblem& problem : random_problems(11, 160)) {
    const int sms = random_sms(rng);
    for (Schedule schedule : kSchedules) {
      const PlanResult planned = make_schedule_plan(problem, schedule, sms);
      if (!planned.ok()) continue;
      const SchedulePlan& plan = planned.plan;
      const std::string expected = full_report(plan);
      ASSERT_EQ(expected, "valid") << describe(plan);
      for (int threads : {1, 3}) {
        const PlanProof proof = prove_plan(plan, in_chunks(threads));
        EXPECT_EQ(proof.summary, expected) << describe(plan) << " threads=" << threads;
        // The fast conditions hold for every plan the planner makes: its proofs never take the slow path.
        EXPECT_FALSE(proof.stats.streamed_fallback) << describe(plan);
        EXPECT_GE(proof.stats.head_classes, 1);
        EXPECT_LE(proof.stats.head_classes, proof.stats.heads);
      }
      // The structural hypotheses hold for every plan the planner makes without a sliding window.
      const PlanProof proof = prove_plan(plan);
      EXPECT_EQ(proof.summary, expected) << describe(plan);
      EXPECT_TRUE(proof.stats.by_structure) << describe(plan);
      EXPECT_FALSE(proof.stats.streamed_fallback) << describe(plan);
      EXPECT_LE(proof.stats.head_classes, std::min(proof.stats.heads, plan.num_ctas));
      EXPECT_EQ(streamed_validation_summary(plan), expected) << describe(plan);
      ++proven;
      const int units_per_head = plan.num_units / problem.num_heads();
      if (plan.dispatch == Dispatch::kStatic && problem.num_heads() > 1 && units_per_head % plan.num_ctas != 0) {
        ++straddling;
      }
    }
  }
  EXPECT_GT(proven, 500);
  EXPECT_GT(straddling, 50) << "too few static plans with heads across wave boundaries";
}

// Under sliding windows (random bounds, alone and with causal, GQA, ragged): the same verdict as the expanding
// validator for every plan the planner makes, without the streamed fallback; the key/value-order schedules by
// their structure (kv_order_proof.hpp covers banded masks), the shift schedules by enumeration: symmetric shift's
// band construction is never taken for the causal triangle shift_proof.hpp describes.
TEST(PlanProof, AgreesWithTheExpandingValidatorOnWindowedPlans) {
  std::mt19937 rng(20261203);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int proven = 0;
  int band_symmetric = 0;
  for (TiledProblem problem : random_problems(47, 120)) {
    const int reach = std::max(problem.seqlen_q, problem.seqlen_k);
    problem.window = {uniform(0, 3) == 0 ? -1 : uniform(0, reach), uniform(0, 2) == 0 ? -1 : uniform(0, reach)};
    if (!problem.windowed()) continue;
    const int sms = random_sms(rng);
    for (Schedule schedule : kSchedules) {
      const PlanResult planned = make_schedule_plan(problem, schedule, sms);
      if (!planned.ok()) continue;
      const std::string expected = full_report(planned.plan);
      ASSERT_EQ(expected, "valid") << describe(planned.plan);
      for (int threads : {1, 3}) {
        const PlanProof proof = prove_plan(planned.plan, in_chunks(threads));
        EXPECT_EQ(proof.summary, expected) << describe(planned.plan);
        EXPECT_FALSE(proof.stats.streamed_fallback) << describe(planned.plan);
      }
      const PlanProof proof = prove_plan(planned.plan);
      EXPECT_EQ(proof.summary, expected) << describe(planned.plan);
      EXPECT_EQ(proof.stats.by_structure, !is_shift_schedule(schedule)) << describe(planned.plan);
      EXPECT_EQ(streamed_validation_summary(planned.plan), expected) << describe(planned.plan);
      ++proven;
      band_symmetric += schedule == Schedule::kSymmetricShift ? 1 : 0;
    }
  }
  EXPECT_GT(proven, 250);
  EXPECT_GT(band_symmetric, 10);
}

// A symmetric-shift plan made for one window and relabelled with another (a stale cache entry): its unit count
// is that of the other window's fold, and the proof reports what the validator does.
TEST(PlanProof, SymmetricShiftPlanOfAnotherWindowIsRefused) {
  TiledProblem problem = abstract_problem(2, 10, 20, true, 2);
  problem.window = {6, kNoWindowBound};
  SchedulePlan plan = must_plan(problem, Schedule::kSymmetricShift, 5);
  plan.problem.window.left = 8;  // the fold begins a tile earlier: one unit fewer per head
  const std::string expected = full_report(plan);
  EXPECT_EQ(expected.rfind("coverage:", 0), 0u) << expected;
  EXPECT_EQ(prove_plan(plan).summary, expected);
}

// Chunks of a class are cut at wave starts and joined again: a head split into up to 7 chunks gives the same
// verdict, valid or not (29 CTAs: waves start inside the head), as the expanding validator.
TEST(PlanProof, ManyChunksAgree) {
  for (Schedule schedule : kSchedules) {
    const bool causal = schedule == Schedule::kSymmetricShift;
    const TiledProblem problem = make_tiled_problem(make_shape(1, 1, 1, 16384, 16384, 128, causal));
    const PlanResult planned = make_schedule_plan(problem, schedule, 29);
    ASSERT_TRUE(planned.ok()) << schedule_name(schedule) << ": " << planned.rejected;
    // The other dispatch: the shift schedules' lanes then wait on later units; the others stall in a staircase
    // under static dispatch but cannot deadlock.
    SchedulePlan other = planned.plan;
    other.dispatch = other.dispatch == Dispatch::kStatic ? Dispatch::kDynamic : Dispatch::kStatic;
    for (const SchedulePlan& plan : {planned.plan, other}) {
      const std::string expected = full_report(plan);
      for (int threads : {1, 2, 7}) {
        const PlanProof proof = prove_plan(plan, in_chunks(threads));
        EXPECT_EQ(proof.summary, expected) << describe(plan) << " threads=" << threads;
        EXPECT_LE(proof.stats.threads, threads);
      }
    }
    const PlanProof proof = prove_plan(planned.plan, in_chunks(7));
    EXPECT_FALSE(proof.stats.streamed_fallback);
    EXPECT_GT(proof.stats.threads, 1) << schedule_name(schedule);
    // By default a head this small is one chunk: a thread would cost more than it saves.
    ProofOptions enumerating;
    enumerating.by_structure = false;
    EXPECT_EQ(prove_plan(planned.plan, enumerating).stats.threads, 1);
  }
}

// One field of a valid plan changed, as a bug in the planner or a stale cache entry might: the proof must
// report what the expanding validator reports. Field values stay where the validator itself is defined
// (at least one CTA, positive tile sizes, group splits dividing the group).
SchedulePlan corrupted(const SchedulePlan& plan, std::mt19937& rng) {
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  SchedulePlan bad = plan;
  TiledProblem& p = bad.problem;
  switch (uniform(0, 9)) {
    case 0:
      bad.num_ctas = uniform(1, 2 * plan.num_ctas + 2);
      break;
    case 1:
      bad.num_units += uniform(0, 1) == 0 ? -1 : 1;
      break;
    case 2:
      bad.num_units = plan.num_units / std::max(1, p.num_heads()) * std::max(1, p.num_heads() - 1);
      break;
    case 3:
      bad.jobs_per_unit = uniform(0, 3);
      break;
    case 4:
      bad.kind = kSchedules[uniform(0, 5)];
      break;
    case 5:
      bad.dispatch = plan.dispatch == Dispatch::kStatic ? Dispatch::kDynamic : Dispatch::kStatic;
      break;
    case 6:
      p.causal = !p.causal;
      break;
    case 7:
      p.seqlen_q = std::max(1, p.seqlen_q + uniform(-2, 2) * p.block_q);
      break;
    case 8:
      p.seqlen_k = std::max(1, p.seqlen_k + uniform(-2, 2) * p.block_kv);
      break;
    case 9: {
      std::vector<int> divisors;
      for (int d = 1; d <= p.group_size; ++d) {
        if (p.group_size % d == 0) divisors.push_back(d);
      }
      p.group_splits = divisors[uniform(0, static_cast<int>(divisors.size()) - 1)];
      break;
    }
  }
  return bad;
}

TEST(PlanProof, CorruptedPlansGetTheValidatorsReport) {
  std::mt19937 rng(7);
  std::map<std::string, int> findings;  // by the report's first words
  int by_structure = 0;                 // corrupted plans that still meet the structural hypotheses
  int shift_not_by_structure = 0;       // and those that do not, of the shift schedules
  int kv_order_not_by_structure = 0;    // and of the key/value-order schedules
  for (const TiledProblem& problem : random_problems(23, 120)) {
    const int sms = random_sms(rng);
    for (Schedule schedule : kSchedules) {
      const PlanResult planned = make_schedule_plan(problem, schedule, sms);
      if (!planned.ok()) continue;
      for (int i = 0; i < 4; ++i) {
        const SchedulePlan bad = corrupted(planned.plan, rng);
        const std::string expected = full_report(bad);
        EXPECT_EQ(prove_plan(bad, in_chunks(3)).summary, expected) << describe(bad);
        const PlanProof proof = prove_plan(bad);
        EXPECT_EQ(proof.summary, expected) << describe(bad);
        EXPECT_EQ(streamed_validation_summary(bad), expected) << describe(bad);
        const size_t cut = expected.find(" ", expected.find(':') + 2);
        ++findings[expected.substr(0, cut)];
        by_structure += proof.stats.by_structure ? 1 : 0;
        shift_not_by_structure += is_shift_schedule(bad.kind) && !proof.stats.by_structure ? 1 : 0;
        kv_order_not_by_structure += !is_shift_schedule(bad.kind) && !proof.stats.by_structure ? 1 : 0;
      }
    }
  }
  // Both sides of the structural hypotheses are reached: corrupted fields that keep them (another SM count or
  // sequence length the plan still fits), and ones that break them, which the enumeration then decides.
  EXPECT_GT(by_structure, 20);
  EXPECT_GT(shift_not_by_structure, 20);
  EXPECT_GT(kv_order_not_by_structure, 20);
  // Plans corrupted this way come out valid, uncovered or waiting on later units (rank errors are rare and
  // static stalls do not occur: the expansion-corrupting tests below compare those findings).
  for (const char* kind : {"valid", "coverage: job", "deadlock: unit"}) EXPECT_GT(findings[kind], 0) << kind;
}

// Deadlock-free without the fast conditions: ascending's jobs under static dispatch wait on the key/value
// tile before them at the same position (the start-up staircase), which the lemma counts as a violation. The
// streamed validator decides, and agrees.
TEST(PlanProof, StaircaseUnderStaticDispatchIsValidByTheStreamedValidator) {
  SchedulePlan plan = must_plan(abstract_problem(3, 6, 8, false), Schedule::kAscending, 4);
  plan.dispatch = Dispatch::kStatic;
  ASSERT_EQ(full_report(plan), "valid");
  const PlanProof proof = prove_plan(plan);
  EXPECT_EQ(proof.summary, "valid");
  EXPECT_TRUE(proof.stats.streamed_fallback);
}

// The key/value-order schedules' structural proof holds whatever the lengths (kv_order_proof.hpp, "Any
// lengths"): every plan of them, for every pair of sequence lengths from one row to past three tiles (the tiles of
// head dims 64, 128, 192 and 256, whose 64x96 and 64x80 have block_kv not a multiple of block_q; every remainder
// class of interest), under the full and causal masks and sliding windows, with GQA split or not, is proven by
// structure, and the expanding validator agrees. This is what lets a packed batch (varlen) plan each sequence's jobs
// from the maximum length alone.
TEST(PlanProof, KeyValueOrderPlansOfEveryLengthAreProvenByStructure) {
  const int lengths[] = {1,   2,   63,  64,  65,  79,  80,  81,  95,  96,  97,  127, 128, 129,
                         159, 160, 161, 191, 192, 255, 256, 257, 300, 383, 384, 385, 450};
  const SlidingWindow windows[] = {{-1, -1}, {0, 0}, {1, -1}, {-1, 1}, {64, 0}, {100, 50}, {0, 200}, {300, -1}};
  const Schedule kv_order[] = {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst,
                               Schedule::kNondeterministic};
  int proven = 0;
  for (int head_dim : {64, 128, 192, 256}) {
    for (int group : {1, 4}) {
      for (int seqlen_q : lengths) {
        for (int seqlen_k : lengths) {
          for (bool causal : {false, true}) {
            for (const SlidingWindow& window : windows) {
              const AttentionShape shape = make_shape(1, 2, group, seqlen_q, seqlen_k, head_dim, causal);
              const TiledProblem problem = make_tiled_problem(shape, window, group == 1 ? 1 : 2);
              for (Schedule schedule : kv_order) {
                const PlanResult planned = make_schedule_plan(problem, schedule, 5);
                ASSERT_TRUE(planned.ok()) << describe(planned.plan) << ": " << planned.rejected;
                ASSERT_TRUE(prove_kv_order_by_structure(planned.plan).proven)
                    << describe(planned.plan) << " window " << window.left << "," << window.right;
                ASSERT_EQ(full_report(planned.plan), "valid") << describe(planned.plan);
                ++proven;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(proven, 4 * 2 * 27 * 27 * 2 * 8 * 4);
}

// d = 192's 64x96 and d = 256's 64x80 tiles, whose block_kv is not a multiple of block_q: the causal bands' first
// query tiles step by 1 and 2 in turn, not by a fixed stride. Every plan the planner makes of every schedule, on
// ragged lengths (inside one tile, one short of or past either tile; 1000 gives 11 or 13 key/value tiles, an odd
// count), seqlen_q != seqlen_k both ways, GQA split or not, full, causal and windowed masks and small SM counts, is
// proven by prove_plan, the enumeration (by_structure off) and the expanding validator alike; the key/value-order
// schedules and shift by structure. Symmetric shift is refused by name under the causal mask, and auto's choice is
// always planned.
TEST(PlanProof, EveryPlanAtTheTilesOfHeadDims192And256IsProven) {
  struct Tiles {
    int head_dim, block_kv;
    int lengths[6];
  };
  const Tiles cases[] = {{192, 96, {1, 63, 95, 97, 191, 1000}}, {256, 80, {1, 63, 79, 81, 159, 1000}}};
  const SlidingWindow windows[] = {{-1, -1}, {0, 0}, {130, -1}, {100, 50}};
  for (const Tiles& t : cases) {
    SCOPED_TRACE("head_dim " + std::to_string(t.head_dim));
    const TileShape tiles = backward_tile_shape(t.head_dim);
    ASSERT_EQ(tiles.block_q, 64);
    ASSERT_EQ(tiles.block_kv, t.block_kv);
    std::map<Schedule, int> proven;
    for (int group : {1, 4}) {
      for (int seqlen_q : t.lengths) {
        for (int seqlen_k : t.lengths) {
          for (bool causal : {false, true}) {
            for (const SlidingWindow& window : windows) {
              const AttentionShape shape = make_shape(2, 2, group, seqlen_q, seqlen_k, t.head_dim, causal);
              const TiledProblem problem = make_tiled_problem(shape, window, group == 1 ? 1 : 2);
              ASSERT_EQ(problem.block_kv, t.block_kv);
              for (const int sms : {5, 132}) {
                ASSERT_TRUE(plan_schedule(problem, Schedule::kAuto, sms).ok()) << "auto, " << sms << " SMs";
                for (Schedule schedule : kSchedules) {
                  const PlanResult planned = make_schedule_plan(problem, schedule, sms);
                  if (schedule == Schedule::kSymmetricShift && problem.causal) {
                    EXPECT_NE(planned.rejected.find("symmetric-shift needs block_kv to be a multiple of block_q"),
                              std::string::npos)
                        << planned.rejected;
                  }
                  if (!planned.ok()) continue;
                  const PlanProof proof = prove_plan(planned.plan);
                  ASSERT_EQ(proof.summary, "valid") << describe(planned.plan);
                  EXPECT_TRUE(proof.stats.by_structure) << describe(planned.plan);
                  ASSERT_EQ(prove_plan(planned.plan, in_chunks(2)).summary, "valid") << describe(planned.plan);
                  ASSERT_EQ(full_report(planned.plan), "valid") << describe(planned.plan);
                  ++proven[schedule];
                }
              }
            }
          }
        }
      }
    }
    EXPECT_EQ(proven.count(Schedule::kSymmetricShift), 0U);
    EXPECT_GT(proven[Schedule::kShift], 0);
    EXPECT_EQ(proven[Schedule::kAscending], 2 * 6 * 6 * 2 * 4 * 2);
  }
}

TEST(PlanProof, PlanWithoutCtasIsRejected) {
  SchedulePlan plan = must_plan(abstract_problem(1, 4, 4, false), Schedule::kAscending, 4);
  plan.num_ctas = 0;
  EXPECT_EQ(prove_plan(plan).summary, "deadlock: the plan has no CTA to run its units");
}

// --- the streamed validator on corrupted expansions ---------------------------------------------------------

// Schedule functions read from a (corrupted) expansion, so that the streamed validator and the expanding one
// see the same corruption: job `sub` of a unit is its sub-th valid job, marked with its index in the expansion
// in `lane` (the streamed checks read a job's head, key/value tile, first query tile and step count only), and
// its visits and ranks are the expansion's steps.
class ExpandedFunctions : public ScheduleFunctions {
 public:
  explicit ExpandedFunctions(const ExpandedSchedule& s) : s_(s) {}
  Job job(const SchedulePlan& /*plan*/, int unit, int sub) const override {
    const int index = s_.unit_first_job[unit] + sub;
    if (index >= s_.unit_first_job[unit + 1]) return Job{};
    Job job = s_.jobs[index].job;
    job.lane = index;
    return job;
  }
  int q_tile(const SchedulePlan& /*plan*/, const Job& job, int step) const override {
    return s_.steps[s_.jobs[job.lane].first_step + step].q_tile;
  }
  int rank(const SchedulePlan& /*plan*/, const Job& job, int v) const override {
    for (int k = s_.jobs[job.lane].first_step; k < s_.job_end_step(job.lane); ++k) {
      if (s_.steps[k].q_tile == v) return s_.steps[k].rank;
    }
    ADD_FAILURE() << "asked for the rank of a query tile the job does not visit";
    return kUnordered;
  }

 private:
  const ExpandedSchedule& s_;
};

::testing::AssertionResult same_report(const ExpandedSchedule& s) {
  const std::string expected = validate_schedule(s).summary();
  const std::string streamed = streamed_validation_summary(s.plan, ExpandedFunctions(s));
  if (streamed == expected) return ::testing::AssertionSuccess() << expected;
  return ::testing::AssertionFailure() << "streamed \"" << streamed << "\", expanding \"" << expected << "\"";
}

// The corruptions of test_validator.cpp, each reported word for word as the expanding validator does.
TEST(StreamedValidator, ReportsEachCorruptionAsTheValidatorDoes) {
  const ExpandedSchedule shift = expand_schedule(must_plan(abstract_problem(1, 4, 4, false), Schedule::kShift, 4));
  const ExpandedSchedule ascending =
      expand_schedule(must_plan(abstract_problem(1, 4, 4, false), Schedule::kAscending, 4));
  EXPECT_TRUE(same_report(shift));

  ExpandedSchedule duplicated = shift;
  duplicated.steps[step_of(duplicated, 2, 1)].rank = duplicated.steps[step_of(duplicated, 1, 1)].rank;
  EXPECT_TRUE(same_report(duplicated));
  ExpandedSchedule out_of_range = shift;
  out_of_range.steps[step_of(out_of_range, 3, 2)].rank = 4;
  EXPECT_TRUE(same_report(out_of_range));
  ExpandedSchedule dropped = shift;
  dropped.jobs.back().job.num_steps -= 1;
  dropped.steps.pop_back();
  EXPECT_TRUE(same_report(dropped));
  ExpandedSchedule repeated = shift;
  repeated.steps[step_of(repeated, 1, 2)].q_tile = 1;
  EXPECT_TRUE(same_report(repeated));
  ExpandedSchedule outside = expand_schedule(must_plan(abstract_problem(1, 4, 4, true), Schedule::kAscending, 4));
  outside.steps[step_of(outside, 2, 3)].q_tile = 1;
  EXPECT_TRUE(same_report(outside));
  ExpandedSchedule twice = shift;
  twice.jobs[1].job.kv_tile = 0;
  EXPECT_TRUE(same_report(twice));
  ExpandedSchedule foreign = shift;
  foreign.jobs[3].job.head = 1;
  EXPECT_TRUE(same_report(foreign));
  ExpandedSchedule never = shift;
  never.jobs.pop_back();
  never.unit_first_job.back() = static_cast<int>(never.jobs.size());
  never.steps.resize(never.steps.size() - 4);
  EXPECT_TRUE(same_report(never));
  ExpandedSchedule dynamic_wait = ascending;
  swap_ranks(dynamic_wait, 2, 0, 1);
  EXPECT_TRUE(same_report(dynamic_wait));
  ExpandedSchedule static_cycle = shift;
  swap_ranks(static_cycle, 0, 0, 1);
  swap_ranks(static_cycle, 1, 0, 1);
  EXPECT_TRUE(same_report(static_cycle));
  ExpandedSchedule backward_edge = shift;
  swap_ranks(backward_edge, 0, 0, 1);
  EXPECT_TRUE(same_report(backward_edge));
}

// Random rank swaps on random plans of every schedule: within one dQ tile (still a permutation: valid, a
// dynamic wait on a later unit, or a static stall) or across two (rank errors), one to three at a time.
TEST(StreamedValidator, RandomRankSwapsAreReportedAsTheValidatorDoes) {
  std::mt19937 rng(41);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::map<std::string, int> findings;
  for (const TiledProblem& problem : random_problems(31, 60)) {
    const int sms = random_sms(rng);
    for (Schedule schedule : kSchedules) {
      const PlanResult planned = make_schedule_plan(problem, schedule, sms);
      if (!planned.ok() || schedule == Schedule::kNondeterministic) continue;
      const ExpandedSchedule clean = expand_schedule(planned.plan);
      if (clean.steps.size() < 2) continue;
      std::map<int, std::vector<int>> steps_of_tile;
      for (int k = 0; k < static_cast<int>(clean.steps.size()); ++k) steps_of_tile[clean.steps[k].dq_tile].push_back(k);
      for (int trial = 0; trial < 6; ++trial) {
        ExpandedSchedule s = clean;
        for (int swaps = uniform(1, 3); swaps > 0; --swaps) {
          const int a = uniform(0, static_cast<int>(s.steps.size()) - 1);
          const std::vector<int>& same_tile = steps_of_tile[s.steps[a].dq_tile];
          const int b = trial % 3 == 2 ? uniform(0, static_cast<int>(s.steps.size()) - 1)
                                       : same_tile[uniform(0, static_cast<int>(same_tile.size()) - 1)];
          std::swap(s.steps[a].rank, s.steps[b].rank);
        }
        const std::string expected = validate_schedule(s).summary();
        EXPECT_EQ(streamed_validation_summary(s.plan, ExpandedFunctions(s)), expected) << describe(s.plan);
        ++findings[expected.substr(0, expected.find(" ", expected.find(':') + 2))];
      }
    }
  }
  for (const char* kind : {"valid", "ranks: dQ", "deadlock: unit", "deadlock: CTA"}) {
    EXPECT_GT(findings[kind], 0) << kind;
  }
}

// --- the facts the reduction rests on ----------------------------------------------------------------------

// q_tile_at and rank_of read a job's fields but its head: jobs equal but for the head make the same visits.
TEST(PlanProof, ScheduleFunctionsIgnoreTheJobsHead) {
  std::mt19937 rng(3);
  long long visits = 0;
  for (const TiledProblem& problem : random_problems(5, 60)) {
    for (Schedule schedule : kSchedules) {
      const PlanResult planned = make_schedule_plan(problem, schedule, random_sms(rng));
      if (!planned.ok()) continue;
      const SchedulePlan& plan = planned.plan;
      for (int unit = 0; unit < plan.num_units; ++unit) {
        for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
          const Job job = make_job(plan, unit, sub);
          if (!job.valid) continue;
          Job moved = job;
          moved.head = (job.head + 1 + unit) % (problem.num_heads() + 3);
          for (int step = 0; step < job.num_steps; ++step) {
            const int v = q_tile_at(plan, job, step);
            ASSERT_EQ(q_tile_at(plan, moved, step), v) << describe(plan);
            ASSERT_EQ(rank_of(plan, moved, v), rank_of(plan, job, v)) << describe(plan);
            ++visits;
          }
        }
      }
    }
  }
  EXPECT_GT(visits, 100000);
}

// Head h owns the dQ tiles [h m, (h + 1) m), one per query tile v: no tile is shared between heads.
TEST(PlanProof, EachHeadOwnsItsBlockOfDqTiles) {
  for (const TiledProblem& p : random_problems(9, 80)) {
    const int m = p.num_q_tiles();
    ASSERT_EQ(p.batch * p.heads_q() * p.real_q_tiles(), p.num_heads() * m);
    for (int head = 0; head < p.num_heads(); ++head) {
      std::vector<int> local(static_cast<size_t>(m));
      for (int v = 0; v < m; ++v) local[v] = p.dq_tile_index(head, v) - head * m;
      std::sort(local.begin(), local.end());
      std::vector<int> expected(static_cast<size_t>(m));
      std::iota(expected.begin(), expected.end(), 0);
      ASSERT_EQ(local, expected) << "head " << head;
    }
  }
}

// The key/value-order schedules give every head the same jobs: one class, and the proof's work is one head's
// visits whatever the batch and head count. The shift schedules' heads differ by where they start in a
// wave: at most num_ctas / gcd(units per head, num_ctas) classes, and one for all heads inside one wave.
TEST(PlanProof, ProofWorkDoesNotGrowWithBatchAndHeads) {
  const TiledProblem one_head = make_tiled_problem(make_shape(1, 1, 1, 4096, 4096, 128, true));
  const TiledProblem many_heads = make_tiled_problem(make_shape(8, 32, 1, 4096, 4096, 128, true));
  for (Schedule schedule :
       {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst, Schedule::kNondeterministic}) {
    const PlanProof one = prove_plan(must_plan(one_head, schedule, 132));
    const PlanProof many = prove_plan(must_plan(many_heads, schedule, 132));
    EXPECT_TRUE(many.ok()) << many.summary;
    EXPECT_EQ(many.stats.heads, 256);
    EXPECT_EQ(many.stats.head_classes, 1) << schedule_name(schedule);
    EXPECT_EQ(many.stats.visits, one.stats.visits) << schedule_name(schedule);
  }
  // 32 key/value tiles, 16 units per head on 132 CTAs: gcd 4, so at most 33 classes, and no visit enumerated.
  const PlanProof symmetric = prove_plan(must_plan(many_heads, Schedule::kSymmetricShift, 132));
  EXPECT_TRUE(symmetric.ok()) << symmetric.summary;
  EXPECT_TRUE(symmetric.stats.by_structure);
  EXPECT_EQ(symmetric.stats.visits, 0);
  EXPECT_LE(symmetric.stats.head_classes, 132 / std::gcd(16, 132));
  // 4 key/value tiles per head, 33 heads to a 132-CTA wave: no head straddles, so all are alike.
  const TiledProblem short_heads = make_tiled_problem(make_shape(4, 32, 1, 512, 512, 128, false));
  const PlanProof shift = prove_plan(must_plan(short_heads, Schedule::kShift, 132));
  EXPECT_TRUE(shift.ok()) << shift.summary;
  EXPECT_TRUE(shift.stats.by_structure);
  EXPECT_EQ(shift.stats.head_classes, 1);
}

// The fact the structural proof's classes rest on (shift_proof.hpp): under static dispatch, heads with the same
// first_wave_start get the same jobs from make_job but for the head, which is their own.
TEST(PlanProof, HeadsWithTheSameFirstWaveStartHaveTheSameJobs) {
  // Every field of a Job but its head; stops compiling when Job gains a field, which must then join it.
  const auto fields_but_head = [](const Job& job) {
    const auto& [head, kv_tile, q_begin, q_end, num_steps, lane, wave_size, earlier, wave_shorts, rect_begin,
                 fold_begin, is_short, valid] = job;
    static_cast<void>(head);
    return std::tuple(kv_tile, q_begin, q_end, num_steps, lane, wave_size, earlier, wave_shorts, rect_begin, fold_begin,
                      is_short, valid);
  };
  std::mt19937 rng(17);
  int compared_heads = 0;
  for (const TiledProblem& problem : random_problems(13, 120)) {
    const int sms = random_sms(rng);
    for (Schedule schedule : {Schedule::kShift, Schedule::kSymmetricShift}) {
      const PlanResult planned = make_schedule_plan(problem, schedule, sms);
      if (!planned.ok()) continue;
      const SchedulePlan& plan = planned.plan;
      const int units_per_head = plan.num_units / problem.num_heads();
      std::map<int, int> representative;  // by first_wave_start
      for (int head = 0; head < problem.num_heads(); ++head) {
        const int start = first_wave_start(head, units_per_head, plan.num_ctas);
        const int first = representative.emplace(start, head).first->second;
        if (first == head) continue;
        ++compared_heads;
        for (int a = 0; a < units_per_head; ++a) {
          for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
            const Job job = make_job(plan, head * units_per_head + a, sub);
            const Job other = make_job(plan, first * units_per_head + a, sub);
            ASSERT_EQ(fields_but_head(job), fields_but_head(other))
                << describe(plan) << " heads " << first << ", " << head;
            if (job.valid) {
              ASSERT_EQ(job.head, head) << describe(plan);
            }
          }
        }
      }
      // Starts repeat with period S / gcd(U, S): the structural proof looks no further than one period.
      const int period = plan.num_ctas / std::gcd(units_per_head, plan.num_ctas);
      for (int head = period; head < problem.num_heads(); ++head) {
        ASSERT_EQ(first_wave_start(head, units_per_head, plan.num_ctas),
                  first_wave_start(head - period, units_per_head, plan.num_ctas));
      }
    }
  }
  EXPECT_GT(compared_heads, 200);
}

// The cases the structural proof must get right, each against the expanding validator and the enumerating
// proof: odd key/value tile counts (symmetric shift's middle unit), seqlen_q != seqlen_k, GQA groups folded
// into the jobs and split, heads that straddle waves, SM counts that do not divide the unit count.
TEST(PlanProof, StructuralProofAgreesOnTheHardCases) {
  struct Case {
    const char* what;
    AttentionShape shape;
    int group_splits;  // 0: the planner's
    int sms;
  };
  const Case cases[] = {
      {"odd n, one head", make_shape(1, 1, 1, 1152, 1152, 64, true), 0, 132},
      {"odd n, heads across waves", make_shape(2, 3, 1, 1152, 1152, 64, true), 0, 7},
      {"odd n, stride 2", make_shape(1, 3, 1, 1408, 1408, 128, true), 0, 4},
      {"seqlen_q > seqlen_k", make_shape(2, 2, 1, 2000, 1300, 128, true), 0, 5},
      {"seqlen_q > seqlen_k, ragged", make_shape(1, 3, 1, 1999, 1201, 64, true), 0, 3},
      {"seqlen_q < seqlen_k, full", make_shape(2, 2, 1, 700, 2100, 128, false), 0, 9},
      {"seqlen_q > seqlen_k, full", make_shape(1, 3, 1, 2100, 700, 64, false), 0, 4},
      {"GQA folded, one part", make_shape(1, 2, 4, 1300, 1300, 128, true), 1, 6},
      {"GQA split in two", make_shape(2, 2, 4, 1300, 1100, 128, true), 2, 11},
      {"GQA split in two, full", make_shape(2, 2, 4, 900, 1500, 64, false), 2, 13},
      {"GQA, the planner's split in two", make_shape(1, 9, 4, 2048, 2048, 64, true), 0, 78},
      {"units not divisible by SMs", make_shape(3, 5, 1, 1536, 1536, 64, false), 0, 114},
      {"units not divisible by SMs, causal", make_shape(3, 5, 1, 2304, 2304, 128, true), 0, 114},
      {"heads straddle every wave", make_shape(3, 4, 1, 1664, 1664, 64, true), 0, 10},
      {"one CTA", make_shape(1, 2, 1, 640, 640, 64, true), 0, 1},
  };
  int proven = 0;
  for (const Case& c : cases) {
    const TiledProblem problem = make_tiled_problem(c.shape, c.group_splits);
    const Schedule schedule = problem.causal ? Schedule::kSymmetricShift : Schedule::kShift;
    const PlanResult planned = make_schedule_plan(problem, schedule, c.sms);
    ASSERT_TRUE(planned.ok()) << c.what << ": " << planned.rejected;
    const SchedulePlan& plan = planned.plan;
    const std::string expected = full_report(plan);
    const PlanProof proof = prove_plan(plan);
    EXPECT_EQ(proof.summary, expected) << c.what << ": " << describe(plan);
    EXPECT_TRUE(proof.stats.by_structure) << c.what;
    EXPECT_EQ(prove_plan(plan, in_chunks(2)).summary, expected) << c.what;
    proven += proof.stats.by_structure && proof.ok() ? 1 : 0;
  }
  EXPECT_EQ(proven, static_cast<int>(std::size(cases)));
}

// Plans of the shift schedules that the planner rejects (a wave wider than its rotation, or a mask the
// closed forms do not describe) do not meet the structural hypotheses: the enumeration decides, as the
// expanding validator does. Some are valid all the same (lanes that meet on a tile stall rather than
// deadlock), one visits tiles its mask hides. (Symmetric shift's rectangles are never shorter than their wave
// where its mask hypothesis holds, so that precondition has no case here.)
TEST(PlanProof, RejectedShiftPlansAreNotProvenByStructure) {
  struct Case {
    const char* what;
    TiledProblem problem;
    Schedule schedule;
    int sms;
  };
  TiledProblem uneven_stride = abstract_problem(1, 6, 12, true, 3);
  uneven_stride.block_q = 2;
  const Case cases[] = {
      {"shift, fewer query tiles than the wave", abstract_problem(2, 6, 3, false), Schedule::kShift, 6},
      {"shift, causal", abstract_problem(2, 5, 5, true), Schedule::kShift, 4},
      {"symmetric shift, block_kv not a multiple of block_q", uneven_stride, Schedule::kSymmetricShift, 3},
      {"symmetric shift, seqlen_q < seqlen_k", abstract_problem(2, 8, 5, true), Schedule::kSymmetricShift, 3},
      {"symmetric shift, full mask", abstract_problem(2, 6, 6, false), Schedule::kSymmetricShift, 3},
  };
  for (const Case& c : cases) {
    const PlanResult planned = make_schedule_plan(c.problem, c.schedule, c.sms);
    EXPECT_FALSE(planned.ok()) << c.what;
    const std::string expected = full_report(planned.plan);
    const PlanProof proof = prove_plan(planned.plan);
    EXPECT_EQ(proof.summary, expected) << c.what << ": " << describe(planned.plan);
    EXPECT_FALSE(proof.stats.by_structure) << c.what;
  }
}

// The closed forms shift_proof.hpp reasons about, visit by visit, against q_tile_at and rank_of: an edit of
// shift_schedules.hpp that changes them must revisit the structural proof.
TEST(PlanProof, ShiftSchedulesFollowTheClosedFormsOfTheStructuralProof) {
  std::mt19937 rng(29);
  long long visits = 0;
  for (const TiledProblem& problem : random_problems(37, 80)) {
    const int sms = random_sms(rng);
    const int m = problem.num_q_tiles();
    const int n = problem.num_kv_tiles();
    for (Schedule schedule : {Schedule::kShift, Schedule::kSymmetricShift}) {
      const PlanResult planned = make_schedule_plan(problem, schedule, sms);
      if (!planned.ok()) continue;
      const SchedulePlan& plan = planned.plan;
      for (int unit = 0; unit < plan.num_units; ++unit) {
        for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
          const Job job = make_job(plan, unit, sub);
          if (!job.valid) continue;
          const int lane = job.lane;
          const int size = job.wave_size;
          const int earlier = job.earlier;
          const int rect_height = m - job.rect_begin;
          for (int step = 0; step < job.num_steps; ++step) {
            const int v = q_tile_at(plan, job, step);
            const int contributors = problem.num_contributors(v);
            const int earlier_waves = earlier + std::max(0, contributors - (n - earlier));
            int expected_v = 0;
            int expected_rank = 0;
            if (schedule == Schedule::kShift) {
              expected_v = (lane + step) % m;
              expected_rank = earlier + positive_mod(std::min(v, size - 1) - lane, size);
            } else if (job.is_short) {
              expected_v = m - 1 - step;
              expected_rank = earlier_waves + size + job.wave_shorts - 1 - lane;
            } else if (step < rect_height) {
              expected_v = job.rect_begin + (lane + step) % rect_height;
              expected_rank = earlier_waves + positive_mod(std::min(v - job.rect_begin, size - 1) - lane, size);
            } else {
              expected_v = job.q_begin + step - rect_height;
              expected_rank = earlier + contributors - 1 - job.kv_tile;
            }
            ASSERT_EQ(v, expected_v) << describe(plan) << " unit " << unit << " sub " << sub << " step " << step;
            ASSERT_EQ(rank_of(plan, job, v), expected_rank) << describe(plan) << " unit " << unit << " step " << step;
            ++visits;
          }
        }
      }
    }
  }
  EXPECT_GT(visits, 100000);
}

// Shapes too large to expand, proven both ways: the structural proof's verdict is the enumeration's, and the
// enumeration finds the fast conditions hold, as the theorems of shift_proof.hpp say they do.
TEST(PlanProof, StructuralProofAgreesWithTheEnumerationOnLargerShapes) {
  std::mt19937 rng(43);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int groups[] = {1, 2, 4};
  int proven = 0;
  for (int i = 0; i < 60; ++i) {
    const int seqlen_q = uniform(2000, 24000);
    const int seqlen_k = i % 2 == 0 ? seqlen_q : uniform(2000, seqlen_q);
    const int group = groups[uniform(0, 2)];
    const bool causal = i % 4 < 2;
    const TiledProblem problem = make_tiled_problem(
        make_shape(uniform(1, 4), uniform(1, 8), group, seqlen_q, seqlen_k, uniform(0, 1) == 0 ? 64 : 128, causal),
        group > 1 && uniform(0, 1) == 0 ? group / 2 : 0);
    const PlanResult planned =
        make_schedule_plan(problem, causal ? Schedule::kSymmetricShift : Schedule::kShift, random_sms(rng));
    if (!planned.ok()) continue;
    const PlanProof structural = prove_plan(planned.plan);
    const PlanProof enumerated = prove_plan(planned.plan, in_chunks(2));
    EXPECT_TRUE(structural.stats.by_structure) << describe(planned.plan);
    EXPECT_EQ(structural.summary, enumerated.summary) << describe(planned.plan);
    EXPECT_FALSE(enumerated.stats.streamed_fallback) << describe(planned.plan);
    EXPECT_LE(structural.stats.head_classes, enumerated.stats.head_classes) << describe(planned.plan);
    ++proven;
  }
  EXPECT_GT(proven, 40);
}

// The shapes of the issue: 1M tokens, as many heads as the library accepts, the H100/H200 SM counts (132,
// 114) and a smaller part (78). The shift schedules are proven without enumerating a visit, from a number of
// head classes bounded by the SM count.
TEST(PlanProof, MillionTokenShapesAreProvenByStructure) {
  constexpr int kTokens = 1 << 20;
  const AttentionShape shapes[] = {
      make_shape(1, 15, 1, kTokens, kTokens, 128, true),  make_shape(1, 31, 1, kTokens, kTokens, 64, true),
      make_shape(3, 5, 1, kTokens, kTokens, 128, true),   make_shape(1, 8, 3, kTokens, kTokens, 64, true),
      make_shape(1, 15, 1, kTokens, kTokens, 128, false), make_shape(1, 31, 1, kTokens, kTokens, 64, false),
      make_shape(1, 8, 3, kTokens, kTokens, 64, false),
  };
  for (const AttentionShape& shape : shapes) {
    const TiledProblem problem = make_tiled_problem(shape);
    const Schedule schedule = shape.causal ? Schedule::kSymmetricShift : Schedule::kShift;
    for (int sms : {132, 114, 78}) {
      const PlanProof proof = prove_plan(must_plan(problem, schedule, sms));
      EXPECT_TRUE(proof.ok()) << proof.summary;
      EXPECT_TRUE(proof.stats.by_structure);
      EXPECT_EQ(proof.stats.visits, 0);
      EXPECT_LE(proof.stats.head_classes, std::min(proof.stats.heads, sms));
    }
  }
}

}  // namespace
}  // namespace dash
