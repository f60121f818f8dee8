// Small sm90 PTX primitives the kernels are built from: waits on mbarriers and bounded waits on ordering semaphores
// in global memory, the bulk (non-tensor) copy engine, and proxy fences. Each wraps one or two instructions and
// says why it is needed; nothing here knows about attention.
#pragma once

#include <cstdint>

#include <cute/arch/util.hpp>
#include <cutlass/arch/barrier.h>

#if defined(DASH_DEBUG_HANGS)
#include <cstdio>
#endif

namespace dash::sm90 {

// Ordering waits on other CTAs (wait_semaphore) are bounded by the host's bound (src/api/wait_timeouts.hpp), in
// nanoseconds of the GPU's global timer, which is independent of the SM clock. -DDASH_DEBUG_HANGS bounds every
// mbarrier wait as well, by kDebugWaitBoundNs: there a wait that long is a kernel bug.
#if defined(DASH_DEBUG_HANGS)
inline constexpr long long kDebugWaitBoundNs = 5'000'000'000LL;
#endif

__device__ __forceinline__ long long global_timer_ns() {
  long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

#if defined(DASH_DEBUG_HANGS)
// Ends a launch whose mbarrier wait outlived kDebugWaitBoundNs (debug builds only, where such a wait is a kernel
// bug): prints which wait and where, then traps, so that the stream reports an error instead of hanging. Like any
// device fault, the trap leaves the CUDA context unusable. Release builds have no such call: printf is a call,
// and a call site makes ptxas drop setmaxnreg and spill in the step loops (scripts/sass_report.sh showed it).
__device__ __forceinline__ void report_hang(const char* what, int detail) {
  printf("dash: CTA %d thread %d waited more than %lld ns in %s (%d): the launch cannot finish\n",
         static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x), kDebugWaitBoundNs, what, detail);
  __trap();
}
#endif

// Waits until phase `parity` of an mbarrier has completed. Only the CTA's own roles complete its mbarriers, and
// the one role that waits on other CTAs bounds that wait (wait_semaphore): if it gives up, it goes on, and so does
// every mbarrier wait behind it. So release builds leave these waits unbounded, which keeps clock reads and their live
// ranges out of the MMA step loops (bounding them all put 48-164 spill loads in each backward step loop, by
// scripts/sass_report.sh). Debug builds (-DDASH_DEBUG_HANGS) bound them too, to name a wait a kernel bug left
// waiting.
__device__ __forceinline__ void wait_barrier(uint64_t& barrier, int parity, const char* what) {
#if defined(DASH_DEBUG_HANGS)
  const long long start = global_timer_ns();
  while (!cutlass::arch::ClusterBarrier::try_wait(&barrier, parity)) {
    if (global_timer_ns() - start > kDebugWaitBoundNs) report_hang(what, parity);
  }
#else
  (void)what;
  cutlass::arch::ClusterBarrier::wait(&barrier, parity);
#endif
}

__device__ __forceinline__ int load_acquire(const int* address) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// Spins until *semaphore == expected and returns true; the acquire makes every global write released by the
// previous holder visible, and the proxy fence then orders them before this thread's bulk (async-proxy) reduce.
// Returns false, the order not reached, once the wait outlives `bound_ns` or another wait of the launch has given
// up (*abandoned != 0, read only while the semaphore is not there): the caller records why and goes on unordered,
// so that a launch whose CTAs cannot all be resident ends, in a wrong order, instead of hanging the stream. The
// other CTAs' waits then end at their next poll, and the launch finishes as soon as its work is done.
__device__ __forceinline__ bool wait_semaphore(const int* semaphore, int expected, const int* abandoned,
                                               long long bound_ns) {
  if (load_acquire(semaphore) != expected) {
    const long long start = global_timer_ns();
    while (load_acquire(semaphore) != expected) {
      if (load_acquire(abandoned) != 0 || global_timer_ns() - start > bound_ns) return false;
    }
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");
  return true;
}

// Adds one to *semaphore, releasing this thread's earlier writes, including completed bulk reduces
// (the proxy fence orders those async-proxy writes before the generic-proxy release).
__device__ __forceinline__ void release_semaphore(int* semaphore) {
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(semaphore) : "memory");
}

// gmem[0 .. bytes/4) += smem[0 .. bytes/4) in fp32, by the bulk copy engine, tracked by bulk groups.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem),
               "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
               : "memory");
}

// gmem[0 .. bytes/4) = smem[0 .. bytes/4), by the bulk copy engine, tracked by bulk groups.
__device__ __forceinline__ void bulk_store(float* gmem, const float* smem, int bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem),
               "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until the shared-memory sources of all committed bulk groups but the newest kPending have been
// read (those buffers may be reused); their global writes may still be in flight.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void bulk_wait_read_all() { bulk_wait_read<0>(); }

// Waits until all committed bulk groups have completed, global writes included. A semaphore may be
// released only after this: waiting for the reads alone would let the next contributor's add overtake.
__device__ __forceinline__ void bulk_wait_complete_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads (wgmma
// operands, bulk copies) of the same memory.
__device__ __forceinline__ void fence_shared_for_async_proxy() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// log2(e): the kernels work with exp2 and LSE * log2(e).
inline constexpr float kLog2e = 1.4426950408889634f;

// Dynamic shared memory one CTA may use on sm90 (227 KB).
inline constexpr int kMaxSharedBytesPerBlock = 227 * 1024;
// Shared memory of one SM (228 KB), and what the hardware reserves of it for each resident CTA (1 KB): CTAs
// sharing an SM must fit their dynamic shared memory and reserves together.
inline constexpr int kSharedBytesPerSm = 228 * 1024;
inline constexpr int kReservedSharedBytesPerBlock = 1024;

// Whether `ctas` CTAs of `bytes` dynamic shared memory each can share one SM.
constexpr bool fits_shared_memory(size_t bytes, int ctas) {
  return bytes <= kMaxSharedBytesPerBlock && (bytes + kReservedSharedBytesPerBlock) * ctas <= kSharedBytesPerSm;
}

// Registers per thread when `threads` threads share the SM (one CTA of them under __launch_bounds__(threads, 1), or
// the threads of all the CTAs the bounds' minimum puts on it): the 64K register file split evenly, in the
// allocation granularity of 8.
constexpr int launch_registers_per_thread(int threads) {
  constexpr int kRegisterFile = 65536;
  constexpr int kGranularity = 8;
  return kRegisterFile / threads / kGranularity * kGranularity;
}

__device__ __forceinline__ int warp_index() { return static_cast<int>(threadIdx.x) / 32; }
__device__ __forceinline__ int lane_index() { return static_cast<int>(threadIdx.x) % 32; }

}  // namespace dash::sm90
