// Tests of packed_sequence (schedule/varlen.hpp), which the varlen kernels call on the device to read each
// sequence's rows from cu_seqlens: offsets and lengths as given for offsets that keep the contract, and, for
// offsets that break it, sequences clamped into the packed tensors and the plan's maxima (and the promise), so that
// no kernel reads or writes outside the tensors or runs a plan it was not proven for.
#include <gtest/gtest.h>

#include <vector>

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
  expect_sequence(packed_sequence(batch, 1), 20, 600, 0, 0);   // decreasing: empty
  expect_sequence(packed_sequence(batch, 2), 10, 0, 90, 90);   // the end clamped to total_q
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

}  // namespace
}  // namespace dash
