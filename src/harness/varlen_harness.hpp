// Harness layer for packed varlen batches (FlashAttention's cu_seqlens, dash/types.hpp's VarlenBatch): a batch of
// sequences of given lengths packed into (total, heads, head_dim) tensors on the device, with padding rows after the
// last sequence that every call clears, the float64 reference of every sequence on its own (the dense reference on
// the sequence's rows), the comparison of a packed output with it that also counts padding elements not cleared, and
// the batch's backward plan and FLOPs (the GPU tests and dash-attn check / bench share them).
// Invariants: sequence b's rows are [cu_seqlens[b], cu_seqlens[b + 1]) of the packed tensors, the LSE is
// (heads_q, total_q); reference values of padding rows are NaN, and a device element there must hold 0 (-inf in the
// LSE) where it held the poison (NaN) that DeviceBuffer::poison() wrote.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dash/attention.hpp"
#include "harness/device_harness.hpp"
#include "schedule/varlen.hpp"

namespace dash::harness {

struct VarlenProblem {
  AttentionShape shape;  // batch = sequences, seqlen_q and seqlen_k = the maxima
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  int64_t total_q = 0, total_k = 0;   // packed rows, padding after the last sequence included
  bool keys_within_queries = false;   // every sequence has seqlen_k <= seqlen_q, promised to the API
  std::vector<double> q, k, v, dout;  // the rounded inputs, packed
  std::vector<double> out, lse;       // reference forward; NaN in padding rows
  std::vector<double> dq, dk, dv;     // reference backward (with `out` rounded); NaN in padding rows
  DeviceBuffer d_q, d_k, d_v, d_dout, d_out, d_lse, d_ref_out, d_ref_lse, d_dq, d_dk, d_dv;
  DeviceBuffer d_cu_seqlens_q, d_cu_seqlens_k;
  DeviceBuffer workspace;

  size_t q_elements() const;
  size_t kv_elements() const;
  size_t lse_elements() const;
};

// A batch of `lengths` (one entry per sequence) under `shape`'s heads, head dim, dtype, mask and softcap, with
// `padding_rows` rows after the last sequence in every packed tensor; shape.batch, seqlen_q and seqlen_k are set
// from the lengths (the maxima, at least 1) unless `max_lengths` raises them. `with_reference` false skips the CPU
// reference (determinism runs, which compare bits alone): `out` and the gradients are then empty, and the device
// copies of the reference O and LSE hold zeros.
VarlenProblem make_varlen_problem(AttentionShape shape, const std::vector<SequenceLengths>& lengths,
                                  int64_t padding_rows, uint64_t seed, SequenceLengths max_lengths = {1, 1},
                                  bool with_reference = true);

VarlenBatch varlen_batch(const VarlenProblem& p);
ForwardArgs forward_args(VarlenProblem& p);
// Reads the reference O and LSE, as backward_args(Problem&) does.
BackwardArgs backward_args(VarlenProblem& p, Schedule schedule);
// Makes backward_args() read the GPU forward's O and LSE instead (benchmarks, which skip the reference).
void use_forward_outputs_for_backward(VarlenProblem& p);
// The backward plan of p's batch on the current device: plan_varlen_backward for its maxima (p.shape), its
// promise (p.keys_within_queries, which the calls carry too) and auto's hint from the lengths' sums (the rows before
// the padding; varlen_lengths_fill_maxima), as dash-attn plan computes it.
Status plan_backward_for(const VarlenProblem& p, Schedule schedule, int sm_margin, BackwardPlan* plan);

// FLOPs of the forward of a batch of `lengths` under `shape`'s heads, head dim, mask and window: the sum of
// forward_flops of each sequence on its own (its own causal diagonal and window), none for a sequence without
// queries or keys. The backward does kBackwardFlopsPerForwardFlop times as many.
double forward_flops(const AttentionShape& shape, const std::vector<SequenceLengths>& lengths);

// A packed output against its reference: the error over the sequences' rows, and how many padding elements (NaN in
// the reference) the call left other than cleared (0, or -inf in the LSE: `is_float` marks the LSE).
struct PackedComparison {
  ErrorStats stats;
  size_t padding_not_cleared = 0;
};
PackedComparison compare_packed(const DeviceBuffer& device, const std::vector<double>& reference, DType dtype,
                                bool is_float = false);

}  // namespace dash::harness
