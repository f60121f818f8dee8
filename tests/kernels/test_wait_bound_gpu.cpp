// GPU test of the bounded ordering wait (wait_semaphore, src/kernels/sm90/primitives.cuh): a dQ ordering wait
// that can never end must end the launch with an error, within its bound, instead of hanging the stream; one
// whose semaphore holds the awaited rank must pass (the negative control, run first).
//
// A trap leaves the CUDA context unusable, so the waits run in a child process: WaitBound runs this binary again
// with only WaitBoundChild selected and DASH_WAIT_BOUND_CHILD set, under `timeout`, and reads what it printed.
// WaitBoundChild skips when run any other way. Both skip, saying why, without a Hopper GPU or without the probe.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dash/attention.hpp"
#include "wait_probe.hpp"

namespace dash {
namespace {

constexpr const char* kChildVariable = "DASH_WAIT_BOUND_CHILD";
constexpr long long kShortBoundNs = 2'000'000;  // 2 ms: the stuck wait's bound
constexpr long long kLongBoundNs = 5'000'000'000LL;
constexpr double kTrapWithinSeconds = 10.0;     // the stuck launch must end this soon (bound, trap, teardown)
constexpr int kChildTimeoutSeconds = 120;       // `timeout` ends a child that hangs anyway

// Empty when the probe is built and the current device is a Hopper GPU (the API's own device check).
std::string skip_reason() {
  if (const std::string why = testing::wait_probe_unavailable_reason(); !why.empty()) return why;
  if (Status s = check_current_device(); !s.ok()) return "no Hopper GPU: " + s.message();
  return {};
}

TEST(WaitBoundChild, ARankedWaitPassesAndAStuckOneEndsTheLaunchWithAnError) {
  if (std::getenv(kChildVariable) == nullptr) {
    GTEST_SKIP() << "runs only as WaitBound's child process (a trap ends the CUDA context)";
  }
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_EQ(testing::semaphore_wait_outcome(/*value=*/3, /*expected=*/3, kLongBoundNs), "cudaSuccess");
  const auto begin = std::chrono::steady_clock::now();
  const std::string stuck = testing::semaphore_wait_outcome(/*value=*/0, /*expected=*/1, kShortBoundNs);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::printf("stuck wait ended with %s after %.3f s\n", stuck.c_str(), seconds);
  EXPECT_NE(stuck, "cudaSuccess");
  EXPECT_LT(seconds, kTrapWithinSeconds);
}

TEST(WaitBound, AnOrderingWaitThatCannotEndBecomesAnErrorNotAHang) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  std::array<char, 4096> self{};
  const ssize_t length = readlink("/proc/self/exe", self.data(), self.size() - 1);
  ASSERT_GT(length, 0) << "cannot find this test binary to run the child";
  const std::string command = std::string(kChildVariable) + "=1 timeout " + std::to_string(kChildTimeoutSeconds) +
                              " '" + std::string(self.data(), static_cast<size_t>(length)) +
                              "' --gtest_filter=WaitBoundChild.* 2>&1";
  FILE* child = popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr) << command;
  std::string output;
  std::array<char, 512> chunk{};
  while (std::fgets(chunk.data(), static_cast<int>(chunk.size()), child) != nullptr) output += chunk.data();
  const int status = pclose(child);
  EXPECT_EQ(status, 0) << "the child failed or hung (timeout exits 124):\n" << output;
  EXPECT_NE(output.find("[  PASSED  ] 1 test"), std::string::npos) << output;
  EXPECT_NE(output.find("stuck wait ended with"), std::string::npos) << output;
}

}  // namespace
}  // namespace dash
