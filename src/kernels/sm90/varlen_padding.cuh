// The padding rows of a packed varlen batch: the rows of the packed tensors past the last sequence,
// [cu_seqlens[batch], total). The varlen calls write them, 0 in out, dq, dk and dv and -inf in the LSE (a row that
// sees no key), so that every element a call returns is defined without the caller clearing the whole tensor
// before each call (a memset of O alone took about a fifth of a short forward's time).
//
// Invariants: cu_seqlens[batch] is read on the device, clamped to [0, total] as packed_sequence clamps it, so the
// kernel writes only rows no sequence holds and never leaves the tensor, whatever cu_seqlens hold; without padding
// rows it writes nothing and costs its launch, one per call (a backward's three tensors share it). Dim stride 1 (the
// API checks it).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "dash/types.hpp"

namespace dash::sm90 {

// A packed (total, heads, head_dim) tensor and the LSE rows (heads, total) beside it, if any.
template <class Element>
struct PaddingRows {
  Element* data = nullptr;
  int64_t row_stride = 0;   // elements
  int64_t head_stride = 0;  // elements
  int heads = 0;
  int head_dim = 0;
  int total = 0;
  const int32_t* sequences_end = nullptr;  // &cu_seqlens[batch]
  float* lse = nullptr;                    // (heads, total) or null
};

// The padding rows of up to three tensors (a backward's dq, dk and dv), cleared by one launch: blockIdx.y picks the
// tensor. Each launch saved is a few microseconds of a short call.
inline constexpr int kMaxPaddedTensors = 3;
template <class Element>
struct PaddingRowsSet {
  PaddingRows<Element> tensors[kMaxPaddedTensors];
};

inline constexpr int kPaddingThreads = 256;
inline constexpr int kPaddingBlocks = 64;  // enough for the few padding rows a batch has; the loop strides past it

template <class Element>
__global__ void __launch_bounds__(kPaddingThreads) clear_padding_rows_kernel(const PaddingRowsSet<Element> set) {
  const PaddingRows<Element>& rows = set.tensors[blockIdx.y];
  const int end = *rows.sequences_end;
  const int first = end < 0 ? 0 : (end > rows.total ? rows.total : end);
  const int64_t row_elements = static_cast<int64_t>(rows.heads) * rows.head_dim;
  const int64_t count = static_cast<int64_t>(rows.total - first) * row_elements;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = first + i / row_elements;
    const int64_t head = (i % row_elements) / rows.head_dim;
    const int64_t column = i % rows.head_dim;
    rows.data[row * rows.row_stride + head * rows.head_stride + column] = Element(0.0f);
    if (rows.lse != nullptr && column == 0) rows.lse[head * rows.total + row] = -INFINITY;
  }
}

// The padding rows of `tensor`, packed (total, heads, head_dim) rows of a batch whose sequences end at
// cu_seqlens[batch]; `lse`, (heads, total), or null.
template <class Element>
PaddingRows<Element> padding_rows(const MutableTensorRef& tensor, int64_t heads, int head_dim, int64_t total,
                                  const int32_t* cu_seqlens, int64_t batch, float* lse = nullptr) {
  return PaddingRows<Element>{static_cast<Element*>(tensor.data), tensor.strides.seq, tensor.strides.head,
                              static_cast<int>(heads), head_dim, static_cast<int>(total), cu_seqlens + batch, lse};
}

// Clears the padding rows of every tensor of `tensors` on `stream`, in one launch, after the call's kernels that
// write the sequences' rows.
template <class Element, size_t kTensors>
cudaError_t clear_padding_rows(const PaddingRows<Element> (&tensors)[kTensors], cudaStream_t stream) {
  static_assert(kTensors >= 1 && kTensors <= kMaxPaddedTensors, "one launch clears 1 to kMaxPaddedTensors tensors");
  PaddingRowsSet<Element> set{};
  for (size_t i = 0; i < kTensors; ++i) set.tensors[i] = tensors[i];
  clear_padding_rows_kernel<Element><<<dim3(kPaddingBlocks, kTensors), kPaddingThreads, 0, stream>>>(set);
  return cudaGetLastError();
}

}  // namespace dash::sm90
