// DASH's shift schedules. Units are assigned statically (CTA c runs units c, c + S, c + 2S, ... for S
// CTAs), so the units of one head that run at the same time form a "wave" whose members can be
// steered onto different query tiles at every step.
#pragma once

#include "schedule/plan.hpp"

namespace dash {

// Shift scheduling (full mask). Unit = one key/value tile. Within a wave, lane j visits query tiles
// (j + s) mod m at step s, so at every step the R lanes of a head touch R different query tiles. Each
// query tile sums its contributions in the order the lanes reach it: all earlier waves first, then
//   q >= R - 1:  lanes, ..., 0
//   q <  R - 1:  lanes q, q-1, ..., 0, R-1, ..., q+1
// which is rank = earlier + ((min(q, R-1) - j) mod R). No lane ever waits on a lane that reaches the
// tile later (the paper's lemma), so in the DAG model the makespan is m n (c + r) with no bubbles.
// Example, 4 key/value tiles x 4 query tiles, one wave (cells: query tile visited, rank):
//   step | lane 0 | lane 1 | lane 2 | lane 3
//     0  | Q0 r0  | Q1 r0  | Q2 r0  | Q3 r0
//     1  | Q1 r1  | Q2 r1  | Q3 r1  | Q0 r1
//     2  | Q2 r2  | Q3 r2  | Q0 r2  | Q1 r2
//     3  | Q3 r3  | Q0 r3  | Q1 r3  | Q2 r3
// Precondition: m >= R (otherwise two lanes share a query tile at some step).
struct ShiftSchedule {
  DASH_HOST_DEVICE static Job make_job(const SchedulePlan& plan, int unit) {
    const int n = plan.problem.num_kv_tiles();
    const int head = unit / n;
    Job job = make_plain_job(plan.problem, head, unit % n);
    const WaveSlot slot = wave_slot(unit, head * n, n, plan.num_ctas);
    job.lane = slot.lane;
    job.wave_size = slot.size;
    job.earlier = slot.earlier;
    return job;
  }
  DASH_HOST_DEVICE static int q_tile_at(const SchedulePlan& plan, const Job& job, int step) {
    return (job.lane + step) % plan.problem.num_q_tiles();
  }
  DASH_HOST_DEVICE static int rank_of(const Job& job, int v) {
    const int row = v < job.wave_size - 1 ? v : job.wave_size - 1;
    return job.earlier + positive_mod(row - job.lane, job.wave_size);
  }
};

// Symmetric shift scheduling (causal mask). Unit p of a head = the pair of key/value tiles
// (p, n-1-p): a long chain then a short one, so every unit does the same amount of work. With
// stride = block_kv / block_q, long tile i of the wave sees query tiles [lo_i, m), lo_i growing by
// `stride` per tile. Its job visits
//   1. the "rectangle" [rect_begin, m) that all long tiles of the wave see, cyclically shifted by its
//      lane as in ShiftSchedule;
//   2. its own part of the upper-left triangle, [lo_i, rect_begin), ascending;
// and then the short job visits its tiles descending. Summation order of a query tile: earlier waves,
// then the wave's long tiles in arrival order, then its short tiles longest first (the lane whose long
// chain ends first starts its short chain first). Example, n = m = 8, stride 1, 4 CTAs:
//   CTA 0: KV0  Q3 Q4 Q5 Q6 Q7 | Q0 Q1 Q2 ; KV7  Q7
//   CTA 1: KV1  Q4 Q5 Q6 Q7 Q3 | Q1 Q2    ; KV6  Q7 Q6
//   CTA 2: KV2  Q5 Q6 Q7 Q3 Q4 | Q2       ; KV5  Q7 Q6 Q5
//   CTA 3: KV3  Q6 Q7 Q3 Q4 Q5 |          ; KV4  Q7 Q6 Q5 Q4
// Every CTA does n + 1 = 9 visits; Q4 sums KV1, KV0, KV3, KV2, KV4.
// With an odd number of key/value tiles the middle tile forms a unit of its own.
// Preconditions: causal, block_kv a multiple of block_q, seqlen_q >= seqlen_k (so lo_i is exactly
// linear in i), and rectangles at least as tall as their wave (m - rect_begin >= R).
struct SymmetricShiftSchedule {
  DASH_HOST_DEVICE static int units_per_head(const TiledProblem& p) { return (p.num_kv_tiles() + 1) / 2; }

  DASH_HOST_DEVICE static Job make_job(const SchedulePlan& plan, int unit, int sub) {
    const TiledProblem& p = plan.problem;
    const int n = p.num_kv_tiles();
    const int pairs = units_per_head(p);
    const int head = unit / pairs;
    const int pair = unit % pairs;
    const bool is_short = sub == 1;
    const int kv = is_short ? n - 1 - pair : pair;
    Job job = make_plain_job(p, head, kv);
    job.is_short = is_short;
    job.valid = !(is_short && kv == pair);
    const WaveSlot slot = wave_slot(unit, head * pairs, pairs, plan.num_ctas);
    job.lane = slot.lane;
    job.wave_size = slot.size;
    job.earlier = slot.earlier;
    const bool wave_has_middle = (n % 2 == 1) && slot.earlier + slot.size == pairs;
    job.wave_shorts = slot.size - (wave_has_middle ? 1 : 0);
    job.rect_begin = p.q_begin(slot.earlier + slot.size - 1);
    return job;
  }

  DASH_HOST_DEVICE static int q_tile_at(const SchedulePlan& plan, const Job& job, int step) {
    const int m = plan.problem.num_q_tiles();
    if (job.is_short) return m - 1 - step;
    const int rect_steps = m - job.rect_begin;
    if (step < rect_steps) return job.rect_begin + (job.lane + step) % rect_steps;
    return job.q_begin + (step - rect_steps);
  }

  DASH_HOST_DEVICE static int rank_of(const SchedulePlan& plan, const Job& job, int v) {
    const TiledProblem& p = plan.problem;
    const int contributors = p.kv_end(v);
    if (!job.is_short && v < job.rect_begin) {
      // Triangle: only long tiles of this and earlier waves see v; the wave's tiles reach it in
      // descending key/value order.
      return job.earlier + (contributors - 1 - job.kv_tile);
    }
    // Earlier waves: all their long tiles, and those of their short tiles that see v.
    const int earlier_shorts_seeing_v = contributors - (p.num_kv_tiles() - job.earlier);
    const int before_wave = job.earlier + (earlier_shorts_seeing_v > 0 ? earlier_shorts_seeing_v : 0);
    if (job.is_short) return before_wave + job.wave_size + (job.wave_shorts - 1 - job.lane);
    const int row = v - job.rect_begin;
    const int clamped = row < job.wave_size - 1 ? row : job.wave_size - 1;
    return before_wave + positive_mod(clamped - job.lane, job.wave_size);
  }
};

}  // namespace dash
