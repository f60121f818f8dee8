// Small sm90 PTX primitives the kernels are built from: ordering semaphores in global memory, the bulk
// (non-tensor) copy engine, and proxy fences. Each wraps one or two instructions and says why it is
// needed; nothing here knows about attention.
#pragma once

#include <cstdint>

#include <cute/arch/util.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdio>

namespace dash::sm90 {

#if defined(DASH_DEBUG_HANGS)
// Cycles after which a debug build reports a wait as hung (about 5 s at 1.98 GHz).
inline constexpr long long kHangCycles = 10'000'000'000LL;

__device__ __forceinline__ void report_hang(const char* what, int detail) {
  printf("dash: CTA %d thread %d stuck in %s (%d)\n", static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x),
         what, detail);
  __trap();
}
#endif

// Waits until phase `parity` of an mbarrier has completed. Debug builds (-DDASH_DEBUG_HANGS) turn a
// wait that never ends into a printed diagnosis and a trapped launch instead of a hang.
__device__ __forceinline__ void wait_barrier(uint64_t& barrier, int parity, const char* what) {
#if defined(DASH_DEBUG_HANGS)
  const long long start = clock64();
  while (!cutlass::arch::ClusterBarrier::test_wait(&barrier, parity, 1)) {
    if (clock64() - start > kHangCycles) report_hang(what, parity);
  }
#else
  (void)what;
  cutlass::arch::ClusterBarrier::wait(&barrier, parity);
#endif
}

// Spins until *semaphore == expected. The acquire makes every global write released by the previous
// holder visible; the proxy fence then orders them before this thread's bulk (async-proxy) reduce.
__device__ __forceinline__ void wait_semaphore(const int* semaphore, int expected) {
  int value;
#if defined(DASH_DEBUG_HANGS)
  const long long start = clock64();
#endif
  do {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(value) : "l"(semaphore) : "memory");
#if defined(DASH_DEBUG_HANGS)
    if (clock64() - start > kHangCycles) report_hang("dQ semaphore wait", expected);
#endif
  } while (value != expected);
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Adds one to *semaphore, releasing this thread's earlier writes, including completed bulk reduces
// (the proxy fence orders those async-proxy writes before the generic-proxy release).
__device__ __forceinline__ void release_semaphore(int* semaphore) {
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(semaphore) : "memory");
}

// gmem[0 .. bytes/4) += smem[0 .. bytes/4) in fp32, by the bulk copy engine, tracked by bulk groups.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               ::"l"(gmem), "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
               : "memory");
}

// gmem[0 .. bytes/4) = smem[0 .. bytes/4), by the bulk copy engine, tracked by bulk groups.
__device__ __forceinline__ void bulk_store(float* gmem, const float* smem, int bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               ::"l"(gmem), "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until the shared-memory sources of all committed bulk groups have been read (the buffers
// may be reused); their global writes may still be in flight.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

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

// Registers per thread a CTA of `threads` threads gets at launch under __launch_bounds__(threads, 1):
// the 64K register file split evenly, in the allocation granularity of 8.
constexpr int launch_registers_per_thread(int threads) {
  constexpr int kRegisterFile = 65536;
  constexpr int kGranularity = 8;
  return kRegisterFile / threads / kGranularity * kGranularity;
}

__device__ __forceinline__ int warp_index() { return static_cast<int>(threadIdx.x) / 32; }
__device__ __forceinline__ int lane_index() { return static_cast<int>(threadIdx.x) % 32; }

}  // namespace dash::sm90
