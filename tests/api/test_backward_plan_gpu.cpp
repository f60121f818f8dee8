// GPU tests of BackwardPlan through the public API: a plan launched many times gives bitwise the gradients of
// the entry point that plans at every call, for every schedule that applies; a plan made for another SM count
// or device is refused before anything runs; the workspace a plan names is the one it checks. Without a
// Hopper GPU (or without the compiled kernel) every test skips and says why.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "harness/device_harness.hpp"
#include "sm90_test_support.hpp"

namespace dash {
namespace {

using harness::DeviceBuffer;
using harness::Problem;

using gpu_testing::kWatchdogSeconds;
constexpr int kPlannedRuns = 3;

constexpr gpu_testing::Instance kInstance{128, DType::kBF16};

AttentionShape test_shape(bool causal) {
  return gpu_testing::make_attention_shape(2, 640, 640, 6, 3, causal, kInstance);
}

std::string skip_reason() { return gpu_testing::skip_reason(kInstance); }

// dQ, dK and dV of the last backward, as raw bytes.
std::vector<uint8_t> gradient_bytes(const Problem& p) {
  std::vector<uint8_t> bytes;
  for (const DeviceBuffer* buffer : {&p.d_dq, &p.d_dk, &p.d_dv}) {
    std::vector<uint8_t> part(buffer->bytes());
    buffer->download(part.data(), part.size());
    bytes.insert(bytes.end(), part.begin(), part.end());
  }
  return bytes;
}

void finish(const std::string& what) {
  ASSERT_TRUE(harness::synchronize_with_watchdog(nullptr, kWatchdogSeconds)) << what << " hung";
}

// Random inputs whose backward reads the GPU forward's O and LSE (no CPU reference: only bits are compared).
Problem forward_problem(bool causal, uint64_t seed) {
  Problem p = harness::make_problem(test_shape(causal), seed, /*with_reference=*/false);
  size_t bytes = 0;
  EXPECT_TRUE(forward_workspace_size(p.shape, &bytes).ok());
  p.workspace = DeviceBuffer(bytes);
  const Status status = forward(harness::forward_args(p), p.workspace.get(), bytes, nullptr);
  EXPECT_TRUE(status.ok()) << status.to_string();
  finish("forward");
  harness::use_forward_outputs_for_backward(p);
  return p;
}

TEST(BackwardPlanGpu, GivesTheBitsOfTheEntryPointThatPlansEveryCall) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const bool causal : {false, true}) {
    Problem p = forward_problem(causal, /*seed=*/0x91a4u + causal);
    for (Schedule schedule : kAllSchedules) {
      if (schedule == Schedule::kNondeterministic) continue;
      SCOPED_TRACE(std::string(schedule_name(schedule)) + (causal ? " causal" : " full"));
      BackwardPlan plan;
      const Status planned = plan_backward(p.shape, schedule, &plan);
      if (planned.code() == StatusCode::kScheduleRejected) continue;
      ASSERT_TRUE(planned.ok()) << planned.to_string();
      DeviceBuffer workspace(plan.workspace_bytes());
      const BackwardArgs args = harness::backward_args(p, schedule);
      ASSERT_TRUE(backward(args, workspace.get(), workspace.bytes(), nullptr).ok());
      finish("backward without a plan");
      const std::vector<uint8_t> expected = gradient_bytes(p);
      for (int run = 0; run < kPlannedRuns; ++run) {
        p.d_dq.poison();
        p.d_dk.poison();
        p.d_dv.poison();
        const Status status = backward(args, plan, workspace.get(), workspace.bytes(), nullptr);
        ASSERT_TRUE(status.ok()) << status.to_string();
        finish("backward with a plan");
        EXPECT_TRUE(gradient_bytes(p) == expected) << "run " << run;
      }
    }
  }
}

TEST(BackwardPlanGpu, RefusesAPlanMadeForAnotherDevice) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  Problem p = forward_problem(true, /*seed=*/7);
  DeviceInfo current;
  ASSERT_TRUE(current_device_info(&current).ok());
  const std::string made_for = "plan: it was made for device ";
  const std::string running_on = "but the current device is " + std::to_string(current.index) + " with " +
                                 std::to_string(current.multiprocessor_count) + " SMs";
  DeviceInfo fewer_sms = current;
  fewer_sms.multiprocessor_count -= 1;
  DeviceInfo other_index = current;
  other_index.index += 1;
  for (const DeviceInfo& device : {fewer_sms, other_index}) {
    BackwardPlan plan;
    ASSERT_TRUE(plan_backward(p.shape, Schedule::kAuto, device, &plan).ok());
    DeviceBuffer workspace(plan.workspace_bytes());
    const Status status =
        backward(harness::backward_args(p, Schedule::kAuto), plan, workspace.get(), workspace.bytes(), nullptr);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), made_for + std::to_string(device.index) + " with " +
                                    std::to_string(device.multiprocessor_count) + " SMs, " + running_on +
                                    " (make the plan on the device that runs it)");
  }
}

TEST(BackwardPlanGpu, ChecksTheWorkspaceItNames) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  Problem p = forward_problem(true, /*seed=*/8);
  BackwardPlan plan;
  ASSERT_TRUE(plan_backward(p.shape, Schedule::kAuto, &plan).ok());
  size_t queried = 0;
  ASSERT_TRUE(backward_workspace_size(p.shape, Schedule::kAuto, &queried).ok());
  EXPECT_EQ(queried, plan.workspace_bytes());
  DeviceBuffer workspace(plan.workspace_bytes());
  const BackwardArgs args = harness::backward_args(p, Schedule::kAuto);
  EXPECT_EQ(backward(args, plan, workspace.get(), plan.workspace_bytes() - 1, nullptr).code(),
            StatusCode::kWorkspaceTooSmall);
  EXPECT_TRUE(backward(args, plan, workspace.get(), plan.workspace_bytes(), nullptr).ok());
  finish("backward with a plan");
}

}  // namespace
}  // namespace dash
