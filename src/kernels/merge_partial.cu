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
// - A row_index is checked after the merge, in stream order (check_row_index_kernel): an index outside [0, seqlen) or
//   naming a row twice fills both accumulators with NaN and fills the device's fault record (kRowIndexInvalid). The
//   merge alone cannot tell: its warps see one row each.
// Plain CUDA: no sm90 instruction, but built with the kernels, so a build without them has no launcher
// (no_kernels.cpp).
#include <climits>
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/kernel_params.hpp"

namespace dash::kernels {
namespace {

constexpr int kWarpThreads = 32;
constexpr int kMergeThreads = 256;  // 8 warps, one accumulator row each
constexpr int kRowsPerBlock = kMergeThreads / kWarpThreads;
// The row_index check: one CTA, one bit of shared memory per accumulator row. validate(MergeArgs) bounds seqlen by
// the attention calls' 2^20 rows, 128 KiB of bits, within the 227 KiB a CTA may use; past the 48 KiB a launch gets
// without opting in (more than 393,216 rows) the kernel opts in.
constexpr int kCheckThreads = 1024;
constexpr int kBitsPerWord = 32;
constexpr int64_t kSharedBytesWithoutOptIn = 48 * 1024;

// MergeArgs as the device reads it: its pointers typed, its strides as they are (element strides, int64 everywhere:
// the host bounds every offset within int64). The accumulators' addressing is accumulator_row and accumulator_lse,
// for the merge and the check alike.
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
  int64_t batch, rows, seqlen, heads, head_dim;
  int64_t block_rows;  // batch * rows * heads: the (batch, row, head) rows of the block
};

// Accumulator row s of (batch b, head h): its head_dim values, and its LSE.
__device__ __forceinline__ float* accumulator_row(const MergeDeviceArgs& a, int64_t b, int64_t s, int64_t h) {
  return a.acc_out + b * a.acc_out_strides.batch + s * a.acc_out_strides.seq + h * a.acc_out_strides.head;
}
__device__ __forceinline__ float* accumulator_lse(const MergeDeviceArgs& a, int64_t b, int64_t s, int64_t h) {
  return a.acc_lse + b * a.acc_lse_strides.batch + h * a.acc_lse_strides.head + s * a.acc_lse_strides.seq;
}

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
  float* acc_lse = accumulator_lse(a, b, s, head);
  const float lse_acc = *acc_lse;
  const float lse_part =
      a.part_lse[b * a.part_lse_strides.batch + head * a.part_lse_strides.head + r * a.part_lse_strides.seq];
  const float merged = log_add_exp(lse_acc, lse_part);
  const float weight_acc = merge_weight(lse_acc, merged);
  const float weight_part = merge_weight(lse_part, merged);
  float* acc = accumulator_row(a, b, s, head);
  const float* part =
      a.part_out + b * a.part_out_strides.batch + r * a.part_out_strides.seq + head * a.part_out_strides.head;
  for (int64_t d = lane; d < a.head_dim; d += kWarpThreads) {
    // One rounding fixed by the code, not by the compiler's contraction choice: acc * w_acc, then fused.
    acc[d] = fmaf(part[d], weight_part, acc[d] * weight_acc);
  }
  __syncwarp();  // every lane has read lse_acc before it is replaced
  if (lane == 0) *acc_lse = merged;
}

// Fills the device's record with block row `row` of the index, unless it holds an unreported fault.
__device__ void record_invalid_row_index(const MergeDeviceArgs& a, int row, FaultRecord* fault) {
  volatile FaultRecord* record = fault;
  if (record->kind != FaultKind::kNone) return;
  const int32_t index = a.row_index[row];
  record->merge_row = row;
  record->merge_row_index = index;
  record->merge_seqlen = static_cast<int>(a.seqlen);
  record->merge_row_repeated = index >= 0 && index < a.seqlen ? 1 : 0;
  __threadfence_system();
  record->kind = FaultKind::kRowIndexInvalid;
}

// Checks a.row_index after the merge: every index in [0, seqlen), none named twice (a bitmap of the accumulator rows
// in shared memory, each bit set by the first block row that names it). A failed check cannot say which accumulator
// row lost a block row, or took two at once from racing warps, so it fills both accumulators with NaN and records
// the lowest failing block row.
__global__ void __launch_bounds__(kCheckThreads) check_row_index_kernel(const MergeDeviceArgs a, FaultRecord* fault) {
  extern __shared__ uint32_t named[];
  __shared__ int first_failing_row;
  const int64_t words = (a.seqlen + kBitsPerWord - 1) / kBitsPerWord;
  for (int64_t w = threadIdx.x; w < words; w += kCheckThreads) named[w] = 0;
  if (threadIdx.x == 0) first_failing_row = INT_MAX;
  __syncthreads();
  for (int64_t r = threadIdx.x; r < a.rows; r += kCheckThreads) {
    const int32_t index = a.row_index[r];
    bool fails = index < 0 || index >= a.seqlen;
    if (!fails) {
      const uint32_t bit = 1u << (index % kBitsPerWord);
      fails = (atomicOr(&named[index / kBitsPerWord], bit) & bit) != 0;
    }
    if (fails) atomicMin(&first_failing_row, static_cast<int>(r));
  }
  __syncthreads();
  const int failing_row = first_failing_row;
  if (failing_row == INT_MAX) return;  // uniform over the CTA
  if (threadIdx.x == 0) record_invalid_row_index(a, failing_row, fault);
  const int64_t acc_rows = a.batch * a.seqlen * a.heads;
  for (int64_t row = threadIdx.x; row < acc_rows; row += kCheckThreads) {
    const int64_t head = row % a.heads;
    const int64_t s = (row / a.heads) % a.seqlen;
    const int64_t b = row / (a.heads * a.seqlen);
    float* acc = accumulator_row(a, b, s, head);
    for (int64_t d = 0; d < a.head_dim; ++d) acc[d] = NAN;
    *accumulator_lse(a, b, s, head) = NAN;
  }
}

// The check's launch: a bitmap past what a launch gets without opting in needs the kernel's opt-in, a host-side
// attribute (allowed while a stream is captured), set only then.
cudaError_t launch_row_index_check(const MergeDeviceArgs& a, FaultRecord* fault, cudaStream_t stream) {
  const int64_t bitmap_bytes = (a.seqlen + kBitsPerWord - 1) / kBitsPerWord * static_cast<int64_t>(sizeof(uint32_t));
  if (bitmap_bytes > kSharedBytesWithoutOptIn) {
    if (cudaError_t e = cudaFuncSetAttribute(check_row_index_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bitmap_bytes));
        e != cudaSuccess) {
      return e;
    }
  }
  check_row_index_kernel<<<1, kCheckThreads, static_cast<size_t>(bitmap_bytes), stream>>>(a, fault);
  return cudaGetLastError();
}

int launch_merge_partial(const MergeArgs& args, FaultRecord* fault, cudaStream_t stream) {
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
  a.batch = args.batch;
  a.rows = args.rows;
  a.seqlen = args.seqlen;
  a.heads = args.heads;
  a.head_dim = args.head_dim;
  a.block_rows = args.batch * args.rows * args.heads;
  // validate(MergeArgs) bounds block_rows, so the grid fits CUDA's x dimension.
  const auto blocks = static_cast<unsigned>((a.block_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  merge_partial_kernel<<<blocks, kMergeThreads, 0, stream>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || a.row_index == nullptr) return static_cast<int>(e);
  return static_cast<int>(launch_row_index_check(a, fault, stream));
}

}  // namespace

MergeLauncher merge_partial_launcher() { return launch_merge_partial; }

}  // namespace dash::kernels
