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
// contiguous range, its band [q_begin, q_end), under every mask (mask.hpp): [0, num_q_tiles) under the
// full mask, [q_begin, num_q_tiles) under the causal one, a band of the diagonal under a sliding window.
// Likewise query tile v is seen by the contiguous key/value tiles [kv_begin(v), kv_end(v)), which start at 0
// unless a window bounds the left side. All four ends never decrease with the tile, and a tile that sees
// nothing gets the empty range at 0.
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
  int split;    // which part of the query-head group
  int head_q0;  // first query head of the part
};

struct TiledProblem {
  int batch;
  int heads_kv;
  int group_size;    // query heads per key/value head
  int group_splits;  // divides group_size
  int seqlen_q;
  int seqlen_k;
  int block_q;
  int block_kv;
  bool causal;
  SlidingWindow window{};  // none for the shapes the kernels run; the planner canonicalizes it

  DASH_HOST_DEVICE MaskShape mask() const { return MaskShape{seqlen_q, seqlen_k, causal, window}; }
  // Whether a sliding window bounds the mask beyond the causal right bound.
  DASH_HOST_DEVICE bool windowed() const { return window.left >= 0 || (!causal && window.right >= 0); }
  DASH_HOST_DEVICE int heads_per_job() const { return group_size / group_splits; }
  DASH_HOST_DEVICE int heads_q() const { return heads_kv * group_size; }
  DASH_HOST_DEVICE int real_q_tiles() const { return ceil_div(seqlen_q, block_q); }

  // --- the schedule's view ---------------------------------------------------------------------
  DASH_HOST_DEVICE int num_heads() const { return batch * heads_kv * group_splits; }
  DASH_HOST_DEVICE int num_kv_tiles() const { return ceil_div(seqlen_k, block_kv); }
  DASH_HOST_DEVICE int num_q_tiles() const { return real_q_tiles() * heads_per_job(); }

  // The band of (virtual) query tiles key/value tile `kv` sees: [q_begin(kv), q_end(kv)). Each function takes
  // the full and causal masks' case first, so that the kernels compute for them what they did before windows.
  DASH_HOST_DEVICE int q_begin(int kv) const {
    const MaskShape m = mask();
    const int col = first_seen_col(m, kv);
    return col < seen_cols_end(kv) ? m.first_row_seeing(col) / block_q * heads_per_job() : 0;
  }
  DASH_HOST_DEVICE int q_end(int kv) const {
    if (window.left < 0) return num_q_tiles();  // no left bound: every key is seen down to the last row
    const MaskShape m = mask();
    const int end = seen_cols_end(kv);
    if (first_seen_col(m, kv) >= end) return 0;
    return ceil_div(m.rows_seeing_end(end - 1), block_q) * heads_per_job();
  }
  // The key/value tiles that contribute to (virtual) query tile v: [kv_begin(v), kv_end(v)).
  DASH_HOST_DEVICE int kv_begin(int v) const {
    if (window.left < 0) return 0;  // no left bound: every row that sees a key sees key 0
    const MaskShape m = mask();
    const int q = v / heads_per_job();
    const int row = first_seeing_row(m, q);
    return row < seeing_rows_end(q) ? m.first_visible_key(row) / block_kv : 0;
  }
  // The last row of the tile sees the most keys; a tile whose rows see none (all before the right bound) gets 0.
  DASH_HOST_DEVICE int kv_end(int v) const {
    return ceil_div(mask().visible_keys(seeing_rows_end(v / heads_per_job()) - 1), block_kv);
  }
  DASH_HOST_DEVICE int num_contributors(int v) const { return kv_end(v) - kv_begin(v); }

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

 private:
  // Key columns of tile `kv` that some row sees: [first_seen_col, seen_cols_end), empty when the window's
  // left bound leaves the whole tile behind every row. (A column is seen iff d - left <= col <
  // seqlen_q + d + right; past the right bound lie no columns, as col < seqlen_k <= seqlen_q + d.)
  DASH_HOST_DEVICE int first_seen_col(const MaskShape& m, int kv) const {
    const int col = kv * block_kv;
    const int oldest = m.diagonal_offset() - m.left_bound();
    return m.left_bound() >= 0 && col < oldest ? oldest : col;
  }
  DASH_HOST_DEVICE int seen_cols_end(int kv) const {
    const int end = (kv + 1) * block_kv;
    return end < seqlen_k ? end : seqlen_k;
  }
  // Rows of real query tile q that see some key: [first_seeing_row, seeing_rows_end), empty when the right
  // bound leaves every row of the tile before key 0 (rows below -d - right see nothing).
  DASH_HOST_DEVICE int first_seeing_row(const MaskShape& m, int q) const {
    const int row = q * block_q;
    const int right = m.right_bound();
    const int earliest = -m.diagonal_offset() - right;
    return right >= 0 && row < earliest ? earliest : row;
  }
  DASH_HOST_DEVICE int seeing_rows_end(int q) const {
    const int end = (q + 1) * block_q;
    return end < seqlen_q ? end : seqlen_q;
  }
};

}  // namespace dash
