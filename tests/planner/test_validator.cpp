// The validator must be able to fail: hand-corrupted expansions of valid schedules (a duplicated or
// out-of-range rank, a dropped or repeated visit, a dynamic wait on a later unit, a static wait cycle) and
// a plan of no schedule are each reported with a message that names the problem, and make_schedule_plan refuses
// to plan one. Also checks compare's per-schedule report.
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "planner/compare.hpp"
#include "planner/dag.hpp"
#include "planner/expanded_schedule.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/validator.hpp"
#include "schedule/schedule.hpp"
#include "schedule_test_support.hpp"

namespace dash {
namespace {

using testing::abstract_problem;
using testing::must_plan;
using testing::step_of;
using testing::swap_ranks;

// Passes when `text` contains `part`; prints the whole message otherwise.
::testing::AssertionResult mentions(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not mention \"" << part << "\"";
}

ExpandedSchedule shift_4x4() {
  return expand_schedule(must_plan(abstract_problem(1, 4, 4, false), Schedule::kShift, 4));
}

TEST(Validator, AcceptsTheUncorruptedSchedules) {
  for (Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst,
                            Schedule::kSymmetricShift, Schedule::kNondeterministic}) {
    const ValidationReport report =
        validate_schedule(expand_schedule(must_plan(abstract_problem(2, 6, 6, true), schedule, 4)));
    EXPECT_TRUE(report.ok()) << schedule_name(schedule) << ": " << report.summary();
    EXPECT_EQ(report.summary(), "valid");
    EXPECT_EQ(report.ordered, schedule != Schedule::kNondeterministic);
  }
  EXPECT_TRUE(validate_schedule(shift_4x4()).ok());
}

// make_job gives no job to a plan of kAuto or of a value outside the enum (the switches in schedule.hpp have
// no default that would run another schedule), so such a plan can never pass for a real one.
TEST(Validator, PlanOfNoScheduleHasNoJobsAndFailsCoverage) {
  for (Schedule kind : {Schedule::kAuto, static_cast<Schedule>(42)}) {
    SchedulePlan plan = must_plan(abstract_problem(1, 4, 4, false), Schedule::kAscending, 4);
    plan.kind = kind;
    const ExpandedSchedule s = expand_schedule(plan);
    EXPECT_TRUE(s.jobs.empty()) << static_cast<int>(kind);
    const ValidationReport report = validate_schedule(s);
    EXPECT_FALSE(report.ok());
    EXPECT_TRUE(mentions(report.summary(), "coverage: job (head 0, kv tile 0) is never scheduled"));
  }
}

// make_schedule_plan names every schedule (no default): the static ones are the shift schedules, symmetric shift
// alone holds two jobs per unit, and kAuto or a value outside the enum is refused rather than planned as some
// dynamic schedule.
TEST(Validator, MakeSchedulePlanStatesEachSchedulesDispatchAndRefusesNoSchedule) {
  const TiledProblem problem = abstract_problem(2, 6, 6, true);
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kAuto) continue;
    // Shift needs the full mask; every other schedule plans the causal problem.
    const bool full = schedule == Schedule::kShift;
    const PlanResult planned = make_schedule_plan(full ? abstract_problem(2, 6, 6, false) : problem, schedule, 4);
    EXPECT_TRUE(planned.ok()) << schedule_name(schedule) << ": " << planned.rejected;
    const bool shift = schedule == Schedule::kShift || schedule == Schedule::kSymmetricShift;
    EXPECT_EQ(planned.plan.dispatch, shift ? Dispatch::kStatic : Dispatch::kDynamic) << schedule_name(schedule);
    EXPECT_EQ(planned.plan.jobs_per_unit, schedule == Schedule::kSymmetricShift ? 2 : 1) << schedule_name(schedule);
  }
  EXPECT_TRUE(mentions(make_schedule_plan(problem, Schedule::kAuto, 4).rejected, "auto is not a schedule"));
  EXPECT_TRUE(
      mentions(make_schedule_plan(problem, static_cast<Schedule>(42), 4).rejected, "Schedule(42) is not a schedule"));
}

// A planned schedule sums in order exactly when it is deterministic, and auto (never planned itself) counts as
// deterministic because it resolves only to ordered schedules: choose_schedule never picks the nondeterministic one.
TEST(Validator, DeterministicSchedulesAreTheOrderedOnes) {
  const TiledProblem causal = abstract_problem(2, 6, 6, true);
  const TiledProblem full = abstract_problem(2, 6, 6, false);
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kAuto) continue;
    const PlanResult planned = make_schedule_plan(schedule == Schedule::kShift ? full : causal, schedule, 4);
    ASSERT_TRUE(planned.ok()) << schedule_name(schedule) << ": " << planned.rejected;
    EXPECT_EQ(sums_in_order(planned.plan), is_deterministic(schedule)) << schedule_name(schedule);
  }
  EXPECT_FALSE(is_deterministic(Schedule::kNondeterministic));
  EXPECT_TRUE(is_deterministic(Schedule::kAuto));
  for (const TiledProblem& problem : {causal, full}) {
    EXPECT_TRUE(is_deterministic(choose_schedule(problem, 4)));
  }
}

TEST(Validator, DuplicatedRank) {
  ExpandedSchedule s = shift_4x4();
  s.steps[step_of(s, 2, 1)].rank = s.steps[step_of(s, 1, 1)].rank;
  const ValidationReport report = validate_schedule(s);
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(report.coverage_error.empty());
  EXPECT_TRUE(mentions(report.rank_error, "rank 0 twice"));
  EXPECT_TRUE(mentions(report.summary(), "ranks: dQ tile 1"));
}

TEST(Validator, RankOutOfRange) {
  ExpandedSchedule s = shift_4x4();
  s.steps[step_of(s, 3, 2)].rank = 4;
  EXPECT_TRUE(mentions(validate_schedule(s).rank_error, "rank 4 outside [0, 4)"));
}

TEST(Validator, DroppedStep) {
  ExpandedSchedule s = shift_4x4();
  s.jobs.back().job.num_steps -= 1;
  s.steps.pop_back();
  const ValidationReport report = validate_schedule(s);
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(mentions(report.coverage_error, "kv tile 3"));
  EXPECT_TRUE(mentions(report.coverage_error, "does not cover the query tiles its mask sees"));
}

TEST(Validator, RepeatedVisit) {
  ExpandedSchedule s = shift_4x4();
  s.steps[step_of(s, 1, 2)].q_tile = 1;
  EXPECT_TRUE(mentions(validate_schedule(s).coverage_error, "kv tile 1) visits query tile 1 twice"));
}

TEST(Validator, VisitOutsideTheMask) {
  ExpandedSchedule s = expand_schedule(must_plan(abstract_problem(1, 4, 4, true), Schedule::kAscending, 4));
  s.steps[step_of(s, 2, 3)].q_tile = 1;  // KV2 sees only Q2 and Q3
  EXPECT_TRUE(mentions(validate_schedule(s).coverage_error, "visits query tile 1 outside its range"));
}

TEST(Validator, JobScheduledTwiceOrNever) {
  ExpandedSchedule twice = shift_4x4();
  twice.jobs[1].job.kv_tile = 0;
  EXPECT_TRUE(mentions(validate_schedule(twice).coverage_error, "(head 0, kv tile 0) is scheduled twice"));
  ExpandedSchedule outside = shift_4x4();
  outside.jobs[3].job.head = 1;
  EXPECT_TRUE(mentions(validate_schedule(outside).coverage_error, "is out of range"));
  // Drop the last unit altogether (its job and its steps).
  ExpandedSchedule never = shift_4x4();
  never.jobs.pop_back();
  never.unit_first_job.back() = static_cast<int>(never.jobs.size());
  never.steps.resize(never.steps.size() - 4);
  EXPECT_TRUE(mentions(validate_schedule(never).coverage_error, "(head 0, kv tile 3) is never scheduled"));
}

// Ascending order with KV0 and KV1 swapped on Q2: unit 0 would wait on unit 1, and a GPU may run unit 0
// on the last free SM while unit 1 is still undispatched behind it.
TEST(Validator, DynamicWaitOnALaterUnit) {
  ExpandedSchedule s = expand_schedule(must_plan(abstract_problem(1, 4, 4, false), Schedule::kAscending, 4));
  swap_ranks(s, 2, 0, 1);
  const ValidationReport report = validate_schedule(s);
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(report.rank_error.empty()) << "the ranks are still a permutation";
  EXPECT_FALSE(report.deadlock_free);
  EXPECT_TRUE(mentions(report.deadlock_error, "unit 0 waits on unit 1 (dQ tile 2, rank 1)"));
  EXPECT_TRUE(mentions(report.summary(), "deadlock:"));
}

// Shift 4x4 with KV0 and KV1 swapped on Q0 and on Q1. Q0 now sums KV1 (step 3) before KV0 (step 0), and
// Q1 sums KV0 (step 1) before KV1 (step 0): each CTA waits for a later step of the other.
TEST(Validator, StaticWaitCycle) {
  ExpandedSchedule s = shift_4x4();
  swap_ranks(s, 0, 0, 1);
  swap_ranks(s, 1, 0, 1);
  const ValidationReport report = validate_schedule(s);
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(report.rank_error.empty());
  EXPECT_TRUE(mentions(report.deadlock_error, "waits forever on dQ tile"));
  const DagAnalysis dag = analyze_dag(s, static_cta_jobs(s), CostModel{});
  EXPECT_FALSE(dag.acyclic);
  EXPECT_TRUE(mentions(dag.cycle, "never becomes ready"));
}

// A single swap on one tile only adds a wait, not a cycle: it stays deadlock-free, and the DAG reports
// the backward order edge as a lemma violation that costs time.
TEST(Validator, BackwardEdgeIsALemmaViolationNotADeadlock) {
  ExpandedSchedule s = shift_4x4();
  swap_ranks(s, 0, 0, 1);
  const ValidationReport report = validate_schedule(s);
  EXPECT_TRUE(report.ok()) << report.summary();
  EXPECT_GT(report.dag.lemma_violations, 0);
  ASSERT_FALSE(report.dag.violation_examples.empty());
  EXPECT_EQ(report.dag.violation_examples[0].dq_tile, 0);
  EXPECT_GT(report.dag.critical_path, 4 * 1.25);
  EXPECT_EQ(validate_schedule(shift_4x4()).dag.lemma_violations, 0);
}

TEST(Compare, ReportsEverySchedule) {
  for (double r : {0.25, 1.0}) {
    const Comparison cmp = compare_schedules(abstract_problem(2, 8, 8, true), 8, CostModel{1.0, r, 0.0});
    ASSERT_EQ(cmp.schedules.size(), 6u);
    EXPECT_EQ(cmp.auto_choice, Schedule::kShortestFirst) << "measured fastest on the GPU";
    EXPECT_EQ(cmp.recommended, Schedule::kSymmetricShift) << "smallest makespan in the DAG model";
    for (const ScheduleReport& report : cmp.schedules) {
      if (report.schedule == Schedule::kShift) {
        EXPECT_FALSE(report.valid);
        EXPECT_TRUE(mentions(report.reason, "full mask"));
        continue;
      }
      EXPECT_TRUE(report.valid) << schedule_name(report.schedule) << ": " << report.reason;
      EXPECT_TRUE(report.deadlock_free);
      // Regression: the critical path used to come from the validator's fixed costs (r = 0.25).
      EXPECT_DOUBLE_EQ(report.makespan, report.critical_path) << schedule_name(report.schedule) << " r=" << r;
      if (report.schedule == Schedule::kSymmetricShift) {
        EXPECT_DOUBLE_EQ(report.makespan, 2 * 9 * (1.0 + r) / 2);
        EXPECT_EQ(report.lemma_violations, 0);
        EXPECT_DOUBLE_EQ(report.bubble_fraction, 0.0);
      }
    }
  }
  // With a signal latency the simulated makespan may exceed the (latency-free) critical path.
  const ScheduleReport slow =
      evaluate_schedule(abstract_problem(1, 8, 8, false), Schedule::kShift, 8, CostModel{1.0, 0.25, 2.0});
  ASSERT_TRUE(slow.valid) << slow.reason;
  EXPECT_DOUBLE_EQ(slow.critical_path, 8 * 1.25);
  EXPECT_GT(slow.makespan, slow.critical_path);
}

}  // namespace
}  // namespace dash
