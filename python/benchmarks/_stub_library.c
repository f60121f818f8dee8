/* A stand-in for libdash_attn_c.so that python_overhead.py compiles and loads through $DASH_ATTN_LIBRARY, so the
 * package's real Python path (checks, custom ops, autograd, plan cache, ctypes marshalling) runs on a machine
 * without a GPU while every C call returns at once.
 *
 * Invariants: it defines every function of src/capi/dash_c.h, which it includes, so the compiler checks each
 * signature against the header and a changed ABI fails its build instead of its measurements; it reports the
 * header's DASH_C_ABI_VERSION, so the package's load() accepts it unchanged; every entry point succeeds without
 * touching its tensors; the workspace sizes are those the real library reports for a tiny shape (the forward's
 * fixed 256 bytes, a backward of the size of a (B, Hq, Sq, D) fp32 dQ accumulator) so the allocations match. It is
 * a benchmark fixture only: it computes nothing and must never be installed. */

#define DASH_C_BUILDING
#include <string.h>

#include "dash_c.h"

/* A plan handle needs an address the package can hold and pass back; nothing reads through it. */
static int stub_plan;

/* The plan keeps the shape's workspace size in a static: the benchmark runs one shape at a time. */
static size_t stub_plan_bytes;
static int stub_plan_is_varlen;

static int ok(char* message, size_t message_size) {
  if (message != NULL && message_size > 0) message[0] = '\0';
  return DASH_STATUS_OK;
}

static int stub_kernel(int64_t head_dim, int dtype) {
  return (head_dim == 64 || head_dim == 128) && (dtype == DASH_DTYPE_BF16 || dtype == DASH_DTYPE_FP16);
}

int dash_abi_version(void) { return DASH_C_ABI_VERSION; }
const char* dash_status_name(int code) { return code == DASH_STATUS_OK ? "ok" : "stub-error"; }
const char* dash_schedule_names(void) {
  return "auto,ascending,descending,shortest-first,shift,symmetric-shift,nondeterministic";
}
int dash_kernel_available(int64_t head_dim, int dtype, int features) {
  return (features & ~(DASH_KERNEL_SOFTCAP | DASH_KERNEL_VARLEN)) == 0 && stub_kernel(head_dim, dtype);
}
const char* dash_library_version(void) { return "stub"; }
int dash_cuda_runtime_version(void) { return 0; }
int dash_cuda_driver_version(void) { return 0; }
int dash_check_device(char* m, size_t n) { return ok(m, n); }

int dash_describe_current_device(dash_device* device, char* m, size_t n) {
  memset(device, 0, sizeof *device);
  device->compute_major = 9;
  device->multiprocessor_count = 132;
  strcpy(device->name, "stub");
  return ok(m, n);
}

static size_t backward_bytes(const dash_shape* s) {
  return (size_t)(s->batch * s->heads_q * s->seqlen_q * s->head_dim) * sizeof(float);
}

int dash_forward_workspace_size(const dash_shape* s, size_t* bytes, char* m, size_t n) {
  (void)s;
  *bytes = 256;
  return ok(m, n);
}

int dash_backward_workspace_size(const dash_shape* s, const char* schedule, size_t* bytes, char* m, size_t n) {
  (void)schedule;
  *bytes = backward_bytes(s);
  return ok(m, n);
}

int dash_forward(const dash_shape* s, const dash_varlen* varlen, const dash_tensor* q, const dash_tensor* k,
                 const dash_tensor* v, const dash_tensor* out, int out_dtype, float* lse, int margin, void* ws,
                 size_t ws_bytes, void* stream, char* m, size_t n) {
  (void)s, (void)varlen, (void)q, (void)k, (void)v, (void)out, (void)out_dtype, (void)lse, (void)margin, (void)ws;
  (void)ws_bytes, (void)stream;
  return ok(m, n);
}

int dash_merge_kernel_available(void) { return 1; }

int dash_merge_partial(const dash_merge_args* args, void* stream, char* m, size_t n) {
  (void)args, (void)stream;
  return ok(m, n);
}

int dash_backward(const dash_shape* s, const dash_varlen* varlen, const dash_tensor* q, const dash_tensor* k,
                  const dash_tensor* v, const dash_tensor* out, const dash_tensor* dout, const float* lse,
                  const dash_tensor* dq, const dash_tensor* dk, const dash_tensor* dv, const char* schedule, int margin,
                  void* ws, size_t ws_bytes, void* stream, char* m, size_t n) {
  (void)s, (void)varlen, (void)q, (void)k, (void)v, (void)out, (void)dout, (void)lse, (void)dq, (void)dk, (void)dv;
  (void)schedule, (void)margin, (void)ws, (void)ws_bytes, (void)stream;
  return ok(m, n);
}

int dash_backward_plan_create(const dash_shape* s, const dash_varlen* varlen, const char* schedule, int margin,
                              const dash_device* device, dash_backward_plan** plan, char* m, size_t n) {
  (void)schedule, (void)margin, (void)device;
  stub_plan_bytes = backward_bytes(s);
  stub_plan_is_varlen = varlen != NULL;
  *plan = (dash_backward_plan*)&stub_plan;
  return ok(m, n);
}

int dash_backward_plan_is_varlen(const dash_backward_plan* plan, int* is_varlen, char* m, size_t n) {
  (void)plan;
  *is_varlen = stub_plan_is_varlen;
  return ok(m, n);
}

int dash_backward_plan_schedule(const dash_backward_plan* plan, const char** schedule, char* m, size_t n) {
  (void)plan;
  *schedule = "ascending";
  return ok(m, n);
}

void dash_backward_plan_destroy(dash_backward_plan* plan) { (void)plan; }

int dash_backward_plan_workspace_size(const dash_backward_plan* plan, size_t* bytes, char* m, size_t n) {
  (void)plan;
  *bytes = stub_plan_bytes;
  return ok(m, n);
}

int dash_backward_plan_sm_count(const dash_backward_plan* plan, int* sm_count, char* m, size_t n) {
  (void)plan;
  *sm_count = 132;
  return ok(m, n);
}

int dash_backward_plan_run(const dash_backward_plan* plan, const dash_shape* s, const dash_varlen* varlen,
                           const dash_tensor* q, const dash_tensor* k, const dash_tensor* v, const dash_tensor* out,
                           const dash_tensor* dout, const float* lse, const dash_tensor* dq, const dash_tensor* dk,
                           const dash_tensor* dv, void* ws, size_t ws_bytes, void* stream, char* m, size_t n) {
  (void)plan, (void)s, (void)varlen, (void)q, (void)k, (void)v, (void)out, (void)dout, (void)lse, (void)dq, (void)dk;
  (void)dv, (void)ws, (void)ws_bytes, (void)stream;
  return ok(m, n);
}
