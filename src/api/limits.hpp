// Limits of the public API, each named once: the head dims, element width and device the kernels are
// written for, and the bounds that keep every kernel index within 32 bits, every launch grid within CUDA's
// limits and every TMA descriptor legal. validate() and the device checks enforce them; the kernels may
// rely on them. Together they also bound every size and byte offset validate() computes well inside int64.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "api/supported.hpp"
#include "schedule/tile_config.hpp"

namespace dash {

// kSupportedHeadDims and kSupportedDTypes, what the kernels are written for, come from cmake/Supported.cmake through
// the generated api/supported.hpp (a build may instantiate a subset, see DASH_HEAD_DIMS and DASH_DTYPES).

// Head dims with a backward kernel as well (has_backward_kernel, schedule/tile_config.hpp): a backward, its plan and
// its workspace size are refused at the others. Every supported head dim has one; the backward's rule stays apart
// so that a head dim could gain its forward first.
inline constexpr auto kBackwardHeadDims = [] {
  constexpr auto count =
      std::ranges::count_if(kSupportedHeadDims, [](int head_dim) { return has_backward_kernel(head_dim); });
  std::array<int, static_cast<size_t>(count)> head_dims{};
  size_t next = 0;
  for (int head_dim : kSupportedHeadDims) {
    if (has_backward_kernel(head_dim)) head_dims[next++] = head_dim;
  }
  return head_dims;
}();

// The kernels' settings per head dim (schedule/tile_config.hpp) have a row for each supported head dim.
static_assert(std::ranges::all_of(kSupportedHeadDims, [](int head_dim) { return has_backward_kernel(head_dim); }),
              "a supported head dim without a row of head_dim_settings (schedule/tile_config.hpp)");

// Both supported element types (bf16, fp16) are 2 bytes wide.
inline constexpr int64_t kElementBytes = 2;

// Longest query or key sequence the kernels accept.
inline constexpr int64_t kMaxSeqlen = int64_t{1} << 20;

// CUDA caps gridDim.y and gridDim.z at 65535. The backward's preprocess, postprocess and split-sum kernels
// launch (tiles, heads, batch) grids, so heads_q (and heads_kv, which divides it) and batch must fit.
inline constexpr int64_t kMaxGridDimYZ = 65535;

// Kernels index query tiles and tensor elements with 32-bit signed integers, so counts must stay below this.
inline constexpr int64_t kMaxKernelIndex = int64_t{1} << 31;

// Fewest rows of any kernel's query tile: a launch has at most ceil(seqlen_q / kMinBlockQ) query tiles
// per (batch, head).
inline constexpr int kMinBlockQ = 64;
static_assert(
    kForwardBlockQ >= kMinBlockQ && kForwardTallBlockQ >= kMinBlockQ &&
        [] {
          for (int head_dim : kBackwardHeadDims) {
            if (backward_tile_shape(head_dim).block_q < kMinBlockQ) return false;
          }
          return true;
        }(),
    "kMinBlockQ must not exceed any kernel's query tile, or the query tile count bound is too loose");
// Shift on a varlen batch is proven only where block_q <= block_kv (planner/varlen_plan.hpp: a sequence's key/value
// tiles then never outnumber its query tiles), and auto picks it for full-mask varlen batches whose lengths fill the
// maxima; every backward tile keeps it. block_kv need not be a multiple of block_q: at d = 192 (64x96) and 256
// (64x80) it is not, and the planner refuses symmetric shift there, whose stride is block_kv / block_q
// (planner/schedule_plan.cpp).
static_assert(
    [] {
      for (int head_dim : kBackwardHeadDims) {
        if (backward_tile_shape(head_dim).block_q > backward_tile_shape(head_dim).block_kv) return false;
      }
      return true;
    }(),
    "every backward tile's block_q must be at most its block_kv (shift on varlen batches)");

// TMA needs 16-byte aligned global addresses and global strides that are multiples of 16 bytes.
inline constexpr int64_t kTmaAlignmentBytes = 16;
inline constexpr int64_t kStrideMultipleElements = kTmaAlignmentBytes / kElementBytes;
// cuTensorMapEncodeTiled also requires every global stride to be less than 2^40 bytes.
inline constexpr int64_t kTmaStrideLimitBytes = int64_t{1} << 40;
inline constexpr int64_t kStrideLimitElements = kTmaStrideLimitBytes / kElementBytes;

// LSE is read and written as plain floats, not through TMA.
inline constexpr int64_t kLseAlignmentBytes = alignof(float);

// The kernels use sm_90a instructions (wgmma, setmaxnreg), which run on compute capability 9.0 only:
// sm_90a code is not forward compatible with later architectures.
inline constexpr int kRequiredComputeMajor = 9;
inline constexpr int kRequiredComputeMinor = 0;

}  // namespace dash
