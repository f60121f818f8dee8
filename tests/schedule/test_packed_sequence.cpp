// Tests of what the varlen kernels compute on the device from schedule/varlen.hpp:
// - packed_sequence, which reads each sequence's rows from cu_seqlens: offsets and lengths as given for offsets that
//   keep the contract, and, for offsets that break it, sequences clamped into the packed tensors and the plan's
//   maxima (and the promise), so that no kernel reads or writes outside the tensors or runs a plan it was not proven
//   for;
// - fit_forward_tile, the varlen forward's tiles: over the maximum problem's whole tile order, every sequence's
//   (head, query tile) exactly once, with the key/value range of a dense batch of the sequence's lengths, under the
//   full, causal and windowed masks and adversarial lengths (0, 1, a tile +-1, the maximum).
#include <map>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "schedule/varlen.hpp"

namespace dash {
namespace {

PackedBatch batch_of(const std::vector<int>& cu_q, const std::vector<int>& cu_k, int total_q, int total_k, int max_q,
                     int max_k, bool keys_within_queries = false) {
  return PackedBatch{cu_q.data(), cu_k.data(), total_q, total_k, max_q, max_k, keys_within_queries};
}

void expect_sequence(const PackedSequence& s, int q_offset, int k_offset, int seqlen_q, int seqlen_k) {
  EXPECT_EQ(s.q_offset, q_offset);
  EXPECT_EQ(s.k_offset, k_offset);
  EXPECT_EQ(s.lengths.seqlen_q, seqlen_q);
  EXPECT_EQ(s.lengths.seqlen_k, seqlen_k);
}

TEST(PackedSequence, ReadsOffsetsThatKeepTheContract) {
  const std::vector<int> cu_q{0, 0, 1, 128, 257, 257};
  const std::vector<int> cu_k{0, 5, 5, 100, 400, 410};
  const PackedBatch batch = batch_of(cu_q, cu_k, 300, 410, 129, 300);
  expect_sequence(packed_sequence(batch, 0), 0, 0, 0, 5);
  expect_sequence(packed_sequence(batch, 1), 0, 5, 1, 0);
  expect_sequence(packed_sequence(batch, 2), 1, 5, 127, 95);
  expect_sequence(packed_sequence(batch, 3), 128, 100, 129, 300);
  expect_sequence(packed_sequence(batch, 4), 257, 400, 0, 10);
}

TEST(PackedSequence, ClampsLengthsToTheMaxima) {
  const std::vector<int> cu{0, 1000, 1010};
  const PackedBatch batch = batch_of(cu, cu, 2000, 2000, 256, 128);
  expect_sequence(packed_sequence(batch, 0), 0, 0, 256, 128);
  expect_sequence(packed_sequence(batch, 1), 1000, 1000, 10, 10);
}

TEST(PackedSequence, ClampsOffsetsAndEndsIntoTheTensors) {
  // Negative offsets, offsets past the totals, decreasing offsets: every sequence stays within [0, total].
  const std::vector<int> cu_q{-50, 20, 10, 5000};
  const std::vector<int> cu_k{0, 700, -3, 90};
  const PackedBatch batch = batch_of(cu_q, cu_k, 100, 600, 1 << 20, 1 << 20);
  expect_sequence(packed_sequence(batch, 0), 0, 0, 20, 600);
  expect_sequence(packed_sequence(batch, 1), 20, 600, 0, 0);  // decreasing: empty
  expect_sequence(packed_sequence(batch, 2), 10, 0, 90, 90);  // the end clamped to total_q
  for (int b = 0; b < 3; ++b) {
    const PackedSequence s = packed_sequence(batch, b);
    EXPECT_LE(s.q_offset + s.lengths.seqlen_q, batch.total_q) << "sequence " << b;
    EXPECT_LE(s.k_offset + s.lengths.seqlen_k, batch.total_k) << "sequence " << b;
    EXPECT_GE(s.lengths.seqlen_q, 0);
    EXPECT_GE(s.lengths.seqlen_k, 0);
  }
}

TEST(PackedSequence, KeepsThePromiseOfKeysWithinQueries) {
  // A plan made with keys_within_queries is proven only for seqlen_k <= seqlen_q: a sequence that breaks it runs
  // with its keys cut to its queries.
  const std::vector<int> cu_q{0, 10, 30};
  const std::vector<int> cu_k{0, 40, 45};
  const PackedBatch promised = batch_of(cu_q, cu_k, 30, 45, 64, 64, /*keys_within_queries=*/true);
  expect_sequence(packed_sequence(promised, 0), 0, 0, 10, 10);
  expect_sequence(packed_sequence(promised, 1), 10, 40, 20, 5);
  const PackedBatch open = batch_of(cu_q, cu_k, 30, 45, 64, 64);
  expect_sequence(packed_sequence(open, 0), 0, 0, 10, 40);
}

struct ForwardFitCase {
  bool causal;
  int window_left, window_right;
};

// Every tile of the maximum order, fitted: each (sequence, head, query tile of the sequence) once, with a dense
// order's range of the sequence's lengths; the dropped ones exactly those past the sequence's query tiles.
void expect_forward_fit_covers(const std::vector<SequenceLengths>& lengths, const ForwardFitCase& c) {
  constexpr int kHeadsQ = 3;
  constexpr int kBlock = 128;
  int max_q = 1, max_k = 1;
  for (const SequenceLengths& l : lengths) {
    max_q = l.seqlen_q > max_q ? l.seqlen_q : max_q;
    max_k = l.seqlen_k > max_k ? l.seqlen_k : max_k;
  }
  const MaskShape max_mask = canonical_mask(max_q, max_k, c.causal, c.window_left, c.window_right);
  const int batch = static_cast<int>(lengths.size());
  const ForwardTileOrder order{max_mask, kBlock, kBlock, kHeadsQ, batch, /*heads_per_group=*/2};
  std::map<std::tuple<int, int, int>, int> seen;
  for (int t = 0; t < order.num_tiles(); ++t) {
    const ForwardTile planned = order.tile_at(t);
    const SequenceLengths len = lengths[planned.batch];
    const FittedForwardTile fitted = fit_forward_tile(order, planned, len);
    ForwardTileOrder dense = order;
    dense.mask.seqlen_q = len.seqlen_q;
    dense.mask.seqlen_k = len.seqlen_k;
    ASSERT_EQ(fitted.valid, planned.q_tile < dense.q_tiles()) << "t " << t;
    if (!fitted.valid) continue;
    ++seen[{planned.batch, planned.head, planned.q_tile}];
    EXPECT_EQ(fitted.mask.seqlen_q, len.seqlen_q);
    EXPECT_EQ(fitted.mask.seqlen_k, len.seqlen_k);
    EXPECT_EQ(fitted.tile.kv_first, dense.kv_first_of(planned.q_tile)) << "t " << t;
    EXPECT_EQ(fitted.tile.kv_tiles, dense.kv_tiles_of(planned.q_tile)) << "t " << t;
    // Every key a row of the tile sees lies in the range it visits.
    const int first_row = planned.q_tile * kBlock;
    const int end_row = first_row + kBlock < len.seqlen_q ? first_row + kBlock : len.seqlen_q;
    for (int row = first_row; row < end_row; ++row) {
      const MaskShape& m = fitted.mask;
      if (m.visible_keys(row) <= m.first_visible_key(row)) continue;  // sees no key
      EXPECT_GE(m.first_visible_key(row), fitted.tile.kv_first * kBlock) << "row " << row;
      EXPECT_LE(m.visible_keys(row), (fitted.tile.kv_first + fitted.tile.kv_tiles) * kBlock) << "row " << row;
    }
  }
  for (int b = 0; b < batch; ++b) {
    const int q_tiles = (lengths[b].seqlen_q + kBlock - 1) / kBlock;
    for (int h = 0; h < kHeadsQ; ++h) {
      for (int q = 0; q < q_tiles; ++q)
        EXPECT_EQ((seen[{b, h, q}]), 1) << "sequence " << b << " head " << h << " tile " << q;
    }
  }
}

TEST(FitForwardTile, CoversEverySequencesTilesOnceWithADenseBatchsRanges) {
  const std::vector<std::vector<SequenceLengths>> batches = {
      {{0, 0}, {1, 1}, {127, 127}, {129, 129}, {300, 300}, {0, 0}},
      {{100, 300}, {300, 100}, {0, 50}, {50, 0}, {257, 129}},
      {{1000, 1000}, {0, 0}, {0, 0}},
      {{256, 256}, {256, 256}, {256, 256}},
      {{1, 700}, {700, 1}, {128, 128}},
  };
  const ForwardFitCase cases[] = {{false, -1, -1}, {true, -1, -1}, {false, 64, 16}, {true, 100, -1}, {false, -1, 0}};
  for (const auto& lengths : batches) {
    for (const ForwardFitCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << "causal " << c.causal << ", window (" << c.window_left << ", "
                                        << c.window_right << "), " << lengths.size() << " sequences");
      expect_forward_fit_covers(lengths, c);
    }
  }
}

}  // namespace
}  // namespace dash
