// GPU tests of sm_margin (SMs left to other work, as FlashAttention-3's option) through the public API.
//  - Every deterministic schedule planned with a margin gives the same bits in every run, with a forward competing
//    for the SMs on another stream every other run, and matches the float64 reference; the dynamic schedules'
//    bits are those of margin 0 (their orders do not depend on the CTA count), and so are the forward's.
//  - Co-residency: while an SmOccupier holds `margin` SMs on another stream (a stand-in for communication
//    kernels), every schedule planned with that margin finishes, with the occupier still holding its SMs, with
//    the bits it gives on an idle GPU; and so does the forward. A backward planned without a margin is also run
//    under the occupier: a static schedule may then stall until the SMs are released (its CTAs cannot all be
//    resident), which the test reports without failing, but it must finish once they are, with its usual bits.
// Without a Hopper GPU (or without compiled kernels) every test skips and says why; a hang ends the binary.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "harness/device_harness.hpp"
#include "sm90_test_support.hpp"
#include "sm_occupier.hpp"

namespace dash {
namespace {

using gpu_testing::download_gradients;
using gpu_testing::Instance;
using gpu_testing::kWatchdogSeconds;
using gpu_testing::skip_reason;
using gpu_testing::wait_or_die;
using harness::DeviceBuffer;
using harness::Problem;

constexpr int kRuns = 20;
// The occupier's CTAs leave on their own after this, whatever happens to the test.
constexpr double kHoldSeconds = 120.0;
constexpr double kStartSeconds = 10.0;
// How long a backward planned with the occupier's margin may take while the SMs are held: far more than the
// milliseconds it needs, far less than the hold.
constexpr double kHeldRunSeconds = 30.0;
// How long a backward planned without a margin is given before the SMs are released.
constexpr double kStallSeconds = 5.0;

struct ShapeCase {
  int64_t batch, seqlen, heads_q, heads_kv;
  bool causal;
};

AttentionShape make_shape(const ShapeCase& c, const Instance& inst) {
  return gpu_testing::make_attention_shape(c.batch, c.seqlen, c.seqlen, c.heads_q, c.heads_kv, c.causal, inst);
}

std::string shape_name(const ShapeCase& c) {
  std::ostringstream name;
  name << "B" << c.batch << "_S" << c.seqlen << "_Hq" << c.heads_q << "_Hkv" << c.heads_kv
       << (c.causal ? "_causal" : "_full");
  return name.str();
}

// Full and causal MHA with several key/value tiles per dQ tile (so the orders matter), and ragged causal GQA.
const ShapeCase kShapes[] = {{2, 768, 4, 4, false}, {2, 768, 4, 4, true}, {1, 1000, 8, 2, true}};
const Instance kInstances[] = {{64, DType::kBF16}, {128, DType::kFP16}};

int device_sms() {
  DeviceInfo device;
  const Status s = current_device_info(&device);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return device.multiprocessor_count;
}

bool is_static(Schedule schedule) { return schedule == Schedule::kShift || schedule == Schedule::kSymmetricShift; }

std::vector<uint16_t> output_bits(const Problem& p) {
  std::vector<uint16_t> bits(p.q_elements());
  p.d_out.download(bits.data(), bits.size() * 2);
  return bits;
}

// NaN in every byte, enqueued on `stream` so that a kernel on that stream is ordered after it (DeviceBuffer::poison
// uses the legacy default stream, which a non-blocking stream does not wait for).
void poison(const DeviceBuffer& buffer, cudaStream_t stream) {
  harness::check_cuda(cudaMemsetAsync(buffer.get(), 0xFF, buffer.bytes(), stream), "cudaMemsetAsync");
}

void poison_gradients(Problem& p, cudaStream_t stream) {
  for (const DeviceBuffer* buffer : {&p.d_dq, &p.d_dk, &p.d_dv}) poison(*buffer, stream);
}

void expect_matches_reference(const Problem& p, const std::string& what) {
  const auto tol = harness::tolerance_for(p.shape.dtype);
  const auto dq = harness::compare(p.d_dq, p.dq, p.shape.dtype);
  const auto dk = harness::compare(p.d_dk, p.dk, p.shape.dtype);
  const auto dv = harness::compare(p.d_dv, p.dv, p.shape.dtype);
  EXPECT_TRUE(harness::within(dq, tol)) << what << " dQ: " << dq.describe();
  EXPECT_TRUE(harness::within(dk, tol)) << what << " dK: " << dk.describe();
  EXPECT_TRUE(harness::within(dv, tol)) << what << " dV: " << dv.describe();
}

// The plan of `schedule` with `margin` on the current device; empty when the schedule rejects the shape.
BackwardPlan plan_or_skip(const AttentionShape& shape, Schedule schedule, int margin) {
  BackwardPlan plan;
  const Status s = plan_backward(shape, schedule, margin, &plan);
  if (s.code() == StatusCode::kScheduleRejected && schedule != Schedule::kAuto) return BackwardPlan();
  EXPECT_TRUE(s.ok()) << schedule_name(schedule) << ", margin " << margin << ": " << s.to_string();
  EXPECT_EQ(plan.planned_sm_count(), plan.multiprocessor_count() - margin);
  return plan;
}

BackwardArgs args_for(Problem& p, const BackwardPlan& plan) {
  BackwardArgs args = harness::backward_args(p, plan.requested_schedule());
  args.sm_margin = plan.sm_margin();
  return args;
}

// Enqueues the planned backward on `stream` into poisoned gradients (the workspace must hold the plan's bytes).
void launch(Problem& p, const BackwardPlan& plan, cudaStream_t stream) {
  poison_gradients(p, stream);
  const Status s = backward(args_for(p, plan), plan, p.workspace.get(), p.workspace.bytes(), stream);
  ASSERT_TRUE(s.ok()) << s.to_string();
}

void ensure_workspace(Problem& p, size_t bytes) {
  if (p.workspace.bytes() < bytes) p.workspace = DeviceBuffer(bytes);
}

// --- deterministic schedules with a margin -----------------------------------------------------------------

class SmMarginGpu : public ::testing::TestWithParam<std::tuple<Instance, ShapeCase>> {};

// A margin of one SM, a third of them, and all but eight.
std::vector<int> margins(int sms) { return {1, sms / 3, sms - 8}; }

TEST_P(SmMarginGpu, EveryDeterministicScheduleIsBitwiseIdenticalAndCorrect) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  const int sms = device_sms();
  Problem p = harness::make_problem(make_shape(c, inst), /*seed=*/0x5a4au + c.seqlen + inst.head_dim);
  // A forward of another problem competes for the SMs every other run, so CTAs start at different times.
  AttentionShape load_shape = p.shape;
  load_shape.batch = 4;
  load_shape.seqlen_q = load_shape.seqlen_k = 4096;
  Problem load = harness::make_problem(load_shape, /*seed=*/78, /*with_reference=*/false);
  size_t load_bytes = 0;
  ASSERT_TRUE(forward_workspace_size(load.shape, &load_bytes).ok());
  load.workspace = DeviceBuffer(load_bytes);
  cudaStream_t side = nullptr;
  harness::check_cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");

  std::vector<int> all_margins = margins(sms);
  all_margins.insert(all_margins.begin(), 0);
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kNondeterministic) continue;
    std::vector<uint16_t> margin_zero_bits;
    for (const int margin : all_margins) {
      const std::string what = std::string(schedule_name(schedule)) + ", sm_margin " + std::to_string(margin);
      SCOPED_TRACE(what);
      const BackwardPlan plan = plan_or_skip(p.shape, schedule, margin);
      if (plan.empty()) continue;
      ensure_workspace(p, plan.workspace_bytes());
      std::vector<uint16_t> first;
      int differing = 0;
      for (int run = 0; run < kRuns; ++run) {
        if (run % 2 == 1) {
          ForwardArgs load_args = harness::forward_args(load);
          load_args.sm_margin = margin;
          ASSERT_TRUE(forward(load_args, load.workspace.get(), load.workspace.bytes(), side).ok());
        }
        launch(p, plan, nullptr);
        wait_or_die(nullptr, what);
        wait_or_die(side, "the competing forward");
        std::vector<uint16_t> bits = download_gradients(p);
        if (run == 0) {
          expect_matches_reference(p, what);
          first = std::move(bits);
        } else if (bits != first) {
          ++differing;
        }
      }
      EXPECT_EQ(differing, 0) << differing << " of " << kRuns - 1 << " runs differed from the first";
      if (margin == 0) {
        margin_zero_bits = first;
      } else if (!is_static(plan.schedule()) && !margin_zero_bits.empty()) {
        EXPECT_TRUE(first == margin_zero_bits) << "a dynamic schedule's bits changed with the margin";
      }
    }
  }
  cudaStreamDestroy(side);
}

// The forward's tiles are computed whole by one CTA, whichever: its bits do not depend on the margin.
TEST_P(SmMarginGpu, ForwardGivesTheBitsOfMarginZero) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  const int sms = device_sms();
  Problem p = harness::make_problem(make_shape(c, inst), /*seed=*/0xf0a4u + c.seqlen, /*with_reference=*/false);
  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(p.shape, &bytes).ok());
  p.workspace = DeviceBuffer(bytes);
  std::vector<uint16_t> expected;
  for (const int margin : {0, 1, sms / 3, sms - 1}) {
    SCOPED_TRACE("sm_margin " + std::to_string(margin));
    poison(p.d_out, nullptr);
    ForwardArgs args = harness::forward_args(p);
    args.sm_margin = margin;
    ASSERT_TRUE(forward(args, p.workspace.get(), bytes, nullptr).ok());
    wait_or_die(nullptr, "forward");
    if (margin == 0) {
      expected = output_bits(p);
    } else {
      EXPECT_TRUE(output_bits(p) == expected);
    }
  }
  ForwardArgs too_many = harness::forward_args(p);
  too_many.sm_margin = sms;
  const Status refused = forward(too_many, p.workspace.get(), bytes, nullptr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("sm_margin must satisfy 0 <= sm_margin < the device's SM count (" +
                                   std::to_string(sms) + " on device"),
            std::string::npos)
      << refused.message();
}

std::string margin_test_name(const ::testing::TestParamInfo<std::tuple<Instance, ShapeCase>>& info) {
  const auto& [inst, c] = info.param;
  return "hdim" + std::to_string(inst.head_dim) + "_" + dtype_name(inst.dtype) + "_" + shape_name(c);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SmMarginGpu,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::ValuesIn(kShapes)),
                         margin_test_name);

// --- co-residency: other work holds SMs --------------------------------------------------------------------

std::string occupier_skip_reason(const Instance& inst) {
  if (std::string why = skip_reason(inst); !why.empty()) return why;
  return testing::SmOccupier::unavailable_reason();
}

class SmMarginCoResidency : public ::testing::TestWithParam<std::tuple<Instance, ShapeCase>> {};

// Every schedule planned with the occupier's margin finishes while the occupier still holds its SMs, with the bits
// of the same plan on an idle GPU (for the deterministic ones) and the reference's values.
TEST_P(SmMarginCoResidency, EveryScheduleWithTheMarginFinishesWhileTheSmsAreHeld) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = occupier_skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  const int sms = device_sms();
  const int margin = sms / 4;
  Problem p = harness::make_problem(make_shape(c, inst), /*seed=*/0xc0e5u + c.seqlen + inst.head_dim);
  cudaStream_t stream = nullptr;
  harness::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  // Plans, workspace and the idle GPU's bits first: nothing is allocated or freed while SMs are held.
  std::vector<BackwardPlan> plans;
  std::vector<std::vector<uint16_t>> idle_bits;
  for (Schedule schedule : kAllSchedules) {
    BackwardPlan plan = plan_or_skip(p.shape, schedule, margin);
    if (plan.empty()) continue;
    ensure_workspace(p, plan.workspace_bytes());
    plans.push_back(plan);
  }
  size_t forward_bytes = 0;
  ASSERT_TRUE(forward_workspace_size(p.shape, &forward_bytes).ok());
  ensure_workspace(p, forward_bytes);
  for (const BackwardPlan& plan : plans) {
    launch(p, plan, stream);
    wait_or_die(stream, std::string(schedule_name(plan.requested_schedule())) + " on an idle GPU");
    idle_bits.push_back(download_gradients(p));
  }
  ForwardArgs forward_args = harness::forward_args(p);
  forward_args.sm_margin = margin;
  ASSERT_TRUE(forward(forward_args, p.workspace.get(), p.workspace.bytes(), stream).ok());
  wait_or_die(stream, "forward on an idle GPU");
  const std::vector<uint16_t> idle_out = output_bits(p);

  testing::SmOccupier occupier;
  if (const std::string why = occupier.start(margin, kHoldSeconds, kStartSeconds); !why.empty()) {
    GTEST_SKIP() << "cannot hold " << margin << " SMs: " << why;
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    const BackwardPlan& plan = plans[i];
    const std::string what = std::string(schedule_name(plan.requested_schedule())) + " (" +
                             std::string(schedule_name(plan.schedule())) + ") with sm_margin " +
                             std::to_string(margin) + " while " + std::to_string(margin) + " SMs are held";
    SCOPED_TRACE(what);
    launch(p, plan, stream);
    const bool finished = harness::synchronize_with_watchdog(stream, kHeldRunSeconds);
    const bool still_held = occupier.holding();
    if (!finished) {
      const bool released = occupier.release();
      wait_or_die(stream, what + ", after the SMs were released");
      ADD_FAILURE() << what << " did not finish within " << kHeldRunSeconds << " s; it finished after the release"
                    << (released ? "" : " (the occupier did not leave when released)");
      return;
    }
    EXPECT_TRUE(still_held) << "the occupier stopped holding its SMs before the backward finished: the test "
                               "proves nothing (raise kHoldSeconds?)";
    if (plan.schedule() != Schedule::kNondeterministic) {
      EXPECT_TRUE(download_gradients(p) == idle_bits[i]) << "bits differ from the same plan on an idle GPU";
    }
    expect_matches_reference(p, what);
  }
  poison(p.d_out, stream);
  ASSERT_TRUE(forward(forward_args, p.workspace.get(), p.workspace.bytes(), stream).ok());
  EXPECT_TRUE(harness::synchronize_with_watchdog(stream, kHeldRunSeconds)) << "forward with the margin while held";
  EXPECT_TRUE(occupier.holding());
  EXPECT_TRUE(output_bits(p) == idle_out);
  EXPECT_TRUE(occupier.release());
  wait_or_die(stream, "the last forward");
  cudaStreamDestroy(stream);
}

// Without a margin, a static schedule's grid takes every SM: with some held, not all its CTAs can be resident.
// Whether it then stalls depends on which CTAs wait for which, so this only reports it; what must hold is that it
// finishes once the SMs are free, with the bits of the same plan on an idle GPU.
TEST_P(SmMarginCoResidency, WithoutAMarginStaticSchedulesFinishOnceTheSmsAreReleased) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = occupier_skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  const int sms = device_sms();
  const int held = sms / 4;
  Problem p = harness::make_problem(make_shape(c, inst), /*seed=*/0x57a1u + c.seqlen, /*with_reference=*/false);
  harness::use_forward_outputs_for_backward(p);
  size_t forward_bytes = 0;
  ASSERT_TRUE(forward_workspace_size(p.shape, &forward_bytes).ok());
  ensure_workspace(p, forward_bytes);
  ASSERT_TRUE(forward(harness::forward_args(p), p.workspace.get(), p.workspace.bytes(), nullptr).ok());
  wait_or_die(nullptr, "forward");
  cudaStream_t stream = nullptr;
  harness::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  int ran = 0;
  for (Schedule schedule : {Schedule::kShift, Schedule::kSymmetricShift}) {
    const BackwardPlan plan = plan_or_skip(p.shape, schedule, 0);
    if (plan.empty()) continue;
    ++ran;
    SCOPED_TRACE(std::string(schedule_name(schedule)));
    ensure_workspace(p, plan.workspace_bytes());
    launch(p, plan, stream);
    wait_or_die(stream, "on an idle GPU");
    const std::vector<uint16_t> idle = download_gradients(p);

    testing::SmOccupier occupier;
    if (const std::string why = occupier.start(held, kHoldSeconds, kStartSeconds); !why.empty()) {
      GTEST_SKIP() << "cannot hold " << held << " SMs: " << why;
    }
    const auto begin = std::chrono::steady_clock::now();
    launch(p, plan, stream);
    const bool finished_while_held = harness::synchronize_with_watchdog(stream, kStallSeconds);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    ASSERT_TRUE(occupier.release());
    wait_or_die(stream, "after the SMs were released");
    std::printf("[ info     ] %s planned for %d SMs with %d held: %s\n", std::string(schedule_name(schedule)).c_str(),
                plan.planned_sm_count(), held,
                finished_while_held ? ("finished while held, in " + std::to_string(seconds) + " s").c_str()
                                    : "stalled until the SMs were released");
    RecordProperty(std::string(schedule_name(schedule)) + "_finished_while_held", finished_while_held ? 1 : 0);
    EXPECT_TRUE(download_gradients(p) == idle);
  }
  cudaStreamDestroy(stream);
  if (ran == 0) GTEST_SKIP() << "neither static schedule applies to " << shape_name(c);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SmMarginCoResidency,
                         ::testing::Combine(::testing::Values(Instance{128, DType::kBF16}),
                                            ::testing::ValuesIn(kShapes)),
                         margin_test_name);

}  // namespace
}  // namespace dash
