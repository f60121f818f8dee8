// The wait probe in a build without DASH_BUILD_KERNELS (no CUDA compiler): it cannot launch a kernel, and says so.
#include "wait_probe.hpp"

namespace dash::testing {

std::string wait_probe_unavailable_reason() { return "built without kernels (DASH_BUILD_KERNELS=OFF)"; }

WaitOutcome semaphore_wait_outcome(int, int, int, long long) { return {wait_probe_unavailable_reason(), false, 0}; }

}  // namespace dash::testing
