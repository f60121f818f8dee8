// Tests of the C ABI (libdash_attn_c.so, src/capi/dash_c.h) on the host path: the workspace-size queries
// refuse every shape of api/rejected_shapes.hpp with the C++ API's code and message before any device query,
// missing arguments are named, the device check tells "no driver" apart from other failures, and the
// diagnostic queries (versions, device description) agree with what this process's own CUDA runtime reports.
// The backward plan handle: made for a device described by hand (no GPU needed), sized, destroyed (NULL
// included); each refused creation with its own message and the handle untouched; a run whose shape is not
// the plan's is refused naming the field, before anything else, and so is a run whose varlen (NULL or not) is not
// the plan's kind. The SM margin: a plan records the SM count it was planned for, and a margin outside
// [0, SM count) is refused naming the rule. A plan names the schedule it runs; a varlen plan is made from a
// dash_varlen without offsets, and the hint its totals give reaches auto alone. dash_kernel_available answers 0 for
// feature bits it does not know. A flag other than 0 or 1 and a workspace that overlaps a tensor of the call are
// refused, naming them. Runs without a GPU; the test
// links the shared library exactly as a C caller would.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <regex>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "dash_c.h"
#include "rejected_shapes.hpp"

namespace dash {
namespace {

constexpr size_t kMessageBytes = 4096;
// A sentinel the queries must leave alone when they refuse.
constexpr size_t kUntouched = 12345;

dash_shape to_c(const AttentionShape& s) {
  return dash_shape{
      s.batch,         s.seqlen_q,       s.seqlen_k,     s.heads_q, s.heads_kv, s.head_dim, static_cast<int>(s.dtype),
      s.softmax_scale, s.causal ? 1 : 0,
      /*windowed=*/1,  s.window_left,    s.window_right, s.softcap};
}

// The dash_varlen a varlen plan of `s` reads: no offsets (a plan does not read them), the promise, and totals that
// let every sequence be as long as the maxima (`fill`) or show one shorter (a query row fewer).
dash_varlen plan_varlen(const dash_shape& s, int keys_within_queries, bool fill = true) {
  const int64_t total_q = s.batch * s.seqlen_q - (fill ? 0 : 1);
  return dash_varlen{nullptr, nullptr, total_q, s.batch * s.seqlen_k, keys_within_queries};
}

// What one C call returned: its code and the message it copied out.
struct Result {
  int code = DASH_STATUS_OK;
  std::string message;
};

template <typename Call>
Result call(Call c) {
  std::array<char, kMessageBytes> message{};
  Result r;
  r.code = c(message.data(), message.size());
  r.message = message.data();
  return r;
}

class CForwardWorkspaceSize : public ::testing::TestWithParam<testing::RejectedShape> {};
class CBackwardWorkspaceSize : public ::testing::TestWithParam<testing::RejectedShape> {};

TEST_P(CForwardWorkspaceSize, RefusesTheShapeBeforeAnythingElse) {
  AttentionShape shape = testing::valid_workspace_shape();
  GetParam().bend(shape);
  const dash_shape c_shape = to_c(shape);
  size_t bytes = kUntouched;
  const Result r = call([&](char* m, size_t n) { return dash_forward_workspace_size(&c_shape, &bytes, m, n); });
  EXPECT_EQ(r.code, static_cast<int>(GetParam().code)) << dash_status_name(r.code) << ": " << r.message;
  EXPECT_EQ(r.message, GetParam().message);
  EXPECT_EQ(bytes, kUntouched);
}

TEST_P(CBackwardWorkspaceSize, RefusesTheShapeBeforeAnythingElse) {
  AttentionShape shape = testing::valid_workspace_shape();
  GetParam().bend(shape);
  const dash_shape c_shape = to_c(shape);
  size_t bytes = kUntouched;
  const Result r =
      call([&](char* m, size_t n) { return dash_backward_workspace_size(&c_shape, "auto", &bytes, m, n); });
  EXPECT_EQ(r.code, static_cast<int>(GetParam().code)) << dash_status_name(r.code) << ": " << r.message;
  EXPECT_EQ(r.message, GetParam().message);
  EXPECT_EQ(bytes, kUntouched);
}

// windowed == 0 means no window whatever the bounds hold: a zeroed struct is not the window (0, 0). With windowed
// set, the bounds are the shape's and are checked.
TEST(CShape, TheWindowAppliesOnlyWhenWindowedIsSet) {
  dash_shape c_shape = to_c(testing::valid_workspace_shape());
  c_shape.windowed = 0;
  c_shape.window_left = -5;
  size_t bytes = kUntouched;
  Result r = call([&](char* m, size_t n) { return dash_forward_workspace_size(&c_shape, &bytes, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_OK) << r.message;
  c_shape.windowed = 1;
  r = call([&](char* m, size_t n) { return dash_forward_workspace_size(&c_shape, &bytes, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "shape.window_left must be >= -1 (-1 leaves that side of the sliding window open), got -5");
  const dash_shape zeroed{};
  EXPECT_EQ(zeroed.windowed, 0);
}

// A softcap instance exists only next to its plain one (DASH_SOFTCAP_KERNELS adds one per head dim and dtype built);
// tests/kernels/test_sm90_variants.cpp checks on a GPU build that each plain one has its softcap one.
TEST(CShape, SoftcapKernelsComeWithThePlainOnes) {
  for (int64_t head_dim : {64, 80, 96, 128, 192, 256}) {
    for (int dtype : {DASH_DTYPE_BF16, DASH_DTYPE_FP16}) {
      if (dash_kernel_available(head_dim, dtype, DASH_KERNEL_SOFTCAP) != 0) {
        EXPECT_EQ(dash_kernel_available(head_dim, dtype, 0), 1) << head_dim << " " << dtype;
      }
    }
  }
  EXPECT_EQ(dash_kernel_available(80, DASH_DTYPE_BF16, DASH_KERNEL_SOFTCAP), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CForwardWorkspaceSize, ::testing::ValuesIn(testing::rejected_shapes()),
                         testing::rejected_shape_name);
INSTANTIATE_TEST_SUITE_P(Shapes, CBackwardWorkspaceSize, ::testing::ValuesIn(testing::rejected_shapes()),
                         testing::rejected_shape_name);

TEST(CWorkspaceSize, NamesMissingArguments) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  size_t bytes = kUntouched;
  Result r = call([&](char* m, size_t n) { return dash_forward_workspace_size(nullptr, &bytes, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "shape must not be null");
  r = call([&](char* m, size_t n) { return dash_forward_workspace_size(&c_shape, nullptr, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "forward_workspace_size: bytes must not be null");
  r = call([&](char* m, size_t n) { return dash_backward_workspace_size(&c_shape, nullptr, &bytes, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "schedule must not be null (pass a name such as \"auto\")");
  r = call([&](char* m, size_t n) { return dash_backward_workspace_size(&c_shape, "auto", nullptr, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "backward_workspace_size: bytes must not be null");
  EXPECT_EQ(bytes, kUntouched);
}

TEST(CWorkspaceSize, RefusesAnUnknownScheduleBeforeAnyDeviceQuery) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  size_t bytes = kUntouched;
  const Result r =
      call([&](char* m, size_t n) { return dash_backward_workspace_size(&c_shape, "fastest", &bytes, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message.rfind("unknown schedule 'fastest' (valid: auto, ascending", 0), 0u) << r.message;
  EXPECT_EQ(bytes, kUntouched);
}

TEST(CWorkspaceSize, ForwardAnswersAValidShapeWithoutADevice) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  size_t bytes = kUntouched;
  const Result r = call([&](char* m, size_t n) { return dash_forward_workspace_size(&c_shape, &bytes, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_OK) << r.message;
  EXPECT_EQ(r.message, "");
  EXPECT_NE(bytes, kUntouched);
}

// The three ways to have no usable device get three messages; this machine shows the one it has.
TEST(CCheckDevice, SaysWhyNoDeviceCanBeUsed) {
  const Result r = call([](char* m, size_t n) { return dash_check_device(m, n); });
  int count = 0;
  const cudaError_t count_error = cudaGetDeviceCount(&count);
  if (count_error == cudaSuccess && count > 0) {
    EXPECT_TRUE(r.code == DASH_STATUS_OK || r.code == DASH_STATUS_UNSUPPORTED_DEVICE) << r.message;
    return;
  }
  EXPECT_EQ(r.code, DASH_STATUS_NO_DEVICE) << r.message;
  int driver_version = 0;
  ASSERT_EQ(cudaDriverGetVersion(&driver_version), cudaSuccess);
  const std::string expected = driver_version == 0                          ? "no NVIDIA driver is installed"
                               : count_error == cudaErrorInsufficientDriver ? "the NVIDIA driver is too old"
                                                                            : "no CUDA device is ";
  EXPECT_EQ(r.message.rfind(expected, 0), 0u) << r.message;
}

TEST(CVersions, NameTheLibraryAndTheCudaItUses) {
  EXPECT_TRUE(std::regex_match(dash_library_version(), std::regex(R"([0-9]+\.[0-9]+\.[0-9]+)")))
      << dash_library_version();
  // The library links the runtime of the toolkit this test is built with; the driver is the machine's.
  EXPECT_EQ(dash_cuda_runtime_version(), CUDART_VERSION);
  int driver_version = -1;
  ASSERT_EQ(cudaDriverGetVersion(&driver_version), cudaSuccess);
  EXPECT_EQ(dash_cuda_driver_version(), driver_version);
}

TEST(CDescribeDevice, NamesAMissingArgument) {
  const Result r = call([](char* m, size_t n) { return dash_describe_current_device(nullptr, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "device must not be null");
}

// Without a device it answers as dash_check_device does and leaves the struct alone; with one, it describes
// it as the runtime does, whether or not the kernels can run there.
TEST(CDescribeDevice, DescribesTheCurrentDeviceOrSaysWhyThereIsNone) {
  dash_device device{};
  device.multiprocessor_count = -1;
  const Result r = call([&](char* m, size_t n) { return dash_describe_current_device(&device, m, n); });
  const Result check = call([](char* m, size_t n) { return dash_check_device(m, n); });
  if (check.code == DASH_STATUS_NO_DEVICE) {
    EXPECT_EQ(r.code, DASH_STATUS_NO_DEVICE);
    EXPECT_EQ(r.message, check.message);
    EXPECT_EQ(device.multiprocessor_count, -1);
    return;
  }
  ASSERT_EQ(r.code, DASH_STATUS_OK) << r.message;
  int index = -1;
  ASSERT_EQ(cudaGetDevice(&index), cudaSuccess);
  cudaDeviceProp properties{};
  ASSERT_EQ(cudaGetDeviceProperties(&properties, index), cudaSuccess);
  EXPECT_EQ(device.index, index);
  EXPECT_EQ(device.compute_major, properties.major);
  EXPECT_EQ(device.compute_minor, properties.minor);
  EXPECT_EQ(device.multiprocessor_count, properties.multiProcessorCount);
  EXPECT_STREQ(device.name, properties.name);
}

// --- the backward plan handle ------------------------------------------------------------------------------

// An H200 described by hand: planning for it needs no GPU.
dash_device h200() {
  dash_device device{};
  device.index = 0;
  device.compute_major = 9;
  device.compute_minor = 0;
  device.multiprocessor_count = 132;
  std::strncpy(device.name, "NVIDIA H200", sizeof(device.name) - 1);
  return device;
}

// A handle value the refusals must leave in the caller's variable.
dash_backward_plan* const kUntouchedPlan = reinterpret_cast<dash_backward_plan*>(uintptr_t{0x1234});

// Creates a plan for h200() (or `device`); fails the test and returns null if that is refused.
dash_backward_plan* create_plan(const AttentionShape& shape, const char* schedule, const dash_device* device = nullptr,
                                int sm_margin = 0) {
  const dash_shape c_shape = to_c(shape);
  const dash_device given = device != nullptr ? *device : h200();
  dash_backward_plan* plan = nullptr;
  const Result r = call([&](char* m, size_t n) {
    return dash_backward_plan_create(&c_shape, nullptr, schedule, sm_margin, &given, &plan, m, n);
  });
  EXPECT_EQ(r.code, DASH_STATUS_OK) << schedule << ": " << r.message;
  EXPECT_EQ(r.message, "");
  return plan;
}

size_t plan_workspace_size(const dash_backward_plan* plan) {
  size_t bytes = kUntouched;
  const Result r = call([&](char* m, size_t n) { return dash_backward_plan_workspace_size(plan, &bytes, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_OK) << r.message;
  return bytes;
}

// What dash_backward_plan_create answered, and the handle variable afterwards (kUntouchedPlan before).
struct CreateResult {
  Result result;
  dash_backward_plan* plan;
};

CreateResult try_create(const dash_shape* shape, const char* schedule, const dash_device* device,
                        bool with_plan_output = true, int sm_margin = 0) {
  dash_backward_plan* plan = kUntouchedPlan;
  const Result r = call([&](char* m, size_t n) {
    return dash_backward_plan_create(shape, nullptr, schedule, sm_margin, device, with_plan_output ? &plan : nullptr, m,
                                     n);
  });
  return {r, plan};
}

TEST(CBackwardPlan, IsMadeForADeviceDescribedByHandWithoutAGpu) {
  dash_backward_plan* plan = create_plan(testing::valid_workspace_shape(), "auto");
  ASSERT_NE(plan, nullptr);
  const size_t bytes = plan_workspace_size(plan);
  EXPECT_NE(bytes, kUntouched);
  EXPECT_GT(bytes, 0u);
  dash_backward_plan_destroy(plan);
}

// Every schedule name is planned, or refused for its preconditions; the workspace follows the shape.
TEST(CBackwardPlan, PlansEveryScheduleWhosePreconditionsHold) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  const dash_device device = h200();
  int planned = 0;
  const std::string names = dash_schedule_names();
  size_t begin = 0;
  while (begin <= names.size()) {
    const size_t end = std::min(names.find(',', begin), names.size());
    const std::string name = names.substr(begin, end - begin);
    begin = end + 1;
    const CreateResult created = try_create(&c_shape, name.c_str(), &device);
    if (created.result.code == DASH_STATUS_SCHEDULE_REJECTED) {
      EXPECT_EQ(created.plan, kUntouchedPlan) << name;
      continue;
    }
    ASSERT_EQ(created.result.code, DASH_STATUS_OK) << name << ": " << created.result.message;
    EXPECT_GT(plan_workspace_size(created.plan), 0u) << name;
    dash_backward_plan_destroy(created.plan);
    ++planned;
  }
  EXPECT_GE(planned, 5) << "auto, ascending, descending, shortest-first and nondeterministic have no preconditions";
}

TEST(CBackwardPlan, WorkspaceGrowsWithTheShape) {
  AttentionShape longer = testing::valid_workspace_shape();
  longer.seqlen_q *= 4;
  dash_backward_plan* small = create_plan(testing::valid_workspace_shape(), "auto");
  dash_backward_plan* large = create_plan(longer, "auto");
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  EXPECT_GT(plan_workspace_size(large), plan_workspace_size(small));
  dash_backward_plan_destroy(small);
  dash_backward_plan_destroy(large);
}

TEST(CBackwardPlan, DestroyingNullDoesNothing) { dash_backward_plan_destroy(nullptr); }

class CBackwardPlanShape : public ::testing::TestWithParam<testing::RejectedShape> {};

TEST_P(CBackwardPlanShape, RefusesTheShapeBeforeAnythingElse) {
  AttentionShape shape = testing::valid_workspace_shape();
  GetParam().bend(shape);
  const dash_shape c_shape = to_c(shape);
  const dash_device device = h200();
  for (const dash_device* given : {&device, static_cast<const dash_device*>(nullptr)}) {
    const CreateResult created = try_create(&c_shape, "auto", given);
    EXPECT_EQ(created.result.code, static_cast<int>(GetParam().code)) << created.result.message;
    EXPECT_EQ(created.result.message, GetParam().message);
    EXPECT_EQ(created.plan, kUntouchedPlan);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CBackwardPlanShape, ::testing::ValuesIn(testing::rejected_shapes()),
                         testing::rejected_shape_name);

TEST(CBackwardPlanCreate, RefusesANullShape) {
  const dash_device device = h200();
  const CreateResult created = try_create(nullptr, "auto", &device);
  EXPECT_EQ(created.result.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(created.result.message, "shape must not be null");
  EXPECT_EQ(created.plan, kUntouchedPlan);
}

TEST(CBackwardPlanCreate, RefusesANullPlanOutput) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  const dash_device device = h200();
  const CreateResult created = try_create(&c_shape, "auto", &device, /*with_plan_output=*/false);
  EXPECT_EQ(created.result.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(created.result.message, "plan must not be null");
}

TEST(CBackwardPlanCreate, RefusesANullSchedule) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  const dash_device device = h200();
  const CreateResult created = try_create(&c_shape, nullptr, &device);
  EXPECT_EQ(created.result.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(created.result.message, "schedule must not be null (pass a name such as \"auto\")");
  EXPECT_EQ(created.plan, kUntouchedPlan);
}

TEST(CBackwardPlanCreate, RefusesAnUnknownSchedule) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  const dash_device device = h200();
  const CreateResult created = try_create(&c_shape, "fastest", &device);
  EXPECT_EQ(created.result.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(created.result.message.rfind("unknown schedule 'fastest' (valid: auto, ascending", 0), 0u)
      << created.result.message;
  EXPECT_EQ(created.plan, kUntouchedPlan);
}

TEST(CBackwardPlanCreate, RefusesANegativeDeviceIndex) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  dash_device device = h200();
  device.index = -1;
  const CreateResult created = try_create(&c_shape, "auto", &device);
  EXPECT_EQ(created.result.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(created.result.message, "device.index must be >= 0, got -1");
  EXPECT_EQ(created.plan, kUntouchedPlan);
}

TEST(CBackwardPlanCreate, RefusesADeviceWithoutMultiprocessors) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  dash_device device = h200();
  device.multiprocessor_count = 0;
  const CreateResult created = try_create(&c_shape, "auto", &device);
  EXPECT_EQ(created.result.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(created.result.message, "device.multiprocessor_count must be > 0, got 0");
  EXPECT_EQ(created.plan, kUntouchedPlan);
}

TEST(CBackwardPlanCreate, RefusesAScheduleWhosePreconditionsFail) {
  AttentionShape shape = testing::valid_workspace_shape();
  shape.causal = false;
  const dash_shape c_shape = to_c(shape);
  const dash_device device = h200();
  const CreateResult created = try_create(&c_shape, "symmetric-shift", &device);
  EXPECT_EQ(created.result.code, DASH_STATUS_SCHEDULE_REJECTED);
  EXPECT_EQ(created.result.message,
            "schedule 'symmetric-shift' cannot run this shape: symmetric-shift needs the causal mask (use shift for "
            "the full mask)");
  EXPECT_EQ(created.plan, kUntouchedPlan);
}

// At d = 192 and 256 the backward's tiles are 64x96 and 64x80: symmetric shift is refused with the rule, dense and
// varlen, and auto plans shortest-first for the same causal shape.
TEST(CBackwardPlanCreate, RefusesSymmetricShiftAtHeadDims192And256WithTheRule) {
  using Tiles = std::pair<int64_t, std::string>;  // head dim, its tiles
  for (const auto& [head_dim, tiles] : {Tiles{192, "64x96"}, Tiles{256, "64x80"}}) {
    SCOPED_TRACE(head_dim);
    AttentionShape shape = testing::valid_workspace_shape();
    shape.head_dim = head_dim;
    shape.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    shape.heads_q = shape.heads_kv = 2;
    shape.seqlen_q = shape.seqlen_k = 1000;
    const dash_shape c_shape = to_c(shape);
    const dash_device device = h200();
    const CreateResult created = try_create(&c_shape, "symmetric-shift", &device);
    EXPECT_EQ(created.result.code, DASH_STATUS_SCHEDULE_REJECTED);
    EXPECT_EQ(created.result.message,
              "schedule 'symmetric-shift' cannot run this shape: symmetric-shift needs block_kv to be a multiple of "
              "block_q, and the backward's tiles at this head dim are " +
                  tiles +
                  " (block_q x block_kv): consecutive key/value tiles' causal ranges would not start a whole number "
                  "of query tiles apart; use shortest-first or descending (auto picks one)");
    EXPECT_EQ(created.plan, kUntouchedPlan);
    dash_backward_plan* plan = kUntouchedPlan;
    const dash_varlen promised = plan_varlen(c_shape, 1);
    const Result varlen = call([&](char* m, size_t n) {
      return dash_backward_plan_create(&c_shape, &promised, "symmetric-shift", 0, &device, &plan, m, n);
    });
    EXPECT_EQ(varlen.code, DASH_STATUS_SCHEDULE_REJECTED);
    EXPECT_NE(varlen.message.find("symmetric-shift needs block_kv to be a multiple of block_q"), std::string::npos)
        << varlen.message;
    EXPECT_EQ(plan, kUntouchedPlan);
    dash_backward_plan* chosen = create_plan(shape, "auto");
    const char* name = nullptr;
    const Result r = call([&](char* m, size_t n) { return dash_backward_plan_schedule(chosen, &name, m, n); });
    ASSERT_EQ(r.code, DASH_STATUS_OK) << r.message;
    EXPECT_STREQ(name, "shortest-first");
    dash_backward_plan_destroy(chosen);
  }
}

// NULL plans for the current device: without a usable one, dash_check_device's answer.
TEST(CBackwardPlanCreate, ForTheCurrentDeviceNeedsOneTheKernelsRunOn) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  const CreateResult created = try_create(&c_shape, "auto", nullptr);
  const Result check = call([](char* m, size_t n) { return dash_check_device(m, n); });
  if (check.code != DASH_STATUS_OK) {
    EXPECT_EQ(created.result.code, check.code);
    EXPECT_EQ(created.result.message, check.message);
    EXPECT_EQ(created.plan, kUntouchedPlan);
    return;
  }
  ASSERT_EQ(created.result.code, DASH_STATUS_OK) << created.result.message;
  EXPECT_GT(plan_workspace_size(created.plan), 0u);
  dash_backward_plan_destroy(created.plan);
}

// --- the SM margin -----------------------------------------------------------------------------------------

int plan_sm_count(const dash_backward_plan* plan) {
  int sms = -1;
  const Result r = call([&](char* m, size_t n) { return dash_backward_plan_sm_count(plan, &sms, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_OK) << r.message;
  return sms;
}

TEST(CBackwardPlanSmMargin, APlanRecordsTheSmCountItWasPlannedFor) {
  for (const int margin : {0, 1, 8, 131}) {
    SCOPED_TRACE(margin);
    dash_backward_plan* plan = create_plan(testing::valid_workspace_shape(), "auto", nullptr, margin);
    ASSERT_NE(plan, nullptr);
    EXPECT_EQ(plan_sm_count(plan), 132 - margin);
    dash_backward_plan_destroy(plan);
  }
}

// The workspace is the shape's: the margin changes how many CTAs run, not what they write.
TEST(CBackwardPlanSmMargin, LeavesTheWorkspaceAlone) {
  dash_backward_plan* all = create_plan(testing::valid_workspace_shape(), "ascending");
  dash_backward_plan* fewer = create_plan(testing::valid_workspace_shape(), "ascending", nullptr, 100);
  ASSERT_NE(all, nullptr);
  ASSERT_NE(fewer, nullptr);
  EXPECT_EQ(plan_workspace_size(all), plan_workspace_size(fewer));
  dash_backward_plan_destroy(all);
  dash_backward_plan_destroy(fewer);
}

TEST(CBackwardPlanSmMargin, RefusesAMarginOutsideZeroToTheSmCount) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  const dash_device device = h200();
  for (const int margin : {132, 133, 1000}) {
    const CreateResult created = try_create(&c_shape, "auto", &device, true, margin);
    EXPECT_EQ(created.result.code, DASH_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(created.result.message,
              "sm_margin must satisfy 0 <= sm_margin < the device's SM count (132 on device 0; at least one SM must "
              "run the kernel), got " +
                  std::to_string(margin));
    EXPECT_EQ(created.plan, kUntouchedPlan);
  }
  // A negative margin is refused before the device is looked at, so also without a GPU for the current device.
  for (const dash_device* given : {&device, static_cast<const dash_device*>(nullptr)}) {
    const CreateResult created = try_create(&c_shape, "auto", given, true, -1);
    EXPECT_EQ(created.result.code, DASH_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(created.result.message,
              "sm_margin must satisfy 0 <= sm_margin < the device's SM count (at least one SM must run the kernel), "
              "got -1");
    EXPECT_EQ(created.plan, kUntouchedPlan);
  }
}

TEST(CBackwardPlanSmMargin, TheQueryNamesAMissingArgument) {
  int sms = -1;
  Result r = call([&](char* m, size_t n) { return dash_backward_plan_sm_count(nullptr, &sms, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "plan must not be null");
  EXPECT_EQ(sms, -1);
  dash_backward_plan* plan = create_plan(testing::valid_workspace_shape(), "auto");
  ASSERT_NE(plan, nullptr);
  r = call([&](char* m, size_t n) { return dash_backward_plan_sm_count(plan, nullptr, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "sm_count must not be null");
  dash_backward_plan_destroy(plan);
}

TEST(CBackwardPlanWorkspaceSize, RefusesANullPlan) {
  size_t bytes = kUntouched;
  const Result r = call([&](char* m, size_t n) { return dash_backward_plan_workspace_size(nullptr, &bytes, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "plan must not be null");
  EXPECT_EQ(bytes, kUntouched);
}

TEST(CBackwardPlanWorkspaceSize, RefusesANullOutput) {
  dash_backward_plan* plan = create_plan(testing::valid_workspace_shape(), "auto");
  ASSERT_NE(plan, nullptr);
  const Result r = call([&](char* m, size_t n) { return dash_backward_plan_workspace_size(plan, nullptr, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "bytes must not be null");
  dash_backward_plan_destroy(plan);
}

// The tensors of a backward call, packed, at fake but aligned device-looking addresses (nothing is dereferenced
// before the device checks, which this machine may not pass).
struct FakeBackwardCall {
  explicit FakeBackwardCall(const AttentionShape& s) : shape(to_c(s)) {
    for (int i = 0; i < kTensors; ++i) {
      const bool key_side = i == 1 || i == 2 || i == 6 || i == 7;  // k, v, dk, dv
      const int64_t seqlen = key_side ? s.seqlen_k : s.seqlen_q;
      const int64_t heads = key_side ? s.heads_kv : s.heads_q;
      tensors[i] = dash_tensor{region(i), {seqlen * heads * s.head_dim, heads * s.head_dim, s.head_dim, 1}};
    }
  }

  // Runs `plan` on this call.
  Result run(const dash_backward_plan* plan) const {
    const dash_tensor* t = tensors.data();
    return call([&](char* m, size_t n) {
      return dash_backward_plan_run(plan, &shape, nullptr, &t[0], &t[1], &t[2], &t[3], &t[4], lse(), &t[5], &t[6],
                                    &t[7], nullptr, 0, nullptr, m, n);
    });
  }

  static constexpr int kTensors = 8;  // q, k, v, out, dout, dq, dk, dv
  dash_shape shape;
  std::array<dash_tensor, kTensors> tensors{};

  static const float* lse() { return static_cast<const float*>(region(kTensors)); }

 private:
  // Each tensor in its own 64 GiB region far above any real allocation.
  static void* region(int i) {
    return reinterpret_cast<void*>((uintptr_t{1} << 44) + static_cast<uintptr_t>(i) * (uintptr_t{1} << 36));
  }
};

TEST(CBackwardPlanRun, RefusesANullPlan) {
  const FakeBackwardCall c(testing::valid_workspace_shape());
  const Result r = c.run(nullptr);
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "plan must not be null");
}

TEST(CBackwardPlanRun, NamesAMissingArgument) {
  dash_backward_plan* plan = create_plan(testing::valid_workspace_shape(), "auto");
  ASSERT_NE(plan, nullptr);
  const FakeBackwardCall c(testing::valid_workspace_shape());
  const dash_tensor* t = c.tensors.data();
  Result r = call([&](char* m, size_t n) {
    return dash_backward_plan_run(plan, nullptr, nullptr, &t[0], &t[1], &t[2], &t[3], &t[4], nullptr, &t[5], &t[6],
                                  &t[7], nullptr, 0, nullptr, m, n);
  });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "shape must not be null");
  r = call([&](char* m, size_t n) {
    return dash_backward_plan_run(plan, &c.shape, nullptr, &t[0], &t[1], &t[2], &t[3], &t[4], nullptr, nullptr, &t[6],
                                  &t[7], nullptr, 0, nullptr, m, n);
  });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "dq must not be null");
  dash_backward_plan_destroy(plan);
}

// The shape is checked against the plan before the arguments themselves: a null data pointer waits its turn.
TEST(CBackwardPlanRun, RefusesAShapeThatIsNotThePlansNamingTheField) {
  dash_backward_plan* plan = create_plan(testing::valid_workspace_shape(), "auto");
  ASSERT_NE(plan, nullptr);
  AttentionShape longer = testing::valid_workspace_shape();
  longer.seqlen_q = 512;
  FakeBackwardCall c(longer);
  c.tensors[0].data = nullptr;
  const Result r = c.run(plan);
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "shape.seqlen_q is 512, but the plan was made for 256 (make a plan for this call)");
  dash_backward_plan_destroy(plan);
}

// A call of the plan's shape meets the library's next checks: the kernel lookup, the device, the pointers.
TEST(CBackwardPlanRun, AMatchingCallGetsPastThePlanChecks) {
  const AttentionShape shape = testing::valid_workspace_shape();
  dash_backward_plan* plan = create_plan(shape, "auto");
  ASSERT_NE(plan, nullptr);
  const Result r = FakeBackwardCall(shape).run(plan);
  const Result check = call([](char* m, size_t n) { return dash_check_device(m, n); });
  if (dash_kernel_available(shape.head_dim, static_cast<int>(shape.dtype), 0) == 0) {
    EXPECT_EQ(r.code, DASH_STATUS_NOT_AVAILABLE) << r.message;
  } else if (check.code != DASH_STATUS_OK) {
    EXPECT_EQ(r.code, check.code);
    EXPECT_EQ(r.message, check.message);
  } else {
    EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT) << r.message;
    EXPECT_EQ(r.message.find("but the plan was made for"), std::string::npos) << r.message;
  }
  dash_backward_plan_destroy(plan);
}

// The workspace is written: a run whose workspace overlaps an output (or any tensor) is refused naming both, before
// the device is asked; the same run with the workspace elsewhere gets past that check.
TEST(CBackwardPlanRun, RefusesAWorkspaceOverlappingAnOutputOrAnInput) {
  const AttentionShape shape = testing::valid_workspace_shape();
  dash_backward_plan* plan = create_plan(shape, "auto");
  ASSERT_NE(plan, nullptr);
  const FakeBackwardCall c(shape);
  const dash_tensor* t = c.tensors.data();
  const auto run_with = [&](void* workspace) {
    return call([&](char* m, size_t n) {
      return dash_backward_plan_run(plan, &c.shape, nullptr, &t[0], &t[1], &t[2], &t[3], &t[4], c.lse(), &t[5], &t[6],
                                    &t[7], workspace, plan_workspace_size(plan), nullptr, m, n);
    });
  };
  for (const auto& [index, name] : {std::pair{6, "dk"}, std::pair{0, "q"}}) {
    const Result r = run_with(static_cast<char*>(t[index].data) + 4096);
    EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT) << r.message;
    EXPECT_NE(r.message.find(std::string("workspace overlaps ") + name), std::string::npos) << r.message;
  }
  // Negative control: a workspace in a region of its own is not refused for overlap.
  const Result apart = run_with(reinterpret_cast<void*>(uintptr_t{1} << 46));
  EXPECT_EQ(apart.message.find("overlaps"), std::string::npos) << apart.message;
  dash_backward_plan_destroy(plan);
}

TEST(CForward, RefusesAWorkspaceOverlappingOut) {
  const AttentionShape shape = testing::valid_workspace_shape();
  const FakeBackwardCall c(shape);  // its q, k, v and out serve the forward
  const dash_tensor* t = c.tensors.data();
  float* lse = const_cast<float*>(c.lse());
  const Result r = call([&](char* m, size_t n) {
    return dash_forward(&c.shape, nullptr, &t[0], &t[1], &t[2], &t[3], c.shape.dtype, lse, 0, t[3].data, 64, nullptr, m,
                        n);
  });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT) << r.message;
  EXPECT_NE(r.message.find("workspace overlaps out"), std::string::npos) << r.message;
}

// out_dtype is the shape's dtype or DASH_DTYPE_FP32; anything else is refused naming it and the rule, before the
// tensors are looked at. A float32 out is validated in its own elements: its strides are multiples of 4, and a
// workspace overlapping its wider span is refused.
TEST(CForward, OutDtypeIsTheShapesOrFp32) {
  const AttentionShape shape = testing::valid_workspace_shape();
  const FakeBackwardCall c(shape);
  const dash_tensor* t = c.tensors.data();
  float* lse = const_cast<float*>(c.lse());
  const auto forward_with = [&](int out_dtype, const dash_tensor& out, void* workspace) {
    return call([&](char* m, size_t n) {
      return dash_forward(&c.shape, nullptr, &t[0], &t[1], &t[2], &out, out_dtype, lse, 0, workspace, 64, nullptr, m,
                          n);
    });
  };
  const int other = c.shape.dtype == DASH_DTYPE_BF16 ? DASH_DTYPE_FP16 : DASH_DTYPE_BF16;
  for (const int bad : {other, 3, -1}) {
    const Result r = forward_with(bad, t[3], nullptr);
    EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT) << r.message;
    EXPECT_EQ(r.message, "out_dtype must be shape->dtype (" + std::to_string(c.shape.dtype) +
                             ") or DASH_DTYPE_FP32 (2, the output before its rounding to shape->dtype), got " +
                             std::to_string(bad));
  }
  // An fp32 out twice as wide: its strides in float elements; the workspace right after its bf16 extent overlaps it.
  dash_tensor wide = t[3];
  const int64_t bf16_bytes = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim * 2;
  void* after_bf16_extent = static_cast<char*>(wide.data) + bf16_bytes + 4096;
  Result r = forward_with(DASH_DTYPE_FP32, wide, after_bf16_extent);
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT) << r.message;
  EXPECT_NE(r.message.find("workspace overlaps out"), std::string::npos) << r.message;
  // Negative control: the same workspace is apart from a bf16 out.
  r = forward_with(c.shape.dtype, wide, after_bf16_extent);
  EXPECT_EQ(r.message.find("overlaps"), std::string::npos) << r.message;
  // A stride of 8 bf16 elements is 16 bytes; as float32 elements, 8 is 32 bytes and 6 (24 bytes) is refused.
  wide.strides[2] = 6;
  r = forward_with(DASH_DTYPE_FP32, wide, nullptr);
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT) << r.message;
  EXPECT_EQ(r.message, "out.strides.head must be a multiple of 4 elements (16 bytes, a TMA requirement), got 6");
}

// --- the merge of partial results (dash_merge_partial, ABI 12) ----------------------------------------------

// A merge of a block of 48 rows into 128 accumulator rows, packed float32 arrays at fake device-looking addresses.
struct FakeMerge {
  FakeMerge() {
    args.batch = 2;
    args.rows = 48;
    args.seqlen = 128;
    args.heads = 4;
    args.head_dim = 64;
    args.part_out = dash_tensor{region(0), {48 * 4 * 64, 4 * 64, 64, 1}};
    args.part_lse = static_cast<const float*>(region(1));
    args.part_lse_strides[0] = 4 * 48;
    args.part_lse_strides[1] = 48;
    args.part_lse_strides[2] = 1;
    args.acc_out = dash_tensor{region(2), {128 * 4 * 64, 4 * 64, 64, 1}};
    args.acc_lse = static_cast<float*>(region(3));
    args.acc_lse_strides[0] = 4 * 128;
    args.acc_lse_strides[1] = 128;
    args.acc_lse_strides[2] = 1;
    args.row_index = nullptr;
    args.row_offset = 80;
  }

  Result run() const {
    return call([&](char* m, size_t n) { return dash_merge_partial(&args, nullptr, m, n); });
  }

  dash_merge_args args{};

  static void* region(int i) {
    return reinterpret_cast<void*>((uintptr_t{1} << 44) + static_cast<uintptr_t>(i) * (uintptr_t{1} << 36));
  }
};

TEST(CMerge, RefusesEachBrokenArgumentNamingIt) {
  struct Case {
    const char* what;
    void (*bend)(dash_merge_args&);
    int code;
    const char* message;
  };
  const Case cases[] = {
      {"rows 0", [](dash_merge_args& a) { a.rows = 0; }, DASH_STATUS_INVALID_ARGUMENT, "rows must be > 0, got 0"},
      {"head_dim 0", [](dash_merge_args& a) { a.head_dim = 0; }, DASH_STATUS_INVALID_ARGUMENT,
       "head_dim must be > 0, got 0"},
      {"head_dim past the limit", [](dash_merge_args& a) { a.head_dim = 512; }, DASH_STATUS_NOT_SUPPORTED,
       "head_dim must be <= 256 (the limit of the attention calls), got 512"},
      {"rows past seqlen", [](dash_merge_args& a) { a.rows = 129; }, DASH_STATUS_INVALID_ARGUMENT,
       "rows must be <= seqlen (each block row goes to an accumulator row of its own), got rows = 129, seqlen = 128"},
      {"offset past the end", [](dash_merge_args& a) { a.row_offset = 81; }, DASH_STATUS_INVALID_ARGUMENT,
       "row_offset must satisfy 0 <= row_offset <= seqlen - rows (block rows row_offset .. row_offset + rows - 1 of "
       "the accumulators), got 81 with rows = 48, seqlen = 128"},
      {"negative offset", [](dash_merge_args& a) { a.row_offset = -1; }, DASH_STATUS_INVALID_ARGUMENT,
       "row_offset must satisfy 0 <= row_offset <= seqlen - rows (block rows row_offset .. row_offset + rows - 1 of "
       "the accumulators), got -1 with rows = 48, seqlen = 128"},
      {"offset with an index",
       [](dash_merge_args& a) { a.row_index = static_cast<const int32_t*>(FakeMerge::region(4)); },
       DASH_STATUS_INVALID_ARGUMENT,
       "row_offset must be 0 when row_index is given (row_index names every row), got 80"},
      {"misaligned index",
       [](dash_merge_args& a) {
         a.row_offset = 0;
         a.row_index = reinterpret_cast<const int32_t*>(static_cast<char*>(FakeMerge::region(4)) + 2);
       },
       DASH_STATUS_INVALID_ARGUMENT, nullptr},
      {"null part_out", [](dash_merge_args& a) { a.part_out.data = nullptr; }, DASH_STATUS_INVALID_ARGUMENT,
       "part_out must not be null"},
      {"null acc_lse", [](dash_merge_args& a) { a.acc_lse = nullptr; }, DASH_STATUS_INVALID_ARGUMENT,
       "acc_lse must not be null"},
      {"strided dim", [](dash_merge_args& a) { a.acc_out.strides[3] = 2; }, DASH_STATUS_INVALID_ARGUMENT,
       "acc_out.strides.dim must be 1 (the last dimension must be contiguous), got 2"},
      {"negative lse stride", [](dash_merge_args& a) { a.part_lse_strides[1] = -48; }, DASH_STATUS_INVALID_ARGUMENT,
       "part_lse_strides.head must be >= 0, got -48"},
      {"accumulator overlapping itself", [](dash_merge_args& a) { a.acc_out.strides[1] = 32; },
       DASH_STATUS_INVALID_ARGUMENT,
       "acc_out.strides: the (B, S, H, D) layout of acc_out overlaps itself: the seq stride 32 is less than the dim "
       "stride 1 times its extent 64"},
      {"accumulator LSE overlapping itself", [](dash_merge_args& a) { a.acc_lse_strides[1] = 0; },
       DASH_STATUS_INVALID_ARGUMENT, nullptr},
      {"accumulator over the block", [](dash_merge_args& a) { a.acc_lse = const_cast<float*>(a.part_lse); },
       DASH_STATUS_INVALID_ARGUMENT, nullptr},
  };
  for (const Case& c : cases) {
    FakeMerge merge;
    c.bend(merge.args);
    const Result r = merge.run();
    EXPECT_EQ(r.code, c.code) << c.what << ": " << r.message;
    if (c.message != nullptr) {
      EXPECT_EQ(r.message, c.message) << c.what;
    }
  }
  // The ones without an exact message above name their argument and rule.
  FakeMerge merge;
  merge.args.acc_lse = const_cast<float*>(merge.args.part_lse);
  EXPECT_NE(merge.run().message.find("acc_lse overlaps part_lse"), std::string::npos);
  merge = FakeMerge();
  merge.args.acc_lse_strides[1] = 0;
  EXPECT_NE(merge.run().message.find("layout of acc_lse overlaps itself: the head stride is 0"), std::string::npos);
  const Result missing = call([](char* m, size_t n) { return dash_merge_partial(nullptr, nullptr, m, n); });
  EXPECT_EQ(missing.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(missing.message, "args must not be null");
}

// Valid arguments get past validation: a build without kernels says so, one with them goes on to the device; an index
// of rows instead of an offset too. A broadcast block (stride 0) is an input, so it may overlap itself. On a machine
// with a device, the first check that needs it refuses the fake addresses as memory unknown to CUDA: every rule
// before it has passed.
TEST(CMerge, ValidArgumentsReachTheKernelOrItsAbsence) {
  FakeMerge merge;
  merge.args.part_lse_strides[1] = 0;
  for (const bool indexed : {false, true}) {
    if (indexed) {
      merge.args.row_offset = 0;
      merge.args.row_index = static_cast<const int32_t*>(FakeMerge::region(4));
    }
    const Result r = merge.run();
    if (dash_merge_kernel_available() == 0) {
      EXPECT_EQ(r.code, DASH_STATUS_NOT_AVAILABLE) << r.message;
      EXPECT_EQ(r.message, "this build has no merge kernel (built without DASH_BUILD_KERNELS)");
    } else {
      EXPECT_NE(r.code, DASH_STATUS_NOT_AVAILABLE) << r.message;
      if (r.code == DASH_STATUS_INVALID_ARGUMENT) {
        EXPECT_NE(r.message.find("is host memory unknown to CUDA"), std::string::npos) << r.message;
      }
    }
  }
}

// C has no bool: a flag other than 0 or 1 (uninitialized memory, another field's value) is refused naming it.
TEST(CFlags, AFlagOtherThanZeroOrOneIsRefusedNamingIt) {
  const AttentionShape shape = testing::valid_workspace_shape();
  size_t bytes = kUntouched;
  for (const int bad : {2, -1, 0x7f3a}) {
    dash_shape c_shape = to_c(shape);
    c_shape.causal = bad;
    Result r = call([&](char* m, size_t n) { return dash_forward_workspace_size(&c_shape, &bytes, m, n); });
    EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(r.message, "shape.causal must be 0 or 1 (a flag), got " + std::to_string(bad));
    c_shape = to_c(shape);
    c_shape.windowed = bad;
    r = call([&](char* m, size_t n) { return dash_backward_workspace_size(&c_shape, "auto", &bytes, m, n); });
    EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(r.message, "shape.windowed must be 0 or 1 (a flag), got " + std::to_string(bad));
  }
  EXPECT_EQ(bytes, kUntouched);
  const dash_shape c_shape = to_c(shape);
  const dash_device device = h200();
  dash_backward_plan* plan = nullptr;
  dash_varlen bad = plan_varlen(c_shape, 2);
  Result r = call(
      [&](char* m, size_t n) { return dash_backward_plan_create(&c_shape, &bad, "auto", 0, &device, &plan, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "varlen.keys_within_queries must be 0 or 1 (a flag), got 2");
  EXPECT_EQ(plan, nullptr);
  // Negative control: 0 and 1 are taken.
  for (const int promise : {0, 1}) {
    const dash_varlen good = plan_varlen(c_shape, promise);
    r = call(
        [&](char* m, size_t n) { return dash_backward_plan_create(&c_shape, &good, "auto", 0, &device, &plan, m, n); });
    EXPECT_EQ(r.code, DASH_STATUS_OK) << r.message;
    dash_backward_plan_destroy(plan);
    plan = nullptr;
  }
  dash_tensor t{};
  const dash_varlen varlen{reinterpret_cast<const int32_t*>(uintptr_t{1} << 44),
                           reinterpret_cast<const int32_t*>(uintptr_t{1} << 44), 8, 8, 3};
  r = call([&](char* m, size_t n) {
    return dash_forward(&c_shape, &varlen, &t, &t, &t, &t, c_shape.dtype, nullptr, 0, nullptr, 0, nullptr, m, n);
  });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "varlen.keys_within_queries must be 0 or 1 (a flag), got 3");
}

// --- packed varlen batches (dash_varlen, ABI 6) ------------------------------------------------------------

TEST(CAbi, TheVersionIsFourteenAndItsStatusesAreNamed) {
  EXPECT_EQ(dash_abi_version(), 14);
  EXPECT_STREQ(dash_status_name(DASH_STATUS_WAIT_TIMEOUT), "wait-timeout");
  EXPECT_STREQ(dash_status_name(DASH_STATUS_SEQLEN_EXCEEDS_MAX), "seqlen-exceeds-max");
  EXPECT_STREQ(dash_status_name(DASH_STATUS_ROW_INDEX_INVALID), "row-index-invalid");
  EXPECT_STREQ(dash_status_name(DASH_STATUS_CU_SEQLENS_INVALID), "cu-seqlens-invalid");
}

// Varlen kernels are an instance's (DASH_VARLEN_KERNELS): none without the instance, plain or softcap.
TEST(CVarlen, VarlenKernelsComeWithTheirInstances) {
  for (const int64_t head_dim : {64, 80, 96, 128, 192, 256}) {
    for (const int dtype : {DASH_DTYPE_BF16, DASH_DTYPE_FP16}) {
      if (dash_kernel_available(head_dim, dtype, 0) == 0) {
        EXPECT_EQ(dash_kernel_available(head_dim, dtype, DASH_KERNEL_VARLEN), 0) << head_dim << " " << dtype;
      }
      if (dash_kernel_available(head_dim, dtype, DASH_KERNEL_SOFTCAP) == 0) {
        EXPECT_EQ(dash_kernel_available(head_dim, dtype, DASH_KERNEL_SOFTCAP | DASH_KERNEL_VARLEN), 0)
            << head_dim << " " << dtype;
      }
    }
  }
}

// A feature bit the library does not know is answered 0 whatever the known bits alone answer: no build has a kernel
// of a feature it does not know. The known combinations are each asked as well (a build with kernels answers 1 for
// some of them, so there the unknown bits' 0 is not the answer of every query).
TEST(CKernelAvailable, AnswersZeroForAnUnknownFeatureBit) {
  constexpr int kKnown[] = {0, DASH_KERNEL_SOFTCAP, DASH_KERNEL_VARLEN, DASH_KERNEL_SOFTCAP | DASH_KERNEL_VARLEN};
  int available = 0;
  for (const int64_t head_dim : {64, 96, 128, 192, 256}) {
    for (const int dtype : {DASH_DTYPE_BF16, DASH_DTYPE_FP16}) {
      for (const int known : kKnown) {
        available += dash_kernel_available(head_dim, dtype, known);
        for (const int unknown : {4, 8, 1 << 30, -1, static_cast<int>(0x80000000u)}) {
          EXPECT_EQ(dash_kernel_available(head_dim, dtype, known | unknown), 0)
              << head_dim << " " << dtype << " " << known << " " << unknown;
        }
      }
    }
  }
  RecordProperty("known_feature_combinations_available", available);
}

dash_backward_plan* kUntouchedVarlenPlan = reinterpret_cast<dash_backward_plan*>(uintptr_t{0x5a5a});

TEST(CVarlenPlan, IsMadeForADeviceDescribedByHandAndSaysSo) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  const dash_device device = h200();
  dash_backward_plan* plan = nullptr;
  const dash_varlen varlen = plan_varlen(c_shape, /*keys_within_queries=*/0);  // cu_seqlens NULL: not read
  Result r = call(
      [&](char* m, size_t n) { return dash_backward_plan_create(&c_shape, &varlen, "auto", 0, &device, &plan, m, n); });
  ASSERT_EQ(r.code, DASH_STATUS_OK) << r.message;
  int is_varlen = -1;
  r = call([&](char* m, size_t n) { return dash_backward_plan_is_varlen(plan, &is_varlen, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_OK) << r.message;
  EXPECT_EQ(is_varlen, 1);
  EXPECT_GT(plan_workspace_size(plan), 0u);
  dash_backward_plan_destroy(plan);
  dash_backward_plan* dense = create_plan(testing::valid_workspace_shape(), "auto");
  r = call([&](char* m, size_t n) { return dash_backward_plan_is_varlen(dense, &is_varlen, m, n); });
  EXPECT_EQ(is_varlen, 0);
  dash_backward_plan_destroy(dense);
}

TEST(CVarlenPlan, RefusesTheShiftSchedulesWithoutThePromiseLeavingTheHandle) {
  AttentionShape shape = testing::valid_workspace_shape();
  shape.seqlen_k = shape.seqlen_q;
  const dash_shape c_shape = to_c(shape);
  const dash_device device = h200();
  dash_backward_plan* plan = kUntouchedVarlenPlan;
  const dash_varlen varlen = plan_varlen(c_shape, 0);
  const Result r = call([&](char* m, size_t n) {
    return dash_backward_plan_create(&c_shape, &varlen, "symmetric-shift", 0, &device, &plan, m, n);
  });
  EXPECT_EQ(r.code, DASH_STATUS_SCHEDULE_REJECTED);
  EXPECT_NE(r.message.find("keys_within_queries"), std::string::npos) << r.message;
  EXPECT_EQ(plan, kUntouchedVarlenPlan);
}

// The schedule a varlen plan of `schedule` runs under the promise and the totals (filling the maxima or a row short),
// or the failing status's name.
std::string varlen_plan_schedule(const AttentionShape& shape, int promise, bool fill, const char* schedule) {
  const dash_shape c_shape = to_c(shape);
  const dash_device device = h200();
  const dash_varlen varlen = plan_varlen(c_shape, promise, fill);
  dash_backward_plan* plan = nullptr;
  Result r = call([&](char* m, size_t n) {
    return dash_backward_plan_create(&c_shape, &varlen, schedule, 0, &device, &plan, m, n);
  });
  if (r.code != DASH_STATUS_OK) return dash_status_name(r.code);
  const char* name = nullptr;
  r = call([&](char* m, size_t n) { return dash_backward_plan_schedule(plan, &name, m, n); });
  dash_backward_plan_destroy(plan);
  return r.code == DASH_STATUS_OK ? std::string(name) : dash_status_name(r.code);
}

TEST(CVarlenPlan, TheHintReachesAutoAndLeavesExplicitSchedules) {
  AttentionShape full = testing::valid_workspace_shape();
  full.seqlen_k = full.seqlen_q;
  full.causal = false;
  EXPECT_EQ(varlen_plan_schedule(full, 1, /*fill=*/true, "auto"), "shift");
  EXPECT_EQ(varlen_plan_schedule(full, 1, /*fill=*/false, "auto"), "shortest-first");
  EXPECT_EQ(varlen_plan_schedule(full, 1, /*fill=*/false, "shift"), "shift");
  AttentionShape causal = full;
  causal.causal = true;
  EXPECT_EQ(varlen_plan_schedule(causal, 1, false, "auto"), varlen_plan_schedule(causal, 1, true, "auto"));
}

// A plan's totals are rows a call could have: each must be > 0, named when it is not; the handle is left alone.
TEST(CVarlenPlan, RefusesTotalsThatAreNotPositiveNamingThem) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  const dash_device device = h200();
  for (const int64_t bad : {int64_t{0}, int64_t{-3}}) {
    for (const bool query_side : {true, false}) {
      dash_varlen varlen = plan_varlen(c_shape, 0);
      (query_side ? varlen.total_q : varlen.total_k) = bad;
      dash_backward_plan* plan = kUntouchedPlan;
      const Result r = call([&](char* m, size_t n) {
        return dash_backward_plan_create(&c_shape, &varlen, "auto", 0, &device, &plan, m, n);
      });
      EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
      EXPECT_EQ(r.message, std::string(query_side ? "varlen.total_q" : "varlen.total_k") +
                               " must be > 0 (the packed rows; a varlen plan's auto reads its hint from them), got " +
                               std::to_string(bad));
      EXPECT_EQ(plan, kUntouchedPlan);
    }
  }
}

TEST(CVarlenPlan, TheScheduleQueryNamesAMissingArgument) {
  const char* name = nullptr;
  Result r = call([&](char* m, size_t n) { return dash_backward_plan_schedule(nullptr, &name, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "plan must not be null");
  dash_backward_plan* plan = create_plan(testing::valid_workspace_shape(), "ascending");
  r = call([&](char* m, size_t n) { return dash_backward_plan_schedule(plan, nullptr, m, n); });
  EXPECT_EQ(r.message, "schedule must not be null");
  r = call([&](char* m, size_t n) { return dash_backward_plan_schedule(plan, &name, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_OK) << r.message;
  EXPECT_STREQ(name, "ascending");
  dash_backward_plan_destroy(plan);
}

// A dash_varlen without offsets would make a varlen call a dense one: refused, pointing at NULL for a dense batch.
TEST(CVarlenCall, RefusesAVarlenWithoutOffsets) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  dash_tensor t{};
  const dash_varlen empty{};
  const std::string expected =
      "varlen.cu_seqlens_q and varlen.cu_seqlens_k must not both be null (pass varlen NULL for a dense batch)";
  Result r = call([&](char* m, size_t n) {
    return dash_forward(&c_shape, &empty, &t, &t, &t, &t, c_shape.dtype, nullptr, 0, nullptr, 0, nullptr, m, n);
  });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, expected);
  r = call([&](char* m, size_t n) {
    return dash_backward(&c_shape, &empty, &t, &t, &t, &t, &t, nullptr, &t, &t, &t, "auto", 0, nullptr, 0, nullptr, m,
                         n);
  });
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, expected);
}

// A varlen plan made without offsets, run with the same maxima, promise and a packed batch's offsets.
dash_backward_plan* offsetless_varlen_plan(const dash_shape& c_shape, int promise) {
  const dash_device device = h200();
  const dash_varlen varlen = plan_varlen(c_shape, promise);
  dash_backward_plan* plan = nullptr;
  const Result r = call(
      [&](char* m, size_t n) { return dash_backward_plan_create(&c_shape, &varlen, "auto", 0, &device, &plan, m, n); });
  EXPECT_EQ(r.code, DASH_STATUS_OK) << r.message;
  return plan;
}

// The packed tensors of a varlen call of `c_shape` (its maxima), at fake device-looking addresses, and its offsets.
struct FakeVarlenCall {
  explicit FakeVarlenCall(const dash_shape& s, int promise) : shape(s) {
    const int64_t total_q = s.batch * s.seqlen_q;
    const int64_t total_k = s.batch * s.seqlen_k;
    for (int i = 0; i < kTensors; ++i) {
      const bool key_side = i == 1 || i == 2 || i == 6 || i == 7;  // k, v, dk, dv
      const int64_t heads = key_side ? s.heads_kv : s.heads_q;
      tensors[i] = dash_tensor{address(i), {0, heads * s.head_dim, s.head_dim, 1}};
    }
    const auto* offsets = static_cast<const int32_t*>(address(kTensors + 1));
    varlen = dash_varlen{offsets, offsets, total_q, total_k, promise};
  }

  Result run(const dash_backward_plan* plan, const dash_varlen* with) const {
    const dash_tensor* t = tensors.data();
    const auto* lse = static_cast<const float*>(address(kTensors));
    return call([&](char* m, size_t n) {
      return dash_backward_plan_run(plan, &shape, with, &t[0], &t[1], &t[2], &t[3], &t[4], lse, &t[5], &t[6], &t[7],
                                    nullptr, 0, nullptr, m, n);
    });
  }

  static constexpr int kTensors = 8;  // q, k, v, out, dout, dq, dk, dv
  dash_shape shape;
  dash_varlen varlen{};
  std::array<dash_tensor, kTensors> tensors{};

 private:
  static void* address(int i) {
    return reinterpret_cast<void*>((uintptr_t{1} << 44) + static_cast<uintptr_t>(i) * (uintptr_t{1} << 36));
  }
};

TEST(CVarlenRun, ADenseRunOfAVarlenPlanIsRefusedNamingVarlen) {
  const AttentionShape shape = testing::valid_workspace_shape();
  dash_backward_plan* plan = offsetless_varlen_plan(to_c(shape), 0);
  ASSERT_NE(plan, nullptr);
  const Result r = FakeBackwardCall(shape).run(plan);
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message,
            "varlen must not be NULL: the plan is a varlen plan (made with a dash_varlen), and runs packed batches "
            "only");
  dash_backward_plan_destroy(plan);
}

TEST(CVarlenRun, AVarlenRunOfADensePlanIsRefusedNamingVarlen) {
  const AttentionShape shape = testing::valid_workspace_shape();
  dash_backward_plan* plan = create_plan(shape, "auto");
  ASSERT_NE(plan, nullptr);
  const FakeVarlenCall c(to_c(shape), 0);
  const Result r = c.run(plan, &c.varlen);
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(r.message,
            "varlen must be NULL: the plan is a dense plan (made with varlen NULL), and runs dense batches only");
  dash_backward_plan_destroy(plan);
}

// The run's promise must be the plan's, named by the C++ API's comparison.
TEST(CVarlenRun, ARunWithAnotherPromiseIsRefusedNamingIt) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  dash_backward_plan* plan = offsetless_varlen_plan(c_shape, 1);
  ASSERT_NE(plan, nullptr);
  const FakeVarlenCall c(c_shape, 0);
  const Result r = c.run(plan, &c.varlen);
  EXPECT_EQ(r.code, DASH_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(r.message.find("varlen.keys_within_queries"), std::string::npos) << r.message;
  dash_backward_plan_destroy(plan);
}

// Negative control of the three above: a varlen run of the offsetless plan's kind and promise gets past every plan
// check, to the kernel lookup, the device or the pointers.
TEST(CVarlenRun, AMatchingRunOfAnOffsetlessPlanGetsPastThePlanChecks) {
  const dash_shape c_shape = to_c(testing::valid_workspace_shape());
  for (const int promise : {0, 1}) {
    dash_backward_plan* plan = offsetless_varlen_plan(c_shape, promise);
    ASSERT_NE(plan, nullptr);
    const FakeVarlenCall c(c_shape, promise);
    const Result r = c.run(plan, &c.varlen);
    EXPECT_NE(r.code, DASH_STATUS_OK);  // fake addresses never run
    EXPECT_EQ(r.message.find("varlen must"), std::string::npos) << r.message;
    EXPECT_EQ(r.message.find("but the plan was made for"), std::string::npos) << r.message;
    dash_backward_plan_destroy(plan);
  }
}

}  // namespace
}  // namespace dash
