// unencoded_descriptor (tma_probe.hpp): a descriptor made by CuTe's make_tma_copy, as the launchers make theirs, and
// the launchers' own check of it.
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>

#include <string>

#include "kernels/sm90/gmem_tensors.cuh"
#include "tma_probe.hpp"

namespace dash::testing {
namespace {

using Element = cutlass::bfloat16_t;
constexpr int kHeadDim = 128;
constexpr int kRows = 64;
constexpr int kHeads = 2;
constexpr int64_t kMisalignment = 1;  // elements added to the row stride: 2 bytes, so no multiple of 16

}  // namespace

std::string tma_probe_unavailable_reason() {
#ifndef NDEBUG
  return "a debug build: CuTe asserts on a descriptor the driver refuses before the check can see it";
#else
  return {};
#endif
}

std::string unencoded_descriptor(bool refused) {
  using namespace cute;
  const int64_t row_stride = kHeads * kHeadDim + (refused ? kMisalignment : 0);
  void* data = nullptr;
  if (cudaMalloc(&data, static_cast<size_t>(kRows * row_stride) * sizeof(Element)) != cudaSuccess) {
    return "cudaMalloc failed";
  }
  const Strides strides{kRows * row_stride, row_stride, kHeadDim, 1};
  const auto smem = tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, make_shape(Int<kRows>{}, Int<kHeadDim>{}));
  const auto tma =
      make_tma_copy(SM90_TMA_LOAD{}, sm90::make_gmem_bshd<Element, kHeadDim>(data, kRows, kHeads, 1, strides), smem);
  const char* unencoded = sm90::first_unencoded({{tma.get_tma_descriptor(), "q"}});
  cudaFree(data);
  return unencoded == nullptr ? "" : unencoded;
}

}  // namespace dash::testing
