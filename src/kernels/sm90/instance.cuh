// Defines the launchers of one kernel instance (head dim, element type) for the kernel registry.
// Included only by the CMake-generated instance translation units.
#pragma once

#include <cutlass/numeric_types.h>

#include "kernels/kernel_params.hpp"
#include "kernels/sm90/bwd_launch.cuh"
#include "kernels/sm90/fwd_launch.cuh"

namespace dash::kernels {
using ElementOf_bf16 = cutlass::bfloat16_t;
using ElementOf_fp16 = cutlass::half_t;
}  // namespace dash::kernels

#define DASH_DEFINE_KERNEL_INSTANCE(HEAD_DIM, DTYPE)                                                   \
  namespace dash::kernels {                                                                             \
  int launch_forward_##HEAD_DIM##_##DTYPE(const ForwardParams& params, cudaStream_t stream) {           \
    return sm90::launch_forward<HEAD_DIM, ElementOf_##DTYPE>(params, stream);                           \
  }                                                                                                     \
  int launch_backward_##HEAD_DIM##_##DTYPE(const BackwardParams& params, cudaStream_t stream) {         \
    return sm90::launch_backward<HEAD_DIM, ElementOf_##DTYPE>(params, stream);                          \
  }                                                                                                     \
  }
