// GPU tests of packed varlen batches (ForwardArgs::varlen, BackwardArgs::varlen; dash/types.hpp) on the sm90
// kernels, through the public API:
// - Sm90Varlen: the forward against the float64 CPU reference of every sequence on its own, on adversarial length
//   distributions (lengths 0 and 1, just under and over a tile, the maximum, all equal, one long and the rest empty,
//   seqlen_q != seqlen_k both ways per sequence, a maximum above every length, a batch long enough for the dense
//   forward's tall or wide tiles, which the varlen forward does not take), full, causal (bottom-right aligned per sequence) and sliding windows, GQA and MQA, and softcap alone,
//   with causal, with a window and on the long batch (the softcap instances' varlen kernels), at every head dim:
//   64 and 128 on the row-split backward, 96 on its 64 x 48 dQ partials, 192 and 256 on the narrower forward key
//   tiles (128x112, 128x80) and the key-split backward (64x96, 64x80). Outputs start poisoned (NaN): every element
//   of every sequence must be written, the padding rows after the last sequence must come out cleared (0, LSE -inf),
//   and a second run repeats the bits.
// - Sm90Varlen, backward: every schedule the varlen planner admits for the batch (ascending, descending,
//   shortest-first and nondeterministic always; shift and symmetric shift where the batch keeps the promise
//   seqlen_k <= seqlen_q, symmetric shift not at 192 and 256), each on poisoned gradients: every element of every
//   sequence written and matching the reference, padding rows cleared to 0.
// - Sm90VarlenContract: offsets that break cu_seqlens' contract neither hang a kernel nor take it outside the
//   tensors (the kernels clamp each sequence; memcheck runs it in scripts/dev/gpu_run.sh); offsets out of order are
//   reported at the next call (kCuSeqlensInvalid; test_sm90_faults.cpp tests the poisoning and the report).
// - Sm90VarlenDeterminism: every deterministic schedule's backward 100 times on adversarial lengths, bit for bit,
//   with a forward competing for the SMs every other run (one case with softcap), and the negative control
//   (Sm90VarlenDeterminismControl: the nondeterministic schedule must differ at least once in the same comparison).
// - VarlenFlops (host only): harness::forward_flops of a batch, each sequence's own (what dash-attn bench counts).
// - Sm90VarlenApi: every compiled instance, plain or softcap, has its varlen kernels.
// Tolerances: harness::tolerance_for(shape), as in test_sm90.cpp (widened with softcap for the kernels' tanh, as in
// test_sm90_variants.cpp).
// Without a Hopper GPU (or without compiled varlen kernels of a case's instance) every test skips and says why.
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "harness/varlen_harness.hpp"
#include "sm90_test_support.hpp"

namespace dash {
namespace {

using gpu_testing::Instance;
using gpu_testing::skip_reason;
using gpu_testing::wait_or_die;
using harness::DeviceBuffer;
using harness::VarlenProblem;

// Rows after the last sequence of every packed tensor: no call may write them.
constexpr int64_t kPaddingRows = 37;

struct VarlenCase {
  const char* name;
  std::vector<SequenceLengths> lengths;
  int64_t heads_q, heads_kv;
  bool causal;
  int64_t window_left, window_right;
  SequenceLengths max_lengths;  // raised to the longest sequence; larger: a plan for longer sequences than any here
  float softcap;                // > 0: the softcap instance's varlen kernels
  float scale_factor;           // softmax_scale = scale_factor / sqrt(head_dim): > 1 makes the softcap bite
};

// Each distribution breaks the packing in another place; see the file comment.
const std::vector<VarlenCase> kCases = {
    {"mixed_self_full",
     {{0, 0}, {1, 1}, {127, 127}, {129, 129}, {300, 300}, {0, 0}, {64, 64}},
     4,
     4,
     false,
     -1,
     -1,
     {1, 1},
     0.0f,
     1.0f},
    {"mixed_self_causal",
     {{0, 0}, {1, 1}, {127, 127}, {129, 129}, {300, 300}, {0, 0}, {64, 64}},
     4,
     2,
     true,
     -1,
     -1,
     {1, 1},
     0.0f,
     1.0f},
    {"q_ne_k_full",
     {{100, 300}, {300, 100}, {0, 50}, {50, 0}, {1, 1}, {257, 129}},
     4,
     2,
     false,
     -1,
     -1,
     {1, 1},
     0.0f,
     1.0f},
    {"q_ne_k_causal",
     {{100, 300}, {300, 100}, {0, 50}, {50, 0}, {1, 1}, {257, 129}},
     4,
     1,
     true,
     -1,
     -1,
     {1, 1},
     0.0f,
     1.0f},
    {"all_equal_causal", {{256, 256}, {256, 256}, {256, 256}, {256, 256}}, 2, 2, true, -1, -1, {1, 1}, 0.0f, 1.0f},
    {"one_long_rest_empty", {{1000, 1000}, {0, 0}, {0, 0}, {0, 0}}, 2, 1, true, -1, -1, {1, 1}, 0.0f, 1.0f},
    {"max_above_every_length", {{200, 200}, {77, 77}, {129, 129}}, 6, 3, false, -1, -1, {700, 700}, 0.0f, 1.0f},
    {"window", {{300, 300}, {5, 5}, {129, 129}, {0, 0}, {600, 600}}, 4, 2, false, 64, 16, {1, 1}, 0.0f, 1.0f},
    {"window_causal_q_ne_k", {{300, 200}, {200, 300}, {1, 1}, {400, 400}}, 4, 4, true, 100, -1, {1, 1}, 0.0f, 1.0f},
    // Mean length past 2048, where the dense forward takes tall tiles at d = 64 and wide ones at d = 128; a varlen
    // batch keeps the base tiles (forward_varlen_tile_shape), each length ending inside a tile.
    {"long_full_mean_past_2048", {{2049, 2049}, {2100, 2100}}, 1, 1, false, -1, -1, {1, 1}, 0.0f, 1.0f},
    // softcap (the scores scaled up so that the cap bites): alone on the mixed lengths, with causal and seqlen_q !=
    // seqlen_k, with a window, and on the long batch
    {"softcap_mixed_self_full",
     {{0, 0}, {1, 1}, {127, 127}, {129, 129}, {300, 300}, {0, 0}, {64, 64}},
     4,
     2,
     false,
     -1,
     -1,
     {1, 1},
     5.0f,
     4.0f},
    {"softcap_q_ne_k_causal",
     {{100, 300}, {300, 100}, {0, 50}, {50, 0}, {1, 1}, {257, 129}},
     4,
     4,
     true,
     -1,
     -1,
     {1, 1},
     10.0f,
     3.0f},
    {"softcap_window", {{300, 300}, {5, 5}, {129, 129}, {0, 0}, {600, 450}}, 4, 2, false, 150, 40, {1, 1}, 3.0f, 4.0f},
    {"softcap_long_full", {{2049, 2049}, {2100, 2100}}, 1, 1, false, -1, -1, {1, 1}, 8.0f, 3.0f},
};

// Every head dim and dtype (the varlen kernels are each instance's, src/kernels/CMakeLists.txt).
const Instance kInstances[] = {{64, DType::kBF16},  {64, DType::kFP16},  {96, DType::kBF16},  {96, DType::kFP16},
                               {128, DType::kBF16}, {128, DType::kFP16}, {192, DType::kBF16}, {192, DType::kFP16},
                               {256, DType::kBF16}, {256, DType::kFP16}};

AttentionShape make_base_shape(const VarlenCase& c, const Instance& inst) {
  AttentionShape s = gpu_testing::make_attention_shape(1, 1, 1, c.heads_q, c.heads_kv, c.causal, inst);
  s.softmax_scale *= c.scale_factor;
  s.window_left = c.window_left;
  s.window_right = c.window_right;
  s.softcap = c.softcap;
  return s;
}

VarlenProblem make_problem(const VarlenCase& c, const Instance& inst, uint64_t seed, bool with_reference = true) {
  return harness::make_varlen_problem(make_base_shape(c, inst), c.lengths, kPaddingRows, seed, c.max_lengths,
                                      with_reference);
}

// Empty when this build has the varlen kernels of the instance (its softcap one for a softcap case) and a Hopper GPU
// runs them.
std::string varlen_skip_reason(const Instance& inst, const VarlenCase& c) {
  if (std::string why = skip_reason(inst); !why.empty()) return why;
  const bool softcap = c.softcap > 0.0f;
  if (!varlen_kernel_available(inst.head_dim, inst.dtype, softcap)) {
    return softcap ? "the softcap varlen kernels are not compiled in this build (DASH_VARLEN_KERNELS, "
                     "DASH_SOFTCAP_KERNELS)"
                   : "the varlen kernels are not compiled in this build (DASH_VARLEN_KERNELS)";
  }
  return {};
}

// The forward on `p` with O, LSE and the workspace poisoned first, waited for under the watchdog.
void run_varlen_forward(VarlenProblem& p) {
  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(p.shape, &bytes).ok());
  if (p.workspace.bytes() < bytes) p.workspace = DeviceBuffer(bytes);
  p.workspace.poison();  // as run_forward (sm90_test_support.hpp) does: the launch must zero the tile counter
  p.d_out.poison();
  p.d_lse.poison();
  const Status s = forward(harness::forward_args(p), p.workspace.get(), p.workspace.bytes(), nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  wait_or_die(nullptr, "varlen forward");
}

std::vector<uint8_t> download_bytes(const DeviceBuffer& buffer, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  buffer.download(host.data(), bytes);
  return host;
}

::testing::AssertionResult matches(const char* what, const harness::PackedComparison& c,
                                   const harness::Tolerance& tol) {
  if (c.padding_not_cleared > 0) {
    return ::testing::AssertionFailure() << what << ": " << c.padding_not_cleared << " padding elements not cleared";
  }
  if (!harness::within(c.stats, tol)) return ::testing::AssertionFailure() << what << ": " << c.stats.describe();
  return ::testing::AssertionSuccess();
}

class Sm90Varlen : public ::testing::TestWithParam<std::tuple<Instance, VarlenCase>> {};

TEST_P(Sm90Varlen, ForwardMatchesEverySequencesReferenceClearsPaddingAndRepeatsItsBits) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = varlen_skip_reason(inst, c); !why.empty()) GTEST_SKIP() << why;
  VarlenProblem p = make_problem(c, inst, /*seed=*/0x7a110000u + inst.head_dim);
  run_varlen_forward(p);
  const auto tol = harness::tolerance_for(p.shape);
  EXPECT_TRUE(matches("O", harness::compare_packed(p.d_out, p.out, inst.dtype), tol));
  EXPECT_TRUE(matches("LSE", harness::compare_packed(p.d_lse, p.lse, inst.dtype, /*is_float=*/true), tol));
  const std::vector<uint8_t> out = download_bytes(p.d_out, p.q_elements() * 2);
  const std::vector<uint8_t> lse = download_bytes(p.d_lse, p.lse_elements() * sizeof(float));
  run_varlen_forward(p);
  EXPECT_TRUE(download_bytes(p.d_out, p.q_elements() * 2) == out) << "O changed between two runs";
  EXPECT_TRUE(download_bytes(p.d_lse, p.lse_elements() * sizeof(float)) == lse) << "LSE changed between two runs";
}

// The backward of `schedule` with a fresh varlen plan, waited for under the watchdog; false (without failing) when
// the planner refuses the schedule for the batch.
bool run_varlen_backward(VarlenProblem& p, Schedule schedule, cudaStream_t stream = nullptr) {
  BackwardPlan plan;
  const Status planned = harness::plan_backward_for(p, schedule, /*sm_margin=*/0, &plan);
  if (planned.code() == StatusCode::kScheduleRejected && schedule != Schedule::kAuto) return false;
  EXPECT_TRUE(planned.ok()) << schedule_name(schedule) << ": " << planned.to_string();
  if (!planned.ok()) return false;
  if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = DeviceBuffer(plan.workspace_bytes());
  const Status s = backward(harness::backward_args(p, schedule), plan, p.workspace.get(), p.workspace.bytes(), stream);
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok()) return false;
  wait_or_die(stream, "varlen backward with schedule " + std::string(schedule_name(schedule)));
  return true;
}

TEST_P(Sm90Varlen, BackwardOfEveryScheduleThePlanAdmitsMatchesEverySequencesReference) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = varlen_skip_reason(inst, c); !why.empty()) GTEST_SKIP() << why;
  VarlenProblem p = make_problem(c, inst, /*seed=*/0xbac70000u + inst.head_dim);
  const auto tol = harness::tolerance_for(p.shape);
  int ran = 0;
  for (Schedule schedule : kAllSchedules) {
    p.d_dq.poison();
    p.d_dk.poison();
    p.d_dv.poison();
    if (!run_varlen_backward(p, schedule)) continue;
    ++ran;
    const std::string name(schedule_name(schedule));
    EXPECT_TRUE(matches((name + " dQ").c_str(), harness::compare_packed(p.d_dq, p.dq, inst.dtype), tol));
    EXPECT_TRUE(matches((name + " dK").c_str(), harness::compare_packed(p.d_dk, p.dk, inst.dtype), tol));
    EXPECT_TRUE(matches((name + " dV").c_str(), harness::compare_packed(p.d_dv, p.dv, inst.dtype), tol));
  }
  // auto, ascending, descending, shortest-first and nondeterministic take every batch.
  EXPECT_GE(ran, 5);
}

// Offsets that break the contract (decreasing, negative, past the totals, lengths past the maxima, keys past the
// queries under the promise): the kernels clamp every sequence (packed_sequence), so the forward and every
// schedule's backward finish (the watchdog turns a hang into a failure) and write nothing outside the tensors
// (compute-sanitizer's memcheck runs this test in scripts/dev/gpu_run.sh). Each call leaves offsets out of order,
// which the call after it reports instead of running (test_sm90_faults.cpp tests the poisoning and the report); the
// test then makes the call again.
TEST(Sm90VarlenContract, OffsetsThatBreakItNeitherHangNorLeaveTheTensors) {
  const Instance inst{128, DType::kBF16};
  const VarlenCase c{"lying", {{300, 300}, {129, 129}, {200, 200}}, 4, 2, true, -1, -1, {1, 1}, 0.0f, 1.0f};
  if (const std::string why = varlen_skip_reason(inst, c); !why.empty()) GTEST_SKIP() << why;
  VarlenProblem p = make_problem(c, inst, /*seed=*/77, /*with_reference=*/false);
  p.keys_within_queries = true;  // promised, and broken by the key offsets below
  const int32_t total_q = static_cast<int32_t>(p.total_q), total_k = static_cast<int32_t>(p.total_k);
  const std::vector<int32_t> lying_q{-40, 500, 100, total_q + 1000};
  const std::vector<int32_t> lying_k{0, total_k + 7, 3, total_k};
  p.d_cu_seqlens_q.upload(lying_q.data(), lying_q.size() * sizeof(int32_t));
  p.d_cu_seqlens_k.upload(lying_k.data(), lying_k.size() * sizeof(int32_t));
  run_varlen_forward(p);
  for (Schedule schedule : kAllSchedules) {
    SCOPED_TRACE(schedule_name(schedule));
    BackwardPlan plan;
    const Status planned = harness::plan_backward_for(p, schedule, /*sm_margin=*/0, &plan);
    if (planned.code() == StatusCode::kScheduleRejected && schedule != Schedule::kAuto) continue;
    ASSERT_TRUE(planned.ok()) << planned.to_string();
    if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = DeviceBuffer(plan.workspace_bytes());
    const BackwardArgs args = harness::backward_args(p, schedule);
    const Status reported = backward(args, plan, p.workspace.get(), p.workspace.bytes(), nullptr);
    EXPECT_EQ(reported.code(), StatusCode::kCuSeqlensInvalid) << "the previous call's: " << reported.to_string();
    const Status s = backward(args, plan, p.workspace.get(), p.workspace.bytes(), nullptr);
    ASSERT_TRUE(s.ok()) << s.to_string();
    wait_or_die(nullptr, "varlen backward with schedule " + std::string(schedule_name(schedule)));
  }
  // The last backward's report, so that the tests after this one start clean.
  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(p.shape, &bytes).ok());
  EXPECT_EQ(forward(harness::forward_args(p), p.workspace.get(), p.workspace.bytes(), nullptr).code(),
            StatusCode::kCuSeqlensInvalid);
}

std::string varlen_name(const ::testing::TestParamInfo<std::tuple<Instance, VarlenCase>>& info) {
  const auto& [inst, c] = info.param;
  return "hdim" + std::to_string(inst.head_dim) + "_" + std::string(dtype_name(inst.dtype)) + "_" + c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90Varlen,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::ValuesIn(kCases)), varlen_name);

// --- determinism ----------------------------------------------------------------------------------

constexpr int kDeterminismRuns = 100;

// The backward kDeterminismRuns times with one plan; every other run a dense forward on a second stream competes
// for the SMs. How many runs differed from the first, bit for bit (-1 when the planner refuses the schedule).
int differing_runs(VarlenProblem& p, harness::Problem& load, Schedule schedule) {
  BackwardPlan plan;
  const Status planned = harness::plan_backward_for(p, schedule, /*sm_margin=*/0, &plan);
  if (planned.code() == StatusCode::kScheduleRejected) return -1;
  EXPECT_TRUE(planned.ok()) << planned.to_string();
  if (!planned.ok()) return -1;
  if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = DeviceBuffer(plan.workspace_bytes());
  cudaStream_t side = nullptr;
  harness::check_cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");
  size_t load_bytes = 0;
  EXPECT_TRUE(forward_workspace_size(load.shape, &load_bytes).ok());
  if (load.workspace.bytes() < load_bytes) load.workspace = DeviceBuffer(load_bytes);
  const size_t q_bytes = p.q_elements() * 2, kv_bytes = p.kv_elements() * 2;
  std::vector<uint8_t> first;
  int differing = 0;
  for (int run = 0; run < kDeterminismRuns; ++run) {
    if (run % 2 == 1) {
      const Status s = forward(harness::forward_args(load), load.workspace.get(), load.workspace.bytes(), side);
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    p.d_dq.poison();
    const Status s =
        backward(harness::backward_args(p, schedule), plan, p.workspace.get(), p.workspace.bytes(), nullptr);
    EXPECT_TRUE(s.ok()) << s.to_string();
    wait_or_die(nullptr, "varlen backward");
    wait_or_die(side, "load forward");
    std::vector<uint8_t> bits = download_bytes(p.d_dq, q_bytes);
    const std::vector<uint8_t> dk = download_bytes(p.d_dk, kv_bytes), dv = download_bytes(p.d_dv, kv_bytes);
    bits.insert(bits.end(), dk.begin(), dk.end());
    bits.insert(bits.end(), dv.begin(), dv.end());
    if (run == 0) {
      first = std::move(bits);
    } else if (bits != first) {
      ++differing;
    }
  }
  cudaStreamDestroy(side);
  return differing;
}

// A problem for the determinism runs: no CPU reference, the GPU forward's O and LSE as the backward's inputs (their
// padding rows cleared by the forward; no kernel reads them).
VarlenProblem make_determinism_problem(const VarlenCase& c, const Instance& inst, uint64_t seed) {
  VarlenProblem p = make_problem(c, inst, seed, /*with_reference=*/false);
  run_varlen_forward(p);
  std::swap(p.d_ref_out, p.d_out);
  std::swap(p.d_ref_lse, p.d_lse);
  return p;
}

// Many key/value tiles reach each dQ tile of the long sequences; the short and empty ones sit between them.
const VarlenCase kDeterminismCases[] = {
    {"self_causal",
     {{1024, 1024}, {1, 1}, {0, 0}, {777, 777}, {129, 129}, {1500, 1500}},
     4,
     4,
     true,
     -1,
     -1,
     {1, 1},
     0.0f,
     1.0f},
    {"self_full_gqa", {{900, 900}, {0, 0}, {1024, 1024}, {127, 127}}, 8, 2, false, -1, -1, {1, 1}, 0.0f, 1.0f},
    {"q_ne_k_window", {{1000, 600}, {600, 1000}, {1, 1}, {1200, 1200}}, 4, 2, true, 300, -1, {1, 1}, 0.0f, 1.0f},
    {"softcap_self_full_gqa", {{900, 900}, {0, 0}, {1024, 1024}, {127, 127}}, 8, 2, false, -1, -1, {1, 1}, 5.0f, 4.0f},
};

harness::Problem make_load_problem(const AttentionShape& shape) {
  AttentionShape load_shape = gpu_testing::make_attention_shape(
      4, 4096, 4096, shape.heads_q, shape.heads_kv, false, Instance{static_cast<int>(shape.head_dim), shape.dtype});
  return harness::make_problem(load_shape, /*seed=*/92, /*with_reference=*/false);
}

class Sm90VarlenDeterminism : public ::testing::TestWithParam<std::tuple<Instance, VarlenCase>> {};

TEST_P(Sm90VarlenDeterminism, EveryDeterministicScheduleIsBitwiseIdentical) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = varlen_skip_reason(inst, c); !why.empty()) GTEST_SKIP() << why;
  VarlenProblem p = make_determinism_problem(c, inst, /*seed=*/91);
  harness::Problem load = make_load_problem(p.shape);
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

INSTANTIATE_TEST_SUITE_P(Cases, Sm90VarlenDeterminism,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::ValuesIn(kDeterminismCases)),
                         varlen_name);

// Negative control: many key/value tiles reach the first query tiles of long full-mask sequences at once, so the
// nondeterministic schedule's unordered adds race, and the comparison above must see it.
TEST(Sm90VarlenDeterminismControl, NondeterministicScheduleIsCaught) {
  const VarlenCase c{"control", {{2048, 2048}, {0, 0}, {2048, 2048}}, 4, 4, false, -1, -1, {1, 1}, 0.0f, 1.0f};
  for (const Instance& inst : kInstances) {
    if (!varlen_skip_reason(inst, c).empty()) continue;
    VarlenProblem p = make_determinism_problem(c, inst, /*seed=*/93);
    harness::Problem load = make_load_problem(p.shape);
    const int differing = differing_runs(p, load, Schedule::kNondeterministic);
    EXPECT_GT(differing, 0) << "hdim " << inst.head_dim << " " << dtype_name(inst.dtype)
                            << ": the nondeterministic schedule gave identical bits in all " << kDeterminismRuns
                            << " runs, so the determinism test could not detect nondeterminism";
    return;
  }
  GTEST_SKIP() << varlen_skip_reason(kInstances[0], c);
}

// Plain and softcap instances alike (src/kernels/CMakeLists.txt).
TEST(Sm90VarlenApi, EveryCompiledInstanceHasItsVarlenKernels) {
  if (!kernels_available()) GTEST_SKIP() << "built without kernels";
  for (const Instance& inst : kInstances) {
    for (const bool softcap : {false, true}) {
      if (!kernel_available(inst.head_dim, inst.dtype, softcap)) continue;
      EXPECT_TRUE(varlen_kernel_available(inst.head_dim, inst.dtype, softcap))
          << "hdim " << inst.head_dim << " " << dtype_name(inst.dtype) << (softcap ? " softcap" : "")
          << " (built with DASH_VARLEN_KERNELS=OFF?)";
    }
  }
}

// --- FLOPs (host only: what dash-attn bench divides by) --------------------------------------------

// A varlen batch's FLOPs are its sequences' own: the dense count of each (its causal diagonal bottom-right aligned),
// nothing for an empty sequence, so a batch of equal lengths counts as the dense batch does.
TEST(VarlenFlops, AreTheSumOfEachSequencesOwn) {
  const Instance inst{128, DType::kBF16};
  constexpr int64_t kHeads = 4;
  constexpr double kFlopsPerScoreAndDim = 4.0;  // Q K^T and P V, 2 FLOPs per multiply-add
  const double per_score = kFlopsPerScoreAndDim * kHeads * inst.head_dim;
  const AttentionShape causal = gpu_testing::make_attention_shape(1, 1, 1, kHeads, kHeads, true, inst);
  // A causal square counts half of it; seqlen_q > seqlen_k: only the last seqlen_k rows see keys, a triangle of half
  // of seqlen_k^2; seqlen_q < seqlen_k: a trapezoid, seqlen_q (seqlen_k - seqlen_q / 2).
  EXPECT_DOUBLE_EQ(harness::forward_flops(causal, {{100, 100}}), per_score * 100 * 100 / 2);
  EXPECT_DOUBLE_EQ(harness::forward_flops(causal, {{300, 100}}), per_score * 100 * 100 / 2);
  EXPECT_DOUBLE_EQ(harness::forward_flops(causal, {{100, 300}}), per_score * 100 * (300 - 50));
  EXPECT_DOUBLE_EQ(harness::forward_flops(causal, {{100, 100}, {0, 0}, {0, 50}, {50, 0}, {300, 100}}),
                   per_score * 100 * 100);
  AttentionShape dense = gpu_testing::make_attention_shape(3, 512, 512, kHeads, kHeads, true, inst);
  EXPECT_DOUBLE_EQ(harness::forward_flops(causal, {{512, 512}, {512, 512}, {512, 512}}), harness::forward_flops(dense));
  // Under a window each sequence's rows are counted under its own bottom-right aligned window.
  AttentionShape windowed = gpu_testing::make_attention_shape(1, 1, 1, kHeads, kHeads, false, inst);
  windowed.window_left = 10;
  windowed.window_right = 0;
  AttentionShape one = windowed;
  one.seqlen_q = one.seqlen_k = 200;
  EXPECT_DOUBLE_EQ(harness::forward_flops(windowed, {{200, 200}, {0, 7}}), harness::forward_flops(one));
  EXPECT_LT(harness::forward_flops(one), per_score * 200 * 11);
}

}  // namespace
}  // namespace dash
