// The C ABI of dash_c.h over the C++ API: converts the plain structs, calls dash::, and turns the Status
// into a code plus a message copied into the caller's buffer. Exceptions (only std::bad_alloc can come out
// of the API's string building and the plan handle's allocation) are caught here, since unwinding into a C
// caller is undefined. A dash_backward_plan handle owns one dash::BackwardPlan; it is allocated only by
// dash_backward_plan_create and freed only by dash_backward_plan_destroy. The version queries for
// diagnostics call the CUDA runtime linked into this library directly.
#include "dash_c.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include <cuda_runtime_api.h>

#include "dash/attention.hpp"

// The opaque handle of dash_c.h.
struct dash_backward_plan {
  dash::BackwardPlan plan;
};

namespace {

static_assert(DASH_STATUS_OK == static_cast<int>(dash::StatusCode::kOk));
static_assert(DASH_STATUS_INVALID_ARGUMENT == static_cast<int>(dash::StatusCode::kInvalidArgument));
static_assert(DASH_STATUS_NOT_SUPPORTED == static_cast<int>(dash::StatusCode::kNotSupported));
static_assert(DASH_STATUS_NOT_AVAILABLE == static_cast<int>(dash::StatusCode::kNotAvailable));
static_assert(DASH_STATUS_NO_DEVICE == static_cast<int>(dash::StatusCode::kNoDevice));
static_assert(DASH_STATUS_UNSUPPORTED_DEVICE == static_cast<int>(dash::StatusCode::kUnsupportedDevice));
static_assert(DASH_STATUS_WORKSPACE_TOO_SMALL == static_cast<int>(dash::StatusCode::kWorkspaceTooSmall));
static_assert(DASH_STATUS_SCHEDULE_REJECTED == static_cast<int>(dash::StatusCode::kScheduleRejected));
static_assert(DASH_STATUS_CUDA_ERROR == static_cast<int>(dash::StatusCode::kCudaError));
static_assert(DASH_STATUS_WAIT_TIMEOUT == static_cast<int>(dash::StatusCode::kWaitTimeout));
static_assert(DASH_STATUS_SEQLEN_EXCEEDS_MAX == static_cast<int>(dash::StatusCode::kSeqlenExceedsMax));
static_assert(DASH_STATUS_ROW_INDEX_INVALID == static_cast<int>(dash::StatusCode::kRowIndexInvalid));
static_assert(DASH_STATUS_CU_SEQLENS_INVALID == static_cast<int>(dash::StatusCode::kCuSeqlensInvalid));
static_assert(DASH_DTYPE_BF16 == static_cast<int>(dash::DType::kBF16));
static_assert(DASH_DTYPE_FP16 == static_cast<int>(dash::DType::kFP16));
static_assert(DASH_DTYPE_FP32 != DASH_DTYPE_BF16 && DASH_DTYPE_FP32 != DASH_DTYPE_FP16,
              "DASH_DTYPE_FP32 names no input type: dash_forward's out_dtype alone takes it");

constexpr const char* kHostErrorName = "host-error";

// Copies `text` into the caller's buffer, truncated so the terminating NUL always fits.
void copy_message(std::string_view text, char* message, size_t message_size) {
  if (message == nullptr || message_size == 0) return;
  const size_t length = std::min(text.size(), message_size - 1);
  std::memcpy(message, text.data(), length);
  message[length] = '\0';
}

int report(const dash::Status& status, char* message, size_t message_size) {
  copy_message(status.message(), message, message_size);
  return static_cast<int>(status.code());
}

dash::Status invalid(std::string text) { return {dash::StatusCode::kInvalidArgument, std::move(text)}; }

// Runs `call` (which returns a Status) and reports it; an escaping exception becomes DASH_STATUS_HOST_ERROR.
template <typename Call>
int guarded(char* message, size_t message_size, Call call) {
  try {
    return report(call(), message, message_size);
  } catch (const std::exception& error) {
    copy_message(error.what(), message, message_size);
  } catch (...) {
    copy_message("unknown C++ exception", message, message_size);
  }
  return DASH_STATUS_HOST_ERROR;
}

dash::AttentionShape to_shape(const dash_shape& s) {
  dash::AttentionShape shape;
  shape.batch = s.batch;
  shape.seqlen_q = s.seqlen_q;
  shape.seqlen_k = s.seqlen_k;
  shape.heads_q = s.heads_q;
  shape.heads_kv = s.heads_kv;
  shape.head_dim = s.head_dim;
  shape.dtype = static_cast<dash::DType>(s.dtype);  // validate() rejects values outside the enum
  shape.softmax_scale = s.softmax_scale;
  shape.causal = s.causal != 0;
  if (s.windowed != 0) {
    shape.window_left = s.window_left;
    shape.window_right = s.window_right;
  }
  shape.softcap = s.softcap;
  return shape;
}

// One C tensor as the API's tensor reference. dash_tensor has one mutable data pointer for inputs and outputs
// alike (C has no const overloads to tell them apart); the MutableTensorRef converts to the TensorRef of an input.
dash::MutableTensorRef to_tensor(const dash_tensor& t) {
  return {t.data, {t.strides[0], t.strides[1], t.strides[2], t.strides[3]}};
}

// The struct pointers themselves must be present; null data pointers inside them are left to validate().
dash::Status check_present(std::initializer_list<std::pair<const void*, const char*>> arguments) {
  for (const auto& [pointer, name] : arguments) {
    if (pointer == nullptr) return invalid(std::string(name) + " must not be null");
  }
  return dash::Status::success();
}

// C has no bool, and the C++ API's flags are bools: a flag of the C structs or arguments must be 0 or 1, so that a
// field left uninitialized or filled with another field's value is refused, naming it, rather than read as true.
dash::Status check_flag(int value, const char* name) {
  if (value == 0 || value == 1) return dash::Status::success();
  return invalid(std::string(name) + " must be 0 or 1 (a flag), got " + std::to_string(value));
}

dash::Status check_flags(std::initializer_list<std::pair<int, const char*>> flags) {
  for (const auto& [value, name] : flags) {
    if (dash::Status s = check_flag(value, name); !s.ok()) return s;
  }
  return dash::Status::success();
}

// A present shape's flags; windowed's bounds are int64 in both APIs and validate() checks them.
dash::Status check_shape_flags(const dash_shape& shape) {
  return check_flags({{shape.causal, "shape.causal"}, {shape.windowed, "shape.windowed"}});
}

// The shape pointer, then its flags.
dash::Status check_shape(const dash_shape* shape) {
  if (dash::Status s = check_present({{shape, "shape"}}); !s.ok()) return s;
  return check_shape_flags(*shape);
}

dash::Status parse(const char* schedule, dash::Schedule* parsed) {
  if (schedule == nullptr) return invalid("schedule must not be null (pass a name such as \"auto\")");
  return dash::parse_schedule(schedule, parsed);
}

cudaStream_t to_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

dash::DeviceInfo to_device_info(const dash_device& d) {
  dash::DeviceInfo device;
  device.index = d.index;
  device.multiprocessor_count = d.multiprocessor_count;
  device.compute_major = d.compute_major;
  device.compute_minor = d.compute_minor;
  device.name.assign(d.name, strnlen(d.name, sizeof(d.name)));  // a caller's name may lack its NUL
  return device;
}

dash::Status describe_current_device(dash_device* device) {
  if (dash::Status s = check_present({{device, "device"}}); !s.ok()) return s;
  dash::DeviceInfo info;
  if (dash::Status s = dash::current_device_info(&info); !s.ok()) return s;
  device->index = info.index;
  device->compute_major = info.compute_major;
  device->compute_minor = info.compute_minor;
  device->multiprocessor_count = info.multiprocessor_count;
  copy_message(info.name, device->name, sizeof(device->name));
  return dash::Status::success();
}

// The tensors of a backward call, in the order dash_backward and dash_backward_plan_run take them.
struct BackwardTensors {
  const dash_tensor* q;
  const dash_tensor* k;
  const dash_tensor* v;
  const dash_tensor* out;
  const dash_tensor* dout;
  const float* lse;
  const dash_tensor* dq;
  const dash_tensor* dk;
  const dash_tensor* dv;
};

// The BackwardArgs of a call whose struct pointers were checked; its schedule is left to the caller.
dash::BackwardArgs to_backward_args(const dash_shape& shape, const BackwardTensors& t) {
  dash::BackwardArgs args;
  args.shape = to_shape(shape);
  args.q = to_tensor(*t.q);
  args.k = to_tensor(*t.k);
  args.v = to_tensor(*t.v);
  args.out = to_tensor(*t.out);
  args.dout = to_tensor(*t.dout);
  args.lse = t.lse;
  args.dq = to_tensor(*t.dq);
  args.dk = to_tensor(*t.dk);
  args.dv = to_tensor(*t.dv);
  return args;
}

// A call's dash_varlen: NULL for a dense batch (no VarlenBatch), else the packed batch it describes, which must name
// its offsets: both null would make it a dense call in a varlen's clothing. Its flag is checked as the shape's are.
dash::Status to_varlen(const dash_varlen* v, dash::VarlenBatch* varlen) {
  if (v == nullptr) return dash::Status::success();
  if (v->cu_seqlens_q == nullptr && v->cu_seqlens_k == nullptr) {
    return invalid(
        "varlen.cu_seqlens_q and varlen.cu_seqlens_k must not both be null (pass varlen NULL for a dense "
        "batch)");
  }
  if (dash::Status s = check_flag(v->keys_within_queries, "varlen.keys_within_queries"); !s.ok()) return s;
  varlen->cu_seqlens_q = v->cu_seqlens_q;
  varlen->cu_seqlens_k = v->cu_seqlens_k;
  varlen->total_q = v->total_q;
  varlen->total_k = v->total_k;
  varlen->keys_within_queries = v->keys_within_queries != 0;
  return dash::Status::success();
}

// What a varlen plan reads of its dash_varlen: the promise and the totals that give auto's hint. The totals are
// checked as a call's are (> 0) so that a plan is not made from rows no call could have.
dash::Status check_plan_varlen(const dash_varlen& v) {
  if (dash::Status s = check_flag(v.keys_within_queries, "varlen.keys_within_queries"); !s.ok()) return s;
  for (const auto& [total, name] : {std::pair{v.total_q, "varlen.total_q"}, std::pair{v.total_k, "varlen.total_k"}}) {
    if (total <= 0) {
      return invalid(std::string(name) + " must be > 0 (the packed rows; a varlen plan's auto reads its hint from " +
                     "them), got " + std::to_string(total));
    }
  }
  return dash::Status::success();
}

// A plan runs only the batches it was made for: a varlen plan's units and workspace are the maximum problem's, read
// per sequence from cu_seqlens, so a dense call on it (or a varlen call on a dense plan) would run the wrong kernels.
dash::Status check_plan_kind(const dash::BackwardPlan& plan, const dash_varlen* varlen) {
  if (plan.varlen() && varlen == nullptr) {
    return invalid(
        "varlen must not be NULL: the plan is a varlen plan (made with a dash_varlen), and runs packed "
        "batches only");
  }
  if (!plan.varlen() && varlen != nullptr) {
    return invalid(
        "varlen must be NULL: the plan is a dense plan (made with varlen NULL), and runs dense batches "
        "only");
  }
  return dash::Status::success();
}

// out_dtype as ForwardArgs::out_fp32: shape's dtype or DASH_DTYPE_FP32, nothing else.
dash::Status to_out_fp32(const dash_shape& shape, int out_dtype, bool* out_fp32) {
  if (out_dtype == shape.dtype || out_dtype == DASH_DTYPE_FP32) {
    *out_fp32 = out_dtype != shape.dtype;
    return dash::Status::success();
  }
  return invalid("out_dtype must be shape->dtype (" + std::to_string(shape.dtype) + ") or DASH_DTYPE_FP32 (" +
                 std::to_string(DASH_DTYPE_FP32) + ", the output before its rounding to shape->dtype), got " +
                 std::to_string(out_dtype));
}

dash::ForwardArgs to_forward_args(const dash_shape& shape, const dash_tensor& q, const dash_tensor& k,
                                  const dash_tensor& v, const dash_tensor& out, float* lse, int sm_margin) {
  dash::ForwardArgs args;
  args.shape = to_shape(shape);
  args.q = to_tensor(q);
  args.k = to_tensor(k);
  args.v = to_tensor(v);
  args.out = to_tensor(out);
  args.lse = lse;
  args.sm_margin = sm_margin;
  return args;
}

dash::Status check_backward_present(const dash_shape* shape, const BackwardTensors& t) {
  if (dash::Status s = check_shape(shape); !s.ok()) return s;
  return check_present(
      {{t.q, "q"}, {t.k, "k"}, {t.v, "v"}, {t.out, "out"}, {t.dout, "dout"}, {t.dq, "dq"}, {t.dk, "dk"}, {t.dv, "dv"}});
}

}  // namespace

extern "C" {

int dash_abi_version(void) { return DASH_C_ABI_VERSION; }

const char* dash_status_name(int code) {
  if (code == DASH_STATUS_HOST_ERROR) return kHostErrorName;
  return dash::status_code_name(static_cast<dash::StatusCode>(code));
}

const char* dash_schedule_names(void) {
  static const std::string names = [] {
    std::string joined;
    for (dash::Schedule s : dash::kAllSchedules) {
      if (!joined.empty()) joined += ',';
      joined += dash::schedule_name(s);
    }
    return joined;
  }();
  return names.c_str();
}

int dash_kernel_available(int64_t head_dim, int dtype, int features) {
  constexpr int kKnownFeatures = DASH_KERNEL_SOFTCAP | DASH_KERNEL_VARLEN;
  if ((features & ~kKnownFeatures) != 0) return 0;
  const auto type = static_cast<dash::DType>(dtype);  // kernel_available() answers false outside the enum
  const bool softcap = (features & DASH_KERNEL_SOFTCAP) != 0;
  const bool available = (features & DASH_KERNEL_VARLEN) != 0 ? dash::varlen_kernel_available(head_dim, type, softcap)
                                                              : dash::kernel_available(head_dim, type, softcap);
  return available ? 1 : 0;
}

const char* dash_library_version(void) { return DASH_C_LIBRARY_VERSION; }

// Both only read a version: they cannot fail in a way that matters (the driver's is 0 when there is none).
int dash_cuda_runtime_version(void) {
  int version = 0;
  static_cast<void>(cudaRuntimeGetVersion(&version));
  return version;
}

int dash_cuda_driver_version(void) {
  int version = 0;
  static_cast<void>(cudaDriverGetVersion(&version));
  return version;
}

int dash_describe_current_device(dash_device* device, char* message, size_t message_size) {
  return guarded(message, message_size, [&] { return describe_current_device(device); });
}

int dash_check_device(char* message, size_t message_size) {
  return guarded(message, message_size, [] { return dash::check_current_device(); });
}

int dash_forward_workspace_size(const dash_shape* shape, size_t* bytes, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_shape(shape); !s.ok()) return s;
    return dash::forward_workspace_size(to_shape(*shape), bytes);
  });
}

int dash_backward_workspace_size(const dash_shape* shape, const char* schedule, size_t* bytes, char* message,
                                 size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_shape(shape); !s.ok()) return s;
    dash::Schedule parsed = dash::Schedule::kAuto;
    if (dash::Status s = parse(schedule, &parsed); !s.ok()) return s;
    return dash::backward_workspace_size(to_shape(*shape), parsed, bytes);
  });
}

int dash_forward(const dash_shape* shape, const dash_varlen* varlen, const dash_tensor* q, const dash_tensor* k,
                 const dash_tensor* v, const dash_tensor* out, int out_dtype, float* lse, int sm_margin,
                 void* workspace, size_t workspace_bytes, void* stream, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_shape(shape); !s.ok()) return s;
    if (dash::Status s = check_present({{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}}); !s.ok()) return s;
    dash::ForwardArgs args = to_forward_args(*shape, *q, *k, *v, *out, lse, sm_margin);
    if (dash::Status s = to_out_fp32(*shape, out_dtype, &args.out_fp32); !s.ok()) return s;
    if (dash::Status s = to_varlen(varlen, &args.varlen); !s.ok()) return s;
    return dash::forward(args, workspace, workspace_bytes, to_stream(stream));
  });
}

int dash_merge_kernel_available(void) { return dash::merge_kernel_available() ? 1 : 0; }

int dash_merge_partial(const dash_merge_args* args, void* stream, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{args, "args"}}); !s.ok()) return s;
    dash::MergeArgs merge;
    merge.batch = args->batch;
    merge.rows = args->rows;
    merge.seqlen = args->seqlen;
    merge.heads = args->heads;
    merge.head_dim = args->head_dim;
    merge.part_out = to_tensor(args->part_out);
    merge.part_lse = args->part_lse;
    merge.part_lse_strides = {args->part_lse_strides[0], args->part_lse_strides[1], args->part_lse_strides[2]};
    merge.acc_out = to_tensor(args->acc_out);
    merge.acc_lse = args->acc_lse;
    merge.acc_lse_strides = {args->acc_lse_strides[0], args->acc_lse_strides[1], args->acc_lse_strides[2]};
    merge.row_index = args->row_index;
    merge.row_offset = args->row_offset;
    return dash::merge_partial(merge, to_stream(stream));
  });
}

int dash_backward(const dash_shape* shape, const dash_varlen* varlen, const dash_tensor* q, const dash_tensor* k,
                  const dash_tensor* v, const dash_tensor* out, const dash_tensor* dout, const float* lse,
                  const dash_tensor* dq, const dash_tensor* dk, const dash_tensor* dv, const char* schedule,
                  int sm_margin, void* workspace, size_t workspace_bytes, void* stream, char* message,
                  size_t message_size) {
  return guarded(message, message_size, [&] {
    const BackwardTensors tensors{q, k, v, out, dout, lse, dq, dk, dv};
    if (dash::Status s = check_backward_present(shape, tensors); !s.ok()) return s;
    dash::BackwardArgs args = to_backward_args(*shape, tensors);
    if (dash::Status s = to_varlen(varlen, &args.varlen); !s.ok()) return s;
    if (dash::Status s = parse(schedule, &args.schedule); !s.ok()) return s;
    args.sm_margin = sm_margin;
    // dash::backward plans a varlen call with plan_varlen_backward, its hint from the totals.
    return dash::backward(args, workspace, workspace_bytes, to_stream(stream));
  });
}

int dash_backward_plan_create(const dash_shape* shape, const dash_varlen* varlen, const char* schedule, int sm_margin,
                              const dash_device* device, dash_backward_plan** plan, char* message,
                              size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{shape, "shape"}, {plan, "plan"}}); !s.ok()) return s;
    if (dash::Status s = check_shape_flags(*shape); !s.ok()) return s;
    dash::Schedule parsed = dash::Schedule::kAuto;
    if (dash::Status s = parse(schedule, &parsed); !s.ok()) return s;
    if (varlen != nullptr) {
      if (dash::Status s = check_plan_varlen(*varlen); !s.ok()) return s;
    }
    const dash::AttentionShape api_shape = to_shape(*shape);
    dash::BackwardPlan made;
    dash::Status planned;
    if (varlen == nullptr) {
      planned = device == nullptr ? dash::plan_backward(api_shape, parsed, sm_margin, &made)
                                  : dash::plan_backward(api_shape, parsed, sm_margin, to_device_info(*device), &made);
    } else {
      const bool promise = varlen->keys_within_queries != 0;
      const bool fill = dash::varlen_lengths_fill_maxima(api_shape, varlen->total_q, varlen->total_k);
      planned = device == nullptr ? dash::plan_varlen_backward(api_shape, promise, fill, parsed, sm_margin, &made)
                                  : dash::plan_varlen_backward(api_shape, promise, fill, parsed, sm_margin,
                                                               to_device_info(*device), &made);
    }
    if (!planned.ok()) return planned;
    *plan = new dash_backward_plan{std::move(made)};
    return dash::Status::success();
  });
}

int dash_backward_plan_is_varlen(const dash_backward_plan* plan, int* is_varlen, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{plan, "plan"}, {is_varlen, "is_varlen"}}); !s.ok()) return s;
    *is_varlen = plan->plan.varlen() ? 1 : 0;
    return dash::Status::success();
  });
}

void dash_backward_plan_destroy(dash_backward_plan* plan) { delete plan; }

int dash_backward_plan_schedule(const dash_backward_plan* plan, const char** schedule, char* message,
                                size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{plan, "plan"}, {schedule, "schedule"}}); !s.ok()) return s;
    // schedule_name's names are string literals: NUL-terminated and static.
    *schedule = dash::schedule_name(plan->plan.schedule()).data();
    return dash::Status::success();
  });
}

int dash_backward_plan_workspace_size(const dash_backward_plan* plan, size_t* bytes, char* message,
                                      size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{plan, "plan"}, {bytes, "bytes"}}); !s.ok()) return s;
    *bytes = plan->plan.workspace_bytes();
    return dash::Status::success();
  });
}

int dash_backward_plan_sm_count(const dash_backward_plan* plan, int* sm_count, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{plan, "plan"}, {sm_count, "sm_count"}}); !s.ok()) return s;
    *sm_count = plan->plan.planned_sm_count();
    return dash::Status::success();
  });
}

int dash_backward_plan_run(const dash_backward_plan* plan, const dash_shape* shape, const dash_varlen* varlen,
                           const dash_tensor* q, const dash_tensor* k, const dash_tensor* v, const dash_tensor* out,
                           const dash_tensor* dout, const float* lse, const dash_tensor* dq, const dash_tensor* dk,
                           const dash_tensor* dv, void* workspace, size_t workspace_bytes, void* stream, char* message,
                           size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{plan, "plan"}}); !s.ok()) return s;
    const BackwardTensors tensors{q, k, v, out, dout, lse, dq, dk, dv};
    if (dash::Status s = check_backward_present(shape, tensors); !s.ok()) return s;
    if (dash::Status s = check_plan_kind(plan->plan, varlen); !s.ok()) return s;
    dash::BackwardArgs args = to_backward_args(*shape, tensors);
    if (dash::Status s = to_varlen(varlen, &args.varlen); !s.ok()) return s;
    // The handle carries the schedule and the SM margin; the C call does not. dash::backward compares the rest of
    // the call (the shape, the promise) with the plan.
    args.schedule = plan->plan.requested_schedule();
    args.sm_margin = plan->plan.sm_margin();
    return dash::backward(args, plan->plan, workspace, workspace_bytes, to_stream(stream));
  });
}

}  // extern "C"
