// prove_plan (and the streamed validator it falls back on) against the expanding validator: the same report
// ("valid" or the same first finding, word for word) on random plans of every schedule, including heads that
// straddle waves, GQA splits, ragged lengths, odd tile counts and seqlen_q != seqlen_k, on small SM counts
// and several thread counts; and on plans corrupted field by field, which must still be caught. Also checks
// the facts the proof's reduction rests on (validator.hpp): the schedule functions ignore a job's head, each
// head owns its block of dQ tiles, heads fall into few classes, and the fast conditions hold for every plan
// the planner makes, so the proof's work does not grow with batch and heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "planner/expanded_schedule.hpp"
#include "planner/plan_proof.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/streamed_validator.hpp"
#include "planner/validator.hpp"
#include "schedule/schedule.hpp"
#include "schedule_test_support.hpp"

namespace dash {
namespace {

using testing::kSchedules;
using testing::make_shape;
using testing::abstract_problem;
using testing::must_plan;
using testing::step_of;
using testing::swap_ranks;

std::string describe(const SchedulePlan& plan) {
  const TiledProblem& p = plan.problem;
  return std::string(schedule_name(plan.kind)) + (plan.dispatch == Dispatch::kStatic ? " static" : " dynamic") +
         " b=" + std::to_string(p.batch) + " hkv=" + std::to_string(p.heads_kv) + " g=" + std::to_string(p.group_size) +
         "/" + std::to_string(p.group_splits) + " sq=" + std::to_string(p.seqlen_q) + " sk=" + std::to_string(p.seqlen_k) +
         " bq=" + std::to_string(p.block_q) + " bkv=" + std::to_string(p.block_kv) + (p.causal ? " causal" : " full") +
         " ctas=" + std::to_string(plan.num_ctas) + " units=" + std::to_string(plan.num_units) +
         " jobs/unit=" + std::to_string(plan.jobs_per_unit);
}

std::string full_report(const SchedulePlan& plan) { return validate_schedule(expand_schedule(plan)).summary(); }

// Up to `threads` chunks per class whatever its size, so that small plans exercise the cuts and the joins.
ProofOptions in_chunks(int threads) {
  ProofOptions options;
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
      TiledProblem p = abstract_problem(uniform(1, 12), uniform(1, 17), uniform(1, 40), uniform(0, 1) == 1,
                                        uniform(1, 2));
      p.batch = uniform(1, 3);
      out.push_back(p);
      continue;
    }
    const int seqlen_q = uniform(1, 2500);
    // A third square, a third ragged with seqlen_q > seqlen_k, a third the other way.
    const int seqlen_k = i % 3 == 0 ? seqlen_q : uniform(1, 2500);
    const int group = groups[uniform(0, 3)];
    out.push_back(make_tiled_problem(
        make_shape(uniform(1, 3), uniform(1, 6), group, seqlen_q, seqlen_k, uniform(0, 1) == 0 ? 64 : 128,
                   uniform(0, 1) == 1),
        uniform(0, 1) == 0 ? 0 : group));  // the planner's GQA split, or one job per query head
  }
  return out;
}

// SM counts that put heads across wave boundaries: few, odd, or the H100/H200 ones.
int random_sms(std::mt19937& rng) {
  const int named[] = {1, 2, 3, 7, 13, 78, 114, 132};
  return std::uniform_int_distribution<int>(0, 1)(rng) == 0
             ? named[std::uniform_int_distribution<int>(0, 7)(rng)]
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
    EXPECT_EQ(prove_plan(planned.plan).stats.threads, 1);
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
    case 0: bad.num_ctas = uniform(1, 2 * plan.num_ctas + 2); break;
    case 1: bad.num_units += uniform(0, 1) == 0 ? -1 : 1; break;
    case 2: bad.num_units = plan.num_units / std::max(1, p.num_heads()) * std::max(1, p.num_heads() - 1); break;
    case 3: bad.jobs_per_unit = uniform(0, 3); break;
    case 4: bad.kind = kSchedules[uniform(0, 5)]; break;
    case 5: bad.dispatch = plan.dispatch == Dispatch::kStatic ? Dispatch::kDynamic : Dispatch::kStatic; break;
    case 6: p.causal = !p.causal; break;
    case 7: p.seqlen_q = std::max(1, p.seqlen_q + uniform(-2, 2) * p.block_q); break;
    case 8: p.seqlen_k = std::max(1, p.seqlen_k + uniform(-2, 2) * p.block_kv); break;
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
  for (const TiledProblem& problem : random_problems(23, 120)) {
    const int sms = random_sms(rng);
    for (Schedule schedule : kSchedules) {
      const PlanResult planned = make_schedule_plan(problem, schedule, sms);
      if (!planned.ok()) continue;
      for (int i = 0; i < 4; ++i) {
        const SchedulePlan bad = corrupted(planned.plan, rng);
        const std::string expected = full_report(bad);
        EXPECT_EQ(prove_plan(bad, in_chunks(3)).summary, expected) << describe(bad);
        EXPECT_EQ(streamed_validation_summary(bad), expected) << describe(bad);
        const size_t cut = expected.find(" ", expected.find(':') + 2);
        ++findings[expected.substr(0, cut)];
      }
    }
  }
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
  for (Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst,
                            Schedule::kNondeterministic}) {
    const PlanProof one = prove_plan(must_plan(one_head, schedule, 132));
    const PlanProof many = prove_plan(must_plan(many_heads, schedule, 132));
    EXPECT_TRUE(many.ok()) << many.summary;
    EXPECT_EQ(many.stats.heads, 256);
    EXPECT_EQ(many.stats.head_classes, 1) << schedule_name(schedule);
    EXPECT_EQ(many.stats.visits, one.stats.visits) << schedule_name(schedule);
  }
  // 32 key/value tiles, 16 units per head on 132 CTAs: gcd 4, so at most 33 classes.
  const PlanProof symmetric = prove_plan(must_plan(many_heads, Schedule::kSymmetricShift, 132));
  EXPECT_TRUE(symmetric.ok()) << symmetric.summary;
  EXPECT_LE(symmetric.stats.head_classes, 132 / std::gcd(16, 132));
  // 4 key/value tiles per head, 33 heads to a 132-CTA wave: no head straddles, so all are alike.
  const TiledProblem short_heads = make_tiled_problem(make_shape(4, 32, 1, 512, 512, 128, false));
  const PlanProof shift = prove_plan(must_plan(short_heads, Schedule::kShift, 132));
  EXPECT_TRUE(shift.ok()) << shift.summary;
  EXPECT_EQ(shift.stats.head_classes, 1);
}

}  // namespace
}  // namespace dash
