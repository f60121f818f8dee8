// The last kernel of every varlen call: it defines the rows of the packed outputs that the call's other kernels do
// not vouch for, so that no element a call returns is uninitialized or silently wrong.
//  - Padding rows, the rows of the packed tensors past the last sequence, [cu_seqlens[batch], total): 0 in out, dq,
//    dk and dv and -inf in the LSE (a row that sees no key). The caller need not clear a whole tensor before each
//    call (a memset of O alone took about a fifth of a short forward's time).
//  - Sequences longer than the call's maxima (max_seqlen_q, max_seqlen_k), or with more keys than queries where the
//    call promised keys_within_queries: the kernels are planned, gridded and clamped to the maxima and the promise
//    (packed_sequence), so such a sequence's results are wrong and its rows past the maximum never written. Every row of it, in every output tensor of the call, becomes NaN (the LSE too), and the first
//    such sequence is written to the device's fault record (kernels::FaultRecord), which the host reports at its
//    next call on the device. cu_seqlens stay on the device: the host could not check them without a copy and a
//    synchronization per call, and the call would no longer be CUDA-graph capturable.
//  - Offsets out of order: cu_seqlens_q or cu_seqlens_k not starting at 0, decreasing, or ending past its total. The
//    sequences' rows are then no partition of the packed rows: rows before the first offset are never written, and
//    the rows of overlapping sequences are written by both. Every row of every output tensor of the call becomes NaN
//    (the LSE too), and the first entry out of order is recorded (kCuSeqlensInvalid); the checks above are skipped.
//
// Cost: no launch of its own (the padding rows needed this one), and per 256 sequences 8 loads of cu_seqlens per
// thread and two __syncthreads_or; the NaN fills run only for a batch that breaks the contract.
//
// Invariants: each offset read is clamped to [0, total] and each end to [offset, total], as packed_sequence clamps
// them, so the kernel never leaves the tensors whatever cu_seqlens hold; every block checks every sequence, so each
// fills its share of a long sequence's rows without waiting on another block; one thread of the grid (block (0, 0),
// thread 0) writes the record: the first entry out of order, or else the lowest-numbered sequence over a maximum.
// Dim stride 1 (the API checks it).
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "dash/types.hpp"
#include "kernels/kernel_params.hpp"

namespace dash::sm90 {

// A packed (total, heads, head_dim) tensor and the LSE rows (heads, total) beside it, if any. `keys`: its rows are
// numbered by cu_seqlens_k (dk, dv), not cu_seqlens_q (out, dq).
template <class Element>
struct PaddingRows {
  Element* data = nullptr;
  int64_t row_stride = 0;   // elements
  int64_t head_stride = 0;  // elements
  int heads = 0;
  int head_dim = 0;
  int total = 0;
  bool keys = false;
  float* lse = nullptr;  // (heads, total) or null
};

// The padding rows of up to three tensors (a backward's dq, dk and dv), cleared by one launch: blockIdx.y picks the
// tensor. Each launch saved is a few microseconds of a short call.
inline constexpr int kMaxPaddedTensors = 3;
template <class Element>
struct PaddingRowsSet {
  PaddingRows<Element> tensors[kMaxPaddedTensors];
};

// What the kernel checks every sequence against, and where it says that one broke it.
struct SequenceGuard {
  const int32_t* cu_seqlens_q = nullptr;  // batch + 1 offsets each (device memory)
  const int32_t* cu_seqlens_k = nullptr;
  int batch = 0;
  int total_q = 0;
  int total_k = 0;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
  bool keys_within_queries = false;       // the call's promise: seqlen_k <= seqlen_q per sequence
  kernels::FaultRecord* fault = nullptr;  // host-mapped, the device's
  kernels::FaultPass pass = kernels::FaultPass::kForward;
};

inline constexpr int kPaddingThreads = 256;
inline constexpr int kPaddingBlocks = 64;  // enough for the few padding rows a batch has; the loop strides past it

__device__ __forceinline__ int clamp_row(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Sequence b's rows as cu_seqlens give them: offsets and lengths clamped to the packed tensors as packed_sequence
// clamps them, but not to the maxima.
struct SequenceRows {
  int q_offset, seqlen_q, k_offset, seqlen_k;
  __device__ bool over_maximum(const SequenceGuard& g) const {
    return seqlen_q > g.max_seqlen_q || seqlen_k > g.max_seqlen_k || (g.keys_within_queries && seqlen_k > seqlen_q);
  }
};

__device__ __forceinline__ SequenceRows sequence_rows(const SequenceGuard& g, int b) {
  const int q_offset = clamp_row(g.cu_seqlens_q[b], 0, g.total_q);
  const int k_offset = clamp_row(g.cu_seqlens_k[b], 0, g.total_k);
  return {q_offset, clamp_row(g.cu_seqlens_q[b + 1], q_offset, g.total_q) - q_offset, k_offset,
          clamp_row(g.cu_seqlens_k[b + 1], k_offset, g.total_k) - k_offset};
}

// Rows [first, last) of `rows` (each head, each column) become `value`, and their LSE entries `lse_value`; the grid's
// x blocks share them.
template <class Element>
__device__ void fill_rows(const PaddingRows<Element>& rows, int first, int last, Element value, float lse_value) {
  const int64_t row_elements = static_cast<int64_t>(rows.heads) * rows.head_dim;
  const int64_t count = static_cast<int64_t>(last - first) * row_elements;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = first + i / row_elements;
    const int64_t head = (i % row_elements) / rows.head_dim;
    const int64_t column = i % rows.head_dim;
    rows.data[row * rows.row_stride + head * rows.head_stride + column] = value;
    if (rows.lse != nullptr && column == 0) rows.lse[head * rows.total + row] = lse_value;
  }
}

// Whether offsets[i], the entry after `previous` (i > 0) of an array whose rows end at `total`, breaks the order:
// offsets[0] = 0, never decreasing, at most total.
__device__ __forceinline__ bool offset_out_of_order(int i, int32_t value, int32_t previous, int total) {
  return i == 0 ? value != 0 : value < previous || value > total;
}

// Whether the entries of sequence b's end, cu_seqlens_q[b + 1] and cu_seqlens_k[b + 1], or for b = 0 also the
// arrays' first entries, break the order.
__device__ __forceinline__ bool sequence_out_of_order(const SequenceGuard& g, int b) {
  const int32_t* q = g.cu_seqlens_q;
  const int32_t* k = g.cu_seqlens_k;
  return (b == 0 && (q[0] != 0 || k[0] != 0)) || offset_out_of_order(b + 1, q[b + 1], q[b], g.total_q) ||
         offset_out_of_order(b + 1, k[b + 1], k[b], g.total_k);
}

// Fills the device's record with the first entry out of order, unless it holds an unreported fault. One thread; it
// runs only for a batch that breaks the order.
__device__ inline void record_offsets_out_of_order(const SequenceGuard& g) {
  volatile kernels::FaultRecord* record = g.fault;
  if (record->kind != kernels::FaultKind::kNone) return;
  for (int i = 0; i <= g.batch; ++i) {
    for (int keys = 0; keys < 2; ++keys) {
      const int32_t* offsets = keys ? g.cu_seqlens_k : g.cu_seqlens_q;
      const int total = keys ? g.total_k : g.total_q;
      const int32_t previous = i > 0 ? offsets[i - 1] : 0;
      if (!offset_out_of_order(i, offsets[i], previous, total)) continue;
      record->pass = g.pass;
      record->offsets_of_keys = keys;
      record->offsets_index = i;
      record->offsets_value = offsets[i];
      record->offsets_previous = previous;
      record->offsets_total = total;
      __threadfence_system();
      record->kind = kernels::FaultKind::kCuSeqlensInvalid;
      return;
    }
  }
}

// Fills the device's record with sequence b, unless it holds an unreported fault.
__device__ __forceinline__ void record_sequence_over_maximum(const SequenceGuard& g, int b, const SequenceRows& s) {
  volatile kernels::FaultRecord* record = g.fault;
  if (record->kind != kernels::FaultKind::kNone) return;
  record->pass = g.pass;
  record->sequence = b;
  record->seqlen_q = s.seqlen_q;
  record->seqlen_k = s.seqlen_k;
  record->max_seqlen_q = g.max_seqlen_q;
  record->max_seqlen_k = g.max_seqlen_k;
  record->keys_within_queries = g.keys_within_queries ? 1 : 0;
  __threadfence_system();
  record->kind = kernels::FaultKind::kSeqlenExceedsMax;
}

template <class Element>
__global__ void __launch_bounds__(kPaddingThreads)
    finish_varlen_rows_kernel(const PaddingRowsSet<Element> set, const SequenceGuard guard) {
  const PaddingRows<Element>& rows = set.tensors[blockIdx.y];
  const bool reports = blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0;
  // Uniform over the grid: every block checks every sequence.
  bool out_of_order = false;
  for (int first = 0; first < guard.batch && !out_of_order; first += kPaddingThreads) {
    const int b = first + static_cast<int>(threadIdx.x);
    out_of_order = __syncthreads_or(b < guard.batch && sequence_out_of_order(guard, b));
  }
  if (out_of_order) {
    fill_rows(rows, 0, rows.total, Element(NAN), NAN);
    if (reports) record_offsets_out_of_order(guard);
    return;
  }

  const int32_t* cu_seqlens = rows.keys ? guard.cu_seqlens_k : guard.cu_seqlens_q;
  fill_rows(rows, clamp_row(cu_seqlens[guard.batch], 0, rows.total), rows.total, Element(0.0f), -INFINITY);

  bool reported = false;
  for (int first = 0; first < guard.batch; first += kPaddingThreads) {
    const int b = first + static_cast<int>(threadIdx.x);
    // Uniform over the block: every thread takes the same chunks, and the fill below only when one is over.
    if (!__syncthreads_or(b < guard.batch && sequence_rows(guard, b).over_maximum(guard))) continue;
    const int end = first + kPaddingThreads < guard.batch ? first + kPaddingThreads : guard.batch;
    for (int over = first; over < end; ++over) {
      const SequenceRows s = sequence_rows(guard, over);
      if (!s.over_maximum(guard)) continue;
      const int offset = rows.keys ? s.k_offset : s.q_offset;
      fill_rows(rows, offset, offset + (rows.keys ? s.seqlen_k : s.seqlen_q), Element(NAN), NAN);
      if (reports && !reported) {
        record_sequence_over_maximum(guard, over, s);
        reported = true;
      }
    }
  }
}

// The rows of `tensor`, packed (total, heads, head_dim); `keys` for a tensor numbered by cu_seqlens_k; `lse`,
// (heads, total), or null.
template <class Element>
PaddingRows<Element> padding_rows(const MutableTensorRef& tensor, int64_t heads, int head_dim, int64_t total, bool keys,
                                  float* lse = nullptr) {
  return PaddingRows<Element>{static_cast<Element*>(tensor.data),
                              tensor.strides.seq,
                              tensor.strides.head,
                              static_cast<int>(heads),
                              head_dim,
                              static_cast<int>(total),
                              keys,
                              lse};
}

// The guard of a varlen call with `shape`'s maxima and the batch `varlen`.
inline SequenceGuard sequence_guard(const AttentionShape& shape, const VarlenBatch& varlen, kernels::FaultRecord* fault,
                                    kernels::FaultPass pass) {
  return SequenceGuard{varlen.cu_seqlens_q,
                       varlen.cu_seqlens_k,
                       static_cast<int>(shape.batch),
                       static_cast<int>(varlen.total_q),
                       static_cast<int>(varlen.total_k),
                       static_cast<int>(shape.seqlen_q),
                       static_cast<int>(shape.seqlen_k),
                       varlen.keys_within_queries,
                       fault,
                       pass};
}

// Clears the padding rows of every tensor of `tensors` and poisons the sequences over the maxima, on `stream`, in one
// launch, after the call's kernels that write the sequences' rows.
template <class Element, size_t kTensors>
cudaError_t finish_varlen_rows(const PaddingRows<Element> (&tensors)[kTensors], const SequenceGuard& guard,
                               cudaStream_t stream) {
  static_assert(kTensors >= 1 && kTensors <= kMaxPaddedTensors, "one launch finishes 1 to kMaxPaddedTensors tensors");
  PaddingRowsSet<Element> set{};
  for (size_t i = 0; i < kTensors; ++i) set.tensors[i] = tensors[i];
  finish_varlen_rows_kernel<Element><<<dim3(kPaddingBlocks, kTensors), kPaddingThreads, 0, stream>>>(set, guard);
  return cudaGetLastError();
}

}  // namespace dash::sm90
