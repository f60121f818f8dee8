// The seam between the API layer (host C++, g++) and the sm90 kernels (nvcc): plain parameter structs,
// the backward workspace layout, and the table of compiled kernel instances. No CuTe here, and of the public
// headers only dash/types.hpp (the argument structs): the kernels never see the API's entry points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "dash/types.hpp"
#include "schedule/plan.hpp"

// The CUDA runtime's stream handle, declared as cuda_runtime_api.h declares it (the launchers take one), so
// this header needs no CUDA header on the g++ side.
struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace dash::kernels {

// What went wrong on the device in a launch whose results it has poisoned: a per-device record in host-mapped
// memory, written by the device so that the host reads it without a CUDA call, even while the launch still runs, and
// reports it at the next call on the device (src/api/wait_timeouts.hpp). The device writes the fields only while
// `kind` is kNone and stores `kind` last, after a system-scope fence; the host clears `kind` once it has reported the
// record. A second fault before the host has read the first is not recorded (its results are poisoned all the same).
enum class FaultKind : int {
  kNone = 0,
  // A dQ ordering wait outlived its bound (kernels/sm90/bwd_dq_writer.cuh); the launch went on without the fixed
  // order, and its postprocess filled dq, dk and dv with NaN.
  kWaitTimeout = 1,
  // A varlen sequence was longer than the call's max_seqlen_q or max_seqlen_k, or had more keys than queries where
  // the call promised keys_within_queries (kernels/sm90/varlen_padding.cuh); its rows of the call's outputs (out and
  // lse, or dq, dk and dv) were filled with NaN.
  kSeqlenExceedsMax = 2,
  // A merge's row_index named a row outside its accumulators, or one row twice (merge_partial.cu); its acc_out and
  // acc_lse were filled with NaN.
  kRowIndexInvalid = 3,
  // A varlen call's cu_seqlens_q or cu_seqlens_k did not start at 0, decreased, or ended past its total
  // (kernels/sm90/varlen_padding.cuh): the sequences' rows are no partition of the packed rows, so every row of the
  // call's outputs was filled with NaN.
  kCuSeqlensInvalid = 4,
};

// Which pass a varlen fault (kSeqlenExceedsMax, kCuSeqlensInvalid) came from.
enum class FaultPass : int { kForward = 0, kBackward = 1 };

struct FaultRecord {
  FaultKind kind;  // kNone until the fields of that kind are written
  // kWaitTimeout: what the first wait that gave up saw.
  int cta;       // blockIdx.x of the CTA whose wait gave up
  int dq_index;  // the dQ tile it waited on, as numbered in the workspace ((batch * heads_q + head) * tiles + tile)
  int expected;  // the contribution's rank in the tile's order
  int observed;  // the tile's semaphore when the wait gave up: the contributions summed by then
  int bound_ms;  // the bound it outlived, in milliseconds
  // kSeqlenExceedsMax: the first sequence of the call over a maximum (seqlen_q for its keys, under the promise), with
  // its lengths, the call's maxima and its promise.
  FaultPass pass;
  int sequence;
  int seqlen_q;  // cu_seqlens_q[sequence + 1] - cu_seqlens_q[sequence], each offset clamped to [0, total_q]
  int seqlen_k;
  int max_seqlen_q;
  int max_seqlen_k;
  int keys_within_queries;  // nonzero: the call promised seqlen_k <= seqlen_q per sequence
  // kRowIndexInvalid: the first block row (lowest r) whose index is outside [0, merge_seqlen) or names a row an
  // earlier block row of the index names too, and that index.
  int merge_row;
  int merge_row_index;
  int merge_seqlen;
  int merge_row_repeated;  // nonzero: the index is within the accumulators but named twice
  // kCuSeqlensInvalid (and `pass`): the first entry, lowest index first and cu_seqlens_q before cu_seqlens_k, that
  // breaks the offsets' order, with the entry before it and the array's total.
  int offsets_of_keys;   // nonzero: cu_seqlens_k, else cu_seqlens_q
  int offsets_index;     // i, the entry cu_seqlens[i]
  int offsets_value;     // cu_seqlens[i]
  int offsets_previous;  // cu_seqlens[i - 1]; unused for i = 0, where the rule is cu_seqlens[0] = 0
  int offsets_total;     // total_q or total_k, which the last offset may not pass
};

// What a forward launch needs beyond the caller's (validated) arguments.
struct ForwardParams {
  ForwardArgs args;
  int* tile_counter;  // workspace: the tile counter of the kernels that take tiles from it, zeroed by the launch
  int num_sms;
  FaultRecord* fault;  // host-mapped, the device's: where a varlen sequence over a maximum says so
};

// Device buffers of the backward pass, carved out of the caller's workspace (see BackwardWorkspace).
struct BackwardBuffers {
  float* dq_accum;     // fp32 partial-dQ sums, one block_q x head_dim chunk per dQ tile
  int* dq_semaphores;  // one per dQ tile: how many contributions have been summed into it
  float* lse_log2;     // LSE * log2(e) per query row (+inf where no key is visible or past seqlen_q)
  float* dpsum;        // rowsum(dO * O) per query row (0 past seqlen_q)
  float* dk_accum;     // GQA with group_splits > 1: fp32 dK per split, summed in split order
  float* dv_accum;
  int* unit_counter;     // dynamic dispatch: next work unit
  int* order_abandoned;  // nonzero once a dQ ordering wait of the launch gave up (FaultKind::kWaitTimeout)
};

// What a backward launch needs beyond the caller's (validated) arguments.
struct BackwardParams {
  BackwardArgs args;
  SchedulePlan plan;
  BackwardBuffers buffers;
  long long wait_bound_ns;  // how long a dQ ordering wait may last before the launch gives up its order
  FaultRecord* fault;       // host-mapped, the device's: where a wait that gave up or a sequence over a maximum says so
};

// Byte offsets of the backward buffers inside one workspace allocation.
struct BackwardWorkspace {
  static constexpr size_t kAlignment = 256;
  size_t dq_accum = 0, dq_semaphores = 0, lse_log2 = 0, dpsum = 0, dk_accum = 0, dv_accum = 0, unit_counter = 0,
         order_abandoned = 0;
  size_t total_bytes = 0;

  // `problem` is the plan's (the maximum problem of a varlen batch: its buffers are numbered by it).
  static BackwardWorkspace layout(const AttentionShape& shape, const TiledProblem& problem);
  BackwardBuffers carve(void* workspace) const;
};

// Bytes of forward workspace (the dynamic tile counter).
inline constexpr size_t kForwardWorkspaceBytes = 256;

// What a launcher returns: the cudaError_t value of its launches, or the tensor whose TMA descriptor the driver would
// refuse to encode and the rule its geometry breaks (sm90::first_tma_refusal), in which case it encoded no descriptor
// and launched nothing (a kernel given a refused descriptor would fault or read wrong memory).
struct LaunchResult {
  int cuda_error = 0;
  const char* unencoded_tensor = nullptr;  // "q", "dout", ...; null when every descriptor can be encoded
  const char* broken_rule = nullptr;       // e.g. "its strides.seq is not a multiple of 16 bytes"
};

using ForwardLauncher = LaunchResult (*)(const ForwardParams&, cudaStream_t);
using BackwardLauncher = LaunchResult (*)(const BackwardParams&, cudaStream_t);

struct KernelInstance {
  int head_dim;
  DType dtype;
  bool softcap;  // the softcap kernels (AttentionShape::softcap > 0), compiled apart so the others stay as they are
  ForwardLauncher forward;
  BackwardLauncher backward;
  // Packed varlen batches (args.varlen): kernels of their own, compiled in a translation unit of their own, so the
  // dense kernels above stay as they are; null where this build has none (built without DASH_VARLEN_KERNELS).
  ForwardLauncher forward_varlen;
  BackwardLauncher backward_varlen;
};

// The instances compiled into this build (empty without DASH_BUILD_KERNELS).
std::span<const KernelInstance> kernel_instances();

// The merge of one block's partial (out, LSE) into accumulators (MergeArgs, validated), and with a row_index its
// check (kRowIndexInvalid, reported through `fault`, the device's record): its cudaError_t value.
using MergeLauncher = int (*)(const MergeArgs&, FaultRecord* fault, cudaStream_t);

// The merge kernel's launcher; null without DASH_BUILD_KERNELS.
MergeLauncher merge_partial_launcher();

}  // namespace dash::kernels
