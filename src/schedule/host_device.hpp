// Marks functions that compile for both the host (g++, nvcc host pass) and the GPU (nvcc device pass).
// The schedule layer is written only with these, so that the CPU planner, the emulator and the kernels
// all execute one definition.
#pragma once

#if defined(__CUDACC__)
#define DASH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DASH_HOST_DEVICE inline
#endif
