/* C ABI of DASH, for callers that cannot link C++ (the Python package loads libdash_attn_c.so with ctypes).
 * Plain structs and ints mirror include/dash/types.hpp and attention.hpp one to one (dash_tensor is TensorRef for
 * an input, MutableTensorRef for an output), plus dash_device and the version
 * queries that diagnostics (python -m dash_attn.info) print; every function that can fail returns a
 * dash_status_code and copies the Status message into the caller's buffer, so no C++ type or exception
 * crosses the boundary. The one allocation a caller owns is the opaque dash_backward_plan handle, made by
 * dash_backward_plan_create and freed by dash_backward_plan_destroy. */
#ifndef DASH_C_H_
#define DASH_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(DASH_C_BUILDING)
#define DASH_C_API __attribute__((visibility("default")))
#else
#define DASH_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct, a signature or the set of functions below changes, so a binding can refuse a library
 * it does not match.
 *   2: dash_device, the version queries and dash_describe_current_device.
 *   3: the backward plan handle: dash_backward_plan_create, _destroy, _workspace_size and _run.
 *   4: sm_margin: dash_forward, dash_backward and dash_backward_plan_create take an int sm_margin after their
 *      last input (lse, schedule), and dash_backward_plan_sm_count reads what a plan was planned for. No struct
 *      changed; the signatures did, so a binding of version 3 would pass its arguments in the wrong places.
 *   5: sliding window and softcap: dash_shape gains windowed, window_left, window_right and softcap after causal, and
 *      dash_softcap_kernel_available says whether the softcap kernels were built.
 *   6: packed varlen batches: dash_varlen, dash_varlen_kernel_available, dash_forward_varlen, dash_backward_varlen,
 *      dash_backward_plan_create_varlen, dash_backward_plan_is_varlen and dash_backward_plan_run_varlen.
 *   7: dash_backward_plan_create_varlen takes int lengths_fill_maxima after keys_within_queries (auto's hint of the
 *      packed rows), and dash_backward_plan_schedule names the schedule a plan runs. No struct changed; the signature
 *      did, so a binding of version 6 would pass its arguments in the wrong places.
 *   8: dash_varlen_softcap_kernel_available says whether the softcap instances' varlen kernels were built (varlen
 *      batches with softcap > 0); dash_varlen_kernel_available keeps its meaning, the instances without softcap.
 *   9: DASH_STATUS_WAIT_TIMEOUT, which dash_backward, dash_backward_varlen and the plan runs return when an earlier
 *      backward on the device gave up its dQ order (dash::StatusCode::kWaitTimeout).
 *  10: DASH_STATUS_SEQLEN_EXCEEDS_MAX, which every call that runs on a device returns when an earlier varlen call there
 *      had a sequence longer than its max_seqlen_q or max_seqlen_k (dash::StatusCode::kSeqlenExceedsMax); both it and
 *      DASH_STATUS_WAIT_TIMEOUT are now returned by the forward calls too.
 *  11: one entry point per operation for dense and varlen batches: dash_forward, dash_backward and
 *      dash_backward_plan_create take a const dash_varlen* after the shape (NULL: a dense batch), and
 *      dash_backward_plan_run after the plan's shape; dash_backward_plan_create reads auto's hint from the varlen's
 *      totals instead of an int lengths_fill_maxima. dash_kernel_available takes an int of enum dash_kernel_feature
 *      bits. dash_forward_varlen, dash_backward_varlen, dash_backward_plan_create_varlen,
 *      dash_backward_plan_run_varlen, dash_softcap_kernel_available, dash_varlen_kernel_available and
 *      dash_varlen_softcap_kernel_available are gone.
 *  12: fp32 partial results for context parallelism: dash_forward takes an int out_dtype after out (shape->dtype, or
 *      DASH_DTYPE_FP32, new in enum dash_dtype, for the output before its rounding); dash_merge_args,
 *      dash_merge_partial and dash_merge_kernel_available merge one block's partial result into accumulators.
 *  13: DASH_STATUS_ROW_INDEX_INVALID, which every call that runs on a device returns when an earlier
 *      dash_merge_partial there had a row_index outside its accumulators or naming a row twice
 *      (dash::StatusCode::kRowIndexInvalid); that merge's accumulators were filled with NaN.
 *  14: DASH_STATUS_CU_SEQLENS_INVALID, which every call that runs on a device returns when an earlier varlen call
 *      there had cu_seqlens_q or cu_seqlens_k not starting at 0, decreasing or ending past its total
 *      (dash::StatusCode::kCuSeqlensInvalid); all that call's outputs were filled with NaN. */
#define DASH_C_ABI_VERSION 14

/* dash::StatusCode values, plus one code of the C layer alone. */
enum dash_status_code {
  DASH_STATUS_OK = 0,
  DASH_STATUS_INVALID_ARGUMENT = 1,
  DASH_STATUS_NOT_SUPPORTED = 2,
  DASH_STATUS_NOT_AVAILABLE = 3,
  DASH_STATUS_NO_DEVICE = 4,
  DASH_STATUS_UNSUPPORTED_DEVICE = 5,
  DASH_STATUS_WORKSPACE_TOO_SMALL = 6,
  DASH_STATUS_SCHEDULE_REJECTED = 7,
  DASH_STATUS_CUDA_ERROR = 8,
  DASH_STATUS_WAIT_TIMEOUT = 9,
  DASH_STATUS_SEQLEN_EXCEEDS_MAX = 10,
  DASH_STATUS_ROW_INDEX_INVALID = 11,
  DASH_STATUS_CU_SEQLENS_INVALID = 12,
  /* A C++ exception (in practice: host memory exhausted) stopped the call before it could return a Status. */
  DASH_STATUS_HOST_ERROR = -1,
};

/* dash::DType values, and DASH_DTYPE_FP32, which only dash_forward's out_dtype takes (inputs are bf16 or fp16). */
enum dash_dtype { DASH_DTYPE_BF16 = 0, DASH_DTYPE_FP16 = 1, DASH_DTYPE_FP32 = 2 };

/* dash::AttentionShape. causal = 1 selects the bottom-right aligned causal mask. windowed = 1 applies the sliding
 * window (window_left, window_right), FlashAttention's window_size: with d = seqlen_k - seqlen_q, query row i sees
 * key j iff i + d - window_left <= j <= i + d + window_right; -1 leaves a side open, each must be >= -1, and causal
 * makes window_right 0 whatever it is. windowed == 0 means no window and the two bounds are not read, so that a
 * zeroed struct (or one filled by a caller of version 4's fields) is not the window (0, 0), the diagonal alone.
 * Every flag of these structs (causal, windowed, keys_within_queries) must be 0 or 1: any other value is refused with
 * DASH_STATUS_INVALID_ARGUMENT naming it, as C has no bool.
 * softcap > 0 caps each scaled score s to softcap * tanh(s / softcap); 0 does not; it must be finite and >= 0, and a
 * normal float when > 0, as softmax_scale must be (> 0): the kernels flush subnormals to 0. */
typedef struct dash_shape {
  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_k;
  int64_t heads_q;
  int64_t heads_kv;
  int64_t head_dim;
  int dtype; /* enum dash_dtype */
  float softmax_scale;
  int causal;
  int windowed;
  int64_t window_left;
  int64_t window_right;
  float softcap;
} dash_shape;

/* One (B, S, H, D) tensor: its data and its element strides in that order. Inputs are only read. */
typedef struct dash_tensor {
  void* data;
  int64_t strides[4];
} dash_tensor;

/* dash::VarlenBatch: a packed variable-length batch (FlashAttention's varlen). The calls below take a
 * const dash_varlen*: NULL for a dense batch, else the packed batch it describes. With it, dash_shape's batch is the
 * number of sequences and seqlen_q, seqlen_k the maximum lengths; sequence b's query rows are rows
 * [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the packed (total_q, heads_q, head_dim) q, out, dout and dq, its key rows
 * those of cu_seqlens_k in the (total_k, heads_kv, head_dim) k, v, dk and dv; every packed dash_tensor has
 * strides[0] == 0 (no batch dimension), and the LSE is (heads_q, total_q) fp32. cu_seqlens_q and cu_seqlens_k are
 * batch + 1 int32 offsets in device memory, never read on the host (a call is CUDA-graph capturable); their contract
 * and what the kernels do when it is broken (clamp, never hang or touch memory outside the tensors; poison and report
 * a sequence over a maximum or offsets out of order) are those of include/dash/types.hpp. keys_within_queries = 1 promises seqlen_k <= seqlen_q for every sequence (true when
 * cu_seqlens_k is cu_seqlens_q), under which the backward may plan shift and symmetric shift. */
typedef struct dash_varlen {
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t total_q;
  int64_t total_k;
  int keys_within_queries;
} dash_varlen;

DASH_C_API int dash_abi_version(void);

/* Stable short name of a code, e.g. "invalid-argument"; "unknown-status" for a value that is none. */
DASH_C_API const char* dash_status_name(int code);

/* The canonical schedule names, comma-separated ("auto,ascending,..."); a static string. */
DASH_C_API const char* dash_schedule_names(void);

/* The kernel variants dash_kernel_available asks about, as bits of its `features`. */
enum dash_kernel_feature {
  DASH_KERNEL_SOFTCAP = 1, /* the softcap instance's kernels (softcap > 0) */
  DASH_KERNEL_VARLEN = 2,  /* the varlen kernels (calls with a dash_varlen) */
};

/* Nonzero if this build has the kernels of (head_dim, dtype) with every feature in `features`, a bitwise OR of enum
 * dash_kernel_feature: 0 asks for the dense kernels without softcap, DASH_KERNEL_SOFTCAP | DASH_KERNEL_VARLEN for
 * the softcap instance's varlen kernels. A `features` with any other bit set, or an unknown dtype, is answered 0:
 * this library has no kernel of a feature it does not know. */
DASH_C_API int dash_kernel_available(int64_t head_dim, int dtype, int features);

/* The version of the DASH sources this library was built from (the CMake project version, e.g. "0.1.0"); a
 * static string. */
DASH_C_API const char* dash_library_version(void);

/* CUDA versions as CUDA encodes them (1000 * major + 10 * minor: 12080 is 12.8); neither needs a device. The
 * runtime is the one linked into this library, the driver's is the newest CUDA it supports, 0 when no NVIDIA
 * driver is installed. */
DASH_C_API int dash_cuda_runtime_version(void);
DASH_C_API int dash_cuda_driver_version(void);

#define DASH_DEVICE_NAME_BYTES 256

/* A CUDA device as the planner sees it: multiprocessor_count is the SM count its schedules are planned for
 * (bitwise results are promised per SM count). dash_describe_current_device fills one for the current device;
 * dash_backward_plan_create reads one to plan for a given device. */
typedef struct dash_device {
  int index;
  int compute_major;
  int compute_minor;
  int multiprocessor_count;
  char name[DASH_DEVICE_NAME_BYTES]; /* NUL-terminated */
} dash_device;

/* In every function below, `message` (when not null and message_size > 0) receives the Status message,
 * truncated to message_size - 1 bytes and NUL-terminated; it is the empty string on success. `stream` is a
 * cudaStream_t value (null: the legacy default stream). `schedule` is a canonical name, e.g. "auto".
 * `workspace` is written by the call: it must share no byte (of its workspace_bytes) with any tensor of the call, the
 * LSE or cu_seqlens, or the call is refused with DASH_STATUS_INVALID_ARGUMENT naming what it overlaps, as an output
 * that overlaps another tensor or cu_seqlens is.
 * `sm_margin` is FlashAttention-3's: SMs the launch leaves to other work (communication kernels), 0 for none.
 * The persistent grids then use at most the device's SM count - sm_margin SMs, and the backward is planned for
 * that many; it must satisfy 0 <= sm_margin < the device's SM count. */

/* DASH_STATUS_OK if the current CUDA device can run the kernels; DASH_STATUS_NO_DEVICE with a message that
 * tells a missing driver, a driver too old for the runtime and no visible device apart. */
DASH_C_API int dash_check_device(char* message, size_t message_size);

/* Fills *device for the current CUDA device, a GPU the kernels cannot run on included (dash_check_device says
 * whether they can). Without a usable device: the code and message of dash_check_device, *device untouched. */
DASH_C_API int dash_describe_current_device(dash_device* device, char* message, size_t message_size);

/* Both workspace queries validate the shape (and the schedule) first, so a bad one is refused, with the
 * message of dash::validate, on any machine; *bytes is written only on success. */
DASH_C_API int dash_forward_workspace_size(const dash_shape* shape, size_t* bytes, char* message, size_t message_size);

/* Then plans and proves the schedule on the current device, so a valid shape needs a GPU. */
DASH_C_API int dash_backward_workspace_size(const dash_shape* shape, const char* schedule, size_t* bytes, char* message,
                                            size_t message_size);

/* out, lse = attention(q, k, v). varlen NULL: a dense batch, lse (B, Hq, Sq) packed fp32. varlen not NULL: the packed
 * batch it describes (dash_varlen above), *shape its maximum problem, lse (Hq, total_q); varlen->cu_seqlens_q and
 * cu_seqlens_k must not both be NULL. The workspace is dash_forward_workspace_size's of *shape in both.
 * out_dtype (enum dash_dtype) is out's element type: shape->dtype, or DASH_DTYPE_FP32 for the values before their
 * rounding to shape->dtype (rounded, they are the bits of the call with shape->dtype), for a caller that merges
 * partial results (dash_merge_partial); any other value is refused with DASH_STATUS_INVALID_ARGUMENT naming
 * out_dtype. out's strides are in its own elements, and 16-byte aligned data and strides are required of both. */
DASH_C_API int dash_forward(const dash_shape* shape, const dash_varlen* varlen, const dash_tensor* q,
                            const dash_tensor* k, const dash_tensor* v, const dash_tensor* out, int out_dtype,
                            float* lse, int sm_margin, void* workspace, size_t workspace_bytes, void* stream,
                            char* message, size_t message_size);

/* dash::MergeArgs: one block's partial attention result, part_out (batch, rows, heads, head_dim) and part_lse
 * (batch, heads, rows), merged into the accumulators acc_out (batch, seqlen, heads, head_dim) and acc_lse
 * (batch, heads, seqlen), all fp32, every stride in elements (dash_tensor's strides[3], the dim stride, must be 1; the
 * LSE strides are batch, head, row):
 *   lse' = logaddexp(lse, lse_b);  out' = out * exp(lse - lse') + out_b * exp(lse_b - lse')
 * with a weight whose LSE is -inf taken as 0, so that an empty accumulator row (out 0, LSE -inf) takes the block as
 * it is and no NaN comes of rows empty on both sides. Block row r goes to accumulator row row_index[r] (device
 * memory, `rows` distinct int32 rows in [0, seqlen), checked on the device: an index outside, or one naming a row
 * twice, is never written through; the merge then fills acc_out and acc_lse with NaN and the next call on the
 * device returns DASH_STATUS_ROW_INDEX_INVALID naming it) or, with row_index NULL, to row_offset + r. Packed (varlen) tensors are a batch of one: out
 * (1, total, heads, head_dim) with strides[0] = 0, the LSE (1, heads, total). */
typedef struct dash_merge_args {
  int64_t batch;
  int64_t rows;
  int64_t seqlen;
  int64_t heads;
  int64_t head_dim;
  dash_tensor part_out;
  const float* part_lse;
  int64_t part_lse_strides[3];
  dash_tensor acc_out;
  float* acc_lse;
  int64_t acc_lse_strides[3];
  const int32_t* row_index;
  int64_t row_offset;
} dash_merge_args;

/* Nonzero if this build has dash_merge_partial's kernel (every build with kernels has it). */
DASH_C_API int dash_merge_kernel_available(void);

/* Merges one block into the accumulators (dash_merge_args) in one launch on `stream`, deterministically (each row by
 * one warp, no atomics). The arguments are validated first (sizes > 0 within the attention calls' limits,
 * rows <= seqlen, row_offset within the accumulators or 0 with row_index, aligned non-null arrays, strides >= 0,
 * accumulators that neither overlap themselves nor share a byte with another array); then DASH_STATUS_NOT_AVAILABLE
 * in a build without kernels. */
DASH_C_API int dash_merge_partial(const dash_merge_args* args, void* stream, char* message, size_t message_size);

/* dq, dk, dv for upstream gradient dout, summed in the order `schedule` fixes; varlen as in dash_forward. Plans the
 * schedule at every call, as dash_backward_plan_create would with this varlen (a varlen call's hint from its totals);
 * a caller that repeats shapes keeps a dash_backward_plan instead. The workspace is dash_backward_workspace_size's of
 * *shape for a dense call, dash_backward_plan_workspace_size's of the varlen plan for a varlen one. */
DASH_C_API int dash_backward(const dash_shape* shape, const dash_varlen* varlen, const dash_tensor* q,
                             const dash_tensor* k, const dash_tensor* v, const dash_tensor* out,
                             const dash_tensor* dout, const float* lse, const dash_tensor* dq, const dash_tensor* dk,
                             const dash_tensor* dv, const char* schedule, int sm_margin, void* workspace,
                             size_t workspace_bytes, void* stream, char* message, size_t message_size);

/* dash::BackwardPlan: the backward planned once for one shape, schedule, SM margin and device (the schedule resolved,
 * planned for the device's SM count less the margin and proven) with the workspace size it needs. Immutable: one
 * handle may be run from any number of threads at once, until it is destroyed. */
typedef struct dash_backward_plan dash_backward_plan;

/* Validates *shape, the schedule name and sm_margin >= 0 first (the shape and schedule as the workspace queries do),
 * then plans for `device`, leaving sm_margin of its SMs free: NULL for the current device, which must be able to run
 * the kernels; otherwise only device->index and device->multiprocessor_count are read, and no GPU is needed.
 * sm_margin must be less than the device's SM count. On success *plan receives a new handle, which the caller frees
 * with dash_backward_plan_destroy; on failure *plan is untouched.
 * varlen NULL makes a dense plan. varlen not NULL makes a varlen plan (dash::plan_varlen_backward) for packed batches
 * whose maximum problem is *shape (batch = sequences, seqlen_q and seqlen_k = the maximum lengths); it holds for every
 * vector of lengths within the maxima. Only three fields of *varlen are read, and its cu_seqlens may be NULL:
 * - keys_within_queries, the promise its runs must carry; shift and symmetric shift are planned only with it
 *   (DASH_STATUS_SCHEDULE_REJECTED, naming the rule, otherwise);
 * - total_q and total_k (each must be > 0), for auto's hint alone: whether the packed rows let every sequence be as
 *   long as the maxima (total_q >= batch * seqlen_q and total_k >= batch * seqlen_k, dash::varlen_lengths_fill_maxima);
 *   when they show some sequence shorter, auto picks shortest-first under the full mask (shift runs mixed lengths
 *   slower). The totals restrict no batch the plan runs: a run is not checked against them. */
DASH_C_API int dash_backward_plan_create(const dash_shape* shape, const dash_varlen* varlen, const char* schedule,
                                         int sm_margin, const dash_device* device, dash_backward_plan** plan,
                                         char* message, size_t message_size);

/* *is_varlen = 1 for a varlen plan (made with a dash_varlen), 0 for a dense one; written only on success. */
DASH_C_API int dash_backward_plan_is_varlen(const dash_backward_plan* plan, int* is_varlen, char* message,
                                            size_t message_size);

/* *schedule = the canonical name of the schedule the plan runs ("auto" resolved, e.g. "shift"), a static string;
 * written only on success. */
DASH_C_API int dash_backward_plan_schedule(const dash_backward_plan* plan, const char** schedule, char* message,
                                           size_t message_size);

/* Frees a handle of dash_backward_plan_create; NULL is allowed and does nothing. */
DASH_C_API void dash_backward_plan_destroy(dash_backward_plan* plan);

/* The workspace bytes dash_backward_plan_run needs; *bytes is written only on success. */
DASH_C_API int dash_backward_plan_workspace_size(const dash_backward_plan* plan, size_t* bytes, char* message,
                                                 size_t message_size);

/* The SM count the plan was planned for, the device's less its sm_margin (the backward's persistent grid never
 * exceeds it); *sm_count is written only on success. */
DASH_C_API int dash_backward_plan_sm_count(const dash_backward_plan* plan, int* sm_count, char* message,
                                           size_t message_size);

/* dash_backward with the plan's schedule and sm_margin, without planning again. *shape must equal the plan's shape in
 * every field (a mismatch is refused, naming the field), varlen must be NULL for a dense plan and not NULL for a
 * varlen plan, carrying the plan's keys_within_queries (DASH_STATUS_INVALID_ARGUMENT, naming varlen and the rule,
 * otherwise); both are checked before the tensors' data and strides. The current device must be the plan's, and the
 * workspace must hold dash_backward_plan_workspace_size bytes. */
DASH_C_API int dash_backward_plan_run(const dash_backward_plan* plan, const dash_shape* shape,
                                      const dash_varlen* varlen, const dash_tensor* q, const dash_tensor* k,
                                      const dash_tensor* v, const dash_tensor* out, const dash_tensor* dout,
                                      const float* lse, const dash_tensor* dq, const dash_tensor* dk,
                                      const dash_tensor* dv, void* workspace, size_t workspace_bytes, void* stream,
                                      char* message, size_t message_size);

#ifdef __cplusplus
}
#endif

#endif /* DASH_C_H_ */
