// Backward producer, warp 0 (one lane): walks the schedule, publishes each job and step to the other
// roles, and streams K, V (once per job) and Q, dO, LSE, dpsum (once per step) into shared memory
// with TMA (StepRings: Q and the LSE, then dO and dpsum). All schedule arithmetic happens here, so the MMA
// warpgroups spend no registers on it.
//
// Step records live in a ring of kStepRing slots read by the MMA warpgroups and the dQ writer. Slot
// reuse is safe without its own barrier: writing step k needs the Q stage of step k - kStages to be
// released, which the MMA warpgroups do only after storing the dQ partial of that step, which
// needs the dQ writer to have finished step k - kStages - 1 (and read its record). So records older
// than k - kStages - 1 are dead, and kStepRing > kStages + 1 slots suffice.
//
// The varlen kernels (run_packed) walk the maximum plan's units in the same order and fit each unit's jobs to its
// sequence (schedule/varlen.hpp): make_varlen_job, and q_tile_at and rank_of of the sequence's plan; dQ tiles keep
// the maximum problem's numbering. Its rows come from cu_seqlens, clamped (packed_sequence).
#pragma once

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/gmem_tensors.cuh"
#include "kernels/sm90/primitives.cuh"
#include "schedule/schedule.hpp"
#include "schedule/varlen.hpp"

namespace dash::sm90 {

template <class Config>
struct BackwardLoader {
  using Element = typename Config::Element;
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;

  __device__ static void run(const Params& p, SharedStorage& smem) {
    if constexpr (Config::kVarlen) {
      run_packed(p, smem);
    } else {
      run_dense(p, smem);
    }
  }

 private:
  __device__ static void run_dense(const Params& p, SharedStorage& smem) {
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

  // run_dense() for a packed varlen batch: the same units, their jobs fitted to their sequences.
  __device__ static void run_packed(const Params& p, SharedStorage& smem) {
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
      const PackedSequence sequence = packed_sequence(p.packed, varlen_sequence_of_unit(plan, unit));
      const SchedulePlan fitted = sequence_plan(plan, sequence.lengths);
      for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
        const Job job = make_varlen_job(plan, unit, sub, sequence.lengths);
        if (!job.valid) continue;
        const KvJobCoord c = plan.problem.kv_coord(job.head);
        typename Config::JobRecordType record{};
        record.num_steps = job.num_steps;
        record.batch = c.batch;
        record.head_kv = c.head_kv;
        record.split = c.split;
        record.kv_tile = job.kv_tile;
        record.head = job.head;
        record.mask = fitted.problem.mask();
        record.k_offset = sequence.k_offset;
        smem.jobs.publish(record, jobs);
        smem.kv_stages.producer_acquire(jobs, "kv_empty");
        uint64_t& full = smem.kv_stages.producer_expect(jobs, Config::kKVBytes);
        const auto kv_extent = make_shape(p.packed.total_k, int{Config::kHeadDim}, p.heads_kv, 1);
        const int kv_row = sequence.k_offset + job.kv_tile * Config::kBlockN;
        tma_load_rows(p.tma_k, kv_extent, c.head_kv, kv_row, full,
                      make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{}));
        tma_load_rows(p.tma_v, kv_extent, c.head_kv, kv_row, full,
                      make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{}));
        for (int s = 0; s < job.num_steps; ++s, ++steps) load_packed_step(p, smem, fitted, job, s, steps, sequence);
        ++jobs;
      }
    }
    typename Config::JobRecordType end{};
    end.num_steps = kEndOfWork;
    smem.jobs.publish(end, jobs);
  }

  // load_step() of a varlen job: visits and ranks from the sequence's plan `fitted`, the dQ tile numbered in the
  // maximum problem (its LSE and dpsum rows too), Q and dO from the sequence's rows.
  __device__ static void load_packed_step(const Params& p, SharedStorage& smem, const SchedulePlan& fitted,
                                          const Job& job, int step, int steps, const PackedSequence& sequence) {
    const TiledProblem& max_problem = p.plan.problem;
    const int v = q_tile_at(fitted, job, step);
    const QTileCoord q = max_problem.q_coord(job.head, v);
    const StepRecord record{q.q_tile, max_problem.dq_tile_index(job.head, v), rank_of(fitted, job, v)};
    const int stage = smem.step_rings.acquire_q(steps);
    smem.steps[steps % Config::kStepRing] = record;
    const auto q_extent = make_shape(p.packed.total_q, int{Config::kHeadDim}, p.heads_q, 1);
    const int q_row = sequence.q_offset + q.q_tile * Config::kBlockM;
    const int64_t row0 =
        (static_cast<int64_t>(q.batch) * p.heads_q + q.head_q) * max_problem.real_q_tiles() * Config::kBlockM +
        static_cast<int64_t>(q.q_tile) * Config::kBlockM;
    uint64_t& q_full = smem.step_rings.expect_q(steps, Config::kQStageBytes, Config::kdOStageBytes);
    tma_load_rows(p.tma_q, q_extent, q.head_q, q_row, q_full, query_tiles(smem)(_, _, stage));
    load_rows_of_floats(p.buffers.lse_log2 + row0, q_full, smem.lse_log2[stage]);
    const int dout_stage = smem.step_rings.acquire_dout(steps);
    uint64_t& dout_full = smem.step_rings.expect_dout(steps, Config::kdOStageBytes, q_full);
    tma_load_rows(p.tma_dout, q_extent, q.head_q, q_row, dout_full, dout_tiles(smem)(_, _, dout_stage));
    load_rows_of_floats(p.buffers.dpsum + row0, dout_full, smem.dpsum[dout_stage]);
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
    const int stage = smem.step_rings.acquire_q(steps);
    smem.steps[steps % Config::kStepRing] = record;
    const auto q_extent = make_shape(p.seqlen_q, int{Config::kHeadDim}, p.heads_q, p.batch);
    const int64_t row0 =
        (static_cast<int64_t>(q.batch) * p.heads_q + q.head_q) * plan.problem.real_q_tiles() * Config::kBlockM +
        static_cast<int64_t>(q.q_tile) * Config::kBlockM;
    uint64_t& q_full = smem.step_rings.expect_q(steps, Config::kQStageBytes, Config::kdOStageBytes);
    tma_load_tile(p.tma_q, q_extent, q.head_q, q.batch, q.q_tile, q_full, query_tiles(smem)(_, _, stage));
    load_rows_of_floats(p.buffers.lse_log2 + row0, q_full, smem.lse_log2[stage]);
    const int dout_stage = smem.step_rings.acquire_dout(steps);
    uint64_t& dout_full = smem.step_rings.expect_dout(steps, Config::kdOStageBytes, q_full);
    tma_load_tile(p.tma_dout, q_extent, q.head_q, q.batch, q.q_tile, dout_full, dout_tiles(smem)(_, _, dout_stage));
    load_rows_of_floats(p.buffers.dpsum + row0, dout_full, smem.dpsum[dout_stage]);
  }
};

}  // namespace dash::sm90
