// The attention mask, defined once for the reference, the schedule model and the kernels.
//
// Causal masks are aligned to the bottom-right corner of the (seqlen_q x seqlen_k) score matrix, as in
// FlashAttention: query row i sees key column j iff j <= i + (seqlen_k - seqlen_q). When
// seqlen_q > seqlen_k the first seqlen_q - seqlen_k rows see no key at all.
#pragma once

#include "schedule/host_device.hpp"

namespace dash {

struct MaskShape {
  int seqlen_q;
  int seqlen_k;
  bool causal;

  // Largest key column query row `row` may see, plus one (the row's visible prefix length).
  DASH_HOST_DEVICE int visible_keys(int row) const {
    if (!causal) return seqlen_k;
    const int end = row + 1 + seqlen_k - seqlen_q;
    return end < 0 ? 0 : (end > seqlen_k ? seqlen_k : end);
  }
  DASH_HOST_DEVICE bool visible(int row, int col) const { return col < visible_keys(row); }
  // First query row that sees key column `col` (seqlen_q if none does).
  DASH_HOST_DEVICE int first_row_seeing(int col) const {
    if (!causal) return 0;
    const int row = col + seqlen_q - seqlen_k;
    return row < 0 ? 0 : row;
  }
};

}  // namespace dash
