// The varlen flags of dash-attn plan, emulate, check and bench (varlen.hpp): parsing and checking the cu_seqlens
// against each other and against the shape flags, every refusal naming the flag and the rule; the maxima; the plan;
// what the GPU commands add (the kernels' own refusals, the packed device batch); the text and JSON that describe the
// batch.
#include "varlen.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "json.hpp"

namespace dash::cli {
namespace {

// FlashAttention's cu_seqlens are int32.
constexpr int64_t kMaxOffset = std::numeric_limits<int32_t>::max();

// The lengths of the sequences that --`name`'s offsets delimit (sequence i: offsets[i + 1] - offsets[i]).
std::vector<int> sequence_lengths(const std::string& name, const std::vector<int64_t>& offsets,
                                  const FlagParser& parser) {
  if (offsets.size() < 2) {
    parser.fail("--" + name + ": " + std::to_string(offsets.size()) +
                " offset; a batch of b sequences needs b + 1 (0, then where each sequence ends)");
  }
  if (offsets.front() != 0) {
    parser.fail("--" + name + ": the first offset is " + std::to_string(offsets.front()) +
                "; offsets start at 0 (FlashAttention's cu_seqlens)");
  }
  if (static_cast<int64_t>(offsets.size()) - 1 > kMaxBatchOrHeads) {
    parser.fail("--" + name + ": " + std::to_string(offsets.size() - 1) + " sequences; at most " +
                std::to_string(kMaxBatchOrHeads) + " are supported");
  }
  std::vector<int> lengths;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    if (offsets[i + 1] < offsets[i]) {
      parser.fail("--" + name + ": entry " + std::to_string(i + 1) + " (" + std::to_string(offsets[i + 1]) +
                  ") is below entry " + std::to_string(i) + " (" + std::to_string(offsets[i]) +
                  "): offsets never decrease, sequence i having offsets[i + 1] - offsets[i] tokens");
    }
    lengths.push_back(static_cast<int>(offsets[i + 1] - offsets[i]));
  }
  return lengths;
}

// The maximum of `lengths` the plan is made for: the value of the first of `bounds` given on the command line, which
// every length must be within, or else the longest length. `what` names the tokens ("queries", "keys").
int64_t maximum_length(const std::vector<int>& lengths, const std::string& list_flag, const std::string& what,
                       const std::vector<std::pair<std::string, int64_t>>& bounds, const FlagParser& parser) {
  const auto longest = std::max_element(lengths.begin(), lengths.end());
  const std::string sequence = "sequence " + std::to_string(longest - lengths.begin());
  for (const auto& [bound_flag, bound] : bounds) {
    if (!parser.given(bound_flag)) continue;
    if (*longest > bound) {
      parser.fail("--" + list_flag + ": " + sequence + " has " + std::to_string(*longest) + " " + what +
                  ", more than --" + bound_flag + " " + std::to_string(bound) +
                  ", the maximum the plan is made for: every sequence must be within it");
    }
    return bound;
  }
  if (*longest == 0) {
    parser.fail("--" + list_flag + ": every sequence has 0 " + what + "; give the maximum the plan is for with --" +
                bounds.front().first);
  }
  if (*longest > kMaxSeqlen) {
    parser.fail("--" + list_flag + ": " + sequence + " has " + std::to_string(*longest) + " " + what + ", more than " +
                std::to_string(kMaxSeqlen) + ", the most --" + bounds.front().first + " takes");
  }
  return *longest;
}

// The sum of one of the lengths over the sequences.
int64_t total_tokens(const VarlenBatch& batch, int SequenceLengths::*length) {
  int64_t sum = 0;
  for (const SequenceLengths& s : batch.lengths) sum += s.*length;
  return sum;
}

}  // namespace

void add_varlen_flags(FlagParser& parser, VarlenFlags* flags) {
  parser.add_int_list("cu-seqlens", "OFFSETS",
                      "a varlen batch: b + 1 query offsets of b sequences, e.g. 0,100,100,3100 for 100,\n"
                      "0 and 3000 queries (FlashAttention's cu_seqlens_q: from 0, never decreasing); keys\n"
                      "as queries unless --cu-seqlens-k. The batch is the sequences; the maxima planned\n"
                      "for: the longest lengths, or --seqlen-q/--seqlen-k, which must bound them",
                      &flags->cu_seqlens_q, 0, kMaxOffset, "dense");
  parser.add_int_list("cu-seqlens-k", "OFFSETS", "key/value offsets (cu_seqlens_k), as many as --cu-seqlens",
                      &flags->cu_seqlens_k, 0, kMaxOffset, "--cu-seqlens");
  parser.add_switch("keys-within-queries",
                    "promise seqlen_k <= seqlen_q in every sequence of every batch the plan will run, which\n"
                    "shift and symmetric-shift need (implied without --cu-seqlens-k)",
                    &flags->keys_within_queries);
}

VarlenBatch make_varlen_batch(const VarlenFlags& flags, ShapeFlags* shape, const FlagParser& parser) {
  if (!parser.given("cu-seqlens")) {
    for (const std::string name : {"cu-seqlens-k", "keys-within-queries"}) {
      if (parser.given(name)) parser.fail("--" + name + " describes a varlen batch: it needs --cu-seqlens");
    }
    return {};
  }
  if (parser.given("batch")) {
    parser.fail(
        "--batch does not combine with --cu-seqlens: a varlen batch has one sequence per pair of "
        "consecutive offsets");
  }
  const std::vector<int> queries = sequence_lengths("cu-seqlens", flags.cu_seqlens_q, parser);
  const bool own_keys = parser.given("cu-seqlens-k");
  const std::vector<int> keys = own_keys ? sequence_lengths("cu-seqlens-k", flags.cu_seqlens_k, parser) : queries;
  if (keys.size() != queries.size()) {
    parser.fail("--cu-seqlens-k has " + std::to_string(keys.size() + 1) + " offsets and --cu-seqlens " +
                std::to_string(queries.size() + 1) + ": both delimit the same sequences");
  }
  VarlenBatch batch;
  batch.keys_within_queries = !own_keys || flags.keys_within_queries;
  for (size_t i = 0; i < queries.size(); ++i) {
    if (batch.keys_within_queries && keys[i] > queries[i]) {
      parser.fail("--keys-within-queries promises seqlen_k <= seqlen_q in every sequence, but sequence " +
                  std::to_string(i) + " has " + std::to_string(keys[i]) + " keys (--cu-seqlens-k) and " +
                  std::to_string(queries[i]) + " queries (--cu-seqlens)");
    }
    batch.lengths.push_back({queries[i], keys[i]});
  }
  shape->batch = static_cast<int64_t>(batch.lengths.size());
  shape->seqlen_q = maximum_length(queries, "cu-seqlens", "queries",
                                   {{"seqlen-q", shape->seqlen_q}, {"seqlen", shape->seqlen}}, parser);
  shape->seqlen_k = maximum_length(keys, own_keys ? "cu-seqlens-k" : "cu-seqlens", "keys",
                                   {{"seqlen-k", shape->seqlen_k}, {"seqlen", shape->seqlen}}, parser);
  AttentionShape maxima;
  maxima.batch = shape->batch;
  maxima.seqlen_q = shape->seqlen_q;
  maxima.seqlen_k = shape->seqlen_k;
  batch.lengths_fill_maxima = varlen_lengths_fill_maxima(maxima, total_query_tokens(batch), total_key_tokens(batch));
  return batch;
}

VarlenPlanResult plan_varlen(const TiledProblem& max_problem, const VarlenBatch& batch, Schedule schedule, int sms) {
  VarlenPlanResult result =
      plan_varlen_schedule(max_problem, batch.keys_within_queries, batch.lengths_fill_maxima, schedule, sms);
  if (!result.ok() && !batch.keys_within_queries &&
      plan_varlen_schedule(max_problem, /*keys_within_queries=*/true, batch.lengths_fill_maxima, schedule, sms).ok()) {
    result.rejected += " (--keys-within-queries makes the promise)";
  }
  return result;
}

std::string missing_varlen_kernel(const AttentionShape& max_shape) {
  const bool softcap = max_shape.softcap > 0.0f;
  if (varlen_kernel_available(max_shape.head_dim, max_shape.dtype, softcap)) return {};
  return "this build has no varlen kernel for head_dim " + std::to_string(max_shape.head_dim) + " and dtype " +
         dtype_name(max_shape.dtype) + (softcap ? " with softcap" : "") +
         " (varlen_kernel_available; see DASH_VARLEN_KERNELS" + (softcap ? " and DASH_SOFTCAP_KERNELS)" : ")");
}

harness::VarlenProblem make_device_problem(const AttentionShape& max_shape, const VarlenBatch& batch,
                                           int64_t padding_rows, uint64_t seed, bool with_reference) {
  const SequenceLengths maxima{static_cast<int>(max_shape.seqlen_q), static_cast<int>(max_shape.seqlen_k)};
  harness::VarlenProblem problem =
      harness::make_varlen_problem(max_shape, batch.lengths, padding_rows, seed, maxima, with_reference);
  // The harness promises what the lengths keep; the plan and the calls carry the command line's promise instead.
  problem.keys_within_queries = batch.keys_within_queries;
  return problem;
}

int64_t total_query_tokens(const VarlenBatch& batch) { return total_tokens(batch, &SequenceLengths::seqlen_q); }
int64_t total_key_tokens(const VarlenBatch& batch) { return total_tokens(batch, &SequenceLengths::seqlen_k); }

std::string describe_varlen(const VarlenBatch& batch) {
  std::ostringstream out;
  out << batch.lengths.size() << (batch.lengths.size() == 1 ? " sequence, " : " sequences, ")
      << total_query_tokens(batch) << " query and " << total_key_tokens(batch) << " key tokens; ";
  out << (batch.keys_within_queries ? "every seqlen_k <= seqlen_q promised"
                                    : "seqlen_k may exceed seqlen_q (no --keys-within-queries)");
  return out.str();
}

std::string describe_lengths(const VarlenBatch& batch, const std::string& separator) {
  std::ostringstream out;
  for (size_t i = 0; i < batch.lengths.size(); ++i) {
    out << (i == 0 ? "" : separator) << batch.lengths[i].seqlen_q << "/" << batch.lengths[i].seqlen_k;
  }
  return out.str();
}

std::string varlen_json(const VarlenBatch& batch, const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::string> queries;
  std::vector<std::string> keys;
  for (const SequenceLengths& s : batch.lengths) {
    queries.push_back(json_number(s.seqlen_q));
    keys.push_back(json_number(s.seqlen_k));
  }
  JsonObject o;
  o.add("sequences", json_number(batch.lengths.size()))
      .add("keys_within_queries", json_bool(batch.keys_within_queries))
      .add("seqlen_q", json_array(queries))
      .add("seqlen_k", json_array(keys));
  for (const auto& [key, value] : extra) o.add(key, value);
  return o.str();
}

}  // namespace dash::cli
