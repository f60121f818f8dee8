// Public API: deterministic attention forward and backward on Hopper GPUs.
//
// Tensors are (batch, seqlen, heads, head_dim) = (B, S, H, D) with arbitrary element strides, except
// that D must be contiguous. Query heads [g*G, (g+1)*G) share key/value head g, where
// G = heads_q / heads_kv (GQA; MQA when heads_kv == 1). With causal = true, query row i attends key
// column j iff j <= i + seqlen_k - seqlen_q (the mask is aligned to the bottom-right corner, as in
// FlashAttention); a row that sees no key gets O = 0 and LSE = -inf.
//
// Every entry point validates its arguments first and returns a Status instead of failing later; the
// work itself is enqueued on `stream` and runs asynchronously. No CuTe or CUDA types appear here
// except cudaStream_t.
//
// The types the entry points take (AttentionShape, Strides, TensorRef, Schedule, ForwardArgs, BackwardArgs, ...)
// are in dash/types.hpp, which this header includes; the layers below the API include that header alone.
//
// The backward can be planned once and launched many times: plan_backward() validates the shape, plans
// the schedule for the device and proves it; backward(args, plan, ...) then only checks that the call fits
// the plan. A device's properties are read once per process and kept.
//
// Both passes run persistent grids of at most one CTA per SM. sm_margin (as in FlashAttention-3) leaves that
// many SMs to other work, such as the communication kernels of a training step: the forward launches at most
// SM count - sm_margin CTAs, and the backward is planned for SM count - sm_margin (docs/DESIGN.md, "SMs left to
// other work", says what this guarantees for the static schedules and what it does not).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dash/status.hpp"
#include "dash/types.hpp"

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace dash {

// Whether this build has kernels at all, and for this (head dim, dtype), without or with softcap (the softcap
// kernels are instances of their own, DASH_SOFTCAP_KERNELS).
bool kernels_available();
bool kernel_available(int64_t head_dim, DType dtype, bool softcap = false);
// Whether this build has the varlen kernels (VarlenBatch calls) of (head dim, dtype), without or with softcap: each
// instance's varlen kernels, DASH_VARLEN_KERNELS.
bool varlen_kernel_available(int64_t head_dim, DType dtype, bool softcap = false);

// Checks the shape alone without touching the GPU: sizes, dtype, head dim, GQA divisibility, softmax scale,
// sliding window (each bound >= -1), softcap (finite, >= 0, softmax_scale / softcap finite), and the limits of the kernels' indices and launch grids. Every entry point runs it first; a tool that
// plans a shape without tensors runs it to refuse exactly what the API refuses.
Status validate(const AttentionShape& shape);

// Checks `args` without touching the GPU (validate(args.shape), then pointers, alignment, strides, overlap, and
// sm_margin >= 0; its upper bound, the device's SM count, is checked where the device is known). A varlen call
// (args.varlen.packed()) also needs both offset pointers (4-byte aligned), totals > 0 within the kernels' 32-bit
// indices, and packed tensors with strides.batch == 0, sized by the totals (the LSE as (heads_q, total_q)); what
// cu_seqlens hold is never read on the host.
Status validate(const ForwardArgs& args);
Status validate(const BackwardArgs& args);
// Checks merge_partial()'s arguments without touching the GPU: sizes > 0 within the attention calls' limits,
// rows <= seqlen, the rows' placement (row_offset within the accumulators, or a 4-byte aligned row_index with
// row_offset 0), 4-byte aligned non-null float arrays with contiguous head_dim, strides >= 0, accumulators whose
// layouts do not overlap themselves, and no accumulator sharing a byte with another array of the call.
Status validate(const MergeArgs& args);

// Checks that the current CUDA device can run DASH kernels (a Hopper GPU, compute capability 9.0). When none
// can be used, the kNoDevice message says whether the driver is missing, older than the CUDA runtime DASH was
// built with, or sees no device.
Status check_current_device();

// A CUDA device as DASH plans for it. The API reads each device's properties once per process and keeps
// them (they cannot change while it runs), so no call after the first on a device queries them again.
struct DeviceInfo {
  int index = 0;                 // CUDA device ordinal
  int multiprocessor_count = 0;  // SMs; schedules are planned for this less sm_margin (bits are promised per
                                 // planned SM count)
  int compute_major = 0;
  int compute_minor = 0;
  std::string name;
};

// The current CUDA device, one the kernels cannot run on included (check_current_device() says whether they
// can). Without a usable device: check_current_device()'s kNoDevice status, *info untouched.
Status current_device_info(DeviceInfo* info);

// Bytes of device workspace forward()/backward() need for this shape (0 is possible). Both validate the
// shape (and the schedule) before anything else; the backward query then plans the schedule for the
// current device, so it needs a GPU (BackwardPlan::workspace_bytes() answers the same without planning again).
// Neither size depends on sm_margin.
Status forward_workspace_size(const AttentionShape& shape, size_t* bytes);
Status backward_workspace_size(const AttentionShape& shape, Schedule schedule, size_t* bytes);

// O, LSE = attention(Q, K, V). Deterministic for every input. The workspace, which the kernels write, may share no
// byte with a tensor, the LSE or cu_seqlens (kInvalidArgument naming what it overlaps); backward() checks the same.
// With args.out_fp32, out is float32: the same values before their rounding to shape.dtype.
Status forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Whether this build has merge_partial()'s kernel (every build with kernels has it).
bool merge_kernel_available();

// Merges one block's partial result (out, LSE) into float32 accumulators in one launch, deterministically (the
// formula and the row placement are MergeArgs's, dash/types.hpp). validate(args) first; then kNotAvailable in a build
// without kernels, and on a device the fault report every call makes (an earlier call's poisoned result).
Status merge_partial(const MergeArgs& args, cudaStream_t stream);

struct BackwardPlanData;  // api/backward_plan.hpp: what a plan holds, private to the library

// The backward pass planned for one shape, schedule and device: kAuto resolved, the schedule planned for the
// device's SM count and proven deadlock-free on the CPU, and the workspace size it needs. Immutable, so
// copies share one plan and any number of threads may launch it at once. A default-constructed plan is
// empty: backward() refuses it, and its accessors answer zeros (and kAuto).
class BackwardPlan {
 public:
  BackwardPlan() = default;

  bool empty() const { return data_ == nullptr; }
  const AttentionShape& shape() const;
  Schedule requested_schedule() const;  // as passed to plan_backward(), kAuto included
  Schedule schedule() const;            // the schedule that runs: never kAuto
  int device_index() const;
  int multiprocessor_count() const;  // the device's SM count: the plan runs only on a device with this many
  int sm_margin() const;             // SMs left to other work, as passed to plan_backward()
  // multiprocessor_count() - sm_margin(): the SM count the schedule was planned for. The backward's persistent
  // grid never exceeds it, and a static schedule needs that many of its CTAs resident at once.
  int planned_sm_count() const;
  size_t workspace_bytes() const;
  // A plan of plan_varlen_backward(): for packed varlen batches whose maximum problem is shape(), and whether it
  // holds them to the promise seqlen_k <= seqlen_q per sequence.
  bool varlen() const;
  bool keys_within_queries() const;

 private:
  friend struct BackwardPlanAccess;  // api/backward_plan.hpp: the library makes plans and reads them
  std::shared_ptr<const BackwardPlanData> data_;
};

// Plans the backward of `shape` under `schedule` for `device` (its index and multiprocessor_count: a
// DeviceInfo from current_device_info(), or one filled in by hand to plan for a device that is not current
// or not present), leaving `sm_margin` of its SMs to other work: the schedule is planned for
// multiprocessor_count - sm_margin persistent CTAs (planned_sm_count()). Validates the shape, the schedule and
// sm_margin >= 0 first, then the device and sm_margin < its SM count, and touches no GPU. The dynamic schedules
// (ascending, descending, shortest-first, nondeterministic) give the same bits for every margin; the static
// ones (shift, symmetric shift) are planned for the smaller CTA count, so their bits are those of a device
// with that many SMs. A schedule whose preconditions the shape fails is kScheduleRejected, naming the rule (e.g.
// symmetric shift at head dims 192 and 256, whose 64x96 and 64x80 tiles have block_kv not a multiple of block_q).
// *plan is written only on success.
Status plan_backward(const AttentionShape& shape, Schedule schedule, int sm_margin, const DeviceInfo& device,
                     BackwardPlan* plan);
// The same for the current device, which must be able to run the kernels (check_current_device()).
Status plan_backward(const AttentionShape& shape, Schedule schedule, int sm_margin, BackwardPlan* plan);
// Both with sm_margin 0: every SM of the device.
Status plan_backward(const AttentionShape& shape, Schedule schedule, const DeviceInfo& device, BackwardPlan* plan);
Status plan_backward(const AttentionShape& shape, Schedule schedule, BackwardPlan* plan);

// Plans the backward of packed varlen batches (VarlenBatch, dash/types.hpp) whose maximum problem is `shape` (batch =
// the number of sequences, seqlen_q and seqlen_k = the maximum lengths), as plan_backward() plans a dense shape. The
// plan holds for every vector of lengths within the maxima, so a launch reads no length on the host (no copy of
// cu_seqlens; CUDA-graph capturable): the schedule is planned for the maximum problem and proven for every length
// vector, and the kernels fit each sequence's jobs to its lengths (schedule/varlen.hpp). `keys_within_queries` is
// VarlenBatch's promise; the calls it launches must carry the same. Schedules: ascending, descending,
// shortest-first and nondeterministic for every batch; shift (full mask) and symmetric shift (causal, no window, not
// at head dims 192 and 256) only with the promise; kAuto picks the best of those the batch admits
// (planner/varlen_plan.hpp says why). kScheduleRejected, naming the rule, for the others. `lengths_fill_maxima` is a
// hint for kAuto alone (varlen_lengths_fill_maxima of the batches' packed rows): false, under the full mask, picks
// shortest-first, which runs mixed lengths faster than shift. It never changes which batches the plan runs: any call
// of the plan's shape and promise is accepted whatever its packed rows.
Status plan_varlen_backward(const AttentionShape& shape, bool keys_within_queries, bool lengths_fill_maxima,
                            Schedule schedule, int sm_margin, const DeviceInfo& device, BackwardPlan* plan);
Status plan_varlen_backward(const AttentionShape& shape, bool keys_within_queries, bool lengths_fill_maxima,
                            Schedule schedule, int sm_margin, BackwardPlan* plan);
// plan_varlen_backward's hint for batches of maximum problem `shape` packed into total_q query and total_k key rows:
// whether every sequence can be as long as the maxima, that is total_q >= shape.batch * shape.seqlen_q and
// total_k >= shape.batch * shape.seqlen_k (rows past the last sequence are padding). False proves some sequence
// shorter without reading cu_seqlens.
bool varlen_lengths_fill_maxima(const AttentionShape& shape, int64_t total_q, int64_t total_k);

// dQ, dK, dV = d attention / d(Q, K, V) for upstream gradient dO, summed in the order the plan's schedule
// fixes, without planning again. args.shape must equal plan.shape() in every field, args.schedule must be
// plan.requested_schedule() and args.sm_margin plan.sm_margin(): a mismatch is refused, naming the field, before
// anything else is checked.
// The current device must be the plan's (same index and SM count), and the workspace must hold
// plan.workspace_bytes().
// Each dQ ordering wait is bounded (DASH_WAIT_TIMEOUT_SECONDS, 10 minutes by default): a launch whose wait outlives
// it, because other kernels held SMs its static schedule was planned for, gives up the order and ends instead of
// hanging the stream, with every element of dq, dk and dv NaN (its dQ would be wrong), and the next call on the
// device, forward or backward, from any thread, returns kWaitTimeout, naming the wait, without running
// (src/api/wait_timeouts.hpp). A varlen sequence longer than its maximum is reported the same way
// (kSeqlenExceedsMax, VarlenBatch). A call being captured into a CUDA graph may be a process's first.
Status backward(const BackwardArgs& args, const BackwardPlan& plan, void* workspace, size_t workspace_bytes,
                cudaStream_t stream);

// The same, planning args.schedule for args.shape with args.sm_margin on the current device at every call (the
// proof is cached per plan, the planning is not); a caller that repeats shapes keeps a BackwardPlan instead. A
// varlen call (args.varlen) is planned with plan_varlen_backward(), its promise and the hint of its packed rows
// (varlen_lengths_fill_maxima).
Status backward(const BackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace dash
