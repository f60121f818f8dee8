// The forward kernel: persistent CTAs, a loader warp (fwd_loader.cuh) and the MMA warpgroups that run the
// online softmax (fwd_mainloop.cuh) and write O and LSE (fwd_epilogue.cuh), in the tile order of
// schedule/forward_tile_order.hpp; in the paired kernels (Config::kPaired) clusters of two CTAs that share their K and
// V loads. Reads top to bottom: set up barriers, give registers to the MMA warpgroups, run each role until the tiles
// run out.
#pragma once

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/fwd_config.cuh"
#include "kernels/sm90/fwd_loader.cuh"
#include "kernels/sm90/fwd_mainloop.cuh"
#include "kernels/sm90/warp_roles.cuh"

namespace dash::sm90 {

template <class Config>
__device__ void init_forward_barriers(typename Config::SharedStorage& smem) {
  constexpr int kLoaderThreads = 1;
  smem.q_stages.init(kLoaderThreads, Config::kMmaThreads);
  smem.k_stages.init(kLoaderThreads, Config::kKvReleaseArrivals);
  smem.v_stages.init(kLoaderThreads, Config::kKvReleaseArrivals);
  smem.tiles.init(Config::kMmaThreads);
  cutlass::arch::fence_barrier_init();
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kCtasPerSm)
    forward_kernel(const __grid_constant__ typename Config::Params params) {
  extern __shared__ __align__(1024) char shared_bytes[];
  auto& smem = *reinterpret_cast<typename Config::SharedStorage*>(shared_bytes);
  if (threadIdx.x == 0) init_forward_barriers<Config>(smem);
  if constexpr (Config::kPaired) {
    // The other CTA of the pair multicasts into this one's K and V stages and releases them from afar: its barriers
    // must be initialized before either CTA loads.
    cute::cluster_sync();
  } else {
    __syncthreads();
  }
  run_warp_roles<Config>(
      [&] {
        if (threadIdx.x == 0) ForwardLoader<Config>::run(params, smem);
      },
      [&](int thread) { ForwardMainloop<Config>::run(params, smem, thread); });
}

}  // namespace dash::sm90
