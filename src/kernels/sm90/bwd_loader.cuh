// Backward producer, warp 0 (one lane): walks the schedule, publishes each job and step to the other
// roles, and streams K, V (once per job) and Q, dO, LSE, dpsum (once per step) into shared memory
// with TMA. All schedule arithmetic happens here, so the MMA warpgroups spend no registers on it.
//
// Step records live in a ring of kStepRing slots read by the MMA warpgroups and the dQ writer. Slot
// reuse is safe without its own barrier: writing step k needs the Q stage of step k - kStages to be
// released, which the MMA warpgroups do only after storing the dQ partial of that step, which
// needs the dQ writer to have finished step k - kStages - 1 (and read its record). So records older
// than k - kStages - 1 are dead, and kStepRing > kStages + 1 slots suffice.
#pragma once

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gmem_tensors.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule/schedule.hpp"

namespace dash::sm90 {

template <class Config>
struct BackwardLoader {
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;

  __device__ static void run(const Params& p, SharedStorage& smem) {
    prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_dout.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    const SchedulePlan& plan = p.plan;
    int jobs = 0;
    int steps = 0;
    const bool dynamic = plan.dispatch == Dispatch::kDynamic;
    for (int i = 0;; ++i) {
      const int unit = dynamic ? atomicAdd(p.buffers.unit_counter, 1) : static_unit(plan, blockIdx.x, i);
      if (unit >= plan.num_units) break;
      for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
        const Job job = make_job(plan, unit, sub);
        if (!job.valid) continue;
        publish_job(p, smem, job, jobs);
        load_kv(p, smem, job, jobs);
        for (int s = 0; s < job.num_steps; ++s, ++steps) load_step(p, smem, job, s, steps);
        ++jobs;
      }
    }
    JobRecord end{};
    end.num_steps = kEndOfWork;
    smem.jobs.publish(end, jobs);
  }

 private:
  __device__ static void publish_job(const Params& p, SharedStorage& smem, const Job& job, int jobs) {
    const KvJobCoord c = p.plan.problem.kv_coord(job.head);
    smem.jobs.publish(JobRecord{job.num_steps, c.batch, c.head_kv, c.split, job.kv_tile, job.head}, jobs);
  }

  __device__ static void load_kv(const Params& p, SharedStorage& smem, const Job& job, int jobs) {
    smem.kv_stages.producer_acquire(jobs, "kv_empty");
    uint64_t& full = smem.kv_stages.producer_expect(jobs, Config::kKVBytes);
    const KvJobCoord c = p.plan.problem.kv_coord(job.head);
    const auto kv_extent = make_shape(p.seqlen_k, int{Config::kHeadDim}, p.heads_kv, p.batch);
    tma_load_tile(p.tma_k, kv_extent, c.head_kv, c.batch, job.kv_tile, full,
                  make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{}));
    tma_load_tile(p.tma_v, kv_extent, c.head_kv, c.batch, job.kv_tile, full,
                  make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{}));
  }

  __device__ static void load_step(const Params& p, SharedStorage& smem, const Job& job, int step, int steps) {
    const SchedulePlan& plan = p.plan;
    // All schedule arithmetic before the wait: it then overlaps the MMA warpgroups' work on the stage.
    const int v = q_tile_at(plan, job, step);
    const QTileCoord q = plan.problem.q_coord(job.head, v);
    const StepRecord record{q.q_tile, plan.problem.dq_tile_index(job.head, v), rank_of(plan, job, v)};
    const int stage = smem.q_stages.producer_acquire(steps, "q_empty");
    smem.steps[steps % Config::kStepRing] = record;
    uint64_t& full = smem.q_stages.producer_expect(steps, Config::kQStageBytes);
    auto sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
    auto sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Config::SmemLayoutQ{});
    const auto q_extent = make_shape(p.seqlen_q, int{Config::kHeadDim}, p.heads_q, p.batch);
    tma_load_tile(p.tma_q, q_extent, q.head_q, q.batch, q.q_tile, full, sQ(_, _, stage));
    tma_load_tile(p.tma_dout, q_extent, q.head_q, q.batch, q.q_tile, full, sdO(_, _, stage));
    const int64_t row0 = (static_cast<int64_t>(q.batch) * p.heads_q + q.head_q) * plan.problem.real_q_tiles() *
                             Config::kBlockM + static_cast<int64_t>(q.q_tile) * Config::kBlockM;
    constexpr int kRowBytes = Config::kBlockM * sizeof(float);
    SM90_BULK_COPY_G2S::copy(p.buffers.lse_log2 + row0, &full, smem.lse_log2[stage], kRowBytes);
    SM90_BULK_COPY_G2S::copy(p.buffers.dpsum + row0, &full, smem.dpsum[stage], kRowBytes);
  }
};

}  // namespace dash::sm90
