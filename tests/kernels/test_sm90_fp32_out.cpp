// GPU tests of the forward with a float32 out (ForwardArgs::out_fp32, dash/types.hpp), through the public API: the
// same call run twice, with out in the input dtype and in float32, each on an out poisoned with NaN first. The float32
// out must be written in every element (no NaN left: the epilogue's fragment stores reach every row before seqlen_q,
// and a varlen batch's padding rows are cleared to 0 in float32), and rounded to the input dtype (round to nearest
// even, as the kernels round) it must be bit for bit the other call's out: the same kernel and accumulation, only the
// last rounding left out. The LSE must be bitwise the same too. Cases: dense batches with ragged lengths (a partial
// last query tile), causal, full (at d = 128 a long full-mask batch takes the 128x176 tiles, which store O from the
// fragment rather than through the staging tile), a sliding window with its own kernels, GQA; varlen batches with
// lengths 0, 1, just under and over a tile, padding rows after the last sequence; every head dim and dtype compiled.
// Without a Hopper GPU or the instance every test skips and says why.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
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

const Instance kInstances[] = {{64, DType::kBF16},  {64, DType::kFP16},  {96, DType::kBF16},  {96, DType::kFP16},
                               {128, DType::kBF16}, {128, DType::kFP16}, {192, DType::kBF16}, {192, DType::kFP16},
                               {256, DType::kBF16}, {256, DType::kFP16}};

// What two forwards of one call wrote: the out in the input dtype (its bits) and in float32, and both LSEs.
struct TwoOuts {
  std::vector<uint16_t> out;
  std::vector<float> out_fp32;
  std::vector<uint32_t> lse, lse_fp32;
};

std::vector<uint32_t> lse_bits(const DeviceBuffer& buffer, size_t count) {
  std::vector<uint32_t> bits(count);
  buffer.download(bits.data(), count * sizeof(float));
  return bits;
}

// Runs `args` (out in the input dtype at `out`, poisoned first), then the same call with a float32 out of the same
// element strides (poisoned first), each with a poisoned LSE, and reads back what both wrote.
TwoOuts run_both(ForwardArgs args, DeviceBuffer& out, DeviceBuffer& lse, size_t out_elements, size_t lse_elements) {
  size_t bytes = 0;
  EXPECT_TRUE(forward_workspace_size(args.shape, &bytes).ok());
  DeviceBuffer workspace(bytes);
  TwoOuts result;
  out.poison();
  lse.poison();
  Status s = forward(args, workspace.get(), workspace.bytes(), nullptr);
  EXPECT_TRUE(s.ok()) << s.to_string();
  wait_or_die(nullptr, "forward");
  result.out.resize(out_elements);
  out.download(result.out.data(), out_elements * sizeof(uint16_t));
  result.lse = lse_bits(lse, lse_elements);

  DeviceBuffer out_fp32(out_elements * sizeof(float));
  out_fp32.poison();
  lse.poison();
  args.out.data = out_fp32.get();
  args.out_fp32 = true;
  s = forward(args, workspace.get(), workspace.bytes(), nullptr);
  EXPECT_TRUE(s.ok()) << s.to_string();
  wait_or_die(nullptr, "forward with a float32 out");
  result.out_fp32.resize(out_elements);
  out_fp32.download(result.out_fp32.data(), out_elements * sizeof(float));
  result.lse_fp32 = lse_bits(lse, lse_elements);
  return result;
}

// The float32 out fully written and, rounded to `dtype`, bitwise the other out; the LSEs bitwise equal.
void expect_rounds_to_the_same_bits(const TwoOuts& r, DType dtype) {
  size_t unwritten = 0, differing = 0, first_differing = r.out.size();
  for (size_t i = 0; i < r.out.size(); ++i) {
    if (std::isnan(r.out_fp32[i])) {
      ++unwritten;
    } else if (harness::to_bits(r.out_fp32[i], dtype) != r.out[i]) {
      if (differing++ == 0) first_differing = i;
    }
  }
  EXPECT_EQ(unwritten, 0u) << "float32 out elements left poisoned (NaN) of " << r.out.size();
  EXPECT_EQ(differing, 0u) << "float32 out elements whose rounding differs from the " << dtype_name(dtype)
                           << " out; the first at " << first_differing << ": "
                           << (first_differing < r.out.size() ? r.out_fp32[first_differing] : 0.0f) << " vs "
                           << (first_differing < r.out.size() ? harness::from_bits(r.out[first_differing], dtype)
                                                              : 0.0f);
  EXPECT_TRUE(r.lse == r.lse_fp32) << "the LSE differs between the two calls";
}

struct DenseCase {
  const char* name;
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  bool causal;
  int64_t window_left, window_right;
};

const DenseCase kDenseCases[] = {
    {"ragged_causal_gqa", 2, 333, 333, 4, 2, true, -1, -1},
    {"ragged_full_q_ne_k", 1, 200, 517, 4, 4, false, -1, -1},
    {"one_row", 3, 1, 70, 2, 1, false, -1, -1},
    // Past 2048 keys under the full mask: the wide 128x176 tiles at d = 128 (O from the fragment), tall at d = 64.
    {"long_full", 1, 2100, 2100, 2, 2, false, -1, -1},
    {"window", 2, 700, 700, 4, 2, false, 100, 20},
};

class Sm90Fp32Out : public ::testing::TestWithParam<std::tuple<Instance, DenseCase>> {};

TEST_P(Sm90Fp32Out, RoundsToTheBitsOfTheInputDtypeOutAndWritesEveryElement) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  AttentionShape shape =
      gpu_testing::make_attention_shape(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.causal, inst);
  shape.window_left = c.window_left;
  shape.window_right = c.window_right;
  harness::Problem p = harness::make_problem(shape, /*seed=*/0xf32000u + inst.head_dim, /*with_reference=*/false);
  const size_t lse_elements = static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q);
  const TwoOuts r = run_both(harness::forward_args(p), p.d_out, p.d_lse, p.q_elements(), lse_elements);
  expect_rounds_to_the_same_bits(r, inst.dtype);
}

std::string dense_name(const ::testing::TestParamInfo<std::tuple<Instance, DenseCase>>& info) {
  const auto& [inst, c] = info.param;
  return std::string(c.name) + "_hdim" + std::to_string(inst.head_dim) + "_" + dtype_name(inst.dtype);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Fp32Out,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::ValuesIn(kDenseCases)),
                         dense_name);

// Rows after the last sequence of every packed tensor: the float32 out's must be cleared to 0 as the other's are.
constexpr int64_t kPaddingRows = 37;

class Sm90Fp32OutVarlen : public ::testing::TestWithParam<std::tuple<Instance, bool>> {};

TEST_P(Sm90Fp32OutVarlen, RoundsToTheBitsOfTheInputDtypeOutAndClearsThePadding) {
  const auto& [inst, causal] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  if (!varlen_kernel_available(inst.head_dim, inst.dtype)) {
    GTEST_SKIP() << "the varlen kernels are not compiled in this build (DASH_VARLEN_KERNELS)";
  }
  const AttentionShape base = gpu_testing::make_attention_shape(1, 1, 1, 4, 2, causal, inst);
  const std::vector<SequenceLengths> lengths = {{0, 0}, {1, 1}, {127, 127}, {129, 129}, {300, 300}, {64, 200}};
  harness::VarlenProblem p = harness::make_varlen_problem(base, lengths, kPaddingRows, /*seed=*/0xf32100u,
                                                          /*max_lengths=*/{1, 1}, /*with_reference=*/false);
  const TwoOuts r = run_both(harness::forward_args(p), p.d_out, p.d_lse, p.q_elements(), p.lse_elements());
  expect_rounds_to_the_same_bits(r, inst.dtype);
  // The padding rows are 0 (and the LSE's -inf, which the bitwise LSE comparison covers).
  const size_t row = static_cast<size_t>(base.heads_q * base.head_dim);
  const size_t padding_start = static_cast<size_t>(p.cu_seqlens_q.back()) * row;
  for (size_t i = padding_start; i < r.out_fp32.size(); ++i) {
    ASSERT_EQ(r.out_fp32[i], 0.0f) << "padding element " << i << " of the float32 out not cleared";
  }
}

std::string varlen_name(const ::testing::TestParamInfo<std::tuple<Instance, bool>>& info) {
  const auto& [inst, causal] = info.param;
  return std::string(causal ? "causal" : "full") + "_hdim" + std::to_string(inst.head_dim) + "_" +
         dtype_name(inst.dtype);
}

INSTANTIATE_TEST_SUITE_P(Lengths, Sm90Fp32OutVarlen,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::Bool()), varlen_name);

}  // namespace
}  // namespace dash
