// GPU tests of the bounded ordering wait (wait_semaphore, src/kernels/sm90/primitives.cuh, and its report,
// src/api/wait_timeouts.hpp):
//  - the wait alone: one whose semaphore holds the awaited rank passes in order (the negative control, first); one
//    that can never end gives up within its bound, and the launch ends cleanly; one whose launch was abandoned by
//    another wait gives up at once, long bound or not.
//  - through the API: a static schedule planned for every SM, run while other work holds all but a few of them,
//    cannot have its CTAs resident together and would wait forever; with a short bound its launch ends while the
//    SMs are still held, with every element of dq, dk and dv NaN (the gradients started finite), the next call on
//    the device, a forward, returns kWaitTimeout naming the wait and runs nothing, and the backward after that
//    runs, with the bits of an idle GPU. A plan with the held SMs as its margin, under the same load, reports nothing
//    and poisons nothing (the control).
// The bound is read once per process (DASH_WAIT_TIMEOUT_SECONDS), so the API test runs in a child process:
// WaitTimeout runs this binary again with only WaitTimeoutChild selected and the variable set, under `timeout`, and
// reads what it printed. WaitTimeoutChild skips when run any other way. All skip, saying why, without a Hopper GPU,
// without the kernels or without the probe and occupier.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "dash/attention.hpp"
#include "harness/device_harness.hpp"
#include "sm90_test_support.hpp"
#include "sm_occupier.hpp"
#include "wait_probe.hpp"

namespace dash {
namespace {

using gpu_testing::download_gradients;
using gpu_testing::Instance;
using gpu_testing::wait_or_die;
using harness::DeviceBuffer;
using harness::Problem;

constexpr long long kShortBoundNs = 2'000'000;       // 2 ms: the stuck wait's bound
constexpr long long kLongBoundNs = 5'000'000'000LL;  // 5 s: longer than any of these waits may take
constexpr double kEndsWithinSeconds = 2.0;           // a wait that gives up ends the launch this soon

constexpr const char* kChildVariable = "DASH_WAIT_TIMEOUT_CHILD";
constexpr const char* kChildBound = "0.2";  // seconds: DASH_WAIT_TIMEOUT_SECONDS in the child
constexpr int kChildTimeoutSeconds = 300;   // `timeout` ends a child that hangs anyway
constexpr int kResidentSms = 8;             // SMs the occupier leaves to the backward
constexpr double kHoldSeconds = 120.0;
constexpr double kStartSeconds = 10.0;
constexpr double kHeldRunSeconds = 30.0;  // the abandoned launch must end this soon while the SMs are held
// One head of 32 key/value tiles at d = 128: under shift every CTA but the first few needs contributions from CTAs
// past the resident ones before its own, so with kResidentSms SMs the launch cannot finish in order.
constexpr Instance kInstance{128, DType::kBF16};

std::string probe_skip_reason() {
  if (const std::string why = testing::wait_probe_unavailable_reason(); !why.empty()) return why;
  if (Status s = check_current_device(); !s.ok()) return "no Hopper GPU: " + s.message();
  return {};
}

TEST(WaitBound, ARankedWaitPassesAStuckOneGivesUpWithinItsBoundAndAnAbandonedOneAtOnce) {
  if (const std::string why = probe_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const testing::WaitOutcome ranked = testing::semaphore_wait_outcome(/*value=*/3, /*expected=*/3, 0, kLongBoundNs);
  EXPECT_EQ(ranked.error, "cudaSuccess");
  EXPECT_TRUE(ranked.in_order);

  const testing::WaitOutcome stuck = testing::semaphore_wait_outcome(/*value=*/0, /*expected=*/1, 0, kShortBoundNs);
  EXPECT_EQ(stuck.error, "cudaSuccess") << "giving up must end the launch cleanly, not trap";
  EXPECT_FALSE(stuck.in_order);
  EXPECT_LT(stuck.seconds, kEndsWithinSeconds);

  const testing::WaitOutcome abandoned = testing::semaphore_wait_outcome(0, 1, /*abandoned=*/1, kLongBoundNs);
  EXPECT_EQ(abandoned.error, "cudaSuccess");
  EXPECT_FALSE(abandoned.in_order);
  EXPECT_LT(abandoned.seconds, kEndsWithinSeconds) << "a wait of an abandoned launch must not run to its bound";
}

std::string api_skip_reason() {
  if (std::string why = gpu_testing::skip_reason(kInstance); !why.empty()) return why;
  return testing::SmOccupier::unavailable_reason();
}

Status run_backward(Problem& p, const BackwardPlan& plan, cudaStream_t stream) {
  BackwardArgs args = harness::backward_args(p, plan.requested_schedule());
  args.sm_margin = plan.sm_margin();
  return backward(args, plan, p.workspace.get(), p.workspace.bytes(), stream);
}

TEST(WaitTimeoutChild, AStaticScheduleThatCannotBeResidentGivesUpAndTheNextCallSaysSo) {
  if (std::getenv(kChildVariable) == nullptr) {
    GTEST_SKIP() << "runs only as WaitTimeout's child process (the bound is read once per process)";
  }
  if (const std::string why = api_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  DeviceInfo device;
  ASSERT_TRUE(current_device_info(&device).ok());
  const int held = device.multiprocessor_count - kResidentSms;
  Problem p = harness::make_problem(gpu_testing::make_attention_shape(1, 4096, 4096, 1, 1, /*causal=*/false, kInstance),
                                    /*seed=*/0x71e0u,
                                    /*with_reference=*/false);
  BackwardPlan unmargined;
  BackwardPlan margined;
  ASSERT_TRUE(plan_backward(p.shape, Schedule::kShift, 0, &unmargined).ok());
  ASSERT_TRUE(plan_backward(p.shape, Schedule::kShift, held, &margined).ok());
  size_t forward_bytes = 0;
  ASSERT_TRUE(forward_workspace_size(p.shape, &forward_bytes).ok());
  p.workspace = DeviceBuffer(std::max({forward_bytes, unmargined.workspace_bytes(), margined.workspace_bytes()}));
  harness::use_forward_outputs_for_backward(p);
  ASSERT_TRUE(forward(harness::forward_args(p), p.workspace.get(), p.workspace.bytes(), nullptr).ok());
  wait_or_die(nullptr, "forward");
  cudaStream_t stream = nullptr;
  harness::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  // Each plan's bits on an idle GPU (the margin changes shift's CTA count, hence its order and bits).
  Status s = run_backward(p, margined, stream);
  ASSERT_TRUE(s.ok()) << s.to_string();
  wait_or_die(stream, "margined shift on an idle GPU");
  const std::vector<uint16_t> idle_margined = download_gradients(p);
  s = run_backward(p, unmargined, stream);
  ASSERT_TRUE(s.ok()) << s.to_string();
  wait_or_die(stream, "shift on an idle GPU");
  const std::vector<uint16_t> idle = download_gradients(p);

  testing::SmOccupier occupier;
  if (const std::string why = occupier.start(held, kHoldSeconds, kStartSeconds); !why.empty()) {
    GTEST_SKIP() << "cannot hold " << held << " SMs: " << why;
  }
  // The control first: planned with the held SMs as its margin, it finishes in order under the same load.
  s = run_backward(p, margined, stream);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(harness::synchronize_with_watchdog(stream, kHeldRunSeconds));
  EXPECT_TRUE(download_gradients(p) == idle_margined) << "the margined plan's bits under load (no NaN)";
  const auto begin = std::chrono::steady_clock::now();
  s = run_backward(p, unmargined, stream);
  ASSERT_TRUE(s.ok()) << "the control's launch left a timeout behind: " << s.to_string();
  const bool ended_while_held = harness::synchronize_with_watchdog(stream, kHeldRunSeconds);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  const bool still_held = occupier.holding();
  EXPECT_TRUE(occupier.release());
  wait_or_die(stream, "the unmargined shift after the SMs were released");
  EXPECT_TRUE(ended_while_held) << "the unmargined shift did not give up its order while the SMs were held";
  EXPECT_TRUE(still_held) << "the occupier left before the backward ended: the test proves nothing";
  std::printf("[ info     ] shift planned for %d SMs, %d of them held: ended in %.3f s\n",
              unmargined.planned_sm_count(), held, seconds);
  const std::vector<uint16_t> abandoned = download_gradients(p);
  size_t finite = 0;
  for (uint16_t bits : abandoned) finite += !std::isnan(harness::from_bits(bits, kInstance.dtype));
  EXPECT_EQ(finite, 0u) << "of " << abandoned.size() << " elements of the abandoned launch's dq, dk and dv, " << finite
                        << " are not NaN: a wrong gradient could reach the optimizer";

  // The next call on the device, whichever it is, reports the timeout and runs nothing.
  p.d_out.poison();
  s = forward(harness::forward_args(p), p.workspace.get(), p.workspace.bytes(), stream);
  EXPECT_EQ(s.code(), StatusCode::kWaitTimeout) << s.to_string();
  for (const char* words :
       {"gave up the fixed order", "dQ tile", "filled with NaN", "sm_margin", "DASH_WAIT_TIMEOUT_SECONDS"}) {
    EXPECT_NE(s.message().find(words), std::string::npos) << words << " missing from: " << s.message();
  }
  std::printf("[ info     ] the next call: %s\n", s.to_string().c_str());
  wait_or_die(stream, "the reporting forward");
  EXPECT_EQ(gpu_testing::count_unwritten_halves(p.d_out, p.q_elements(), kInstance.dtype), p.q_elements())
      << "the reporting forward ran";
  s = run_backward(p, unmargined, stream);
  ASSERT_TRUE(s.ok()) << "the timeout is reported once: " << s.to_string();
  wait_or_die(stream, "shift on an idle GPU again");
  EXPECT_TRUE(download_gradients(p) == idle) << "after the report, the idle GPU's bits";
  cudaStreamDestroy(stream);
}

TEST(WaitTimeout, AStaticScheduleThatCannotBeResidentEndsAndIsReportedNotAHang) {
  if (const std::string why = api_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  gpu_testing::expect_child_passes(std::string(kChildVariable) + "=1 DASH_WAIT_TIMEOUT_SECONDS=" + kChildBound,
                                   kChildTimeoutSeconds, "WaitTimeoutChild.*");
}

}  // namespace
}  // namespace dash
