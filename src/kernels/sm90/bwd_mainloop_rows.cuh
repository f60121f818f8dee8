// Backward mainloop up to d = 128, the rows layout: MMA warpgroup w owns key/value rows [64w, 64w + 64) of the job's
// tile and keeps their dK and dV in registers while it visits the schedule's query tiles. Per step:
//   S^T = K Q^T, dP^T = V dO^T          (wgmma, shared-memory operands)
//   P^T, dS^T                           (registers, bwd_scores.cuh)
//   dV += P^T dO, dK += dS^T Q          (wgmma, P^T and dS^T from registers)
//   dQ_partial = dS K                   (wgmma, dS^T through shared memory)
// and the partial to the dQ writer (bwd_dq_handoff.cuh). The job loop around the step and the dK/dV epilogue are
// those of both layouts (bwd_job_loop.cuh, bwd_epilogue.cuh).
// The dQ GEMM contracts over both warpgroups' key rows, so they meet at kDsReadyBarrier every step.
// Invariants: both warpgroups walk the same jobs and steps, so the named barriers pair up; a dS buffer (one per Q
// stage) is overwritten only after the dQ GEMMs that read it are complete: each step waits for all its GEMMs before
// it releases its Q stage, and the loader refills a stage only after both warpgroups released it.
#pragma once

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_dq_handoff.cuh"
#include "kernels/sm90/bwd_job_loop.cuh"
#include "kernels/sm90/bwd_scores.cuh"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

template <class Config>
struct RowsMainloop {
  static_assert(!Config::kSplitsKeys, "up to d = 128: each MMA warpgroup owns 64 key/value rows");
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  using Scores = BackwardScores<Config>;
  using SlopeElement = typename Scores::SlopeElement;
  using DqHandoff = BackwardDqHandoff<Config>;

  // Up to d = 128: MMA warpgroup w owns key/value rows [64w, 64w + 64) of the job's tile.
  __device__ static void run(const Params& p, SharedStorage& smem, int thread) {
    typename Config::TiledMmaSdP mma_sdp;
    typename Config::TiledMmadKV mma_dkv;
    typename Config::TiledMmadQ mma_dq;
    const int warp_group = uniform_warp_group(thread, Config::kWarpGroupThreads);
    auto thr_sdp = mma_sdp.get_thread_slice(thread);
    auto wg_sdp = warpgroup_operand_slice(mma_sdp, warp_group, Config::kWarpGroupThreads);
    auto wg_dkv = warpgroup_operand_slice(mma_dkv, warp_group, Config::kWarpGroupThreads);
    auto wg_dq = warpgroup_operand_slice(mma_dq, warp_group, Config::kWarpGroupThreads);

    const typename Config::SharedTensors shared(smem);

    Tensor tSrK = wg_sdp.partition_fragment_A(shared.k);
    Tensor tSrV = wg_sdp.partition_fragment_A(shared.v);
    Tensor tSrQ = wg_sdp.partition_fragment_B(shared.q);
    Tensor tSrdO = wg_sdp.partition_fragment_B(shared.dout);
    Tensor tdVrdOt = wg_dkv.partition_fragment_B(shared.doutt);
    Tensor tdKrQt = wg_dkv.partition_fragment_B(shared.qt);
    // dQ = dS K over both warpgroups' keys.
    Tensor tdQrdS = wg_dq.partition_fragment_A(shared.ds);
    Tensor tdQrKt = wg_dq.partition_fragment_B(shared.kt);
    // dS^T goes to shared memory with stmatrix: each 8 x 8 block of the accumulator is a row of 16
    // contiguous bytes there (queries are contiguous in dS^T), four blocks per instruction.
    auto ds_store = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto thr_ds_store = ds_store.get_thread_slice(thread);
    Tensor tdSsdSt = thr_ds_store.partition_D(shared.dst);
    // (key row, query column) of each S^T element this thread holds.
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));

    // Whether a window bounds the keys on the left: tested first in each step's mask decision, so that the full
    // and causal masks' steps do not compute the left end. Read from the kernel's parameters at each step rather
    // than kept in a register, which the d = 64 step loop spilled (one local load per step).
    const auto left_bounded = [&p] { return p.plan.problem.window.left >= 0; };
    const auto run_step = [&](const BackwardJobStep& step, const MaskShape& mask, int kv_row0, auto& tdKrdK,
                              auto& tdVrdV) {
      const auto [s, steps, stage, dout_stage, q_row0] = step;

      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      warpgroup_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS);
      warpgroup_gemm<true>(mma_sdp, tSrV, tSrdO(_, _, _, dout_stage), tdPrdP);
      // The previous step's dQ partial is handed over only now: its stores drained while the GEMMs
      // above were issued, so the fence before the hand-over no longer stalls on them.
      if (s > 0) DqHandoff::commit_dq(smem, warp_group, Config::dq_last_position(steps - 1));

      warpgroup_wait<1>();
      // P^T, in place of S^T. Only tiles crossing the causal diagonal, a sliding window's bounds or the key
      // tail need the mask: visible_keys and first_visible_key grow with the row, so the tile's first row
      // bounds the right ends and its last row the left ends (0 without a left bound; rows past seqlen_q
      // have P = 0 anyway). The branch is uniform over the CTA, so each loop stays branch-free.
      // The left ends are tested only under a left window bound, in a path of its own, so that the full and
      // causal masks' masked steps run what they did before windows.
      Tensor tSrSlope = make_tensor<SlopeElement>(tSrS.layout());  // used only where kKeepsSlope
      Scores::step_probabilities(left_bounded(), tSrS, tSrSlope, tScS, smem.lse_log2[stage], mask, q_row0, kv_row0, p);
      // dS^T = P^T o (dP^T - dpsum). P^T and dS^T go straight to the MMA element type, so their fp32
      // copies die element by element and the register peak stays low.
      warpgroup_wait<0>();
      Tensor tdVrP = make_operand_a_for<Element>(tSrS);
      Tensor tdKrdS = make_operand_a_for<Element>(tdPrdP);
      Scores::compute_ds(tSrS, tdPrdP, tSrSlope, operand_in_accumulator_layout(tdVrP, tSrS),
                         operand_in_accumulator_layout(tdKrdS, tdPrdP), tScS, smem.dpsum[dout_stage],
                         smem.lse_log2[stage], p);
      // dS^T to shared memory for the dQ GEMM, which contracts over both warpgroups' key rows. Stored
      // before the dV GEMM is issued, so the stores drain under its issue instead of stalling the fence.
      copy(ds_store, thr_ds_store.retile_S(make_tensor(tdKrdS.data(), tSrS.layout())), tdSsdSt(_, _, _, stage));
      warpgroup_gemm<false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, dout_stage), tdVrdV);
      fence_shared_for_async_proxy();
      cutlass::arch::NamedBarrier::sync(Config::kMmaThreads, Config::kDsReadyBarrier);

      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<Config::kHeadDim>>{});
      static_assert(Config::kdQColumnBlocks == 1, "up to d = 128 the partial is one block");
      warpgroup_gemm<true>(mma_dq, tdQrdS(_, _, _, stage), tdQrKt, tdQrdQ);
      warpgroup_gemm<false>(mma_dkv, tdKrdS, tdKrQt(_, _, _, stage), tdKrdK);
      warpgroup_wait<1>();  // dV and dQ done; dK may still run
      DqHandoff::store_dq(smem, tdQrdQ, warp_group, thread, Config::dq_position(steps, 0));
      warpgroup_wait<0>();
      smem.step_rings.release_dout(steps);
      smem.step_rings.release_q(steps);
    };
    BackwardJobLoop<Config>::run(p, smem, mma_dkv, warp_group, thread, run_step);
  }
};

}  // namespace dash::sm90
