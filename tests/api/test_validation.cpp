// Tests of the public API's host-side checks: validate() for forward and backward arguments (one test per
// rule, each starting from valid arguments and breaking that rule alone; a float32 out in its own element size) and
// for merge_partial()'s, the workspace-size queries (which must refuse a bad shape before any device query or plan),
// the device checks of api/device.hpp, schedule names and Status formatting. Tensor pointers are fake (validate()
// never dereferences them) but aligned, and lie in disjoint regions unless a test makes them overlap.
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "api/device.hpp"
#include "api/limits.hpp"
#include "api/validate.hpp"
#include "dash/attention.hpp"
#include "rejected_shapes.hpp"
#include "status_assertions.hpp"

namespace dash {
namespace {

// Each fake tensor gets its own 64 GiB region, larger than any tensor a test builds.
constexpr uintptr_t kFakeBase = uintptr_t{1} << 44;
constexpr uintptr_t kFakeRegionBytes = uintptr_t{1} << 36;

// An address that converts to any pointer type, so a test can aim any argument at any byte.
struct FakeAddress {
  uintptr_t value;
  template <typename T>
  operator T*() const {
    return reinterpret_cast<T*>(value);
  }
};

FakeAddress fake_pointer(int region) { return {kFakeBase + static_cast<uintptr_t>(region) * kFakeRegionBytes}; }

FakeAddress shifted(const void* p, int64_t bytes) {
  return {reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)};
}

AttentionShape test_shape() { return testing::valid_workspace_shape(); }

// Bytes of a packed (B, S, H, D) tensor.
int64_t packed_bytes(const AttentionShape& shape, int64_t seqlen, int64_t heads) {
  return shape.batch * seqlen * heads * shape.head_dim * kElementBytes;
}

template <typename Args>
Args valid_args(const AttentionShape& shape = test_shape());

template <>
ForwardArgs valid_args<ForwardArgs>(const AttentionShape& shape) {
  const Strides query = packed_strides(shape.seqlen_q, shape.heads_q, shape.head_dim);
  const Strides key = packed_strides(shape.seqlen_k, shape.heads_kv, shape.head_dim);
  ForwardArgs a;
  a.shape = shape;
  a.q = {fake_pointer(0), query};
  a.k = {fake_pointer(1), key};
  a.v = {fake_pointer(2), key};
  a.out = {fake_pointer(3), query};
  a.lse = fake_pointer(4);
  return a;
}

template <>
BackwardArgs valid_args<BackwardArgs>(const AttentionShape& shape) {
  const Strides query = packed_strides(shape.seqlen_q, shape.heads_q, shape.head_dim);
  const Strides key = packed_strides(shape.seqlen_k, shape.heads_kv, shape.head_dim);
  BackwardArgs a;
  a.shape = shape;
  a.q = {fake_pointer(0), query};
  a.k = {fake_pointer(1), key};
  a.v = {fake_pointer(2), key};
  a.out = {fake_pointer(3), query};
  a.dout = {fake_pointer(4), query};
  a.lse = fake_pointer(5);
  a.dq = {fake_pointer(6), query};
  a.dk = {fake_pointer(7), key};
  a.dv = {fake_pointer(8), key};
  a.schedule = Schedule::kShift;
  return a;
}

// A (B, S, H, D) tensor argument of a call, with what the tests need to break it.
struct TensorField {
  std::string name;
  Strides* strides;
  std::function<void(int64_t)> shift_data;  // moves the data pointer by a number of bytes
  std::function<void()> clear_data;
};

// The field of tensor argument `name`, a TensorRef or a MutableTensorRef of `a`.
template <typename Ref>
TensorField field(std::string name, Ref& tensor) {
  return {std::move(name), &tensor.strides, [&tensor](int64_t b) { tensor.data = shifted(tensor.data, b); },
          [&tensor] { tensor.data = nullptr; }};
}

std::vector<TensorField> tensor_fields(ForwardArgs& a) {
  return {field("q", a.q), field("k", a.k), field("v", a.v), field("out", a.out)};
}

std::vector<TensorField> tensor_fields(BackwardArgs& a) {
  return {field("q", a.q),       field("k", a.k),   field("v", a.v),   field("out", a.out),
          field("dout", a.dout), field("dq", a.dq), field("dk", a.dk), field("dv", a.dv)};
}

// Calls `check(args, field)` once per tensor argument, each time on fresh valid arguments.
template <typename Args>
void for_each_tensor(const std::function<void(Args&, const TensorField&)>& check) {
  Args probe = valid_args<Args>();
  const size_t count = tensor_fields(probe).size();
  for (size_t i = 0; i < count; ++i) {
    Args a = valid_args<Args>();
    const TensorField field = tensor_fields(a)[i];
    SCOPED_TRACE(field.name);
    check(a, field);
  }
}

using testing::fails_with;
using testing::is_ok;

// --- Rules shared by forward and backward: run for both. ----------------------------------------------

template <typename Args>
class ValidateBoth : public ::testing::Test {};
using ArgTypes = ::testing::Types<ForwardArgs, BackwardArgs>;
TYPED_TEST_SUITE(ValidateBoth, ArgTypes);

TYPED_TEST(ValidateBoth, AcceptsValidArguments) { EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>()))); }

TYPED_TEST(ValidateBoth, AcceptsFp16) {
  AttentionShape shape = test_shape();
  shape.dtype = DType::kFP16;
  EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape))));
}

// The backward's head dims (kBackwardHeadDims) are every supported one since the backward kernels at 192 and 256;
// ValidateBackward refuses the others (RefusesHeadDimsWithoutABackwardKernel).
TYPED_TEST(ValidateBoth, AcceptsEverySupportedHeadDim) {
  const std::span<const int> head_dims =
      std::is_same_v<TypeParam, BackwardArgs> ? std::span<const int>(kBackwardHeadDims) : kSupportedHeadDims;
  for (int head_dim : head_dims) {
    AttentionShape shape = test_shape();
    shape.head_dim = head_dim;
    EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape)))) << "head_dim " << head_dim;
  }
}

TYPED_TEST(ValidateBoth, AcceptsMhaGqaAndMqa) {
  for (int64_t heads_kv : {8, 4, 2, 1}) {
    AttentionShape shape = test_shape();
    shape.heads_kv = heads_kv;
    EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape)))) << "heads_kv " << heads_kv;
  }
}

TYPED_TEST(ValidateBoth, AcceptsPaddedStrides) {
  const AttentionShape shape = test_shape();
  TypeParam a = valid_args<TypeParam>(shape);
  constexpr int64_t kPad = 64;
  a.q.strides.seq = shape.heads_q * shape.head_dim + kPad;      // padded rows
  a.q.strides.batch = shape.seqlen_q * a.q.strides.seq + kPad;  // padded batches
  a.k.strides.head = shape.head_dim + kPad;                     // padded heads
  a.k.strides.seq = shape.heads_kv * a.k.strides.head;
  a.k.strides.batch = shape.seqlen_k * a.k.strides.seq;
  // v stored in (H, S, B, D) order.
  a.v.strides = {shape.head_dim, shape.batch * shape.head_dim, shape.seqlen_k * shape.batch * shape.head_dim, 1};
  EXPECT_TRUE(is_ok(validate(a)));
}

TYPED_TEST(ValidateBoth, AcceptsAnyStrideOfSingleIndexDimensions) {
  AttentionShape shape = test_shape();
  shape.batch = 1;
  shape.heads_kv = 1;
  TypeParam a = valid_args<TypeParam>(shape);
  a.q.strides.batch = 0;  // one batch: the stride is never applied
  a.k.strides.head = 0;   // one key head (MQA)
  EXPECT_TRUE(is_ok(validate(a)));
}

// q, k and v interleaved in one (B, S, 3, H, D) buffer.
TYPED_TEST(ValidateBoth, AcceptsPackedQkvInputs) {
  AttentionShape shape = test_shape();
  shape.seqlen_k = shape.seqlen_q;
  shape.heads_kv = shape.heads_q;
  TypeParam a = valid_args<TypeParam>(shape);
  const int64_t row = 3 * shape.heads_q * shape.head_dim;
  const Strides qkv_strides{shape.seqlen_q * row, row, shape.head_dim, 1};
  const int64_t part_bytes = shape.heads_q * shape.head_dim * kElementBytes;
  a.q.data = fake_pointer(0);
  a.k.data = shifted(a.q.data, part_bytes);
  a.v.data = shifted(a.q.data, 2 * part_bytes);
  a.q.strides = a.k.strides = a.v.strides = qkv_strides;
  EXPECT_TRUE(is_ok(validate(a)));
}

TYPED_TEST(ValidateBoth, AcceptsLongestSequence) {
  AttentionShape shape = test_shape();
  shape.batch = 1;
  shape.heads_kv = 1;
  shape.seqlen_k = kMaxSeqlen;
  EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape))));
}

TYPED_TEST(ValidateBoth, AcceptsQueryElementCountJustBelowLimit) {
  AttentionShape shape = test_shape();
  shape.batch = 1;
  shape.heads_q = 127;
  shape.heads_kv = 1;
  shape.seqlen_q = int64_t{1} << 17;  // 127 * 2^17 * 128 = 2^31 - 2^24 elements
  EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape))));
}

TYPED_TEST(ValidateBoth, RejectsNonPositiveSizes) {
  const std::pair<const char*, int64_t AttentionShape::*> sizes[] = {
      {"shape.batch", &AttentionShape::batch},       {"shape.seqlen_q", &AttentionShape::seqlen_q},
      {"shape.seqlen_k", &AttentionShape::seqlen_k}, {"shape.heads_q", &AttentionShape::heads_q},
      {"shape.heads_kv", &AttentionShape::heads_kv}, {"shape.head_dim", &AttentionShape::head_dim},
  };
  for (const auto& [name, member] : sizes) {
    for (int64_t value : {int64_t{0}, int64_t{-1}}) {
      AttentionShape shape = test_shape();
      shape.*member = value;
      EXPECT_TRUE(
          fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kInvalidArgument, {name, "must be > 0"}))
          << name << " = " << value;
    }
  }
}

TYPED_TEST(ValidateBoth, RejectsTooLongSequences) {
  for (auto [name, member] : {std::pair{"shape.seqlen_q", &AttentionShape::seqlen_q},
                              std::pair{"shape.seqlen_k", &AttentionShape::seqlen_k}}) {
    AttentionShape shape = test_shape();
    shape.*member = kMaxSeqlen + 1;
    EXPECT_TRUE(
        fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kNotSupported, {name, "must be <= 1048576"}));
  }
}

TYPED_TEST(ValidateBoth, AcceptsTheGridLimitOfBatchAndHeads) {
  AttentionShape shape = test_shape();
  shape.seqlen_q = 64;  // keeps the query element count below 2^31
  shape.heads_q = shape.heads_kv = 1;
  shape.batch = kMaxGridDimYZ;
  EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape))));
  shape.batch = 1;
  shape.heads_q = kMaxGridDimYZ;
  EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape))));
}

TYPED_TEST(ValidateBoth, RejectsBatchAboveTheGridLimit) {
  for (int64_t batch : {kMaxGridDimYZ + 1, std::numeric_limits<int64_t>::max() / 2}) {
    AttentionShape shape = test_shape();
    shape.batch = batch;
    EXPECT_TRUE(fails_with(
        validate(valid_args<TypeParam>(shape)), StatusCode::kNotSupported,
        {"shape.batch must be <= 65535", "grid dimension, which CUDA caps at 65535", "got " + std::to_string(batch)}));
  }
}

TYPED_TEST(ValidateBoth, RejectsHeadsQAboveTheGridLimit) {
  AttentionShape shape = test_shape();
  shape.heads_q = kMaxGridDimYZ + 1;
  shape.heads_kv = 1;
  EXPECT_TRUE(fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kNotSupported,
                         {"shape.heads_q must be <= 65535", "grid dimension, which CUDA caps at 65535", "got 65536"}));
}

TYPED_TEST(ValidateBoth, RejectsTooManyQueryTiles) {
  AttentionShape shape = test_shape();
  shape.batch = shape.heads_q = int64_t{1} << 15;  // 2^15 * 2^15 heads * 4 tiles
  EXPECT_TRUE(
      fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kNotSupported,
                 {"query tile count batch * heads_q * ceil(seqlen_q / 64)", "must be < 2147483648", "got 4294967296"}));
}

TYPED_TEST(ValidateBoth, RejectsTooManyQueryElements) {
  AttentionShape shape = test_shape();
  shape.batch = 1;
  shape.heads_q = 128;
  shape.heads_kv = 1;
  shape.seqlen_q = int64_t{1} << 17;  // 128 * 2^17 * 128 = 2^31 elements
  EXPECT_TRUE(fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kNotSupported,
                         {"query element count batch * heads_q * seqlen_q * head_dim", "got 2147483648"}));
}

TYPED_TEST(ValidateBoth, RejectsUnsupportedHeadDims) {
  for (int64_t head_dim : {32, 80, 160, 512}) {
    AttentionShape shape = test_shape();
    shape.head_dim = head_dim;
    EXPECT_TRUE(
        fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kNotSupported,
                   {"shape.head_dim must be one of {64, 96, 128, 192, 256}", "got " + std::to_string(head_dim)}));
  }
}

TYPED_TEST(ValidateBoth, RejectsOutOfRangeDType) {
  for (int raw : {-1, 2, 7}) {
    AttentionShape shape = test_shape();
    shape.dtype = static_cast<DType>(raw);
    EXPECT_TRUE(fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kNotSupported,
                           {"shape.dtype must be bf16 or fp16", "DType(" + std::to_string(raw) + ")"}));
  }
}

TYPED_TEST(ValidateBoth, RejectsHeadsQNotMultipleOfHeadsKv) {
  AttentionShape shape = test_shape();
  shape.heads_kv = 3;
  EXPECT_TRUE(fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kInvalidArgument,
                         {"shape.heads_q must be a multiple of shape.heads_kv", "heads_q = 8, heads_kv = 3"}));
}

TYPED_TEST(ValidateBoth, RejectsBadSoftmaxScale) {
  for (float scale : {0.0f, -0.125f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
    AttentionShape shape = test_shape();
    shape.softmax_scale = scale;
    EXPECT_TRUE(fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kInvalidArgument,
                           {"shape.softmax_scale must be finite and > 0"}))
        << scale;
  }
}

// A subnormal float is finite and > 0, but the kernels flush it to 0: the scale or the cap would silently vanish.
TYPED_TEST(ValidateBoth, RejectsSubnormalSoftmaxScaleAndSoftcap) {
  const float subnormal = std::numeric_limits<float>::denorm_min() * 1024;
  AttentionShape shape = test_shape();
  shape.softmax_scale = subnormal;
  EXPECT_TRUE(fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kInvalidArgument,
                         {"shape.softmax_scale must be a normal float", "flush subnormals to 0"}));
  // With a scale small enough that softmax_scale / softcap stays finite (a larger one meets that rule first).
  shape = test_shape();
  shape.softmax_scale = 1e-30f;
  shape.softcap = subnormal;
  EXPECT_TRUE(fails_with(validate(valid_args<TypeParam>(shape)), StatusCode::kInvalidArgument,
                         {"shape.softcap must be 0 or a normal float", "flush subnormals to 0"}));
  // Negative controls: the smallest normal scale, and no cap.
  shape = test_shape();
  shape.softmax_scale = std::numeric_limits<float>::min();
  EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape))));
  shape = test_shape();
  shape.softcap = 0.0f;
  EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>(shape))));
}

TYPED_TEST(ValidateBoth, RejectsNullTensors) {
  for_each_tensor<TypeParam>([](TypeParam& a, const TensorField& field) {
    field.clear_data();
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {field.name + " must not be null"}));
  });
}

TYPED_TEST(ValidateBoth, RejectsNullLse) {
  TypeParam a = valid_args<TypeParam>();
  a.lse = nullptr;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"lse must not be null"}));
}

TYPED_TEST(ValidateBoth, RejectsTensorsNotAlignedTo16Bytes) {
  for_each_tensor<TypeParam>([](TypeParam& a, const TensorField& field) {
    field.shift_data(8);
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                           {field.name + " must be 16-byte aligned (TMA needs it)"}));
  });
}

TYPED_TEST(ValidateBoth, LseNeedsOnly4ByteAlignment) {
  TypeParam a = valid_args<TypeParam>();
  a.lse = shifted(a.lse, 4);
  EXPECT_TRUE(is_ok(validate(a)));
  a.lse = shifted(a.lse, 2);
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"lse must be 4-byte aligned"}));
}

TYPED_TEST(ValidateBoth, RejectsNonUnitDimStride) {
  for_each_tensor<TypeParam>([](TypeParam& a, const TensorField& field) {
    field.strides->dim = 2;
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                           {field.name + ".strides.dim must be 1 (the last dimension must be contiguous), got 2"}));
  });
}

// Pointers to the batch, seq and head strides with their names.
std::vector<std::pair<std::string, int64_t*>> outer_strides(const std::string& tensor, Strides* s) {
  return {
      {tensor + ".strides.batch", &s->batch}, {tensor + ".strides.seq", &s->seq}, {tensor + ".strides.head", &s->head}};
}

TYPED_TEST(ValidateBoth, RejectsNegativeStrides) {
  for_each_tensor<TypeParam>([](TypeParam& a, const TensorField& field) {
    for (const auto& [name, stride] : outer_strides(field.name, field.strides)) {
      const int64_t saved = *stride;
      *stride = -saved;
      EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {name + " must be >= 0"}));
      *stride = saved;
    }
  });
}

TYPED_TEST(ValidateBoth, RejectsStridesNotMultipleOf8Elements) {
  for_each_tensor<TypeParam>([](TypeParam& a, const TensorField& field) {
    for (const auto& [name, stride] : outer_strides(field.name, field.strides)) {
      const int64_t saved = *stride;
      *stride += 4;
      EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                             {name + " must be a multiple of 8 elements (16 bytes, a TMA requirement)"}));
      *stride = saved;
    }
  });
}

TYPED_TEST(ValidateBoth, RejectsHeadStrideSmallerThanHeadDim) {
  for_each_tensor<TypeParam>([](TypeParam& a, const TensorField& field) {
    field.strides->head = a.shape.head_dim / 2;
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                           {field.name + ".strides: the (B, S, H, D) layout of " + field.name + " overlaps itself",
                            "the head stride 64 is less than the dim stride 1 times its extent 128"}));
  });
}

TYPED_TEST(ValidateBoth, RejectsSeqStrideEqualToHeadStride) {
  TypeParam a = valid_args<TypeParam>();
  a.q.strides.seq = a.q.strides.head;  // rows of one head would alias the heads of one row
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                         {"q.strides: the (B, S, H, D) layout of q overlaps itself",
                          "the head stride 128 is less than the seq stride 128 times its extent 256"}));
}

TYPED_TEST(ValidateBoth, RejectsBatchStrideOverlappingNextBatch) {
  TypeParam a = valid_args<TypeParam>();
  a.k.strides.batch -= a.k.strides.seq;  // the last row of batch 0 is the first row of batch 1
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                         {"k.strides: the (B, S, H, D) layout of k overlaps itself", "the batch stride"}));
}

TYPED_TEST(ValidateBoth, RejectsZeroStrideOfMultiIndexDimension) {
  TypeParam a = valid_args<TypeParam>();
  a.v.strides.seq = 0;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                         {"v.strides: the (B, S, H, D) layout of v overlaps itself: the seq stride is 0 but that "
                          "dimension has 384 indices"}));
}

TYPED_TEST(ValidateBoth, RejectsStridesAtTheTmaLimit) {
  for_each_tensor<TypeParam>([](TypeParam& a, const TensorField& field) {
    for (const auto& [name, stride] : outer_strides(field.name, field.strides)) {
      for (int64_t too_large : {kStrideLimitElements, int64_t{1} << 62}) {
        const int64_t saved = *stride;
        *stride = too_large;
        EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                               {name +
                                " must be < 549755813888 elements (2^40 bytes, the largest stride a TMA "
                                "descriptor can encode), got " +
                                std::to_string(too_large)}));
        *stride = saved;
      }
    }
  });
}

// The limit holds for a dimension of one index too, whose stride is never applied: TMA still encodes it.
TYPED_TEST(ValidateBoth, AcceptsStrideJustBelowTheTmaLimit) {
  AttentionShape shape = test_shape();
  shape.batch = 1;
  TypeParam a = valid_args<TypeParam>(shape);
  a.q.strides.batch = kStrideLimitElements - kStrideMultipleElements;
  EXPECT_TRUE(is_ok(validate(a)));
  a.q.strides.batch = kStrideLimitElements;
  EXPECT_FALSE(validate(a).ok());
}

TYPED_TEST(ValidateBoth, RejectsTensorRunningPastTheAddressSpace) {
  TypeParam a = valid_args<TypeParam>();
  a.q.data = FakeAddress{UINTPTR_MAX - uintptr_t{15} - uintptr_t{4096}};  // aligned, 4 KiB below the top
  EXPECT_TRUE(
      fails_with(validate(a), StatusCode::kInvalidArgument, {"q: the tensor at", "past the end of the address space"}));
  a = valid_args<TypeParam>();
  a.lse = FakeAddress{UINTPTR_MAX - uintptr_t{3}};
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                         {"lse: the tensor at", "past the end of the address space"}));
}

TYPED_TEST(ValidateBoth, RejectsOutputOverlappingAnInput) {
  TypeParam a = valid_args<TypeParam>();
  const int64_t q_bytes = packed_bytes(a.shape, a.shape.seqlen_q, a.shape.heads_q);
  a.out.data = shifted(a.q.data, q_bytes - 16);  // shares q's last 16 bytes
  if constexpr (std::is_same_v<TypeParam, ForwardArgs>) {
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                           {"out overlaps q", "an output must not share memory with any other tensor"}));
  } else {
    EXPECT_TRUE(is_ok(validate(a)));  // out is an input of backward: inputs may share memory
    a.dq.data = shifted(a.q.data, q_bytes - 16);
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"dq overlaps q"}));
  }
}

TYPED_TEST(ValidateBoth, AcceptsOutputAdjacentToAnInput) {
  TypeParam a = valid_args<TypeParam>();
  const int64_t q_bytes = packed_bytes(a.shape, a.shape.seqlen_q, a.shape.heads_q);
  if constexpr (std::is_same_v<TypeParam, ForwardArgs>) {
    a.out.data = shifted(a.q.data, q_bytes);
  } else {
    a.dq.data = shifted(a.q.data, q_bytes);
  }
  EXPECT_TRUE(is_ok(validate(a)));
}

// sm_margin's lower bound needs no device; its upper bound (the device's SM count) is checked at the launch.
TYPED_TEST(ValidateBoth, AcceptsAnySmMarginFromZeroUp) {
  for (int margin : {0, 1, 131, 100000}) {
    TypeParam a = valid_args<TypeParam>();
    a.sm_margin = margin;
    EXPECT_TRUE(is_ok(validate(a))) << "sm_margin " << margin;
  }
}

TYPED_TEST(ValidateBoth, RejectsANegativeSmMargin) {
  for (int margin : {-1, -132}) {
    TypeParam a = valid_args<TypeParam>();
    a.sm_margin = margin;
    const Status status = validate(a);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(),
              "sm_margin must satisfy 0 <= sm_margin < the device's SM count (at least one SM must run the kernel), "
              "got " +
                  std::to_string(margin));
  }
}

// The workspace is written: dense calls refuse it over an output or an input, naming what it overlaps.
TYPED_TEST(ValidateBoth, RejectsAWorkspaceOverlappingAnyTensor) {
  TypeParam a = valid_args<TypeParam>();
  ASSERT_TRUE(is_ok(validate(a)));
  void* output = nullptr;
  const char* output_name = nullptr;
  if constexpr (std::is_same_v<TypeParam, ForwardArgs>) {
    output = a.out.data;
    output_name = "workspace overlaps out";
  } else {
    output = a.dk.data;
    output_name = "workspace overlaps dk";
  }
  EXPECT_TRUE(fails_with(check_workspace_overlap(a, shifted(output, 256), 1024), StatusCode::kInvalidArgument,
                         {output_name, "the workspace, which the call writes, must not share memory"}));
  EXPECT_TRUE(fails_with(check_workspace_overlap(a, const_cast<void*>(a.k.data), 16), StatusCode::kInvalidArgument,
                         {"workspace overlaps k"}));
  // Negative controls: a workspace that ends just before the output, and the null or empty one check_workspace
  // refuses with its own status.
  EXPECT_TRUE(is_ok(check_workspace_overlap(a, shifted(output, -1024), 1024)));
  EXPECT_TRUE(is_ok(check_workspace_overlap(a, nullptr, 1024)));
  EXPECT_TRUE(is_ok(check_workspace_overlap(a, output, 0)));
  // What validate() refuses is left to it: a null tensor or a bad stride is no overlap of the workspace.
  TypeParam broken = a;
  broken.k.data = nullptr;
  broken.v.strides.seq = -8;
  EXPECT_TRUE(is_ok(check_workspace_overlap(broken, const_cast<void*>(a.v.data), 1024)));
  EXPECT_FALSE(is_ok(validate(broken)));
}

// --- Forward-only and backward-only rules. -------------------------------------------------------------

TEST(ValidateForward, RejectsLseOverlappingOut) {
  ForwardArgs a = valid_args<ForwardArgs>();
  a.lse = shifted(a.out.data, 4096);
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"out overlaps lse"}));
}

TEST(ValidateForward, RejectsLseOverlappingAnInput) {
  ForwardArgs a = valid_args<ForwardArgs>();
  a.lse = shifted(a.v.data, 0);
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"lse overlaps v"}));
}

// A float32 out spans twice the bytes of the input dtype's: an LSE placed right after the bf16 extent overlaps it,
// and its strides are checked in float32 elements (16 bytes are 4 of them).
TEST(ValidateForward, ChecksAFloat32OutInItsOwnElements) {
  ForwardArgs a = valid_args<ForwardArgs>();
  const int64_t bf16_bytes = packed_bytes(a.shape, a.shape.seqlen_q, a.shape.heads_q);
  a.lse = shifted(a.out.data, bf16_bytes);
  EXPECT_TRUE(is_ok(validate(a)));  // negative control: apart from a bf16 out
  a.out_fp32 = true;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"out overlaps lse"}));
  a = valid_args<ForwardArgs>();
  a.out_fp32 = true;
  EXPECT_TRUE(is_ok(validate(a)));
  a.out.strides.head = a.shape.head_dim + 4;  // 16 bytes more per head in float32, 8 in bf16
  a.out.strides.seq = a.out.strides.head * a.shape.heads_q;
  a.out.strides.batch = a.out.strides.seq * a.shape.seqlen_q;
  EXPECT_TRUE(is_ok(validate(a)));
  a.out_fp32 = false;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                         {"out.strides.head must be a multiple of 8 elements (16 bytes"}));
}

// merge_partial()'s arguments: one valid merge, then each rule broken alone (the C ABI tests name every message).
MergeArgs valid_merge() {
  MergeArgs m;
  m.batch = 2;
  m.rows = 8;
  m.seqlen = 32;
  m.heads = 4;
  m.head_dim = 64;
  m.part_out = {fake_pointer(0), packed_strides(8, 4, 64)};
  m.part_lse = fake_pointer(1);
  m.part_lse_strides = {4 * 8, 8, 1};
  m.acc_out = {fake_pointer(2), packed_strides(32, 4, 64)};
  m.acc_lse = fake_pointer(3);
  m.acc_lse_strides = {4 * 32, 32, 1};
  m.row_offset = 24;
  return m;
}

TEST(ValidateMerge, AcceptsOffsetsAndIndicesAndRefusesEachBrokenRule) {
  EXPECT_TRUE(is_ok(validate(valid_merge())));
  MergeArgs m = valid_merge();
  m.row_offset = 0;
  m.row_index = fake_pointer(4);
  EXPECT_TRUE(is_ok(validate(m)));
  m = valid_merge();
  m.row_offset = 25;
  EXPECT_TRUE(fails_with(validate(m), StatusCode::kInvalidArgument, {"row_offset must satisfy"}));
  m = valid_merge();
  m.heads = 70000;
  EXPECT_TRUE(fails_with(validate(m), StatusCode::kNotSupported, {"heads must be <= 65535"}));
  m = valid_merge();
  m.acc_out = {fake_pointer(0), packed_strides(32, 4, 64)};  // over the block
  EXPECT_TRUE(fails_with(validate(m), StatusCode::kInvalidArgument, {"acc_out overlaps part_out"}));
  m = valid_merge();
  m.row_offset = 0;
  m.row_index = static_cast<const int32_t*>(shifted(m.acc_lse, 64));
  EXPECT_TRUE(fails_with(validate(m), StatusCode::kInvalidArgument, {"acc_lse overlaps row_index"}));
  m = valid_merge();
  m.part_lse = shifted(m.part_lse, 2);
  EXPECT_TRUE(fails_with(validate(m), StatusCode::kInvalidArgument, {"part_lse must be 4-byte aligned"}));
  // Inputs may overlap themselves (a broadcast block); the accumulators may not.
  m = valid_merge();
  m.part_out.strides.head = 0;
  EXPECT_TRUE(is_ok(validate(m)));
  m.acc_out.strides.head = 0;
  EXPECT_TRUE(fails_with(validate(m), StatusCode::kInvalidArgument, {"layout of acc_out overlaps itself"}));
}

TEST(ValidateBackward, AcceptsEverySchedule) {
  for (Schedule schedule : kAllSchedules) {
    BackwardArgs a = valid_args<BackwardArgs>();
    a.schedule = schedule;
    EXPECT_TRUE(is_ok(validate(a))) << schedule_name(schedule);
  }
}

// 192 and 256, refused until they had backward kernels (now the key split's), are taken like the others (their plans:
// api/test_backward_plan.cpp).
TEST(ValidateBackward, AcceptsHeadDims192And256) {
  for (int64_t head_dim : {192, 256}) {
    AttentionShape shape = test_shape();
    shape.head_dim = head_dim;
    EXPECT_TRUE(is_ok(validate(valid_args<BackwardArgs>(shape)))) << "head_dim " << head_dim;
    EXPECT_TRUE(is_ok(validate(shape))) << "head_dim " << head_dim;
  }
}

// A head dim without kernels is refused by the backward, its workspace size and the forward alike, as not supported.
TEST(ValidateBackward, RefusesHeadDimsWithoutABackwardKernel) {
  AttentionShape shape = test_shape();
  shape.head_dim = 80;
  EXPECT_TRUE(fails_with(validate(valid_args<BackwardArgs>(shape)), StatusCode::kNotSupported,
                         {"shape.head_dim must be one of {64, 96, 128, 192, 256}", "got 80"}));
  size_t bytes = 0;
  EXPECT_TRUE(fails_with(backward_workspace_size(shape, Schedule::kAuto, &bytes), StatusCode::kNotSupported,
                         {"shape.head_dim must be one of {64, 96, 128, 192, 256}", "got 80"}));
  EXPECT_TRUE(fails_with(validate(valid_args<ForwardArgs>(shape)), StatusCode::kNotSupported, {"got 80"}));
}

TEST(ValidateBackward, RejectsInvalidSchedule) {
  for (int raw : {-1, 7, 42}) {
    BackwardArgs a = valid_args<BackwardArgs>();
    a.schedule = static_cast<Schedule>(raw);
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                           {"schedule must be a valid Schedule value", "Schedule(" + std::to_string(raw) + ")"}));
  }
}

TEST(ValidateBackward, RejectsOverlappingGradients) {
  BackwardArgs a = valid_args<BackwardArgs>();
  a.dv = a.dk;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"dk overlaps dv"}));
}

TEST(ValidateBackward, RejectsGradientOverlappingLse) {
  BackwardArgs a = valid_args<BackwardArgs>();
  a.lse = shifted(a.dv.data, 1024);
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"dv overlaps lse"}));
}

TEST(ValidateBackward, RejectsGradientOverlappingDout) {
  BackwardArgs a = valid_args<BackwardArgs>();
  a.dq.data = shifted(a.dout.data, 0);
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"dq overlaps dout"}));
}

// --- validate(AttentionShape) and the workspace-size queries. ---------------------------------------------

TEST(ValidateShape, AcceptsTheValidShape) { EXPECT_TRUE(is_ok(validate(test_shape()))); }

// The shape rules of validate(args) are validate(shape)'s: the same status for every shape case.
TEST(ValidateShape, GivesTheStatusOfValidateArgs) {
  for (const testing::RejectedShape& c : testing::rejected_shapes()) {
    AttentionShape shape = test_shape();
    c.bend(shape);
    EXPECT_EQ(validate(shape).to_string(), validate(valid_args<ForwardArgs>(shape)).to_string()) << c.name;
    EXPECT_EQ(validate(shape).to_string(), validate(valid_args<BackwardArgs>(shape)).to_string()) << c.name;
  }
}

// A sentinel the queries must leave alone when they refuse.
constexpr size_t kUntouched = 12345;

class ForwardWorkspaceSize : public ::testing::TestWithParam<testing::RejectedShape> {};
class BackwardWorkspaceSize : public ::testing::TestWithParam<testing::RejectedShape> {};

// Without a GPU the device query would answer "no device", with one the planner would crash: only a shape
// check that runs first gives the shape's own message on every machine.
TEST_P(ForwardWorkspaceSize, RefusesTheShapeBeforeAnythingElse) {
  AttentionShape shape = test_shape();
  GetParam().bend(shape);
  size_t bytes = kUntouched;
  const Status status = forward_workspace_size(shape, &bytes);
  EXPECT_EQ(status.code(), GetParam().code) << status.to_string();
  EXPECT_EQ(status.message(), GetParam().message);
  EXPECT_EQ(bytes, kUntouched);
}

TEST_P(BackwardWorkspaceSize, RefusesTheShapeBeforeAnythingElse) {
  AttentionShape shape = test_shape();
  GetParam().bend(shape);
  size_t bytes = kUntouched;
  const Status status = backward_workspace_size(shape, Schedule::kAuto, &bytes);
  EXPECT_EQ(status.code(), GetParam().code) << status.to_string();
  EXPECT_EQ(status.message(), GetParam().message);
  EXPECT_EQ(bytes, kUntouched);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ForwardWorkspaceSize, ::testing::ValuesIn(testing::rejected_shapes()),
                         testing::rejected_shape_name);
INSTANTIATE_TEST_SUITE_P(Shapes, BackwardWorkspaceSize, ::testing::ValuesIn(testing::rejected_shapes()),
                         testing::rejected_shape_name);

TEST(BackwardWorkspaceSizeSchedule, RefusesAnInvalidScheduleBeforeAnyDeviceQuery) {
  size_t bytes = kUntouched;
  EXPECT_TRUE(fails_with(backward_workspace_size(test_shape(), static_cast<Schedule>(42), &bytes),
                         StatusCode::kInvalidArgument, {"schedule must be a valid Schedule value", "Schedule(42)"}));
  EXPECT_EQ(bytes, kUntouched);
}

TEST(WorkspaceSizeOutput, NullBytesIsRefused) {
  EXPECT_TRUE(fails_with(forward_workspace_size(test_shape(), nullptr), StatusCode::kInvalidArgument,
                         {"forward_workspace_size: bytes must not be null"}));
  EXPECT_TRUE(fails_with(backward_workspace_size(test_shape(), Schedule::kAuto, nullptr), StatusCode::kInvalidArgument,
                         {"backward_workspace_size: bytes must not be null"}));
}

TEST(ForwardWorkspaceSizeValid, AnswersWithoutADevice) {
  size_t bytes = kUntouched;
  EXPECT_TRUE(is_ok(forward_workspace_size(test_shape(), &bytes)));
  EXPECT_NE(bytes, kUntouched);
}

// --- Device checks. -----------------------------------------------------------------------------------

bool device_visible() {
  int count = 0;
  const bool visible = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  static_cast<void>(cudaGetLastError());
  return visible;
}

TEST(DeviceCheck, AcceptsComputeCapability90) {
  EXPECT_TRUE(is_ok(check_device_properties(0, "NVIDIA H100 80GB HBM3", 9, 0)));
}

TEST(DeviceCheck, RejectsAmpere) {
  const Status status = check_device_properties(0, "NVIDIA A100", 8, 0);
  EXPECT_EQ(status.code(), StatusCode::kUnsupportedDevice);
  EXPECT_EQ(status.message(), "DASH kernels need a Hopper GPU (compute capability 9.0); device 0 'NVIDIA A100' is 8.0");
}

TEST(DeviceCheck, RejectsBlackwell) {
  EXPECT_TRUE(fails_with(check_device_properties(1, "NVIDIA B200", 10, 0), StatusCode::kUnsupportedDevice,
                         {"device 1 'NVIDIA B200' is 10.0"}));
}

TEST(DeviceCheck, ToleratesMissingName) {
  EXPECT_TRUE(
      fails_with(check_device_properties(0, nullptr, 8, 6), StatusCode::kUnsupportedDevice, {"device 0 '' is 8.6"}));
}

TEST(DeviceCheck, CurrentDevice) {
  const Status status = check_current_device();
  if (device_visible()) {
    EXPECT_TRUE(status.ok() || status.code() == StatusCode::kUnsupportedDevice) << status.to_string();
    return;
  }
  int driver_version = 0;
  ASSERT_EQ(cudaDriverGetVersion(&driver_version), cudaSuccess);
  if (driver_version == 0) {
    EXPECT_TRUE(fails_with(status, StatusCode::kNoDevice, {"no NVIDIA driver is installed"}));
  } else {
    EXPECT_EQ(status.code(), StatusCode::kNoDevice) << status.to_string();
  }
}

constexpr int kCuda12_2 = 12020;
constexpr int kCuda13_0 = 13000;
constexpr const char* kInsufficientDriverText = "CUDA driver version is insufficient for CUDA runtime version";

TEST(DeviceCount, AcceptsOneDevice) {
  EXPECT_TRUE(is_ok(check_device_count(cudaSuccess, "no error", 1, kCuda13_0, kCuda13_0)));
}

// Without libcuda the runtime reports cudaErrorInsufficientDriver, as for an old driver.
TEST(DeviceCount, NoDriver) {
  const Status status = check_device_count(cudaErrorInsufficientDriver, kInsufficientDriverText, 0, 0, kCuda13_0);
  EXPECT_EQ(status.code(), StatusCode::kNoDevice);
  EXPECT_EQ(status.message(),
            "no NVIDIA driver is installed (cudaDriverGetVersion found none); DASH needs a driver that supports CUDA "
            "13.0 or newer");
}

TEST(DeviceCount, DriverTooOld) {
  const Status status =
      check_device_count(cudaErrorInsufficientDriver, kInsufficientDriverText, 0, kCuda12_2, kCuda13_0);
  EXPECT_EQ(status.code(), StatusCode::kNoDevice);
  EXPECT_EQ(status.message(),
            "the NVIDIA driver is too old: it supports CUDA up to 12.2, but DASH was built with the CUDA 13.0 runtime; "
            "update the driver to one for CUDA 13.0 or newer");
}

TEST(DeviceCount, NoDeviceVisible) {
  for (const auto& [error, count] : {std::pair{cudaErrorNoDevice, 0}, std::pair{cudaSuccess, 0}}) {
    EXPECT_TRUE(fails_with(check_device_count(error, "no CUDA-capable device is detected", count, kCuda13_0, kCuda13_0),
                           StatusCode::kNoDevice,
                           {"no CUDA device is visible (the driver, for CUDA 13.0, found none; check "
                            "CUDA_VISIBLE_DEVICES"}));
  }
}

TEST(DeviceCount, OtherFailureQuotesTheRuntime) {
  EXPECT_TRUE(fails_with(
      check_device_count(cudaErrorSystemDriverMismatch,
                         "system has unsupported display driver / cuda driver combination", 0, kCuda13_0, kCuda13_0),
      StatusCode::kNoDevice, {"no CUDA device is usable (cudaGetDeviceCount: system has unsupported display driver"}));
}

TEST(DeviceCheck, RejectsNullPointer) {
  EXPECT_TRUE(fails_with(check_device_pointer(nullptr, "q"), StatusCode::kInvalidArgument, {"q must not be null"}));
}

TEST(DeviceCheck, DevicePointers) {
  if (!device_visible()) GTEST_SKIP() << "no CUDA device";
  constexpr size_t kBytes = 4096;
  void* device = nullptr;
  void* managed = nullptr;
  void* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMallocManaged(&managed, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, kBytes), cudaSuccess);
  EXPECT_TRUE(is_ok(check_device_pointer(device, "q")));
  EXPECT_TRUE(is_ok(check_device_pointer(managed, "k")));
  EXPECT_TRUE(is_ok(check_device_pointer(pinned, "v")));
  std::vector<char> host(kBytes);
  EXPECT_TRUE(fails_with(check_device_pointer(host.data(), "dout"), StatusCode::kInvalidArgument,
                         {"dout (", "is host memory unknown to CUDA"}));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the checks leave no error behind
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaFree(managed), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// --- Names and Status. ----------------------------------------------------------------------------------

TEST(ScheduleNames, RoundTrip) {
  for (Schedule schedule : kAllSchedules) {
    EXPECT_EQ(parse_schedule(schedule_name(schedule)), schedule) << schedule_name(schedule);
    Schedule parsed = Schedule::kAuto;
    EXPECT_TRUE(is_ok(parse_schedule(schedule_name(schedule), &parsed)));
    EXPECT_EQ(parsed, schedule);
  }
}

TEST(ScheduleNames, UnknownNameListsValidNames) {
  EXPECT_EQ(parse_schedule("fastest"), std::nullopt);
  Schedule parsed = Schedule::kShift;
  const Status status = parse_schedule("fastest", &parsed);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "unknown schedule 'fastest' (valid: auto, ascending, descending, shortest-first, shift, "
            "symmetric-shift, nondeterministic)");
  EXPECT_EQ(parsed, Schedule::kShift);  // untouched on failure
}

TEST(ScheduleNames, NullOutputPointer) {
  EXPECT_TRUE(fails_with(parse_schedule("shift", nullptr), StatusCode::kInvalidArgument, {"output pointer is null"}));
}

TEST(ScheduleNames, OutOfRangeValue) { EXPECT_EQ(schedule_name(static_cast<Schedule>(42)), "unknown-schedule"); }

TEST(StatusFormat, ToString) {
  EXPECT_EQ(Status().to_string(), "ok");
  EXPECT_EQ(Status::success().to_string(), "ok");
  EXPECT_EQ(Status(StatusCode::kInvalidArgument, "q must not be null").to_string(),
            "invalid-argument: q must not be null");
  EXPECT_EQ(Status(StatusCode::kNoDevice, "no CUDA device is visible").to_string(),
            "no-device: no CUDA device is visible");
  EXPECT_EQ(Status(StatusCode::kUnsupportedDevice, "x").to_string(), "unsupported-device: x");
}

}  // namespace
}  // namespace dash
