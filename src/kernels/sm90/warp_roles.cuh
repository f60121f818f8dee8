// The warp-specialized CTA both kernels use: warpgroup 0 produces (loads, and in the backward writes
// dQ), warpgroups 1 and 2 run the MMAs. One definition of the thread counts, of the register split
// that setmaxnreg applies, and of the role dispatch at the top of each kernel.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

struct WarpRoles {
  static constexpr int kMmaWarpGroups = 2;
  static constexpr int kWarpGroupThreads = 128;
  static constexpr int kMmaThreads = kWarpGroupThreads * kMmaWarpGroups;
  static constexpr int kThreads = kMmaThreads + kWarpGroupThreads;
  // setmaxnreg moves registers between warpgroups inside the CTA's launch allocation (168 per thread
  // for 384 threads); asking for more than the producer released would block the MMA warpgroups forever.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kMmaRegisters = 240;
  static_assert(kProducerRegisters * kWarpGroupThreads + kMmaRegisters * kMmaThreads <=
                    launch_registers_per_thread(kThreads) * kThreads,
                "setmaxnreg budget exceeds the CTA's register allocation");
};

// Named barriers among MMA threads, one list for both kernels so that no two uses share an id. The ids
// are CUTLASS NamedBarrier ids, which it offsets past the ones it reserves (id 0 there is not __syncthreads).
enum NamedBarrierId : int {
  kDsReadyBarrier = 1,      // backward: dS of a step is complete in shared memory (both MMA warpgroups)
  kDsFreeBarrier = 2,       // backward: no MMA warpgroup reads the dS buffer, which stages dK and dV
  kStagingBarrierBase = 3,  // kStagingBarrierBase + w: MMA warpgroup w's rows of a staging tile (gemm.cuh)
  kNamedBarrierIdEnd = kStagingBarrierBase + WarpRoles::kMmaWarpGroups,
};
static_assert(kNamedBarrierIdEnd + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <=
                  cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers,
              "more named barriers than the SM has");

// Moves registers from the producer warpgroup to the MMA warpgroups, then runs `produce()` in the
// producer and `consume(thread)` in the MMA warpgroups, thread numbered from 0 across them.
template <class Produce, class Consume>
__device__ __forceinline__ void run_warp_roles(Produce&& produce, Consume&& consume) {
  const int warp_group = static_cast<int>(threadIdx.x) / WarpRoles::kWarpGroupThreads;
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<WarpRoles::kProducerRegisters>();
    produce();
  } else {
    cutlass::arch::warpgroup_reg_alloc<WarpRoles::kMmaRegisters>();
    consume(static_cast<int>(threadIdx.x) - WarpRoles::kWarpGroupThreads);
  }
}

}  // namespace dash::sm90
