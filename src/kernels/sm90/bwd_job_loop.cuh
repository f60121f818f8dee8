// Backward, the MMA warpgroups' job loop, shared by both layouts (bwd_mainloop_rows.cuh, bwd_mainloop_key_split.cuh):
// takes each job the loader publishes, waits for its K and V and for each step's Q and dO, runs the layout's step body,
// hands the job's last dQ partial over and writes dK and dV (bwd_epilogue.cuh).
// Invariants: every MMA thread takes every job and step record in the loader's order (the rings count positions over
// the kernel's life), so both warpgroups' named barriers pair up; a job's last partial is committed before its
// epilogue, since other CTAs may wait on its dQ tile.
#pragma once

#include "kernels/sm90/bwd_config.cuh"
#include "kernels/sm90/bwd_dq_handoff.cuh"
#include "kernels/sm90/bwd_epilogue.cuh"
#include "schedule/mask.hpp"

namespace dash::sm90 {

// One step of a job, as the job loop hands it to a layout's step body.
struct BackwardJobStep {
  int index;       // within the job: 0 for its first
  int count;       // steps of the CTA before it: its place in the step ring and the dq ring
  int q_stage;     // Q's and the LSE's stage
  int dout_stage;  // dO's and dpsum's stage
  int q_row0;      // the first query row of its tile
};

template <class Config>
struct BackwardJobLoop {
  using Params = typename Config::Params;
  using SharedStorage = typename Config::SharedStorage;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;

  // The job loop of both layouts: each job the loader publishes gets fresh dK and dV accumulators
  // (Config::dKVAccumulatorShape), waits for its K and V, runs `step_body(step, mask, kv_row0, tdKrdK, tdVrdV)` on
  // each of its steps once their Q and dO are in, hands its last dQ partial over (each step body hands over the
  // previous step's), frees K and V and writes dK and dV. The mask is the plan's (causal and the canonical sliding
  // window, the planner's make_tiled_problem) or in the varlen kernels the job's sequence's (job_mask).
  template <class TiledMmadKV, class StepBody>
  __device__ static void run(const Params& p, SharedStorage& smem, const TiledMmadKV& mma_dkv, int warp_group,
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
        step_body(BackwardJobStep{s, steps, q_stage, dout_stage, q_row0}, mask, kv_row0, tdKrdK, tdVrdV);
      }
      // The job's last partial goes out before the epilogue: other CTAs may wait on its dQ tile.
      if (job.num_steps > 0) {
        BackwardDqHandoff<Config>::commit_dq(smem, warp_group, Config::dq_last_position(steps - 1));
      }
      smem.kv_stages.consumer_release(jobs);
      BackwardEpilogue<Config>::store(p, smem, job, tdKrdK, tdVrdV, thread);
    }
  }

  // The mask the job runs: the plan's, or in the varlen kernels its sequence's, which is the plan's with the
  // sequence's lengths. There the rows layout takes the plan's causal flag and window from the kernel's parameters,
  // which its step loop reads from the constant bank, rather than the record's copies, which it held in registers
  // over the job: at d = 64 that spilled 17 loads and 19 stores per step (scripts/sass_report.sh). The key split
  // keeps the record's: from the parameters its step loops grew by 19 and 46 instructions at d = 192 and 256, the
  // per-row mask tests moved to the uniform datapath.
  __device__ static MaskShape job_mask(const typename Config::JobRecordType& job, const MaskShape& plan_mask) {
    if constexpr (Config::kVarlen && !Config::kSplitsKeys) {
      MaskShape mask = plan_mask;
      mask.seqlen_q = job.mask.seqlen_q;
      mask.seqlen_k = job.mask.seqlen_k;
      return mask;
    } else if constexpr (Config::kVarlen) {
      return job.mask;
    } else {
      return plan_mask;
    }
  }
};

}  // namespace dash::sm90
