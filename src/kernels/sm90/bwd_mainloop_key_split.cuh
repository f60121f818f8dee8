// Backward mainloop at d = 192 and 256, the key split: dK and dV of 64 rows would take 192 or 256 registers per
// thread, so both MMA warpgroups work on the job's 64x96 or 64x80 tile and split its keys. Warpgroup w, per step:
//   S = Q K^T, dP = dO V^T for its n keys [wn, wn + n) (n = 48 or 40) over the 64 query rows (wgmma; S^T's 96 or 80
//                                                   key rows are no whole number of 64-row wgmma tiles)
//   P, dS                                           (registers, bwd_scores.cuh), to shared memory
//   dV^T += dO^T P, dK^T += Q^T dS for its keys over all of head_dim (swapped wgmma, all operands in shared memory)
//   dQ_partial = dS K for its half of head_dim     (wgmma, over both warpgroups' keys)
// and the partial to the dQ writer (bwd_dq_handoff.cuh); dK and dV leave transposed, straight from the fragments
// (bwd_epilogue.cuh). The job loop is that of both layouts (bwd_job_loop.cuh).
// Invariants: both warpgroups walk the same jobs and steps, so the named barriers (kDsFreeBarrier, kDsReadyBarrier)
// pair up; a warpgroup overwrites the P or dS buffer only after the GEMMs that read its previous contents are
// complete (run says how at d = 192 and at d = 256, where P and dS share one buffer).
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
struct KeySplitMainloop {
  static_assert(Config::kSplitsKeys, "d = 192 and 256: the MMA warpgroups split the tile's keys");
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  using Scores = BackwardScores<Config>;
  using SlopeElement = typename Scores::SlopeElement;
  using DqHandoff = BackwardDqHandoff<Config>;

  // d = 192 and 256: both MMA warpgroups work on the 64x96 or 64x80 tile; warpgroup w computes S and dP for its n
  // keys [wn, wn + n) (n = 48 or 40) over the 64 query rows, dV^T and dK^T for those keys over all of head_dim, and
  // its dQ partial for head_dim columns [w d/2, (w + 1) d/2).
  //
  // P and dS meet in shared memory: the swapped dV^T and dK^T GEMMs take them as B operands (a wgmma B operand is
  // never in registers), and each warpgroup's dQ GEMM contracts over all keys, both warpgroups' dS columns. One
  // buffer each at d = 192 (a second pair of 24 KiB would need 240 KiB), so a step's stores wait at kDsFreeBarrier
  // until both warpgroups are past the previous step, whose GEMMs each completed before leaving it; kDsReadyBarrier
  // then publishes both warpgroups' columns to the GEMMs. At d = 256 P and dS share one buffer (Config::kSharesPdS):
  // a warpgroup's dV^T GEMM reads only its own keys' columns of P, so it writes P, syncs its own threads
  // (kWarpGroupBarrierBase + w), runs dV^T to completion and then writes dS over P before kDsReadyBarrier.
  //
  // dO's stage is released as soon as dV^T's GEMM is done, so the loader fills it with the next step's dO while dQ
  // and dK^T still run; Q's stage, read by dK^T, at the end of the step.
  __device__ static void run(const Params& p, SharedStorage& smem, int thread) {
    typename Config::TiledMmaSdP mma_sdp;
    typename Config::TiledMmadKV mma_dkv;
    typename Config::TiledMmadQ mma_dq;
    const int warp_group = uniform_warp_group(thread, Config::kWarpGroupThreads);
    auto thr_sdp = mma_sdp.get_thread_slice(thread);
    auto wg_sdp = warpgroup_operand_slice(mma_sdp, warp_group, Config::kWarpGroupThreads);
    auto wg_dkv = warpgroup_operand_slice(mma_dkv, warp_group, Config::kWarpGroupThreads);
    auto wg_dq = warpgroup_operand_slice(mma_dq, warp_group, Config::kWarpGroupThreads);

    // P and dS share shared.ds, (query, key, buffer), as dQ's MN-major A operand and as stmatrix's destination, and
    // shared.dst, (key, query, buffer), as the K-major B operands of dV^T and dK^T.
    const typename Config::SharedTensors shared(smem);

    // S and dP: all 64 query rows (A), the warpgroup's keys (B).
    Tensor tSrQ = wg_sdp.partition_fragment_A(shared.q);
    Tensor tSrdO = wg_sdp.partition_fragment_A(shared.dout);
    Tensor tSrK = wg_sdp.partition_fragment_B(shared.k);
    Tensor tSrV = wg_sdp.partition_fragment_B(shared.v);
    // dV^T and dK^T: dO^T or Q^T over all of head_dim (A), P or dS of the warpgroup's keys (B).
    Tensor tdVrdOt = wg_dkv.partition_fragment_A(shared.doutt);
    Tensor tdKrQt = wg_dkv.partition_fragment_A(shared.qt);
    Tensor tdKVrPdS = wg_dkv.partition_fragment_B(shared.dst);
    // dQ: dS over all keys (A), the warpgroup's half of head_dim (B).
    Tensor tdQrdS = wg_dq.partition_fragment_A(shared.ds);
    Tensor tdQrKt = wg_dq.partition_fragment_B(shared.kt);
    // P and dS go to shared memory with the transposing stmatrix: the accumulator's rows are queries, which are
    // contiguous there; each 8 x 8 block becomes 8 rows of 16 bytes, one per key. Four blocks (16 x 16) per
    // instruction where the warpgroup's keys are whole 16-key blocks (48 at d = 192), two (16 x 8) where not (40).
    using PdSStore = std::conditional_t<Config::kKeyColumns % 16 == 0, SM90_U16x8_STSM_T, SM90_U16x4_STSM_T>;
    auto pds_store = make_tiled_copy_C(Copy_Atom<PdSStore, Element>{}, mma_sdp);
    auto thr_pds_store = pds_store.get_thread_slice(thread);
    Tensor tPdSsPdS = thr_pds_store.partition_D(shared.ds);
    // (query row, key) of each S element this thread holds: its warpgroup's keys.
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

    // The left bound's test, as in the rows layout (bwd_mainloop_rows.cuh).
    const auto left_bounded = [&p] { return p.plan.problem.window.left >= 0; };
    // dV^T and dK^T of the warpgroup's keys (the job loop): 72 + 72 fp32 registers per thread at d = 192, 80 + 80 at 256.
    const auto run_step = [&](const BackwardJobStep& step, const MaskShape& mask, int kv_row0, auto& tdKrdK,
                              auto& tdVrdV) {
      const auto [s, steps, stage, dout_stage, q_row0] = step;

      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      warpgroup_gemm<true>(mma_sdp, tSrQ(_, _, _, stage), tSrK, tSrS);
      warpgroup_gemm<true>(mma_sdp, tSrdO(_, _, _, dout_stage), tSrV, tdPrdP);
      // The previous step's (last block of its) dQ partial is handed over only now, as in the rows layout (bwd_mainloop_rows.cuh).
      if (s > 0) DqHandoff::commit_dq(smem, warp_group, Config::dq_last_position(steps - 1));

      warpgroup_wait<1>();
      // P in place of S, masked only where the tile crosses a mask's ends (bwd_mainloop_rows.cuh says why this way).
      Tensor tSrSlope = make_tensor<SlopeElement>(tSrS.layout());  // used only where kKeepsSlope
      Scores::step_probabilities(left_bounded(), tSrS, tSrSlope, tScS, smem.lse_log2[stage], mask, q_row0, kv_row0, p);
      Tensor tPrP = make_tensor<Element>(tSrS.layout());
      Tensor tdSrdS = make_tensor<Element>(tdPrdP.layout());
      constexpr auto kP = Int<Config::kKeySplitP>{};
      constexpr auto kdS = Int<Config::kKeySplitdS>{};
      if constexpr (Config::kSharesPdS) {
        // P goes out and dV^T starts while dP's GEMM still runs, so that P's 16-bit copy is dead before dS is
        // computed: with dK^T's and dV^T's 160 registers, S's and dP's 40 and both 16-bit copies live at once,
        // ptxas spilled accumulators and serialized every wgmma.
        convert_to_operand<Element>(tSrS, tPrP);
        cutlass::arch::NamedBarrier::sync(Config::kMmaThreads, Config::kDsFreeBarrier);
        copy(pds_store, thr_pds_store.retile_S(tPrP), tPdSsPdS(_, _, _, kP));
        // The generic-proxy stores before wgmma's async-proxy reads; dV^T reads only this warpgroup's columns.
        fence_shared_for_async_proxy();
        cutlass::arch::NamedBarrier::sync(Config::kWarpGroupThreads, Config::kWarpGroupBarrierBase + warp_group);
        warpgroup_gemm<false>(mma_dkv, tdVrdOt(_, _, _, dout_stage), tdKVrPdS(_, _, _, kP), tdVrdV);
        warpgroup_wait<1>();  // dP done; dV^T may still run
        Scores::template compute_ds<false>(tSrS, tdPrdP, tSrSlope, operand_in_accumulator_layout(tPrP, tSrS),
                                           operand_in_accumulator_layout(tdSrdS, tdPrdP), tScS, smem.dpsum[dout_stage],
                                           smem.lse_log2[stage], p);
        warpgroup_wait<0>();  // dV^T done: dO's stage and this warpgroup's columns of P are free
        smem.step_rings.release_dout(steps);
        copy(pds_store, thr_pds_store.retile_S(tdSrdS), tPdSsPdS(_, _, _, kdS));
      } else {
        warpgroup_wait<0>();
        Scores::compute_ds(tSrS, tdPrdP, tSrSlope, operand_in_accumulator_layout(tPrP, tSrS),
                           operand_in_accumulator_layout(tdSrdS, tdPrdP), tScS, smem.dpsum[dout_stage],
                           smem.lse_log2[stage], p);
        cutlass::arch::NamedBarrier::sync(Config::kMmaThreads, Config::kDsFreeBarrier);
        copy(pds_store, thr_pds_store.retile_S(tPrP), tPdSsPdS(_, _, _, kP));
        copy(pds_store, thr_pds_store.retile_S(tdSrdS), tPdSsPdS(_, _, _, kdS));
      }
      // The generic-proxy stores before wgmma's async-proxy reads, then both warpgroups' columns are complete.
      fence_shared_for_async_proxy();
      cutlass::arch::NamedBarrier::sync(Config::kMmaThreads, Config::kDsReadyBarrier);

      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<Config::kHeadDim>>{});
      if constexpr (Config::kdQColumnBlocks == 1) {
        // dV^T, dQ, then dK^T, which runs while dQ is stored.
        static_assert(!Config::kSharesPdS, "P has a buffer of its own, so dV^T starts only now");
        warpgroup_gemm<false>(mma_dkv, tdVrdOt(_, _, _, dout_stage), tdKVrPdS(_, _, _, kP), tdVrdV);
        warpgroup_gemm<true>(mma_dq, tdQrdS(_, _, _, kdS), tdQrKt, tdQrdQ);
        warpgroup_gemm<false>(mma_dkv, tdKrQt(_, _, _, stage), tdKVrPdS(_, _, _, kdS), tdKrdK);
        warpgroup_wait<2>();  // dV^T done: dO's stage is free
        smem.step_rings.release_dout(steps);
        warpgroup_wait<1>();  // dQ done; dK^T may still run
        DqHandoff::store_dq(smem, tdQrdQ, warp_group, thread, Config::dq_position(steps, 0));
      } else {
        // d = 256: dQ by column blocks, each handed to the dQ writer on its own; dK^T runs beside the first.
        DqHandoff::dq_by_column_blocks(
            smem, mma_dq, tdQrdS(_, _, _, kdS), tdQrKt, tdQrdQ, warp_group, thread, steps,
            [&] { warpgroup_gemm<false>(mma_dkv, tdKrQt(_, _, _, stage), tdKVrPdS(_, _, _, kdS), tdKrdK); });
      }
      // All of this step's GEMMs are complete before Q's stage is released and before the warpgroup reaches the
      // next step's kDsFreeBarrier, after which the other warpgroup overwrites P and dS.
      warpgroup_wait<0>();
      smem.step_rings.release_q(steps);
    };
    BackwardJobLoop<Config>::run(p, smem, mma_dkv, warp_group, thread, run_step);
  }
};

}  // namespace dash::sm90
