// The forward's tile order, one definition for the kernel's loader and the CPU tests: the t-th tile a
// persistent CTA takes from the forward's global counter, and how many key/value tiles it visits.
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
// The dense kernels without a left window bound take no counter: the CTAs deal the tiles among themselves in turns
// (dealt_tiles), so that no launch needs the counter zeroed first and each CTA's tile indices follow from blockIdx.x
// and gridDim.x alone. Under a full mask every tile is equally long and the turns are round robin over tile_at's
// order. Where the tiles' lengths differ, a CTA's turn takes two tiles of one head group, the q-th from its front
// and the q-th from its back, whose key/value counts sum to about the same for every q (the group's tiles fall in
// length, or under a right-only window rise): round robin over the single tiles lost 6-18% on causal rows at
// d = 128, each CTA's turns landing at different depths of the falling order (same-run A/Bs on the H200,
// docs/HISTORY.md); the last, partial turn deals single tiles (dealt_tiles says how). The counter stays with the
// varlen and left-bounded kernels, whose tiles' lengths the order does not predict.
//
// Invariants: tile_at is a bijection from [0, num_tiles()) onto (batch, head, query tile); groups come in
// order; within a group, kv_tiles never increases (without a sliding window; under one the order is still a
// bijection, but a band's length need not fall monotonically). The turns of all CTAs deal every tile index exactly
// once; a CTA's turns begin at rising indices, and once one is past num_tiles() so is every later one. A query tile
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

// Whether a forward kernel's CTAs deal its tiles among themselves (ForwardTileOrder::dealt_tiles) rather than take
// them from the global counter: the dense kernels without a left window bound (the file comment says why).
DASH_HOST_DEVICE constexpr bool forward_deals_tiles(bool varlen, bool left_bounded) { return !varlen && !left_bounded; }

// The tiles of one CTA's turn (ForwardTileOrder::dealt_tiles), or of a pair unit (pair_unit): indices into tile_at's
// order, taken first then second; second == first where there is one tile, and first >= num_tiles() where none.
struct DealtTiles {
  int first;
  int second;
};

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

  // Whether every tile visits as many key/value tiles: no causal diagonal and no window bound.
  DASH_HOST_DEVICE bool tiles_equally_long() const {
    return mask.right_bound() == kNoWindowBound && mask.left_bound() == kNoWindowBound;
  }

  // Where the tiles differ in length, the deal's units: the q-th is a head group's q-th tile from the front and its
  // q-th from the back (second == first for the middle tile of a group with an odd count). The last group may hold
  // fewer heads than the others. Valid for q in [0, pair_units()).
  DASH_HOST_DEVICE int pair_units() const {
    const int heads = heads_q * batch;
    const int units_per_group = (heads_per_group * q_tiles() + 1) / 2;
    return heads / heads_per_group * units_per_group + (heads % heads_per_group * q_tiles() + 1) / 2;
  }
  DASH_HOST_DEVICE DealtTiles pair_unit(int unit) const {
    const int group_tiles = heads_per_group * q_tiles();
    const int units_per_group = (group_tiles + 1) / 2;
    const int group_start = unit / units_per_group * group_tiles;
    const int pair = unit % units_per_group;
    const int in_group = num_tiles() - group_start < group_tiles ? num_tiles() - group_start : group_tiles;
    return {group_start + pair, group_start + in_group - 1 - pair};
  }

  // The tiles CTA `cta` of `ctas` takes in its turn `turn` (0, 1, ...) without the counter. Where all tiles are
  // equally long, turn r gives CTA c tile r * ctas + c. Otherwise the whole turns give CTA c pair unit r * ctas + c
  // (the file comment says why), and the last, partial turn deals the rest of the units' tiles one by one, longest
  // first: their fronts, then their backs in reverse, CTA c taking the c-th and the (2 ctas - 1 - c)-th, so that
  // the CTAs that take a long front take a short back. Dealt whole, the last turn's pairs would leave some CTAs a
  // pair over the others; its CPU test bounds each CTA's load by the mean and one unit.
  DASH_HOST_DEVICE DealtTiles dealt_tiles(int cta, int ctas, int turn) const {
    const int tiles = num_tiles();
    if (tiles_equally_long()) {
      const int t = turn * ctas + cta;
      return {t, t};
    }
    const int units = pair_units();
    const int whole_turns = units / ctas;
    if (turn < whole_turns) return pair_unit(turn * ctas + cta);
    const int first_left = whole_turns * ctas;
    const int left = units - first_left;
    if (turn > whole_turns || left == 0) return {tiles, tiles};
    // The j-th tile of the last turn's deal, or `tiles` for none: j < left the fronts, then the backs in reverse (a
    // group's lone middle tile is dealt as its unit's front).
    const auto last_turn_tile = [&](int j) {
      if (j >= 2 * left) return tiles;
      if (j < left) return pair_unit(first_left + j).first;
      const DealtTiles unit = pair_unit(first_left + 2 * left - 1 - j);
      return unit.second != unit.first ? unit.second : tiles;
    };
    const int first = last_turn_tile(cta);
    const int second = last_turn_tile(2 * ctas - 1 - cta);
    if (first == tiles) return {second, second};
    return {first, second == tiles ? first : second};
  }

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
