// The bounded ordering wait of the kernels (wait_semaphore, src/kernels/sm90/primitives.cuh) run alone, for the
// GPU test that a wait which can never end gives up within its bound instead of hanging (test_wait_bound_gpu.cpp).
//
// It is CUDA code (wait_probe.cu); a build without DASH_BUILD_KERNELS links wait_probe_unavailable.cpp, which
// says why it cannot run, and the test skips.
#pragma once

#include <string>

namespace dash::testing {

// Empty if this build can run the probe, else why not.
std::string wait_probe_unavailable_reason();

struct WaitOutcome {
  std::string error;      // the CUDA error the launch ended with, "cudaSuccess" when it ended cleanly
  bool in_order = false;  // what wait_semaphore returned: the semaphore reached the awaited value
  double seconds = 0;     // from the launch to the end of the synchronization
};

// Launches one thread that waits with wait_semaphore, bounded by `bound_ns`, for a semaphore in device memory
// holding `value` to equal `expected`, with the launch's abandoned flag holding `abandoned`, and synchronizes.
WaitOutcome semaphore_wait_outcome(int value, int expected, int abandoned, long long bound_ns);

}  // namespace dash::testing
