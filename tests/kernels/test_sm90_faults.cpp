// GPU tests of the results the kernels cannot vouch for (src/api/wait_timeouts.hpp, kernels/sm90/varlen_padding.cuh),
// through the public API:
// - Sm90SeqlenGuard: a varlen batch with one sequence longer than the call's max_seqlen_q (the forward) or
//   max_seqlen_k (the backward). The outputs start at 0, not NaN, so a NaN proves a write: every element of that
//   sequence's rows (out and LSE; dq, dk and dv) is NaN, every other sequence's matches the float64 reference, the
//   padding rows are cleared; the next call on the device, made from another thread, returns kSeqlenExceedsMax
//   naming the sequence, its length and the maximum, and runs nothing; the call after it runs (the record was
//   cleared). A sequence with more keys than queries under keys_within_queries is poisoned and reported the same way.
//   The negative control: the same batch with maxima that hold it leaves no NaN and no report.
// - Sm90OffsetsGuard: cu_seqlens out of order (decreasing, not starting at 0, ending past the total), with every
//   length within the maxima: every element of the call's outputs is NaN, the padding rows too; the next call,
//   from another thread, returns kCuSeqlensInvalid naming the entry and the rule; with the offsets in order again
//   the call after it runs, matches the reference and is not reported (the negative control).
// - Sm90TmaDescriptor: the launchers' geometry check (first_tma_refusal) and cuTensorMapEncodeTiled agree on a valid
//   tensor, a row stride that is no multiple of 16 bytes, an address off 16-byte alignment and batch strides just
//   below and at 2^40 bytes; the check names "q" for each the driver refuses (tma_probe.cu).
// - CaptureFirstCall: a process whose very first DASH call, forward and backward, is captured into a CUDA graph in
//   the global mode (which refuses unsafe calls from any thread): the calls return OK, the graph instantiates, and
//   its replay matches the reference. It runs this binary again with only CaptureFirstCallChild selected, so the
//   capture is the child's first call; the child checks the GPU with the CUDA runtime alone.
// The wait that gives up (poisoned gradients, reported at the next call, a forward) is in test_wait_bound_gpu.cpp.
// Without a Hopper GPU or the kernels every test skips and says why.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "dash/attention.hpp"
#include "harness/device_harness.hpp"
#include "harness/varlen_harness.hpp"
#include "sm90_test_support.hpp"
#include "tma_probe.hpp"

namespace dash {
namespace {

using gpu_testing::Instance;
using gpu_testing::wait_or_die;
using harness::DeviceBuffer;
using harness::VarlenProblem;

constexpr Instance kInstance{128, DType::kBF16};
constexpr int64_t kPaddingRows = 9;
constexpr int kLongSequence = 1;  // the sequence over the maximum, between two that are within it
constexpr int kMaximum = 256;     // the maximum the call is given; the long sequence has kLongLength rows
constexpr int kLongLength = 300;

std::string guard_skip_reason() {
  if (std::string why = gpu_testing::skip_reason(kInstance); !why.empty()) return why;
  if (!varlen_kernel_available(kInstance.head_dim, kInstance.dtype)) return "varlen kernels not compiled";
  return {};
}

// Three sequences, the middle one kLongLength rows of queries (`long_queries`) or of keys; the call's maxima are
// kMaximum unless `within` keeps them at the longest sequence's lengths (the control).
VarlenProblem make_guard_problem(bool long_queries, bool within) {
  AttentionShape shape = gpu_testing::make_attention_shape(1, 1, 1, /*heads_q=*/4, /*heads_kv=*/2, false, kInstance);
  const SequenceLengths long_one = long_queries ? SequenceLengths{kLongLength, 200} : SequenceLengths{200, kLongLength};
  VarlenProblem p = harness::make_varlen_problem(shape, {{100, 120}, long_one, {64, 64}}, kPaddingRows, 0x5e9u);
  if (!within) {
    if (long_queries) p.shape.seqlen_q = kMaximum;
    if (!long_queries) p.shape.seqlen_k = kMaximum;
  }
  return p;
}

void zero(DeviceBuffer& buffer) { harness::check_cuda(cudaMemset(buffer.get(), 0, buffer.bytes()), "cudaMemset"); }

// How many of the rows [first, first + count) of a packed (total, heads, head_dim) 16-bit tensor are not NaN, and
// the same for the LSE's (heads, total) entries of those rows when `lse` is given.
size_t rows_not_nan(const DeviceBuffer& tensor, int64_t total, int64_t heads, int first, int count,
                    const DeviceBuffer* lse = nullptr) {
  const int64_t row_elements = heads * kInstance.head_dim;
  std::vector<uint16_t> bits(static_cast<size_t>(total * row_elements));
  tensor.download(bits.data(), bits.size() * sizeof(uint16_t));
  size_t finite = 0;
  for (int64_t i = first * row_elements; i < (first + count) * row_elements; ++i) {
    finite += !std::isnan(harness::from_bits(bits[static_cast<size_t>(i)], kInstance.dtype));
  }
  if (lse != nullptr) {
    std::vector<float> values(static_cast<size_t>(heads * total));
    lse->download(values.data(), values.size() * sizeof(float));
    for (int64_t h = 0; h < heads; ++h) {
      for (int r = first; r < first + count; ++r) finite += !std::isnan(values[static_cast<size_t>(h * total + r)]);
    }
  }
  return finite;
}

// A packed output against its reference where exactly `poisoned` elements are expected NaN (the long sequence's,
// checked by rows_not_nan): the rest within tolerance, the padding cleared.
::testing::AssertionResult matches_except_poisoned(const char* what, const DeviceBuffer& device,
                                                   const std::vector<double>& reference, size_t poisoned,
                                                   const harness::Tolerance& tol, bool is_float = false) {
  harness::PackedComparison c = harness::compare_packed(device, reference, kInstance.dtype, is_float);
  if (c.padding_not_cleared > 0) {
    return ::testing::AssertionFailure() << what << ": " << c.padding_not_cleared << " padding elements not cleared";
  }
  if (c.stats.not_finite != poisoned) {
    return ::testing::AssertionFailure() << what << ": " << c.stats.not_finite << " elements not finite, expected "
                                         << poisoned << " (the long sequence's alone)";
  }
  c.stats.not_finite = 0;
  if (!harness::within(c.stats, tol)) return ::testing::AssertionFailure() << what << ": " << c.stats.describe();
  return ::testing::AssertionSuccess();
}

Status forward_on(VarlenProblem& p) {
  size_t bytes = 0;
  EXPECT_TRUE(forward_workspace_size(p.shape, &bytes).ok());
  if (p.workspace.bytes() < bytes) p.workspace = DeviceBuffer(bytes);
  return forward(harness::forward_args(p), p.workspace.get(), p.workspace.bytes(), nullptr);
}

// The next call's status, made from another thread (the record is the device's, not the thread's).
Status next_call_from_another_thread(VarlenProblem& p) {
  Status status;
  std::thread other([&] { status = forward_on(p); });
  other.join();
  return status;
}

// The status a call returns for an earlier call's fault: `code`, with every one of `words` in its message.
void expect_reported(const Status& s, const std::vector<std::string>& words,
                     StatusCode code = StatusCode::kSeqlenExceedsMax) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& w : words)
    EXPECT_NE(s.message().find(w), std::string::npos) << w << " missing: " << s.message();
}

TEST(Sm90SeqlenGuard, AForwardSequenceOverTheMaximumIsNanAloneAndTheNextCallOnAnyThreadSaysSo) {
  if (const std::string why = guard_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  VarlenProblem p = make_guard_problem(/*long_queries=*/true, /*within=*/false);
  zero(p.d_out);
  zero(p.d_lse);
  const Status s = forward_on(p);
  ASSERT_TRUE(s.ok()) << "the call itself cannot know: " << s.to_string();
  wait_or_die(nullptr, "varlen forward over its maximum");
  const int first = p.cu_seqlens_q[kLongSequence];
  EXPECT_EQ(rows_not_nan(p.d_out, p.total_q, p.shape.heads_q, first, kLongLength, &p.d_lse), 0u)
      << "every row of the long sequence, those past the maximum too, must be NaN in out and lse";
  const size_t poisoned = static_cast<size_t>(kLongLength * p.shape.heads_q * kInstance.head_dim);
  const auto tol = harness::tolerance_for(p.shape);
  EXPECT_TRUE(matches_except_poisoned("O", p.d_out, p.out, poisoned, tol));
  EXPECT_TRUE(matches_except_poisoned("LSE", p.d_lse, p.lse, static_cast<size_t>(kLongLength * p.shape.heads_q), tol,
                                      /*is_float=*/true));

  zero(p.d_out);
  expect_reported(next_call_from_another_thread(p),
                  {"varlen forward", "sequence 1 has 300 query rows", "(cu_seqlens_q[2] - cu_seqlens_q[1])",
                   "more than max_seqlen_q = 256", "out and lse were filled with NaN"});
  wait_or_die(nullptr, "the reporting call");
  EXPECT_EQ(rows_not_nan(p.d_out, p.total_q, p.shape.heads_q, 0, static_cast<int>(p.total_q)),
            static_cast<size_t>(p.total_q * p.shape.heads_q * kInstance.head_dim))
      << "the reporting call ran nothing";

  p.shape.seqlen_q = kLongLength;  // now within the maximum: the record was cleared, and this call runs
  const Status after = forward_on(p);
  EXPECT_TRUE(after.ok()) << "reported once: " << after.to_string();
  wait_or_die(nullptr, "varlen forward within its maximum");
  EXPECT_TRUE(matches_except_poisoned("O after", p.d_out, p.out, 0, tol));
}

TEST(Sm90SeqlenGuard, ABackwardSequenceOverTheKeyMaximumHasNanGradientsAloneAndTheNextCallSaysSo) {
  if (const std::string why = guard_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  VarlenProblem p = make_guard_problem(/*long_queries=*/false, /*within=*/false);
  for (Schedule schedule : {Schedule::kAscending, Schedule::kNondeterministic}) {
    SCOPED_TRACE(schedule_name(schedule));
    BackwardPlan plan;
    ASSERT_TRUE(harness::plan_backward_for(p, schedule, /*sm_margin=*/0, &plan).ok());
    if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = DeviceBuffer(plan.workspace_bytes());
    zero(p.d_dq);
    zero(p.d_dk);
    zero(p.d_dv);
    const Status s =
        backward(harness::backward_args(p, schedule), plan, p.workspace.get(), p.workspace.bytes(), nullptr);
    ASSERT_TRUE(s.ok()) << s.to_string();
    wait_or_die(nullptr, "varlen backward over its key maximum");
    const int q_first = p.cu_seqlens_q[kLongSequence], k_first = p.cu_seqlens_k[kLongSequence];
    const int q_rows = p.cu_seqlens_q[kLongSequence + 1] - q_first;
    EXPECT_EQ(rows_not_nan(p.d_dq, p.total_q, p.shape.heads_q, q_first, q_rows), 0u) << "dq";
    EXPECT_EQ(rows_not_nan(p.d_dk, p.total_k, p.shape.heads_kv, k_first, kLongLength), 0u) << "dk";
    EXPECT_EQ(rows_not_nan(p.d_dv, p.total_k, p.shape.heads_kv, k_first, kLongLength), 0u) << "dv";
    const auto tol = harness::tolerance_for(p.shape);
    const size_t kv_poisoned = static_cast<size_t>(kLongLength * p.shape.heads_kv * kInstance.head_dim);
    EXPECT_TRUE(matches_except_poisoned("dQ", p.d_dq, p.dq,
                                        static_cast<size_t>(q_rows * p.shape.heads_q * kInstance.head_dim), tol));
    EXPECT_TRUE(matches_except_poisoned("dK", p.d_dk, p.dk, kv_poisoned, tol));
    EXPECT_TRUE(matches_except_poisoned("dV", p.d_dv, p.dv, kv_poisoned, tol));

    expect_reported(next_call_from_another_thread(p),
                    {"varlen backward", "sequence 1 has 300 key rows", "(cu_seqlens_k[2] - cu_seqlens_k[1])",
                     "more than max_seqlen_k = 256", "dq, dk and dv were filled with NaN"});
    wait_or_die(nullptr, "the reporting call");
  }
  const Status after = forward_on(p);
  EXPECT_TRUE(after.ok()) << "reported once: " << after.to_string();
  wait_or_die(nullptr, "varlen forward");
  // That forward ran over the key maximum again: its report is drained, so later tests start clean.
  expect_reported(forward_on(p), {"varlen forward", "300 key rows"});
}

TEST(Sm90SeqlenGuard, KeysPastTheQueriesUnderThePromiseAreNanAloneAndReported) {
  if (const std::string why = guard_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  AttentionShape shape = gpu_testing::make_attention_shape(1, 1, 1, /*heads_q=*/4, /*heads_kv=*/2, false, kInstance);
  VarlenProblem p = harness::make_varlen_problem(shape, {{100, 100}, {200, 250}, {64, 64}}, kPaddingRows, 0x9e0u);
  p.keys_within_queries = true;  // promised, and broken by sequence 1 alone
  zero(p.d_out);
  zero(p.d_lse);
  ASSERT_TRUE(forward_on(p).ok());
  wait_or_die(nullptr, "varlen forward breaking its promise");
  const int first = p.cu_seqlens_q[kLongSequence];
  EXPECT_EQ(rows_not_nan(p.d_out, p.total_q, p.shape.heads_q, first, 200, &p.d_lse), 0u);
  EXPECT_TRUE(matches_except_poisoned("O", p.d_out, p.out,
                                      static_cast<size_t>(200 * p.shape.heads_q * kInstance.head_dim),
                                      harness::tolerance_for(p.shape)));
  expect_reported(next_call_from_another_thread(p),
                  {"sequence 1 has 250 key rows", "more than its 200 query rows", "promised keys_within_queries"});
  wait_or_die(nullptr, "the reporting call");
}

TEST(Sm90SeqlenGuard, WithinTheMaximaNothingIsNanAndNothingIsReported) {
  if (const std::string why = guard_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const bool long_queries : {true, false}) {
    VarlenProblem p = make_guard_problem(long_queries, /*within=*/true);
    zero(p.d_out);
    ASSERT_TRUE(forward_on(p).ok());
    wait_or_die(nullptr, "varlen forward");
    const auto tol = harness::tolerance_for(p.shape);
    EXPECT_TRUE(matches_except_poisoned("O", p.d_out, p.out, 0, tol));
    BackwardPlan plan;
    ASSERT_TRUE(harness::plan_backward_for(p, Schedule::kAscending, 0, &plan).ok());
    if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = DeviceBuffer(plan.workspace_bytes());
    const Status s = backward(harness::backward_args(p, Schedule::kAscending), plan, p.workspace.get(),
                              p.workspace.bytes(), nullptr);
    ASSERT_TRUE(s.ok()) << s.to_string();
    wait_or_die(nullptr, "varlen backward");
    EXPECT_TRUE(matches_except_poisoned("dQ", p.d_dq, p.dq, 0, tol));
    EXPECT_TRUE(matches_except_poisoned("dK", p.d_dk, p.dk, 0, tol));
    EXPECT_TRUE(matches_except_poisoned("dV", p.d_dv, p.dv, 0, tol));
    const Status next = forward_on(p);
    EXPECT_TRUE(next.ok()) << "nothing to report: " << next.to_string();
    wait_or_die(nullptr, "varlen forward");
  }
}

// --- offsets out of order ---------------------------------------------------------------------------------

// Uploads `offsets` as the call's cu_seqlens_q (`keys` false) or cu_seqlens_k.
void upload_offsets(VarlenProblem& p, bool keys, const std::vector<int32_t>& offsets) {
  (keys ? p.d_cu_seqlens_k : p.d_cu_seqlens_q).upload(offsets.data(), offsets.size() * sizeof(int32_t));
}

TEST(Sm90OffsetsGuard, AForwardWithDecreasingOffsetsIsNanEverywhereAndTheNextCallOnAnyThreadSaysSo) {
  if (const std::string why = guard_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  VarlenProblem p = make_guard_problem(/*long_queries=*/true, /*within=*/true);
  std::vector<int32_t> decreasing = p.cu_seqlens_q;
  decreasing[2] = decreasing[1] - 40;  // sequence 1 ends before it starts; sequence 2 overlaps sequence 0
  upload_offsets(p, /*keys=*/false, decreasing);
  zero(p.d_out);
  zero(p.d_lse);
  ASSERT_TRUE(forward_on(p).ok()) << "the call itself cannot know";
  wait_or_die(nullptr, "varlen forward with decreasing offsets");
  const int total_q = static_cast<int>(p.total_q);
  EXPECT_EQ(rows_not_nan(p.d_out, p.total_q, p.shape.heads_q, 0, total_q, &p.d_lse), 0u)
      << "every row of out and lse, the padding rows too, must be NaN";

  expect_reported(
      next_call_from_another_thread(p),
      {"varlen forward",
       "cu_seqlens_q[2] = " + std::to_string(decreasing[2]) + " < cu_seqlens_q[1] = " + std::to_string(decreasing[1]),
       "never decrease", "every row of out and lse was filled with NaN"},
      StatusCode::kCuSeqlensInvalid);
  wait_or_die(nullptr, "the reporting call");

  upload_offsets(p, /*keys=*/false, p.cu_seqlens_q);
  const Status after = forward_on(p);
  EXPECT_TRUE(after.ok()) << "reported once: " << after.to_string();
  wait_or_die(nullptr, "varlen forward with its offsets in order");
  EXPECT_TRUE(matches_except_poisoned("O after", p.d_out, p.out, 0, harness::tolerance_for(p.shape)));
  EXPECT_TRUE(forward_on(p).ok()) << "offsets in order are not reported";
  wait_or_die(nullptr, "varlen forward");
}

TEST(Sm90OffsetsGuard, ABackwardWhoseKeyOffsetsDoNotStartAtZeroOrEndPastTheTotalIsNanEverywhere) {
  if (const std::string why = guard_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  VarlenProblem p = make_guard_problem(/*long_queries=*/false, /*within=*/true);
  const std::vector<int32_t> in_order = p.cu_seqlens_k;
  std::vector<int32_t> late_start = in_order;
  late_start[0] = 5;  // rows 0..4 of dk and dv would never be written
  std::vector<int32_t> past_total = in_order;
  past_total.back() = static_cast<int32_t>(p.total_k) + 1;
  const struct {
    std::vector<int32_t> offsets;
    std::string words;
  } cases[] = {
      {late_start, "cu_seqlens_k[0] = 5, where the offsets start at 0"},
      {past_total, "cu_seqlens_k[3] = " + std::to_string(p.total_k + 1) + " > total_k = " + std::to_string(p.total_k)}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.words);
    upload_offsets(p, /*keys=*/true, c.offsets);
    BackwardPlan plan;
    ASSERT_TRUE(harness::plan_backward_for(p, Schedule::kAscending, /*sm_margin=*/0, &plan).ok());
    if (p.workspace.bytes() < plan.workspace_bytes()) p.workspace = DeviceBuffer(plan.workspace_bytes());
    zero(p.d_dq);
    zero(p.d_dk);
    zero(p.d_dv);
    const Status s = backward(harness::backward_args(p, Schedule::kAscending), plan, p.workspace.get(),
                              p.workspace.bytes(), nullptr);
    ASSERT_TRUE(s.ok()) << s.to_string();
    wait_or_die(nullptr, "varlen backward with key offsets out of order");
    EXPECT_EQ(rows_not_nan(p.d_dq, p.total_q, p.shape.heads_q, 0, static_cast<int>(p.total_q)), 0u) << "dq";
    EXPECT_EQ(rows_not_nan(p.d_dk, p.total_k, p.shape.heads_kv, 0, static_cast<int>(p.total_k)), 0u) << "dk";
    EXPECT_EQ(rows_not_nan(p.d_dv, p.total_k, p.shape.heads_kv, 0, static_cast<int>(p.total_k)), 0u) << "dv";
    upload_offsets(p, /*keys=*/true, in_order);
    expect_reported(next_call_from_another_thread(p),
                    {"varlen backward", c.words, "every row of dq, dk and dv was filled with NaN"},
                    StatusCode::kCuSeqlensInvalid);
    wait_or_die(nullptr, "the reporting call");
  }
}

// --- TMA descriptors the driver refuses ------------------------------------------------------------------

TEST(Sm90TmaDescriptor, TheLaunchersCheckRefusesExactlyWhatTheDriverRefuses) {
  if (const std::string why = testing::tma_probe_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  if (Status s = check_current_device(); !s.ok()) GTEST_SKIP() << "no Hopper GPU: " << s.message();
  struct Case {
    testing::TmaGeometry geometry;
    const char* what;
    bool refused;      // by the driver, per cuTensorMapEncodeTiled's documented rules
    const char* rule;  // what the check's reason says, when it refuses
  };
  const Case cases[] = {
      {testing::TmaGeometry::kValid, "a valid tensor", false, ""},
      {testing::TmaGeometry::kRowStridePlusOneElement, "a 514-byte row stride", true,
       "its strides.seq is not a multiple of 16 bytes"},
      {testing::TmaGeometry::kAddressPlusTwoBytes, "an address 2 bytes past a 16-byte boundary", true,
       "its address is not 16-byte aligned"},
      {testing::TmaGeometry::kBatchStrideBelowLimit, "a batch stride of 2^40 - 16 bytes", false, ""},
      {testing::TmaGeometry::kBatchStrideAtLimit, "a batch stride of 2^40 bytes", true,
       "its strides.batch is negative or not below 2^40 bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const testing::TmaVerdicts v = testing::tma_verdicts(c.geometry);
    ASSERT_EQ(v.failure, "");
    // The driver first: it confirms that the case is the geometry it is meant to be.
    EXPECT_EQ(v.driver_result == 0, !c.refused) << "cuTensorMapEncodeTiled returned CUresult " << v.driver_result;
    EXPECT_EQ(v.check, c.refused ? "q" : "")
        << "the launchers' check (rule: \"" << v.rule << "\") disagrees with cuTensorMapEncodeTiled (CUresult "
        << v.driver_result << ")";
    EXPECT_EQ(v.rule, c.rule);
  }
}

// --- CUDA graph capture as a process's first call -------------------------------------------------------

constexpr const char* kCaptureChildVariable = "DASH_CAPTURE_FIRST_CALL_CHILD";
constexpr int kCaptureChildTimeoutSeconds = 300;

TEST(CaptureFirstCallChild, AForwardAndABackwardCapturedAsTheFirstCallsReplayCorrectly) {
  if (std::getenv(kCaptureChildVariable) == nullptr) {
    GTEST_SKIP() << "runs only as CaptureFirstCall's child process (its first DASH call must be the captured one)";
  }
  // The GPU through the CUDA runtime alone, as a framework that creates the context would: no DASH call yet.
  int device = 0;
  cudaDeviceProp properties{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&properties, device) != cudaSuccess ||
      properties.major != 9 || properties.minor != 0 || !kernel_available(kInstance.head_dim, kInstance.dtype)) {
    GTEST_SKIP() << "no Hopper GPU or no kernel for head dim 128 / bf16";
  }
  harness::Problem p = harness::make_problem(
      gpu_testing::make_attention_shape(2, 300, 300, 4, 2, /*causal=*/true, kInstance), /*seed=*/0xca97u);
  // The plan for the device as described by the runtime: planning needs no DASH device query.
  DeviceInfo info;
  info.index = device;
  info.multiprocessor_count = properties.multiProcessorCount;
  info.compute_major = properties.major;
  info.compute_minor = properties.minor;
  info.name = properties.name;
  BackwardPlan plan;
  ASSERT_TRUE(plan_backward(p.shape, Schedule::kAuto, info, &plan).ok());
  size_t forward_bytes = 0;
  ASSERT_TRUE(forward_workspace_size(p.shape, &forward_bytes).ok());
  DeviceBuffer forward_workspace(forward_bytes);
  DeviceBuffer backward_workspace(plan.workspace_bytes());
  p.d_out.poison();
  p.d_dq.poison();
  p.d_dk.poison();
  p.d_dv.poison();
  cudaStream_t stream = nullptr;
  harness::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  harness::check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  const Status f = forward(harness::forward_args(p), forward_workspace.get(), forward_workspace.bytes(), stream);
  const Status b = backward(harness::backward_args(p, Schedule::kAuto), plan, backward_workspace.get(),
                            backward_workspace.bytes(), stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  ASSERT_TRUE(f.ok()) << "captured first forward: " << f.to_string();
  ASSERT_TRUE(b.ok()) << "captured first backward: " << b.to_string();
  ASSERT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
  cudaGraphExec_t exec = nullptr;
  harness::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  harness::check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  wait_or_die(stream, "the captured graph");

  const auto tol = harness::tolerance_for(p.shape);
  EXPECT_TRUE(harness::within(harness::compare(p.d_out, p.out, kInstance.dtype), tol)) << "O";
  EXPECT_TRUE(harness::within(harness::compare(p.d_dq, p.dq, kInstance.dtype), tol)) << "dQ";
  EXPECT_TRUE(harness::within(harness::compare(p.d_dk, p.dk, kInstance.dtype), tol)) << "dK";
  EXPECT_TRUE(harness::within(harness::compare(p.d_dv, p.dv, kInstance.dtype), tol)) << "dV";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CaptureFirstCall, AProcessWhoseFirstCallsAreCapturedRunsThem) {
  if (std::string why = gpu_testing::skip_reason(kInstance); !why.empty()) GTEST_SKIP() << why;
  gpu_testing::expect_child_passes(std::string(kCaptureChildVariable) + "=1", kCaptureChildTimeoutSeconds,
                                   "CaptureFirstCallChild.*");
}

}  // namespace
}  // namespace dash
