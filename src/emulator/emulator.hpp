// CPU emulator: executes a SchedulePlan the way the GPU backward kernel will, one host thread per
// persistent CTA, real float32 tile arithmetic, dQ semaphores and random delays before every
// reduction. Running it several times shows that the gradient bits do not depend on timing for every
// deterministic schedule (and that they do for the nondeterministic one). Dense batches run the plan's schedule
// functions; varlen batches (packed sequences of different lengths) the same functions fitted to each sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dash/types.hpp"
#include "planner/varlen_plan.hpp"
#include "schedule/plan.hpp"
#include "schedule/tile_config.hpp"

namespace dash {

// Random inputs of one shape (fixed seed) and what the references compute from them, under the shape's mask and
// softcap and FlashAttention's sliding window (none by default; passed apart from the shape, whose window fields the
// emulator does not read).
// A varlen batch (`lengths` not empty) packs its sequences one after another, FlashAttention's cu_seqlens layout:
// q, dout and out are (total_q, Hq, D) and k, v (total_k, Hkv, D), sequence b starting at row sum of the lengths
// before it; lse is (Hq, seqlen_q[b]) per sequence, in sequence order. `shape` then holds the maximum lengths
// and batch = the number of sequences. A dense batch is the case of every sequence at the shape's lengths.
struct EmulatorInputs {
  AttentionShape shape;
  SlidingWindow window;
  std::vector<SequenceLengths> lengths;        // varlen: one per sequence; empty for a dense batch
  std::vector<float> q, k, v, dout;            // packed (B, S, H, D), uniform in [-1, 1]
  std::vector<float> out, lse;                 // float32 reference forward: what the kernel reads
  std::vector<double> ref_dq, ref_dk, ref_dv;  // float64 reference backward of the same inputs
};

EmulatorInputs make_emulator_inputs(const AttentionShape& shape, uint64_t seed, SlidingWindow window = {});
// The inputs of a varlen batch of `lengths` (each within max_shape's lengths; max_shape.batch = lengths.size()).
EmulatorInputs make_varlen_emulator_inputs(const AttentionShape& max_shape, const std::vector<SequenceLengths>& lengths,
                                           uint64_t seed, SlidingWindow window = {});

// The tiled problem of `shape` (under `window`, in the planner's canonical form) with `tiles` instead of the
// kernel's tile shape: small tiles give many tiles, and so non-trivial schedules, on shapes small enough for the
// CPU. group_splits = 0 picks choose_group_splits() for these tiles.
TiledProblem make_emulator_problem(const AttentionShape& shape, TileShape tiles, int group_splits = 0,
                                   SlidingWindow window = {});

struct EmulatorOptions {
  int runs = 5;
  int max_delay_us = 50;         // each reduction is preceded by a random delay in [0, max_delay_us]
  uint64_t seed = 1;             // seeds the delays of every (run, CTA)
  double wait_timeout_s = 30.0;  // a semaphore wait longer than this is reported as a deadlock
};

struct Gradients {
  std::vector<float> dq, dk, dv;  // packed like q, k, v
};

struct GradientErrors {
  double dq = 0.0;
  double dk = 0.0;
  double dv = 0.0;
  double max() const;
};

struct EmulationResult {
  bool completed = false;            // every run finished every job with every contribution summed
  std::string error;                 // why not, when !completed
  int runs = 0;                      // runs that completed
  bool bitwise_identical = false;    // dQ, dK and dV bits equal in every run
  std::vector<uint64_t> run_hashes;  // per run: FNV-1a hash of the dQ, dK and dV bits
  Gradients gradients;               // of the first run
  // Largest over the runs of max |x - ref| / max |ref| per tensor, against the float64 reference.
  // Normwise rather than elementwise, because elementwise ratios blow up on near-zero gradients.
  GradientErrors error_vs_reference;

  double max_rel_error() const { return error_vs_reference.max(); }
};

// Runs `plan` (whose problem must describe inputs.shape and inputs.window, tile sizes aside) options.runs
// times. Throws std::invalid_argument when plan and inputs disagree or options are out of range (runs < 2).
EmulationResult emulate(const EmulatorInputs& inputs, const SchedulePlan& plan, const EmulatorOptions& options);

// The same on make_emulator_inputs(shape, options.seed, plan.problem.window).
EmulationResult emulate(const AttentionShape& shape, const SchedulePlan& plan, const EmulatorOptions& options);

// Runs a varlen plan (planner/varlen_plan.hpp) on varlen inputs, each unit's jobs fitted to its sequence's lengths
// (schedule/varlen.hpp) as the kernels will fit them. The plan need not be proven (a broken one is reported, as
// by emulate), but the lengths must be admitted by it (check_varlen_lengths); throws std::invalid_argument
// otherwise, or when plan and inputs disagree.
EmulationResult emulate_varlen(const EmulatorInputs& inputs, const VarlenPlan& plan, const EmulatorOptions& options);

}  // namespace dash
