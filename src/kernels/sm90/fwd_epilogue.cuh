// Forward epilogue, per MMA thread: O / l to the output in its element type and the LSE, for the query
// tile's rows before seqlen_q. Where the configuration stages O (fwd_config.cuh), each MMA warpgroup writes its
// 64 rows to its staging tile and one of its threads stores them with TMA, asynchronously: the warpgroup goes on
// to the next tile while the store runs, and that thread waits for the store to have read the staging tile
// before the tile is written again and before the CTA exits (drain). The varlen kernels stage only a warpgroup's
// rows that all lie in their sequence, and store the rest from the fragment. A float32 out (Params::out_f32) is
// stored from the fragment by every kernel: staging is sized for the element type, and the TMA store's descriptor too.
#pragma once

#include <cmath>

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/gemm.cuh"

namespace dash::sm90 {

template <class Config>
struct ForwardEpilogue {
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;

  // O / l in the output type and LSE = (m * c + log2 l) ln 2 (natural log); -inf and O = 0 for rows that
  // see no key. Rows past seqlen_q are not written.
  //
  // Invariant: the quad shuffles run in every lane, before any lane leaves its row. A row past
  // seqlen_q can share a warp with rows before it (seqlen_q need not be a multiple of 8), and a
  // full-mask shuffle that some lanes skip is undefined behaviour: on the H200 it hung the kernel.
  //
  // Varlen kernels: rows past the sequence's end are not written either (they belong to the next sequence). A
  // warpgroup whose 64 rows all lie in the sequence stores them with TMA; one that reaches past its end (the
  // sequence's last, partial rows) by predicated stores from the fragment. The LSE goes to its (heads_q, total_q)
  // row.
  template <class Out>
  __device__ static void store(const Params& p, SharedStorage& smem, const typename Config::TileRecord& tile,
                               const Out& out_frag, const float* row_max, const float* row_sum, int thread) {
    typename Config::TiledMmaO mma_o;
    constexpr int kRows = decltype(size<0>(accumulator_rows_by_columns(out_frag.layout())))::value;
    constexpr float kLn2 = 0.6931471805599453f;
    float sum[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // Each row's sum is spread over the four threads of a quad.
      sum[r] = row_sum[r];
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }
    const int row0 = tile.q_tile * kBlockM;
    const int valid_rows = rows_of(p, tile) - row0;
    const auto inverse_sum = [&](int r) { return sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f; };
    const auto store_from_fragment = [&] {
      Element* o_tile = p.out + first_row_offset(p, tile, p.out_strides) + row0 * p.out_strides[1];
      store_accumulator_rows<Element, kBlockM, Config::kHeadDim>(mma_o, thread, out_frag, o_tile, p.out_strides[1],
                                                                 valid_rows, inverse_sum);
    };
    if (p.out_f32 != nullptr) {
      // The same products as the element-type stores below, unrounded: rounded to Element they are their bits.
      float* o_tile = p.out_f32 + first_row_offset(p, tile, p.out_strides) + row0 * p.out_strides[1];
      store_accumulator_rows<float, kBlockM, Config::kHeadDim>(mma_o, thread, out_frag, o_tile, p.out_strides[1],
                                                               valid_rows, inverse_sum);
    } else if constexpr (Config::kStagedO) {
      const int warp_group = uniform_warp_group(thread, kWarpGroupThreads);
      if (!Config::kVarlen || valid_rows >= (warp_group + 1) * kMmaWarpGroupRows) {
        store_staged(p, smem, tile, out_frag, inverse_sum, thread);
      } else {
        store_from_fragment();
      }
    } else {
      store_from_fragment();
    }

    // LSE: written by the thread that holds column 0 of the row.
    Tensor coords_frag =
        mma_o.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<Config::kHeadDim>>{}));
    Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
    float* lse = p.lse + lse_row_offset(p, tile) + row0;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(coords(r, 0));
      if (row >= valid_rows || get<1>(coords(r, 0)) != 0) continue;
      lse[row] = sum[r] > 0.0f ? fmaf(row_max[r], p.scale_log2, __log2f(sum[r])) * kLn2 : -INFINITY;
    }
  }

  // Waits for this thread's last TMA store of O to have read its staging tile: shared memory must outlive the
  // reads of every store issued from it.
  __device__ static void drain(int thread) {
    if constexpr (Config::kStagedO) {
      if (issues_store(thread)) tma_store_wait<0>();
    }
  }

 private:
  static constexpr int kWarpGroupThreads = Config::kWarpGroupThreads;

  __device__ static bool issues_store(int thread) { return thread % kWarpGroupThreads == 0; }

  // Query rows of the tile's sequence: the plan's seqlen_q, or the varlen sequence's own.
  __device__ static int rows_of(const Params& p, const typename Config::TileRecord& tile) {
    if constexpr (Config::kVarlen) {
      return tile.mask.seqlen_q;
    } else {
      return p.tiles.mask.seqlen_q;
    }
  }

  // Elements from the tensor's start to row 0 of the tile's (batch, head) slice: in the varlen kernels, to the
  // sequence's first row in the packed tensor.
  __device__ static int64_t first_row_offset(const Params& p, const typename Config::TileRecord& tile,
                                             const int64_t (&strides)[3]) {
    if constexpr (Config::kVarlen) {
      return tile.head * strides[2] + static_cast<int64_t>(tile.q_offset) * strides[1];
    } else {
      return tile.batch * strides[0] + tile.head * strides[2];
    }
  }

  // Floats from the LSE's start to row 0 of the tile's (batch, head) row: (batch, heads_q, seqlen_q) packed, or in
  // the varlen kernels (heads_q, total_q) from the sequence's first row.
  __device__ static int64_t lse_row_offset(const Params& p, const typename Config::TileRecord& tile) {
    if constexpr (Config::kVarlen) {
      return static_cast<int64_t>(tile.head) * p.packed.total_q + tile.q_offset;
    } else {
      return (static_cast<int64_t>(tile.batch) * p.tiles.heads_q + tile.head) * p.tiles.mask.seqlen_q;
    }
  }

  // This warpgroup's 64 rows of O * row_scale(r) to its staging tile, then one TMA store of the tile.
  template <class Out, class RowScale>
  __device__ static void store_staged(const Params& p, SharedStorage& smem, const typename Config::TileRecord& tile,
                                      const Out& out_frag, RowScale row_scale, int thread) {
    using Pair = cutlass::AlignedArray<Element, 2>;
    typename Config::TiledMmaO mma_o;
    const int warp_group = uniform_warp_group(thread, kWarpGroupThreads);
    const int barrier = Config::kWarpGroupBarrierBase + warp_group;
    Tensor staging = make_tensor(make_smem_ptr(smem.o_staging.data()), typename Config::SmemLayoutO{});
    Tensor coords_frag =
        mma_o.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<Config::kHeadDim>>{}));
    Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
    Tensor acc = make_tensor(out_frag.data(), accumulator_rows_by_columns(out_frag.layout()));
    if (issues_store(thread)) tma_store_wait<0>();  // the previous tile's store has read the staging tile
    cutlass::arch::NamedBarrier::sync(kWarpGroupThreads, barrier);
    const int row_base = warp_group * kMmaWarpGroupRows;
    CUTE_UNROLL
    for (int r = 0; r < size<0>(acc); ++r) {
      const float scale = row_scale(r);
      const int row = get<0>(coords(r, 0)) - row_base;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(acc); c += 2) {
        // The swizzle moves 16-byte chunks, so a pair of neighbouring columns stays contiguous.
        Pair pair;
        pair[0] = static_cast<Element>(acc(r, c) * scale);
        pair[1] = static_cast<Element>(acc(r, c + 1) * scale);
        *reinterpret_cast<Pair*>(&staging(row, get<1>(coords(r, c)), warp_group)) = pair;
      }
    }
    cutlass::arch::fence_view_async_shared();  // the writes above, visible to the TMA unit
    cutlass::arch::NamedBarrier::sync(kWarpGroupThreads, barrier);
    if (issues_store(thread)) {
      if constexpr (Config::kVarlen) {
        const auto extent = make_shape(p.packed.total_q, int{Config::kHeadDim}, p.tiles.heads_q, 1);
        tma_store_rows(p.tma_o, extent, tile.head, tile.q_offset + tile.q_tile * kBlockM + row_base,
                       staging(_, _, warp_group));
      } else {
        const auto extent = make_shape(p.tiles.mask.seqlen_q, int{Config::kHeadDim}, p.tiles.heads_q, p.tiles.batch);
        tma_store_tile(p.tma_o, extent, tile.head, tile.batch, tile.q_tile * Config::kMmaWarpGroups + warp_group,
                       staging(_, _, warp_group));
      }
      tma_store_arrive();
    }
  }
};

}  // namespace dash::sm90
