// The attention problem as the schedule model sees it: key/value tiles that each own a chain of query
// tiles, grouped into "schedule heads" whose dQ contributions are summed in a fixed order.
//
// A job is one key/value tile of one schedule head: it keeps that tile's dK and dV in registers while it
// visits every query tile the mask lets it see, producing one partial dQ tile per visit.
//
// GQA/MQA: the G = heads_q / heads_kv query heads sharing a key/value head are folded into the job's
// query axis, so dK and dV of a key/value head are accumulated inside one job and need no cross-job
// reduction. To keep enough jobs for the machine, the G query heads may be split into `group_splits`
// equal parts, each its own schedule head; the kernels then sum the parts' fp32 dK/dV in split order.
// Within a schedule head, "virtual" query tile v stands for query tile v / heads_per_job of query head
// (first head of the part) + v % heads_per_job, so the query tiles a key/value tile sees stay one
// contiguous range [q_begin, num_q_tiles) under the causal mask.
#pragma once

#include "schedule/host_device.hpp"
#include "schedule/mask.hpp"
#include "schedule/tile_config.hpp"

namespace dash {

struct QTileCoord {
  int batch;
  int head_q;
  int q_tile;  // real query tile of that head
};

struct KvJobCoord {
  int batch;
  int head_kv;
  int split;      // which part of the query-head group
  int head_q0;    // first query head of the part
};

struct TiledProblem {
  int batch;
  int heads_kv;
  int group_size;     // query heads per key/value head
  int group_splits;   // divides group_size
  int seqlen_q;
  int seqlen_k;
  int block_q;
  int block_kv;
  bool causal;

  DASH_HOST_DEVICE MaskShape mask() const { return MaskShape{seqlen_q, seqlen_k, causal}; }
  DASH_HOST_DEVICE int heads_per_job() const { return group_size / group_splits; }
  DASH_HOST_DEVICE int heads_q() const { return heads_kv * group_size; }
  DASH_HOST_DEVICE int real_q_tiles() const { return ceil_div(seqlen_q, block_q); }

  // --- the schedule's view ---------------------------------------------------------------------
  DASH_HOST_DEVICE int num_heads() const { return batch * heads_kv * group_splits; }
  DASH_HOST_DEVICE int num_kv_tiles() const { return ceil_div(seqlen_k, block_kv); }
  DASH_HOST_DEVICE int num_q_tiles() const { return real_q_tiles() * heads_per_job(); }

  // First (virtual) query tile that key/value tile `kv` sees.
  DASH_HOST_DEVICE int q_begin(int kv) const {
    return mask().first_row_seeing(kv * block_kv) / block_q * heads_per_job();
  }
  // Number of key/value tiles that contribute to (virtual) query tile v: tiles [0, result) do.
  DASH_HOST_DEVICE int num_contributors(int v) const {
    const int q = v / heads_per_job();
    const int last_row = ((q + 1) * block_q < seqlen_q ? (q + 1) * block_q : seqlen_q) - 1;
    return ceil_div(mask().visible_keys(last_row), block_kv);
  }

  // --- from schedule coordinates to tensor coordinates -----------------------------------------
  DASH_HOST_DEVICE KvJobCoord kv_coord(int head) const {
    const int split = head % group_splits;
    const int bh = head / group_splits;
    const int head_kv = bh % heads_kv;
    return KvJobCoord{bh / heads_kv, head_kv, split, head_kv * group_size + split * heads_per_job()};
  }
  DASH_HOST_DEVICE QTileCoord q_coord(int head, int v) const {
    const KvJobCoord kv = kv_coord(head);
    return QTileCoord{kv.batch, kv.head_q0 + v % heads_per_job(), v / heads_per_job()};
  }
  // Index of the dQ tile (and of its ordering semaphore) among batch * heads_q * real_q_tiles.
  DASH_HOST_DEVICE int dq_tile_index(int head, int v) const {
    const QTileCoord c = q_coord(head, v);
    return (c.batch * heads_q() + c.head_q) * real_q_tiles() + c.q_tile;
  }
};

}  // namespace dash
