// DASH's shift schedules. Units are assigned statically (CTA c runs units c, c + S, c + 2S, ... for S
// CTAs), so the units of one head that run at the same time form a "wave" whose members can be
// steered onto different query tiles at every step: shift for the full mask, symmetric shift for the causal
// mask and, folding the band's triangle, for a causal sliding window.
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

// Symmetric shift under a causal sliding window (window_size = (left, 0), or causal with a left bound):
// the band's DAG. Key/value tile k sees the band of query tiles [b_k, e_k): b_k = b_0 + g k rises by
// g = (block_kv / block_q) * heads_per_job per tile, and so does e_k until it reaches the last query
// tile m. Tiles [0, F) see full-length bands of L = e_0 - b_0 tiles; the tiles [F, n) whose bands the
// last query tile cuts short form a triangle, their lengths falling by g. A unit is one full-length
// tile, or, as symmetric shift folds the causal triangle, the pair (F + i, n - 1 - i) of triangle tiles,
// long then short (an odd triangle leaves its middle tile alone). Units of a head run in that order.
// Jobs visit
//   full-length tiles and the long tile of a pair: their band ascending (position v - b_k);
//   the short tile of a pair: its band descending, after its partner (position L_a + m - 1 - v).
// No rotation is needed: the band's slope already staggers the tiles of a wave, which reach any query
// tile v at distinct positions v - b_k (b_k distinct). A short tile's position L_a + m - 1 - v =
// 2m - 1 - v - b_a has the other parity than v - b_k whenever g is even (b_a - b_k is a multiple of g),
// so no short tile meets an ascending one, and two short tiles differ by b_a. Summation order of a tile:
// earlier waves of its head first, then the wave's visits in position order (arrival order).
// Example: stride 2 (g = 2), 8 key/value x 16 query tiles, left window of 4 rows (L = 6), 7 CTAs:
//   CTA 0..5: KVk  Q2k .. Q2k+5          (CTA 5: KV5 Q10 .. Q15)
//   CTA 6:    KV6  Q12 Q13 Q14 Q15 ; KV7  Q15 Q14
// Every CTA does L = 6 visits; Q14 sums KV6 (position 2), KV5 (4), KV7 (5); Q15 sums KV6, KV7, KV5.
// Closed form in the DAG model (compute c, reduce r per visit; H schedule heads of U = F + (n - F) / 2
// units on S CTAs): when the pairs are as long as a full band and the triangle has no middle tile, every
// unit does L visits, so a CTA's i-th unit starts at i L (c + r) unless it stalls; each tile's order
// follows (wave, position), which is then chain depth, strictly; by the paper's lemma nothing stalls and
//   T = ceil(H U / S) L (c + r),
// the work bound up to the last wave (test_closed_forms.cpp checks the simulator reproduces it). On other
// shapes the same orders stay valid (the keys (wave, position) rise along every chain and waits point to
// smaller ones), but units of different lengths let later waves start early and stall.
// Preconditions (planner): causal with a left window, block_kv a multiple of block_q, seqlen_q >= seqlen_k
// (b_k exactly linear), g even.
struct BandSymmetricShift {
  DASH_HOST_DEVICE static int band_length(const TiledProblem& p, int kv) { return p.q_end(kv) - p.q_begin(kv); }
  // F: the first key/value tile whose band is shorter than tile 0's (n when none is). Bands keep tile 0's
  // length up to F and shrink after it, so a binary search finds it.
  DASH_HOST_DEVICE static int fold_begin(const TiledProblem& p) {
    const int full = band_length(p, 0);
    int lo = 1;
    int hi = p.num_kv_tiles();
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (band_length(p, mid) < full) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }
  DASH_HOST_DEVICE static int units_per_head(const TiledProblem& p, int fold) {
    return fold + (p.num_kv_tiles() - fold + 1) / 2;
  }
  // Query tiles between the bands of consecutive key/value tiles: integral, as the planner admits symmetric shift
  // only where block_kv is a multiple of block_q (symmetric_shift_tile_refusal).
  DASH_HOST_DEVICE static int slope(const TiledProblem& p) { return p.block_kv / p.block_q * p.heads_per_job(); }

  DASH_HOST_DEVICE static Job make_job(const SchedulePlan& plan, int unit, int sub) {
    const TiledProblem& p = plan.problem;
    const int n = p.num_kv_tiles();
    const int fold = fold_begin(p);
    const int units = units_per_head(p, fold);
    const int head = unit / units;
    const int u = unit % units;
    const bool is_short = sub == 1;
    // Unit u runs tile u first (full-length, or the long tile of a pair); a pair's short tile second.
    const int kv = is_short ? n - 1 - (u - fold) : u;
    Job job = make_plain_job(p, head, kv);
    job.is_short = is_short;
    job.valid = !is_short || (u >= fold && kv != u);
    const WaveSlot slot = wave_slot(unit, head * units, units, plan.num_ctas);
    job.lane = slot.lane;
    job.wave_size = slot.size;
    job.earlier = slot.earlier;
    job.fold_begin = fold;
    return job;
  }

  DASH_HOST_DEVICE static int q_tile_at(const Job& job, int step) {
    return job.is_short ? job.q_end - 1 - step : job.q_begin + step;
  }

  // Earlier waves' visits of v, then this wave's visits with smaller positions.
  DASH_HOST_DEVICE static int rank_of(const SchedulePlan& plan, const Job& job, int v) {
    const TiledProblem& p = plan.problem;
    const int n = p.num_kv_tiles();
    const int m = p.num_q_tiles();
    const int fold = job.fold_begin;
    const int b0 = p.q_begin(0);
    const int g = slope(p);
    const int seen_begin = p.kv_begin(v);
    const int seen_end = p.kv_end(v);
    // Tiles of the head's units [0, E): the first tiles [0, E) and the short tiles of its pairs.
    const int earlier = job.earlier;
    const int earlier_shorts_begin = n - (earlier > fold ? earlier - fold : 0);
    int rank = overlap(seen_begin, seen_end, 0, earlier) + overlap(seen_begin, seen_end, earlier_shorts_begin, n);
    const int position =
        job.is_short ? band_length(p, n - 1 - job.kv_tile + fold) + job.q_end - 1 - v : v - job.q_begin;
    // This wave's first tiles [E, E + R), at positions v - b_k: those with b_k > v - position come first.
    const int wave_end = earlier + job.wave_size;
    const int ascending_after = floor_div(v - position - b0, g) + 1;
    rank += overlap(seen_begin, seen_end, earlier > ascending_after ? earlier : ascending_after, wave_end);
    // This wave's short tiles s, partner a = F + n - 1 - s, at positions 2m - 1 - v - b_a: those with
    // b_a > 2m - 1 - v - position come first, i.e. s below `shorts_before`.
    const int first_pair_unit = earlier > fold ? earlier : fold;
    const int shorts_begin = n - (wave_end - fold);
    const int shorts_end = n - (first_pair_unit - fold);
    const int shorts_before = fold + n - 1 - floor_div(2 * m - 1 - v - b0 - position, g);
    rank += overlap(seen_begin, seen_end, shorts_begin, shorts_end < shorts_before ? shorts_end : shorts_before);
    // The middle unit of an odd triangle has no short tile: the short range above then names its long tile,
    // which the first tiles already counted.
    const int middle = fold + (n - fold) / 2;
    const bool wave_has_middle = (n - fold) % 2 == 1 && middle >= first_pair_unit && middle < wave_end;
    if (wave_has_middle && middle >= shorts_begin && middle < shorts_end && middle < shorts_before &&
        middle >= seen_begin && middle < seen_end) {
      --rank;
    }
    return rank;
  }

 private:
  // |[a, b) ∩ [c, d)|
  DASH_HOST_DEVICE static int overlap(int a, int b, int c, int d) {
    const int lo = a > c ? a : c;
    const int hi = b < d ? b : d;
    return hi > lo ? hi - lo : 0;
  }
};

// The band's construction is compiled for the host alone: in the backward loader, whose producer warp keeps 24
// registers, it tripled the spill code at head dim 128 (scripts/sass_report.sh: STL 74 -> 236), and the full and
// causal kernels would pay for it too (the branch is at run time). So the kernels run no windowed symmetric-shift
// plan: plan_backward refuses one (api/backward_plan.cpp reads kBandFoldInKernels), and the planner, simulator,
// emulator and proofs keep it. Running it on the GPU starts by setting kBandFoldInKernels and measuring the
// loader again.
inline constexpr bool kBandFoldInKernels = false;
#if defined(__CUDA_ARCH__)
inline constexpr bool kBandFoldCompiled = kBandFoldInKernels;
#else
inline constexpr bool kBandFoldCompiled = true;
#endif

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
// Under a causal sliding window it folds the band's triangle instead (BandSymmetricShift, above).
struct SymmetricShiftSchedule {
  DASH_HOST_DEVICE static int units_per_head(const TiledProblem& p) {
    if (kBandFoldCompiled && p.windowed()) {
      return BandSymmetricShift::units_per_head(p, BandSymmetricShift::fold_begin(p));
    }
    return (p.num_kv_tiles() + 1) / 2;
  }

  DASH_HOST_DEVICE static Job make_job(const SchedulePlan& plan, int unit, int sub) {
    if (kBandFoldCompiled && plan.problem.windowed()) return BandSymmetricShift::make_job(plan, unit, sub);
    const int pairs = units_per_head(plan.problem);
    const int head = unit / pairs;
    return pair_job(plan.problem, plan.num_ctas, unit, head, unit % pairs, head * pairs, sub);
  }

  // Job `sub` (0: the pair's long tile, 1: its short one) of unit `unit`, which holds pair `pair` of problem p's
  // head `head`, whose (n + 1) / 2 units start at `first_unit` (unit = first_unit + pair; varlen plans place a
  // sequence's pairs at the start of the maximum problem's units: schedule/varlen.hpp).
  DASH_HOST_DEVICE static Job pair_job(const TiledProblem& p, int num_ctas, int unit, int head, int pair,
                                       int first_unit, int sub) {
    const int n = p.num_kv_tiles();
    const int pairs = (n + 1) / 2;
    const bool is_short = sub == 1;
    const int kv = is_short ? n - 1 - pair : pair;
    Job job = make_plain_job(p, head, kv);
    job.is_short = is_short;
    job.valid = !(is_short && kv == pair);
    const WaveSlot slot = wave_slot(unit, first_unit, pairs, num_ctas);
    job.lane = slot.lane;
    job.wave_size = slot.size;
    job.earlier = slot.earlier;
    const bool wave_has_middle = (n % 2 == 1) && slot.earlier + slot.size == pairs;
    job.wave_shorts = slot.size - (wave_has_middle ? 1 : 0);
    job.rect_begin = p.q_begin(slot.earlier + slot.size - 1);
    return job;
  }

  DASH_HOST_DEVICE static int q_tile_at(const SchedulePlan& plan, const Job& job, int step) {
    if (kBandFoldCompiled && plan.problem.windowed()) return BandSymmetricShift::q_tile_at(job, step);
    const int m = plan.problem.num_q_tiles();
    if (job.is_short) return m - 1 - step;
    const int rect_steps = m - job.rect_begin;
    if (step < rect_steps) return job.rect_begin + (job.lane + step) % rect_steps;
    return job.q_begin + (step - rect_steps);
  }

  DASH_HOST_DEVICE static int rank_of(const SchedulePlan& plan, const Job& job, int v) {
    if (kBandFoldCompiled && plan.problem.windowed()) return BandSymmetricShift::rank_of(plan, job, v);
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
