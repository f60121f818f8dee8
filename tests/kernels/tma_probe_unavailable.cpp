// The TMA probe in a build without DASH_BUILD_KERNELS (no CUDA compiler): it cannot ask the driver, and says so.
#include "tma_probe.hpp"

namespace dash::testing {

std::string tma_probe_unavailable_reason() { return "built without kernels (DASH_BUILD_KERNELS=OFF)"; }

TmaVerdicts tma_verdicts(TmaGeometry) {
  TmaVerdicts verdicts;
  verdicts.failure = tma_probe_unavailable_reason();
  return verdicts;
}

}  // namespace dash::testing
