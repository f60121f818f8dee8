// Tile shapes of the sm90 kernels, per head dim. The schedule model plans in units of these tiles, so
// the host planner and the kernels must agree on them: both read them from here.
//
// Backward: each CTA owns one key/value tile of block_kv rows (split between two MMA warpgroups of 64
// rows each) and visits query tiles of block_q rows. block_kv is a multiple of block_q, which the
// symmetric shift schedule needs (its stride is block_kv / block_q).
#pragma once

#include <cstdint>

#include "schedule/host_device.hpp"

namespace dash {

struct TileShape {
  int block_q;
  int block_kv;
};

DASH_HOST_DEVICE constexpr TileShape backward_tile_shape(int head_dim) {
  // d=64: 128x128 keeps the S/dP accumulators at 64 registers per thread each.
  // d=128: dK and dV alone take 128 registers per thread, so the query tile shrinks to 64 rows.
  return head_dim <= 64 ? TileShape{128, 128} : TileShape{64, 128};
}

// Forward: one MMA warpgroup per 64 query rows, 128 keys per tile. Query tiles are 128 rows (two MMA
// warpgroups of 240 registers) or, at d = 64, 192 rows (three of 160: the O and S accumulators, 32 + 64
// registers per thread, still fit), which gives the tensor cores 1.5x the GEMM work per key/value tile to
// overlap with each warpgroup's softmax. The taller tile pays where the sequence is long enough that the
// work it adds past the causal diagonal and past seqlen_q is small. Same-run A/B on the H200, d = 64, bf16
// (docs/PERF.md, 2026-12-02): full mask +6-9% from 2048 tokens, -4 to -5% at 512-1024; causal +2-4% from
// 8192 tokens, -4 to -28% below (at 512 the 192-row tiles compute 35% more of the masked triangle).
inline constexpr int kForwardBlockQ = 128;
inline constexpr int kForwardTallBlockQ = 192;
inline constexpr int kForwardBlockKv = 128;
inline constexpr int kForwardTallFromFull = 2048;     // seqlen_q from which a full mask takes tall tiles
inline constexpr int kForwardTallFromCausal = 8192;   // the same under the causal mask

DASH_HOST_DEVICE constexpr bool forward_has_tall_tiles(int head_dim) { return head_dim <= 64; }

DASH_HOST_DEVICE constexpr TileShape forward_tile_shape(int head_dim, bool causal, int64_t seqlen_q) {
  const bool tall = forward_has_tall_tiles(head_dim) &&
                    seqlen_q >= (causal ? kForwardTallFromCausal : kForwardTallFromFull);
  return TileShape{tall ? kForwardTallBlockQ : kForwardBlockQ, kForwardBlockKv};
}

DASH_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace dash
