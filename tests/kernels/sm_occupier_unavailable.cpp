// SmOccupier in a build without DASH_BUILD_KERNELS (no CUDA compiler): it cannot launch a kernel, and says so.
#include "sm_occupier.hpp"

namespace dash::testing {

SmOccupier::~SmOccupier() = default;

std::string SmOccupier::unavailable_reason() { return "built without kernels (DASH_BUILD_KERNELS=OFF)"; }

std::string SmOccupier::start(int, double, double) { return unavailable_reason(); }

bool SmOccupier::holding() const { return false; }

bool SmOccupier::release(double) { return true; }

}  // namespace dash::testing
