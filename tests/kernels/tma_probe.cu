// tma_verdicts (tma_probe.hpp): the launchers' geometry check (first_tma_refusal) and cuTensorMapEncodeTiled itself on
// one tensor. The driver is reached through the runtime's entry-point query, as CuTe's make_tma_copy reaches it, so
// the probe needs no link to libcuda; nothing goes through make_tma_copy, so no CuTe assert can stop it in a debug
// build.
#include <cstdint>
#include <string>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include "kernels/sm90/gmem_tensors.cuh"
#include "tma_probe.hpp"

namespace dash::testing {
namespace {

using Element = cutlass::bfloat16_t;
constexpr int64_t kElementBytes = sizeof(Element);
constexpr int kHeadDim = 128;
constexpr int64_t kRows = 64;
constexpr int64_t kHeads = 2;
constexpr int64_t kBatch = 2;
constexpr int64_t kRowStride = kHeads * kHeadDim;  // elements
constexpr int64_t kMisalignment = 1;               // elements: 2 bytes, off every 16-byte boundary
// The kernels' boxes: 64 elements of head_dim (128 bytes, the 128-byte swizzle's span) by 64 rows.
constexpr cuuint32_t kBoxDim = 64;
constexpr cuuint32_t kRank = 4;
// The CUDA version whose cuTensorMapEncodeTiled (its first) the probe calls, as CUDART_VERSION numbers them.
constexpr unsigned int kEncodeTiledVersion = 12000;

using EncodeTiled = decltype(&::cuTensorMapEncodeTiled);

// cuTensorMapEncodeTiled from the driver the runtime loaded, or null (and `failure` says why).
EncodeTiled encode_tiled(std::string& failure) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t error = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, kEncodeTiledVersion,
                                                             cudaEnableDefault, &found);
#else
  const cudaError_t error = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found);
#endif
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || function == nullptr) {
    failure = std::string("the driver's cuTensorMapEncodeTiled was not found: ") + cudaGetErrorString(error);
    return nullptr;
  }
  return reinterpret_cast<EncodeTiled>(function);
}

}  // namespace

std::string tma_probe_unavailable_reason() { return {}; }

TmaVerdicts tma_verdicts(TmaGeometry geometry) {
  TmaVerdicts verdicts;
  const EncodeTiled encode = encode_tiled(verdicts.failure);
  if (encode == nullptr) return verdicts;

  const int64_t row_stride = kRowStride + (geometry == TmaGeometry::kRowStridePlusOneElement ? kMisalignment : 0);
  int64_t batch_stride = kRows * row_stride;
  if (geometry == TmaGeometry::kBatchStrideBelowLimit) {
    batch_stride = (sm90::kTmaStrideLimitBytes - sm90::kTmaStrideMultipleBytes) / kElementBytes;
  }
  if (geometry == TmaGeometry::kBatchStrideAtLimit) batch_stride = sm90::kTmaStrideLimitBytes / kElementBytes;
  // Memory for the geometries that fit in it; the driver reads none of it, so the 2^40-byte strides need no memory
  // behind them.
  void* allocation = nullptr;
  const size_t bytes =
      static_cast<size_t>((kBatch * kRows * (kRowStride + kMisalignment) + kMisalignment) * kElementBytes);
  if (const cudaError_t error = cudaMalloc(&allocation, bytes); error != cudaSuccess) {
    verdicts.failure = std::string("cudaMalloc: ") + cudaGetErrorString(error);
    return verdicts;
  }
  const Element* data = static_cast<const Element*>(allocation);
  if (geometry == TmaGeometry::kAddressPlusTwoBytes) data += kMisalignment;

  // The launchers' check, on the tensor as they build it.
  const Strides strides{batch_stride, row_stride, kHeadDim, 1};
  const auto tensor = sm90::make_gmem_bshd<Element, kHeadDim>(data, kRows, kHeads, kBatch, strides);
  const sm90::TmaRefusal refusal = sm90::first_tma_refusal<Element>({{tensor, "q"}});
  verdicts.check = refusal.tensor == nullptr ? "" : refusal.tensor;
  verdicts.rule = refusal.rule == nullptr ? "" : refusal.rule;

  // The driver, on the same geometry, innermost dimension first: head_dim, rows, heads, batch.
  CUtensorMap descriptor{};
  const cuuint64_t dims[kRank] = {kHeadDim, kRows, kHeads, kBatch};
  const cuuint64_t strides_bytes[kRank - 1] = {static_cast<cuuint64_t>(row_stride * kElementBytes),
                                               static_cast<cuuint64_t>(kHeadDim * kElementBytes),
                                               static_cast<cuuint64_t>(batch_stride * kElementBytes)};
  const cuuint32_t box[kRank] = {kBoxDim, kBoxDim, 1, 1};
  const cuuint32_t element_strides[kRank] = {1, 1, 1, 1};
  verdicts.driver_result = static_cast<int>(
      encode(&descriptor, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, kRank, const_cast<Element*>(data), dims, strides_bytes, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  cudaFree(allocation);
  return verdicts;
}

}  // namespace dash::testing
