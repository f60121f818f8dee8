// The forward's tile order (schedule/forward_tile_order.hpp), which the GPU loader runs: every (batch,
// head, query tile) exactly once; groups of heads_per_group heads in order, the longest tiles of a group
// first across its heads; each tile's key/value count equal to a brute-force count over its rows from the
// mask; the group size the launch derives from the shape (forward_heads_per_group); the deal by which the CTAs share
// equally long tiles without a counter (forward_deals_tiles, dealt_tile), and the CTA pairs it allows
// (forward_may_pair).
#include <algorithm>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "schedule/forward_tile_order.hpp"

namespace dash {
namespace {

// Key/value tiles that some row of query tile `q_tile` sees, counted row by row.
int brute_force_kv_tiles(const ForwardTileOrder& order, int q_tile) {
  int keys = 0;
  for (int row = q_tile * order.block_q; row < std::min((q_tile + 1) * order.block_q, order.mask.seqlen_q); ++row) {
    keys = std::max(keys, order.mask.visible_keys(row));
  }
  return (keys + order.block_kv - 1) / order.block_kv;
}

TEST(ForwardTileOrder, CoversEveryTileOnceGroupByGroupLongestFirstWithTheMasksKeyCounts) {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 400; ++trial) {
    const bool causal = trial % 2 == 1;
    const int seqlen_q = std::uniform_int_distribution<int>(1, 1200)(rng);
    const int seqlen_k = std::uniform_int_distribution<int>(1, 1200)(rng);
    // The kernels' tile shapes (schedule/tile_config.hpp): 192x128 (d = 64, long), 128x176 (d = 128, full)
    // and 128x128.
    const int64_t long_enough = 1 << 20;
    const TileShape shape = trial % 4 == 0   ? forward_tile_shape(64, causal, long_enough, long_enough)
                            : trial % 4 == 1 ? forward_tile_shape(128, causal, long_enough, long_enough)
                                             : forward_tile_shape(128, causal, 1, 1);
    const int heads_q = std::uniform_int_distribution<int>(1, 5)(rng);
    const int batch = std::uniform_int_distribution<int>(1, 3)(rng);
    // Groups of one head, of some heads (the last one short), and of more heads than there are.
    const int heads_per_group = std::uniform_int_distribution<int>(1, heads_q * batch + 1)(rng);
    const ForwardTileOrder order{
        MaskShape{seqlen_q, seqlen_k, causal}, shape.block_q, shape.block_kv, heads_q, batch, heads_per_group};
    std::set<std::tuple<int, int, int>> seen;
    int previous_group = -1, previous_kv_tiles = 0;
    for (int t = 0; t < order.num_tiles(); ++t) {
      const ForwardTile tile = order.tile_at(t);
      ASSERT_TRUE(seen.insert({tile.batch, tile.head, tile.q_tile}).second) << "tile " << t << " repeats";
      ASSERT_EQ(tile.kv_tiles, brute_force_kv_tiles(order, tile.q_tile)) << "tile " << t;
      ASSERT_EQ(tile.kv_first, 0) << "no window: every tile starts at key 0";
      const int group = (tile.batch * heads_q + tile.head) / heads_per_group;
      ASSERT_GE(group, previous_group) << "groups in order";
      if (group == previous_group) {
        EXPECT_LE(tile.kv_tiles, previous_kv_tiles) << "longest tiles first within a group, tile " << t;
      }
      previous_group = group;
      previous_kv_tiles = tile.kv_tiles;
    }
    EXPECT_EQ(static_cast<int>(seen.size()), order.q_tiles() * heads_q * batch);
  }
}

// Under a sliding window a query tile visits [kv_first, kv_first + kv_tiles): from the tile holding the smallest
// first key of a row that sees any key to the one holding the largest last key, counted row by row; a tile whose
// rows see no key visits none (the kernel then writes O = 0, LSE = -inf). Random windows (left, right, causal,
// bounds of 0 and past the sequence, canonicalized as the launch does), lengths and the kernels' tile shapes.
TEST(ForwardTileOrder, VisitsTheKeyValueTilesOfEachQueryTilesBandUnderASlidingWindow) {
  std::mt19937 rng(20261202);
  int empty_tiles = 0, offset_tiles = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const bool causal = trial % 3 == 1;
    const int seqlen_q = std::uniform_int_distribution<int>(1, 1100)(rng);
    const int seqlen_k = std::uniform_int_distribution<int>(1, 1100)(rng);
    const auto bound = [&] {
      const int pick = std::uniform_int_distribution<int>(0, 5)(rng);
      return pick == 0 ? -1 : pick == 1 ? 0 : pick == 2 ? 2000 : std::uniform_int_distribution<int>(0, 700)(rng);
    };
    const MaskShape mask = canonical_mask(seqlen_q, seqlen_k, causal, bound(), bound());
    const TileShape shape = trial % 2 == 0 ? TileShape{kForwardBlockQ, kForwardBlockKv}
                                           : TileShape{kForwardTallBlockQ, kForwardWideBlockKv};
    const ForwardTileOrder order{mask, shape.block_q, shape.block_kv, 2, 1, 1};
    for (int t = 0; t < order.num_tiles(); ++t) {
      const ForwardTile tile = order.tile_at(t);
      int first = seqlen_k, end = 0;
      for (int row = tile.q_tile * shape.block_q; row < std::min((tile.q_tile + 1) * shape.block_q, seqlen_q); ++row) {
        for (int col = 0; col < seqlen_k; ++col) {
          if (!mask.visible(row, col)) continue;
          first = std::min(first, col);
          end = std::max(end, col + 1);
        }
      }
      SCOPED_TRACE("trial " + std::to_string(trial) + ", tile " + std::to_string(t));
      if (end == 0) {
        ASSERT_EQ(tile.kv_tiles, 0);
        ++empty_tiles;
        continue;
      }
      ASSERT_EQ(tile.kv_first, first / shape.block_kv);
      ASSERT_EQ(tile.kv_first + tile.kv_tiles, (end + shape.block_kv - 1) / shape.block_kv);
      if (tile.kv_first > 0) ++offset_tiles;
    }
  }
  EXPECT_GT(empty_tiles, 0) << "some tiles see no key";
  EXPECT_GT(offset_tiles, 0) << "some tiles start past key 0";
}

// The CTAs deal the tiles exactly where every tile visits as many key/value tiles (forward_deals_tiles), and there
// the deal gives every tile to exactly one CTA, each CTA's turns rise, and once a turn is past the tiles every later
// one is (so a CTA's first turn past the tiles is its last, as the loader assumes): under full and causal masks,
// windows on either side, groups of one head, of some, and of more than there are, and more CTAs than tiles. Causal
// masks and windows whose tiles all happen to be equally long (one query tile, say) still take the counter:
// forward_deals_tiles asks for no bound at all, and a window that binds nothing is no bound.
TEST(ForwardTileOrder, TheCtasDealEquallyLongTilesRoundRobinEveryTileToOneCtaAndTakeTheOthersFromTheCounter) {
  std::mt19937 rng(20261205);
  int dealt_orders = 0, counter_orders = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const int seqlen_q = std::uniform_int_distribution<int>(1, 2000)(rng);
    const int seqlen_k = std::uniform_int_distribution<int>(1, 2000)(rng);
    const int kind = trial % 4;  // full, causal, right-only window, left-bounded window
    const int right = kind == 2 ? std::uniform_int_distribution<int>(0, 500)(rng) : -1;
    const int left = kind == 3 ? std::uniform_int_distribution<int>(0, 500)(rng) : -1;
    const MaskShape mask = canonical_mask(seqlen_q, seqlen_k, kind == 1, left, right);
    const TileShape shape =
        trial % 2 == 0 ? TileShape{kForwardBlockQ, kForwardBlockKv} : TileShape{kForwardTallBlockQ, kForwardBlockKv};
    const int heads_q = std::uniform_int_distribution<int>(1, 6)(rng);
    const int batch = std::uniform_int_distribution<int>(1, 4)(rng);
    const int heads_per_group = std::uniform_int_distribution<int>(1, heads_q * batch + 1)(rng);
    const ForwardTileOrder order{mask, shape.block_q, shape.block_kv, heads_q, batch, heads_per_group};
    const int ctas = std::uniform_int_distribution<int>(1, 300)(rng);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(ctas) + " CTAs");
    std::set<int> lengths;
    for (int t = 0; t < order.num_tiles(); ++t) lengths.insert(order.tile_at(t).kv_tiles);
    if (lengths.size() > 1) {
      ASSERT_FALSE(forward_deals_tiles(order.mask)) << "tiles of different lengths are dealt";
    }
    // A window that binds nothing (canonical_mask drops it) deals as the full mask does.
    if (kind == 0) {
      ASSERT_TRUE(forward_deals_tiles(order.mask)) << "the full mask deals";
    }
    if (!forward_deals_tiles(order.mask)) {
      ++counter_orders;
      continue;
    }
    ++dealt_orders;
    std::vector<int> owner(order.num_tiles(), -1);
    for (int cta = 0; cta < ctas; ++cta) {
      int turns = 0;
      for (int previous = -1;; ++turns) {
        const int t = ForwardTileOrder::dealt_tile(cta, ctas, turns);
        if (t >= order.num_tiles()) break;
        ASSERT_GT(t, previous) << "CTA " << cta << "'s turns rise";
        previous = t;
        ASSERT_EQ(owner[t], -1) << "tile " << t << " dealt twice";
        owner[t] = cta;
      }
      for (int later = turns + 1; later < turns + 4; ++later) {
        ASSERT_GE(ForwardTileOrder::dealt_tile(cta, ctas, later), order.num_tiles()) << "CTA " << cta;
      }
    }
    ASSERT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << "a tile no CTA takes";
  }
  EXPECT_GT(dealt_orders, 0);
  EXPECT_GT(counter_orders, 0);
}

// The forward's CTA pairs (forward_may_pair, kernels/sm90/fwd_loader.cuh) rest on the full-mask deal: with an even
// count of CTAs and an even count of query tiles per head, CTAs 2c and 2c + 1 take in each turn two neighbouring
// query tiles of one head, which visit the same key/value tiles, and their turns end together, so the pair loads the
// same key/value tiles in one order. The negative control: with an odd count of query tiles some pair's two tiles
// belong to two heads (two different K and V), which is why forward_may_pair asks for an even count.
TEST(ForwardTileOrder, UnderAFullMaskTheDealGivesEachCtaPairOneHeadsNeighbouringTilesWhereTheHeadsTilesAreEven) {
  // Whether every pair (2c, 2c + 1) of `ctas` takes, turn by turn, tiles of one (batch, head) with equal key/value
  // ranges, and no turn for one CTA of a pair that the other lacks.
  const auto pairs_share_key_value_tiles = [](const ForwardTileOrder& order, int ctas) {
    for (int pair = 0; pair < ctas / kForwardPairCtas; ++pair) {
      for (int turn = 0;; ++turn) {
        const int first = ForwardTileOrder::dealt_tile(kForwardPairCtas * pair, ctas, turn);
        const int second = ForwardTileOrder::dealt_tile(kForwardPairCtas * pair + 1, ctas, turn);
        const bool first_done = first >= order.num_tiles();
        if (first_done != (second >= order.num_tiles())) return false;
        if (first_done) break;
        const ForwardTile a = order.tile_at(first);
        const ForwardTile b = order.tile_at(second);
        if (a.batch != b.batch || a.head != b.head || a.kv_first != b.kv_first || a.kv_tiles != b.kv_tiles ||
            b.q_tile != a.q_tile + 1) {
          return false;
        }
      }
    }
    return true;
  };
  std::mt19937 rng(20261206);
  int odd_counterexamples = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int head_dim = trial % 3 == 0 ? 128 : trial % 3 == 1 ? 192 : 256;
    const int seqlen_q = std::uniform_int_distribution<int>(1, 3000)(rng);
    const int seqlen_k = std::uniform_int_distribution<int>(1, 3000)(rng);
    const MaskShape mask = canonical_mask(seqlen_q, seqlen_k, /*causal=*/false, -1, -1);
    const TileShape tile = forward_tile_shape(head_dim, /*causal=*/false, seqlen_q, seqlen_k);
    const int heads_q = std::uniform_int_distribution<int>(1, 6)(rng);
    const int batch = std::uniform_int_distribution<int>(1, 4)(rng);
    const ForwardTileOrder order{mask, tile.block_q, tile.block_kv, heads_q, batch, 1};
    const int ctas = kForwardPairCtas * std::uniform_int_distribution<int>(1, 150)(rng);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(ctas) + " CTAs, " +
                 std::to_string(order.q_tiles()) + " query tiles a head");
    ASSERT_TRUE(forward_deals_tiles(order.mask));
    const bool may_pair = forward_may_pair(head_dim, tile, false, false, false, false, seqlen_q);
    EXPECT_EQ(may_pair, order.q_tiles() % kForwardPairCtas == 0);
    if (may_pair) {
      EXPECT_TRUE(pairs_share_key_value_tiles(order, ctas));
    } else if (!pairs_share_key_value_tiles(order, ctas)) {
      ++odd_counterexamples;
    }
  }
  EXPECT_GT(odd_counterexamples, 0) << "the negative control: odd query tile counts split some pair across heads";
  // Only the full mask, without softcap, on dense batches, at the head dims whose row pairs, on 128-row tiles.
  const TileShape base128 = forward_base_tile_shape(128);
  EXPECT_TRUE(forward_may_pair(128, base128, false, false, false, false, 2048));
  EXPECT_FALSE(forward_may_pair(128, base128, true, false, false, false, 2048));
  EXPECT_FALSE(forward_may_pair(128, base128, false, true, false, false, 2048));
  EXPECT_FALSE(forward_may_pair(128, base128, false, false, true, false, 2048));
  EXPECT_FALSE(forward_may_pair(128, base128, false, false, false, true, 2048));
  EXPECT_FALSE(forward_may_pair(128, base128, false, false, false, false, 2048 + 1));
  EXPECT_FALSE(forward_may_pair(64, forward_base_tile_shape(64), false, false, false, false, 2048));
  EXPECT_FALSE(forward_may_pair(96, forward_base_tile_shape(96), false, false, false, false, 2048));
  EXPECT_FALSE(forward_may_pair(64, TileShape{kForwardTallBlockQ, kForwardBlockKv}, false, false, false, false, 3840));
  // The choice takes them only in builds that have the paired kernels.
  const ForwardKernelChoice choice = forward_kernel_choice(256, false, false, false, false, false, 4096, 4096);
  EXPECT_EQ(choice.paired, kForwardPairedCtasBuilt);
}

TEST(ForwardTileOrder, CausalHeadGroupsHoldWholeKeyValueHeadsWithinTheL2BudgetAndFullMasksGoHeadByHead) {
  constexpr int kBytes = 2;
  // One key/value head of K and V at d = 128, 8192 keys: 4 MiB, so 4 fit the 16 MiB budget; with 4 query heads
  // per key/value head, 16 query heads.
  static_assert(kForwardL2Budget == int64_t{16} << 20, "the cases below count heads of a 16 MiB budget");
  EXPECT_EQ(forward_heads_per_group(true, 8192, 128, kBytes, 32, 8, 2), 16);
  EXPECT_EQ(forward_heads_per_group(true, 8192, 128, kBytes, 16, 16, 2), 4);
  // Never fewer than one key/value head's query heads, even when one head exceeds the budget.
  EXPECT_EQ(forward_heads_per_group(true, int64_t{1} << 20, 128, kBytes, 28, 4, 1), 7);
  // 128 KiB per key/value head at d = 64 and 512 keys: 128 fit, but the second launch has only 8 heads.
  EXPECT_EQ(forward_heads_per_group(true, 512, 64, kBytes, 32, 32, 32), 128);
  EXPECT_EQ(forward_heads_per_group(true, 512, 64, kBytes, 4, 4, 2), 8);
  EXPECT_EQ(forward_heads_per_group(false, 8192, 128, kBytes, 32, 8, 2), 1);
  for (int64_t seqlen_k : {int64_t{1}, int64_t{300}, int64_t{4096}, int64_t{1} << 20}) {
    for (int heads_kv : {1, 2, 8}) {
      const int heads_q = heads_kv * 4;
      const int group = forward_heads_per_group(true, seqlen_k, 64, kBytes, heads_q, heads_kv, 3);
      EXPECT_EQ(group % (heads_q / heads_kv), 0) << "whole key/value heads";
      EXPECT_GE(group, heads_q / heads_kv);
      EXPECT_LE(group, heads_q * 3);
      const int64_t kv_heads = group / (heads_q / heads_kv);
      EXPECT_TRUE(kv_heads == 1 || kv_heads * 2 * seqlen_k * 64 * kBytes <= kForwardL2Budget) << seqlen_k;
    }
  }
}

TEST(ForwardTileShape, ShortAndTallTilesAtHeadDim64AndWideOnesAtHeadDim128FromTheMeasuredLengths) {
  for (bool causal : {false, true}) {
    const int tall_from = causal ? kForwardTallFromCausal : kForwardTallFromFull;
    for (int64_t seqlen_q : {int64_t{1}, int64_t{kForwardShortUpToFull}, int64_t{kForwardShortUpToFull} + 1,
                             int64_t{tall_from} - 1, int64_t{tall_from}, int64_t{1} << 20}) {
      for (int64_t seqlen_k : {int64_t{1}, int64_t{kForwardShortUpToFull}, int64_t{kForwardShortUpToFull} + 1,
                               int64_t{kForwardWideFromKeys} - 1, int64_t{kForwardWideFromKeys}}) {
        const TileShape d64 = forward_tile_shape(64, causal, seqlen_q, seqlen_k);
        // Short tiles only under the full mask with both lengths up to kForwardShortUpToFull.
        const bool short_tiles = !causal && seqlen_q <= kForwardShortUpToFull && seqlen_k <= kForwardShortUpToFull;
        const int block_q = short_tiles             ? kForwardShortBlockQ
                            : seqlen_q >= tall_from ? kForwardTallBlockQ
                                                    : kForwardBlockQ;
        EXPECT_EQ(d64.block_q, block_q) << seqlen_q << " " << seqlen_k;
        EXPECT_EQ(d64.block_kv, kForwardBlockKv);
        EXPECT_EQ(forward_ctas_per_sm(d64.block_q), short_tiles ? 2 : 1);
        const TileShape d128 = forward_tile_shape(128, causal, seqlen_q, seqlen_k);
        EXPECT_EQ(d128.block_q, kForwardBlockQ) << seqlen_q;
        const bool wide = !causal && seqlen_k >= kForwardWideFromKeys;
        EXPECT_EQ(d128.block_kv, wide ? kForwardWideBlockKv : kForwardBlockKv) << seqlen_k;
      }
    }
  }
  // One MMA warpgroup per 64 query rows (kernels/sm90/fwd_config.cuh); wgmma's N and the P V GEMM's K are
  // multiples of 16.
  static_assert(kForwardBlockQ % 64 == 0 && kForwardTallBlockQ % 64 == 0 && kForwardShortBlockQ % 64 == 0);
  static_assert(kForwardBlockKv % 16 == 0 && kForwardWideBlockKv % 16 == 0);
}

// Each head dim with kernels finds its own row; one without (the emulator's small models) takes the next row up, and
// one past the last row the last.
TEST(HeadDimSettings, EachRowIsFoundByItsHeadDimAndOthersTakeTheNextRowUp) {
  constexpr int kWidest = 1024;
  constexpr int kLastRow = 256;
  std::vector<int> rows;
  for (int head_dim = 1; head_dim <= kWidest; ++head_dim) {
    const int row = head_dim_settings(head_dim).head_dim;
    EXPECT_EQ(row >= head_dim, head_dim <= kLastRow) << head_dim;
    EXPECT_EQ(has_backward_kernel(head_dim), row == head_dim) << head_dim;
    if (rows.empty() || row != rows.back()) rows.push_back(row);
  }
  EXPECT_EQ(rows, (std::vector<int>{64, 96, 128, 192, kLastRow}));
  // The settings the kernels were measured with (DESIGN.md's head-dim table).
  EXPECT_EQ(backward_tile_shape(64).block_q, 128);
  EXPECT_EQ(backward_tile_shape(192).block_kv, 96);
  EXPECT_TRUE(backward_splits_keys(256) && !backward_splits_keys(128));
  EXPECT_EQ(forward_base_tile_shape(256).block_kv, kForwardBlockKvD256);
  EXPECT_TRUE(forward_has_short_tiles(64) && forward_has_tall_tiles(64) && forward_has_wide_tiles(128));
  EXPECT_FALSE(forward_has_short_tiles(128) || forward_has_tall_tiles(96) || forward_has_wide_tiles(192));
}

}  // namespace
}  // namespace dash
