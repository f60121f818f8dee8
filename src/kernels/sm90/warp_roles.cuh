// The warp-specialized CTA both kernels use: warpgroup 0 produces (loads, and in the backward writes
// dQ), warpgroups 1 .. kMmaWarpGroups run the MMAs, each on 64 rows of the tile. One definition, per
// MMA warpgroup count, of the thread counts, of the register split that setmaxnreg applies, of the
// named barrier ids, and of the role dispatch at the top of each kernel.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

// Rows of a tile that one MMA warpgroup owns: the M of one wgmma.
inline constexpr int kMmaWarpGroupRows = 64;

// kCtasPerSm_: CTAs of the kernel that share one SM (its __launch_bounds__ minimum), which split the register file.
template <int kMmaWarpGroups_, int kCtasPerSm_ = 1>
struct WarpRoles {
  static constexpr int kMmaWarpGroups = kMmaWarpGroups_;
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static constexpr int kWarpGroupThreads = 128;
  static constexpr int kMmaThreads = kWarpGroupThreads * kMmaWarpGroups;
  static constexpr int kThreads = kMmaThreads + kWarpGroupThreads;
  // Registers per thread each CTA gets at launch: 168 for 384 threads, 128 for 512 or for two CTAs of 256.
  static constexpr int kLaunchRegisters = launch_registers_per_thread(kThreads * kCtasPerSm);
  // setmaxnreg moves registers between warpgroups inside the CTA's launch allocation; asking for more than the
  // producer released would block the MMA warpgroups forever. The MMA warpgroups take all the producer gives up,
  // in setmaxnreg's steps of 8, at most 256: 240 with two MMA warpgroups, 160 with three, 232 with one in each of
  // two CTAs.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kRegisterStep = 8;
  static constexpr int kMaxRegisters = 256;
  static constexpr int kMmaRegisters = [] {
    const int spare = kLaunchRegisters * kThreads - kProducerRegisters * kWarpGroupThreads;
    const int per_thread = spare / kMmaThreads / kRegisterStep * kRegisterStep;
    return per_thread < kMaxRegisters ? per_thread : kMaxRegisters;
  }();
  static_assert(kProducerRegisters * kWarpGroupThreads + kMmaRegisters * kMmaThreads <= kLaunchRegisters * kThreads,
                "setmaxnreg budget exceeds the CTA's register allocation");

  // Named barriers among MMA threads. The ids are CUTLASS NamedBarrier ids, which it offsets past the ones
  // it reserves (id 0 there is not __syncthreads). The forward and backward never share a CTA, so the ids
  // only need to be distinct within one kernel.
  static constexpr int kDsReadyBarrier = 0;  // backward: dS of a step is complete in shared memory
  static constexpr int kDsFreeBarrier = 1;   // backward: no MMA warpgroup reads dS, which stages dK and dV
  // + w: MMA warpgroup w's own threads: its rows of a staging tile (gemm.cuh), its keys' P before its dV^T GEMM
  // (bwd_mainloop_key_split.cuh).
  static constexpr int kWarpGroupBarrierBase = 2;
  static constexpr int kMmaTurnBarrierBase = kWarpGroupBarrierBase + kMmaWarpGroups;  // + w: warpgroup w's GEMM turn
  static constexpr int kNamedBarrierIdEnd = kMmaTurnBarrierBase + kMmaWarpGroups;
  static_assert(kNamedBarrierIdEnd + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <=
                    cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers,
                "more named barriers than the SM has");
};

// Ping-pong of the MMA warpgroups (FlashAttention-3's "warp scheduler barrier"): a warpgroup issues the
// GEMMs of a step only on its turn and passes the turn to the next warpgroup right after issuing them, so
// the warpgroups' GEMMs reach the tensor cores one after the other and one warpgroup's elementwise work
// (the softmax) runs under the others' GEMMs instead of all of them idling the tensor cores at once.
// Warpgroup w's turn is named barrier kMmaTurnBarrierBase + w, completed by its own 128 threads waiting
// and the previous warpgroup's 128 passing; warpgroup 0 passes itself the first turn in start().
// Invariant: every MMA warpgroup calls start() once, then wait() and pass() in pairs, equally often (the
// forward's warpgroups walk the same tiles and key/value tiles). The one turn left passed at the end is
// never waited for, which a barrier at kernel exit allows. A CTA of one MMA warpgroup has no one to take turns
// with (the other CTA on its SM interleaves instead), and the turns compile to nothing.
template <class Roles>
class MmaTurns {
 public:
  __device__ explicit MmaTurns(int warp_group)
      : own_(Roles::kMmaTurnBarrierBase + warp_group),
        next_(Roles::kMmaTurnBarrierBase + (warp_group + 1) % Roles::kMmaWarpGroups),
        first_(warp_group == 0) {}
  __device__ void start() const {
    if (kTakeTurns && first_) cutlass::arch::NamedBarrier::arrive(kThreads, own_);
  }
  __device__ void wait() const {
    if (kTakeTurns) cutlass::arch::NamedBarrier::sync(kThreads, own_);
  }
  __device__ void pass() const {
    if (kTakeTurns) cutlass::arch::NamedBarrier::arrive(kThreads, next_);
  }

 private:
  static constexpr bool kTakeTurns = Roles::kMmaWarpGroups > 1;
  static constexpr int kThreads = 2 * Roles::kWarpGroupThreads;  // the waiting and the passing warpgroup
  int own_;
  int next_;
  bool first_;
};

// Moves registers from the producer warpgroup to the MMA warpgroups, then runs `produce()` in the
// producer and `consume(thread)` in the MMA warpgroups, thread numbered from 0 across them.
template <class Roles, class Produce, class Consume>
__device__ __forceinline__ void run_warp_roles(Produce&& produce, Consume&& consume) {
  const int warp_group = static_cast<int>(threadIdx.x) / Roles::kWarpGroupThreads;
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Roles::kProducerRegisters>();
    produce();
  } else {
    cutlass::arch::warpgroup_reg_alloc<Roles::kMmaRegisters>();
    consume(static_cast<int>(threadIdx.x) - Roles::kWarpGroupThreads);
  }
}

}  // namespace dash::sm90
