// Backward, the MMA warpgroups' side of the dQ hand-off: each step's dQ partial goes to the dQ writer (bwd_dq_writer.cuh)
// through the dq ring in shared memory, by column blocks (Config::kdQColumnBlocks), in fragment order, which the
// postprocess undoes with the same tiled MMA. A block is written (store_dq, or in the chained layout chain_dq), then
// committed (commit_dq: the async-proxy fence and the ring's full barrier) once later work has been issued, so that
// the fence does not wait on the stores.
// Invariants: a stage is written only after producer_acquire has seen the writer free it; the writer reads a block
// only after its commit; in the chained layout warpgroup 1 reaches a stage only through dq_chain, after warpgroup 0's
// acquire, and it alone commits.
#pragma once

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

template <class Config>
struct BackwardDqHandoff {
  using SharedStorage = typename Config::SharedStorage;

  // dQ = dS K by column blocks (Config::kdQColumnBlocks), each handed over on its own, so that the dQ writer reduces
  // the first while the others are computed and only one block's registers are live: each block's GEMM, then
  // hand_over(block, its position in the dq ring). issue_dk() issues the dK GEMM beside the first block; each later
  // block commits the previous one, whose stores drained while its GEMM was issued.
  template <class TiledMmadQ, class OperandA, class OperandB, class Accumulator, class IssueDk, class HandOver>
  __device__ static void dq_by_column_blocks(SharedStorage& smem, TiledMmadQ& mma_dq, const OperandA& ds,
                                             const OperandB& kt, Accumulator& dq, int warp_group, int steps,
                                             IssueDk&& issue_dk, HandOver&& hand_over) {
    for_each(make_int_sequence<Config::kdQColumnBlocks>{}, [&](auto block) {
      Tensor dq_block = mode_block<2>(dq, block);
      warpgroup_gemm<true>(mma_dq, ds, mode_block<1>(kt, block), dq_block);
      if constexpr (decltype(block)::value == 0) {
        issue_dk();
        warpgroup_wait<1>();  // the block is done; dK may still run
      } else {
        commit_dq(smem, warp_group, Config::dq_position(steps, block - 1));
        warpgroup_wait<0>();
      }
      hand_over(dq_block, Config::dq_position(steps, block));
    });
  }

  // The chained layout's hand-over of a block of a step's dQ, position `position` of the dq ring
  // (Config::kChainsDq): warpgroup 0 writes its block to the ring's stage in fragment order, as store_dq does, and
  // arrives on the stage's dq_chain barrier; warpgroup 1 waits there, adds its own block element by element (p0 + p1,
  // each element by the thread that holds both) and writes the sum back, which it alone commits to the dQ writer
  // (commit_dq). Only warpgroup 0 waits for the stage to be free: warpgroup 1 reaches it only through dq_chain, after
  // warpgroup 0's wait. Neither side can be lapped: warpgroup 0's next arrival on the stage's dq_chain barrier waits
  // for the stage, which the writer frees only after warpgroup 1 has waited there, summed and committed.
  template <class Fragment>
  __device__ static void chain_dq(SharedStorage& smem, const Fragment& dq, int warp_group, int thread, int position) {
    static_assert(Config::kdQPartials == 1, "one partial per step, the sum");
    constexpr int kVectors = decltype(size(dq))::value / 4;
    static_assert(kVectors * 4 * Config::kWarpGroupThreads == Config::kdQBlockFloats, "a block per position");
    const int lane = thread % Config::kWarpGroupThreads;
    if (warp_group == 0) {
      const int stage = smem.dq_stages[0].producer_acquire(position, "dq_empty");
      float4* dst = reinterpret_cast<float4*>(smem.dq.data() + stage * Config::kdQBlockFloats);
      CUTE_UNROLL
      for (int i = 0; i < kVectors; ++i) {
        dst[i * Config::kWarpGroupThreads + lane] = make_float4(dq(4 * i), dq(4 * i + 1), dq(4 * i + 2), dq(4 * i + 3));
      }
      smem.dq_chain.producer_commit(position);
    } else {
      const int stage = smem.dq_chain.consumer_wait(position, "dq_chain");
      float4* sum = reinterpret_cast<float4*>(smem.dq.data() + stage * Config::kdQBlockFloats);
      CUTE_UNROLL
      for (int i = 0; i < kVectors; ++i) {
        const float4 first = sum[i * Config::kWarpGroupThreads + lane];
        sum[i * Config::kWarpGroupThreads + lane] =
            make_float4(first.x + dq(4 * i), first.y + dq(4 * i + 1), first.z + dq(4 * i + 2), first.w + dq(4 * i + 3));
      }
    }
  }

  // Writes a column block of this warpgroup's dQ partial (all of it where the partial is one block), position
  // `position` of its dq ring (Config::dq_position), to the ring's stage in fragment order (each thread's values as
  // consecutive float4s), which the postprocess kernel undoes with the same tiled MMA. The stage is free once the dQ
  // writer has read the position kdQBufferStages before; the writer sees this one only after commit_dq.
  template <class Fragment>
  __device__ static void store_dq(SharedStorage& smem, const Fragment& dq, int warp_group, int thread, int position) {
    const int stage = smem.dq_stages[warp_group].producer_acquire(position, "dq_empty");
    constexpr int kVectors = decltype(size(dq))::value / 4;
    static_assert(kVectors * 4 * Config::kWarpGroupThreads == Config::kdQBlockFloats, "a block per position");
    float4* dst =
        reinterpret_cast<float4*>(smem.dq.data() + (stage * Config::kdQPartials + warp_group) * Config::kdQBlockFloats);
    const int lane = thread % Config::kWarpGroupThreads;
    CUTE_UNROLL
    for (int i = 0; i < kVectors; ++i) {
      dst[i * Config::kWarpGroupThreads + lane] = make_float4(dq(4 * i), dq(4 * i + 1), dq(4 * i + 2), dq(4 * i + 3));
    }
  }

  // Hands the block store_dq wrote at `position` to the dQ writer, whose bulk copy reads it through the async proxy;
  // in the chained layout warpgroup 1 hands over the sum chain_dq left there, and warpgroup 0 nothing.
  __device__ static void commit_dq(SharedStorage& smem, int warp_group, int position) {
    if constexpr (Config::kChainsDq) {
      if (warp_group == 0) return;
      fence_shared_for_async_proxy();
      smem.dq_stages[0].producer_commit(position);
    } else {
      fence_shared_for_async_proxy();
      smem.dq_stages[warp_group].producer_commit(position);
    }
  }
};

}  // namespace dash::sm90
