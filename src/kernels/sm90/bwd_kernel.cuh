// The backward main kernel: persistent CTAs, one producer warpgroup (loader + dQ writer) and two MMA
// warpgroups, connected by mbarriers in shared memory. Reads top to bottom: set up barriers, give
// registers to the MMA warpgroups, run each role until the schedule runs out of work.
// Its named parts: the tile scheduler, which walks the schedule for the loader (bwd_tile_scheduler.cuh); the loader
// (bwd_loader.cuh); the mainloop of the head dim's layout (BackwardMainloop: bwd_mainloop_rows.cuh or
// bwd_mainloop_key_split.cuh), whose job loop, element-wise part and dQ hand-off both layouts share
// (bwd_job_loop.cuh, bwd_scores.cuh, bwd_dq_handoff.cuh); the dK/dV epilogue (bwd_epilogue.cuh); the dQ writer
// (bwd_dq_writer.cuh). Their settings per head dim are bwd_config.cuh's, from schedule/tile_config.hpp's table.
#pragma once

#include <type_traits>

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_dq_writer.cuh"
#include "kernels/sm90/bwd_loader.cuh"
#include "kernels/sm90/bwd_mainloop_key_split.cuh"
#include "kernels/sm90/bwd_mainloop_rows.cuh"

namespace dash::sm90 {

// The MMA warpgroups' mainloop: each owns 64 key/value rows up to d = 128, or they split the tile's keys at d = 192
// and 256 (Config::kSplitsKeys, from backward_splits_keys).
template <class Config>
using BackwardMainloop = std::conditional_t<Config::kSplitsKeys, KeySplitMainloop<Config>, RowsMainloop<Config>>;

template <class Config>
__device__ void init_backward_barriers(typename Config::SharedStorage& smem) {
  // The loader and the dQ writer are one thread each. A thread that waits on a full barrier without arriving on its
  // empty barrier (as the writer's other 31 lanes did) does not hold the producer back: once the next use of the
  // stage completes the barrier again, the phase it waits for has come round unfinished, and it waits forever.
  constexpr int kLoaderThreads = 1;
  constexpr int kWriterThreads = 1;
  smem.step_rings.init(kLoaderThreads, Config::kMmaThreads);
  smem.kv_stages.init(kLoaderThreads, Config::kMmaThreads);
  smem.jobs.init(Config::kMmaThreads + kWriterThreads);
  for (auto& partial : smem.dq_stages) partial.init(Config::kWarpGroupThreads, kWriterThreads);
  cutlass::arch::fence_barrier_init();
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    backward_kernel(const __grid_constant__ typename Config::Params params) {
  extern __shared__ __align__(1024) char shared_bytes[];
  auto& smem = *reinterpret_cast<typename Config::SharedStorage*>(shared_bytes);
  if (threadIdx.x == 0) init_backward_barriers<Config>(smem);
  __syncthreads();

  run_warp_roles<Config>(
      [&] {
        if (lane_index() != 0) return;
        const int warp = warp_index();
        if (warp == 0) BackwardLoader<Config>::run(params, smem);
        if (warp == 1) BackwardDqWriter<Config>::run(params, smem);
      },
      [&](int thread) { BackwardMainloop<Config>::run(params, smem, thread); });
}

}  // namespace dash::sm90
