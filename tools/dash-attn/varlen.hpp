// The varlen flags of dash-attn plan, prove, emulate, check and bench: a batch of sequences of different lengths,
// given as FlashAttention gives it (cu_seqlens), checked against the shape flags, and planned as
// planner/varlen_plan.hpp plans it (plan, prove, emulate) or as the library plans it (plan_varlen_backward: check and
// bench, which run the library's varlen kernels on a packed batch of these lengths, harness/varlen_harness.hpp).
//
//   --cu-seqlens 0,100,100,3100   b + 1 query offsets of b sequences (here 100, 0 and 3000 queries): FlashAttention's
//                                 cu_seqlens_q. Offsets start at 0 and never decrease; sequence i has
//                                 offsets[i + 1] - offsets[i] tokens. The keys are the queries (self-attention)
//                                 unless --cu-seqlens-k gives theirs.
//   --cu-seqlens-k 0,90,90,2590   b + 1 key/value offsets (cu_seqlens_k), as many as --cu-seqlens.
//   --keys-within-queries         promises seqlen_k <= seqlen_q in every sequence of every batch the plan will run,
//                                 which shift and symmetric shift need; implied without --cu-seqlens-k (the keys are
//                                 the queries), checked against the lengths given with it.
// The batch is the number of sequences (--batch is refused). The plan is made from the maxima: the longest
// sequence's lengths, or --seqlen-q / --seqlen-k (--seqlen for both) where given, which every sequence must then be
// within, as FlashAttention's max_seqlen_q / max_seqlen_k. --preset sets a dense shape and refuses these flags.
// Every refusal of these flags is a bad command line (exit code 2) raised before any device is touched; check and
// bench find a build without the varlen kernel a batch needs after their device check (exit code 1).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/varlen_harness.hpp"
#include "options.hpp"
#include "planner/varlen_plan.hpp"

namespace dash::cli {

struct VarlenFlags {
  std::vector<int64_t> cu_seqlens_q;
  std::vector<int64_t> cu_seqlens_k;
  bool keys_within_queries = false;
};

void add_varlen_flags(FlagParser& parser, VarlenFlags* flags);

struct VarlenBatch {
  std::vector<SequenceLengths> lengths;  // one per sequence; empty for a dense batch (no --cu-seqlens)
  bool keys_within_queries = false;      // the promise the plan is made with (plan_varlen_schedule, and
                                         // plan_varlen_backward and the calls in check and bench)
  bool lengths_fill_maxima = true;       // auto's hint (choose_varlen_auto): every sequence at the maxima, as
                                         // varlen_lengths_fill_maxima finds it from the lengths' sums
  bool varlen() const { return !lengths.empty(); }
};

// The batch the varlen flags give (a dense one without --cu-seqlens), checked with the shape flags (file comment).
// For a varlen batch it sets shape->batch to the number of sequences and shape->seqlen_q, seqlen_k to the maxima,
// so that make_shape then builds the maximum shape.
VarlenBatch make_varlen_batch(const VarlenFlags& flags, ShapeFlags* shape, const FlagParser& parser);

// plan_varlen_schedule for the batch (its promise and hint); a refusal that --keys-within-queries would lift says so.
VarlenPlanResult plan_varlen(const TiledProblem& max_problem, const VarlenBatch& batch, Schedule schedule, int sms);

// Why this build cannot run a varlen batch of `max_shape`'s head dim, dtype and softcap variant
// (varlen_kernel_available), or empty.
std::string missing_varlen_kernel(const AttentionShape& max_shape);
// The batch packed on the device for check and bench (harness::make_varlen_problem): the lengths of `batch`,
// `padding_rows` rows after the last sequence, the maxima of `max_shape` (make_shape's, which may exceed every
// length) and the promise the plan is made with (which make_varlen_batch checked the lengths against).
harness::VarlenProblem make_device_problem(const AttentionShape& max_shape, const VarlenBatch& batch,
                                           int64_t padding_rows, uint64_t seed, bool with_reference);
// Query and key tokens of all sequences together (the last offsets).
int64_t total_query_tokens(const VarlenBatch& batch);
int64_t total_key_tokens(const VarlenBatch& batch);

// "3 sequences, 3100 query and 2590 key tokens; every seqlen_k <= seqlen_q promised"
std::string describe_varlen(const VarlenBatch& batch);
// "100/90, 0/0, 3000/2500": seqlen_q/seqlen_k of each sequence, `separator` between them.
std::string describe_lengths(const VarlenBatch& batch, const std::string& separator = ", ");
// {"sequences": b, "keys_within_queries": ..., "seqlen_q": [...], "seqlen_k": [...]}, then the `extra` members
// (already encoded).
std::string varlen_json(const VarlenBatch& batch, const std::vector<std::pair<std::string, std::string>>& extra = {});

}  // namespace dash::cli
