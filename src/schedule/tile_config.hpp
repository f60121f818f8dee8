// Tile shapes and the other per-head-dim settings of the sm90 kernels (head_dim_settings, one row per head dim). The
// schedule model plans in units of these tiles, so the host planner and the kernels must agree on them: both read
// them from here.
//
// Backward: each CTA owns one key/value tile of block_kv rows and visits query tiles of block_q rows, with two MMA
// warpgroups: up to d = 128 each owns 64 of the key/value rows; at d = 192 and 256 both work on a 64x96 or 64x80
// tile and split its keys (backward_splits_keys). block_kv need not be a multiple of block_q: the schedule model takes
// each tile's query band from the mask (tiled_problem.hpp), never from block_kv / block_q. Only symmetric shift needs
// the ratio integral (its stride), and 64x96 and 64x80 are not: the planner refuses it at d = 192 and 256
// (schedule_plan.cpp).
#pragma once

#include <cstdint>

#include "schedule/host_device.hpp"

namespace dash {

struct TileShape {
  int block_q;
  int block_kv;
};

// The settings of the sm90 kernels that differ between head dims, one row per head dim with kernels
// (head_dim_settings). The planner, the kernels' configurations (kernels/sm90/fwd_config.cuh, bwd_config.cuh) and the
// launchers read them through the functions below; adding a head dim adds a row (CONTRIBUTING.md). Every head dim of
// cmake/Supported.cmake has one (api/limits.hpp checks it through has_backward_kernel).
struct HeadDimSettings {
  int head_dim;
  // The backward's block_q x block_kv (backward_tile_shape says why).
  TileShape backward_tile;
  // Whether its MMA warpgroups split the tile's keys (backward_splits_keys says why).
  bool backward_splits_keys;
  // Column blocks in which each MMA warpgroup computes its dQ partial and hands it to the dQ writer, and whether the
  // key split's P and dS share one shared-memory buffer (kernels/sm90/bwd_config.cuh says why).
  int backward_dq_column_blocks;
  bool backward_shares_p_ds;
  // The forward's base key/value tile (its query tiles are kForwardBlockQ rows), and which of its other tiles the
  // head dim has: short, tall and wide (the forward's comment below says why).
  int forward_block_kv;
  bool forward_short_tiles;
  bool forward_tall_tiles;
  bool forward_wide_tiles;
  // Whether its full-mask forward may run in CTA pairs that share each key/value tile (forward_may_pair says why).
  bool forward_pairs_ctas;
};

inline constexpr int kForwardBlockKv = 128;
inline constexpr int kForwardBlockKvD192 = 112;
inline constexpr int kForwardBlockKvD256 = 80;

// The row of `head_dim`. A head dim without kernels (the emulator's small models, or one the API refuses) takes the
// row of the next head dim up that has them, or the last row. The rows are returns rather than an array: device code
// may not read a host array, and the kernels' configurations read these settings.
DASH_HOST_DEVICE constexpr HeadDimSettings head_dim_settings(int head_dim) {
  // clang-format off
  //                          d    backward tile  splits keys  dQ blocks  P, dS shared  forward keys         short  tall   wide   pairs
  if (head_dim <= 64)  return {64,  {128, 128},    false,       1,         false,        kForwardBlockKv,     true,  true,  false, false};
  if (head_dim <= 96)  return {96,  {64, 128},     false,       1,         false,        kForwardBlockKv,     false, false, false, false};
  if (head_dim <= 128) return {128, {64, 128},     false,       1,         false,        kForwardBlockKv,     false, false, true,  true};
  if (head_dim <= 192) return {192, {64, 96},      true,        1,         false,        kForwardBlockKvD192, false, false, false, true};
  return                      {256, {64, 80},      true,        4,         true,         kForwardBlockKvD256, false, false, false, true};
  // clang-format on
}

// Head dims with a backward kernel: every one with a row. Up to d = 128 each MMA warpgroup keeps its 64 key/value
// rows of dK and dV in registers, d / 2 + d / 2 = d per thread, next to S^T and dP^T (block_q / 2 each) and a dQ
// partial: 240 registers hold them (128 + 32 + 32 + 32 at 64x128). At d = 192 and 256 dK and dV alone would take
// 192 or 256, so there both warpgroups work on one tile and split its keys (backward_splits_keys);
// kernels/sm90/bwd_mainloop_key_split.cuh.
DASH_HOST_DEVICE constexpr bool has_backward_kernel(int head_dim) {
  return head_dim_settings(head_dim).head_dim == head_dim;
}

// Whether the backward's MMA warpgroups split the tile's keys, with dK and dV as swapped GEMMs (d = 192 and 256):
// each computes S and dP for half of the keys (48 of 96, 40 of 80) over the 64 query rows, and dV^T += dO^T P,
// dK^T += Q^T dS for those keys over all of head_dim (head_dim as the GEMMs' M): 72 + 72 registers per thread at
// d = 192 and 80 + 80 at 256, beside S and dP (24 + 24, 20 + 20) or its 64 x 96 or 64 x 128 dQ partial (48, 64).
// Against the 64x64 head_dim split these head dims had before, the wider tiles cut the dQ partials reduced into
// global memory per FLOP by 1.5x and 1.25x: at 64x64 the MMA warpgroups waited on the dQ writer's hand-off for
// 32% of their stall samples at d = 192 (Nsight Compute, docs/HISTORY.md). Three MMA warpgroups at d = 192, 32 keys
// each, ran 0.92x (docs/HISTORY.md).
DASH_HOST_DEVICE constexpr bool backward_splits_keys(int head_dim) {
  return head_dim_settings(head_dim).backward_splits_keys;
}

// d=64: 128x128 keeps the S/dP accumulators at 64 registers per thread each.
// d=96 and 128: dK and dV alone take 96 or 128 registers per thread, so the query tile shrinks to 64 rows.
// d=192: 64x96, the key split's tile (bwd_config.cuh: two Q stages, one dO stage, K and V of 96 rows, P, dS and
// the dQ partials take 216 KiB of the 227).
// d=256: 64x80, the widest key tile shared memory holds (one Q and one dO stage of 32 KiB, K and V of 40, the dQ
// partials of 64, and P and dS sharing one 10 KiB buffer: 218 KiB of the 227).
DASH_HOST_DEVICE constexpr TileShape backward_tile_shape(int head_dim) {
  return head_dim_settings(head_dim).backward_tile;
}

// Forward: one MMA warpgroup per 64 query rows, 128 keys per tile. Query tiles are 128 rows (two MMA
// warpgroups of 240 registers) or, at d = 64, 192 rows (three of 160: the O and S accumulators, 32 + 64
// registers per thread, still fit), which gives the tensor cores 1.5x the GEMM work per key/value tile to
// overlap with each warpgroup's softmax. The taller tile pays where the sequence is long enough that the work
// it adds past the causal diagonal and past seqlen_q is small. Same-run A/B on the H200, d = 64, bf16, the
// paper grid (16384 tokens per batch, hidden 2048; fd2049d's kernel at every length against 7c08e11,
// docs/HISTORY.md): full mask +6-9% from 2048 tokens, -4 to -5% at 512-1024; causal +2-4% from 8192
// tokens, -4 to -28% below (at 512 the 192-row tiles compute 35% more of the masked triangle).
//
// At d = 128 under a full mask, key/value tiles are 176 keys wide instead (128x176): the per-tile work that
// does not grow with the keys (rescaling O's 64 registers per thread, the row max and sum shuffles, the
// barriers) is spread over 1.375x the keys. Nsight Compute on the H200 (d = 128, full, 16384
// tokens): FA3's step loop at 128x176 issues 3.3 instructions per key and thread, DASH's at 128x128 3.7, and
// DASH's at 128x176 3.4 (unmasked path, scripts/sass_report.sh). The wide tiles store O without a staging
// tile (kernels/sm90/fwd_config.cuh: none fits beside Q, K and V), which costs more than the loop saves
// when a tile visits few key/value tiles. Same-run A/B on the H200, d = 128, full, bf16, the paper grid
// (docs/HISTORY.md): against 128x128, -3% at 512 keys, +3.7-4.1% at 1024-2048, +3-13% from 4096.
// At 1024 keys (six wide tiles a query tile) two later same-run A/Bs (docs/HISTORY.md) found the
// opposite, 128x128 4.8% and 5.2% faster, so the wide tiles start at 2048 keys.
// The causal mask keeps 128 keys: wider tiles would compute more of the masked triangle.
//
// At d = 192 and 256 the key/value tiles narrow to what shared memory holds beside a 128-row Q tile, with K and
// V double-buffered (fwd_config.cuh checks the sum against the 227 KiB a CTA may use): 128x112 at d = 192
// (48 KiB of Q + 2 x 2 x 42 KiB of K and V = 216 KiB) and 128x80 at d = 256 (64 KiB + 2 x 2 x 40 KiB = 224 KiB),
// FA3's shapes at these head dims. Their O accumulators take 96 and 128 registers per thread, S 56 and 40, which
// leaves no room for the tall or wide tiles. d = 96 keeps 128x128 (O 48 registers, Q, K, V and the O staging tile
// 144 KiB): its tall tiles (192x128, FA3 runs 192x144 there) spilled 252 bytes with three MMA warpgroups of 160
// registers (ptxas, nvcc 13.0), and its wide ones are unmeasured.
//
// At d = 64, sequences of up to 1024 tokens under a full mask take short tiles instead: 64 query rows on one MMA
// warpgroup, with two CTAs per SM (forward_ctas_per_sm), so that one CTA's prologue and epilogue run under the
// other's GEMMs (Q, K, V and the O staging tile take 8 + 2 x 2 x 16 + 8 = 80 KiB a CTA). A 128-row query tile of a
// 512-token sequence visits only 4 key/value tiles, too few to hide those fixed costs. Same-run A/Bs on the H200
// (bf16, the paper grid, docs/HISTORY.md), short against the tiles the shape had: full mask +3.3 to +4.2% at 512
// tokens, 0 to +2.6% at 1024, -8 to -13% from 2048 (against the tall tiles); causal -3 to -6% at 512 and, in two
// calls of three, -2 to -4% at 1024-4096, so the causal mask keeps its tiles. At d = 128 two CTAs fit only with
// 64-key tiles (16 + 2 x 2 x 16 + 16 = 96 KiB), which lost 3-18% at 512-2048 tokens.
inline constexpr int kForwardBlockQ = 128;
inline constexpr int kForwardShortBlockQ = 64;
inline constexpr int kForwardShortUpToFull = 1024;  // the longest seqlen_q and seqlen_k with short tiles (full mask)
inline constexpr int kForwardTallBlockQ = 192;
inline constexpr int kForwardWideBlockKv = 176;
inline constexpr int kForwardTallFromFull = 2048;    // seqlen_q from which a full mask takes tall tiles
inline constexpr int kForwardTallFromCausal = 8192;  // the same under the causal mask
inline constexpr int kForwardWideFromKeys = 2048;    // seqlen_k from which a full mask at d = 128 takes wide tiles

DASH_HOST_DEVICE constexpr bool forward_has_tall_tiles(int head_dim) {
  return head_dim_settings(head_dim).forward_tall_tiles;
}
DASH_HOST_DEVICE constexpr bool forward_has_short_tiles(int head_dim) {
  return head_dim_settings(head_dim).forward_short_tiles;
}
DASH_HOST_DEVICE constexpr bool forward_has_wide_tiles(int head_dim) {
  return head_dim_settings(head_dim).forward_wide_tiles;
}

// The forward's tile at `head_dim` when neither short, tall nor wide tiles apply (and under any sliding window).
DASH_HOST_DEVICE constexpr TileShape forward_base_tile_shape(int head_dim) {
  return TileShape{kForwardBlockQ, head_dim_settings(head_dim).forward_block_kv};
}

DASH_HOST_DEVICE constexpr TileShape forward_short_tile_shape() {
  return TileShape{kForwardShortBlockQ, kForwardBlockKv};
}

// CTAs of the forward kernel with this tile that share one SM: two for the short tiles (one MMA warpgroup each),
// one otherwise (two or three MMA warpgroups, which take the SM's registers).
DASH_HOST_DEVICE constexpr int forward_ctas_per_sm(int block_q) { return block_q == kForwardShortBlockQ ? 2 : 1; }

DASH_HOST_DEVICE constexpr TileShape forward_tile_shape(int head_dim, bool causal, int64_t seqlen_q, int64_t seqlen_k) {
  const bool short_tiles = forward_has_short_tiles(head_dim) && !causal && seqlen_q <= kForwardShortUpToFull &&
                           seqlen_k <= kForwardShortUpToFull;
  if (short_tiles) return forward_short_tile_shape();
  const bool tall =
      forward_has_tall_tiles(head_dim) && seqlen_q >= (causal ? kForwardTallFromCausal : kForwardTallFromFull);
  const bool wide = forward_has_wide_tiles(head_dim) && !causal && seqlen_k >= kForwardWideFromKeys;
  const TileShape base = forward_base_tile_shape(head_dim);
  return TileShape{tall ? kForwardTallBlockQ : base.block_q, wide ? kForwardWideBlockKv : base.block_kv};
}

// CTA pairs (an A/B candidate, built only with the CMake option DASH_FORWARD_PAIRED_CTAS, which defines this macro
// for every target, so that the planner's view and the kernels' agree): under a full mask at d >= 128, two CTAs of a
// thread-block cluster take neighbouring query tiles of one head, which visit the same key/value tiles, and each
// loads half of every K and V tile into both CTAs' shared memory with one TMA multicast. A 128-row query tile reads
// 2 * block_kv * d * 2 bytes of K and V per 4 * 128 * block_kv * d FLOPs, one byte per 128 FLOPs whatever the tile's
// width or head dim: 5.5 TB/s out of L2 at 700 TFLOPS. The pairs halve it. FA3 runs its full-mask forward at d >= 128
// in such clusters (hopper/flash_fwd_launch_template.h), and the forward's rows below FA3's are full-mask rows at
// d = 128, 192 and 256 (docs/PERF.md). The deal (ForwardTileOrder::dealt_tile, round robin under a full mask)
// gives CTAs 2c and 2c + 1, the pair, tiles 2u and 2u + 1 in every turn: one head's neighbouring query tiles wherever
// a head has an even number of them, the pairs' condition. Not the tall or short tiles, the softcap kernels (instance
// count), or the causal mask and windows, whose tiles differ in length.
#ifndef DASH_FORWARD_PAIRED_CTAS
#define DASH_FORWARD_PAIRED_CTAS 0
#endif
inline constexpr bool kForwardPairedCtasBuilt = DASH_FORWARD_PAIRED_CTAS != 0;
inline constexpr int kForwardPairCtas = 2;  // CTAs of a pair: the thread-block cluster's size

DASH_HOST_DEVICE constexpr bool forward_has_paired_ctas(int head_dim) {
  return head_dim_settings(head_dim).forward_pairs_ctas;
}

// Whether the forward with `tile` may run in CTA pairs (above) for a dense batch: full mask, no softcap, 128-row
// query tiles, and an even number of query tiles per head.
DASH_HOST_DEVICE constexpr bool forward_may_pair(int head_dim, TileShape tile, bool causal, bool windowed, bool softcap,
                                                 bool varlen, int64_t seqlen_q) {
  const int64_t q_tiles = (seqlen_q + tile.block_q - 1) / tile.block_q;
  return forward_has_paired_ctas(head_dim) && tile.block_q == kForwardBlockQ && !causal && !windowed && !softcap &&
         !varlen && q_tiles % kForwardPairCtas == 0;
}

// The forward kernel a call runs: its tile, whether it is one of a left-bounded window's kernels
// (kernels/sm90/fwd_config.cuh) and whether its CTAs run in pairs. kernels/sm90/fwd_launch.cuh launches it and
// `dash-attn plan` prints it.
struct ForwardKernelChoice {
  TileShape tile;
  bool left_bounded;
  bool paired;
};

// `causal`, `left_bounded` and `right_bounded` are the mask after canonical_mask (schedule/mask.hpp): a window bound
// >= 0 bounds that side. The tall and wide tiles (forward_tile_shape) were measured on the full and causal masks
// only, so a sliding window keeps the base tiles. The softcap kernels keep the base key tiles: at 128x176 their
// unmasked step loop spilled (7 local loads and 7 stores per iteration, scripts/sass_report.sh). A packed varlen
// batch keeps the base tiles at every length: a tile chosen by its lengths would make a sequence's bits depend on
// the other sequences (the wide tiles move where a row's online softmax rescales, and the tall ones changed the
// LSE's last bits under the causal mask, measured on the H200 with a 1000-token sequence beside 20000 tokens:
// python/tests/test_batch_invariance.py). Varlen batches of long sequences give up the tiles' 2-13% (above) for that.
DASH_HOST_DEVICE constexpr ForwardKernelChoice forward_kernel_choice(int head_dim, bool causal, bool left_bounded,
                                                                     bool right_bounded, bool softcap, bool varlen,
                                                                     int64_t seqlen_q, int64_t seqlen_k) {
  const TileShape base = forward_base_tile_shape(head_dim);
  if (left_bounded || right_bounded || varlen) return {base, left_bounded, false};
  const TileShape tile = forward_tile_shape(head_dim, causal, seqlen_q, seqlen_k);
  if (tile.block_q == kForwardShortBlockQ) return {softcap ? base : tile, false, false};
  const TileShape chosen{tile.block_q, softcap ? base.block_kv : tile.block_kv};
  const bool paired = kForwardPairedCtasBuilt &&
                      forward_may_pair(head_dim, chosen, causal, /*windowed=*/false, softcap, varlen, seqlen_q);
  return {chosen, false, paired};
}

DASH_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace dash
