// Tests of the C ABI (libdash_attn_c.so, src/capi/dash_c.h) on the host path: the workspace-size queries
// refuse every shape of api/rejected_shapes.hpp with the C++ API's code and message before any device query,
// missing arguments are named, the device check tells "no driver" apart from other failures, and the
// diagnostic queries (versions, device description) agree with what this process's own CUDA runtime reports.
// Runs without a GPU; the test links the shared library exactly as a C caller would.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <regex>
#include <string>

#include "dash_c.h"
#include "rejected_shapes.hpp"

namespace dash {
namespace {

constexpr size_t kMessageBytes = 4096;
// A sentinel the queries must leave alone when they refuse.
constexpr size_t kUntouched = 12345;

dash_shape to_c(const AttentionShape& s) {
  return dash_shape{s.batch,    s.seqlen_q, s.seqlen_k,       s.heads_q,          s.heads_kv,
                    s.head_dim, static_cast<int>(s.dtype), s.softmax_scale, s.causal ? 1 : 0};
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

}  // namespace
}  // namespace dash
