// Host-side argument validation: the shape alone (validate(AttentionShape), which every entry point and the
// tools that plan without tensors run first), the schedule value, sm_margin, and for forward() and backward()
// also pointers, alignment, strides, self-overlap of each layout, overlap of outputs with the other tensors and a
// varlen call's cu_seqlens, and (check_workspace_overlap) overlap of the workspace with any of them; and the
// arguments of merge_partial(). Tensors are checked in their own element size: 2 bytes, or 4 for a float32 out
// (ForwardArgs::out_fp32) and the merge's arrays.
// Nothing here touches the GPU. Every failure names the argument and the rule, so a caller can fix the
// call from the message alone. The shape is checked before anything that uses it, so later checks may rely
// on every size being within the limits of api/limits.hpp.
#include "api/validate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "api/limits.hpp"
#include "dash/attention.hpp"

namespace dash {
namespace {

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

Status invalid(std::string message) { return {StatusCode::kInvalidArgument, std::move(message)}; }
Status not_supported(std::string message) { return {StatusCode::kNotSupported, std::move(message)}; }

// The largest head dim: with it, kMaxGridDimYZ and kMaxSeqlen, every size product below fits int64.
constexpr int64_t kMaxHeadDim = std::ranges::max(kSupportedHeadDims);
static_assert(kMaxGridDimYZ * kMaxGridDimYZ * kMaxSeqlen * kMaxHeadDim < INT64_MAX / int64_t{sizeof(float)},
              "the size limits must keep batch * heads_q * seqlen_q * head_dim (and the LSE bytes) within int64");
// A tensor's largest byte offset is sum((extent - 1) * stride) over (batch, seq, head) plus head_dim - 1, in
// elements; with strides below kTmaStrideLimitBytes (in bytes, whatever the element size) and extents within the shape
// limits it fits int64. The merge's arrays have the same extents and stride limit.
static_assert((2 * kMaxGridDimYZ + kMaxSeqlen + kMaxHeadDim) * kTmaStrideLimitBytes < INT64_MAX,
              "the stride and size limits must keep every byte offset of a tensor within int64");

// Bytes of a float32 element: a float32 out and the merge's arrays.
constexpr int64_t kFloatBytes = sizeof(float);

// Fails unless the product of `factors` (sizes already checked against their limits, so it cannot overflow)
// is below kMaxKernelIndex. `what` spells the product.
Status check_index_product(std::initializer_list<int64_t> factors, const std::string& what) {
  int64_t product = 1;
  for (int64_t factor : factors) product *= factor;
  if (product < kMaxKernelIndex) return Status::success();
  return not_supported(cat("shape: ", what, " must be < ", kMaxKernelIndex,
                           " (the kernels index it with 32-bit integers), got ", product));
}

Status check_pointer(const char* name, const void* data, int64_t alignment, const char* why) {
  if (data == nullptr) return invalid(cat(name, " must not be null"));
  if (reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(alignment) != 0) {
    return invalid(cat(name, " must be ", alignment, "-byte aligned (", why, "), got address ", data));
  }
  return Status::success();
}

// The bytes [first, last] a tensor argument may touch.
struct ByteSpan {
  const char* name;
  bool output;
  uintptr_t first;
  uintptr_t last;
};

// A span of `last_byte + 1` bytes at `data`, or an error if it runs past the end of the address space.
Status make_span(const char* name, bool output, const void* data, int64_t last_byte, ByteSpan* span) {
  const auto first = reinterpret_cast<uintptr_t>(data);
  const auto offset = static_cast<uintptr_t>(last_byte);
  if (offset > UINTPTR_MAX - first) {
    return invalid(
        cat(name, ": the tensor at ", data, " spans ", last_byte + 1, " bytes, past the end of the address space"));
  }
  *span = ByteSpan{name, output, first, first + offset};
  return Status::success();
}

// One (B, S, H, D) tensor argument: its TensorRef, what the shape says of it, and whether the call writes it.
struct TensorArg {
  const char* name;  // "q": messages name the field (q.data is "q", its strides "q.strides.seq")
  TensorRef tensor;
  int64_t seqlen;
  int64_t heads;
  bool output;
  int64_t element_bytes = kElementBytes;
};

struct Dimension {
  const char* name;
  int64_t stride;
  int64_t extent;
};

// Fails unless the layout `dims` of `name` (`layout` spells it, "(B, S, H, D)"; `strides` names its strides in
// messages) gives every index an element of its own: ordering the dimensions that have more than one index by stride,
// each stride must step over everything the smaller dimensions span, and the innermost over one element. Strides are
// non-negative by now.
Status check_one_to_one(const char* name, const std::string& strides, const char* layout,
                        std::span<const Dimension> dims) {
  std::vector<Dimension> varying;
  for (const Dimension& d : dims) {
    if (d.extent > 1) varying.push_back(d);
  }
  std::ranges::stable_sort(varying, {}, &Dimension::stride);
  const Dimension* inner = nullptr;
  for (const Dimension& d : varying) {
    if (inner == nullptr && d.stride < 1) {
      return invalid(cat(strides, ": the ", layout, " layout of ", name, " overlaps itself: the ", d.name,
                         " stride is ", d.stride, " but that dimension has ", d.extent, " indices"));
    }
    if (inner != nullptr) {
      const int64_t inner_span = inner->stride * inner->extent;
      if (d.stride < inner_span) {
        return invalid(cat(strides, ": the ", layout, " layout of ", name, " overlaps itself: the ", d.name, " stride ",
                           d.stride, " is less than the ", inner->name, " stride ", inner->stride, " times its extent ",
                           inner->extent));
      }
    }
    inner = &d;
  }
  return Status::success();
}

// Checks the strides of `t` and, when they are valid, computes the bytes it spans.
Status check_layout(const TensorArg& t, int64_t batch, int64_t head_dim, ByteSpan* span) {
  const Strides& strides = t.tensor.strides;
  if (strides.dim != 1) {
    return invalid(cat(t.name, ".strides.dim must be 1 (the last dimension must be contiguous), got ", strides.dim));
  }
  const std::array<Dimension, 4> dims = {{
      {"batch", strides.batch, batch},
      {"seq", strides.seq, t.seqlen},
      {"head", strides.head, t.heads},
      {"dim", strides.dim, head_dim},
  }};
  // In t's own elements: a float32 out keeps the 16-byte rules (its stores are 8-byte pairs; one rule for every out).
  const int64_t stride_multiple = kTmaAlignmentBytes / t.element_bytes;
  const int64_t stride_limit = kTmaStrideLimitBytes / t.element_bytes;
  for (const Dimension& d : std::span(dims).first<3>()) {  // batch, seq, head: dim is 1 by now
    if (d.stride < 0) return invalid(cat(t.name, ".strides.", d.name, " must be >= 0, got ", d.stride));
    if (d.stride % stride_multiple != 0) {
      return invalid(cat(t.name, ".strides.", d.name, " must be a multiple of ", stride_multiple, " elements (",
                         kTmaAlignmentBytes, " bytes, a TMA requirement), got ", d.stride));
    }
    // Applies to dimensions of one index too: the TMA descriptor encodes every stride.
    if (d.stride >= stride_limit) {
      return invalid(cat(t.name, ".strides.", d.name, " must be < ", stride_limit, " elements (2^40 bytes, ",
                         "the largest stride a TMA descriptor can encode), got ", d.stride));
    }
  }
  // Strides are non-negative, so the first element is at offset 0 and the last at sum((extent - 1) * stride);
  // the static_assert above keeps it within int64.
  int64_t last_element = 0;
  for (const Dimension& d : dims) last_element += (d.extent - 1) * d.stride;
  const int64_t last_byte = last_element * t.element_bytes + t.element_bytes - 1;
  if (Status s = check_one_to_one(t.name, cat(t.name, ".strides"), "(B, S, H, D)", dims); !s.ok()) return s;
  return make_span(t.name, t.output, t.tensor.data, last_byte, span);
}

// The rows of a call's tensors: (batch, seqlen) of a dense call, one batch of the packed rows of a varlen call;
// and the floats of its LSE.
struct CallRows {
  int64_t batch;
  int64_t rows_q;
  int64_t rows_k;
  int64_t lse_floats;
};

CallRows call_rows(const AttentionShape& shape, const VarlenBatch& varlen) {
  if (varlen.packed()) return {1, varlen.total_q, varlen.total_k, shape.heads_q * varlen.total_q};
  return {shape.batch, shape.seqlen_q, shape.seqlen_k, shape.batch * shape.heads_q * shape.seqlen_q};
}

// A varlen call's own arguments (VarlenBatch, dash/types.hpp), after validate(shape): both offset arrays present
// and aligned, the totals positive and within the kernels' 32-bit indices. What cu_seqlens hold is not checked
// here: that would take a copy from the device.
Status check_varlen_batch(const AttentionShape& shape, const VarlenBatch& varlen) {
  const std::pair<const char*, const int32_t*> offsets[] = {{"varlen.cu_seqlens_q", varlen.cu_seqlens_q},
                                                            {"varlen.cu_seqlens_k", varlen.cu_seqlens_k}};
  for (const auto& [name, data] : offsets) {
    if (data == nullptr) {
      return invalid(cat(name, " must not be null in a varlen call (set both cu_seqlens_q and cu_seqlens_k, ",
                         "shape.batch + 1 int32 offsets each in device memory)"));
    }
    if (Status s = check_pointer(name, data, alignof(int32_t), "it holds int32 offsets"); !s.ok()) return s;
  }
  const std::tuple<const char*, int64_t, int64_t, const char*> totals[] = {
      {"varlen.total_q", varlen.total_q, shape.heads_q, "heads_q"},
      {"varlen.total_k", varlen.total_k, shape.heads_kv, "heads_kv"}};
  for (const auto& [name, total, heads, heads_name] : totals) {
    if (total <= 0) {
      return invalid(cat(name, " must be > 0 (the rows of the packed tensors; a batch without rows has nothing to ",
                         "compute), got ", total));
    }
    // total <= kMaxKernelIndex / (heads * head_dim) keeps it and the element count within int32 without overflow.
    if (total >= kMaxKernelIndex / (heads * shape.head_dim)) {
      return not_supported(cat(name, " * ", heads_name, " * head_dim must be < ", kMaxKernelIndex,
                               " (the kernels index packed rows with 32-bit integers), got ", name, " = ", total));
    }
  }
  return Status::success();
}

// A packed tensor has no batch dimension: its strides.batch must be 0, so that no layout reads it as one.
Status check_packed_strides(std::span<const TensorArg> tensors) {
  for (const TensorArg& t : tensors) {
    if (t.tensor.strides.batch != 0) {
      return invalid(cat(t.name, ".strides.batch must be 0 in a varlen call (a packed (total, heads, head_dim) ",
                         "tensor has no batch dimension), got ", t.tensor.strides.batch));
    }
  }
  return Status::success();
}

// The bytes of a varlen call's offset arrays: shape.batch + 1 int32 each, read by the kernels. Empty for a dense call.
std::vector<ByteSpan> cu_seqlens_spans(const AttentionShape& shape, const VarlenBatch& varlen) {
  if (!varlen.packed()) return {};
  // validate(shape) bounds batch by kMaxGridDimYZ, and check_varlen_batch checked both pointers: this cannot
  // overflow, and make_span refuses a span past the address space.
  const int64_t last_byte = (shape.batch + 1) * static_cast<int64_t>(sizeof(int32_t)) - 1;
  std::vector<ByteSpan> spans;
  for (const auto& [name, data] :
       {std::pair{"varlen.cu_seqlens_q", varlen.cu_seqlens_q}, std::pair{"varlen.cu_seqlens_k", varlen.cu_seqlens_k}}) {
    ByteSpan span{};
    if (make_span(name, false, data, last_byte, &span).ok()) spans.push_back(span);
  }
  return spans;
}

// Refuses the first pair of spans that share a byte where one of them is written (an output, or the workspace).
// Inputs may share memory (packed QKV, cu_seqlens_k == cu_seqlens_q); an output written while another span is read,
// or two written together, would make the result depend on the order of memory accesses.
constexpr const char* kWorkspaceName = "workspace";

// The refusal of `out` (written by the call) sharing bytes with `other`.
Status overlap_error(const ByteSpan& out, const ByteSpan& other) {
  const bool workspace = std::string_view(out.name) == kWorkspaceName;
  return invalid(cat(out.name, " overlaps ", other.name, " (", out.name, " spans bytes [0x", std::hex, out.first,
                     ", 0x", out.last, "], ", other.name, " [0x", other.first, ", 0x", other.last, "]): ",
                     workspace ? "the workspace, which the call writes, must not share memory with any tensor of the "
                                 "call"
                               : "an output must not share memory with any other tensor of the call"));
}

bool overlap(const ByteSpan& a, const ByteSpan& b) { return a.first <= b.last && b.first <= a.last; }

Status check_disjoint(std::span<const ByteSpan> spans) {
  for (size_t i = 0; i < spans.size(); ++i) {
    for (size_t j = i + 1; j < spans.size(); ++j) {
      const ByteSpan& a = spans[i];
      const ByteSpan& b = spans[j];
      if (!a.output && !b.output) continue;
      if (!overlap(a, b)) continue;
      return a.output ? overlap_error(a, b) : overlap_error(b, a);
    }
  }
  return Status::success();
}

// Checks pointers and layouts of all tensors of a call and appends the bytes each spans (the LSE's last) to *spans.
Status tensor_spans(const AttentionShape& shape, const CallRows& rows, std::span<const TensorArg> tensors,
                    const float* lse, bool lse_output, std::vector<ByteSpan>* spans) {
  for (const TensorArg& t : tensors) {
    if (Status s = check_pointer(t.name, t.tensor.data, kTmaAlignmentBytes, "TMA needs it"); !s.ok()) return s;
    ByteSpan span{};
    if (Status s = check_layout(t, rows.batch, shape.head_dim, &span); !s.ok()) return s;
    spans->push_back(span);
  }
  if (Status s = check_pointer("lse", lse, kLseAlignmentBytes, "it holds floats"); !s.ok()) return s;
  // validate(shape) bounded batch * heads_q * seqlen_q below 2^31 (check_varlen_batch heads_q * total_q), so this
  // cannot overflow.
  const int64_t lse_bytes = rows.lse_floats * static_cast<int64_t>(sizeof(float));
  ByteSpan lse_span{};
  if (Status s = make_span("lse", lse_output, lse, lse_bytes - 1, &lse_span); !s.ok()) return s;
  spans->push_back(lse_span);
  return Status::success();
}

// Checks pointers and layouts of all tensors of a call, then that no output shares a byte with another tensor or
// with a varlen call's offset arrays.
Status check_tensors(const AttentionShape& shape, const VarlenBatch& varlen, const CallRows& rows,
                     std::span<const TensorArg> tensors, const float* lse, bool lse_output) {
  std::vector<ByteSpan> spans = cu_seqlens_spans(shape, varlen);
  if (Status s = tensor_spans(shape, rows, tensors, lse, lse_output, &spans); !s.ok()) return s;
  return check_disjoint(spans);
}

// The forward's and the backward's tensors, as validate() checks them.
std::array<TensorArg, 4> forward_tensors(const ForwardArgs& args, const CallRows& rows) {
  const AttentionShape& shape = args.shape;
  return {{
      {"q", args.q, rows.rows_q, shape.heads_q, false},
      {"k", args.k, rows.rows_k, shape.heads_kv, false},
      {"v", args.v, rows.rows_k, shape.heads_kv, false},
      {"out", args.out, rows.rows_q, shape.heads_q, true, args.out_fp32 ? kFloatBytes : kElementBytes},
  }};
}

std::array<TensorArg, 8> backward_tensors(const BackwardArgs& args, const CallRows& rows) {
  const AttentionShape& shape = args.shape;
  return {{
      {"q", args.q, rows.rows_q, shape.heads_q, false},
      {"k", args.k, rows.rows_k, shape.heads_kv, false},
      {"v", args.v, rows.rows_k, shape.heads_kv, false},
      {"out", args.out, rows.rows_q, shape.heads_q, false},
      {"dout", args.dout, rows.rows_q, shape.heads_q, false},
      {"dq", args.dq, rows.rows_q, shape.heads_q, true},
      {"dk", args.dk, rows.rows_k, shape.heads_kv, true},
      {"dv", args.dv, rows.rows_k, shape.heads_kv, true},
  }};
}

// The bytes `t` spans when its pointer and strides are ones check_layout accepts (self-overlap aside); false, with
// *span untouched, otherwise: validate() refuses those, so the workspace check leaves them to it.
bool accepted_span(const TensorArg& t, int64_t batch, int64_t head_dim, ByteSpan* span) {
  const Strides& st = t.tensor.strides;
  if (t.tensor.data == nullptr || st.dim != 1) return false;
  for (int64_t stride : {st.batch, st.seq, st.head}) {
    if (stride < 0 || stride >= kTmaStrideLimitBytes / t.element_bytes) return false;
  }
  // The static_asserts above keep this within int64 for strides and extents within the limits.
  const int64_t last_element =
      (batch - 1) * st.batch + (t.seqlen - 1) * st.seq + (t.heads - 1) * st.head + head_dim - 1;
  return make_span(t.name, t.output, t.tensor.data, last_element * t.element_bytes + t.element_bytes - 1, span).ok();
}

// The workspace is written by the call, so it must share no byte with any tensor of the call, its LSE or the offset
// arrays. Only the workspace is checked here, against each of them: arguments that validate() refuses (a bad shape,
// a null pointer, a stride out of range) pass, for validate() to refuse by name; a null or empty workspace too, for
// the workspace size check. No allocation: a call runs it after validate().
Status check_workspace_apart(const AttentionShape& shape, const VarlenBatch& varlen, std::span<const TensorArg> tensors,
                             const float* lse, const void* workspace, size_t workspace_bytes) {
  if (workspace == nullptr || workspace_bytes == 0) return Status::success();
  // Sizes past the limits would overflow the spans below.
  if (!validate(shape).ok()) return Status::success();
  if (varlen.packed() && !check_varlen_batch(shape, varlen).ok()) return Status::success();
  if (workspace_bytes - 1 > static_cast<size_t>(INT64_MAX)) {
    return invalid(cat("workspace_bytes must be < 2^63, got ", workspace_bytes));
  }
  ByteSpan written{};
  const auto last_byte = static_cast<int64_t>(workspace_bytes - 1);
  if (Status s = make_span(kWorkspaceName, true, workspace, last_byte, &written); !s.ok()) return s;
  const CallRows rows = call_rows(shape, varlen);
  for (const TensorArg& t : tensors) {
    ByteSpan span{};
    if (accepted_span(t, rows.batch, shape.head_dim, &span) && overlap(written, span)) {
      return overlap_error(written, span);
    }
  }
  ByteSpan lse_span{};
  const int64_t lse_bytes = rows.lse_floats * static_cast<int64_t>(sizeof(float));
  if (lse != nullptr && make_span("lse", false, lse, lse_bytes - 1, &lse_span).ok() && overlap(written, lse_span)) {
    return overlap_error(written, lse_span);
  }
  for (const ByteSpan& offsets : cu_seqlens_spans(shape, varlen)) {
    if (overlap(written, offsets)) return overlap_error(written, offsets);
  }
  return Status::success();
}

}  // namespace

Status check_schedule(Schedule schedule) {
  if (std::ranges::find(kAllSchedules, schedule) != std::end(kAllSchedules)) return Status::success();
  return invalid(cat("schedule must be a valid Schedule value, got Schedule(", static_cast<int>(schedule), ")"));
}

Status check_sm_margin(int sm_margin) {
  if (sm_margin >= 0) return Status::success();
  return invalid(cat("sm_margin must satisfy 0 <= sm_margin < the device's SM count (at least one SM must run the ",
                     "kernel), got ", sm_margin));
}

Status check_sm_margin(int sm_margin, const DeviceInfo& device) {
  if (sm_margin >= 0 && sm_margin < device.multiprocessor_count) return Status::success();
  return invalid(cat("sm_margin must satisfy 0 <= sm_margin < the device's SM count (", device.multiprocessor_count,
                     " on device ", device.index, "; at least one SM must run the kernel), got ", sm_margin));
}

Status check_backward_head_dim(const AttentionShape& shape) {
  if (std::ranges::find(kBackwardHeadDims, shape.head_dim) != kBackwardHeadDims.end()) return Status::success();
  std::string supported;
  for (int head_dim : kBackwardHeadDims) supported += cat(supported.empty() ? "" : ", ", head_dim);
  return not_supported(cat("shape.head_dim must be one of {", supported, "} for the backward, got ", shape.head_dim));
}

Status validate(const AttentionShape& shape) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"batch", shape.batch},     {"seqlen_q", shape.seqlen_q}, {"seqlen_k", shape.seqlen_k},
      {"heads_q", shape.heads_q}, {"heads_kv", shape.heads_kv}, {"head_dim", shape.head_dim},
  };
  for (const auto& [name, value] : sizes) {
    if (value <= 0) return invalid(cat("shape.", name, " must be > 0, got ", value));
  }
  const std::pair<const char*, int64_t> seqlens[] = {{"seqlen_q", shape.seqlen_q}, {"seqlen_k", shape.seqlen_k}};
  for (const auto& [name, value] : seqlens) {
    if (value > kMaxSeqlen) {
      return not_supported(
          cat("shape.", name, " must be <= ", kMaxSeqlen, " (the longest sequence the kernels support), got ", value));
    }
  }
  // heads_kv needs no bound of its own: it divides heads_q (checked below).
  const std::pair<const char*, int64_t> grid_sizes[] = {{"batch", shape.batch}, {"heads_q", shape.heads_q}};
  for (const auto& [name, value] : grid_sizes) {
    if (value > kMaxGridDimYZ) {
      return not_supported(cat("shape.", name, " must be <= ", kMaxGridDimYZ,
                               " (the backward's preprocess, postprocess and split-sum kernels launch it as a grid "
                               "dimension, which CUDA caps at ",
                               kMaxGridDimYZ, "), got ", value));
    }
  }
  if (std::ranges::find(kSupportedHeadDims, shape.head_dim) == kSupportedHeadDims.end()) {
    std::string supported;
    for (int head_dim : kSupportedHeadDims) supported += cat(supported.empty() ? "" : ", ", head_dim);
    return not_supported(cat("shape.head_dim must be one of {", supported, "}, got ", shape.head_dim));
  }
  // A DType cast from an out-of-range int must not reach the kernel dispatch.
  if (std::ranges::find(kSupportedDTypes, shape.dtype) == kSupportedDTypes.end()) {
    std::string supported;
    for (DType dtype : kSupportedDTypes) supported += cat(supported.empty() ? "" : " or ", dtype_name(dtype));
    return not_supported(cat("shape.dtype must be ", supported, ", got DType(", static_cast<int>(shape.dtype), ")"));
  }
  if (shape.heads_q % shape.heads_kv != 0) {
    return invalid(cat("shape.heads_q must be a multiple of shape.heads_kv (each key/value head serves a whole group ",
                       "of query heads), got heads_q = ", shape.heads_q, ", heads_kv = ", shape.heads_kv));
  }
  if (!std::isfinite(shape.softmax_scale) || !(shape.softmax_scale > 0.0f)) {
    return invalid(cat("shape.softmax_scale must be finite and > 0, got ", shape.softmax_scale));
  }
  // The kernels flush subnormal floats to 0: such a scale or cap would silently be none.
  if (!std::isnormal(shape.softmax_scale)) {
    return invalid(cat("shape.softmax_scale must be a normal float (at least ", std::numeric_limits<float>::min(),
                       "; the kernels flush subnormals to 0), got ", shape.softmax_scale));
  }
  // FlashAttention's window_size: -1 leaves a side open; causal makes the right bound 0 whatever it is.
  const std::pair<const char*, int64_t> window[] = {{"window_left", shape.window_left},
                                                    {"window_right", shape.window_right}};
  for (const auto& [name, value] : window) {
    if (value < -1) {
      return invalid(
          cat("shape.", name, " must be >= -1 (-1 leaves that side of the sliding window open), got ", value));
    }
  }
  if (!std::isfinite(shape.softcap) || !(shape.softcap >= 0.0f)) {
    return invalid(cat("shape.softcap must be finite and >= 0 (0: no capping), got ", shape.softcap));
  }
  // The kernels multiply the scores by softmax_scale / softcap before the tanh.
  if (shape.softcap > 0.0f && !std::isfinite(shape.softmax_scale / shape.softcap)) {
    return invalid(cat("shape.softcap must be 0 or large enough that softmax_scale / softcap is finite, got softcap ",
                       shape.softcap, " with softmax_scale ", shape.softmax_scale));
  }
  // Past that rule only with a tiny scale; a subnormal cap is still none to the kernels.
  if (shape.softcap > 0.0f && !std::isnormal(shape.softcap)) {
    return invalid(cat("shape.softcap must be 0 or a normal float (at least ", std::numeric_limits<float>::min(),
                       "; the kernels flush subnormals to 0), got ", shape.softcap));
  }
  const int64_t query_tiles_per_head = (shape.seqlen_q + kMinBlockQ - 1) / kMinBlockQ;
  if (Status s = check_index_product({shape.batch, shape.heads_q, query_tiles_per_head},
                                     cat("the query tile count batch * heads_q * ceil(seqlen_q / ", kMinBlockQ, ")"));
      !s.ok()) {
    return s;
  }
  return check_index_product({shape.batch, shape.heads_q, shape.seqlen_q, shape.head_dim},
                             "the query element count batch * heads_q * seqlen_q * head_dim");
}

Status validate(const ForwardArgs& args) {
  const AttentionShape& shape = args.shape;
  if (Status s = validate(shape); !s.ok()) return s;
  if (args.varlen.packed()) {
    if (Status s = check_varlen_batch(shape, args.varlen); !s.ok()) return s;
  }
  const CallRows rows = call_rows(shape, args.varlen);
  const std::array<TensorArg, 4> tensors = forward_tensors(args, rows);
  if (args.varlen.packed()) {
    if (Status s = check_packed_strides(tensors); !s.ok()) return s;
  }
  if (Status s = check_tensors(shape, args.varlen, rows, tensors, args.lse, true); !s.ok()) return s;
  return check_sm_margin(args.sm_margin);
}

Status validate(const BackwardArgs& args) {
  const AttentionShape& shape = args.shape;
  if (Status s = validate(shape); !s.ok()) return s;
  if (Status s = check_backward_head_dim(shape); !s.ok()) return s;
  if (Status s = check_schedule(args.schedule); !s.ok()) return s;
  if (args.varlen.packed()) {
    if (Status s = check_varlen_batch(shape, args.varlen); !s.ok()) return s;
  }
  const CallRows rows = call_rows(shape, args.varlen);
  const std::array<TensorArg, 8> tensors = backward_tensors(args, rows);
  if (args.varlen.packed()) {
    if (Status s = check_packed_strides(tensors); !s.ok()) return s;
  }
  if (Status s = check_tensors(shape, args.varlen, rows, tensors, args.lse, false); !s.ok()) return s;
  return check_sm_margin(args.sm_margin);
}

namespace {

// One strided float32 array of a merge: `dims` (the contiguous dimension, if any, last) of the array `name` at `data`,
// whose strides are the fields `strides` ("acc_out.strides", "acc_lse_strides"), written by the call when `output`.
// Checks the pointer, the strides (>= 0, below the tensors' limit so that every
// offset fits int64) and, for an output, that no two indices share an element (threads would race on it); appends the
// bytes it spans to *spans.
Status merge_array_span(const char* name, const char* strides, const void* data, bool output,
                        std::span<const Dimension> dims, std::vector<ByteSpan>* spans) {
  if (Status s = check_pointer(name, data, kFloatBytes, "it holds floats"); !s.ok()) return s;
  int64_t last_element = 0;
  for (const Dimension& d : dims) {
    if (d.stride < 0) return invalid(cat(strides, ".", d.name, " must be >= 0, got ", d.stride));
    if (d.stride >= kTmaStrideLimitBytes / kFloatBytes) {
      return invalid(cat(strides, ".", d.name, " must be < ", kTmaStrideLimitBytes / kFloatBytes,
                         " elements (2^40 bytes, the tensors' stride limit), got ", d.stride));
    }
    last_element += (d.extent - 1) * d.stride;
  }
  if (output) {
    const char* layout = dims.size() == 4 ? "(B, S, H, D)" : "(B, H, S)";
    if (Status s = check_one_to_one(name, strides, layout, dims); !s.ok()) return s;
  }
  ByteSpan span{};
  if (Status s = make_span(name, output, data, last_element * kFloatBytes + kFloatBytes - 1, &span); !s.ok()) return s;
  spans->push_back(span);
  return Status::success();
}

Status check_merge_sizes(const MergeArgs& a) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"batch", a.batch}, {"rows", a.rows}, {"seqlen", a.seqlen}, {"heads", a.heads}, {"head_dim", a.head_dim}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) return invalid(cat(name, " must be > 0, got ", value));
  }
  // The attention calls' limits: they keep every offset within int64 (the static_assert above).
  const std::tuple<const char*, int64_t, int64_t> limits[] = {{"batch", a.batch, kMaxGridDimYZ},
                                                              {"heads", a.heads, kMaxGridDimYZ},
                                                              {"rows", a.rows, kMaxSeqlen},
                                                              {"seqlen", a.seqlen, kMaxSeqlen},
                                                              {"head_dim", a.head_dim, kMaxHeadDim}};
  for (const auto& [name, value, limit] : limits) {
    if (value > limit) {
      return not_supported(cat(name, " must be <= ", limit, " (the limit of the attention calls), got ", value));
    }
  }
  if (a.rows > a.seqlen) {
    return invalid(cat("rows must be <= seqlen (each block row goes to an accumulator row of its own), got rows = ",
                       a.rows, ", seqlen = ", a.seqlen));
  }
  // One warp per (batch, row, head) of the block, 8 to a CTA: the grid's x dimension holds it.
  return check_index_product({a.batch, a.rows, a.heads}, "the block's rows batch * rows * heads");
}

}  // namespace

Status validate(const MergeArgs& a) {
  if (Status s = check_merge_sizes(a); !s.ok()) return s;
  std::vector<ByteSpan> spans;
  if (a.row_index == nullptr) {
    if (a.row_offset < 0 || a.row_offset > a.seqlen - a.rows) {
      return invalid(cat("row_offset must satisfy 0 <= row_offset <= seqlen - rows (block rows row_offset .. ",
                         "row_offset + rows - 1 of the accumulators), got ", a.row_offset, " with rows = ", a.rows,
                         ", seqlen = ", a.seqlen));
    }
  } else {
    if (a.row_offset != 0) {
      return invalid(
          cat("row_offset must be 0 when row_index is given (row_index names every row), got ", a.row_offset));
    }
    if (Status s = check_pointer("row_index", a.row_index, alignof(int32_t), "it holds int32 rows"); !s.ok()) return s;
    ByteSpan span{};
    const int64_t last_byte = a.rows * static_cast<int64_t>(sizeof(int32_t)) - 1;
    if (Status s = make_span("row_index", false, a.row_index, last_byte, &span); !s.ok()) return s;
    spans.push_back(span);
  }
  const TensorRef acc_out = a.acc_out;
  const std::pair<const char*, const TensorRef*> outs[] = {{"part_out", &a.part_out}, {"acc_out", &acc_out}};
  for (const auto& [name, tensor] : outs) {
    if (tensor->strides.dim != 1) {
      return invalid(
          cat(name, ".strides.dim must be 1 (the last dimension must be contiguous), got ", tensor->strides.dim));
    }
  }
  const std::array<Dimension, 4> part_out_dims = {{{"batch", a.part_out.strides.batch, a.batch},
                                                   {"seq", a.part_out.strides.seq, a.rows},
                                                   {"head", a.part_out.strides.head, a.heads},
                                                   {"dim", 1, a.head_dim}}};
  const std::array<Dimension, 4> acc_out_dims = {{{"batch", acc_out.strides.batch, a.batch},
                                                  {"seq", acc_out.strides.seq, a.seqlen},
                                                  {"head", acc_out.strides.head, a.heads},
                                                  {"dim", 1, a.head_dim}}};
  const std::array<Dimension, 3> part_lse_dims = {{{"batch", a.part_lse_strides.batch, a.batch},
                                                   {"head", a.part_lse_strides.head, a.heads},
                                                   {"seq", a.part_lse_strides.seq, a.rows}}};
  const std::array<Dimension, 3> acc_lse_dims = {{{"batch", a.acc_lse_strides.batch, a.batch},
                                                  {"head", a.acc_lse_strides.head, a.heads},
                                                  {"seq", a.acc_lse_strides.seq, a.seqlen}}};
  const std::tuple<const char*, const char*, const void*, bool, std::span<const Dimension>> arrays[] = {
      {"part_out", "part_out.strides", a.part_out.data, false, part_out_dims},
      {"part_lse", "part_lse_strides", a.part_lse, false, part_lse_dims},
      {"acc_out", "acc_out.strides", acc_out.data, true, acc_out_dims},
      {"acc_lse", "acc_lse_strides", a.acc_lse, true, acc_lse_dims}};
  for (const auto& [name, strides, data, output, dims] : arrays) {
    if (Status s = merge_array_span(name, strides, data, output, dims, &spans); !s.ok()) return s;
  }
  return check_disjoint(spans);
}

Status check_workspace_overlap(const ForwardArgs& args, const void* workspace, size_t workspace_bytes) {
  const CallRows rows = call_rows(args.shape, args.varlen);
  return check_workspace_apart(args.shape, args.varlen, forward_tensors(args, rows), args.lse, workspace,
                               workspace_bytes);
}

Status check_workspace_overlap(const BackwardArgs& args, const void* workspace, size_t workspace_bytes) {
  const CallRows rows = call_rows(args.shape, args.varlen);
  return check_workspace_apart(args.shape, args.varlen, backward_tensors(args, rows), args.lse, workspace,
                               workspace_bytes);
}

}  // namespace dash
