// Forward consumer warpgroups: each owns 64 query rows of the 128-row tile and, per key/value tile,
// computes S = Q K^T (SS wgmma), the online softmax in registers and O += P V (RS wgmma, P reused from
// the S accumulator), then hands O, the running max and sum to the epilogue:
//   m' = max(m, rowmax(S));  P = exp2((S - m') * c);  l' = l * exp2((m - m') * c) + rowsum(P)
//   O = O * exp2((m - m') * c) + P V,   with c = scale * log2(e) and m in raw score units.
#pragma once

#include <cmath>

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/fwd_epilogue.cuh"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule/mask.hpp"

namespace dash::sm90 {

template <class Config>
struct ForwardMainloop {
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;

  __device__ static void run(const Params& p, SharedStorage& smem, int thread) {
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

    const MaskShape mask = p.tiles.mask;
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
      ForwardEpilogue<Config>::store(p, smem, tile, tOrO, row_max, row_sum, thread);
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
};

}  // namespace dash::sm90
