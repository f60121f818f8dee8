// Backward tile scheduler: the CTA's walk over the schedule, which the loader runs (bwd_loader.cuh). It takes the
// CTA's work units in dispatch order (from the global counter under dynamic dispatch; c, c + S, c + 2S, ... under
// static), and hands the loader each valid job of each unit with the plan its steps follow, then each step's record
// and query tile. A unit's jobs and a job's visits are the plan's walk (schedule/job_walk.hpp), which the emulator and
// the planner's expansion share; the dispatch of units is the kernels' own, and the loader does no schedule arithmetic.
//
// The varlen kernels walk the maximum plan's units in the same order and fit each unit's jobs to its sequence
// (for_each_varlen_job_of_unit); dQ tiles, and the LSE and dpsum rows of the workspace, keep the maximum problem's
// numbering. The sequence's rows come from cu_seqlens, clamped (packed_sequence).
#pragma once

#include "kernels/sm90/bwd_config.cuh"
#include "schedule/job_walk.hpp"
#include "schedule/varlen.hpp"

namespace dash::sm90 {

template <class Config>
struct BackwardTileScheduler {
  using Params = typename Config::Params;
  // The dense kernels' jobs have no sequence of their own.
  struct WholeBatch {};
  using Sequence = std::conditional_t<Config::kVarlen, PackedSequence, WholeBatch>;

  // One step of a job: what the other roles read of it, and its query tile (which Q, dO, LSE and dpsum rows to load).
  struct Step {
    StepRecord record;
    QTileCoord q;
  };

  // Calls on_job(job, sequence, job_plan) for each valid job of the CTA's units, in order: job_plan is the plan its
  // steps follow (the sequence's in the varlen kernels, p.plan otherwise).
  template <class OnJob>
  __device__ static void for_each_job(const Params& p, OnJob&& on_job) {
    const SchedulePlan& plan = p.plan;
    const bool dynamic = plan.dispatch == Dispatch::kDynamic;
    for (int i = 0;; ++i) {
      const int unit = dynamic ? atomicAdd(p.buffers.unit_counter, 1) : static_unit(plan, blockIdx.x, i);
      if (unit >= plan.num_units) break;
      if constexpr (Config::kVarlen) {
        const PackedSequence sequence = packed_sequence(p.packed, varlen_sequence_of_unit(plan, unit));
        for_each_varlen_job_of_unit(plan, unit, sequence.lengths,
                                    [&](const Job& job, const SchedulePlan& fitted) { on_job(job, sequence, fitted); });
      } else {
        for_each_job_of_unit(
            plan, unit, [&](const Job& job, const SchedulePlan& job_plan) { on_job(job, WholeBatch{}, job_plan); });
      }
    }
  }

  // Step `step` of `job`: the query tile it visits and that visit's rank come from `job_plan` (for_each_job's), the
  // tile's coordinates and numbering from the plan's problem (the maximum problem in the varlen kernels).
  __device__ static Step step(const Params& p, const SchedulePlan& job_plan, const Job& job, int step) {
    const TiledProblem& problem = p.plan.problem;
    const Visit visit = visit_at(problem, job_plan, job, step);
    const QTileCoord q = problem.q_coord(job.head, visit.q_tile);
    return Step{StepRecord{q.q_tile, visit.dq_tile, visit.rank}, q};
  }

  // The first row of query tile `q` in the workspace's LSE and dpsum, numbered in the plan's problem.
  __device__ static int64_t workspace_row0(const Params& p, const QTileCoord& q) {
    return (static_cast<int64_t>(q.batch) * p.heads_q + q.head_q) * p.plan.problem.real_q_tiles() * Config::kBlockM +
           static_cast<int64_t>(q.q_tile) * Config::kBlockM;
  }

  // The record the other roles read of `job` (bwd_config.cuh): in the varlen kernels with its sequence's mask and
  // first key row.
  __device__ static typename Config::JobRecordType job_record(const Params& p, const Job& job, const Sequence& sequence,
                                                              const SchedulePlan& job_plan) {
    const KvJobCoord c = p.plan.problem.kv_coord(job.head);
    typename Config::JobRecordType record{};
    record.num_steps = job.num_steps;
    record.batch = c.batch;
    record.head_kv = c.head_kv;
    record.split = c.split;
    record.kv_tile = job.kv_tile;
    record.head = job.head;
    if constexpr (Config::kVarlen) {
      record.mask = job_plan.problem.mask();
      record.k_offset = sequence.k_offset;
    }
    return record;
  }
};

}  // namespace dash::sm90
