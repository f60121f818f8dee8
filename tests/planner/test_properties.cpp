// Property tests over hundreds of random attention shapes (fixed seeds), with and without sliding windows:
// every schedule either plans and validates, or is rejected with a reason; auto always plans a valid schedule;
// the key/value-order schedules sum dQ in an order independent of the SM count; and the shapes that break the authors'
// code (odd tile counts, ragged lengths, seqlen_q != seqlen_k, other SM counts, > 32767 tiles) work.
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "planner/expanded_schedule.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/simulator.hpp"
#include "planner/validator.hpp"
#include "schedule_test_support.hpp"

namespace dash {
namespace {

using testing::all_ranks;
using testing::kSchedules;
using testing::make_shape;

std::string describe(const AttentionShape& s, int num_sms) {
  return "b=" + std::to_string(s.batch) + " hkv=" + std::to_string(s.heads_kv) + " hq=" + std::to_string(s.heads_q) +
         " sq=" + std::to_string(s.seqlen_q) + " sk=" + std::to_string(s.seqlen_k) +
         " d=" + std::to_string(s.head_dim) + (s.causal ? " causal" : " full") + " sms=" + std::to_string(num_sms);
}

struct RandomCase {
  AttentionShape shape;
  int num_sms;
};

// Random shapes over the brief's ranges. Visits grow as batch * heads_q * seqlen^2, so large sequence
// lengths come with few heads: the whole sweep stays within a few seconds.
std::vector<RandomCase> random_cases(unsigned seed, int count) {
  std::mt19937 rng(seed);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int groups[] = {1, 2, 4, 8};
  const int named_sms[] = {132, 114, 78};
  std::vector<RandomCase> out;
  for (int i = 0; i < count; ++i) {
    const int seqlen_q = uniform(1, 4000);
    // A third of the shapes are square, a third ragged with seqlen_q > seqlen_k, a third the other way.
    const int seqlen_k = i % 3 == 0 ? seqlen_q : uniform(1, 4000);
    const int head_dim = uniform(0, 1) == 0 ? 64 : 128;
    const long long tiles = 1LL * ((seqlen_q + 63) / 64) * ((seqlen_k + 127) / 128);
    int batch = uniform(1, 4);
    int heads_kv = uniform(1, 8);
    int group = groups[uniform(0, 3)];
    while (tiles * batch * heads_kv * group > 60000 && batch * heads_kv * group > 1) {
      if (group > 1)
        group /= 2;
      else if (heads_kv > 1)
        heads_kv /= 2;
      else
        batch /= 2;
    }
    const int num_sms = i % 4 == 3 ? named_sms[i / 4 % 3] : uniform(1, 200);
    out.push_back({make_shape(batch, heads_kv, group, seqlen_q, seqlen_k, head_dim, uniform(0, 1) == 1), num_sms});
  }
  return out;
}

// Plans `schedule` and, when its preconditions hold, proves the plan (coverage, permutation, deadlock
// freedom); returns whether it planned.
bool plan_and_validate(const TiledProblem& problem, Schedule schedule, int num_sms, const std::string& what) {
  const PlanResult planned = make_schedule_plan(problem, schedule, num_sms);
  if (!planned.ok()) {
    EXPECT_FALSE(planned.rejected.empty());
    return false;
  }
  EXPECT_EQ(planned.plan.kind, schedule);
  EXPECT_GE(planned.plan.num_ctas, 1);
  EXPECT_LE(planned.plan.num_ctas, std::max(1, num_sms));
  const ValidationReport report = validate_schedule(expand_schedule(planned.plan));
  EXPECT_TRUE(report.ok()) << schedule_name(schedule) << " " << what << ": " << report.summary();
  return report.ok();
}

TEST(Properties, EveryScheduleValidatesOrIsRejected) {
  int planned[6] = {};
  const std::vector<RandomCase> cases = random_cases(2026, 240);
  for (const RandomCase& c : cases) {
    const TiledProblem problem = make_tiled_problem(c.shape);
    const std::string what = describe(c.shape, c.num_sms);
    for (int i = 0; i < 6; ++i) planned[i] += plan_and_validate(problem, kSchedules[i], c.num_sms, what) ? 1 : 0;
    const PlanResult automatic = plan_schedule(problem, Schedule::kAuto, c.num_sms);
    ASSERT_TRUE(automatic.ok()) << what << ": " << automatic.rejected;
    EXPECT_NE(automatic.plan.kind, Schedule::kAuto);
    EXPECT_NE(automatic.plan.kind, Schedule::kNondeterministic);
    EXPECT_TRUE(validate_schedule(expand_schedule(automatic.plan)).ok()) << what;
    EXPECT_FALSE(make_schedule_plan(problem, Schedule::kAuto, c.num_sms).ok());
  }
  // The key/value-order schedules have no preconditions; the shift schedules apply to about half.
  for (int i : {0, 1, 2, 5}) EXPECT_EQ(planned[i], static_cast<int>(cases.size())) << schedule_name(kSchedules[i]);
  EXPECT_GT(planned[3], 40);
  EXPECT_GT(planned[4], 40);
}

// The same under FlashAttention's sliding windows, alone and with causal (one-sided, two-sided, narrower and
// wider than a tile, some reaching past the whole sequence): the key/value-order schedules cover every band,
// symmetric shift the causal bands of an even slope, shift none; auto keeps to a dynamic schedule.
TEST(Properties, WindowedShapesValidateOrAreRejected) {
  std::mt19937 rng(2027);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int planned[6] = {};
  int windowed = 0;
  const std::vector<RandomCase> cases = random_cases(4242, 160);
  for (const RandomCase& c : cases) {
    const int reach = static_cast<int>(std::max(c.shape.seqlen_q, c.shape.seqlen_k));
    const SlidingWindow window{uniform(0, 3) == 0 ? -1 : uniform(0, reach),
                               uniform(0, 2) == 0 ? 0 : uniform(-1, reach)};
    const TiledProblem problem = make_tiled_problem(c.shape, window);
    windowed += problem.windowed() ? 1 : 0;
    const std::string what =
        describe(c.shape, c.num_sms) + " window " + std::to_string(window.left) + "," + std::to_string(window.right);
    for (int i = 0; i < 6; ++i) planned[i] += plan_and_validate(problem, kSchedules[i], c.num_sms, what) ? 1 : 0;
    const PlanResult automatic = plan_schedule(problem, Schedule::kAuto, c.num_sms);
    ASSERT_TRUE(automatic.ok()) << what << ": " << automatic.rejected;
    if (problem.windowed()) {
      EXPECT_EQ(automatic.plan.dispatch, Dispatch::kDynamic) << what;
    }
  }
  EXPECT_GT(windowed, 100);
  for (int i : {0, 1, 2, 5}) EXPECT_EQ(planned[i], static_cast<int>(cases.size())) << schedule_name(kSchedules[i]);
  EXPECT_GT(planned[4], 20) << "symmetric shift on causal bands";
}

// Bitwise reproducibility across GPUs: the tiled problem (and with it the GQA split, which fixes the
// dK/dV summation order) does not depend on the SM count, and the dQ summation order of ascending,
// descending and shortest-first depends on the tile indices only.
TEST(Properties, KvOrderRanksDoNotDependOnTheSmCount) {
  for (const RandomCase& c : random_cases(77, 80)) {
    // Every other shape under a sliding window of a quarter of the keys (causal or not).
    const SlidingWindow window{c.num_sms % 2 == 0 ? static_cast<int>(c.shape.seqlen_k / 4) : -1, -1};
    const TiledProblem problem = make_tiled_problem(c.shape, window);
    for (Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst}) {
      const ExpandedSchedule a = expand_schedule(make_schedule_plan(problem, schedule, 132).plan);
      const ExpandedSchedule b = expand_schedule(make_schedule_plan(problem, schedule, 77).plan);
      EXPECT_TRUE(all_ranks(a) == all_ranks(b)) << schedule_name(schedule) << " " << describe(c.shape, 77);
    }
  }
}

// Simulated time of the busiest CTA's own work: the makespan of a schedule without dependency stalls.
double busiest_cta_work(const ExpandedSchedule& s, const CostModel& costs) {
  long long most = 0;
  for (const auto& jobs : static_cta_jobs(s)) {
    long long steps = 0;
    for (int j : jobs) steps += s.jobs[j].job.num_steps;
    most = std::max(most, steps);
  }
  return static_cast<double>(most) * (costs.compute + costs.reduce);
}

struct Regression {
  AttentionShape shape;
  int num_sms;
  Schedule schedule;
};

// Shapes where the authors' code deadlocks or misbehaves (paper-notes.md 4.1): each must plan,
// validate and simulate to completion here.
TEST(Regressions, AuthorsFailureCasesPlanAndRun) {
  const std::vector<Regression> cases = {
      // Odd key/value tile counts: the middle tile forms a unit of its own (authors: host assert).
      {make_shape(2, 4, 1, 1920, 1920, 128, true), 132, Schedule::kSymmetricShift},
      {make_shape(1, 3, 1, 640, 640, 64, true), 132, Schedule::kSymmetricShift},
      {make_shape(1, 5, 1, 384, 384, 64, false), 132, Schedule::kShift},
      // Ragged: 1950 rows at head dim 128 give 16 key/value tiles but 31 query tiles, not 32.
      {make_shape(2, 8, 1, 1950, 1950, 128, true), 132, Schedule::kSymmetricShift},
      {make_shape(1, 2, 1, 1950, 1950, 128, true), 132, Schedule::kSymmetricShift},
      {make_shape(1, 4, 2, 1950, 1950, 128, false), 132, Schedule::kShift},
      // seqlen_q != seqlen_k both ways.
      {make_shape(2, 4, 1, 3000, 1000, 128, true), 132, Schedule::kSymmetricShift},
      {make_shape(2, 4, 1, 1000, 3000, 128, true), 132, Schedule::kShortestFirst},
      {make_shape(1, 4, 1, 1000, 3000, 64, false), 132, Schedule::kAscending},
      {make_shape(1, 8, 1, 3000, 1000, 64, false), 132, Schedule::kShift},
      // SM counts other than 132 (the authors hard-code 132 in the wave math).
      {make_shape(4, 16, 1, 2048, 2048, 128, true), 114, Schedule::kSymmetricShift},
      {make_shape(4, 16, 1, 2048, 2048, 128, true), 78, Schedule::kSymmetricShift},
      {make_shape(4, 16, 1, 2048, 2048, 64, false), 114, Schedule::kShift},
      {make_shape(2, 16, 1, 1024, 1024, 64, false), 78, Schedule::kShift},
      {make_shape(1, 3, 1, 1000, 1000, 128, true), 1, Schedule::kSymmetricShift},
      {make_shape(1, 3, 1, 1000, 1000, 128, false), 7, Schedule::kShift},
  };
  for (const Regression& c : cases) {
    const std::string what = std::string(schedule_name(c.schedule)) + " " + describe(c.shape, c.num_sms);
    const TiledProblem problem = make_tiled_problem(c.shape);
    const PlanResult planned = make_schedule_plan(problem, c.schedule, c.num_sms);
    ASSERT_TRUE(planned.ok()) << what << ": " << planned.rejected;
    EXPECT_TRUE(plan_schedule(problem, Schedule::kAuto, c.num_sms).ok()) << what;
    const ExpandedSchedule s = expand_schedule(planned.plan);
    const ValidationReport report = validate_schedule(s);
    ASSERT_TRUE(report.ok()) << what << ": " << report.summary();
    for (const CostModel& costs : {CostModel{1.0, 0.25, 0.0}, CostModel{1.0, 0.25, 0.5}}) {
      const SimulationResult sim = simulate(s, costs);
      ASSERT_TRUE(sim.completed) << what << ": " << sim.stuck;
      if (planned.plan.dispatch == Dispatch::kStatic) {
        EXPECT_GE(sim.makespan, busiest_cta_work(s, costs)) << what;
      }
    }
  }
}

// The notes' observation (3.5): on 132 SMs, the shift schedules' makespan on the paper's shapes is the
// busiest CTA's work, i.e. the wave math leaves no dependency stall, also with heads straddling waves.
TEST(Regressions, PaperShapesHaveNoDependencyStalls) {
  const CostModel costs{1.0, 0.25, 0.0};
  for (int seqlen : {512, 1024, 2048}) {
    for (int head_dim : {64, 128}) {
      for (bool causal : {false, true}) {
        const AttentionShape shape = make_shape(16384 / seqlen, 2048 / head_dim, 1, seqlen, seqlen, head_dim, causal);
        const TiledProblem problem = make_tiled_problem(shape);
        const PlanResult planned =
            make_schedule_plan(problem, causal ? Schedule::kSymmetricShift : Schedule::kShift, 132);
        ASSERT_TRUE(planned.ok()) << describe(shape, 132) << ": " << planned.rejected;
        const ExpandedSchedule s = expand_schedule(planned.plan);
        EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, busiest_cta_work(s, costs)) << describe(shape, 132);
      }
    }
  }
}

// batch * heads * key/value tiles > 32767 overflows the authors' 16-bit tile ids. Short sequences keep
// this fast: 4 x 4200 heads x 2 tiles (hdim 64, 256 rows) = 33600 jobs, 16800 symmetric-shift pairs.
TEST(Regressions, MoreThan32767TilesDoNotOverflow) {
  for (bool causal : {false, true}) {
    const AttentionShape shape = make_shape(4, 4200, 1, 256, 256, 64, causal);
    const TiledProblem problem = make_tiled_problem(shape);
    ASSERT_GT(1LL * problem.num_heads() * problem.num_kv_tiles(), 32767);
    const Schedule schedule = causal ? Schedule::kSymmetricShift : Schedule::kShift;
    const PlanResult planned = make_schedule_plan(problem, schedule, 132);
    ASSERT_TRUE(planned.ok()) << planned.rejected;
    const ExpandedSchedule s = expand_schedule(planned.plan);
    const ValidationReport report = validate_schedule(s);
    ASSERT_TRUE(report.ok()) << report.summary();
    const CostModel costs{1.0, 0.25, 0.0};
    EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, busiest_cta_work(s, costs));
    EXPECT_EQ(s.jobs.back().job.head, problem.num_heads() - 1);
    EXPECT_EQ(s.jobs.back().unit, planned.plan.num_units - 1);
  }
}

}  // namespace
}  // namespace dash
