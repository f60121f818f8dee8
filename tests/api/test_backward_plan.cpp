// Tests of BackwardPlan on the host path (no GPU needed): plan_backward() for a DeviceInfo given by hand
// plans what the planner plans for that SM count, resolves auto, sizes the workspace as the kernels' layout
// does, and refuses each bad request (shape, schedule, device, a schedule whose preconditions fail) with its
// own message, leaving the caller's plan untouched; the current-device overload checks the request before
// the device; an empty plan answers zeros and is refused; backward(args, plan) names the first field a call
// and its plan disagree on before anything else, and a call that matches gets past the plan to the next check.
// The SM margin: a plan is what the planner plans for the device's SMs less the margin and records both counts;
// a margin outside [0, SM count) is refused with the rule, a negative one before the device is looked at.
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "api/backward_plan.hpp"
#include "dash/attention.hpp"
#include "kernels/kernel_params.hpp"
#include "planner/schedule_plan.hpp"
#include "rejected_shapes.hpp"

namespace dash {
namespace {

// An H200 as current_device_info() describes it; planning reads its index and SM count only.
DeviceInfo h200(int index = 0) { return DeviceInfo{index, 132, 9, 0, "NVIDIA H200"}; }

AttentionShape causal_shape() { return testing::valid_workspace_shape(); }

AttentionShape full_shape() {
  AttentionShape shape = testing::valid_workspace_shape();
  shape.causal = false;
  return shape;
}

BackwardPlan plan_or_fail(const AttentionShape& shape, Schedule schedule, const DeviceInfo& device = h200()) {
  BackwardPlan plan;
  const Status status = plan_backward(shape, schedule, device, &plan);
  EXPECT_TRUE(status.ok()) << schedule_name(schedule) << ": " << status.to_string();
  return plan;
}

// plan_backward of `shape` and `schedule` on the H200 against the planner's plan_schedule: refused as the planner
// refuses (false), or planned (true, in *plan) with the workspace of the planner's tiles.
bool plans_as_the_planner_does(const AttentionShape& shape, Schedule schedule, BackwardPlan* plan,
                               PlanResult* expected) {
  *expected = plan_schedule(make_tiled_problem(shape), schedule, h200().multiprocessor_count);
  const Status status = plan_backward(shape, schedule, h200(), plan);
  if (!expected->ok()) {
    EXPECT_EQ(status.code(), StatusCode::kScheduleRejected) << status.to_string();
    return false;
  }
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(plan->workspace_bytes(), kernels::BackwardWorkspace::layout(shape, expected->plan.problem).total_bytes);
  return status.ok();
}

TEST(PlanBackward, PlansWhatThePlannerPlansForTheDevicesSmCount) {
  for (const AttentionShape& shape : {causal_shape(), full_shape()}) {
    for (Schedule schedule : kAllSchedules) {
      SCOPED_TRACE(std::string(schedule_name(schedule)) + (shape.causal ? " causal" : " full"));
      BackwardPlan plan;
      PlanResult expected;
      if (!plans_as_the_planner_does(shape, schedule, &plan, &expected)) continue;
      EXPECT_FALSE(plan.empty());
      EXPECT_EQ(plan.requested_schedule(), schedule);
      EXPECT_EQ(plan.schedule(), expected.plan.kind);
      EXPECT_NE(plan.schedule(), Schedule::kAuto);
      EXPECT_EQ(plan.device_index(), 0);
      EXPECT_EQ(plan.multiprocessor_count(), 132);
      EXPECT_GT(plan.workspace_bytes(), 0u);
      const BackwardPlanData& data = *BackwardPlanAccess::data(plan);
      EXPECT_EQ(data.schedule_plan.num_ctas, expected.plan.num_ctas);
      EXPECT_EQ(data.schedule_plan.num_units, expected.plan.num_units);
    }
  }
}

// At d = 192 and 256 the backward plans on the key split's tiles (64x96 and 64x80), every schedule the planner takes
// for the shape, with the workspace of those tiles (the dQ accumulators of 64-row tiles, the split accumulators of 96-
// or 80-row ones).
TEST(PlanBackward, PlansHeadDims192And256OnTheirTiles) {
  for (const auto& [head_dim, block_kv] : {std::pair<int64_t, int>{192, 96}, std::pair<int64_t, int>{256, 80}}) {
    for (AttentionShape shape : {causal_shape(), full_shape()}) {
      shape.head_dim = head_dim;
      shape.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      const TiledProblem problem = make_tiled_problem(shape);
      EXPECT_EQ(problem.block_q, 64);
      EXPECT_EQ(problem.block_kv, block_kv);
      int planned = 0;
      for (Schedule schedule : kAllSchedules) {
        SCOPED_TRACE(std::string(schedule_name(schedule)) + (shape.causal ? " causal" : " full") + " head_dim " +
                     std::to_string(head_dim));
        BackwardPlan plan;
        PlanResult expected;
        if (!plans_as_the_planner_does(shape, schedule, &plan, &expected)) continue;
        ++planned;
        EXPECT_EQ(BackwardPlanAccess::data(plan)->schedule_plan.problem.block_kv, block_kv);
      }
      // auto, ascending, descending, shortest-first and nondeterministic at least.
      EXPECT_GE(planned, 5);
    }
  }
}

// A causal shape at `head_dim` that meets every precondition of symmetric shift but the tiles' (seqlen_q >= seqlen_k,
// one query head per job, waves no taller than their rectangles at d = 128's 64x128 tiles).
AttentionShape symmetric_shift_shape(int64_t head_dim) {
  AttentionShape shape = causal_shape();
  shape.head_dim = head_dim;
  shape.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  shape.heads_q = shape.heads_kv = 2;
  shape.seqlen_q = shape.seqlen_k = 1000;
  return shape;
}

// auto at d = 192 and 256 runs a schedule the planner proves on the 64x96 and 64x80 tiles: shortest-first
// (descending with folded GQA groups) under the causal mask, shift under the full one up to 64 key/value tiles per
// head, shortest-first under a window and on varlen batches whose lengths may fall short of the maxima; never
// symmetric shift.
TEST(PlanBackward, AutoAtHeadDims192And256PicksWhatTheTilesAdmit) {
  struct Expectation {
    const char* name;
    bool causal;
    int64_t heads_q, heads_kv, window_left;
    bool varlen, fill;
    Schedule schedule;
  };
  const Expectation cases[] = {
      {"causal", true, 2, 2, -1, false, true, Schedule::kShortestFirst},
      {"causal_gqa", true, 128, 32, -1, false, true, Schedule::kDescending},  // 704 or 832 jobs: groups not split
      {"full", false, 2, 2, -1, false, true, Schedule::kShift},
      {"causal_window", true, 2, 2, 300, false, true, Schedule::kShortestFirst},
      {"full_window", false, 2, 2, 300, false, true, Schedule::kShortestFirst},
      {"varlen_causal", true, 2, 2, -1, true, true, Schedule::kShortestFirst},
      {"varlen_full", false, 2, 2, -1, true, true, Schedule::kShift},
      {"varlen_full_shorter", false, 2, 2, -1, true, false, Schedule::kShortestFirst},
      {"varlen_window", true, 2, 2, 300, true, true, Schedule::kShortestFirst},
  };
  for (const auto& [head_dim, block_kv] : {std::pair<int64_t, int>{192, 96}, std::pair<int64_t, int>{256, 80}}) {
    for (const Expectation& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " head_dim " + std::to_string(head_dim));
      AttentionShape shape = symmetric_shift_shape(head_dim);
      shape.causal = c.causal;
      shape.heads_q = c.heads_q;
      shape.heads_kv = c.heads_kv;
      shape.window_left = c.window_left;
      BackwardPlan plan;
      const Status status = c.varlen ? plan_varlen_backward(shape, true, c.fill, Schedule::kAuto, 0, h200(), &plan)
                                     : plan_backward(shape, Schedule::kAuto, h200(), &plan);
      ASSERT_TRUE(status.ok()) << status.to_string();
      EXPECT_EQ(plan.schedule(), c.schedule) << schedule_name(plan.schedule());
      EXPECT_EQ(BackwardPlanAccess::data(plan)->schedule_plan.problem.block_kv, block_kv);
    }
  }
}

TEST(PlanBackward, AutoRunsTheScheduleChooseAutoPicks) {
  for (const AttentionShape& shape : {causal_shape(), full_shape()}) {
    const BackwardPlan plan = plan_or_fail(shape, Schedule::kAuto);
    EXPECT_EQ(plan.requested_schedule(), Schedule::kAuto);
    EXPECT_EQ(plan.schedule(), choose_schedule(make_tiled_problem(shape), 132));
  }
}

TEST(PlanBackward, KeepsTheShapeAndTheDevice) {
  AttentionShape shape = causal_shape();
  shape.dtype = DType::kFP16;
  shape.softmax_scale = 0.3f;
  const BackwardPlan plan = plan_or_fail(shape, Schedule::kDescending, DeviceInfo{3, 114, 9, 0, "NVIDIA H100 PCIe"});
  EXPECT_EQ(plan.shape().seqlen_k, shape.seqlen_k);
  EXPECT_EQ(plan.shape().dtype, DType::kFP16);
  EXPECT_EQ(plan.shape().softmax_scale, 0.3f);
  EXPECT_EQ(plan.device_index(), 3);
  EXPECT_EQ(plan.multiprocessor_count(), 114);
}

// The SM count is an input of the static schedules: a smaller device gets a plan of its own.
TEST(PlanBackward, PlansStaticSchedulesForTheSmCountGiven) {
  AttentionShape shape = full_shape();
  shape.batch = 8;
  shape.seqlen_q = shape.seqlen_k = 2048;
  const BackwardPlan large = plan_or_fail(shape, Schedule::kShift, DeviceInfo{0, 132, 9, 0, ""});
  const BackwardPlan small = plan_or_fail(shape, Schedule::kShift, DeviceInfo{0, 16, 9, 0, ""});
  EXPECT_EQ(BackwardPlanAccess::data(large)->schedule_plan.num_ctas, 132);
  EXPECT_EQ(BackwardPlanAccess::data(small)->schedule_plan.num_ctas, 16);
}

TEST(PlanBackward, CopiesShareOnePlanThatOutlivesTheOriginal) {
  BackwardPlan copy;
  {
    const BackwardPlan original = plan_or_fail(causal_shape(), Schedule::kShortestFirst);
    copy = original;
    EXPECT_EQ(BackwardPlanAccess::data(copy), BackwardPlanAccess::data(original));
  }
  EXPECT_EQ(copy.schedule(), Schedule::kShortestFirst);
  EXPECT_EQ(copy.shape().seqlen_q, causal_shape().seqlen_q);
}

TEST(PlanBackward, AnEmptyPlanAnswersZeros) {
  const BackwardPlan plan;
  EXPECT_TRUE(plan.empty());
  EXPECT_EQ(plan.shape().batch, 0);
  EXPECT_EQ(plan.requested_schedule(), Schedule::kAuto);
  EXPECT_EQ(plan.schedule(), Schedule::kAuto);
  EXPECT_EQ(plan.device_index(), 0);
  EXPECT_EQ(plan.multiprocessor_count(), 0);
  EXPECT_EQ(plan.sm_margin(), 0);
  EXPECT_EQ(plan.planned_sm_count(), 0);
  EXPECT_EQ(plan.workspace_bytes(), 0u);
}

// --- refused requests: each its own message, the caller's plan untouched. --------------------------------

// A plan the refusals below must leave alone.
BackwardPlan sentinel_plan() { return plan_or_fail(full_shape(), Schedule::kAscending); }

void expect_untouched(const BackwardPlan& plan) {
  EXPECT_EQ(plan.requested_schedule(), Schedule::kAscending);
  EXPECT_FALSE(plan.shape().causal);
}

class PlanBackwardShape : public ::testing::TestWithParam<testing::RejectedShape> {};

TEST_P(PlanBackwardShape, RefusesTheShapeBeforeAnythingElse) {
  AttentionShape shape = causal_shape();
  GetParam().bend(shape);
  for (const bool given_device : {true, false}) {
    SCOPED_TRACE(given_device ? "given device" : "current device");
    BackwardPlan plan = sentinel_plan();
    // Also with a bad device: the shape is checked first.
    const Status status = given_device ? plan_backward(shape, Schedule::kAuto, DeviceInfo{-1, 0, 0, 0, ""}, &plan)
                                       : plan_backward(shape, Schedule::kAuto, &plan);
    EXPECT_EQ(status.code(), GetParam().code) << status.to_string();
    EXPECT_EQ(status.message(), GetParam().message);
    expect_untouched(plan);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PlanBackwardShape, ::testing::ValuesIn(testing::rejected_shapes()),
                         testing::rejected_shape_name);

TEST(PlanBackwardRefuses, AnInvalidScheduleValueBeforeTheDevice) {
  for (const bool given_device : {true, false}) {
    BackwardPlan plan = sentinel_plan();
    const Status status = given_device ? plan_backward(causal_shape(), static_cast<Schedule>(42), h200(), &plan)
                                       : plan_backward(causal_shape(), static_cast<Schedule>(42), &plan);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("Schedule(42)"), std::string::npos) << status.message();
    expect_untouched(plan);
  }
}

TEST(PlanBackwardRefuses, ANullPlan) {
  for (const bool given_device : {true, false}) {
    const Status status = given_device ? plan_backward(causal_shape(), Schedule::kAuto, h200(), nullptr)
                                       : plan_backward(causal_shape(), Schedule::kAuto, nullptr);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), "plan_backward: plan must not be null");
  }
}

TEST(PlanBackwardRefuses, ANegativeDeviceIndex) {
  BackwardPlan plan = sentinel_plan();
  const Status status = plan_backward(causal_shape(), Schedule::kAuto, DeviceInfo{-1, 132, 9, 0, ""}, &plan);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "device.index must be >= 0, got -1");
  expect_untouched(plan);
}

TEST(PlanBackwardRefuses, ADeviceWithoutMultiprocessors) {
  for (const int sms : {0, -4}) {
    BackwardPlan plan = sentinel_plan();
    const Status status = plan_backward(causal_shape(), Schedule::kAuto, DeviceInfo{0, sms, 9, 0, ""}, &plan);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), "device.multiprocessor_count must be > 0, got " + std::to_string(sms));
    expect_untouched(plan);
  }
}

TEST(PlanBackwardRefuses, AScheduleWhosePreconditionsFail) {
  BackwardPlan plan = sentinel_plan();
  const Status status = plan_backward(full_shape(), Schedule::kSymmetricShift, h200(), &plan);
  EXPECT_EQ(status.code(), StatusCode::kScheduleRejected);
  EXPECT_EQ(status.message(),
            "schedule 'symmetric-shift' cannot run this shape: symmetric-shift needs the causal mask (use shift for "
            "the full mask)");
  expect_untouched(plan);
}

// Symmetric shift's stride is block_kv / block_q query tiles: at d = 192's 64x96 and d = 256's 64x80 tiles the
// planner refuses it with the rule and the tiles, dense and varlen, where d = 128's 64x128 tiles plan it.
TEST(PlanBackwardRefuses, SymmetricShiftAtHeadDims192And256WithTheRule) {
  BackwardPlan plan;
  ASSERT_TRUE(plan_backward(symmetric_shift_shape(128), Schedule::kSymmetricShift, h200(), &plan).ok());
  using Tiles = std::pair<int64_t, std::string>;  // head dim, its tiles
  for (const auto& [head_dim, tiles] : {Tiles{192, "64x96"}, Tiles{256, "64x80"}}) {
    SCOPED_TRACE(head_dim);
    const std::string expected =
        "schedule 'symmetric-shift' cannot run this shape: symmetric-shift needs block_kv to be a multiple of "
        "block_q, and the backward's tiles at this head dim are " +
        tiles +
        " (block_q x block_kv): consecutive key/value tiles' causal ranges would not start a whole number of query "
        "tiles apart; use shortest-first or descending (auto picks one)";
    plan = sentinel_plan();
    const Status dense = plan_backward(symmetric_shift_shape(head_dim), Schedule::kSymmetricShift, h200(), &plan);
    EXPECT_EQ(dense.code(), StatusCode::kScheduleRejected);
    EXPECT_EQ(dense.message(), expected);
    expect_untouched(plan);
    const Status varlen =
        plan_varlen_backward(symmetric_shift_shape(head_dim), /*keys_within_queries=*/true,
                             /*lengths_fill_maxima=*/true, Schedule::kSymmetricShift, 0, h200(), &plan);
    EXPECT_EQ(varlen.code(), StatusCode::kScheduleRejected);
    EXPECT_NE(varlen.message().find("cannot run this varlen batch: symmetric-shift needs block_kv to be a multiple of "
                                    "block_q, and the backward's tiles at this head dim are " +
                                    tiles),
              std::string::npos)
        << varlen.message();
    expect_untouched(plan);
    // Shift's advice for the causal mask names the schedules these tiles admit.
    const Status shift = plan_backward(symmetric_shift_shape(head_dim), Schedule::kShift, h200(), &plan);
    EXPECT_EQ(shift.message(),
              "schedule 'shift' cannot run this shape: shift needs the full mask (use shortest-first "
              "or descending for causal)");
  }
}

// With a GPU the current device's plan is the one its DeviceInfo gives; without one, the device check's status.
TEST(PlanBackward, ForTheCurrentDevicePlansForItsDeviceInfo) {
  BackwardPlan plan;
  const Status status = plan_backward(causal_shape(), Schedule::kAuto, &plan);
  if (const Status device = check_current_device(); !device.ok()) {
    EXPECT_EQ(status.to_string(), device.to_string());
    EXPECT_TRUE(plan.empty());
    return;
  }
  ASSERT_TRUE(status.ok()) << status.to_string();
  DeviceInfo current;
  ASSERT_TRUE(current_device_info(&current).ok());
  const BackwardPlan expected = plan_or_fail(causal_shape(), Schedule::kAuto, current);
  EXPECT_EQ(plan.device_index(), current.index);
  EXPECT_EQ(plan.multiprocessor_count(), current.multiprocessor_count);
  EXPECT_EQ(plan.schedule(), expected.schedule());
  EXPECT_EQ(plan.workspace_bytes(), expected.workspace_bytes());
  size_t bytes = 0;
  ASSERT_TRUE(backward_workspace_size(causal_shape(), Schedule::kAuto, &bytes).ok());
  EXPECT_EQ(bytes, plan.workspace_bytes());
}

// --- the SM margin ---------------------------------------------------------------------------------------

TEST(PlanBackwardSmMargin, PlansWhatThePlannerPlansForTheSmsLeft) {
  AttentionShape shape = full_shape();
  shape.batch = 8;
  shape.seqlen_q = shape.seqlen_k = 2048;
  for (const AttentionShape& s : {shape, causal_shape()}) {
    for (Schedule schedule : kAllSchedules) {
      for (const int margin : {0, 1, 8, 100, 131}) {
        SCOPED_TRACE(std::string(schedule_name(schedule)) + (s.causal ? " causal" : " full") + ", sm_margin " +
                     std::to_string(margin));
        const PlanResult expected = plan_schedule(make_tiled_problem(s), schedule, 132 - margin);
        BackwardPlan plan;
        const Status status = plan_backward(s, schedule, margin, h200(), &plan);
        if (!expected.ok()) {
          EXPECT_EQ(status.code(), StatusCode::kScheduleRejected) << status.to_string();
          continue;
        }
        ASSERT_TRUE(status.ok()) << status.to_string();
        EXPECT_EQ(plan.multiprocessor_count(), 132);
        EXPECT_EQ(plan.sm_margin(), margin);
        EXPECT_EQ(plan.planned_sm_count(), 132 - margin);
        EXPECT_EQ(plan.schedule(), expected.plan.kind);
        const SchedulePlan& planned = BackwardPlanAccess::data(plan)->schedule_plan;
        EXPECT_EQ(planned.num_ctas, expected.plan.num_ctas);
        EXPECT_LE(planned.num_ctas, 132 - margin);
        EXPECT_EQ(planned.num_units, expected.plan.num_units);
        // The workspace is the shape's, whatever the margin.
        EXPECT_EQ(plan.workspace_bytes(), kernels::BackwardWorkspace::layout(s, expected.plan.problem).total_bytes);
      }
    }
  }
}

TEST(PlanBackwardSmMargin, ZeroIsTheDefault) {
  const BackwardPlan plain = plan_or_fail(causal_shape(), Schedule::kAuto);
  EXPECT_EQ(plain.sm_margin(), 0);
  EXPECT_EQ(plain.planned_sm_count(), 132);
}

TEST(PlanBackwardSmMargin, RefusesAMarginNotBelowTheDevicesSmCount) {
  for (const DeviceInfo& device : {h200(), DeviceInfo{3, 114, 9, 0, "NVIDIA H100 PCIe"}}) {
    for (const int margin : {device.multiprocessor_count, device.multiprocessor_count + 1, 1 << 30}) {
      BackwardPlan plan = sentinel_plan();
      const Status status = plan_backward(causal_shape(), Schedule::kAuto, margin, device, &plan);
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(status.message(), "sm_margin must satisfy 0 <= sm_margin < the device's SM count (" +
                                      std::to_string(device.multiprocessor_count) + " on device " +
                                      std::to_string(device.index) + "; at least one SM must run the kernel), got " +
                                      std::to_string(margin));
      expect_untouched(plan);
    }
  }
}

// Negative margins are refused before the device: also for a bad device, and for the current one without a GPU.
TEST(PlanBackwardSmMargin, RefusesANegativeMarginBeforeTheDevice) {
  const std::string expected =
      "sm_margin must satisfy 0 <= sm_margin < the device's SM count (at least one SM must run the kernel), got -1";
  for (const bool given_device : {true, false}) {
    SCOPED_TRACE(given_device ? "given device" : "current device");
    BackwardPlan plan = sentinel_plan();
    const Status status = given_device
                              ? plan_backward(causal_shape(), Schedule::kAuto, -1, DeviceInfo{-1, 0, 0, 0, ""}, &plan)
                              : plan_backward(causal_shape(), Schedule::kAuto, -1, &plan);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), expected);
    expect_untouched(plan);
  }
}

// The shape and the schedule come before the margin.
TEST(PlanBackwardSmMargin, TheShapeAndTheScheduleAreCheckedFirst) {
  AttentionShape shape = causal_shape();
  shape.heads_kv = 0;
  BackwardPlan plan;
  EXPECT_EQ(plan_backward(shape, Schedule::kAuto, -1, h200(), &plan).message(), "shape.heads_kv must be > 0, got 0");
  EXPECT_NE(plan_backward(causal_shape(), static_cast<Schedule>(42), -1, h200(), &plan).message().find("Schedule(42)"),
            std::string::npos);
}

// --- backward(args, plan): the call must be the plan's. ----------------------------------------------------

// Each fake tensor in its own 64 GiB region, aligned: validate() accepts them and never dereferences them.
void* fake_pointer(int region) {
  constexpr uintptr_t kBase = uintptr_t{1} << 44;
  constexpr uintptr_t kRegionBytes = uintptr_t{1} << 36;
  return reinterpret_cast<void*>(kBase + static_cast<uintptr_t>(region) * kRegionBytes);
}

// Arguments validate() accepts for `plan`'s shape and requested schedule.
BackwardArgs matching_args(const BackwardPlan& plan) {
  const AttentionShape& s = plan.shape();
  BackwardArgs a;
  a.shape = s;
  a.schedule = plan.requested_schedule();
  const Strides query = packed_strides(s.seqlen_q, s.heads_q, s.head_dim);
  const Strides key = packed_strides(s.seqlen_k, s.heads_kv, s.head_dim);
  a.q = {fake_pointer(0), query};
  a.k = {fake_pointer(1), key};
  a.v = {fake_pointer(2), key};
  a.out = {fake_pointer(3), query};
  a.dout = {fake_pointer(4), query};
  a.lse = static_cast<const float*>(fake_pointer(5));
  a.dq = {fake_pointer(6), query};
  a.dk = {fake_pointer(7), key};
  a.dv = {fake_pointer(8), key};
  return a;
}

struct Mismatch {
  std::string field;
  std::function<void(BackwardArgs&)> bend;
  std::string message;
};

std::vector<Mismatch> mismatches() {
  const std::string tail = " (make a plan for this call)";
  return {
      {"batch", [](BackwardArgs& a) { a.shape.batch = 3; }, "shape.batch is 3, but the plan was made for 2" + tail},
      {"seqlen_q", [](BackwardArgs& a) { a.shape.seqlen_q = 512; },
       "shape.seqlen_q is 512, but the plan was made for 256" + tail},
      {"seqlen_k", [](BackwardArgs& a) { a.shape.seqlen_k = 256; },
       "shape.seqlen_k is 256, but the plan was made for 384" + tail},
      {"heads_q", [](BackwardArgs& a) { a.shape.heads_q = 4; },
       "shape.heads_q is 4, but the plan was made for 8" + tail},
      {"heads_kv", [](BackwardArgs& a) { a.shape.heads_kv = 8; },
       "shape.heads_kv is 8, but the plan was made for 2" + tail},
      {"head_dim", [](BackwardArgs& a) { a.shape.head_dim = 64; },
       "shape.head_dim is 64, but the plan was made for 128" + tail},
      {"dtype", [](BackwardArgs& a) { a.shape.dtype = DType::kFP16; },
       "shape.dtype is fp16, but the plan was made for bf16" + tail},
      // Scales one float apart still differ in print.
      {"softmax_scale", [](BackwardArgs& a) { a.shape.softmax_scale = std::nextafter(a.shape.softmax_scale, 1.0f); },
       "shape.softmax_scale is 0.0883883536, but the plan was made for 0.0883883461" + tail},
      {"causal", [](BackwardArgs& a) { a.shape.causal = false; },
       "shape.causal is false, but the plan was made for true" + tail},
      {"window_left", [](BackwardArgs& a) { a.shape.window_left = 64; },
       "shape.window_left is 64, but the plan was made for -1" + tail},
      {"window_right", [](BackwardArgs& a) { a.shape.window_right = 0; },
       "shape.window_right is 0, but the plan was made for -1" + tail},
      {"softcap", [](BackwardArgs& a) { a.shape.softcap = 30.0f; },
       "shape.softcap is 30, but the plan was made for 0" + tail},
      {"schedule", [](BackwardArgs& a) { a.schedule = Schedule::kAuto; },
       "schedule is 'auto', but the plan was made for 'descending'" + tail},
      {"sm_margin", [](BackwardArgs& a) { a.sm_margin = 8; }, "sm_margin is 8, but the plan was made for 0" + tail},
  };
}

TEST(BackwardWithPlan, NamesTheFieldTheCallAndThePlanDisagreeOnBeforeAnythingElse) {
  const BackwardPlan plan = plan_or_fail(causal_shape(), Schedule::kDescending);
  for (const Mismatch& m : mismatches()) {
    SCOPED_TRACE(m.field);
    BackwardArgs args = matching_args(plan);
    m.bend(args);
    args.q.data = nullptr;  // the plan is checked before the arguments
    const Status status = backward(args, plan, nullptr, 0, nullptr);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), m.message);
  }
}

// The window reaches the planner: the plan's problem holds it in canonical form (the planner's own
// make_tiled_problem with the window), every schedule the planner accepts is planned and proven, the others are
// refused with the planner's reason, and a window that adds nothing plans as its mask.
TEST(PlanBackward, PlansTheShapesSlidingWindow) {
  for (const bool causal : {false, true}) {
    AttentionShape shape = testing::valid_workspace_shape();
    shape.causal = causal;
    shape.window_left = 100;
    shape.window_right = causal ? 7 : 30;  // causal makes it 0
    const TiledProblem problem = make_tiled_problem(shape, SlidingWindow{100, causal ? 0 : 30});
    EXPECT_TRUE(problem.windowed());
    EXPECT_EQ(problem.window.left, 100);
    EXPECT_EQ(problem.window.right, causal ? kNoWindowBound : 30);
    EXPECT_EQ(problem.causal, causal);
    for (Schedule schedule : kAllSchedules) {
      SCOPED_TRACE(std::string(schedule_name(schedule)) + (causal ? " causal" : " full"));
      const PlanResult expected = plan_schedule(problem, schedule, h200().multiprocessor_count);
      BackwardPlan plan;
      const Status status = plan_backward(shape, schedule, h200(), &plan);
      if (!expected.ok()) {
        EXPECT_EQ(status.code(), StatusCode::kScheduleRejected) << status.to_string();
        EXPECT_NE(status.message().find(expected.rejected), std::string::npos) << status.message();
        continue;
      }
      if (expected.plan.kind == Schedule::kSymmetricShift) {
        // Planned and proven on the CPU, but the kernels are built without the band fold.
        EXPECT_EQ(status.code(), StatusCode::kScheduleRejected) << status.to_string();
        EXPECT_NE(status.message().find("not built into the kernels"), std::string::npos) << status.message();
        continue;
      }
      ASSERT_TRUE(status.ok()) << status.to_string();
      const SchedulePlan& planned = BackwardPlanAccess::data(plan)->schedule_plan;
      EXPECT_EQ(planned.kind, expected.plan.kind);
      EXPECT_EQ(planned.problem.window.left, 100);
      EXPECT_EQ(planned.problem.window.right, problem.window.right);
      EXPECT_EQ(planned.num_units, expected.plan.num_units);
    }
  }
  // Shift needs the full mask: a window is refused with the planner's reason.
  AttentionShape windowed = full_shape();
  windowed.window_left = 64;
  BackwardPlan plan;
  const Status shift = plan_backward(windowed, Schedule::kShift, h200(), &plan);
  EXPECT_EQ(shift.code(), StatusCode::kScheduleRejected);
  EXPECT_NE(shift.message().find("shift needs the full mask"), std::string::npos) << shift.message();
  // Bounds no row reaches past, and right = 0 without causal: the full and causal masks' plans.
  AttentionShape wide = full_shape();
  wide.window_left = wide.seqlen_k;
  wide.window_right = int64_t{1} << 40;
  EXPECT_FALSE(make_tiled_problem(wide).windowed());
  EXPECT_FALSE(make_tiled_problem(wide).causal);
  AttentionShape right_zero = full_shape();
  right_zero.window_right = 0;
  EXPECT_TRUE(make_tiled_problem(right_zero).causal);
  EXPECT_FALSE(make_tiled_problem(right_zero).windowed());
}

TEST(PlanBackward, PlansSoftcapLikeItsShapeWithoutOne) {
  AttentionShape capped = causal_shape();
  capped.softcap = 30.0f;
  for (Schedule schedule : {Schedule::kAuto, Schedule::kDescending, Schedule::kShortestFirst}) {
    const BackwardPlan with = plan_or_fail(capped, schedule);
    const BackwardPlan without = plan_or_fail(causal_shape(), schedule);
    EXPECT_EQ(with.schedule(), without.schedule());
    EXPECT_EQ(with.workspace_bytes(), without.workspace_bytes());
    EXPECT_EQ(with.shape().softcap, 30.0f);
  }
}

TEST(BackwardWithPlan, NamesTheSmMarginOfAPlanMadeWithOne) {
  BackwardPlan plan;
  ASSERT_TRUE(plan_backward(causal_shape(), Schedule::kDescending, 8, h200(), &plan).ok());
  BackwardArgs args = matching_args(plan);
  EXPECT_EQ(args.sm_margin, 0);
  const Status status = backward(args, plan, nullptr, 0, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "sm_margin is 0, but the plan was made for 8 (make a plan for this call)");
  args.sm_margin = 8;
  EXPECT_EQ(backward(args, plan, nullptr, 0, nullptr).message().find("but the plan was made for"), std::string::npos);
}

TEST(BackwardWithPlan, RefusesAnEmptyPlan) {
  const BackwardPlan plan = plan_or_fail(causal_shape(), Schedule::kDescending);
  const Status status = backward(matching_args(plan), BackwardPlan(), nullptr, 0, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "plan is empty (make it with plan_backward())");
}

TEST(BackwardWithPlan, ValidatesTheArgumentsOfAMatchingCall) {
  const BackwardPlan plan = plan_or_fail(causal_shape(), Schedule::kDescending);
  BackwardArgs args = matching_args(plan);
  args.dk.data = nullptr;
  const Status status = backward(args, plan, nullptr, 0, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "dk must not be null");
}

// Past the plan and validate(), a call meets the kernel lookup, then the device, then the pointers (the fake
// ones are host memory CUDA does not know) - whichever this machine stops at first.
TEST(BackwardWithPlan, AMatchingCallGetsPastThePlanChecks) {
  const BackwardPlan plan = plan_or_fail(causal_shape(), Schedule::kDescending);
  const Status status = backward(matching_args(plan), plan, nullptr, 0, nullptr);
  if (!kernel_available(plan.shape().head_dim, plan.shape().dtype)) {
    EXPECT_EQ(status.code(), StatusCode::kNotAvailable) << status.to_string();
  } else if (const Status device = check_current_device(); !device.ok()) {
    EXPECT_EQ(status.to_string(), device.to_string());
  } else {
    // A hand-made H200 plan on another device is refused first; on an H200 the pointers are.
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_EQ(status.message().find("but the plan was made for"), std::string::npos) << status.message();
  }
}

}  // namespace
}  // namespace dash
