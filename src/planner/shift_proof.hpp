// Proves plans of the shift schedules (shift, symmetric shift) from their structure: prove_plan's verdict for
// them without enumerating a single tile visit. The work is a few integers per key/value tile and per query
// tile of one head, and make_job on one head per class of equal heads; classes are bounded by the CTA count,
// so the cost depends neither on batch and heads nor on the visits (n m per head).
//
// prove_shift_by_structure checks hypotheses on the plan and on make_job's jobs, and when all hold, the
// theorems below give the fast conditions of validator.hpp ("Proving a plan without expanding it"), hence the
// validator's verdict "valid". When one fails it proves nothing, and prove_plan enumerates as for any plan:
// the verdict stays the validator's for every plan.
//
// Hypotheses (S CTAs, U units per head, n key/value tiles and m query tiles per head, H query heads per job;
// b(k) = problem.q_begin(k), C(v) = problem.kv_end(v), the contributor count where M holds):
//  M (the mask) b(k) = b(0) + g k with 0 <= b(k) < m, every band [b(k), m) (no sliding window ends one
//    early), and C(v) = #{k : b(k) <= v} for every tile v: tile v is seen by exactly the key/value tiles
//    [0, C(v)). Shift needs g = b(0) = 0 (C(v) = n: the full mask);
//    symmetric shift g >= 1 (causal, seqlen_q >= seqlen_k, block_kv a multiple of block_q, g = H stride).
//  J (the jobs) static dispatch, U = n (shift) or ceil(n / 2) (symmetric shift), num_units = heads U; head h
//    runs units [h U, (h + 1) U), split into waves by unit / S: the wave of units E .. E + R - 1 of the head
//    ("earlier" E, size R). Its lane j (unit E + j) holds, as make_job returns them, valid jobs of head h
//    with lane j, wave_size R, earlier E, q_begin = b(kv), q_end = m, num_steps = m - b(kv):
//      shift: jobs_per_unit 1, one job, not is_short, kv = E + j;
//      symmetric shift: jobs_per_unit 2, a long job (not is_short) kv = E + j and a short job (is_short)
//      kv' = n - 1 - E - j, which is invalid instead when kv' = kv (the middle tile of an odd n, the head's
//      last unit); both with rect_begin rb = b(E + R - 1) and wave_shorts = R - 1 when the wave holds that
//      middle unit, else R.
//  W (the waves) R <= m (shift), R <= m - rb (symmetric shift): a wave is no wider than the query tiles its
//    lanes rotate through. (For symmetric shift M implies it: m - rb > b(n - 1) - b(U - 1) >= n - U >= U - 1,
//    and R <= U.)
// M and W are the planner's preconditions and J is how make_job builds jobs, so every plan the planner makes of
// these schedules without a sliding window is proven here. Under a window symmetric shift folds the band instead
// (BandSymmetricShift in shift_schedules.hpp), which these theorems do not describe: such plans are enumerated.
//
// Theorem (shift). Under M and J with W, in every wave and for every tile v, the wave's R lanes each visit v
// once, at positions (v - j) mod m, no two alike (R <= m), and with ranks E + ((min(v, R - 1) - j) mod R), which
// in position order run E, E + 1, ..., E + R - 1: for v >= R - 1 positions v - j rise as j falls from R - 1
// to 0, ranks E + R - 1 - j; for v < R - 1 lanes v, ..., 0 come first (positions 0 .. v, ranks E + 0 .. v),
// then R - 1, ..., v + 1 (positions m - R + 1 + v .. m - 1 > v, ranks E + v + 1 .. E + R - 1). E is the
// number of visits of v in the head's earlier waves (every unit visits every tile), and the waves together
// give n = C(v). So each tile's ranks run 0 .. C(v) - 1 in key order (wave, position) with no tie.
//
// Theorem (symmetric shift). Under M and J with W, take a wave and a tile v; hr = m - rb >= R, and lane j's
// long job visits the rectangle [rb, m) at positions (v - rb - j) mod hr, then its triangle [b(E + j), rb)
// ascending (position hr + v - b(E + j)); its short job starts at position m - b(E + j) and visits
// [b(kv'), m) descending (position 2m - 1 - v - b(E + j)). Each job visits each tile of its range once.
//  - v >= rb. All R long jobs see v (b(E + j) <= rb): the shift theorem with m := hr gives positions below
//    hr and ranks base + 0 .. R - 1, where base = E + max(0, C(v) - (n - E)) counts the earlier waves'
//    visits of v: their long tiles 0 .. E - 1 all see v, their short tiles n - E .. n - 1 those below C(v)
//    (the middle unit is the head's last, never in an earlier wave). The short jobs that see v are the
//    lanes j >= n - E - C(v) below wave_shorts, at positions >= m - b(E + j) >= hr, falling as j rises
//    (g >= 1), with ranks base + R + wave_shorts - 1 - j: in position order base + R, base + R + 1, ...
//  - v < rb. Then C(v) <= E + R - 1 (tile E + R - 1 does not see v), and no short tile of this or an earlier
//    wave sees v: they are >= n - E - R >= E + R - 1 since E + R <= U = ceil(n / 2). The long lanes j with
//    b(E + j) <= v, i.e. j <= C(v) - 1 - E, visit v in their triangles at distinct positions falling as j
//    rises, with ranks E + C(v) - 1 - (E + j): in position order E, E + 1, ..., C(v) - 1; the earlier waves
//    gave v exactly their E long visits.
// Each wave thus gives v the ranks that follow its earlier waves' visits, in position order without ties, and
// as every key/value tile of the head is held by one job, the waves together give v its C(v) contributors.
//
// These are the fast conditions: the jobs cover the head's key/value tiles, each visit lies in its job's range,
// and every tile's ranks run 0 .. C(v) - 1 in key order with no two visits under one key. validator.hpp shows
// that they imply coverage, the rank permutation and deadlock freedom.
//
// Heads are checked one per class. Under static dispatch the fields of make_job (shift_schedules.hpp) but the
// head, for unit h U + a, are functions of a and of where the head's units meet wave boundaries: make_job takes
// the head as unit / U and the key/value tile from unit % U = a, and wave_slot's lane, size and earlier are
// unit - lo, hi - lo and lo - h U, where lo and hi, the wave's bounds clipped to the head's, lie relative to h U
// at 0, U or a boundary first_wave_start(h) + k S; rect_begin and wave_shorts follow from earlier and size. So
// heads with the same first_wave_start have the same jobs but the head (test_plan_proof.cpp checks it on random
// plans), and first_wave_start(h) depends on h U mod S only, which repeats with period S / gcd(U, S).
#pragma once

#include "schedule/plan.hpp"

namespace dash {

// Under static dispatch on `num_ctas` CTAs (unit u runs in wave u / num_ctas), where the first wave of `head`
// ends: the first of its units after its first that begins a wave, counted from its first (the head runs units
// [head U, (head + 1) U)), or U if none does. The waves of all its units follow: the others begin at
// first_wave_start + k num_ctas.
int first_wave_start(int head, int units_per_head, int num_ctas);

struct StructuralProof {
  bool proven = false;   // every hypothesis held: the plan is valid. false says nothing about the plan
  int head_classes = 0;  // heads whose jobs were checked, one per distinct first_wave_start
};

// See the file comment. Needs plan.num_ctas >= 1.
StructuralProof prove_shift_by_structure(const SchedulePlan& plan);

}  // namespace dash
