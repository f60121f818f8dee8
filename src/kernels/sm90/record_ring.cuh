// A ring of small records in shared memory that one producer thread hands to a fixed set of consumer
// threads, slot by slot, through a full and an empty mbarrier per slot. The kernels announce their work
// (backward jobs, forward tiles) with it; the n-th record goes to slot n % kSlots.
#pragma once

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

template <class Record, int kSlots>
struct RecordRing {
  Record records[kSlots];
  uint64_t full[kSlots];
  uint64_t empty[kSlots];

  // By one thread before the CTA's first barrier: `consumers` threads take every record.
  __device__ void init(int consumers) {
    for (int s = 0; s < kSlots; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 1);
      cutlass::arch::ClusterBarrier::init(&empty[s], consumers);
    }
  }

  // Producer: the n-th record, once every consumer has taken record n - kSlots.
  __device__ void publish(const Record& record, int n) {
    const int slot = n % kSlots;
    wait_barrier(empty[slot], ((n / kSlots) & 1) ^ 1, "record ring slot free");
    records[slot] = record;
    cutlass::arch::ClusterBarrier::arrive(&full[slot]);
  }

  // Each consumer thread: the n-th record, copied out so the slot can be reused at once.
  __device__ Record take(int n) {
    const int slot = n % kSlots;
    wait_barrier(full[slot], (n / kSlots) & 1, "record ring slot full");
    const Record record = records[slot];
    cutlass::arch::ClusterBarrier::arrive(&empty[slot]);
    return record;
  }
};

}  // namespace dash::sm90
