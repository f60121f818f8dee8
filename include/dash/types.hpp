// Public types: the plain data every DASH layer shares (element types, strides, tensor references, shapes,
// schedules and the arguments of forward() and backward()), and the functions that name them (defined in
// dash_common).
//
// Types only: no entry point and no CUDA type, so the schedule, planner, reference, emulator and kernel layers
// include this header rather than dash/attention.hpp, which adds the entry points on top of it. Tensors are
// (batch, seqlen, heads, head_dim) = (B, S, H, D) with element strides; attention.hpp states the conventions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "dash/status.hpp"

namespace dash {

enum class DType : int { kBF16 = 0, kFP16 = 1 };
const char* dtype_name(DType dtype);

// Element strides of a (B, S, H, D) tensor.
struct Strides {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head = 0;
  int64_t dim = 1;
};

// Strides of a densely packed (B, S, H, D) tensor.
Strides packed_strides(int64_t seqlen, int64_t heads, int64_t head_dim);

struct AttentionShape {
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kBF16;
  float softmax_scale = 0.0f;  // multiplies Q K^T; usually 1/sqrt(head_dim)
  bool causal = false;
  // FlashAttention's sliding window, window_size = (window_left, window_right), bottom-right aligned: with
  // d = seqlen_k - seqlen_q, query row i sees key j iff i + d - window_left <= j <= i + d + window_right. -1
  // leaves that side open (both -1: no window); each must be >= -1. causal sets window_right to 0 whatever it
  // is, as FlashAttention does. A bound that reaches past every key changes nothing.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Gemma-2-style score capping: with softcap > 0 each scaled score s becomes softcap * tanh(s / softcap)
  // before the softmax; 0 leaves the scores as they are. Must be finite and >= 0 (and softmax_scale / softcap
  // finite).
  float softcap = 0.0f;
};

// The order in which the backward pass sums the partial dQ tiles of different key/value tiles
// (see docs/DESIGN.md). Every schedule but kNondeterministic gives bitwise-identical gradients from
// run to run; kAuto picks the best schedule whose preconditions hold for the shape.
// Switches over Schedule name every value and have no default (-Werror=switch), so a value added here fails
// the build wherever it is not handled.
enum class Schedule : int {
  kAuto = 0,
  kAscending,         // Q tiles ascending, dQ summed in ascending KV-tile order (FA3's deterministic baseline)
  kDescending,        // Q tiles descending, ascending KV order
  kShortestFirst,     // shortest KV tiles dispatched first, dQ summed in descending KV order (FA3's causal)
  kShift,             // DASH shift scheduling (full mask)
  kSymmetricShift,    // DASH symmetric shift scheduling (causal mask)
  kNondeterministic,  // unordered atomic reduction: fastest order, bits vary from run to run
};

inline constexpr Schedule kAllSchedules[] = {
    Schedule::kAuto,  Schedule::kAscending,      Schedule::kDescending,       Schedule::kShortestFirst,
    Schedule::kShift, Schedule::kSymmetricShift, Schedule::kNondeterministic,
};

// Canonical names: "auto", "ascending", "descending", "shortest-first", "shift", "symmetric-shift",
// "nondeterministic".
std::string_view schedule_name(Schedule schedule);
std::optional<Schedule> parse_schedule(std::string_view name);
// As parse_schedule, with an error that lists the valid names.
Status parse_schedule(std::string_view name, Schedule* schedule);

// One (B, S, H, D) tensor argument: device memory and its element strides. Inputs are TensorRefs, which the
// library only reads; outputs are MutableTensorRefs, which it writes, and which convert to a TensorRef. Two types
// rather than one with a mutable pointer, so that a caller's const input needs no const_cast and an output
// cannot be given a read-only pointer.
struct TensorRef {
  const void* data = nullptr;
  Strides strides;
};

struct MutableTensorRef {
  void* data = nullptr;
  Strides strides;

  operator TensorRef() const { return {data, strides}; }
};

// A packed variable-length batch (FlashAttention's varlen): shape.batch sequences, sequence b's query rows
// [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the packed (total_q, heads_q, head_dim) q, out, dout and dq, its key rows
// [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of the packed (total_k, heads_kv, head_dim) k, v, dk and dv; shape.seqlen_q
// and shape.seqlen_k are the maximum lengths (FlashAttention's max_seqlen_q, max_seqlen_k). The packed tensors are
// TensorRefs whose strides.batch is 0 (no batch dimension); the LSE is (heads_q, total_q) float32. The masks are
// each sequence's own (causal and the window aligned to its bottom-right corner). Rows past the last sequence
// (cu_seqlens_q[batch] <= row < total_q, and the same for keys) are padding: a forward writes 0 to out and -inf to the
// LSE there, a backward 0 to dq, dk and dv.
// cu_seqlens stay in device memory: no entry point reads them on the host, so a call is CUDA-graph capturable. The
// kernels read them; their contract (unchecked on the host, it would take a copy): shape.batch + 1 int32 offsets
// starting at 0, non-decreasing, each sequence within the maxima, the last offsets at most total_q and total_k, and,
// with keys_within_queries, seqlen_k <= seqlen_q per sequence. A sequence longer than a maximum, or with more keys
// than queries under keys_within_queries, is caught on the device: every row of it in the call's outputs (out and the LSE, or dq, dk and dv) is NaN, and the next call on the
// device returns kSeqlenExceedsMax naming it. Offsets out of order (not starting at 0, decreasing, or ending past
// total_q or total_k), whose sequences would leave rows unwritten or overlap, are caught on the device too: every row
// of the call's outputs is NaN, and the next call returns kCuSeqlensInvalid naming the entry. Either way no kernel
// reads or writes outside the tensors or hangs: each sequence is clamped to the totals and the maxima first
// (schedule/varlen.hpp, packed_sequence).
struct VarlenBatch {
  const int32_t* cu_seqlens_q = nullptr;  // device memory; both null: not a varlen call
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0;  // rows of the packed q, out, dout, dq
  int64_t total_k = 0;  // rows of the packed k, v, dk, dv
  // The caller's promise that every sequence has seqlen_k <= seqlen_q (true when cu_seqlens_k is cu_seqlens_q, as
  // in self-attention). The backward plans shift and symmetric shift only under it (planner/varlen_plan.hpp).
  bool keys_within_queries = false;

  bool packed() const { return cu_seqlens_q != nullptr || cu_seqlens_k != nullptr; }
};

struct ForwardArgs {
  AttentionShape shape;
  TensorRef q;           // (B, Sq, Hq, D)
  TensorRef k;           // (B, Sk, Hkv, D)
  TensorRef v;           // (B, Sk, Hkv, D)
  MutableTensorRef out;  // (B, Sq, Hq, D), of shape.dtype, or float32 with out_fp32
  float* lse = nullptr;  // (B, Hq, Sq) packed, natural-log logsumexp of each scaled score row; varlen: (Hq, total_q)
  // out holds float32 elements instead of shape.dtype: O / l as the kernel accumulated it, before the rounding to
  // shape.dtype (which, applied to this out, gives the bits of a call without it). For a caller that merges partial
  // results of blocks of keys (context parallelism): each partial rounded to shape.dtype before the merge adds a
  // rounding error per block. out's strides are then in float32 elements and follow the same rules (16-byte aligned
  // data and strides).
  bool out_fp32 = false;
  // SMs the persistent grid leaves to other work: at most SM count - sm_margin CTAs run. Needs
  // 0 <= sm_margin < the device's SM count. It does not change the result.
  int sm_margin = 0;
  VarlenBatch varlen;  // a packed varlen batch, or none (the default)
};

// Element strides of a (B, H, S) float32 LSE.
struct LseStrides {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t seq = 1;
};

// merge_partial(): the partial attention result of one block of keys, out and LSE over `rows` query rows, merged
// into running accumulators of `seqlen` rows, all float32:
//   lse' = logaddexp(lse, lse_b);  out' = out * exp(lse - lse') + out_b * exp(lse_b - lse')
// where a weight whose LSE is -inf (an accumulator row no block has reached yet, or a block row that sees no key) is
// 0, so an empty row takes the block as it is and two empty rows stay out 0, LSE -inf: no NaN comes of empty rows.
// Block row r goes to accumulator row row_index[r], or row_offset + r when row_index is null. Packed (varlen) tensors
// are a batch of one: out (1, total, H, D) with strides.batch 0, the LSE (1, H, total).
struct MergeArgs {
  int64_t batch = 0;
  int64_t rows = 0;    // rows of the block
  int64_t seqlen = 0;  // rows of the accumulators
  int64_t heads = 0;
  int64_t head_dim = 0;
  TensorRef part_out;               // (batch, rows, heads, head_dim) float32
  const float* part_lse = nullptr;  // (batch, heads, rows)
  LseStrides part_lse_strides;
  MutableTensorRef acc_out;  // (batch, seqlen, heads, head_dim) float32, read and written
  float* acc_lse = nullptr;  // (batch, heads, seqlen), read and written
  LseStrides acc_lse_strides;
  // Device memory: `rows` int32 accumulator rows, distinct, each in [0, seqlen); null: rows row_offset ..
  // row_offset + rows - 1. What it holds is checked on the device, not on the host (that would take a copy): an index
  // outside [0, seqlen) is never written through, and an index outside or naming a row twice makes the merge fill
  // acc_out and acc_lse with NaN (a block row went nowhere, or two went to one row at once) and the next call on the
  // device return kRowIndexInvalid naming it.
  const int32_t* row_index = nullptr;
  int64_t row_offset = 0;
};

struct BackwardArgs {
  AttentionShape shape;
  TensorRef q;
  TensorRef k;
  TensorRef v;
  TensorRef out;               // forward output O
  TensorRef dout;              // dL/dO, same shape as O
  const float* lse = nullptr;  // forward LSE, (B, Hq, Sq) packed; varlen: (Hq, total_q)
  MutableTensorRef dq;         // outputs, same shapes as q, k, v
  MutableTensorRef dk;
  MutableTensorRef dv;
  Schedule schedule = Schedule::kAuto;
  // SMs the backward leaves to other work: the schedule is planned for SM count - sm_margin persistent CTAs
  // (see plan_backward()). Needs 0 <= sm_margin < the device's SM count.
  int sm_margin = 0;
  VarlenBatch varlen;  // a packed varlen batch, or none (the default)
};

}  // namespace dash
