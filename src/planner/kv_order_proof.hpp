// Proves plans of the key/value-order schedules (ascending, descending, shortest-first, nondeterministic) from
// their structure: prove_plan's verdict for them without enumerating a tile visit. The work is a few integers per
// key/value tile and per query tile of one head (the mask) and one make_job per unit, so it grows with neither
// the visits (n m per head) nor, beyond make_job, with batch and heads. Without it a 1M-token MQA head of head
// dim 128 enumerated 2 * 10^9 visits (2.4-5.2 s on two cores).
//
// prove_kv_order_by_structure checks hypotheses on the plan, the mask and make_job's jobs; when all hold, the
// theorem below gives the fast conditions of validator.hpp ("Proving a plan without expanding it"), hence the
// validator's verdict "valid". When one fails it proves nothing, and prove_plan enumerates as for any plan.
//
// Hypotheses (n key/value tiles and m query tiles per head; B(k) = q_begin(k), E(k) = q_end(k), K(v) =
// kv_begin(v), L(v) = kv_end(v) of the plan's TiledProblem):
//  P (the plan) dynamic dispatch, one job per unit, num_units = heads n.
//  M (the mask) the tiles whose band [B(k), E(k)) is not empty are one range [k0, k1), on which B and E never
//    decrease; and for every tile v, [K(v), L(v)) is the set {k : B(k) <= v < E(k)} (empty when K(v) >= L(v)).
//    With B and E monotone that set is [a(v), b(v)): a(v) the first k in [k0, k1) with E(k) > v, b(v) the first
//    with B(k) > v (or k1), both non-decreasing in v, so one sweep over v checks it.
//  J (the jobs) unit u holds one valid job of head u / n, key/value tile sigma(u mod n), band [B, E) of that
//    tile and E - B steps, where sigma is the identity (ascending, descending, nondeterministic visiting
//    ascending) or k -> n - 1 - k (shortest-first, nondeterministic visiting shortest-first), as
//    kv_order_schedules.hpp builds them. The nondeterministic schedule's choice (and its visiting direction in
//    F) is read off its first unit's job; it needs neither fixed, since it has no ranks.
//  F (the closed forms of kv_order_schedules.hpp, which the check samples at both ends of every job's band)
//    q_tile_at(job, s) = B + s (ascending, shortest-first) or E - 1 - s (descending), so a job visits each tile
//    of its band once; rank_of(job, v) = k - K(v) (ascending, descending) or L(v) - 1 - k (shortest-first).
//
// Theorem. Under P, M, J and F every (head, key/value tile) is one unit's job, which visits exactly the tiles of
// its band, once each; by M tile v is visited by the jobs of tiles [K(v), L(v)), C(v) = L(v) - K(v) of them. The
// key of a visit is its unit h n + sigma^-1(k). Ascending and descending: the key rises with k and so does the
// rank k - K(v), from 0 to C(v) - 1. Shortest-first: the key rises as k falls, and so does the rank L(v) - 1 - k,
// from 0 to C(v) - 1. So each tile's ranks run 0 .. C(v) - 1 in key order with no two visits under one key,
// the fast conditions under dynamic dispatch; the nondeterministic schedule has no ranks, and coverage is all
// it needs. validator.hpp shows that these imply coverage, the rank permutation and deadlock freedom.
//
// Any lengths. M holds for every (seqlen_q, seqlen_k, mask, window), so these schedules need no proof per length:
// a query row sees the keys [first_visible_key(row), visible_keys(row)), both ends non-decreasing in the row and
// moving by at most one key per row (mask.hpp), so the keys some row sees form one range and, tile by tile, the
// first and last rows that see a key/value tile do not decrease with the tile: B and E never decrease on the
// tiles that see something, which are one range, and K(v), L(v) are the inverse images that M compares.
// test_plan_proof.cpp checks it for every pair of lengths up to past three tiles of both tile shapes, under
// every mask and several windows, with and without GQA splits. So a packed batch (varlen) may plan each
// sequence's jobs from the maximum length and size them at run time from the real lengths: every
// sequence's problem meets M, J and F are the schedules' own code, and the theorem applies sequence by
// sequence (dQ tiles of different sequences are distinct, as those of different heads are).
//
// F is read from the code rather than checked on every visit; test_plan_proof.cpp checks the verdict against
// the enumerating proof and the expanding validator on random plans, sliding windows and corrupted plans.
#pragma once

#include "planner/shift_proof.hpp"  // StructuralProof
#include "schedule/plan.hpp"

namespace dash {

// See the file comment. head_classes in the result is 1: every head's jobs are checked and are equal but for
// the head, so all heads form one class.
StructuralProof prove_kv_order_by_structure(const SchedulePlan& plan);

}  // namespace dash
