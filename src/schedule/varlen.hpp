// Variable-length batches (FlashAttention's cu_seqlens): the schedule functions of a plan made from the maximum
// lengths, fitted at run time to each sequence's real lengths, and where each sequence's rows lie in the packed
// tensors (packed_sequence, which the varlen kernels call on the device to read cu_seqlens).
//
// A varlen plan is an ordinary SchedulePlan of the *maximum* problem: batch = number of sequences, seqlen_q and
// seqlen_k = the maximum lengths, heads and tiles as for a dense batch. It fixes everything that must not depend
// on the lengths: the number of work units, which CTA runs which unit (static dispatch) and each head's units
// (head h, of sequence kv_coord(h).batch, owns units [h U, (h + 1) U), U = units per head of the maximum problem).
// Sequence b's real lengths (seqlen_q[b], seqlen_k[b] <= the maxima) only decide, per unit, which job it holds:
//  - each sequence is its own tiled problem (sequence_problem: the plan's with the sequence's lengths), so its
//    query and key/value tiles, bands and contributor counts are those of a dense batch of that length; a
//    sequence of length 0 has no tiles, one shorter than a tile has one ragged tile;
//  - a unit whose key/value tile (or symmetric-shift pair) lies past the sequence's last holds no job, so a head's
//    jobs are a prefix (in the schedule's own tile order) of what the maximum plan gives it;
//  - q_tile_at and rank_of are the schedules' own functions (schedule.hpp) called with sequence_plan, the plan
//    with the sequence's problem, on the fitted job.
// Fitting per schedule (planner/varlen_plan.hpp proves which of these are valid for every length):
//  - ascending, descending, shortest-first, nondeterministic: the maximum plan's job keeps its head and key/value
//    tile, and exists iff that tile exists in the sequence (shortest-first's first units of a short sequence are
//    then empty); its band is the sequence's;
//  - shift: unit a of a head holds tile a iff a < n_b (the sequence's key/value tiles); its wave is clipped to
//    the head's first n_b units, so lane, wave size and earlier count only units that hold a job;
//  - symmetric shift: unit a holds the sequence's own pair (a, n_b - 1 - a) iff a < ceil(n_b / 2), its wave
//    clipped likewise; the causal triangle folded is the sequence's, not the maximum's.
// For a sequence at the maximum lengths every fitted job equals make_job's (test_varlen.cpp checks every field).
// The varlen forward fits its tiles the same way (fit_forward_tile): the tile order of the maximum problem, each tile
// given its sequence's mask and key/value range, those past the sequence's query tiles dropped.
// dQ tiles keep the maximum problem's numbering (dq_tile_index of the plan's problem): one per (sequence, query
// head, query tile of the maximum length), so no two sequences share a tile or a semaphore.
#pragma once

#include "schedule/forward_tile_order.hpp"
#include "schedule/schedule.hpp"

namespace dash {

// One sequence's lengths: seqlen_q[b] = cu_seqlens_q[b + 1] - cu_seqlens_q[b], and likewise for the keys.
struct SequenceLengths {
  int seqlen_q;
  int seqlen_k;
};

// A packed varlen batch as the kernels read it: the device's cu_seqlens and the bounds every sequence is clamped
// to. The host knows the bounds without reading cu_seqlens (no copy per call).
struct PackedBatch {
  const int* cu_seqlens_q;  // num_seqs + 1 offsets into the packed query rows (device memory)
  const int* cu_seqlens_k;  // num_seqs + 1 offsets into the packed key rows
  int total_q;              // rows of the packed q, out, dout, dq (and LSE columns)
  int total_k;              // rows of the packed k, v, dk, dv
  int max_seqlen_q;         // the plan's maxima
  int max_seqlen_k;
  bool keys_within_queries;  // the plan admits only seqlen_k <= seqlen_q
};

// Sequence b's rows in the packed tensors: query rows [q_offset, q_offset + lengths.seqlen_q), key rows
// [k_offset, k_offset + lengths.seqlen_k).
struct PackedSequence {
  int q_offset;
  int k_offset;
  SequenceLengths lengths;
};

// Sequence b of `batch`, read from cu_seqlens and clamped so that whatever cu_seqlens hold, the kernels stay
// inside the packed tensors and run a plan they were proven for: each offset within [0, total], each end within
// [offset, total], each length at most its maximum, and seqlen_k at most seqlen_q where the plan was made with
// keys_within_queries. For cu_seqlens that keep the contract (non-decreasing from 0, ends within the totals,
// lengths within the maxima, the promise kept) this changes nothing; otherwise the sequences it changes get
// unspecified results (rows of overlapping sequences may be written by both), but no kernel hangs or touches
// memory outside the tensors.
DASH_HOST_DEVICE PackedSequence packed_sequence(const PackedBatch& batch, int b) {
  const auto clamp = [](int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); };
  const int q_offset = clamp(batch.cu_seqlens_q[b], 0, batch.total_q);
  const int k_offset = clamp(batch.cu_seqlens_k[b], 0, batch.total_k);
  const int seqlen_q = clamp(batch.cu_seqlens_q[b + 1], q_offset, batch.total_q) - q_offset;
  const int seqlen_k = clamp(batch.cu_seqlens_k[b + 1], k_offset, batch.total_k) - k_offset;
  SequenceLengths lengths{seqlen_q < batch.max_seqlen_q ? seqlen_q : batch.max_seqlen_q,
                          seqlen_k < batch.max_seqlen_k ? seqlen_k : batch.max_seqlen_k};
  if (batch.keys_within_queries && lengths.seqlen_k > lengths.seqlen_q) lengths.seqlen_k = lengths.seqlen_q;
  return PackedSequence{q_offset, k_offset, lengths};
}

// The tiled problem of one sequence: the maximum problem with the sequence's lengths. batch and heads are kept,
// so that the plan's head numbers name the same (sequence, key/value head, split) in it.
DASH_HOST_DEVICE TiledProblem sequence_problem(const TiledProblem& max_problem, SequenceLengths lengths) {
  TiledProblem p = max_problem;
  p.seqlen_q = lengths.seqlen_q;
  p.seqlen_k = lengths.seqlen_k;
  return p;
}

// The plan whose q_tile_at and rank_of give a fitted job's visits and ranks: the varlen plan with the sequence's
// problem. Units, CTAs and dispatch stay the plan's.
DASH_HOST_DEVICE SchedulePlan sequence_plan(const SchedulePlan& plan, SequenceLengths lengths) {
  SchedulePlan fitted = plan;
  fitted.problem = sequence_problem(plan.problem, lengths);
  return fitted;
}

// Units of each schedule head in the maximum plan (every head has as many), as make_schedule_plan counts them.
DASH_HOST_DEVICE int varlen_units_per_head(const SchedulePlan& plan) {
  switch (plan.kind) {
    case Schedule::kAscending:
    case Schedule::kDescending:
    case Schedule::kShortestFirst:
    case Schedule::kNondeterministic:
    case Schedule::kShift:
      return plan.problem.num_kv_tiles();
    case Schedule::kSymmetricShift:
      return SymmetricShiftSchedule::units_per_head(plan.problem);
    case Schedule::kAuto:
      break;
  }
  return 1;  // a plan of kAuto has no jobs; 1 keeps the unit arithmetic defined
}

// The sequence whose lengths fit unit `unit`'s jobs.
DASH_HOST_DEVICE int varlen_sequence_of_unit(const SchedulePlan& plan, int unit) {
  return plan.problem.kv_coord(unit / varlen_units_per_head(plan)).batch;
}

// Job `sub` of unit `unit` for a sequence of `lengths` (those of varlen_sequence_of_unit): valid == false when
// the unit holds no job of the sequence. Each case names its schedule; no default (-Werror=switch).
DASH_HOST_DEVICE Job make_varlen_job(const SchedulePlan& plan, int unit, int sub, SequenceLengths lengths) {
  const TiledProblem seq = sequence_problem(plan.problem, lengths);
  const int n = seq.num_kv_tiles();
  const int units = varlen_units_per_head(plan);
  const int head = unit / units;
  const int a = unit % units;
  switch (plan.kind) {
    case Schedule::kAscending:
    case Schedule::kDescending:
    case Schedule::kShortestFirst:
    case Schedule::kNondeterministic: {
      const Job planned = make_job(plan, unit, sub);
      if (!planned.valid || planned.kv_tile >= n) return Job{};
      return make_plain_job(seq, planned.head, planned.kv_tile);
    }
    case Schedule::kShift: {
      if (a >= n) return Job{};
      Job job = make_plain_job(seq, head, a);
      const WaveSlot slot = wave_slot(unit, head * units, n, plan.num_ctas);
      job.lane = slot.lane;
      job.wave_size = slot.size;
      job.earlier = slot.earlier;
      return job;
    }
    case Schedule::kSymmetricShift:
      // The sequence's own pairs, its head's units starting where the plan's do.
      if (a >= (n + 1) / 2) return Job{};
      return SymmetricShiftSchedule::pair_job(seq, plan.num_ctas, unit, head, a, head * units, sub);
    case Schedule::kAuto:
      break;
  }
  return Job{};  // a plan of kAuto has no jobs (schedule.hpp)
}

// The varlen forward's query tile: tile `planned` of the maximum problem's order `order` (ForwardTileOrder of the
// maxima) fitted to its sequence of `lengths`: the sequence's mask (the plan's with the sequence's lengths, as
// sequence_problem gives the backward), and kv_first, kv_tiles of a dense order of that mask. valid == false when the
// tile lies past the sequence's last query tile (the loader skips it). The fitted tiles of all t cover each
// sequence's (head, query tile) once, with a dense batch's ranges (test_packed_sequence.cpp).
struct FittedForwardTile {
  ForwardTile tile;
  MaskShape mask;
  bool valid;
};

DASH_HOST_DEVICE FittedForwardTile fit_forward_tile(const ForwardTileOrder& order, const ForwardTile& planned,
                                                    SequenceLengths lengths) {
  ForwardTileOrder fitted = order;
  fitted.mask.seqlen_q = lengths.seqlen_q;
  fitted.mask.seqlen_k = lengths.seqlen_k;
  FittedForwardTile result{planned, fitted.mask, planned.q_tile < fitted.q_tiles()};
  if (!result.valid) return result;
  result.tile.kv_first = fitted.kv_first_of(planned.q_tile);
  result.tile.kv_tiles = fitted.kv_end_of(planned.q_tile) - result.tile.kv_first;
  return result;
}

}  // namespace dash
