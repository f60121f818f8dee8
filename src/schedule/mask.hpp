// The attention mask, defined once for the reference, the schedule model and the kernels.
//
// Masks are FlashAttention's, aligned to the bottom-right corner of the (seqlen_q x seqlen_k) score matrix.
// With d = seqlen_k - seqlen_q, query row i sees key column j iff
//   i + d - left <= j <= i + d + right,
// where (left, right) is the sliding window (FlashAttention's window_size) and a negative bound leaves its
// side unbounded; causal sets right to 0 whatever the window says, as FlashAttention does. No window and
// not causal is the full mask; causal alone is j <= i + d, so when seqlen_q > seqlen_k the first
// seqlen_q - seqlen_k rows see no key at all.
//
// Invariants the tiled problem builds on: the keys a row sees are one contiguous range, so are the rows a key
// is seen by, and both ends of either range never decrease as the row (the key) grows. A row that sees a key
// sees [first_visible_key(row), visible_keys(row)); the others see the empty range.
#pragma once

#include "schedule/host_device.hpp"

namespace dash {

// A window bound that leaves its side open (FlashAttention's -1).
inline constexpr int kNoWindowBound = -1;

// FlashAttention's window_size = (left, right): how far before and after its diagonal a query row sees.
struct SlidingWindow {
  int left = kNoWindowBound;
  int right = kNoWindowBound;
};

struct MaskShape {
  int seqlen_q;
  int seqlen_k;
  bool causal;
  SlidingWindow window{};  // the kernels build masks without one: they run the full and causal masks only

  // Keys after the diagonal a row sees (kNoWindowBound: all of them).
  DASH_HOST_DEVICE int right_bound() const { return causal ? 0 : (window.right < 0 ? kNoWindowBound : window.right); }
  DASH_HOST_DEVICE int left_bound() const { return window.left < 0 ? kNoWindowBound : window.left; }
  DASH_HOST_DEVICE int diagonal_offset() const { return seqlen_k - seqlen_q; }

  // One past the last key column query row `row` sees (0 when it sees none). The causal case comes first and
  // alone, so that the kernels' step loops, which test it per row, compile to what they did before windows.
  DASH_HOST_DEVICE int visible_keys(int row) const {
    if (!causal && window.right < 0) return seqlen_k;
    const int end = row + 1 + seqlen_k - seqlen_q + (causal ? 0 : window.right);
    return end < 0 ? 0 : (end > seqlen_k ? seqlen_k : end);
  }
  // First key column query row `row` sees (0 when it sees none).
  DASH_HOST_DEVICE int first_visible_key(int row) const {
    const int left = left_bound();
    if (left < 0) return 0;
    return clamp(row + diagonal_offset() - left, 0, seqlen_k);
  }
  DASH_HOST_DEVICE bool visible(int row, int col) const {
    return first_visible_key(row) <= col && col < visible_keys(row);
  }
  // First query row that sees key column `col` (seqlen_q if none does).
  DASH_HOST_DEVICE int first_row_seeing(int col) const {
    const int right = right_bound();
    const int first = right < 0 ? 0 : clamp(col - diagonal_offset() - right, 0, seqlen_q);
    return first < rows_seeing_end(col) ? first : seqlen_q;
  }
  // One past the last query row that sees key column `col` (0 if none does).
  DASH_HOST_DEVICE int rows_seeing_end(int col) const {
    const int left = left_bound();
    if (left < 0) return seqlen_q;
    return clamp(col - diagonal_offset() + left + 1, 0, seqlen_q);
  }

 private:
  DASH_HOST_DEVICE static int clamp(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }
};

}  // namespace dash
