// The merge of one block's partial attention result (out, LSE over a block of keys) into running float32
// accumulators, in one launch (MergeArgs, dash/types.hpp, states the formula). Context parallelism merges one block
// per ring step and call; as torch elementwise ops that was about seven launches and as many passes over memory.
//
// Invariants:
// - Deterministic: every accumulator row is read and written by one warp alone, with no atomics, so the bits depend
//   only on the inputs. The warp reads the row's two LSEs before any lane writes (its lane 0 writes the new LSE
//   after the row's out), so no thread reads an LSE another has already replaced.
// - A weight whose LSE is -inf is 0 rather than exp(-inf - -inf) = NaN: an empty accumulator row takes the block as
//   it is, and a row that is empty on both sides stays out 0, LSE -inf. A NaN LSE (a poisoned input) stays NaN.
// - The kernel writes only accumulator rows in [0, seqlen): an index outside is skipped (MergeArgs::row_index).
// Plain CUDA: no sm90 instruction, but built with the kernels, so a build without them has no launcher
// (no_kernels.cpp).
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/kernel_params.hpp"

namespace dash::kernels {
namespace {

constexpr int kWarpThreads = 32;
constexpr int kMergeThreads = 256;  // 8 warps, one accumulator row each
constexpr int kRowsPerBlock = kMergeThreads / kWarpThreads;

// MergeArgs as the device reads it: its pointers typed, its strides as they are (element strides, int64 everywhere:
// the host bounds every offset within int64).
struct MergeDeviceArgs {
  const float* part_out;
  Strides part_out_strides;  // batch, row (seq), head
  const float* part_lse;
  LseStrides part_lse_strides;
  float* acc_out;
  Strides acc_out_strides;
  float* acc_lse;
  LseStrides acc_lse_strides;
  const int32_t* row_index;
  int64_t row_offset;
  int64_t rows, seqlen, heads, head_dim;
  int64_t block_rows;  // batch * rows * heads: the (batch, row, head) rows of the block
};

// exp(lse - merged), 0 where lse is -inf (which also covers merged = -inf, when both sides are -inf).
__device__ __forceinline__ float merge_weight(float lse, float merged) {
  return lse == -INFINITY ? 0.0f : expf(lse - merged);
}

// logaddexp in its stable form: equal infinities stay as they are (avoiding inf - inf), else
// max + log1p(exp(-|a - b|)). A NaN on either side gives NaN (fmaxf would drop it, the log1p term keeps it).
__device__ __forceinline__ float log_add_exp(float a, float b) {
  if (isinf(a) && a == b) return a;
  const float larger = fmaxf(a, b);
  return larger + log1pf(expf(-fabsf(a - b)));
}

__global__ void __launch_bounds__(kMergeThreads) merge_partial_kernel(const MergeDeviceArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpThreads;
  if (row >= a.block_rows) return;  // uniform over the warp
  const int lane = static_cast<int>(threadIdx.x % kWarpThreads);
  const int64_t head = row % a.heads;
  const int64_t r = (row / a.heads) % a.rows;
  const int64_t b = row / (a.heads * a.rows);
  const int64_t s = a.row_index != nullptr ? static_cast<int64_t>(a.row_index[r]) : a.row_offset + r;
  if (s < 0 || s >= a.seqlen) return;  // uniform over the warp: a broken index is skipped, never written through
  float* acc_lse = a.acc_lse + b * a.acc_lse_strides.batch + head * a.acc_lse_strides.head + s * a.acc_lse_strides.seq;
  const float lse_acc = *acc_lse;
  const float lse_part =
      a.part_lse[b * a.part_lse_strides.batch + head * a.part_lse_strides.head + r * a.part_lse_strides.seq];
  const float merged = log_add_exp(lse_acc, lse_part);
  const float weight_acc = merge_weight(lse_acc, merged);
  const float weight_part = merge_weight(lse_part, merged);
  float* acc = a.acc_out + b * a.acc_out_strides.batch + s * a.acc_out_strides.seq + head * a.acc_out_strides.head;
  const float* part =
      a.part_out + b * a.part_out_strides.batch + r * a.part_out_strides.seq + head * a.part_out_strides.head;
  for (int64_t d = lane; d < a.head_dim; d += kWarpThreads) {
    // One rounding fixed by the code, not by the compiler's contraction choice: acc * w_acc, then fused.
    acc[d] = fmaf(part[d], weight_part, acc[d] * weight_acc);
  }
  __syncwarp();  // every lane has read lse_acc before it is replaced
  if (lane == 0) *acc_lse = merged;
}

int launch_merge_partial(const MergeArgs& args, cudaStream_t stream) {
  MergeDeviceArgs a{};
  a.part_out = static_cast<const float*>(args.part_out.data);
  a.part_out_strides = args.part_out.strides;
  a.part_lse = args.part_lse;
  a.part_lse_strides = args.part_lse_strides;
  a.acc_out = static_cast<float*>(args.acc_out.data);
  a.acc_out_strides = args.acc_out.strides;
  a.acc_lse = args.acc_lse;
  a.acc_lse_strides = args.acc_lse_strides;
  a.row_index = args.row_index;
  a.row_offset = args.row_offset;
  a.rows = args.rows;
  a.seqlen = args.seqlen;
  a.heads = args.heads;
  a.head_dim = args.head_dim;
  a.block_rows = args.batch * args.rows * args.heads;
  // validate(MergeArgs) bounds block_rows, so the grid fits CUDA's x dimension.
  const auto blocks = static_cast<unsigned>((a.block_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  merge_partial_kernel<<<blocks, kMergeThreads, 0, stream>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

MergeLauncher merge_partial_launcher() { return launch_merge_partial; }

}  // namespace dash::kernels
