// The hand-off between warp roles: a ring of stages, each guarded by a "full" and an "empty" mbarrier
// in shared memory (PipelineRing; StepRings pairs two for the backward's per-step operands; MulticastRing is one
// that the CTAs of a cluster fill together). One type owns the phase arithmetic and the arrival counts, so no kernel
// spells a parity expression.
//
// Positions count up from 0 over the life of the kernel: position n uses stage n % kStages, and its
// barriers are in phase (n / kStages) & 1. The producer of position n first waits until the consumers
// have released position n - kStages (the stage's previous use), fills the stage and arrives on its full
// barrier (directly, or with a transaction count that TMA completes); each consumer waits on the full
// barrier, reads the stage and arrives on the empty barrier.
//
// Invariants: the producer and every consumer visit the same positions in the same order; the full
// barrier expects `producer_arrivals` arrivals per phase and the empty barrier `consumer_arrivals`; every
// thread that waits on a full barrier is one of the consumer arrivals on its empty barrier (and every thread
// that waits on an empty barrier one of the producer arrivals on the full one). A parity wait tells only
// whether the phase is even or odd, so a waiter that does not hold the other side back can be lapped: the
// barrier completes its phase and the next, and the waiter waits forever for a phase it missed.
#pragma once

#include <type_traits>

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

template <int kStages>
struct PipelineRing {
  static constexpr int kStageCount = kStages;
  uint64_t full[kStages];
  uint64_t empty[kStages];

  // By one thread, before the CTA's first barrier (then cutlass::arch::fence_barrier_init()).
  __device__ void init(int producer_arrivals, int consumer_arrivals) {
    for (int s = 0; s < kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], producer_arrivals);
      cutlass::arch::ClusterBarrier::init(&empty[s], consumer_arrivals);
    }
  }

  __device__ static int stage(int position) { return position % kStages; }

  // Producer: waits until position's stage may be overwritten; returns the stage.
  __device__ int producer_acquire(int position, const char* what) {
    wait_barrier(empty[stage(position)], phase(position) ^ 1, what);
    return stage(position);
  }
  // Producer: the full barrier a TMA load of `bytes` completes; arrives on it with that count.
  __device__ uint64_t& producer_expect(int position, uint32_t bytes) {
    uint64_t& barrier = full[stage(position)];
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&barrier, bytes);
    return barrier;
  }
  // Producer (plain writes, each producing thread): the stage is filled.
  __device__ void producer_commit(int position) { cutlass::arch::ClusterBarrier::arrive(&full[stage(position)]); }

  // Consumer: waits until position's stage is filled; returns the stage.
  __device__ int consumer_wait(int position, const char* what) {
    wait_barrier(full[stage(position)], phase(position), what);
    return stage(position);
  }
  // Consumer (each consuming thread): done with position's stage.
  __device__ void consumer_release(int position) { cutlass::arch::ClusterBarrier::arrive(&empty[stage(position)]); }

 private:
  __device__ static int phase(int position) { return (position / kStages) & 1; }
};

// A ring whose stages the producers of kCtas CTAs of a thread-block cluster fill together, each multicasting its
// part of every stage into all of them (the forward's CTA pairs, fwd_config.cuh). A stage may be refilled only once
// the consumers of every one of those CTAs have released it, so each CTA's empty barrier counts the releases of all
// of them: init's consumer_arrivals is kCtas times the consuming warpgroups of one CTA.
// The consumers are whole warpgroups of kWarpGroupThreads that read the stage with wgmma, a warpgroup-wide operation:
// once one of the warpgroup's threads has waited for it, it has read the stage for all of them. So one thread per
// warpgroup and CTA releases: lane 0 of the warpgroup's warp c on CTA c's barrier, the same offset in its shared
// memory.
template <int kStages, int kCtas, int kWarpGroupThreads>
struct MulticastRing : PipelineRing<kStages> {
  static_assert(kCtas * 32 <= kWarpGroupThreads, "one warp of each consuming warpgroup per CTA of the cluster");

  // Each consuming thread: done with position's stage (the threads that release for their warpgroup arrive).
  __device__ void consumer_release(int position) {
    const int thread = static_cast<int>(threadIdx.x) % kWarpGroupThreads;
    const int cta = thread / 32;
    if (thread % 32 == 0 && cta < kCtas) {
      cutlass::arch::ClusterBarrier::arrive(&this->empty[this->stage(position)], static_cast<uint32_t>(cta), 1u);
    }
  }
};

// The backward's per-step operands: Q with the LSE, and dO with dpsum. Where both have the same depth they share one
// ring (one wait and one release per step, as up to d = 128 and at 256); with fewer dO stages (d = 192) dO has a ring
// of its own, which its consumers release as soon as their last GEMM that reads dO is done. The loader fills a step
// with acquire_q, expect_q, acquire_dout, expect_dout, in that order; the consumers call wait_q, wait_dout, then
// release_dout before (or with) release_q.
// Invariant: in the shared ring expect_q announces both operands' bytes before either load is issued, so the full
// barrier cannot complete on Q's bytes alone.
template <int kQStages, int kdOStages>
struct StepRings {
  static constexpr bool kSeparateDout = kQStages != kdOStages;
  struct NoRing {};
  PipelineRing<kQStages> q;
  std::conditional_t<kSeparateDout, PipelineRing<kdOStages>, NoRing> dout;

  __device__ void init(int producer_arrivals, int consumer_arrivals) {
    q.init(producer_arrivals, consumer_arrivals);
    if constexpr (kSeparateDout) dout.init(producer_arrivals, consumer_arrivals);
  }

  __device__ int acquire_q(int position) { return q.producer_acquire(position, "q_empty"); }
  // The full barrier of Q's stage, expecting Q's bytes, and dO's too where they share the ring.
  __device__ uint64_t& expect_q(int position, uint32_t q_bytes, uint32_t dout_bytes) {
    return q.producer_expect(position, kSeparateDout ? q_bytes : q_bytes + dout_bytes);
  }
  __device__ int acquire_dout(int position) {
    if constexpr (kSeparateDout) {
      return dout.producer_acquire(position, "dout_empty");
    } else {
      return q.stage(position);
    }
  }
  // The full barrier dO's loads complete: its own ring's, or `q_full` (expect_q counted dO's bytes).
  __device__ uint64_t& expect_dout(int position, uint32_t dout_bytes, uint64_t& q_full) {
    if constexpr (kSeparateDout) {
      return dout.producer_expect(position, dout_bytes);
    } else {
      return q_full;
    }
  }

  __device__ int wait_q(int position) { return q.consumer_wait(position, "q_full"); }
  __device__ int wait_dout(int position) {
    if constexpr (kSeparateDout) {
      return dout.consumer_wait(position, "dout_full");
    } else {
      return q.stage(position);
    }
  }
  __device__ void release_dout(int position) {
    if constexpr (kSeparateDout) dout.consumer_release(position);
  }
  // Q's stage, and dO's where they share the ring.
  __device__ void release_q(int position) { q.consumer_release(position); }
};

// A ring of small records that one producer thread hands to a fixed set of consumer threads (the
// kernels announce their work, backward jobs and forward tiles, with it): record n lives in slot
// n % kSlots, and the slot's copy is taken out at once so the slot can be reused.
template <class Record, int kSlots>
struct RecordRing {
  Record records[kSlots];
  PipelineRing<kSlots> slots;

  // By one thread before the CTA's first barrier: `consumers` threads take every record.
  __device__ void init(int consumers) { slots.init(1, consumers); }

  // Producer: the n-th record, once every consumer has taken record n - kSlots.
  __device__ void publish(const Record& record, int n) {
    records[slots.producer_acquire(n, "record ring slot free")] = record;
    slots.producer_commit(n);
  }

  // Each consumer thread: the n-th record.
  __device__ Record take(int n) {
    const Record record = records[slots.consumer_wait(n, "record ring slot full")];
    slots.consumer_release(n);
    return record;
  }
};

}  // namespace dash::sm90
