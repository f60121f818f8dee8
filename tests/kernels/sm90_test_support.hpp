// What the GPU tests in the test_sm90 binary share: the kernel instance a test runs, the shape it builds from
// a case, why it must skip (no kernels, no Hopper GPU, instance not compiled), the watchdog that turns a
// hang into an exit with a message instead of a stuck CI job, the forward run on poisoned outputs, and the
// readers of what a run wrote. Header-only: each test file keeps its own cases.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "harness/device_harness.hpp"
#include "schedule/tile_config.hpp"

namespace dash::gpu_testing {

inline constexpr double kWatchdogSeconds = 60.0;

struct Instance {
  int head_dim;
  DType dtype;
};

inline AttentionShape make_attention_shape(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                           int64_t heads_kv, bool causal, const Instance& inst) {
  AttentionShape s;
  s.batch = batch;
  s.seqlen_q = seqlen_q;
  s.seqlen_k = seqlen_k;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = inst.head_dim;
  s.dtype = inst.dtype;
  s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(inst.head_dim));
  s.causal = causal;
  return s;
}

// Empty when this build has the instance and the current device is a Hopper GPU; otherwise why not.
inline std::string skip_reason(const Instance& inst) {
  if (!kernels_available()) return "built without kernels (DASH_BUILD_KERNELS=OFF)";
  if (Status s = check_current_device(); !s.ok()) return "no Hopper GPU: " + s.message();
  if (kernel_available(inst.head_dim, inst.dtype)) return {};
  return "head dim " + std::to_string(inst.head_dim) + " / " + dtype_name(inst.dtype) + " not compiled in this build";
}

// Waits for `stream`; a wait past the watchdog ends the binary (exit 3), since a hung kernel cannot be recovered.
inline void wait_or_die(cudaStream_t stream, const std::string& what) {
  if (!harness::synchronize_with_watchdog(stream, kWatchdogSeconds)) {
    std::fprintf(stderr, "HANG: %s did not finish within %.0f s; aborting the test binary\n", what.c_str(),
                 kWatchdogSeconds);
    std::_Exit(3);
  }
}

// The forward on `p`, its O and LSE poisoned first (so that an element it does not write reads as NaN) and its
// workspace too, waited for under the watchdog.
inline void run_forward(harness::Problem& p) {
  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(p.shape, &bytes).ok());
  if (p.workspace.bytes() < bytes) p.workspace = harness::DeviceBuffer(bytes);
  // The workspace too: the kernels that take their tiles from its counter need the launch to zero it (the others
  // never read it), and a fresh allocation often holds zeros anyway.
  p.workspace.poison();
  p.d_out.poison();
  p.d_lse.poison();
  const Status s = forward(harness::forward_args(p), p.workspace.get(), p.workspace.bytes(), nullptr);
  ASSERT_TRUE(s.ok()) << s.to_string();
  wait_or_die(nullptr, "forward");
}

// Elements of a 16-bit output (or of LSE, where -inf is legitimate) that are NaN or infinite.
inline size_t count_unwritten_halves(const harness::DeviceBuffer& buffer, size_t count, DType dtype) {
  std::vector<uint16_t> bits(count);
  buffer.download(bits.data(), count * sizeof(uint16_t));
  size_t bad = 0;
  for (uint16_t b : bits) bad += !std::isfinite(harness::from_bits(b, dtype));
  return bad;
}

// dQ, dK and dV of `p`, bit for bit, in one vector.
inline std::vector<uint16_t> download_gradients(const harness::Problem& p) {
  std::vector<uint16_t> bits(p.q_elements() + 2 * p.kv_elements());
  p.d_dq.download(bits.data(), p.q_elements() * 2);
  p.d_dk.download(bits.data() + p.q_elements(), p.kv_elements() * 2);
  p.d_dv.download(bits.data() + p.q_elements() + p.kv_elements(), p.kv_elements() * 2);
  return bits;
}

// Runs this test binary again as a child process, with `environment` ("VAR=value ...") set and only the tests of
// `child_filter`, under `timeout_seconds`, and expects it to pass: for what must be a process's first CUDA work, or
// must not take the parent's process down with it.
inline void expect_child_passes(const std::string& environment, int timeout_seconds, const std::string& child_filter) {
  std::array<char, 4096> self{};
  const ssize_t length = readlink("/proc/self/exe", self.data(), self.size() - 1);
  ASSERT_GT(length, 0) << "cannot find this test binary to run the child";
  const std::string command = environment + " timeout " + std::to_string(timeout_seconds) + " '" +
                              std::string(self.data(), static_cast<size_t>(length)) +
                              "' --gtest_filter=" + child_filter + " 2>&1";
  FILE* child = popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr) << command;
  std::string output;
  std::array<char, 512> chunk{};
  while (std::fgets(chunk.data(), static_cast<int>(chunk.size()), child) != nullptr) output += chunk.data();
  const int status = pclose(child);
  std::printf("%s", output.c_str());
  EXPECT_EQ(status, 0) << "the child failed or hung (timeout exits 124):\n" << output;
  EXPECT_NE(output.find("[  PASSED  ] 1 test"), std::string::npos) << output;
}

}  // namespace dash::gpu_testing
