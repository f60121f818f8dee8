// Tests of the public API's host-side rules for packed varlen batches (VarlenBatch, dash/types.hpp): validate() of
// varlen forward and backward arguments (one test per rule, each breaking that rule alone on valid arguments, each
// message naming the argument and the rule), plan_varlen_backward() on a device described by hand (which schedules
// a batch admits with and without the promise keys_within_queries, and why the others are refused; what auto picks
// under the hint lengths_fill_maxima), and a plan's refusal of calls that do not fit it (and acceptance of calls
// whose packed rows would give the other hint); cu_seqlens and the workspace overlapping an output. No GPU: pointers
// are fake (validate() never dereferences them) and aligned.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "api/backward_plan.hpp"
#include "api/limits.hpp"
#include "api/validate.hpp"
#include "dash/attention.hpp"
#include "status_assertions.hpp"

namespace dash {
namespace {

// Each fake tensor gets its own 64 GiB region, larger than any tensor a test builds.
constexpr uintptr_t kFakeBase = uintptr_t{1} << 44;
constexpr uintptr_t kFakeRegionBytes = uintptr_t{1} << 36;

template <typename T>
T* fake(int region) {
  return reinterpret_cast<T*>(kFakeBase + static_cast<uintptr_t>(region) * kFakeRegionBytes);
}

// 3 sequences of at most 256 queries and 384 keys packed into 500 query and 700 key rows.
constexpr int64_t kTotalQ = 500;
constexpr int64_t kTotalK = 700;

AttentionShape max_shape() {
  AttentionShape shape;
  shape.batch = 3;
  shape.seqlen_q = 256;
  shape.seqlen_k = 384;
  shape.heads_q = 8;
  shape.heads_kv = 2;
  shape.head_dim = 128;
  shape.dtype = DType::kBF16;
  shape.softmax_scale = 1.0f / std::sqrt(128.0f);
  shape.causal = true;
  return shape;
}

// A packed (total, heads, head_dim) tensor's strides: no batch dimension.
Strides packed_rows(int64_t heads, int64_t head_dim) { return Strides{0, heads * head_dim, head_dim, 1}; }

VarlenBatch valid_batch() {
  VarlenBatch v;
  v.cu_seqlens_q = fake<const int32_t>(20);
  v.cu_seqlens_k = fake<const int32_t>(21);
  v.total_q = kTotalQ;
  v.total_k = kTotalK;
  return v;
}

template <typename Args>
Args valid_args();

template <>
ForwardArgs valid_args<ForwardArgs>() {
  const AttentionShape shape = max_shape();
  const Strides query = packed_rows(shape.heads_q, shape.head_dim);
  const Strides key = packed_rows(shape.heads_kv, shape.head_dim);
  ForwardArgs a;
  a.shape = shape;
  a.q = {fake<void>(0), query};
  a.k = {fake<void>(1), key};
  a.v = {fake<void>(2), key};
  a.out = {fake<void>(3), query};
  a.lse = fake<float>(4);
  a.varlen = valid_batch();
  return a;
}

template <>
BackwardArgs valid_args<BackwardArgs>() {
  const AttentionShape shape = max_shape();
  const Strides query = packed_rows(shape.heads_q, shape.head_dim);
  const Strides key = packed_rows(shape.heads_kv, shape.head_dim);
  BackwardArgs a;
  a.shape = shape;
  a.q = {fake<void>(0), query};
  a.k = {fake<void>(1), key};
  a.v = {fake<void>(2), key};
  a.out = {fake<void>(3), query};
  a.dout = {fake<void>(4), query};
  a.lse = fake<float>(5);
  a.dq = {fake<void>(6), query};
  a.dk = {fake<void>(7), key};
  a.dv = {fake<void>(8), key};
  a.schedule = Schedule::kAscending;
  a.varlen = valid_batch();
  return a;
}

using testing::fails_with;
using testing::is_ok;

template <typename Args>
class ValidateVarlen : public ::testing::Test {};
using ArgTypes = ::testing::Types<ForwardArgs, BackwardArgs>;
TYPED_TEST_SUITE(ValidateVarlen, ArgTypes);

TYPED_TEST(ValidateVarlen, AcceptsValidArguments) { EXPECT_TRUE(is_ok(validate(valid_args<TypeParam>()))); }

TYPED_TEST(ValidateVarlen, AcceptsOneSequenceOfOneToken) {
  TypeParam a = valid_args<TypeParam>();
  a.shape.batch = 1;
  a.shape.seqlen_q = a.shape.seqlen_k = 1;
  a.varlen.total_q = a.varlen.total_k = 1;
  EXPECT_TRUE(is_ok(validate(a)));
}

TYPED_TEST(ValidateVarlen, AcceptsMaximaAboveTheTotals) {
  // The maxima bound each sequence, the totals all of them: a plan for longer sequences fits a short batch.
  TypeParam a = valid_args<TypeParam>();
  a.varlen.total_q = 10;
  a.varlen.total_k = 20;
  EXPECT_TRUE(is_ok(validate(a)));
}

TYPED_TEST(ValidateVarlen, RejectsEachNullOffsetArray) {
  for (const bool query_side : {true, false}) {
    TypeParam a = valid_args<TypeParam>();
    (query_side ? a.varlen.cu_seqlens_q : a.varlen.cu_seqlens_k) = nullptr;
    EXPECT_TRUE(
        fails_with(validate(a), StatusCode::kInvalidArgument,
                   {query_side ? "varlen.cu_seqlens_q must not be null" : "varlen.cu_seqlens_k must not be null",
                    "shape.batch + 1 int32 offsets"}));
  }
}

TYPED_TEST(ValidateVarlen, RejectsMisalignedOffsets) {
  TypeParam a = valid_args<TypeParam>();
  a.varlen.cu_seqlens_k = reinterpret_cast<const int32_t*>(reinterpret_cast<uintptr_t>(a.varlen.cu_seqlens_k) + 2);
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                         {"varlen.cu_seqlens_k must be 4-byte aligned", "int32 offsets"}));
}

TYPED_TEST(ValidateVarlen, RejectsTotalsBelowOne) {
  for (const int64_t total : {int64_t{0}, int64_t{-5}}) {
    TypeParam a = valid_args<TypeParam>();
    a.varlen.total_q = total;
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                           {"varlen.total_q must be > 0", "got " + std::to_string(total)}));
    a = valid_args<TypeParam>();
    a.varlen.total_k = total;
    EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"varlen.total_k must be > 0"}));
  }
}

TYPED_TEST(ValidateVarlen, RejectsTotalsPastTheKernelsIndices) {
  TypeParam a = valid_args<TypeParam>();
  a.varlen.total_q = kMaxKernelIndex / (a.shape.heads_q * a.shape.head_dim);
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kNotSupported,
                         {"varlen.total_q * heads_q * head_dim must be < 2147483648", "32-bit"}));
  a = valid_args<TypeParam>();
  a.varlen.total_k = kMaxKernelIndex;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kNotSupported, {"varlen.total_k * heads_kv * head_dim"}));
}

TYPED_TEST(ValidateVarlen, RejectsABatchStride) {
  TypeParam a = valid_args<TypeParam>();
  a.k.strides.batch = 8;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                         {"k.strides.batch must be 0 in a varlen call", "no batch dimension", "got 8"}));
}

TYPED_TEST(ValidateVarlen, RejectsMaximaBelowOne) {
  // max_seqlen_q and max_seqlen_k are the shape's seqlen_q and seqlen_k: validate(shape)'s rules name them.
  TypeParam a = valid_args<TypeParam>();
  a.shape.seqlen_q = 0;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"shape.seqlen_q must be > 0", "got 0"}));
  a = valid_args<TypeParam>();
  a.shape.seqlen_k = -1;
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"shape.seqlen_k must be > 0"}));
}

TYPED_TEST(ValidateVarlen, SizesTheLseByHeadsAndTotalQ) {
  // The LSE is (heads_q, total_q): an output that starts in its last row overlaps it.
  TypeParam a = valid_args<TypeParam>();
  const int64_t lse_floats = a.shape.heads_q * kTotalQ;
  auto* last_row = const_cast<float*>(a.lse) + lse_floats - kTmaAlignmentBytes / static_cast<int64_t>(sizeof(float));
  if constexpr (std::is_same_v<TypeParam, ForwardArgs>) {
    a.out.data = last_row;
  } else {
    a.dq.data = last_row;
  }
  EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument, {"overlaps lse"}));
  // One row further on, nothing overlaps.
  TypeParam b = valid_args<TypeParam>();
  if constexpr (std::is_same_v<TypeParam, ForwardArgs>) {
    b.out.data = const_cast<float*>(b.lse) + lse_floats;
  } else {
    b.dq.data = const_cast<float*>(b.lse) + lse_floats;
  }
  EXPECT_TRUE(is_ok(validate(b)));
}

// Every output of the call: out for the forward (and the LSE it writes), dq, dk and dv for the backward.
template <typename Args>
std::vector<std::pair<const char*, void**>> outputs(Args& a) {
  if constexpr (std::is_same_v<Args, ForwardArgs>) {
    return {{"out", &a.out.data}};
  } else {
    return {{"dq", &a.dq.data}, {"dk", &a.dk.data}, {"dv", &a.dv.data}};
  }
}

TYPED_TEST(ValidateVarlen, RejectsCuSeqlensInsideAnOutput) {
  // The kernels read the offsets while they write the outputs: an output over them changes what they read.
  for (const bool query_side : {true, false}) {
    TypeParam probe = valid_args<TypeParam>();
    for (const auto& [name, data] : outputs(probe)) {
      TypeParam a = valid_args<TypeParam>();
      void** output = nullptr;
      for (const auto& [other, field] : outputs(a)) {
        if (std::string_view(other) == name) output = field;
      }
      // The last offset lies inside the output's first row.
      const auto* inside = reinterpret_cast<const int32_t*>(*output) + 4 - a.shape.batch;
      (query_side ? a.varlen.cu_seqlens_q : a.varlen.cu_seqlens_k) = inside;
      const std::string offsets = query_side ? "varlen.cu_seqlens_q" : "varlen.cu_seqlens_k";
      EXPECT_TRUE(fails_with(validate(a), StatusCode::kInvalidArgument,
                             {std::string(name) + " overlaps " + offsets, "an output must not share memory"}));
    }
  }
}

TYPED_TEST(ValidateVarlen, AcceptsCuSeqlensNextToAnOutputAndSharedBetweenQueryAndKey) {
  // Negative control: the offsets end one byte before the output starts, and both sides share one array.
  TypeParam a = valid_args<TypeParam>();
  void* output = *outputs(a).front().second;
  const auto* before = reinterpret_cast<const int32_t*>(output) - (a.shape.batch + 1);
  a.varlen.cu_seqlens_q = a.varlen.cu_seqlens_k = before;
  EXPECT_TRUE(is_ok(validate(a)));
}

TYPED_TEST(ValidateVarlen, RejectsAWorkspaceOverCuSeqlensOrAnyTensor) {
  TypeParam a = valid_args<TypeParam>();
  ASSERT_TRUE(is_ok(validate(a)));
  // The workspace's last byte is the first byte of cu_seqlens_k.
  void* ending_on_offsets = reinterpret_cast<char*>(const_cast<int32_t*>(a.varlen.cu_seqlens_k)) - 63;
  EXPECT_TRUE(fails_with(check_workspace_overlap(a, ending_on_offsets, 64), StatusCode::kInvalidArgument,
                         {"workspace overlaps varlen.cu_seqlens_k",
                          "the workspace, which the call writes, must not "
                          "share memory with any tensor of the call"}));
  // An input is refused as well: the call writes the workspace while it reads q.
  EXPECT_TRUE(fails_with(check_workspace_overlap(a, const_cast<void*>(a.q.data), 64), StatusCode::kInvalidArgument,
                         {"workspace overlaps q"}));
  EXPECT_TRUE(fails_with(check_workspace_overlap(a, const_cast<float*>(a.lse) + 16, 64), StatusCode::kInvalidArgument,
                         {"workspace overlaps lse"}));
  // Negative control: the same workspace one byte shorter touches nothing.
  EXPECT_TRUE(is_ok(check_workspace_overlap(a, ending_on_offsets, 63)));
}

// --- plan_varlen_backward on a device described by hand --------------------------------------------------

DeviceInfo hand_device() {
  DeviceInfo device;
  device.index = 0;
  device.multiprocessor_count = 132;
  device.compute_major = 9;
  return device;
}

// With the hint that every sequence may be as long as the maxima (auto as for the maximum problem).
Status plan(const AttentionShape& shape, bool promise, Schedule schedule, BackwardPlan* made) {
  return plan_varlen_backward(shape, promise, /*lengths_fill_maxima=*/true, schedule, /*sm_margin=*/0, hand_device(),
                              made);
}

// The schedule plan_varlen_backward runs for `schedule` under the hint `fill`, or kAuto where it refused.
Schedule planned_schedule(const AttentionShape& shape, bool promise, bool fill, Schedule schedule) {
  BackwardPlan made;
  const Status s = plan_varlen_backward(shape, promise, fill, schedule, /*sm_margin=*/0, hand_device(), &made);
  return s.ok() ? made.schedule() : Schedule::kAuto;
}

TEST(PlanVarlenBackward, PlansTheKvOrderSchedulesForEveryBatch) {
  for (const bool causal : {false, true}) {
    AttentionShape shape = max_shape();
    shape.causal = causal;
    for (Schedule schedule : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst,
                              Schedule::kNondeterministic, Schedule::kAuto}) {
      BackwardPlan made;
      EXPECT_TRUE(is_ok(plan(shape, /*promise=*/false, schedule, &made))) << schedule_name(schedule);
      EXPECT_TRUE(made.varlen());
      EXPECT_FALSE(made.keys_within_queries());
      EXPECT_GT(made.workspace_bytes(), 0u);
    }
  }
}

TEST(PlanVarlenBackward, PlansTheShiftSchedulesOnlyWithThePromise) {
  AttentionShape full = max_shape();
  full.causal = false;
  full.seqlen_k = full.seqlen_q;
  AttentionShape causal = full;
  causal.causal = true;
  for (const auto& [shape, schedule] :
       {std::pair{full, Schedule::kShift}, std::pair{causal, Schedule::kSymmetricShift}}) {
    BackwardPlan made;
    EXPECT_TRUE(is_ok(plan(shape, /*promise=*/true, schedule, &made))) << schedule_name(schedule);
    EXPECT_TRUE(made.keys_within_queries());
    EXPECT_EQ(made.schedule(), schedule);
    EXPECT_TRUE(fails_with(plan(shape, /*promise=*/false, schedule, &made), StatusCode::kScheduleRejected,
                           {"cannot run this varlen batch", "seqlen_k <= seqlen_q", "keys_within_queries"}));
  }
}

TEST(PlanVarlenBackward, AutoPicksShiftForFullSelfAttentionOnlyWithThePromise) {
  // auto's dense choice for a full mask of few key/value tiles is shift (planner/schedule_plan.cpp); without the
  // promise the varlen planner falls back to ascending rather than refuse.
  AttentionShape shape = max_shape();
  shape.causal = false;
  shape.seqlen_k = shape.seqlen_q;
  BackwardPlan made;
  ASSERT_TRUE(is_ok(plan(shape, /*promise=*/true, Schedule::kAuto, &made)));
  EXPECT_EQ(made.schedule(), Schedule::kShift);
  ASSERT_TRUE(is_ok(plan(shape, /*promise=*/false, Schedule::kAuto, &made)));
  EXPECT_EQ(made.schedule(), Schedule::kAscending);
}

TEST(PlanVarlenBackward, AutoPicksShortestFirstUnderTheFullMaskWhenTheRowsProveSomeSequenceShorter) {
  AttentionShape full = max_shape();
  full.causal = false;
  full.seqlen_k = full.seqlen_q;
  EXPECT_EQ(planned_schedule(full, /*promise=*/true, /*fill=*/true, Schedule::kAuto), Schedule::kShift);
  EXPECT_EQ(planned_schedule(full, /*promise=*/true, /*fill=*/false, Schedule::kAuto), Schedule::kShortestFirst);
  EXPECT_EQ(planned_schedule(full, /*promise=*/false, /*fill=*/false, Schedule::kAuto), Schedule::kShortestFirst);
  // Under the causal mask or a window auto's choice does not depend on the hint.
  AttentionShape causal = full;
  causal.causal = true;
  AttentionShape windowed = full;
  windowed.window_left = 64;
  for (const AttentionShape& shape : {causal, windowed}) {
    const Schedule chosen = planned_schedule(shape, true, /*fill=*/true, Schedule::kAuto);
    EXPECT_NE(chosen, Schedule::kAuto);
    EXPECT_EQ(planned_schedule(shape, true, /*fill=*/false, Schedule::kAuto), chosen);
  }
  // An explicit schedule is planned as requested under either hint.
  for (const bool fill : {false, true}) {
    EXPECT_EQ(planned_schedule(full, true, fill, Schedule::kShift), Schedule::kShift);
    EXPECT_EQ(planned_schedule(full, true, fill, Schedule::kAscending), Schedule::kAscending);
    EXPECT_EQ(planned_schedule(causal, true, fill, Schedule::kSymmetricShift), Schedule::kSymmetricShift);
  }
}

TEST(PlanVarlenBackward, TheHintIsWhetherThePackedRowsHoldEverySequenceAtTheMaxima) {
  const AttentionShape shape = max_shape();  // 3 sequences of at most 256 queries and 384 keys
  EXPECT_TRUE(varlen_lengths_fill_maxima(shape, 3 * 256, 3 * 384));
  EXPECT_TRUE(varlen_lengths_fill_maxima(shape, 3 * 256 + 37, 3 * 384 + 37)) << "padding rows after the last";
  EXPECT_FALSE(varlen_lengths_fill_maxima(shape, 3 * 256 - 1, 3 * 384));
  EXPECT_FALSE(varlen_lengths_fill_maxima(shape, 3 * 256, 3 * 384 - 1));
  EXPECT_FALSE(varlen_lengths_fill_maxima(shape, kTotalQ, kTotalK));
}

TEST(PlanVarlenBackward, RefusesSymmetricShiftUnderAWindow) {
  AttentionShape shape = max_shape();
  shape.seqlen_k = shape.seqlen_q;
  shape.window_left = 64;
  BackwardPlan made;
  EXPECT_TRUE(fails_with(plan(shape, /*promise=*/true, Schedule::kSymmetricShift, &made), StatusCode::kScheduleRejected,
                         {"sliding window", "varlen"}));
}

TEST(PlanVarlenBackward, RefusesABadShapeFirst) {
  AttentionShape shape = max_shape();
  shape.seqlen_q = 0;
  BackwardPlan made;
  EXPECT_TRUE(fails_with(plan(shape, false, Schedule::kAuto, &made), StatusCode::kInvalidArgument,
                         {"shape.seqlen_q must be > 0"}));
}

TEST(VarlenPlanCall, RefusesADenseCallAndAVarlenCallOfTheOtherPlan) {
  BackwardPlan varlen_plan;
  ASSERT_TRUE(is_ok(plan(max_shape(), /*promise=*/false, Schedule::kAscending, &varlen_plan)));
  BackwardArgs dense = valid_args<BackwardArgs>();
  dense.varlen = VarlenBatch{};
  EXPECT_TRUE(fails_with(check_args_match_plan(dense, *BackwardPlanAccess::data(varlen_plan)),
                         StatusCode::kInvalidArgument, {"varlen is none", "plan_varlen_backward"}));
  BackwardPlan dense_plan;
  ASSERT_TRUE(is_ok(plan_backward(max_shape(), Schedule::kAscending, 0, hand_device(), &dense_plan)));
  EXPECT_TRUE(fails_with(check_args_match_plan(valid_args<BackwardArgs>(), *BackwardPlanAccess::data(dense_plan)),
                         StatusCode::kInvalidArgument, {"varlen is a packed batch", "made for none"}));
}

TEST(VarlenPlanCall, RefusesAnotherPromise) {
  BackwardPlan made;
  ASSERT_TRUE(is_ok(plan(max_shape(), /*promise=*/false, Schedule::kAscending, &made)));
  BackwardArgs a = valid_args<BackwardArgs>();
  a.varlen.keys_within_queries = true;
  EXPECT_TRUE(fails_with(check_args_match_plan(a, *BackwardPlanAccess::data(made)), StatusCode::kInvalidArgument,
                         {"varlen.keys_within_queries is true", "made for false"}));
  a.varlen.keys_within_queries = false;
  EXPECT_TRUE(is_ok(check_args_match_plan(a, *BackwardPlanAccess::data(made))));
}

TEST(VarlenPlanCall, AcceptsACallWhoseRowsWouldGiveTheOtherHint) {
  // The hint only chose among schedules proven for every length vector: a plan runs batches of any packed rows.
  AttentionShape full = max_shape();
  full.causal = false;
  for (const bool fill : {false, true}) {
    BackwardPlan made;
    ASSERT_TRUE(is_ok(plan_varlen_backward(full, false, fill, Schedule::kAuto, 0, hand_device(), &made)));
    BackwardArgs a = valid_args<BackwardArgs>();
    a.shape = full;
    a.schedule = Schedule::kAuto;
    for (const int64_t rows : {int64_t{1}, full.batch * full.seqlen_k}) {
      a.varlen.total_q = a.varlen.total_k = rows;
      EXPECT_TRUE(is_ok(check_args_match_plan(a, *BackwardPlanAccess::data(made)))) << fill << " " << rows;
    }
  }
}

}  // namespace
}  // namespace dash
