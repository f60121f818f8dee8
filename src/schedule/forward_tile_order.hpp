// The forward's tile order, one definition for the kernel's loader and the CPU tests: the t-th tile, which a
// persistent CTA is dealt or takes from the forward's global counter, and how many key/value tiles it visits.
//
// Heads are taken in groups of heads_per_group consecutive (batch, head) pairs. Within a group, tiles come
// longest first across all of the group's heads (under the causal mask the last query tiles see the most
// keys), head by head for each length. Under the causal mask, longest first over many heads is what balances
// the CTAs: the last wave holds the shortest tiles of the last group, not a mix of one head's long and
// another's short ones. A list-scheduling model of the grid put head-by-head order 3-6% behind at 2k-8k
// tokens; measured (same-run A/B on the H200, bf16, paper grid, fd2049d's order against 7c08e11's,
// docs/HISTORY.md), the grouped order gave +4.5-7.5% at d = 128, 2048-16384 tokens. The group bound
// keeps the K and V that the CTAs read at one time within L2: a group's key/value heads fit kForwardL2Budget
// (forward_heads_per_group). Under a full mask every tile is equally long, and groups of one head keep each
// head's K and V shared by the CTAs that run its tiles at once (grouping lost 1-7% there at d = 128, 512-2048
// tokens).
//
// Where every tile is equally long (a full mask, no window; dense, since a varlen batch's tiles are fitted to its
// sequences) the CTAs take no counter: they deal the tiles round robin over tile_at's order (dealt_tile), so that no
// launch needs the counter zeroed first and each CTA's tile indices follow from blockIdx.x and gridDim.x alone. Where
// the tiles' lengths differ (causal, any window, varlen) the CTAs take them from the counter as they free up, which
// leaves the last wave the shortest tiles. Dealt under the causal mask, round robin over the single tiles lost 6-18%
// on the causal rows at d = 128 (each CTA's turns landing at different depths of the falling order), and turns that
// paired a group's long tiles with its short ones still lost 2-6% at d = 64 and 128, 512-8192 tokens, against the
// counter (same-run A/Bs, docs/HISTORY.md); under a full mask the deal gained 1-3%.
//
// Invariants: tile_at is a bijection from [0, num_tiles()) onto (batch, head, query tile); groups come in
// order; within a group, kv_tiles never increases (without a sliding window; under one the order is still a
// bijection, but a band's length need not fall monotonically). The turns of all CTAs deal every tile index exactly
// once; a CTA's turns rise, and once one is past num_tiles() so is every later one. A query tile
// visits the key/value tiles from the one holding its first seeing row's first visible key (0 without a left window
// bound) to the one holding its last row's last visible key (none for a tile whose rows see no key).
#pragma once

#include <cstdint>

#include "schedule/host_device.hpp"
#include "schedule/mask.hpp"
#include "schedule/tile_config.hpp"

namespace dash {

struct ForwardTile {
  int kv_tiles;  // key/value tiles to visit: [kv_first, kv_first + kv_tiles)
  int batch;
  int head;
  int q_tile;
  int kv_first = 0;  // 0 unless a sliding window bounds the left side
};

// Bytes of K and V that the CTAs of one head group may read at one time: about a quarter of the H200's 60 MiB
// L2, which leaves the rest to Q, O, the other group's tail and the L2's split into two partitions. FA3 sizes its
// head sections the same way. Nsight Compute at d = 128, causal, 1024 tokens put DASH's L2 hit rate at 51% with
// 32 MiB against FA3's 61%; same-run A/B on the H200 (bf16, the paper grid and GQA rows, docs/HISTORY.md):
// 16 MiB against 32, causal rows +1 to +4.6% (GQA rows -1 to +4.3%), 1.012x in geometric mean over all rows.
inline constexpr int64_t kForwardL2Budget = int64_t{16} << 20;

// Consecutive (batch, query head) pairs whose tiles are ordered together: under the causal mask the query
// heads of as many key/value heads as fit kForwardL2Budget, at least one and at most all of them; under a
// full mask one.
DASH_HOST_DEVICE constexpr int forward_heads_per_group(bool causal, int64_t seqlen_k, int head_dim, int element_bytes,
                                                       int heads_q, int heads_kv, int batch) {
  if (!causal) return 1;
  const int64_t kv_head_bytes = 2 * seqlen_k * head_dim * element_bytes;  // K and V of one key/value head
  const int64_t fitting = kv_head_bytes >= kForwardL2Budget ? 1 : kForwardL2Budget / kv_head_bytes;
  const int64_t all = int64_t{heads_kv} * batch;
  return static_cast<int>((fitting < all ? fitting : all) * (heads_q / heads_kv));
}

// Whether a forward kernel may deal its tiles (ForwardTileOrder::dealt_tile; kernels/sm90/fwd_config.cuh's
// kDealsTiles): the dense kernels without a left window bound, the only ones whose tiles can all be equally long.
DASH_HOST_DEVICE constexpr bool forward_may_deal_tiles(bool varlen, bool left_bounded) {
  return !varlen && !left_bounded;
}

// Whether the CTAs of a dense kernel deal the tiles among themselves (ForwardTileOrder::dealt_tile) rather than take
// them from the global counter, which the launch must then zero: where every tile is equally long, which holds where
// every row sees every key (the file comment says why).
DASH_HOST_DEVICE bool forward_deals_tiles(const MaskShape& mask) { return mask.sees_all_keys(); }

struct ForwardTileOrder {
  MaskShape mask;
  int block_q;
  int block_kv;
  int heads_q;
  int batch;
  int heads_per_group;  // forward_heads_per_group; any value >= 1 gives a valid order

  DASH_HOST_DEVICE int q_tiles() const { return ceil_div(mask.seqlen_q, block_q); }
  DASH_HOST_DEVICE int num_tiles() const { return q_tiles() * heads_q * batch; }

  // One past the key/value tile holding the last key the tile's last row sees (0 if it sees none).
  DASH_HOST_DEVICE int kv_end_of(int q_tile) const {
    const int end = (q_tile + 1) * block_q;
    const int last_row = (end < mask.seqlen_q ? end : mask.seqlen_q) - 1;
    return ceil_div(mask.visible_keys(last_row), block_kv);
  }
  // The key/value tile holding the first key the tile's first row that sees any key sees: 0 unless a sliding
  // window bounds the left side. The rows that see no key come first (those the right bound leaves before key
  // 0); a tile whose rows see none gets 0, with kv_end_of 0.
  DASH_HOST_DEVICE int kv_first_of(int q_tile) const {
    if (mask.left_bound() < 0) return 0;
    const int right = mask.right_bound();
    const int earliest = right < 0 ? 0 : -mask.diagonal_offset() - right;  // first row that sees a key
    const int row = q_tile * block_q > earliest ? q_tile * block_q : earliest;
    if (row >= mask.seqlen_q || kv_end_of(q_tile) == 0) return 0;
    return mask.first_visible_key(row) / block_kv;
  }
  DASH_HOST_DEVICE int kv_tiles_of(int q_tile) const { return kv_end_of(q_tile) - kv_first_of(q_tile); }

  // The tile CTA `cta` of `ctas` takes in its turn `turn` (0, 1, ...) where the CTAs deal the tiles: round robin,
  // index turn * ctas + cta; the CTA's first turn at or past num_tiles() is its last.
  DASH_HOST_DEVICE static int dealt_tile(int cta, int ctas, int turn) { return turn * ctas + cta; }

  DASH_HOST_DEVICE ForwardTile tile_at(int t) const {
    const int tiles_per_head = q_tiles();
    const int heads = heads_q * batch;  // (batch, head) pairs, batch major
    const int group_tiles = heads_per_group * tiles_per_head;
    const int first_head = t / group_tiles * heads_per_group;
    const int remaining = heads - first_head;
    const int group_heads = remaining < heads_per_group ? remaining : heads_per_group;
    const int within = t % group_tiles;
    const int rank = within / group_heads;  // 0: the tiles that see the most keys
    const int q_tile = mask.causal ? tiles_per_head - 1 - rank : rank;
    const int bh = first_head + within % group_heads;
    const int kv_first = kv_first_of(q_tile);
    return ForwardTile{kv_end_of(q_tile) - kv_first, bh / heads_q, bh % heads_q, q_tile, kv_first};
  }
};

}  // namespace dash
