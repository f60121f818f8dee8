// Backward, the MMA warpgroups' side of the dQ hand-off: each step's dQ partial goes to the dQ writer (bwd_dq_writer.cuh)
// through the dq ring in shared memory, by column blocks (Config::kdQColumnBlocks), in fragment order, which the
// postprocess undoes with the same tiled MMA. A block is written (store_dq), then committed (commit_dq: the
// async-proxy fence and the ring's full barrier) once later work has been issued, so that the fence does not wait on
// the stores.
// Invariants: a stage is written only after producer_acquire has seen the writer free it; the writer reads a block
// only after its commit.
#pragma once

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

template <class Config>
struct BackwardDqHandoff {
  using SharedStorage = typename Config::SharedStorage;

  // dQ = dS K by column blocks (Config::kdQColumnBlocks), each handed over on its own, so that the dQ writer reduces
  // the first while the others are computed and only one block's registers are live: each block's GEMM, then its
  // store_dq at its position in the dq ring. issue_dk() issues the dK GEMM beside the first block; each later block
  // commits the previous one, whose stores drained while its GEMM was issued.
  template <class TiledMmadQ, class OperandA, class OperandB, class Accumulator, class IssueDk>
  __device__ static void dq_by_column_blocks(SharedStorage& smem, TiledMmadQ& mma_dq, const OperandA& ds,
                                             const OperandB& kt, Accumulator& dq, int warp_group, int thread, int steps,
                                             IssueDk&& issue_dk) {
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
      store_dq(smem, dq_block, warp_group, thread, Config::dq_position(steps, block));
    });
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

  // Hands the block store_dq wrote at `position` to the dQ writer, whose bulk copy reads it through the async proxy.
  __device__ static void commit_dq(SharedStorage& smem, int warp_group, int position) {
    fence_shared_for_async_proxy();
    smem.dq_stages[warp_group].producer_commit(position);
  }
};

}  // namespace dash::sm90
