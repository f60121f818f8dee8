// The launchers' check of a tensor's geometry against cuTensorMapEncodeTiled's rules (first_tma_refusal,
// src/kernels/sm90/gmem_tensors.cuh) beside the driver's own verdict on the same geometry, for the GPU test that the
// two agree (test_sm90_faults.cpp): the check is what stops a launch, so it must refuse what the driver refuses, and
// nothing the driver accepts.
//
// It is CUDA code (tma_probe.cu); a build without DASH_BUILD_KERNELS links tma_probe_unavailable.cpp, which says why
// it cannot run, and the test skips.
#pragma once

#include <string>

namespace dash::testing {

// Empty if this build can run the probe, else why not.
std::string tma_probe_unavailable_reason();

// A bf16 (rows, 128, 2 heads, 2 batches) tensor named "q", as the launchers view one (make_gmem_bshd), with rows of
// 2 heads (a 512-byte row stride) on a cudaMalloc'd address, changed as each geometry says.
enum class TmaGeometry {
  kValid,
  kRowStridePlusOneElement,  // a row stride of 514 bytes: no multiple of 16
  kAddressPlusTwoBytes,      // the tensor starts one element past the allocation: not 16-byte aligned
  kBatchStrideBelowLimit,    // a batch stride of 2^40 - 16 bytes: the largest the driver takes
  kBatchStrideAtLimit,       // a batch stride of 2^40 bytes
};

struct TmaVerdicts {
  std::string failure;     // why the probe could not ask (an allocation, the driver's entry point); empty if it asked
  std::string check;       // the tensor first_tma_refusal names: "q" if it refuses, "" if not
  std::string rule;        // the rule it says is broken
  int driver_result = -1;  // cuTensorMapEncodeTiled's CUresult on the same geometry: 0 (CUDA_SUCCESS) if it encoded
};

// The check's and the driver's verdicts on `geometry`. The driver is asked for a descriptor with a box and swizzle
// like the kernels' (64 x 64 elements, 128-byte swizzle); it checks the geometry, not the memory behind it.
TmaVerdicts tma_verdicts(TmaGeometry geometry);

}  // namespace dash::testing
