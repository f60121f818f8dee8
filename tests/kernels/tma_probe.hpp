// The launchers' check of their TMA descriptors (first_unencoded, src/kernels/sm90/gmem_tensors.cuh) on descriptors
// the driver really encodes or refuses, for the GPU test that a refused one is caught (test_sm90_faults.cpp).
//
// It is CUDA code (tma_probe.cu); a build without DASH_BUILD_KERNELS links tma_probe_unavailable.cpp, which says why
// it cannot run, and the test skips.
#pragma once

#include <string>

namespace dash::testing {

// Empty if this build can run the probe, else why not.
std::string tma_probe_unavailable_reason();

// Encodes the TMA descriptor of a (64, 128, 2, 1) bf16 tensor named "q", as the kernels' launchers do, with a row
// stride the driver accepts or, when `refused`, one that is no multiple of 16 bytes; returns what first_unencoded
// says of it: "q" if it was not encoded, "" if it was.
std::string unencoded_descriptor(bool refused);

}  // namespace dash::testing
