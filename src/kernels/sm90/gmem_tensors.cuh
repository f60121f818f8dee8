// Global-memory (B, S, H, D) tensors as the kernels see them: one CuTe type per element type, viewed as
// (seqlen, head_dim, heads, batch) with head_dim contiguous, which is what the TMA descriptors are built
// from; the one TMA load of a sequence tile that both kernels' loaders issue (and, for packed varlen tensors, of
// the rows from a sequence's offset on); the (batch, seq, head) strides the plain-store epilogues use; and the check
// of a tensor's geometry against cuTensorMapEncodeTiled's rules (first_tma_refusal), which the launchers make before
// they encode any descriptor; a tensor that breaks one fails the launch, and nothing is launched.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include <cuda_runtime.h>
#include <cute/tensor.hpp>

#include "dash/types.hpp"
#include "kernels/kernel_params.hpp"

namespace dash::sm90 {

using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
template <class Element>
using GmemTensor =
    decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{}, GmemStride{}));

template <class Element, int kHeadDim>
GmemTensor<Element> make_gmem_bshd(const void* data, int64_t seqlen, int64_t heads, int64_t batch, const Strides& s) {
  return cute::make_tensor(cute::make_gmem_ptr(static_cast<const Element*>(data)),
                           cute::make_shape(static_cast<int32_t>(seqlen), static_cast<int32_t>(kHeadDim),
                                            static_cast<int32_t>(heads), static_cast<int32_t>(batch)),
                           cute::make_stride(s.seq, cute::_1{}, s.head, s.batch));
}

// A packed varlen tensor (total_rows, heads, head_dim) as a (total_rows, head_dim, heads, 1) tensor of the type
// above, so that its TMA descriptors are built as the dense ones; its batch stride is never stepped over.
template <class Element, int kHeadDim>
GmemTensor<Element> make_gmem_packed(const void* data, int64_t total_rows, int64_t heads, const Strides& s) {
  return make_gmem_bshd<Element, kHeadDim>(data, total_rows, heads, 1, Strides{0, s.seq, s.head, s.dim});
}

// A call's (B, S, H, D) tensor as the launchers' descriptors see it: dense, (seqlen, head_dim, heads, batch); of a
// packed varlen batch (kVarlen), every row of the batch, total_rows of them, from which the loaders step to each
// sequence's offset.
template <class Element, int kHeadDim, bool kVarlen>
GmemTensor<Element> make_gmem_call_tensor(const void* data, int64_t seqlen, int64_t total_rows, int64_t heads,
                                          int64_t batch, const Strides& s) {
  if constexpr (kVarlen) {
    return make_gmem_packed<Element, kHeadDim>(data, total_rows, heads, s);
  } else {
    return make_gmem_bshd<Element, kHeadDim>(data, seqlen, heads, batch, s);
  }
}

// One TMA load of sequence tile `tile` of slice (head, batch) of a tensor of extent (seqlen, head_dim,
// heads, batch) into the shared-memory tile `dst`, completing on mbarrier `full`. One thread issues it.
// With kMulticastCtas > 1 (a TMA built for that many CTAs of the cluster, SM90_TMA_LOAD_MULTICAST) the load is CTA
// `cta_rank`'s share of the tile, written into `dst` and completing on `full` at the same offsets in every CTA of the
// cluster: the cluster's CTAs together load the whole tile into each.
template <int kMulticastCtas = 1, class Tma, class Extent, class SmemTensor>
__device__ void tma_load_tile(const Tma& tma, const Extent& extent, int head, int batch, int tile, uint64_t& full,
                              SmemTensor dst, int cta_rank = 0) {
  using namespace cute;
  auto m = tma.get_tma_tensor(extent);
  auto g = local_tile(m(_, _, head, batch), product_each(shape(dst)), make_coord(_, _0{}));
  if constexpr (kMulticastCtas == 1) {
    auto [src_part, dst_part] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(dst), group_modes<0, 2>(g));
    copy(tma.with(full), src_part(_, tile), dst_part);
  } else {
    auto [src_part, dst_part] =
        tma_partition(tma, cta_rank, Layout<Int<kMulticastCtas>>{}, group_modes<0, 2>(dst), group_modes<0, 2>(g));
    constexpr uint16_t kEveryCta = (1u << kMulticastCtas) - 1;  // cluster ranks 0 .. kMulticastCtas - 1
    copy(tma.with(full, kEveryCta), src_part(_, tile), dst_part);
  }
}

// One TMA load of the rows [row0, row0 + rows of `dst`) of head `head` of a packed tensor of extent (total_rows,
// head_dim, heads, 1) (make_gmem_packed) into `dst`, completing on `full`: a varlen sequence's tile, which starts
// at the sequence's offset rather than at a multiple of the tile. Rows past total_rows arrive as zeros; rows of
// the next sequence arrive as they are, and the caller masks them. One thread issues it.
template <class Tma, class Extent, class SmemTensor>
__device__ void tma_load_rows(const Tma& tma, const Extent& extent, int head, int row0, uint64_t& full,
                              SmemTensor dst) {
  using namespace cute;
  auto m = domain_offset(make_coord(row0, _0{}), tma.get_tma_tensor(extent)(_, _, head, _0{}));
  auto g = local_tile(m, product_each(shape(dst)), make_coord(_, _0{}));
  auto [src_part, dst_part] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(dst), group_modes<0, 2>(g));
  copy(tma.with(full), src_part(_, 0), dst_part);
}

// One TMA store of the shared-memory tile `src` to sequence tile `tile` of slice (head, batch) of a tensor of
// extent (seqlen, head_dim, heads, batch); TMA writes none of its rows at or past seqlen. One thread issues it;
// the caller commits it (tma_store_arrive) and waits for it to have read `src` before writing `src` again.
template <class Tma, class Extent, class SmemTensor>
__device__ void tma_store_tile(const Tma& tma, const Extent& extent, int head, int batch, int tile, SmemTensor src) {
  using namespace cute;
  auto m = tma.get_tma_tensor(extent);
  auto g = local_tile(m(_, _, head, batch), product_each(shape(src)), make_coord(_, _0{}));
  auto [gmem_part, smem_part] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(src), group_modes<0, 2>(g));
  copy(tma, smem_part, gmem_part(_, tile));
}

// One TMA store of the shared-memory tile `src` to the rows [row0, row0 + rows of `src`) of head `head` of a packed
// tensor of extent (total_rows, head_dim, heads, 1) (make_gmem_packed): a varlen sequence's rows, which start at the
// sequence's offset. TMA clips only at total_rows, so the caller stores no tile that reaches past its sequence (the
// next sequence's rows follow). One thread issues it; committed and waited for as tma_store_tile's.
template <class Tma, class Extent, class SmemTensor>
__device__ void tma_store_rows(const Tma& tma, const Extent& extent, int head, int row0, SmemTensor src) {
  using namespace cute;
  auto m = domain_offset(make_coord(row0, _0{}), tma.get_tma_tensor(extent)(_, _, head, _0{}));
  auto g = local_tile(m, product_each(shape(src)), make_coord(_, _0{}));
  auto [gmem_part, smem_part] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(src), group_modes<0, 2>(g));
  copy(tma, smem_part, gmem_part(_, 0));
}

// cuTensorMapEncodeTiled's rules on a tiled descriptor without interleave (CUDA driver API reference), as they bear
// on a GmemTensor: the global address 16-byte aligned; every global stride (all but the contiguous head_dim's) a
// multiple of 16 bytes and below 2^40 bytes; every extent in [1, 2^32]. Its other arguments (box dims, element
// strides, swizzle) are compile-time constants of the kernels' configs, known valid: every config runs with them.
inline constexpr uintptr_t kTmaAddressAlignmentBytes = 16;
inline constexpr int64_t kTmaStrideMultipleBytes = 16;
inline constexpr int64_t kTmaStrideLimitBytes = int64_t{1} << 40;
inline constexpr int64_t kTmaExtentLimit = int64_t{1} << 32;

// Why the driver would refuse the TMA descriptor of `tensor`, or null if it breaks none of the rules above (callers
// name Element: GmemTensor cannot deduce it). It reads only the tensor's geometry, before any descriptor is encoded:
// CuTe's make_tma_copy only prints a refusal (outside debug builds) and returns the descriptor as the driver left
// it, which need not be all zero, so a refusal cannot be recognized from the descriptor afterwards.
template <class Element>
const char* tma_geometry_fault(const GmemTensor<Element>& tensor) {
  using namespace cute;
  if (reinterpret_cast<uintptr_t>(raw_pointer_cast(tensor.data())) % kTmaAddressAlignmentBytes != 0) {
    return "its address is not 16-byte aligned";
  }
  // GmemShape's extents are int32_t, so none exceeds 2^32: only the lower bound can be broken.
  static_assert(std::numeric_limits<int32_t>::max() <= kTmaExtentLimit);
  const int64_t extents[] = {get<0>(tensor.shape()), get<1>(tensor.shape()), get<2>(tensor.shape()),
                             get<3>(tensor.shape())};
  for (const int64_t extent : extents) {
    if (extent < 1) return "an extent is below 1";
  }
  struct GlobalStride {
    int64_t elements;
    const char* not_a_multiple;
    const char* out_of_range;
  };
  // Named as the API's Strides fields are: a packed varlen tensor's rows step by strides.seq as a dense one's do.
  const GlobalStride strides[] = {
      {get<0>(tensor.stride()), "its strides.seq is not a multiple of 16 bytes",
       "its strides.seq is negative or not below 2^40 bytes"},
      {get<2>(tensor.stride()), "its strides.head is not a multiple of 16 bytes",
       "its strides.head is negative or not below 2^40 bytes"},
      {get<3>(tensor.stride()), "its strides.batch is not a multiple of 16 bytes",
       "its strides.batch is negative or not below 2^40 bytes"},
  };
  constexpr int64_t kElementBytes = sizeof(Element);
  for (const GlobalStride& stride : strides) {
    // Compared in elements first, so that the product in bytes cannot overflow.
    if (stride.elements < 0 || stride.elements >= kTmaStrideLimitBytes / kElementBytes) return stride.out_of_range;
    if (stride.elements * kElementBytes % kTmaStrideMultipleBytes != 0) return stride.not_a_multiple;
  }
  return nullptr;
}

// The first of a launch's tensors whose TMA descriptor the driver would refuse, and the rule it breaks.
struct TmaRefusal {
  const char* tensor = nullptr;  // "q", "dout", ...; null when every tensor keeps the rules
  const char* rule = nullptr;
};

template <class Element>
TmaRefusal first_tma_refusal(std::initializer_list<std::pair<GmemTensor<Element>, const char*>> tensors) {
  for (const auto& [tensor, name] : tensors) {
    if (const char* rule = tma_geometry_fault<Element>(tensor)) return {name, rule};
  }
  return {};
}

// The launcher's result when it refuses `refusal` and launches nothing.
inline kernels::LaunchResult refused(const TmaRefusal& refusal) { return {0, refusal.tensor, refusal.rule}; }

// The launcher's result of a launch sequence that returned `error`.
inline kernels::LaunchResult launched(cudaError_t error) { return {static_cast<int>(error), nullptr}; }

// What the dense kernels' parameters carry in place of a varlen batch's PackedBatch (schedule/varlen.hpp): nothing.
struct NoPackedBatch {};

inline void copy_strides(int64_t (&dst)[3], const Strides& s) {
  dst[0] = s.batch;
  dst[1] = s.seq;
  dst[2] = s.head;
}

}  // namespace dash::sm90
