// The bounded ordering wait of the kernels (wait_semaphore, src/kernels/sm90/primitives.cuh) run alone, for the
// GPU test that a wait which can never end becomes an error rather than a hang (test_wait_bound_gpu.cpp).
//
// It is CUDA code (wait_probe.cu); a build without DASH_BUILD_KERNELS links wait_probe_unavailable.cpp, which
// says why it cannot run, and the test skips.
#pragma once

#include <string>

namespace dash::testing {

// Empty if this build can run the probe, else why not.
std::string wait_probe_unavailable_reason();

// Launches one thread that waits with wait_semaphore, bounded by `bound_ns`, for a semaphore in device memory
// holding `value` to equal `expected`, and synchronizes. Returns the name of the CUDA error the launch ended with:
// "cudaSuccess" when the wait ended; after a trap the CUDA context is unusable for the rest of the process.
std::string semaphore_wait_outcome(int value, int expected, long long bound_ns);

}  // namespace dash::testing
