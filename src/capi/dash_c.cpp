// The C ABI of dash_c.h over the C++ API: converts the plain structs, calls dash::, and turns the Status
// into a code plus a message copied into the caller's buffer. Exceptions (only std::bad_alloc can come out
// of the API's string building) are caught here, since unwinding into a C caller is undefined. The version
// and device queries for diagnostics call the CUDA runtime linked into this library directly.
#include "dash_c.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "dash/attention.hpp"

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
static_assert(DASH_DTYPE_BF16 == static_cast<int>(dash::DType::kBF16));
static_assert(DASH_DTYPE_FP16 == static_cast<int>(dash::DType::kFP16));

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
  return shape;
}

dash::Strides to_strides(const dash_tensor& t) { return {t.strides[0], t.strides[1], t.strides[2], t.strides[3]}; }

// The struct pointers themselves must be present; null data pointers inside them are left to validate().
dash::Status check_present(std::initializer_list<std::pair<const void*, const char*>> arguments) {
  for (const auto& [pointer, name] : arguments) {
    if (pointer == nullptr) return invalid(std::string(name) + " must not be null");
  }
  return dash::Status::success();
}

dash::Status parse(const char* schedule, dash::Schedule* parsed) {
  if (schedule == nullptr) return invalid("schedule must not be null (pass a name such as \"auto\")");
  return dash::parse_schedule(schedule, parsed);
}

cudaStream_t to_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// "call: error string", clearing the error the failed runtime call recorded (the Status now reports it).
dash::Status cuda_failure(const std::string& call, cudaError_t error) {
  static_cast<void>(cudaGetLastError());
  return {dash::StatusCode::kCudaError, call + ": " + cudaGetErrorString(error)};
}

dash::Status describe_current_device(dash_device* device) {
  if (dash::Status s = check_present({{device, "device"}}); !s.ok()) return s;
  // An unsupported GPU is still described; only a missing device or a failing runtime stops here.
  if (dash::Status s = dash::check_current_device();
      s.code() == dash::StatusCode::kNoDevice || s.code() == dash::StatusCode::kCudaError) {
    return s;
  }
  int index = 0;
  if (const cudaError_t error = cudaGetDevice(&index); error != cudaSuccess) {
    return cuda_failure("cudaGetDevice", error);
  }
  cudaDeviceProp properties{};
  if (const cudaError_t error = cudaGetDeviceProperties(&properties, index); error != cudaSuccess) {
    return cuda_failure("cudaGetDeviceProperties(" + std::to_string(index) + ")", error);
  }
  device->index = index;
  device->compute_major = properties.major;
  device->compute_minor = properties.minor;
  device->multiprocessor_count = properties.multiProcessorCount;
  copy_message(properties.name, device->name, sizeof(device->name));
  return dash::Status::success();
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

int dash_kernel_available(int64_t head_dim, int dtype) {
  return dash::kernel_available(head_dim, static_cast<dash::DType>(dtype)) ? 1 : 0;
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
    if (dash::Status s = check_present({{shape, "shape"}}); !s.ok()) return s;
    return dash::forward_workspace_size(to_shape(*shape), bytes);
  });
}

int dash_backward_workspace_size(const dash_shape* shape, const char* schedule, size_t* bytes, char* message,
                                 size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{shape, "shape"}}); !s.ok()) return s;
    dash::Schedule parsed = dash::Schedule::kAuto;
    if (dash::Status s = parse(schedule, &parsed); !s.ok()) return s;
    return dash::backward_workspace_size(to_shape(*shape), parsed, bytes);
  });
}

int dash_forward(const dash_shape* shape, const dash_tensor* q, const dash_tensor* k, const dash_tensor* v,
                 const dash_tensor* out, float* lse, void* workspace, size_t workspace_bytes, void* stream,
                 char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{shape, "shape"}, {q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}}); !s.ok()) {
      return s;
    }
    dash::ForwardArgs args;
    args.shape = to_shape(*shape);
    args.q = q->data;
    args.q_strides = to_strides(*q);
    args.k = k->data;
    args.k_strides = to_strides(*k);
    args.v = v->data;
    args.v_strides = to_strides(*v);
    args.out = out->data;
    args.out_strides = to_strides(*out);
    args.lse = lse;
    return dash::forward(args, workspace, workspace_bytes, to_stream(stream));
  });
}

int dash_backward(const dash_shape* shape, const dash_tensor* q, const dash_tensor* k, const dash_tensor* v,
                  const dash_tensor* out, const dash_tensor* dout, const float* lse, const dash_tensor* dq,
                  const dash_tensor* dk, const dash_tensor* dv, const char* schedule, void* workspace,
                  size_t workspace_bytes, void* stream, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (dash::Status s = check_present({{shape, "shape"},
                                        {q, "q"},
                                        {k, "k"},
                                        {v, "v"},
                                        {out, "out"},
                                        {dout, "dout"},
                                        {dq, "dq"},
                                        {dk, "dk"},
                                        {dv, "dv"}});
        !s.ok()) {
      return s;
    }
    dash::BackwardArgs args;
    args.shape = to_shape(*shape);
    if (dash::Status s = parse(schedule, &args.schedule); !s.ok()) return s;
    args.q = q->data;
    args.q_strides = to_strides(*q);
    args.k = k->data;
    args.k_strides = to_strides(*k);
    args.v = v->data;
    args.v_strides = to_strides(*v);
    args.out = out->data;
    args.out_strides = to_strides(*out);
    args.dout = dout->data;
    args.dout_strides = to_strides(*dout);
    args.lse = lse;
    args.dq = dq->data;
    args.dq_strides = to_strides(*dq);
    args.dk = dk->data;
    args.dk_strides = to_strides(*dk);
    args.dv = dv->data;
    args.dv_strides = to_strides(*dv);
    return dash::backward(args, workspace, workspace_bytes, to_stream(stream));
  });
}

}  // extern "C"
