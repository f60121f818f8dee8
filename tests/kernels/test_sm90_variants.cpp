// GPU tests of the sliding window and softcap (AttentionShape::window_left, window_right, softcap) on the sm90
// kernels, through the public API, in the patterns of test_sm90.cpp:
// - Sm90Variant: forward and the backward of every schedule the planner accepts (each deterministic one and the
//   nondeterministic one) against the float64 CPU reference (which takes the same window and softcap) on
//   window alone, window + causal, seqlen_q != seqlen_k both ways, GQA/MQA, ragged lengths, rows that see no
//   key (O = 0 and LSE = -inf exactly, no NaN), keys no row sees (dK = dV = 0), softcap alone, with causal and
//   with a window, and softcap on the forward's tall tiles (192x128, d = 64) and on a d = 128 shape that takes the
//   wide tiles without softcap (128x128 with it); every
//   output starts poisoned with NaN and must be written; the forward runs twice and must repeat its bits.
// - Sm90VariantDeterminism: every deterministic schedule's backward 100 times under a window and with softcap,
//   bit for bit, with a forward competing for the SMs every other run, and a negative control
//   (Sm90VariantDeterminismControl: the nondeterministic schedule under a wide window must differ at least once).
// Tolerances: harness::tolerance_for(shape), the dtype's (test_sm90.cpp's reasoning: a few roundings of the
// inputs, P, dS and the outputs), widened by two bf16 roundoffs with softcap for the kernels' tanh.approx.f32
// (relative error about 2^-11: a capped score c is off by up to |c| 2^-11, so P by that fraction; the softcap
// cases scale the scores up so that the cap bites, |c| up to softcap).
// Without a Hopper GPU (or without compiled kernels) every test skips and says why.
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "harness/device_harness.hpp"
#include "schedule/tile_config.hpp"
#include "sm90_test_support.hpp"

namespace dash {
namespace {

using gpu_testing::count_unwritten_halves;
using gpu_testing::download_gradients;
using gpu_testing::Instance;
using gpu_testing::kWatchdogSeconds;
using gpu_testing::run_forward;
using gpu_testing::skip_reason;
using gpu_testing::wait_or_die;
using harness::DeviceBuffer;
using harness::Problem;

constexpr int kDeterminismRuns = 100;

struct VariantCase {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  bool causal;
  int64_t window_left, window_right;
  float softcap;
  float scale_factor;  // softmax_scale = scale_factor / sqrt(head_dim): > 1 makes the softcap bite
};

std::string case_name(const VariantCase& c) {
  std::ostringstream name;
  name << "B" << c.batch << "_Sq" << c.seqlen_q << "_Sk" << c.seqlen_k << "_Hq" << c.heads_q << "_Hkv" << c.heads_kv
       << (c.causal ? "_causal" : "_full");
  const auto bound = [](int64_t b) { return b < 0 ? std::string("open") : std::to_string(b); };
  if (c.window_left >= 0 || c.window_right >= 0) name << "_win" << bound(c.window_left) << "_" << bound(c.window_right);
  if (c.softcap > 0.0f) name << "_softcap" << static_cast<int>(c.softcap);
  return name.str();
}

// Each case breaks the band in another place; see the file comment.
const VariantCase kCases[] = {
    // window alone, both sides, and each side alone
    {2, 512, 512, 4, 4, false, 100, 50, 0.0f, 1.0f},
    {1, 700, 700, 2, 2, false, 128, -1, 0.0f, 1.0f},
    {1, 300, 300, 2, 1, false, -1, 64, 0.0f, 1.0f},
    // window + causal (causal makes the right bound 0 whatever it is), GQA, ragged
    {2, 640, 640, 4, 2, true, 255, -1, 0.0f, 1.0f},
    {3, 1000, 1000, 8, 2, true, 300, 17, 0.0f, 1.0f},
    // seqlen_q != seqlen_k both ways, MQA, ragged
    {1, 300, 777, 4, 2, false, 200, 30, 0.0f, 1.0f},
    {2, 777, 300, 4, 1, true, 100, -1, 0.0f, 1.0f},
    {2, 333, 555, 6, 3, false, 70, 90, 0.0f, 1.0f},
    // rows that see no key: seqlen_q > seqlen_k, rows before seqlen_q - seqlen_k - right see nothing (whole
    // query tiles and parts of one)
    {1, 400, 100, 2, 2, false, 20, 5, 0.0f, 1.0f},
    // keys no row sees: seqlen_q < seqlen_k with a short left bound (their key/value tiles' jobs have no step)
    {1, 128, 1000, 2, 2, false, 50, 10, 0.0f, 1.0f},
    // the diagonal alone, and the diagonal and one key after it
    {1, 257, 257, 2, 2, false, 0, 0, 0.0f, 1.0f},
    {1, 257, 257, 2, 2, false, 0, 1, 0.0f, 1.0f},
    // softcap alone, with causal, with a window and with both
    {2, 300, 300, 4, 2, false, -1, -1, 5.0f, 4.0f},
    {2, 513, 513, 4, 4, true, -1, -1, 10.0f, 3.0f},
    {1, 600, 450, 4, 2, false, 150, 40, 3.0f, 4.0f},
    {1, 700, 700, 4, 4, true, 200, -1, 20.0f, 2.0f},
    // softcap on the forward's tall tiles (d = 64, full, seqlen_q >= 2048), which the window never takes; at d = 128
    // the shape would take the wide tiles without softcap, and the softcap kernels keep 128x128 there
    {1, 2100, 2050, 2, 1, false, -1, -1, 8.0f, 3.0f},
};

// Every head dim and dtype, forward and backward (the backward runs the key split at 192 and 256, on 64x96 and 64x80
// tiles, bwd_mainloop_key_split.cuh; symmetric shift is refused there and skipped).
constexpr Instance kInstances[] = {{64, DType::kBF16},  {64, DType::kFP16},  {96, DType::kBF16},  {96, DType::kFP16},
                                   {128, DType::kBF16}, {128, DType::kFP16}, {192, DType::kBF16}, {192, DType::kFP16},
                                   {256, DType::kBF16}, {256, DType::kFP16}};
static_assert(
    [] {
      for (const Instance& inst : kInstances) {
        if (!has_backward_kernel(inst.head_dim)) return false;
      }
      return true;
    }(),
    "every instance the tests run has a backward kernel");

AttentionShape make_shape(const VariantCase& c, const Instance& inst) {
  AttentionShape s =
      gpu_testing::make_attention_shape(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.causal, inst);
  s.softmax_scale *= c.scale_factor;
  s.window_left = c.window_left;
  s.window_right = c.window_right;
  s.softcap = c.softcap;
  return s;
}

// Empty when the kernels of this case can run here (the softcap ones are instances of their own).
std::string variant_skip_reason(const Instance& inst, const VariantCase& c) {
  if (std::string why = skip_reason(inst); !why.empty()) return why;
  if (c.softcap > 0.0f && !kernel_available(inst.head_dim, inst.dtype, /*softcap=*/true)) {
    return "the softcap kernels are not compiled in this build (DASH_SOFTCAP_KERNELS)";
  }
  return {};
}

std::vector<uint16_t> download_halves(const DeviceBuffer& buffer, size_t count) {
  std::vector<uint16_t> bits(count);
  buffer.download(bits.data(), count * sizeof(uint16_t));
  return bits;
}

// Runs the backward with a fresh plan; false (without failing) when the planner refuses the schedule for the shape.
bool run_backward(Problem& p, Schedule schedule, cudaStream_t stream = nullptr) {
  BackwardPlan plan;
  const Status planned = plan_backward(p.shape, schedule, &plan);
  if (planned.code() == StatusCode::kScheduleRejected && schedule != Schedule::kAuto) return false;
  EXPECT_TRUE(planned.ok()) << schedule_name(schedule) << ": " << planned.to_string();
  if (!planned.ok()) return false;
  if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = DeviceBuffer(plan.workspace_bytes());
  const Status s = backward(backward_args(p, schedule), plan, p.workspace.get(), p.workspace.bytes(), stream);
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok()) return false;
  wait_or_die(stream, "backward with schedule " + std::string(schedule_name(schedule)));
  return true;
}

// Rows whose reference LSE is -inf (they see no key) must come out with LSE exactly -inf and O exactly 0.
::testing::AssertionResult keyless_rows_are_zero(const Problem& p) {
  const AttentionShape& s = p.shape;
  const size_t rows = static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q);
  std::vector<float> lse(rows);
  p.d_lse.download(lse.data(), rows * sizeof(float));
  const std::vector<uint16_t> out = download_halves(p.d_out, p.q_elements());
  size_t keyless = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads_q; ++h) {
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const size_t r = static_cast<size_t>((b * s.heads_q + h) * s.seqlen_q + i);
        if (p.lse[r] != -INFINITY) continue;
        ++keyless;
        if (lse[r] != -INFINITY) {
          return ::testing::AssertionFailure()
                 << "row " << i << " (batch " << b << ", head " << h << ") sees no key but its LSE is " << lse[r];
        }
        const size_t at = static_cast<size_t>(((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim);
        for (int64_t d = 0; d < s.head_dim; ++d) {
          if (harness::from_bits(out[at + d], s.dtype) != 0.0) {
            return ::testing::AssertionFailure() << "row " << i << " sees no key but O[" << d << "] is not 0";
          }
        }
      }
    }
  }
  return ::testing::AssertionSuccess() << keyless << " rows see no key";
}

class Sm90Variant : public ::testing::TestWithParam<std::tuple<Instance, VariantCase>> {};

TEST_P(Sm90Variant, ForwardMatchesReferenceWritesEveryElementAndRepeatsItsBits) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = variant_skip_reason(inst, c); !why.empty()) GTEST_SKIP() << why;
  Problem p = harness::make_problem(make_shape(c, inst), /*seed=*/0x3a1d0000u + c.seqlen_q * 13 + inst.head_dim);
  run_forward(p);
  const size_t rows = static_cast<size_t>(c.batch * c.heads_q * c.seqlen_q);
  EXPECT_EQ(count_unwritten_halves(p.d_out, p.q_elements(), inst.dtype), 0u) << "O not written (or not finite)";
  EXPECT_TRUE(keyless_rows_are_zero(p));
  const auto tol = harness::tolerance_for(p.shape);
  const auto out = harness::compare(p.d_out, p.out, inst.dtype);
  const auto lse = harness::compare(p.d_lse, p.lse, inst.dtype, /*is_float=*/true);
  EXPECT_TRUE(harness::within(out, tol)) << "O: " << out.describe();
  EXPECT_TRUE(harness::within(lse, tol)) << "LSE: " << lse.describe();
  // The forward sums in a fixed order: a second run repeats the bits.
  const std::vector<uint16_t> first = download_halves(p.d_out, p.q_elements());
  std::vector<float> first_lse(rows);
  p.d_lse.download(first_lse.data(), rows * sizeof(float));
  run_forward(p);
  EXPECT_EQ(download_halves(p.d_out, p.q_elements()), first) << "O changed between two runs";
  std::vector<float> second_lse(rows);
  p.d_lse.download(second_lse.data(), rows * sizeof(float));
  EXPECT_EQ(std::memcmp(first_lse.data(), second_lse.data(), rows * sizeof(float)), 0) << "LSE changed";
}

TEST_P(Sm90Variant, BackwardOfEveryScheduleThePlannerAcceptsMatchesReference) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = variant_skip_reason(inst, c); !why.empty()) GTEST_SKIP() << why;
  Problem p = harness::make_problem(make_shape(c, inst), /*seed=*/0xbac10000u + c.seqlen_k * 7 + inst.head_dim);
  const auto tol = harness::tolerance_for(p.shape);
  int ran = 0;
  for (Schedule schedule : kAllSchedules) {
    p.d_dq.poison();
    p.d_dk.poison();
    p.d_dv.poison();
    if (!run_backward(p, schedule)) continue;
    ++ran;
    const std::string name(schedule_name(schedule));
    EXPECT_EQ(count_unwritten_halves(p.d_dq, p.q_elements(), inst.dtype), 0u) << name << ": dQ not written";
    EXPECT_EQ(count_unwritten_halves(p.d_dk, p.kv_elements(), inst.dtype), 0u) << name << ": dK not written";
    EXPECT_EQ(count_unwritten_halves(p.d_dv, p.kv_elements(), inst.dtype), 0u) << name << ": dV not written";
    const auto dq = harness::compare(p.d_dq, p.dq, inst.dtype);
    const auto dk = harness::compare(p.d_dk, p.dk, inst.dtype);
    const auto dv = harness::compare(p.d_dv, p.dv, inst.dtype);
    EXPECT_TRUE(harness::within(dq, tol)) << name << " dQ: " << dq.describe();
    EXPECT_TRUE(harness::within(dk, tol)) << name << " dK: " << dk.describe();
    EXPECT_TRUE(harness::within(dv, tol)) << name << " dV: " << dv.describe();
  }
  // auto, ascending, descending, shortest-first and nondeterministic take every window.
  EXPECT_GE(ran, 5);
}

std::string variant_name(const ::testing::TestParamInfo<std::tuple<Instance, VariantCase>>& info) {
  const auto& [inst, c] = info.param;
  return "hdim" + std::to_string(inst.head_dim) + "_" + std::string(dtype_name(inst.dtype)) + "_" + case_name(c);
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90Variant,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::ValuesIn(kCases)),
                         variant_name);

// The softcap case on long full masks runs the tiles it is there for.
static_assert(forward_tile_shape(64, false, 2100, 2050).block_q == kForwardTallBlockQ, "tall tiles at d = 64");
static_assert(forward_tile_shape(128, false, 2100, 2050).block_kv == kForwardWideBlockKv,
              "at d = 128 the shape would take the wide tiles, which the softcap kernels replace by 128x128");

// --- determinism ----------------------------------------------------------------------------------

// The backward kDeterminismRuns times with one plan; every other run a forward on a second stream competes for
// the SMs. Returns how many runs differed from the first, bit for bit (-1 when the planner refuses the schedule).
int differing_runs(Problem& p, Problem& load, Schedule schedule) {
  BackwardPlan plan;
  const Status planned = plan_backward(p.shape, schedule, &plan);
  if (planned.code() == StatusCode::kScheduleRejected) return -1;
  EXPECT_TRUE(planned.ok()) << planned.to_string();
  if (!planned.ok()) return -1;
  if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = DeviceBuffer(plan.workspace_bytes());
  cudaStream_t side = nullptr;
  harness::check_cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");
  size_t load_bytes = 0;
  EXPECT_TRUE(forward_workspace_size(load.shape, &load_bytes).ok());
  if (load.workspace.bytes() < load_bytes) load.workspace = DeviceBuffer(load_bytes);
  std::vector<uint16_t> first;
  int differing = 0;
  for (int run = 0; run < kDeterminismRuns; ++run) {
    if (run % 2 == 1) {
      const Status s = forward(forward_args(load), load.workspace.get(), load.workspace.bytes(), side);
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    p.d_dq.poison();
    const Status s = backward(backward_args(p, schedule), plan, p.workspace.get(), p.workspace.bytes(), nullptr);
    EXPECT_TRUE(s.ok()) << s.to_string();
    wait_or_die(nullptr, "backward");
    wait_or_die(side, "load forward");
    std::vector<uint16_t> bits = download_gradients(p);
    if (run == 0) {
      first = std::move(bits);
    } else if (std::memcmp(bits.data(), first.data(), bits.size() * 2) != 0) {
      ++differing;
    }
  }
  cudaStreamDestroy(side);
  return differing;
}

// The GPU forward's O and LSE as the backward's inputs (the softcap backward recovers the capped score from P and
// the LSE, so the LSE must be a forward's; no CPU reference is needed for bits).
Problem make_determinism_problem(const AttentionShape& shape) {
  Problem p = harness::make_problem(shape, /*seed=*/91, /*with_reference=*/false);
  run_forward(p);
  harness::use_forward_outputs_for_backward(p);
  return p;
}

Problem make_load_problem(const AttentionShape& shape) {
  AttentionShape load_shape = shape;
  load_shape.batch = 4;
  load_shape.seqlen_q = load_shape.seqlen_k = 4096;
  load_shape.window_left = load_shape.window_right = -1;
  return harness::make_problem(load_shape, /*seed=*/92, /*with_reference=*/false);
}

class Sm90VariantDeterminism : public ::testing::TestWithParam<std::tuple<Instance, VariantCase>> {};

TEST_P(Sm90VariantDeterminism, EveryDeterministicScheduleIsBitwiseIdentical) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = variant_skip_reason(inst, c); !why.empty()) GTEST_SKIP() << why;
  Problem p = make_determinism_problem(make_shape(c, inst));
  Problem load = make_load_problem(p.shape);
  int ran = 0;
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kNondeterministic) continue;
    const int differing = differing_runs(p, load, schedule);
    if (differing < 0) continue;
    ++ran;
    EXPECT_EQ(differing, 0) << schedule_name(schedule) << ": " << differing << " of " << kDeterminismRuns - 1
                            << " runs differed from the first";
  }
  EXPECT_GE(ran, 4);
}

// At least three key/value tiles reach every dQ tile but the first few.
const VariantCase kDeterminismCases[] = {
    {2, 1024, 1024, 4, 4, true, 511, -1, 0.0f, 1.0f},
    {2, 1024, 1024, 4, 2, false, 400, 300, 0.0f, 1.0f},
    {2, 1024, 1024, 4, 4, true, -1, -1, 5.0f, 3.0f},
    {1, 1536, 1536, 8, 2, false, 600, 200, 4.0f, 3.0f},
};

INSTANTIATE_TEST_SUITE_P(Cases, Sm90VariantDeterminism,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::ValuesIn(kDeterminismCases)),
                         variant_name);

// Negative control: under a window that leaves most of the full mask, many key/value tiles reach the first query
// tiles at once, so the nondeterministic schedule's unordered adds race, and the comparison above must see it.
TEST(Sm90VariantDeterminismControl, NondeterministicScheduleUnderAWindowIsCaught) {
  const VariantCase c{2, 1024, 1024, 4, 4, false, 900, 900, 0.0f, 1.0f};
  for (const Instance& inst : kInstances) {
    if (!variant_skip_reason(inst, c).empty()) continue;
    Problem p = make_determinism_problem(make_shape(c, inst));
    Problem load = make_load_problem(p.shape);
    const int differing = differing_runs(p, load, Schedule::kNondeterministic);
    EXPECT_GT(differing, 0) << "hdim " << inst.head_dim << " " << dtype_name(inst.dtype)
                            << ": the nondeterministic schedule gave identical bits in all " << kDeterminismRuns
                            << " runs, so the determinism test could not detect nondeterminism";
    return;
  }
  GTEST_SKIP() << skip_reason(kInstances[0]);
}

TEST(Sm90VariantApi, EveryCompiledInstanceHasItsSoftcapKernels) {
  if (!kernels_available()) GTEST_SKIP() << "built without kernels";
  for (const Instance& inst : kInstances) {
    if (!kernel_available(inst.head_dim, inst.dtype)) continue;
    EXPECT_TRUE(kernel_available(inst.head_dim, inst.dtype, /*softcap=*/true))
        << "hdim " << inst.head_dim << " " << dtype_name(inst.dtype) << " (built with DASH_SOFTCAP_KERNELS=OFF?)";
  }
}

}  // namespace
}  // namespace dash
