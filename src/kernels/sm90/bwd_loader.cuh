// Backward producer, warp 0 (one lane): publishes each job and step of the CTA's walk over the schedule
// (BackwardTileScheduler, bwd_tile_scheduler.cuh) to the other roles, and streams K, V (once per job) and Q, dO, LSE,
// dpsum (once per step) into shared memory with TMA (StepRings: Q and the LSE, then dO and dpsum). The schedule
// arithmetic is the scheduler's and runs in this thread, so the MMA warpgroups spend no registers on it.
//
// Step records live in a ring of kStepRing slots read by the MMA warpgroups and the dQ writer. Slot
// reuse is safe without its own barrier: writing step k needs the Q stage of step k - kStages to be
// released, which the MMA warpgroups do only after storing the dQ partial of that step, which
// needs the dQ writer to have finished step k - kStages - 1 (and read its record). So records older
// than k - kStages - 1 are dead, and kStepRing > kStages + 1 slots suffice.
//
// The varlen kernels load a job's rows at its sequence's offsets in the packed tensors (tma_load_rows) where the
// dense kernels load tiles of a (seqlen, head_dim, heads, batch) tensor (tma_load_tile).
#pragma once

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_tile_scheduler.cuh"
#include "kernels/sm90/gmem_tensors.cuh"
#include "kernels/sm90/primitives.cuh"

namespace dash::sm90 {

template <class Config>
struct BackwardLoader {
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  using Scheduler = BackwardTileScheduler<Config>;
  using Sequence = typename Scheduler::Sequence;

  __device__ static void run(const Params& p, SharedStorage& smem) {
    prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_dout.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    int jobs = 0;
    int steps = 0;
    Scheduler::for_each_job(p, [&](const Job& job, const Sequence& sequence, const SchedulePlan& job_plan) {
      smem.jobs.publish(Scheduler::job_record(p, job, sequence, job_plan), jobs);
      load_kv(p, smem, job, sequence, jobs);
      for (int s = 0; s < job.num_steps; ++s, ++steps) load_step(p, smem, job_plan, job, s, steps, sequence);
      ++jobs;
    });
    typename Config::JobRecordType end{};
    end.num_steps = kEndOfWork;
    smem.jobs.publish(end, jobs);
  }

 private:
  __device__ static void load_kv(const Params& p, SharedStorage& smem, const Job& job, const Sequence& sequence,
                                 int jobs) {
    smem.kv_stages.producer_acquire(jobs, "kv_empty");
    uint64_t& full = smem.kv_stages.producer_expect(jobs, Config::kKVBytes);
    const KvJobCoord c = p.plan.problem.kv_coord(job.head);
    auto k_tile = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    auto v_tile = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{});
    if constexpr (Config::kVarlen) {
      const auto kv_extent = make_shape(p.packed.total_k, int{Config::kHeadDim}, p.heads_kv, 1);
      const int kv_row = sequence.k_offset + job.kv_tile * Config::kBlockN;
      tma_load_rows(p.tma_k, kv_extent, c.head_kv, kv_row, full, k_tile);
      tma_load_rows(p.tma_v, kv_extent, c.head_kv, kv_row, full, v_tile);
    } else {
      const auto kv_extent = make_shape(p.seqlen_k, int{Config::kHeadDim}, p.heads_kv, p.batch);
      tma_load_tile(p.tma_k, kv_extent, c.head_kv, c.batch, job.kv_tile, full, k_tile);
      tma_load_tile(p.tma_v, kv_extent, c.head_kv, c.batch, job.kv_tile, full, v_tile);
    }
  }

  // Step `step` of `job`, the CTA's `steps`-th: its record to the step ring, then Q with the LSE and dO with dpsum.
  __device__ static void load_step(const Params& p, SharedStorage& smem, const SchedulePlan& job_plan, const Job& job,
                                   int step, int steps, const Sequence& sequence) {
    // All schedule arithmetic before the wait: it then overlaps the MMA warpgroups' work on the stage.
    const typename Scheduler::Step visit = Scheduler::step(p, job_plan, job, step);
    const QTileCoord& q = visit.q;
    const int stage = smem.step_rings.acquire_q(steps);
    smem.steps[steps % Config::kStepRing] = visit.record;
    const int64_t row0 = Scheduler::workspace_row0(p, q);
    uint64_t& q_full = smem.step_rings.expect_q(steps, Config::kQStageBytes, Config::kdOStageBytes);
    load_query_rows(p.tma_q, p, q, sequence, q_full, query_tiles(smem)(_, _, stage));
    load_rows_of_floats(p.buffers.lse_log2 + row0, q_full, smem.lse_log2[stage]);
    const int dout_stage = smem.step_rings.acquire_dout(steps);
    uint64_t& dout_full = smem.step_rings.expect_dout(steps, Config::kdOStageBytes, q_full);
    load_query_rows(p.tma_dout, p, q, sequence, dout_full, dout_tiles(smem)(_, _, dout_stage));
    load_rows_of_floats(p.buffers.dpsum + row0, dout_full, smem.dpsum[dout_stage]);
  }

  // Query tile `q` of q or dO: rows at the sequence's offset in the varlen kernels, a tile otherwise.
  template <class Tma, class SmemTile>
  __device__ static void load_query_rows(const Tma& tma, const Params& p, const QTileCoord& q, const Sequence& sequence,
                                         uint64_t& full, SmemTile dst) {
    if constexpr (Config::kVarlen) {
      const auto q_extent = make_shape(p.packed.total_q, int{Config::kHeadDim}, p.heads_q, 1);
      tma_load_rows(tma, q_extent, q.head_q, sequence.q_offset + q.q_tile * Config::kBlockM, full, dst);
    } else {
      const auto q_extent = make_shape(p.seqlen_q, int{Config::kHeadDim}, p.heads_q, p.batch);
      tma_load_tile(tma, q_extent, q.head_q, q.batch, q.q_tile, full, dst);
    }
  }

  __device__ static auto query_tiles(SharedStorage& smem) {
    return make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
  }
  __device__ static auto dout_tiles(SharedStorage& smem) {
    return make_tensor(make_smem_ptr(smem.dout.data()), typename Config::SmemLayoutdO{});
  }
  // One float per row of a query tile (the LSE or dpsum), from the workspace, completing `full`.
  __device__ static void load_rows_of_floats(const float* rows, uint64_t& full, float* dst) {
    constexpr int kRowBytes = Config::kBlockM * sizeof(float);
    SM90_BULK_COPY_G2S::copy(rows, &full, dst, kRowBytes);
  }
};

}  // namespace dash::sm90
