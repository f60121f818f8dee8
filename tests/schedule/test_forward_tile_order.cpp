// The forward's tile order (schedule/forward_tile_order.hpp), which the GPU loader runs: every (batch,
// head, query tile) exactly once, heads in order with the longest causal tiles first, and each tile's
// key/value count equal to a brute-force count over its rows from the mask.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <tuple>

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

TEST(ForwardTileOrder, CoversEveryTileOnceLongestFirstWithTheMasksKeyCounts) {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 300; ++trial) {
    const bool causal = trial % 2 == 1;
    const int seqlen_q = std::uniform_int_distribution<int>(1, 1200)(rng);
    const int seqlen_k = std::uniform_int_distribution<int>(1, 1200)(rng);
    const ForwardTileOrder order{MaskShape{seqlen_q, seqlen_k, causal}, 128, 128,
                                 std::uniform_int_distribution<int>(1, 5)(rng),
                                 std::uniform_int_distribution<int>(1, 3)(rng)};
    std::set<std::tuple<int, int, int>> seen;
    int previous_head = -1, previous_kv_tiles = 0;
    for (int t = 0; t < order.num_tiles(); ++t) {
      const ForwardTile tile = order.tile_at(t);
      ASSERT_TRUE(seen.insert({tile.batch, tile.head, tile.q_tile}).second) << "tile " << t << " repeats";
      ASSERT_EQ(tile.kv_tiles, brute_force_kv_tiles(order, tile.q_tile)) << "tile " << t;
      const int head = tile.batch * order.heads_q + tile.head;
      ASSERT_GE(head, previous_head) << "heads in order";
      if (head == previous_head) {
        EXPECT_LE(tile.kv_tiles, previous_kv_tiles) << "longest tiles first within a head";
      }
      previous_head = head;
      previous_kv_tiles = tile.kv_tiles;
    }
    EXPECT_EQ(static_cast<int>(seen.size()), order.q_tiles() * order.heads_q * order.batch);
  }
}

}  // namespace
}  // namespace dash
