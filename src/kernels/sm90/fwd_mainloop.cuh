// Forward consumer warpgroups: each owns 64 query rows of the query tile and, per key/value tile,
// computes S = Q K^T (SS wgmma), the online softmax in registers and O += P V (RS wgmma, P converted
// from the S accumulator), the O GEMM of tile j - 1 running under the softmax of tile j, and the
// warpgroups taking turns to issue their GEMMs (MmaTurns), so that one's softmax runs under the others'
// GEMMs; then hands O, the running max and sum to the epilogue:
//   m' = max(m, rowmax(S));  P = exp2((S - m') * c);  l' = l * exp2((m - m') * c) + rowsum(P)
//   O = O * exp2((m - m') * c) + P V,   with c = scale * log2(e) and m in raw score units.
// Softcap kernels first cap S: S <- tanh(S * scale / softcap), with c = softcap * log2(e) (cap_scores).
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

    const MaskShape plan_mask = p.tiles.mask;
    const MmaTurns<Config> turns(warp_group);
    turns.start();
    int kv_loads = 0;  // key/value tiles visited so far: positions in the K and V rings
    for (int tiles = 0;; ++tiles) {
      const typename Config::TileRecord tile = smem.tiles.take(tiles);
      if (tile.kv_tiles == kEndOfTiles) break;
      const MaskShape mask = tile_mask(tile, plan_mask);

      Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<Config::kHeadDim>>{});
      Tensor out = make_tensor(tOrO.data(), accumulator_rows_by_columns(tOrO.layout()));
      clear(tOrO);
      float row_max[kRows];
      float row_sum[kRows];
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f;
      const int q_row0 = tile.q_tile * kBlockM;
      smem.q_stages.consumer_wait(tiles, "q_full");
      // Software-pipelined by one key/value tile: while the softmax of S_j runs on the CUDA cores, the
      // tensor cores run O += P_{j-1} V_{j-1}. S_j and P_{j-1} live in separate registers; O is rescaled
      // for tile j only once the GEMM that accumulates into it has finished.
      Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
      Tensor scores = make_tensor(tSrS.data(), accumulator_rows_by_columns(tSrS.layout()));
      Tensor tOrP = make_operand_a_for<Element>(tSrS);
      float correction[kRows];
      // The tile visits key/value tiles [kv_first, kv_first + kv_tiles); j counts from kv_first. Those in
      // [unmasked_begin, unmasked_end) lie within every row's keys; the others cross the causal diagonal, a sliding
      // window's bounds or the key tail. Without a left window bound unmasked_begin is 0: what was there before.
      const int kv_first = Config::kLeftBounded ? tile.kv_first : 0;  // 0 without a left bound
      const int kv_col_first = kv_first * kBlockN;
      const int unmasked_end = mask.visible_keys(q_row0) / kBlockN - kv_first;
      const int unmasked_begin = first_unmasked(mask, tile, q_row0);
      // A tile whose rows see no key visits no key/value tile (the loader loads none): O = 0, LSE = -inf.
      if (tile.kv_tiles > 0) {
        {
          const int k_stage = smem.k_stages.consumer_wait(kv_loads, "k_full");
          turns.wait();
          warpgroup_gemm<true>(mma_s, tSrQ, tSrK(_, _, _, k_stage), tSrS);
          turns.pass();
          warpgroup_wait<0>();
          release_after_s(smem, tile, tiles, kv_loads, 0);
          cap_scores(tSrS, p);
          softmax_tile(unmasked_begin > 0 || unmasked_end <= 0, scores, tScS, row_max, row_sum, correction, mask,
                       q_row0, kv_col_first, p.scale_log2);
          convert_to_operand<Element>(tSrS, tOrP);
        }
        // One key/value tile of the pipelined loop, its softmax masked or not at compile time. The unmasked
        // tiles and those crossing a mask boundary run in loops of their own, each with one path, rather
        // than one loop that branches per tile: 8% faster in geometric mean over the grid, up to 16% (A/B,
        // docs/HISTORY.md), although the executed path's instruction count barely changes.
        const auto step = [&](int j, auto masked) {
          const int k_stage = smem.k_stages.consumer_wait(kv_loads + j, "k_full");
          turns.wait();
          warpgroup_gemm<true>(mma_s, tSrQ, tSrK(_, _, _, k_stage), tSrS);
          const int v_stage = smem.v_stages.consumer_wait(kv_loads + j - 1, "v_full");
          warpgroup_gemm<false>(mma_o, tOrP, tOrVt(_, _, _, v_stage), tOrO);
          turns.pass();
          warpgroup_wait<1>();  // S_j is done; O += P_{j-1} V_{j-1} may still run
          release_after_s(smem, tile, tiles, kv_loads, j);
          cap_scores(tSrS, p);
          online_softmax<decltype(masked)::value>(scores, tScS, row_max, row_sum, correction, mask, q_row0,
                                                  kv_col_first + j * kBlockN, p.scale_log2);
          warpgroup_wait<0>();
          smem.v_stages.consumer_release(kv_loads + j - 1);
          rescale_rows(out, correction);
          convert_to_operand<Element>(tSrS, tOrP);
        };
        int j = 1;
        if constexpr (Config::kLeftBounded) {
          // Masked tiles before the unmasked run (the left bound's), the run, then the masked rest: one copy of
          // each path. unmasked_end <= kv_tiles (visible_keys grows with the row).
          for (;;) {
            for (; j < tile.kv_tiles && (j < unmasked_begin || j >= unmasked_end); ++j) step(j, true_type{});
            if (j >= tile.kv_tiles) break;
            for (; j < unmasked_end; ++j) step(j, false_type{});
          }
        } else {
          for (; j < unmasked_end; ++j) step(j, false_type{});
          for (; j < tile.kv_tiles; ++j) step(j, true_type{});
        }
        const int last = kv_loads + tile.kv_tiles - 1;
        const int v_stage = smem.v_stages.consumer_wait(last, "v_full");
        warpgroup_gemm<false>(mma_o, tOrP, tOrVt(_, _, _, v_stage), tOrO);
        warpgroup_wait<0>();
        smem.v_stages.consumer_release(last);
      }
      kv_loads += tile.kv_tiles;
      if (tile.kv_tiles == 0) smem.q_stages.consumer_release(tiles);
      ForwardEpilogue<Config>::store(p, smem, tile, tOrO, row_max, row_sum, thread);
    }
    ForwardEpilogue<Config>::drain(thread);
  }

 private:
  // The mask the tile runs: the plan's, or in the varlen kernels its sequence's.
  __device__ static MaskShape tile_mask(const typename Config::TileRecord& tile, const MaskShape& plan_mask) {
    if constexpr (Config::kVarlen) {
      return tile.mask;
    } else {
      return plan_mask;
    }
  }

  // S_j is complete: K_j is free, and after the tile's last S GEMM so is Q, which no other GEMM reads.
  // Releasing Q here rather than after the tile lets the loader fetch the next tile's Q (and, ring stages
  // permitting, its first K and V) under this tile's last O GEMM and its epilogue.
  __device__ static void release_after_s(SharedStorage& smem, const ForwardTileRecord& tile, int tiles, int kv_loads,
                                         int j) {
    smem.k_stages.consumer_release(kv_loads + j);
    if (j == tile.kv_tiles - 1) smem.q_stages.consumer_release(tiles);
  }

  // The first of the tile's key/value tiles (counted from kv_first) that lies within every row's keys on the
  // left: 0 without a left bound; with one, the tile holding the last row's first visible key or the next.
  __device__ static int first_unmasked(const MaskShape& mask, const ForwardTileRecord& tile, int q_row0) {
    if constexpr (Config::kLeftBounded) {
      const int last_row = (q_row0 + kBlockM < mask.seqlen_q ? q_row0 + kBlockM : mask.seqlen_q) - 1;
      return ceil_div(mask.first_visible_key(last_row), kBlockN) - tile.kv_first;
    } else {
      return 0;
    }
  }

  // Softcap kernels: S becomes tanh(S * softmax_scale / softcap), the capped score over softcap (p.scale_log2
  // is softcap * log2(e) there, so the softmax below runs on it unchanged). Nothing in the other kernels.
  template <class Fragment>
  __device__ static void cap_scores(Fragment& s, const Params& p) {
    if constexpr (Config::kSoftcap) {
      CUTE_UNROLL
      for (int i = 0; i < size(s); ++i) s(i) = fast_tanh(s(i) * p.softcap_in);
    }
  }

  // online_softmax on the CTA-uniform path: masked only for tiles that cross the causal diagonal, a sliding
  // window's bounds or the key tail, so the other path has no mask code.
  template <class Scores, class Coords>
  __device__ static void softmax_tile(bool masked, Scores& scores, const Coords& coords, float* row_max, float* row_sum,
                                      float* correction, const MaskShape& mask, int q_row0, int kv_col0,
                                      float scale_log2) {
    if (masked) {
      online_softmax<true>(scores, coords, row_max, row_sum, correction, mask, q_row0, kv_col0, scale_log2);
    } else {
      online_softmax<false>(scores, coords, row_max, row_sum, correction, mask, q_row0, kv_col0, scale_log2);
    }
  }

  // O's rows times this tile's correction exp2((m - m') * c).
  template <class Out>
  __device__ static void rescale_rows(Out& out, const float* correction) {
    CUTE_UNROLL
    for (int r = 0; r < size<0>(out); ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= correction[r];
    }
  }

  // One key/value tile of the online softmax, in place: scores become P, the running max and sum are
  // updated, and each row's correction for O is returned (rescale_rows applies it). row_max is kept in
  // raw score units, so that the scale folds into the exponent: P = exp2(S * scale_log2 - max *
  // scale_log2), one FFMA per element.
  template <bool kMasked, class Scores, class Coords>
  __device__ static void online_softmax(Scores& scores, const Coords& coords, float* row_max, float* row_sum,
                                        float* correction, const MaskShape& mask, int q_row0, int kv_col0,
                                        float scale_log2) {
    CUTE_UNROLL
    for (int r = 0; r < size<0>(scores); ++r) {
      float tile_max = -INFINITY;
      if constexpr (kMasked) {
        const int row = q_row0 + get<0>(coords(r, 0));
        const int visible = mask.visible_keys(row);
        const int first = Config::kLeftBounded ? mask.first_visible_key(row) : 0;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          const int col = kv_col0 + get<1>(coords(r, c));
          if (col >= visible || (Config::kLeftBounded && col < first)) scores(r, c) = -INFINITY;
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
      correction[r] = fast_exp2(fmaf(row_max[r], scale_log2, -base));
      row_max[r] = new_max;
      float tile_sum = 0.0f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        scores(r, c) = fast_exp2(fmaf(scores(r, c), scale_log2, -base));
        tile_sum += scores(r, c);
      }
      row_sum[r] = row_sum[r] * correction[r] + tile_sum;
    }
  }
};

}  // namespace dash::sm90
