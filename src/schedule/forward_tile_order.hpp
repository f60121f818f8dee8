// The forward's tile order, one definition for the kernel's loader and the CPU tests: the t-th tile a
// persistent CTA takes from the forward's global counter, and how many key/value tiles it visits.
//
// Invariants: tile_at is a bijection from [0, num_tiles()) onto (batch, head, query tile); heads come
// in order, and within a head the query tiles that see the most keys come first (under the causal
// mask the last ones), so the last wave holds the shortest tiles. A query tile visits the key/value
// tiles up to the one holding its last row's last visible key (none for a tile whose rows see no key).
#pragma once

#include "schedule/host_device.hpp"
#include "schedule/mask.hpp"
#include "schedule/tile_config.hpp"

namespace dash {

struct ForwardTile {
  int kv_tiles;  // key/value tiles to visit: [0, kv_tiles)
  int batch;
  int head;
  int q_tile;
};

struct ForwardTileOrder {
  MaskShape mask;
  int block_q;
  int block_kv;
  int heads_q;
  int batch;

  DASH_HOST_DEVICE int q_tiles() const { return ceil_div(mask.seqlen_q, block_q); }
  DASH_HOST_DEVICE int num_tiles() const { return q_tiles() * heads_q * batch; }

  DASH_HOST_DEVICE int kv_tiles_of(int q_tile) const {
    const int end = (q_tile + 1) * block_q;
    const int last_row = (end < mask.seqlen_q ? end : mask.seqlen_q) - 1;
    return ceil_div(mask.visible_keys(last_row), block_kv);
  }

  DASH_HOST_DEVICE ForwardTile tile_at(int t) const {
    const int tiles_per_head = q_tiles();
    const int within = t % tiles_per_head;
    const int q_tile = mask.causal ? tiles_per_head - 1 - within : within;
    const int bh = t / tiles_per_head;
    return ForwardTile{kv_tiles_of(q_tile), bh / heads_q, bh % heads_q, q_tile};
  }
};

}  // namespace dash
