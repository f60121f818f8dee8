// Backward producer, warp 1 (one lane, bwd_kernel.cuh says why): sums each step's dQ partial into the fp32 dQ
// accumulator in global memory, in the order the schedule fixes. It is the only role that ever waits on another CTA,
// so the MMA warpgroups stall on an ordering wait only when every stage of the dQ ring is still occupied.
//
// Per step: wait until both MMA warpgroups' partials (or their first column blocks, Config::kdQColumnBlocks) are in
// shared memory; wait until the dQ tile's semaphore equals this contribution's rank; bulk reduce-add the partials
// (rank 0, the first of the fixed order, stores them instead, so the accumulator needs no zeroing), block by block as
// they come, each block's copies issued before the previous block's buffers are awaited; free each block's buffer once
// the copy engine has read it; wait until the writes have completed in global memory; release the semaphore
// (rank + 1). Nondeterministic contributions (kUnordered) skip the two semaphore steps and add into an accumulator
// the preprocess zeroed.
//
// A wait that outlives p.wait_bound_ns (CTAs of a static schedule kept off their SMs by other kernels) gives up the
// order for the rest of the launch: the first one records what it waited for (FaultRecord, read by the host), and
// every contribution then goes in as it comes. The launch ends instead of hanging; its dQ would be wrong (a late
// rank 0 stores over what others added), so the postprocess fills dq, dk and dv with NaN (bwd_prepost.cuh), and the
// host reports the record at its next call on the device.
#pragma once

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

template <class Config>
struct BackwardDqWriter {
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;

  __device__ static void run(const Params& p, SharedStorage& smem) {
    constexpr int kTileFloats = Config::kBlockM * Config::kHeadDim;
    constexpr int kBlockBytes = Config::kdQBlockFloats * sizeof(float);
    // Frees column block `position`'s stage of the dq ring, every partial's buffer.
    auto free_block = [&](int position) {
      for (auto& partial : smem.dq_stages) partial.consumer_release(position);
    };
    int steps = 0;
    for (int jobs = 0;; ++jobs) {
      const int num_steps = smem.jobs.take(jobs).num_steps;
      if (num_steps == kEndOfWork) break;
      for (int s = 0; s < num_steps; ++s, ++steps) {
        StepRecord step{};
        float* tile = nullptr;
        int* semaphore = nullptr;
        for (int block = 0; block < Config::kdQColumnBlocks; ++block) {
          const int position = Config::dq_position(steps, block);
          int stage = 0;
          for (auto& partial : smem.dq_stages) stage = partial.consumer_wait(position, "dq_full");
          if (block == 0) {
            // Read only now: the record is published before the step's data, which dq_full comes after.
            step = smem.steps[steps % Config::kStepRing];
            tile = p.buffers.dq_accum + static_cast<int64_t>(step.dq_index) * kTileFloats;
            semaphore = p.buffers.dq_semaphores + step.dq_index;
            // The tile is this step's from its first block's reduce to its last block's completion.
            if (step.rank != kUnordered &&
                !wait_semaphore(semaphore, step.rank, p.buffers.order_abandoned, p.wait_bound_ns)) {
              abandon_order(p, step, semaphore);
            }
          }
          for (int part = 0; part < Config::kdQPartials; ++part) {
            float* dst = tile + part * Config::kdQPartialFloats + block * Config::kdQBlockFloats;
            const float* src = smem.dq.data() + (stage * Config::kdQPartials + part) * Config::kdQBlockFloats;
            if (step.rank == 0) {
              bulk_store(dst, src, kBlockBytes);
            } else {
              bulk_reduce_add_f32(dst, src, kBlockBytes);
            }
          }
          bulk_commit_group();
          // The previous block's buffers are free once the copy engine has read them. Waiting for that only now,
          // with this block's copies issued behind them, overlaps the two reads; waiting before issuing this block
          // serialized them (d = 256 backward 1.04x with the automatic schedule, 1.03x nondeterministic;
          // docs/HISTORY.md). The MMA warpgroups cannot need the previous block's stage before this block
          // is full: they hand it over before storing the block after it.
          if (block > 0) {
            bulk_wait_read<1>();
            free_block(position - 1);
          }
        }
        bulk_wait_read_all();
        free_block(Config::dq_last_position(steps));
        if (step.rank != kUnordered) {
          bulk_wait_complete_all();
          release_semaphore(semaphore);
        }
      }
    }
    bulk_wait_complete_all();
  }

 private:
  // Marks the launch's order abandoned; the first wait to give up also fills the device's record, unless an earlier
  // launch's record is still unread there. Inlined, as every device function here: a call site would make ptxas drop
  // setmaxnreg (primitives.cuh, report_hang).
  __device__ static void abandon_order(const Params& p, const StepRecord& step, const int* semaphore) {
    if (atomicExch(p.buffers.order_abandoned, 1) != 0) return;
    volatile kernels::FaultRecord* record = p.fault;
    if (record->kind != kernels::FaultKind::kNone) return;
    record->cta = static_cast<int>(blockIdx.x);
    record->dq_index = step.dq_index;
    record->expected = step.rank;
    record->observed = load_acquire(semaphore);
    record->bound_ms = static_cast<int>(p.wait_bound_ns / 1'000'000);
    __threadfence_system();
    record->kind = kernels::FaultKind::kWaitTimeout;
  }
};

}  // namespace dash::sm90
