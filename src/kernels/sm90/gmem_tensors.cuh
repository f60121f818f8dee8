// Global-memory (B, S, H, D) tensors as the kernels see them: one CuTe type per element type, viewed as
// (seqlen, head_dim, heads, batch) with head_dim contiguous, which is what the TMA descriptors are built
// from; the one TMA load of a sequence tile that both kernels' loaders issue (and, for packed varlen tensors, of
// the rows from a sequence's offset on); the (batch, seq, head) strides the plain-store epilogues use; and the check
// that every descriptor of a launch was encoded (first_unencoded), without which the launchers launch nothing.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_desc.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "dash/types.hpp"
#include "kernels/kernel_params.hpp"

namespace dash::sm90 {

using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
template <class Element>
using GmemTensor = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{},
                                              GmemStride{}));

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

// One TMA load of sequence tile `tile` of slice (head, batch) of a tensor of extent (seqlen, head_dim,
// heads, batch) into the shared-memory tile `dst`, completing on mbarrier `full`. One thread issues it.
template <class Tma, class Extent, class SmemTensor>
__device__ void tma_load_tile(const Tma& tma, const Extent& extent, int head, int batch, int tile, uint64_t& full,
                              SmemTensor dst) {
  using namespace cute;
  auto m = tma.get_tma_tensor(extent);
  auto g = local_tile(m(_, _, head, batch), product_each(shape(dst)), make_coord(_, _0{}));
  auto [src_part, dst_part] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(dst), group_modes<0, 2>(g));
  copy(tma.with(full), src_part(_, tile), dst_part);
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

// The name of the first of `descriptors` that the driver did not encode, or null if it encoded them all. CuTe's
// make_tma_copy value-initializes a descriptor (all zero) before cuTensorMapEncodeTiled fills it, and on a failure
// only prints to stderr (an assert, compiled out in release builds) and returns it as it is; an encoded descriptor is
// never all zero (it holds the tensor's address, which the API holds non-null, and its element format).
inline const char* first_unencoded(
    std::initializer_list<std::pair<const cute::TmaDescriptor*, const char*>> descriptors) {
  for (const auto& [descriptor, name] : descriptors) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(descriptor);
    bool encoded = false;
    for (size_t i = 0; i < sizeof(cute::TmaDescriptor) && !encoded; ++i) encoded = bytes[i] != 0;
    if (!encoded) return name;
  }
  return nullptr;
}

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
