// The TMA probe in a build without DASH_BUILD_KERNELS (no CUDA compiler): it cannot encode a descriptor, and says so.
#include "tma_probe.hpp"

namespace dash::testing {

std::string tma_probe_unavailable_reason() { return "built without kernels (DASH_BUILD_KERNELS=OFF)"; }

std::string unencoded_descriptor(bool) { return tma_probe_unavailable_reason(); }

}  // namespace dash::testing
