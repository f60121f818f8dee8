// The API's proof of schedule plans (api/proven_schedules.hpp): the verdict cache keeps at most its capacity,
// evicting the least recently used plan first, and may be shared by threads; prove_schedule proves a valid
// plan and rejects a broken one with the proof's finding, from the cache the second time.
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "api/proven_schedules.hpp"
#include "dash/attention.hpp"
#include "planner/schedule_plan.hpp"

namespace dash {
namespace {

SchedulePlan plan_of_length(int seqlen, Schedule schedule = Schedule::kAscending) {
  AttentionShape shape;
  shape.batch = 2;
  shape.heads_q = shape.heads_kv = 4;
  shape.seqlen_q = shape.seqlen_k = seqlen;
  shape.head_dim = 128;
  shape.causal = true;
  const PlanResult planned = make_schedule_plan(make_tiled_problem(shape), schedule, 132);
  EXPECT_TRUE(planned.ok()) << planned.rejected;
  return planned.plan;
}

std::string verdict_of(int seqlen) { return "verdict " + std::to_string(seqlen); }

TEST(ProofCache, KeepsTheMostRecentlyUsedPlans) {
  ProofCache cache(3);
  for (int seqlen : {100, 200, 300}) cache.insert(plan_of_length(seqlen), verdict_of(seqlen));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.find(plan_of_length(100)), verdict_of(100));  // now the most recently used
  cache.insert(plan_of_length(400), verdict_of(400));           // evicts 200, the least recently used
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.find(plan_of_length(200)), std::nullopt);
  for (int seqlen : {100, 300, 400}) EXPECT_EQ(cache.find(plan_of_length(seqlen)), verdict_of(seqlen)) << seqlen;
  // Inserting a cached plan again keeps one entry.
  cache.insert(plan_of_length(300), verdict_of(300));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.find(plan_of_length(300, Schedule::kDescending)), std::nullopt) << "the schedule is in the key";
}

TEST(ProofCache, KeysPlansByTheirWindow) {
  AttentionShape shape;
  shape.batch = 2;
  shape.heads_q = shape.heads_kv = 4;
  shape.seqlen_q = shape.seqlen_k = 3000;
  shape.head_dim = 128;
  shape.causal = true;
  const auto plan_with = [&](SlidingWindow window) {
    const PlanResult planned = make_schedule_plan(make_tiled_problem(shape, window), Schedule::kShortestFirst, 132);
    EXPECT_TRUE(planned.ok()) << planned.rejected;
    return planned.plan;
  };
  ProofCache cache(8);
  cache.insert(plan_with(SlidingWindow{}), "causal");
  cache.insert(plan_with(SlidingWindow{511, 0}), "left 511");
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.find(plan_with(SlidingWindow{})), "causal");
  EXPECT_EQ(cache.find(plan_with(SlidingWindow{511, 0})), "left 511");
  EXPECT_EQ(cache.find(plan_with(SlidingWindow{1023, 0})), std::nullopt) << "the left bound is in the key";
  shape.causal = false;
  cache.insert(plan_with(SlidingWindow{511, 64}), "left 511, right 64");
  EXPECT_EQ(cache.find(plan_with(SlidingWindow{511, 65})), std::nullopt) << "the right bound is in the key";
  EXPECT_EQ(cache.find(plan_with(SlidingWindow{511, 64})), "left 511, right 64");
}

TEST(ProveSchedule, ProvesWindowedPlansOfEveryDeterministicScheduleThePlannerAccepts) {
  AttentionShape shape;
  shape.batch = 2;
  shape.heads_q = 8;
  shape.heads_kv = 2;
  shape.seqlen_q = 1000;
  shape.seqlen_k = 1300;
  shape.head_dim = 64;
  for (const bool causal : {false, true}) {
    shape.causal = causal;
    for (const SlidingWindow window : {SlidingWindow{0, 0}, SlidingWindow{255, -1}, SlidingWindow{100, 37}}) {
      for (Schedule schedule : kAllSchedules) {
        if (schedule == Schedule::kAuto) continue;
        const PlanResult planned = make_schedule_plan(make_tiled_problem(shape, window), schedule, 132);
        if (!planned.ok()) continue;
        EXPECT_TRUE(prove_schedule(planned.plan).ok()) << schedule_name(schedule) << (causal ? " causal" : " full")
                                                       << " window " << window.left << "," << window.right;
      }
    }
  }
}

TEST(ProofCache, IsSafeToShareBetweenThreads) {
  constexpr int kThreads = 8;
  constexpr int kLookups = 3000;
  constexpr int kPlans = 200;
  constexpr size_t kCapacity = 64;
  std::vector<SchedulePlan> plans;
  for (int i = 0; i < kPlans; ++i) plans.push_back(plan_of_length(64 * (i + 1)));
  ProofCache cache(kCapacity);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kLookups; ++k) {
        const int i = (t * 7 + k * 13) % kPlans;
        if (const std::optional<std::string> verdict = cache.find(plans[i])) {
          if (*verdict != verdict_of(i)) ++wrong;
        } else {
          cache.insert(plans[i], verdict_of(i));
        }
        if (cache.size() > kCapacity) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(cache.size(), kCapacity);
}

TEST(ProveSchedule, ProvesValidPlansAndRejectsBrokenOnes) {
  for (Schedule schedule : {Schedule::kAscending, Schedule::kShortestFirst, Schedule::kSymmetricShift}) {
    const SchedulePlan plan = plan_of_length(3000, schedule);
    for (int call = 0; call < 2; ++call) EXPECT_TRUE(prove_schedule(plan).ok()) << schedule_name(schedule);
  }
  SchedulePlan broken = plan_of_length(3000);
  broken.kind = Schedule::kAuto;  // no schedule: no jobs
  for (int call = 0; call < 2; ++call) {
    const Status status = prove_schedule(broken);
    EXPECT_EQ(status.code(), StatusCode::kScheduleRejected);
    EXPECT_NE(status.message().find("coverage: job (head 0, kv tile 0) is never scheduled"), std::string::npos)
        << status.message();
  }
}

}  // namespace
}  // namespace dash
