// Backward, the MMA warpgroups' element-wise part of a step, shared by both layouts (bwd_mainloop_rows.cuh,
// bwd_mainloop_key_split.cuh): P from the recomputed scores and the LSE, masked where the tile crosses the mask's
// ends, and dS = P o (dP - dpsum) from P and dP, both in registers. Up to d = 128 the fragments are S^T's and dP^T's,
// (key rows, query columns); in the key split S's and dP's, (query rows, key columns).
// Softcap kernels recompute the forward's capped score (S <- tanh(S * scale / softcap)) and multiply dS by tanh's
// derivative, kept from P's computation to dS's in fp16 where registers allow (kKeepsSlope).
// Invariants: the mask test is the one definition of schedule/mask.hpp (visible_keys, first_visible_key), as in the
// forward and the reference; a masked or underflowed P is 0 and its dS stays 0, softcap or not.
#pragma once

#include <cmath>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule/mask.hpp"

namespace dash::sm90 {

template <class Config>
struct BackwardScores {
  using Element = typename Config::Element;
  // tanh's derivative, which softcap kernels keep from P's computation to dS's where it fits (compute_probabilities).
  using SlopeElement = cutlass::half_t;
  using Params = typename Config::Params;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  // The S^T values each MMA thread holds per step, and how many of their slopes fit beside S^T, dP^T, dK and dV: 32
  // (16 registers) at d = 96 to 256 spill nothing, while at d = 64 the 128x128 tile's 64 (32 registers) spilled 92
  // loads and 88 stores per step (scripts/sass_report.sh), so there compute_ds takes tanh back from P instead.
  static constexpr int kScoresPerThread = kBlockN * kBlockM / Config::kMmaThreads;
  static constexpr int kMaxKeptSlopes = 32;
  static constexpr bool kKeepsSlope = Config::kSoftcap && kScoresPerThread <= kMaxKeptSlopes;

  // P^T in place of one step's S^T, on the path its tile needs: masked where it crosses the right ends (the causal
  // diagonal, a window's right bound, the key tail) or, under a left window bound, the left ends; unmasked
  // otherwise. The branch is uniform over the CTA.
  template <class Fragment, class SlopeFragment, class Coords>
  __device__ static void step_probabilities(bool left_bounded, Fragment& s_frag, SlopeFragment& slope_frag,
                                            const Coords& coords_frag, const float* lse_log2, const MaskShape& mask,
                                            int q_row0, int kv_row0, const Params& p) {
    const bool crosses_right_ends = kv_row0 + kBlockN > mask.visible_keys(q_row0);
    if (left_bounded && (crosses_right_ends || kv_row0 < mask.first_visible_key(q_row0 + kBlockM - 1))) {
      compute_probabilities<MaskedEnds::kBoth>(s_frag, slope_frag, coords_frag, lse_log2, mask, q_row0, kv_row0, p);
    } else if (crosses_right_ends) {
      compute_probabilities<MaskedEnds::kRight>(s_frag, slope_frag, coords_frag, lse_log2, mask, q_row0, kv_row0, p);
    } else {
      compute_probabilities<MaskedEnds::kNone>(s_frag, slope_frag, coords_frag, lse_log2, mask, q_row0, kv_row0, p);
    }
  }

  // The thread's S^T fragment viewed as (key rows, query columns); columns come in pairs of adjacent
  // queries, so their LSE and dpsum are read as one float2 per pair. In the key split the fragment is S's, (query
  // rows, key columns), and each row has one LSE and one dpsum.
  template <class Fragment>
  __device__ static auto by_rows_and_columns(Fragment& f) {
    return make_tensor(f.data(), accumulator_rows_by_columns(f.layout()));
  }

  // P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)), 0 where the key is hidden from the query row. Softcap
  // kernels recompute the forward's capped score first: S^T <- tanh(S^T * scale / softcap), and p.scale_log2 is
  // softcap * log2(e); where kKeepsSlope they keep tanh's derivative 1 - tanh^2 in `slope_frag` for compute_ds. It
  // lies in [0, 1], so fp16 holds it to 2^-11 (below dS^T's own rounding to the MMA element type) in half the
  // registers of fp32, and keeping it spares compute_ds the MUFU.LG2 that takes tanh back from P (the softcap step's
  // third MUFU per score). The key split's S fragment gets the same, by query rows.
  template <MaskedEnds kMasked, class Fragment, class SlopeFragment, class Coords>
  __device__ static void compute_probabilities(Fragment& s_frag, SlopeFragment& slope_frag, const Coords& coords_frag,
                                               const float* lse_log2, const MaskShape& mask, int q_row0, int kv_row0,
                                               const Params& p) {
    Tensor s = by_rows_and_columns(s_frag);
    Tensor slope = make_tensor(slope_frag.data(), accumulator_rows_by_columns(slope_frag.layout()));
    Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
    constexpr bool kRight = kMasked != MaskedEnds::kNone;
    constexpr bool kLeft = kMasked == MaskedEnds::kBoth;
    if constexpr (Config::kSplitsKeys) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s); ++r) {
        const int query = get<0>(coords(r, 0));
        const float lse = lse_log2[query];
        const int limit = kRight ? mask.visible_keys(q_row0 + query) : 0;
        const int first = kLeft ? mask.first_visible_key(q_row0 + query) : 0;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s); ++c) {
          s(r, c) =
              probability<kRight, kLeft>(s(r, c), slope(r, c), lse, kv_row0 + get<1>(coords(r, c)), limit, first, p);
        }
      }
    } else {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); c += 2) {
        const int query = get<1>(coords(0, c));
        const float2 lse = *reinterpret_cast<const float2*>(lse_log2 + query);
        const int limits[2] = {kRight ? mask.visible_keys(q_row0 + query) : 0,
                               kRight ? mask.visible_keys(q_row0 + query + 1) : 0};
        const int firsts[2] = {kLeft ? mask.first_visible_key(q_row0 + query) : 0,
                               kLeft ? mask.first_visible_key(q_row0 + query + 1) : 0};
        CUTE_UNROLL
        for (int r = 0; r < size<0>(s); ++r) {
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            s(r, c + h) = probability<kRight, kLeft>(s(r, c + h), slope(r, c + h), h == 0 ? lse.x : lse.y,
                                                     kv_row0 + get<0>(coords(r, c + h)), limits[h], firsts[h], p);
          }
        }
      }
    }
  }

  // One score's probability (compute_probabilities): `key` is hidden where kRight and key >= limit, or kLeft and
  // key < first.
  template <bool kRight, bool kLeft, class Slope>
  __device__ __forceinline__ static float probability(float score, Slope& slope, float lse_log2, int key, int limit,
                                                      int first, const Params& p) {
    if constexpr (Config::kSoftcap) score = fast_tanh(score * p.softcap_in);
    if constexpr (kKeepsSlope) slope = static_cast<SlopeElement>(fmaf(-score, score, 1.0f));
    float x = score * p.scale_log2 - lse_log2;
    if constexpr (kRight) x = key >= limit || (kLeft && key < first) ? -INFINITY : x;
    return fast_exp2(x);
  }

  // dS^T = P^T o (dP^T - dpsum), stored with P^T in the MMA element type. Softcap kernels multiply by tanh's
  // derivative 1 - t^2 as well (the scale is applied to dQ and dK later, as without softcap): `slope_frag` of
  // compute_probabilities where kKeepsSlope, which is finite, so dS = 0 stays 0 where P = 0 (masked, underflowed, a
  // row without keys). Otherwise t, the capped score over softcap, comes back from P's exponent: t = (log2 P + LSE *
  // log2(e)) / (softcap * log2(e)); where P = 0 that is -inf or NaN, clamped to -1, so dS = 0 stays 0 too. The key
  // split's dS the same, by query rows; kWritesP false leaves P's slots to the caller (the key split at d = 256).
  template <bool kWritesP = true, class Fragment, class SlopeFragment, class Slots, class Coords>
  __device__ static void compute_ds(const Fragment& p_frag, const Fragment& dp_frag, const SlopeFragment& slope_frag,
                                    Slots p_slots, Slots ds_slots, const Coords& coords_frag, const float* dpsum,
                                    const float* lse_log2, const Params& params) {
    Tensor p = make_tensor(p_frag.data(), accumulator_rows_by_columns(p_frag.layout()));
    Tensor slope = make_tensor(slope_frag.data(), accumulator_rows_by_columns(slope_frag.layout()));
    Tensor dp = make_tensor(dp_frag.data(), accumulator_rows_by_columns(dp_frag.layout()));
    Tensor p_out = make_tensor(p_slots.data(), accumulator_rows_by_columns(p_slots.layout()));
    Tensor ds_out = make_tensor(ds_slots.data(), accumulator_rows_by_columns(ds_slots.layout()));
    Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
    if constexpr (Config::kSplitsKeys) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dp); ++r) {
        const int query = get<0>(coords(r, 0));
        const float sum = dpsum[query];
        // softcap without a kept slope: LSE * log2(e) / (softcap * log2(e)) of the row
        const float lse_t = Config::kSoftcap && !kKeepsSlope ? lse_log2[query] * params.softcap_rcp_log2 : 0.0f;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(dp); ++c) {
          ds_out(r, c) = static_cast<Element>(score_gradient(p(r, c), dp(r, c), sum, slope(r, c), lse_t, params));
          if constexpr (kWritesP) p_out(r, c) = static_cast<Element>(p(r, c));
        }
      }
    } else {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(dp); c += 2) {
        const float2 sum = *reinterpret_cast<const float2*>(dpsum + get<1>(coords(0, c)));
        float2 lse_t{};  // softcap without a kept slope: LSE * log2(e) / (softcap * log2(e)) of the column pair
        if constexpr (Config::kSoftcap && !kKeepsSlope) {
          const float2 lse = *reinterpret_cast<const float2*>(lse_log2 + get<1>(coords(0, c)));
          lse_t = make_float2(lse.x * params.softcap_rcp_log2, lse.y * params.softcap_rcp_log2);
        }
        CUTE_UNROLL
        for (int r = 0; r < size<0>(dp); ++r) {
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            const float ds = score_gradient(p(r, c + h), dp(r, c + h), h == 0 ? sum.x : sum.y, slope(r, c + h),
                                            h == 0 ? lse_t.x : lse_t.y, params);
            ds_out(r, c + h) = static_cast<Element>(ds);
            p_out(r, c + h) = static_cast<Element>(p(r, c + h));
          }
        }
      }
    }
  }

  // One score's dS (compute_ds): `lse_t` is its row's LSE over softcap where the softcap kernels keep no slope.
  template <class Slope>
  __device__ __forceinline__ static float score_gradient(float prob, float dprob, float dpsum, const Slope& slope,
                                                         float lse_t, const Params& params) {
    float ds = prob * (dprob - dpsum);
    if constexpr (kKeepsSlope) {
      ds *= static_cast<float>(slope);
    } else if constexpr (Config::kSoftcap) {
      const float t = fmaxf(fmaf(fast_log2(prob), params.softcap_rcp_log2, lse_t), -1.0f);
      ds *= fmaf(-t, t, 1.0f);
    }
    return ds;
  }
};

}  // namespace dash::sm90
