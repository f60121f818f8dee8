// Defines the launchers of one kernel instance (head dim, element type, softcap) for the kernel registry, and those
// of its varlen kernels (in a translation unit of their own, so that both compile in parallel). Included only by the
// CMake-generated instance translation units.
#pragma once

#include <cutlass/numeric_types.h>

#include "kernels/kernel_params.hpp"
#include "kernels/sm90/bwd_launch.cuh"
#include "kernels/sm90/fwd_launch.cuh"

namespace dash::kernels {
using ElementOf_bf16 = cutlass::bfloat16_t;
using ElementOf_fp16 = cutlass::half_t;
}  // namespace dash::kernels

// NAME is HEAD_DIM_DTYPE, with _softcap for the softcap instance (SOFTCAP true).
#define DASH_DEFINE_KERNEL_INSTANCE(NAME, HEAD_DIM, DTYPE, SOFTCAP)                        \
  namespace dash::kernels {                                                                \
  LaunchResult launch_forward_##NAME(const ForwardParams& params, cudaStream_t stream) {   \
    return sm90::launch_forward<HEAD_DIM, ElementOf_##DTYPE, SOFTCAP>(params, stream);     \
  }                                                                                        \
  LaunchResult launch_backward_##NAME(const BackwardParams& params, cudaStream_t stream) { \
    return sm90::launch_backward<HEAD_DIM, ElementOf_##DTYPE, SOFTCAP>(params, stream);    \
  }                                                                                        \
  }

// The varlen launchers of instance NAME (args.varlen set).
#define DASH_DEFINE_VARLEN_KERNEL_INSTANCE(NAME, HEAD_DIM, DTYPE, SOFTCAP)                        \
  namespace dash::kernels {                                                                       \
  LaunchResult launch_forward_varlen_##NAME(const ForwardParams& params, cudaStream_t stream) {   \
    return sm90::launch_forward_varlen<HEAD_DIM, ElementOf_##DTYPE, SOFTCAP>(params, stream);     \
  }                                                                                               \
  LaunchResult launch_backward_varlen_##NAME(const BackwardParams& params, cudaStream_t stream) { \
    return sm90::launch_backward_varlen<HEAD_DIM, ElementOf_##DTYPE, SOFTCAP>(params, stream);    \
  }                                                                                               \
  }
