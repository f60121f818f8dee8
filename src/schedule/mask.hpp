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

#include <cstdint>

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
  SlidingWindow window{};  // canonical_mask() below puts it in the form the planner and the kernels use

  // Keys after the diagonal a row sees (kNoWindowBound: all of them).
  DASH_HOST_DEVICE int right_bound() const { return causal ? 0 : (window.right < 0 ? kNoWindowBound : window.right); }
  DASH_HOST_DEVICE int left_bound() const { return window.left < 0 ? kNoWindowBound : window.left; }
  DASH_HOST_DEVICE int diagonal_offset() const { return seqlen_k - seqlen_q; }
  // Whether every row sees every key: neither a causal diagonal nor a window bound.
  DASH_HOST_DEVICE bool sees_all_keys() const {
    return right_bound() == kNoWindowBound && left_bound() == kNoWindowBound;
  }

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

// Which ends of each row's visible keys a step of the backward tests: none (the tile lies within every row's keys),
// the right ends (it crosses the causal diagonal, a right window bound or the key tail), or both (a left window
// bound as well). A compile-time choice, so that the full and causal masks' steps carry no left-end test.
enum class MaskedEnds { kNone, kRight, kBoth };

// The mask of a shape's (causal, window_left, window_right) in canonical form, one definition for the planner
// (make_tiled_problem) and the forward kernel's launcher, so that both run the same mask: a window that reduces
// to the full or causal mask becomes that mask. Causal keeps no right bound of its own (it is 0, whatever the
// window says, as in FlashAttention); a right bound of 0 makes the mask causal; a bound that no row reaches past
// (left >= seqlen_k - 1, right >= seqlen_q - 1) is dropped, as is a negative one (an open side). The bounds are
// int64 (the public shape's), so a huge one cannot wrap when narrowed.
DASH_HOST_DEVICE MaskShape canonical_mask(int seqlen_q, int seqlen_k, bool causal, int64_t left, int64_t right) {
  const bool left_reaches = left >= 0 && left < seqlen_k - 1;
  const bool right_reaches = !causal && right >= 0 && right < seqlen_q - 1;
  MaskShape mask{seqlen_q, seqlen_k, causal || (right_reaches && right == 0)};
  mask.window.left = left_reaches ? static_cast<int>(left) : kNoWindowBound;
  mask.window.right = right_reaches && !mask.causal ? static_cast<int>(right) : kNoWindowBound;
  return mask;
}

}  // namespace dash
