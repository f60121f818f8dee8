// Backward epilogue, per MMA thread, at the end of each job: dK * scale and dV of the job's key/value rows, from the
// accumulators the mainloop kept in registers over the job's steps.
// Invariants: rows past the key length (the sequence's, in the varlen kernels) are not written; up to d = 128 the
// staging tile is the dS buffer, entered and left through kDsFreeBarrier, so neither warpgroup's GEMMs read it
// meanwhile; the per-split accumulators of a split query-head group are padded to whole tiles and written whole.
#pragma once

#include <cutlass/arch/barrier.h>

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gemm.cuh"

namespace dash::sm90 {

template <class Config>
struct BackwardEpilogue {
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;

  // dK * scale and dV for the job's rows: to dK/dV through shared memory (straight from the fragments and transposed
  // in the key split, where no free staging tile holds the tile), or, when the query-head
  // group is split over several jobs, straight to the fp32 per-split accumulators that the postprocess sums in split
  // order (a float pair fills a 32-byte sector per row and warp instruction already).
  //
  // Varlen kernels: the rows past the sequence's end are not written (they belong to the next sequence), and the
  // rows start at the sequence's offset in the packed dk and dv; the per-split accumulators keep the maximum
  // problem's rows.
  template <class Fragment>
  __device__ static void store(const Params& p, SharedStorage& smem, const typename Config::JobRecordType& job,
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
