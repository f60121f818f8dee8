// Backward consumer warpgroups: for each job, keep dK and dV of the key/value tile in registers while
// visiting the schedule's query tiles; per step compute
//   S^T = K Q^T, dP^T = V dO^T                      (wgmma, shared-memory operands)
//   P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)), masked
//   dS^T = P^T o (dP^T - rowsum(dO o O))
// (softcap kernels: S^T <- tanh(S^T * scale / softcap) with softcap * log2(e) in place of scale * log2(e), and
// dS^T multiplied by 1 - tanh^2, kept from P's computation to dS's in fp16 where registers allow; see
// compute_probabilities and compute_ds)
//   dV += P^T dO, dK += dS^T Q                       (wgmma, P^T and dS^T from registers)
//   dQ_partial = dS K                                (wgmma, dS through shared memory)
// and hand dQ_partial to the dQ writer. At the end of the job write dK * scale and dV.
//
// Two layouts of the work over the two MMA warpgroups (bwd_config.cuh):
// - up to d = 128 (run_rows) each warpgroup owns 64 key/value rows: S^T, dP^T, dK and dV of its rows, P^T and dS^T
//   straight from registers into the dV and dK GEMMs; only dS^T goes through shared memory, for dQ, which
//   contracts over both warpgroups' rows.
// - at d = 192 and 256 (run_key_split) dK and dV of 64 rows would take 192 or 256 registers per thread, so both
//   warpgroups work on a 64x96 or 64x80 tile and split its keys: each computes S = Q K^T and dP = dO V^T for its
//   48 or 40 keys (the query rows as M: S^T's 96 or 80 key rows are no whole number of 64-row wgmma tiles), writes
//   P and dS to shared memory, and runs the swapped dV^T += dO^T P and dK^T += Q^T dS for its keys over all of
//   head_dim, and dQ = dS K for its half of head_dim after a barrier, all operands from shared memory. dK and dV
//   leave transposed, straight from the fragments.
// Invariants: both warpgroups walk the same jobs and steps (the loader's records), so the named barriers
// (kDsReadyBarrier, kDsFreeBarrier) pair up; a warpgroup overwrites a shared P or dS buffer only after the GEMMs
// that read its previous contents are complete (see each path).
#pragma once

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gemm.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule/mask.hpp"

namespace dash::sm90 {

template <class Config>
struct BackwardMma {
  using Element = typename Config::Element;
  // tanh's derivative, which softcap kernels keep from P's computation to dS's where it fits (compute_probabilities).
  using SlopeElement = cutlass::half_t;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  // The S^T values each MMA thread holds per step, and how many of their slopes fit beside S^T, dP^T, dK and dV: 32
  // (16 registers) at d = 96 to 256 spill nothing, while at d = 64 the 128x128 tile's 64 (32 registers) spilled 92
  // loads and 88 stores per step (scripts/sass_report.sh), so there compute_ds takes tanh back from P instead.
  static constexpr int kScoresPerThread = kBlockN * kBlockM / Config::kMmaThreads;
  static constexpr int kMaxKeptSlopes = 32;
  static constexpr bool kKeepsSlope = Config::kSoftcap && kScoresPerThread <= kMaxKeptSlopes;

  __device__ static void run(const Params& p, SharedStorage& smem, int thread) {
    if constexpr (Config::kSplitsKeys) {
      run_key_split(p, smem, thread);
    } else {
      run_rows(p, smem, thread);
    }
  }

 private:
  // Up to d = 128: MMA warpgroup w owns key/value rows [64w, 64w + 64) of the job's tile.
  __device__ static void run_rows(const Params& p, SharedStorage& smem, int thread) {
    typename Config::TiledMmaSdP mma_sdp;
    typename Config::TiledMmadKV mma_dkv;
    typename Config::TiledMmadQ mma_dq;
    const int warp_group = uniform_warp_group(thread, Config::kWarpGroupThreads);
    auto thr_sdp = mma_sdp.get_thread_slice(thread);
    auto wg_sdp = warpgroup_operand_slice(mma_sdp, warp_group, Config::kWarpGroupThreads);
    auto wg_dkv = warpgroup_operand_slice(mma_dkv, warp_group, Config::kWarpGroupThreads);
    // The chained layout's dQ GEMM is one warpgroup's tiled MMA, whose only slice is the first (each warpgroup picks
    // its keys through dq_keys instead).
    auto wg_dq = warpgroup_operand_slice(mma_dq, Config::kChainsDq ? 0 : warp_group, Config::kWarpGroupThreads);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Config::SmemLayoutdO{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Config::SmemLayoutdOt{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKt{});
    Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Config::SmemLayoutdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Config::SmemLayoutdSt{});

    Tensor tSrK = wg_sdp.partition_fragment_A(sK);
    Tensor tSrV = wg_sdp.partition_fragment_A(sV);
    Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);
    Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
    Tensor tdVrdOt = wg_dkv.partition_fragment_B(sdOt);
    Tensor tdKrQt = wg_dkv.partition_fragment_B(sQt);
    // dQ = dS K over both warpgroups' keys, or in the chained layout over the warpgroup's own (dq_keys).
    Tensor tdQrdS = wg_dq.partition_fragment_A(dq_keys(sdS, warp_group));
    Tensor tdQrKt = wg_dq.partition_fragment_B(dq_keys(sKt, warp_group));
    // dS^T goes to shared memory with stmatrix: each 8 x 8 block of the accumulator is a row of 16
    // contiguous bytes there (queries are contiguous in dS^T), four blocks per instruction.
    auto ds_store = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto thr_ds_store = ds_store.get_thread_slice(thread);
    Tensor tdSsdSt = thr_ds_store.partition_D(sdSt);
    // (key row, query column) of each S^T element this thread holds.
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));

    // Whether a window bounds the keys on the left: tested first in each step's mask decision, so that the full
    // and causal masks' steps do not compute the left end. Read from the kernel's parameters at each step rather
    // than kept in a register, which the d = 64 step loop spilled (one local load per step).
    const auto left_bounded = [&p] { return p.plan.problem.window.left >= 0; };
    const auto run_step = [&](const JobStep& step, const MaskShape& mask, int kv_row0, auto& tdKrdK, auto& tdVrdV) {
      const auto [s, steps, stage, dout_stage, q_row0] = step;

      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      warpgroup_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS);
      warpgroup_gemm<true>(mma_sdp, tSrV, tSrdO(_, _, _, dout_stage), tdPrdP);
      // The previous step's dQ partial is handed over only now: its stores drained while the GEMMs
      // above were issued, so the fence before the hand-over no longer stalls on them.
      if (s > 0) commit_dq(smem, warp_group, Config::dq_last_position(steps - 1));

      warpgroup_wait<1>();
      // P^T, in place of S^T. Only tiles crossing the causal diagonal, a sliding window's bounds or the key
      // tail need the mask: visible_keys and first_visible_key grow with the row, so the tile's first row
      // bounds the right ends and its last row the left ends (0 without a left bound; rows past seqlen_q
      // have P = 0 anyway). The branch is uniform over the CTA, so each loop stays branch-free.
      // The left ends are tested only under a left window bound, in a path of its own, so that the full and
      // causal masks' masked steps run what they did before windows.
      Tensor tSrSlope = make_tensor<SlopeElement>(tSrS.layout());  // used only where kKeepsSlope
      step_probabilities(left_bounded(), tSrS, tSrSlope, tScS, smem.lse_log2[stage], mask, q_row0, kv_row0, p);
      // dS^T = P^T o (dP^T - dpsum). P^T and dS^T go straight to the MMA element type, so their fp32
      // copies die element by element and the register peak stays low.
      warpgroup_wait<0>();
      Tensor tdVrP = make_operand_a_for<Element>(tSrS);
      Tensor tdKrdS = make_operand_a_for<Element>(tdPrdP);
      compute_ds(tSrS, tdPrdP, tSrSlope, operand_in_accumulator_layout(tdVrP, tSrS),
                 operand_in_accumulator_layout(tdKrdS, tdPrdP), tScS, smem.dpsum[dout_stage], smem.lse_log2[stage], p);
      // dS^T to shared memory for the dQ GEMM, which contracts over both warpgroups' key rows. Stored
      // before the dV GEMM is issued, so the stores drain under its issue instead of stalling the fence.
      copy(ds_store, thr_ds_store.retile_S(make_tensor(tdKrdS.data(), tSrS.layout())), tdSsdSt(_, _, _, stage));
      warpgroup_gemm<false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, dout_stage), tdVrdV);
      fence_shared_for_async_proxy();
      if constexpr (Config::kChainsDq) {
        // The dQ GEMM reads only this warpgroup's columns of dS: its own threads' stores.
        cutlass::arch::NamedBarrier::sync(Config::kWarpGroupThreads, Config::kWarpGroupBarrierBase + warp_group);
      } else {
        cutlass::arch::NamedBarrier::sync(Config::kMmaThreads, Config::kDsReadyBarrier);
      }

      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<Config::kHeadDim>>{});
      if constexpr (Config::kdQColumnBlocks == 1) {
        warpgroup_gemm<true>(mma_dq, tdQrdS(_, _, _, stage), tdQrKt, tdQrdQ);
        warpgroup_gemm<false>(mma_dkv, tdKrdS, tdKrQt(_, _, _, stage), tdKrdK);
        warpgroup_wait<1>();  // dV and dQ done; dK may still run
        if constexpr (Config::kChainsDq) {
          chain_dq(smem, tdQrdQ, warp_group, thread, Config::dq_position(steps, 0));
        } else {
          store_dq(smem, tdQrdQ, warp_group, thread, Config::dq_position(steps, 0));
        }
      } else {
        // The chained layout at d = 64 and 128: dQ by column blocks, each chained on its own.
        static_assert(Config::kChainsDq, "column blocks up to d = 128 only in the chained layout");
        dq_by_column_blocks(
            smem, mma_dq, tdQrdS(_, _, _, stage), tdQrKt, tdQrdQ, warp_group, steps,
            [&] { warpgroup_gemm<false>(mma_dkv, tdKrdS, tdKrQt(_, _, _, stage), tdKrdK); },
            [&](const auto& block, int position) { chain_dq(smem, block, warp_group, thread, position); });
      }
      warpgroup_wait<0>();
      smem.step_rings.release_dout(steps);
      smem.step_rings.release_q(steps);
    };
    run_jobs(p, smem, mma_dkv, warp_group, thread, run_step);
  }

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
  __device__ static void run_key_split(const Params& p, SharedStorage& smem, int thread) {
    typename Config::TiledMmaSdP mma_sdp;
    typename Config::TiledMmadKV mma_dkv;
    typename Config::TiledMmadQ mma_dq;
    const int warp_group = uniform_warp_group(thread, Config::kWarpGroupThreads);
    auto thr_sdp = mma_sdp.get_thread_slice(thread);
    auto wg_sdp = warpgroup_operand_slice(mma_sdp, warp_group, Config::kWarpGroupThreads);
    auto wg_dkv = warpgroup_operand_slice(mma_dkv, warp_group, Config::kWarpGroupThreads);
    auto wg_dq = warpgroup_operand_slice(mma_dq, warp_group, Config::kWarpGroupThreads);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Config::SmemLayoutdO{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Config::SmemLayoutdOt{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKt{});
    // P and dS: (query, key, buffer) as dQ's MN-major A operand and as stmatrix's destination, (key, query, buffer)
    // as the K-major B operands of dV^T and dK^T.
    Tensor sPdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Config::SmemLayoutdS{});
    Tensor sPdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Config::SmemLayoutdSt{});

    // S and dP: all 64 query rows (A), the warpgroup's keys (B).
    Tensor tSrQ = wg_sdp.partition_fragment_A(sQ);
    Tensor tSrdO = wg_sdp.partition_fragment_A(sdO);
    Tensor tSrK = wg_sdp.partition_fragment_B(sK);
    Tensor tSrV = wg_sdp.partition_fragment_B(sV);
    // dV^T and dK^T: dO^T or Q^T over all of head_dim (A), P or dS of the warpgroup's keys (B).
    Tensor tdVrdOt = wg_dkv.partition_fragment_A(sdOt);
    Tensor tdKrQt = wg_dkv.partition_fragment_A(sQt);
    Tensor tdKVrPdS = wg_dkv.partition_fragment_B(sPdSt);
    // dQ: dS over all keys (A), the warpgroup's half of head_dim (B).
    Tensor tdQrdS = wg_dq.partition_fragment_A(sPdS);
    Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);
    // P and dS go to shared memory with the transposing stmatrix: the accumulator's rows are queries, which are
    // contiguous there; each 8 x 8 block becomes 8 rows of 16 bytes, one per key. Four blocks (16 x 16) per
    // instruction where the warpgroup's keys are whole 16-key blocks (48 at d = 192), two (16 x 8) where not (40).
    using PdSStore = std::conditional_t<Config::kKeyColumns % 16 == 0, SM90_U16x8_STSM_T, SM90_U16x4_STSM_T>;
    auto pds_store = make_tiled_copy_C(Copy_Atom<PdSStore, Element>{}, mma_sdp);
    auto thr_pds_store = pds_store.get_thread_slice(thread);
    Tensor tPdSsPdS = thr_pds_store.partition_D(sPdS);
    // (query row, key) of each S element this thread holds: its warpgroup's keys.
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

    // The left bound's test, as in run_rows.
    const auto left_bounded = [&p] { return p.plan.problem.window.left >= 0; };
    // dV^T and dK^T of the warpgroup's keys (run_jobs): 72 + 72 fp32 registers per thread at d = 192, 80 + 80 at 256.
    const auto run_step = [&](const JobStep& step, const MaskShape& mask, int kv_row0, auto& tdKrdK, auto& tdVrdV) {
      const auto [s, steps, stage, dout_stage, q_row0] = step;

      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      warpgroup_gemm<true>(mma_sdp, tSrQ(_, _, _, stage), tSrK, tSrS);
      warpgroup_gemm<true>(mma_sdp, tSrdO(_, _, _, dout_stage), tSrV, tdPrdP);
      // The previous step's (last block of its) dQ partial is handed over only now, as in run_rows.
      if (s > 0) commit_dq(smem, warp_group, Config::dq_last_position(steps - 1));

      warpgroup_wait<1>();
      // P in place of S, masked only where the tile crosses a mask's ends (run_rows says why this way).
      Tensor tSrSlope = make_tensor<SlopeElement>(tSrS.layout());  // used only where kKeepsSlope
      step_probabilities(left_bounded(), tSrS, tSrSlope, tScS, smem.lse_log2[stage], mask, q_row0, kv_row0, p);
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
        compute_ds<false>(tSrS, tdPrdP, tSrSlope, operand_in_accumulator_layout(tPrP, tSrS),
                          operand_in_accumulator_layout(tdSrdS, tdPrdP), tScS, smem.dpsum[dout_stage],
                          smem.lse_log2[stage], p);
        warpgroup_wait<0>();  // dV^T done: dO's stage and this warpgroup's columns of P are free
        smem.step_rings.release_dout(steps);
        copy(pds_store, thr_pds_store.retile_S(tdSrdS), tPdSsPdS(_, _, _, kdS));
      } else {
        warpgroup_wait<0>();
        compute_ds(tSrS, tdPrdP, tSrSlope, operand_in_accumulator_layout(tPrP, tSrS),
                   operand_in_accumulator_layout(tdSrdS, tdPrdP), tScS, smem.dpsum[dout_stage], smem.lse_log2[stage],
                   p);
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
        store_dq(smem, tdQrdQ, warp_group, thread, Config::dq_position(steps, 0));
      } else {
        // d = 256: dQ by column blocks, each handed to the dQ writer on its own; dK^T runs beside the first.
        dq_by_column_blocks(
            smem, mma_dq, tdQrdS(_, _, _, kdS), tdQrKt, tdQrdQ, warp_group, steps,
            [&] { warpgroup_gemm<false>(mma_dkv, tdKrQt(_, _, _, stage), tdKVrPdS(_, _, _, kdS), tdKrdK); },
            [&](const auto& block, int position) { store_dq(smem, block, warp_group, thread, position); });
      }
      // All of this step's GEMMs are complete before Q's stage is released and before the warpgroup reaches the
      // next step's kDsFreeBarrier, after which the other warpgroup overwrites P and dS.
      warpgroup_wait<0>();
      smem.step_rings.release_q(steps);
    };
    run_jobs(p, smem, mma_dkv, warp_group, thread, run_step);
  }

  // One step of a job, as run_jobs hands it to a layout's step body.
  struct JobStep {
    int index;       // within the job: 0 for its first
    int count;       // steps of the CTA before it: its place in the step ring and the dq ring
    int q_stage;     // Q's and the LSE's stage
    int dout_stage;  // dO's and dpsum's stage
    int q_row0;      // the first query row of its tile
  };

  // The job loop of both layouts: each job the loader publishes gets fresh dK and dV accumulators
  // (Config::dKVAccumulatorShape), waits for its K and V, runs `step_body(step, mask, kv_row0, tdKrdK, tdVrdV)` on
  // each of its steps once their Q and dO are in, hands its last dQ partial over (each step body hands over the
  // previous step's), frees K and V and writes dK and dV. The mask is the plan's (causal and the canonical sliding
  // window, the planner's make_tiled_problem) or in the varlen kernels the job's sequence's (job_mask).
  template <class TiledMmadKV, class StepBody>
  __device__ static void run_jobs(const Params& p, SharedStorage& smem, const TiledMmadKV& mma_dkv, int warp_group,
                                  int thread, StepBody&& step_body) {
    const MaskShape plan_mask = p.plan.problem.mask();
    int steps = 0;
    for (int jobs = 0;; ++jobs) {
      const typename Config::JobRecordType job = smem.jobs.take(jobs);
      if (job.num_steps == kEndOfWork) break;
      const MaskShape mask = job_mask(job, plan_mask);

      Tensor tdVrdV = partition_fragment_C(mma_dkv, typename Config::dKVAccumulatorShape{});
      Tensor tdKrdK = partition_fragment_C(mma_dkv, typename Config::dKVAccumulatorShape{});
      clear(tdVrdV);
      clear(tdKrdK);
      smem.kv_stages.consumer_wait(jobs, "kv_full");
      const int kv_row0 = job.kv_tile * kBlockN;
      for (int s = 0; s < job.num_steps; ++s, ++steps) {
        const int q_stage = smem.step_rings.wait_q(steps);
        const int dout_stage = smem.step_rings.wait_dout(steps);
        const int q_row0 = smem.steps[steps % Config::kStepRing].q_tile * kBlockM;
        step_body(JobStep{s, steps, q_stage, dout_stage, q_row0}, mask, kv_row0, tdKrdK, tdVrdV);
      }
      // The job's last partial goes out before the epilogue: other CTAs may wait on its dQ tile.
      if (job.num_steps > 0) {
        commit_dq(smem, warp_group, Config::dq_last_position(steps - 1));
      }
      smem.kv_stages.consumer_release(jobs);
      store_dkv(p, smem, job, tdKrdK, tdVrdV, thread);
    }
  }

  // P^T in place of one step's S^T, on the path its tile needs: masked where it crosses the right ends (the causal
  // diagonal, a window's right bound, the key tail) or, under a left window bound, the left ends; unmasked
  // otherwise. The branch is uniform over the CTA.
  template <class Fragment, class SlopeFragment, class Coords>
  __device__ static void step_probabilities(bool left_bounded, Fragment& s_frag, SlopeFragment& slope_frag,
                                            const Coords& coords_frag, const float* lse_log2, const MaskShape& mask,
                                            int q_row0, int kv_row0, const Params& p) {
    const bool crosses_right_ends = kv_row0 + kBlockN > mask.visible_keys(q_row0);
    if (left_bounded && (crosses_right_ends || kv_row0 < mask.first_visible_key(q_row0 + kBlockM - 1))) {
      compute_probabilities<MaskedEnds::kBoth>(s_frag, slope_frag, coords_frag, lse_log2, mask, q_row0, kv_row0, p);
    } else if (crosses_right_ends) {
      compute_probabilities<MaskedEnds::kRight>(s_frag, slope_frag, coords_frag, lse_log2, mask, q_row0, kv_row0, p);
    } else {
      compute_probabilities<MaskedEnds::kNone>(s_frag, slope_frag, coords_frag, lse_log2, mask, q_row0, kv_row0, p);
    }
  }

  // The mask the job runs: the plan's, or in the varlen kernels its sequence's.
  __device__ static MaskShape job_mask(const typename Config::JobRecordType& job, const MaskShape& plan_mask) {
    if constexpr (Config::kVarlen) {
      return job.mask;
    } else {
      return plan_mask;
    }
  }

  // The thread's S^T fragment viewed as (key rows, query columns); columns come in pairs of adjacent
  // queries, so their LSE and dpsum are read as one float2 per pair. In the key split the fragment is S's, (query
  // rows, key columns), and each row has one LSE and one dpsum.
  template <class Fragment>
  __device__ static auto by_rows_and_columns(Fragment& f) {
    return make_tensor(f.data(), accumulator_rows_by_columns(f.layout()));
  }

  // P^T = exp2(S^T * scale * log2(e) - LSE * log2(e)), 0 where the key is hidden from the query row. Softcap
  // kernels recompute the forward's capped score first: S^T <- tanh(S^T * scale / softcap), and p.scale_log2 is
  // softcap * log2(e); where kKeepsSlope they keep tanh's derivative 1 - tanh^2 in `slope_frag` for compute_ds. It
  // lies in [0, 1], so fp16 holds it to 2^-11 (below dS^T's own rounding to the MMA element type) in half the
  // registers of fp32, and keeping it spares compute_ds the MUFU.LG2 that takes tanh back from P (the softcap step's
  // third MUFU per score). The key split's S fragment gets the same, by query rows.
  template <MaskedEnds kMasked, class Fragment, class SlopeFragment, class Coords>
  __device__ static void compute_probabilities(Fragment& s_frag, SlopeFragment& slope_frag, const Coords& coords_frag,
                                               const float* lse_log2, const MaskShape& mask, int q_row0, int kv_row0,
                                               const Params& p) {
    Tensor s = by_rows_and_columns(s_frag);
    Tensor slope = make_tensor(slope_frag.data(), accumulator_rows_by_columns(slope_frag.layout()));
    Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
    constexpr bool kRight = kMasked != MaskedEnds::kNone;
    constexpr bool kLeft = kMasked == MaskedEnds::kBoth;
    if constexpr (Config::kSplitsKeys) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s); ++r) {
        const int query = get<0>(coords(r, 0));
        const float lse = lse_log2[query];
        const int limit = kRight ? mask.visible_keys(q_row0 + query) : 0;
        const int first = kLeft ? mask.first_visible_key(q_row0 + query) : 0;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s); ++c) {
          s(r, c) =
              probability<kRight, kLeft>(s(r, c), slope(r, c), lse, kv_row0 + get<1>(coords(r, c)), limit, first, p);
        }
      }
    } else {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); c += 2) {
        const int query = get<1>(coords(0, c));
        const float2 lse = *reinterpret_cast<const float2*>(lse_log2 + query);
        const int limits[2] = {kRight ? mask.visible_keys(q_row0 + query) : 0,
                               kRight ? mask.visible_keys(q_row0 + query + 1) : 0};
        const int firsts[2] = {kLeft ? mask.first_visible_key(q_row0 + query) : 0,
                               kLeft ? mask.first_visible_key(q_row0 + query + 1) : 0};
        CUTE_UNROLL
        for (int r = 0; r < size<0>(s); ++r) {
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            s(r, c + h) = probability<kRight, kLeft>(s(r, c + h), slope(r, c + h), h == 0 ? lse.x : lse.y,
                                                     kv_row0 + get<0>(coords(r, c + h)), limits[h], firsts[h], p);
          }
        }
      }
    }
  }

  // One score's probability (compute_probabilities): `key` is hidden where kRight and key >= limit, or kLeft and
  // key < first.
  template <bool kRight, bool kLeft, class Slope>
  __device__ __forceinline__ static float probability(float score, Slope& slope, float lse_log2, int key, int limit,
                                                      int first, const Params& p) {
    if constexpr (Config::kSoftcap) score = fast_tanh(score * p.softcap_in);
    if constexpr (kKeepsSlope) slope = static_cast<SlopeElement>(fmaf(-score, score, 1.0f));
    float x = score * p.scale_log2 - lse_log2;
    if constexpr (kRight) x = key >= limit || (kLeft && key < first) ? -INFINITY : x;
    return fast_exp2(x);
  }

  // dS^T = P^T o (dP^T - dpsum), stored with P^T in the MMA element type. Softcap kernels multiply by tanh's
  // derivative 1 - t^2 as well (the scale is applied to dQ and dK later, as without softcap): `slope_frag` of
  // compute_probabilities where kKeepsSlope, which is finite, so dS = 0 stays 0 where P = 0 (masked, underflowed, a
  // row without keys). Otherwise t, the capped score over softcap, comes back from P's exponent: t = (log2 P + LSE *
  // log2(e)) / (softcap * log2(e)); where P = 0 that is -inf or NaN, clamped to -1, so dS = 0 stays 0 too. The key
  // split's dS the same, by query rows; kWritesP false leaves P's slots to the caller (the key split at d = 256).
  template <bool kWritesP = true, class Fragment, class SlopeFragment, class Slots, class Coords>
  __device__ static void compute_ds(const Fragment& p_frag, const Fragment& dp_frag, const SlopeFragment& slope_frag,
                                    Slots p_slots, Slots ds_slots, const Coords& coords_frag, const float* dpsum,
                                    const float* lse_log2, const Params& params) {
    Tensor p = make_tensor(p_frag.data(), accumulator_rows_by_columns(p_frag.layout()));
    Tensor slope = make_tensor(slope_frag.data(), accumulator_rows_by_columns(slope_frag.layout()));
    Tensor dp = make_tensor(dp_frag.data(), accumulator_rows_by_columns(dp_frag.layout()));
    Tensor p_out = make_tensor(p_slots.data(), accumulator_rows_by_columns(p_slots.layout()));
    Tensor ds_out = make_tensor(ds_slots.data(), accumulator_rows_by_columns(ds_slots.layout()));
    Tensor coords = make_tensor(coords_frag.data(), accumulator_rows_by_columns(coords_frag.layout()));
    if constexpr (Config::kSplitsKeys) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dp); ++r) {
        const int query = get<0>(coords(r, 0));
        const float sum = dpsum[query];
        // softcap without a kept slope: LSE * log2(e) / (softcap * log2(e)) of the row
        const float lse_t = Config::kSoftcap && !kKeepsSlope ? lse_log2[query] * params.softcap_rcp_log2 : 0.0f;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(dp); ++c) {
          ds_out(r, c) = static_cast<Element>(score_gradient(p(r, c), dp(r, c), sum, slope(r, c), lse_t, params));
          if constexpr (kWritesP) p_out(r, c) = static_cast<Element>(p(r, c));
        }
      }
    } else {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(dp); c += 2) {
        const float2 sum = *reinterpret_cast<const float2*>(dpsum + get<1>(coords(0, c)));
        float2 lse_t{};  // softcap without a kept slope: LSE * log2(e) / (softcap * log2(e)) of the column pair
        if constexpr (Config::kSoftcap && !kKeepsSlope) {
          const float2 lse = *reinterpret_cast<const float2*>(lse_log2 + get<1>(coords(0, c)));
          lse_t = make_float2(lse.x * params.softcap_rcp_log2, lse.y * params.softcap_rcp_log2);
        }
        CUTE_UNROLL
        for (int r = 0; r < size<0>(dp); ++r) {
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            const float ds = score_gradient(p(r, c + h), dp(r, c + h), h == 0 ? sum.x : sum.y, slope(r, c + h),
                                            h == 0 ? lse_t.x : lse_t.y, params);
            ds_out(r, c + h) = static_cast<Element>(ds);
            p_out(r, c + h) = static_cast<Element>(p(r, c + h));
          }
        }
      }
    }
  }

  // One score's dS (compute_ds): `lse_t` is its row's LSE over softcap where the softcap kernels keep no slope.
  template <class Slope>
  __device__ __forceinline__ static float score_gradient(float prob, float dprob, float dpsum, const Slope& slope,
                                                         float lse_t, const Params& params) {
    float ds = prob * (dprob - dpsum);
    if constexpr (kKeepsSlope) {
      ds *= static_cast<float>(slope);
    } else if constexpr (Config::kSoftcap) {
      const float t = fmaxf(fmaf(fast_log2(prob), params.softcap_rcp_log2, lse_t), -1.0f);
      ds *= fmaf(-t, t, 1.0f);
    }
    return ds;
  }

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

  // The operand of dQ = dS K that `t` holds (dS, or K^T: keys in mode 1): all of it, or in the chained layout only the
  // keys [64w, 64w + 64) of warpgroup w, every other mode whole.
  template <class T>
  __device__ static auto dq_keys(T&& t, int warp_group) {
    if constexpr (Config::kChainsDq) {
      const auto tiler = replace<1>(shape(t), Int<kMmaWarpGroupRows>{});
      return local_tile(t, tiler, replace<1>(repeat_like(shape(t), _0{}), warp_group));
    } else {
      return t;
    }
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

  // dK * scale and dV for the job's rows: to dK/dV through shared memory (straight from the fragments and transposed
  // in the key split, where no free staging tile holds the tile), or, when the query-head
  // group is split over several jobs, straight to the fp32 per-split accumulators that the postprocess sums in split
  // order (a float pair fills a 32-byte sector per row and warp instruction already).
  //
  // Varlen kernels: the rows past the sequence's end are not written (they belong to the next sequence), and the
  // rows start at the sequence's offset in the packed dk and dv; the per-split accumulators keep the maximum
  // problem's rows.
  template <class Fragment>
  __device__ static void store_dkv(const Params& p, SharedStorage& smem, const typename Config::JobRecordType& job,
                                   const Fragment& dk, const Fragment& dv, int thread) {
    typename Config::TiledMmadKV mma_dkv;
    constexpr int kHeadDim = Config::kHeadDim;
    const int row0 = job.kv_tile * kBlockN;
    const auto scaled = [&](int) { return p.softmax_scale; };
    const auto unscaled = [](int) { return 1.0f; };
    const TiledProblem& problem = p.plan.problem;
    if (problem.group_splits > 1) {
      const int64_t rows = static_cast<int64_t>(problem.num_kv_tiles()) * kBlockN;
      const int64_t at =
          (((static_cast<int64_t>(job.split) * p.batch + job.batch) * p.heads_kv + job.head_kv) * rows + row0) *
          kHeadDim;
      // The accumulators are padded to whole tiles: every row is written.
      if constexpr (Config::kSplitsKeys) {
        store_accumulator_transposed<float, kHeadDim, kBlockN>(mma_dkv, thread, dk, p.buffers.dk_accum + at, kHeadDim,
                                                               kBlockN, p.softmax_scale);
        store_accumulator_transposed<float, kHeadDim, kBlockN>(mma_dkv, thread, dv, p.buffers.dv_accum + at, kHeadDim,
                                                               kBlockN, 1.0f);
      } else {
        store_accumulator_rows<float, kBlockN, kHeadDim>(mma_dkv, thread, dk, p.buffers.dk_accum + at, kHeadDim,
                                                         kBlockN, scaled);
        store_accumulator_rows<float, kBlockN, kHeadDim>(mma_dkv, thread, dv, p.buffers.dv_accum + at, kHeadDim,
                                                         kBlockN, unscaled);
      }
      return;
    }
    int valid_rows = p.seqlen_k - row0;
    Element* dk_tile = p.dk + job.batch * p.dk_strides[0] + job.head_kv * p.dk_strides[2] + row0 * p.dk_strides[1];
    Element* dv_tile = p.dv + job.batch * p.dv_strides[0] + job.head_kv * p.dv_strides[2] + row0 * p.dv_strides[1];
    if constexpr (Config::kVarlen) {
      valid_rows = job.mask.seqlen_k - row0;
      // The packed tensors' batch strides are 0: the sequence's rows start at its offset.
      dk_tile += static_cast<int64_t>(job.k_offset) * p.dk_strides[1];
      dv_tile += static_cast<int64_t>(job.k_offset) * p.dv_strides[1];
    }
    if constexpr (Config::kSplitsKeys) {
      // dK^T and dV^T of the warpgroup's keys, once per job. Staging them would take the P and dS buffers, which the
      // other warpgroup may still read (its last GEMMs) or already write (the next job's first step), and a barrier
      // per job to free them.
      store_accumulator_transposed<Element, kHeadDim, kBlockN>(mma_dkv, thread, dk, dk_tile, p.dk_strides[1],
                                                               valid_rows, p.softmax_scale);
      store_accumulator_transposed<Element, kHeadDim, kBlockN>(mma_dkv, thread, dv, dv_tile, p.dv_strides[1],
                                                               valid_rows, 1.0f);
    } else {
      // dK, then dV, go out through the dS buffer, free once both warpgroups' last dQ GEMMs (each reads
      // all of dS) are done; the next job's first dS store waits until neither warpgroup reads it.
      static_assert(cosize_v<typename Config::SmemLayoutdS> >= kBlockN * kHeadDim, "dS holds a dK or dV tile");
      Element* staging = smem.ds.data();
      cutlass::arch::NamedBarrier::sync(Config::kMmaThreads, Config::kDsFreeBarrier);
      store_accumulator_rows_staged<Config, Element, kBlockN, kHeadDim>(mma_dkv, thread, dk, staging, dk_tile,
                                                                        p.dk_strides[1], valid_rows, scaled);
      store_accumulator_rows_staged<Config, Element, kBlockN, kHeadDim>(mma_dkv, thread, dv, staging, dv_tile,
                                                                        p.dv_strides[1], valid_rows, unscaled);
      cutlass::arch::NamedBarrier::sync(Config::kMmaThreads, Config::kDsFreeBarrier);
    }
  }
};

}  // namespace dash::sm90
