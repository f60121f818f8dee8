// What sm_margin changes and what it does not, on the CPU: plans made by plan_backward() for a device described by
// hand, with margins from 0 to all SMs but one, read through the schedule functions the kernels run and executed by
// the CPU emulator (host threads as the plan's CTAs, random delays before every dQ reduction).
//  - Dynamic schedules (ascending, descending, shortest-first, nondeterministic): units reach CTAs from a counter,
//    and which job a unit holds, the query tiles it visits and the rank of each contribution depend on tile
//    indices only. So a margin changes the plan's CTA count and nothing else, and the emulated gradients of the
//    deterministic ones are bitwise those of margin 0.
//  - Static schedules (shift, symmetric shift): CTA c runs units c, c + C, ... and the wave state steers each unit
//    of a wave, so the visiting orders and ranks are those of the smaller CTA count: the plan, and with it the bits,
//    change. Each plan is still proven and bitwise reproducible from run to run, and matches the reference.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "api/backward_plan.hpp"
#include "dash/attention.hpp"
#include "emulator/emulator.hpp"
#include "schedule/schedule.hpp"

namespace dash {
namespace {

// A small device, so that the shapes below have more work units than SMs and a margin changes the CTA count.
constexpr int kDeviceSms = 8;
constexpr int kMargins[] = {0, 3, 5, kDeviceSms - 1};
// Float32 tiles over inputs in [-1, 1] (the emulator's tests use the same bound).
constexpr double kFloat32Tolerance = 1e-5;

DeviceInfo small_device() { return DeviceInfo{0, kDeviceSms, 9, 0, "a Hopper GPU with 8 SMs"}; }

// Head dim 64: the kernels' 128 x 128 tiles, so these are the plans the GPU would run. Three key/value tiles per
// schedule head, and six (MHA) or eight (GQA, a group of four split into single query heads) schedule heads: 18 or
// 24 units, 12 or 16 under symmetric shift, which pairs tiles.
AttentionShape shape(bool causal, bool gqa) {
  AttentionShape s;
  s.batch = gqa ? 1 : 3;
  s.seqlen_q = s.seqlen_k = 384;
  s.heads_q = gqa ? 8 : 2;
  s.heads_kv = 2;
  s.head_dim = 64;
  s.dtype = DType::kBF16;
  s.softmax_scale = 0.125f;
  s.causal = causal;
  return s;
}

const std::vector<AttentionShape>& shapes() {
  static const std::vector<AttentionShape> all = {shape(false, false), shape(true, false), shape(false, true),
                                                  shape(true, true)};
  return all;
}

std::string describe(const AttentionShape& s) {
  return std::string(s.causal ? "causal" : "full") + (s.heads_q != s.heads_kv ? " GQA" : " MHA");
}

bool is_static(Schedule schedule) { return schedule == Schedule::kShift || schedule == Schedule::kSymmetricShift; }

// The plan of `schedule` with `margin`; an empty plan when its preconditions fail for this shape.
BackwardPlan plan_with_margin(const AttentionShape& s, Schedule schedule, int margin) {
  BackwardPlan plan;
  const Status status = plan_backward(s, schedule, margin, small_device(), &plan);
  if (status.code() == StatusCode::kScheduleRejected) return BackwardPlan();
  EXPECT_TRUE(status.ok()) << status.to_string();
  return plan;
}

const SchedulePlan& schedule_plan(const BackwardPlan& plan) { return BackwardPlanAccess::data(plan)->schedule_plan; }

// Everything the schedule functions say about a plan's work, unit by unit: each job's head, key/value tile and
// visits in order, each visit as (query tile, rank). The CTA a unit runs on is not part of it.
std::vector<int> visiting_order(const SchedulePlan& plan) {
  std::vector<int> order;
  for (int unit = 0; unit < plan.num_units; ++unit) {
    for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
      const Job job = make_job(plan, unit, sub);
      if (!job.valid) continue;
      order.insert(order.end(), {unit, sub, job.head, job.kv_tile, job.num_steps});
      for (int step = 0; step < job.num_steps; ++step) {
        const int v = q_tile_at(plan, job, step);
        order.insert(order.end(), {v, rank_of(plan, job, v)});
      }
    }
  }
  return order;
}

TEST(SmMargin, ShrinksEveryPlansCtaCountToTheSmsLeft) {
  for (const AttentionShape& s : shapes()) {
    for (Schedule schedule : kAllSchedules) {
      for (const int margin : kMargins) {
        const BackwardPlan plan = plan_with_margin(s, schedule, margin);
        if (plan.empty()) continue;
        SCOPED_TRACE(describe(s) + ", " + std::string(schedule_name(schedule)) + ", margin " + std::to_string(margin));
        EXPECT_EQ(plan.planned_sm_count(), kDeviceSms - margin);
        const SchedulePlan& planned = schedule_plan(plan);
        ASSERT_GT(planned.num_units, kDeviceSms);
        EXPECT_EQ(planned.num_ctas, kDeviceSms - margin);
      }
    }
  }
}

TEST(SmMargin, LeavesTheDynamicSchedulesOrdersUnchanged) {
  int compared = 0;
  for (const AttentionShape& s : shapes()) {
    for (Schedule schedule : kAllSchedules) {
      const BackwardPlan all_sms = plan_with_margin(s, schedule, 0);
      if (all_sms.empty() || is_static(all_sms.schedule())) continue;
      const std::vector<int> expected = visiting_order(schedule_plan(all_sms));
      for (const int margin : kMargins) {
        SCOPED_TRACE(describe(s) + ", " + std::string(schedule_name(schedule)) + ", margin " + std::to_string(margin));
        const BackwardPlan fewer = plan_with_margin(s, schedule, margin);
        ASSERT_FALSE(fewer.empty());
        EXPECT_EQ(fewer.schedule(), all_sms.schedule());
        EXPECT_EQ(schedule_plan(fewer).dispatch, Dispatch::kDynamic);
        EXPECT_TRUE(visiting_order(schedule_plan(fewer)) == expected);
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 4 * 4 * static_cast<int>(std::size(kMargins)));
}

TEST(SmMargin, ReplansTheStaticSchedules) {
  int changed = 0;
  for (const AttentionShape& s : shapes()) {
    for (Schedule schedule : {Schedule::kShift, Schedule::kSymmetricShift}) {
      const BackwardPlan all_sms = plan_with_margin(s, schedule, 0);
      if (all_sms.empty()) continue;
      const std::vector<int> all_sms_order = visiting_order(schedule_plan(all_sms));
      for (const int margin : kMargins) {
        if (margin == 0) continue;
        SCOPED_TRACE(describe(s) + ", " + std::string(schedule_name(schedule)) + ", margin " + std::to_string(margin));
        const BackwardPlan fewer = plan_with_margin(s, schedule, margin);
        if (fewer.empty()) continue;
        EXPECT_EQ(schedule_plan(fewer).dispatch, Dispatch::kStatic);
        EXPECT_LT(schedule_plan(fewer).num_ctas, schedule_plan(all_sms).num_ctas);
        EXPECT_FALSE(visiting_order(schedule_plan(fewer)) == all_sms_order)
            << "the static plan for " << kDeviceSms - margin << " SMs visits as the one for " << kDeviceSms;
        ++changed;
      }
    }
  }
  // Shift on both full-mask shapes and symmetric shift on both causal ones, at each nonzero margin.
  EXPECT_EQ(changed, 4 * (static_cast<int>(std::size(kMargins)) - 1));
}

// --- the emulator: the bits themselves ---------------------------------------------------------------------

EmulatorOptions emulator_options() {
  EmulatorOptions options;
  options.runs = 2;
  options.max_delay_us = 20;
  return options;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One emulation of `plan`, checked: it finished, gave the same bits in every run and matches the reference.
EmulationResult emulate_checked(const EmulatorInputs& inputs, const BackwardPlan& plan) {
  EmulationResult result = emulate(inputs, schedule_plan(plan), emulator_options());
  EXPECT_TRUE(result.completed) << result.error;
  EXPECT_TRUE(result.bitwise_identical);
  EXPECT_LT(result.max_rel_error(), kFloat32Tolerance);
  return result;
}

TEST(SmMarginEmulated, DynamicSchedulesGiveTheBitsOfMarginZero) {
  for (const AttentionShape& s : {shape(false, false), shape(true, true)}) {
    const EmulatorInputs inputs = make_emulator_inputs(s, /*seed=*/31);
    for (Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst}) {
      SCOPED_TRACE(describe(s) + ", " + std::string(schedule_name(schedule)));
      const EmulationResult all_sms = emulate_checked(inputs, plan_with_margin(s, schedule, 0));
      for (const int margin : {3, kDeviceSms - 1}) {
        SCOPED_TRACE("margin " + std::to_string(margin));
        const EmulationResult fewer = emulate_checked(inputs, plan_with_margin(s, schedule, margin));
        EXPECT_TRUE(same_bits(fewer.gradients.dq, all_sms.gradients.dq));
        EXPECT_TRUE(same_bits(fewer.gradients.dk, all_sms.gradients.dk));
        EXPECT_TRUE(same_bits(fewer.gradients.dv, all_sms.gradients.dv));
      }
    }
  }
}

// A static plan for fewer SMs is another plan, but still one the proof accepts (plan_backward proved it), that
// finishes with the same bits in every run and computes the gradients. Its bits are its own: the summation orders
// changed, so on these inputs dQ and dK differ from margin 0 in the last place (a caller who needs the bits of
// another run must use its margin too).
TEST(SmMarginEmulated, StaticSchedulesPlannedForFewerSmsAreReproducibleAndCorrect) {
  for (const auto& [s, schedule] :
       {std::pair{shape(false, false), Schedule::kShift}, std::pair{shape(true, false), Schedule::kSymmetricShift}}) {
    const EmulatorInputs inputs = make_emulator_inputs(s, /*seed=*/32);
    const EmulationResult all_sms = emulate_checked(inputs, plan_with_margin(s, schedule, 0));
    for (const int margin : {3, kDeviceSms - 1}) {
      SCOPED_TRACE(describe(s) + ", " + std::string(schedule_name(schedule)) + ", margin " + std::to_string(margin));
      const BackwardPlan plan = plan_with_margin(s, schedule, margin);
      ASSERT_FALSE(plan.empty());
      const EmulationResult fewer = emulate_checked(inputs, plan);
      EXPECT_FALSE(same_bits(fewer.gradients.dq, all_sms.gradients.dq));
      EXPECT_FALSE(same_bits(fewer.gradients.dk, all_sms.gradients.dk));
    }
  }
}

}  // namespace
}  // namespace dash
