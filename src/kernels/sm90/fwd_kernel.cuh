// The forward kernel: persistent CTAs take 128-row query tiles from a global counter (longest causal
// tiles first); a loader warp brings Q once per tile and streams K, V through a two-stage TMA
// pipeline; two MMA warpgroups of 64 query rows each run the online softmax
//   S = Q K^T;  m' = max(m, rowmax(S));  P = exp2((S - m') * c);  l' = l * exp2((m - m') * c) + rowsum(P)
//   O = O * exp2((m - m') * c) + P V,   with c = scale * log2(e) and m in raw score units,
// and write O / l and LSE = (m * c + log2(l)) * ln(2).
#pragma once

#include <cutlass/arch/barrier.h>

#include <cmath>

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule/mask.hpp"

namespace dash::sm90 {

template <class Config>
struct ForwardKernel {
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;

  // Key/value tiles query tile `q_tile` sees: all up to the one holding its last row's last visible key.
  __device__ static int kv_tiles_of(const Params& p, int q_tile) {
    const MaskShape mask{p.seqlen_q, p.seqlen_k, p.causal};
    const int last_row = min((q_tile + 1) * kBlockM, p.seqlen_q) - 1;
    return ceil_div(mask.visible_keys(last_row), kBlockN);
  }

  // Tile t of the dispatch order: heads in order, and within a head the query tiles that see the most
  // keys first (under the causal mask the last ones), so that the last wave holds the shortest tiles.
  __device__ static ForwardTileRecord tile_at(const Params& p, int t) {
    const int within = t % p.q_tiles;
    const int q_tile = p.causal ? p.q_tiles - 1 - within : within;
    const int bh = t / p.q_tiles;
    return ForwardTileRecord{kv_tiles_of(p, q_tile), bh / p.heads_q, bh % p.heads_q, q_tile};
  }

  __device__ static void load(const Params& p, SharedStorage& smem) {
    prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    const int num_tiles = p.q_tiles * p.heads_q * p.batch;
    const int group = p.heads_q / p.heads_kv;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{});
    const auto q_extent = make_shape(p.seqlen_q, int{Config::kHeadDim}, p.heads_q, p.batch);
    const auto kv_extent = make_shape(p.seqlen_k, int{Config::kHeadDim}, p.heads_kv, p.batch);
    int tiles = 0;
    int kv_loads = 0;
    for (int t = atomicAdd(p.tile_counter, 1); t < num_tiles; t = atomicAdd(p.tile_counter, 1), ++tiles) {
      const ForwardTileRecord tile = tile_at(p, t);
      smem.tiles.publish(tile, tiles);
      smem.q_stages.producer_acquire(tiles, "q_empty");
      tma_tile(p.tma_q, q_extent, tile.head, tile.batch, tile.q_tile, smem.q_stages.producer_expect(tiles, Config::kQBytes), sQ);
      for (int j = 0; j < tile.kv_tiles; ++j, ++kv_loads) {
        const int stage = smem.kv_stages.producer_acquire(kv_loads, "kv_empty");
        uint64_t& full = smem.kv_stages.producer_expect(kv_loads, Config::kKVStageBytes);
        tma_tile(p.tma_k, kv_extent, tile.head / group, tile.batch, j, full, sK(_, _, stage));
        tma_tile(p.tma_v, kv_extent, tile.head / group, tile.batch, j, full, sV(_, _, stage));
      }
    }
    smem.tiles.publish(ForwardTileRecord{kEndOfTiles, 0, 0, 0}, tiles);
  }

  __device__ static void compute(const Params& p, SharedStorage& smem, int thread) {
    typename Config::TiledMmaS mma_s;
    typename Config::TiledMmaO mma_o;
    const int warp_group = uniform_warp_group(thread, Config::kWarpGroupThreads);
    auto thr_s = mma_s.get_thread_slice(thread);
    auto wg_s = warpgroup_operand_slice(mma_s, warp_group, Config::kWarpGroupThreads);
    auto wg_o = warpgroup_operand_slice(mma_o, warp_group, Config::kWarpGroupThreads);
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutVt{});
    Tensor tSrQ = wg_s.partition_fragment_A(sQ);
    Tensor tSrK = wg_s.partition_fragment_B(sK);
    Tensor tOrVt = wg_o.partition_fragment_B(sVt);
    // (query row, key column) of each S element this thread holds, in (row, column) view.
    Tensor cS = thr_s.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor tScS = make_tensor(cS.data(), accumulator_rows_by_columns(cS.layout()));
    constexpr int kRows = decltype(size<0>(tScS))::value;

    const MaskShape mask{p.seqlen_q, p.seqlen_k, p.causal};
    int kv_loads = 0;
    for (int tiles = 0;; ++tiles) {
      const ForwardTileRecord tile = smem.tiles.take(tiles);
      if (tile.kv_tiles == kEndOfTiles) break;

      Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<Config::kHeadDim>>{});
      Tensor out = make_tensor(tOrO.data(), accumulator_rows_by_columns(tOrO.layout()));
      clear(tOrO);
      float row_max[kRows];
      float row_sum[kRows];
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f;
      const int q_row0 = tile.q_tile * kBlockM;
      smem.q_stages.consumer_wait(tiles, "q_full");
      for (int j = 0; j < tile.kv_tiles; ++j, ++kv_loads) {
        const int stage = smem.kv_stages.consumer_wait(kv_loads, "kv_full");
        Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
        warpgroup_gemm<true>(mma_s, tSrQ, tSrK(_, _, _, stage), tSrS);
        warpgroup_wait<0>();
        Tensor scores = make_tensor(tSrS.data(), accumulator_rows_by_columns(tSrS.layout()));
        // Only tiles crossing the causal diagonal or the key tail need the mask; the test is uniform
        // over the CTA, so each path stays branch-free.
        if ((j + 1) * kBlockN > mask.visible_keys(q_row0)) {
          online_softmax<true>(scores, out, tScS, row_max, row_sum, mask, q_row0, j * kBlockN, p.scale_log2);
        } else {
          online_softmax<false>(scores, out, tScS, row_max, row_sum, mask, q_row0, j * kBlockN, p.scale_log2);
        }
        Tensor tOrP = make_operand_a<Element>(tSrS);
        warpgroup_gemm<false>(mma_o, tOrP, tOrVt(_, _, _, stage), tOrO);
        warpgroup_wait<0>();
        smem.kv_stages.consumer_release(kv_loads);
      }
      smem.q_stages.consumer_release(tiles);
      store(p, tile, tOrO, row_max, row_sum, thread);
    }
  }

 private:
  // One key/value tile of the online softmax, in place: scores become P, the running max and sum and
  // the output rows are rescaled. row_max is kept in raw score units, so that the scale folds into
  // the exponent: P = exp2(S * scale_log2 - max * scale_log2), one FFMA per element.
  template <bool kMasked, class Scores, class Out, class Coords>
  __device__ static void online_softmax(Scores& scores, Out& out, const Coords& coords, float* row_max,
                                        float* row_sum, const MaskShape& mask, int q_row0, int kv_col0,
                                        float scale_log2) {
    CUTE_UNROLL
    for (int r = 0; r < size<0>(scores); ++r) {
      float tile_max = -INFINITY;
      if constexpr (kMasked) {
        const int visible = mask.visible_keys(q_row0 + get<0>(coords(r, 0)));
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          if (kv_col0 + get<1>(coords(r, c)) >= visible) scores(r, c) = -INFINITY;
        }
      }
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
      // The four threads of a quad hold the same row.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      // A row with no visible key so far keeps max -inf; use 0 so that exp2 gives 0, not NaN.
      const float base = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
      const float correction = fast_exp2(fmaf(row_max[r], scale_log2, -base));
      row_max[r] = new_max;
      float tile_sum = 0.0f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        scores(r, c) = fast_exp2(fmaf(scores(r, c), scale_log2, -base));
        tile_sum += scores(r, c);
      }
      row_sum[r] = row_sum[r] * correction + tile_sum;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= correction;
    }
  }

  template <class Tma, class Extent, class SmemTensor>
  __device__ static void tma_tile(const Tma& tma, const Extent& extent, int head, int batch, int tile, uint64_t& full,
                                  SmemTensor dst) {
    auto m = tma.get_tma_tensor(extent);
    auto g = local_tile(m(_, _, head, batch), product_each(shape(dst)), make_coord(_, _0{}));
    auto [src_part, dst_part] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(dst), group_modes<0, 2>(g));
    copy(tma.with(full), src_part(_, tile), dst_part);
  }

  // O / l in the output type and LSE = (m * c + log2 l) ln 2 (natural log); -inf and O = 0 for rows that
  // see no key. Rows past seqlen_q are not written.
  //
  // Invariant: the quad shuffles run in every lane, before any lane leaves its row. A row past
  // seqlen_q can share a warp with rows before it (seqlen_q need not be a multiple of 8), and a
  // full-mask shuffle that some lanes skip is undefined behaviour: on the H200 it hung the kernel.
  template <class Out>
  __device__ static void store(const Params& p, const ForwardTileRecord& tile, const Out& out_frag,
                               const float* row_max, const float* row_sum, int thread) {
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
    const int valid_rows = p.seqlen_q - row0;
    Element* o_tile = p.out + tile.batch * p.out_strides[0] + tile.head * p.out_strides[2] + row0 * p.out_strides[1];
    store_accumulator_rows<Element, kBlockM, Config::kHeadDim>(
        mma_o, thread, out_frag, o_tile, p.out_strides[1], valid_rows,
        [&](int r) { return sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f; });

    // LSE: written by the thread that holds column 0 of the row.
    Tensor coords_frag = mma_o.get_thread_slice(thread).partition_C(
        make_identity_tensor(Shape<Int<kBlockM>, Int<Config::kHeadDim>>{}));
    Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
    float* lse = p.lse + (static_cast<int64_t>(tile.batch) * p.heads_q + tile.head) * p.seqlen_q + row0;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(coords(r, 0));
      if (row >= valid_rows || get<1>(coords(r, 0)) != 0) continue;
      lse[row] = sum[r] > 0.0f ? fmaf(row_max[r], p.scale_log2, __log2f(sum[r])) * kLn2 : -INFINITY;
    }
  }
};

template <class Config>
__device__ void init_forward_barriers(typename Config::SharedStorage& smem) {
  constexpr int kLoaderThreads = 1;
  smem.q_stages.init(kLoaderThreads, Config::kMmaThreads);
  smem.kv_stages.init(kLoaderThreads, Config::kMmaThreads);
  smem.tiles.init(Config::kMmaThreads);
  cutlass::arch::fence_barrier_init();
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    forward_kernel(const __grid_constant__ typename Config::Params params) {
  extern __shared__ __align__(1024) char shared_bytes[];
  auto& smem = *reinterpret_cast<typename Config::SharedStorage*>(shared_bytes);
  if (threadIdx.x == 0) init_forward_barriers<Config>(smem);
  __syncthreads();
  run_warp_roles([&] { if (threadIdx.x == 0) ForwardKernel<Config>::load(params, smem); },
                 [&](int thread) { ForwardKernel<Config>::compute(params, smem, thread); });
}

}  // namespace dash::sm90
