// Planner layer for variable-length batches (FlashAttention's cu_seqlens): a plan made from the maximum lengths,
// the number of sequences and the heads alone, proven for EVERY vector of sequence lengths it admits, so that a
// launch needs no lengths on the host (no copy of cu_seqlens per call; CUDA-graph capturable). auto also reads a
// hint of the packed rows (choose_varlen_auto), which picks among proven schedules and admits no other lengths. How
// a plan's jobs fit each sequence is schedule/varlen.hpp; for concrete lengths expand_varlen_schedule and
// validate_varlen_schedule enumerate and check it as validate_schedule does a dense plan (tests, the emulator).
//
// Admitted lengths: b sequences with 0 <= seqlen_q[b] <= max_seqlen_q and 0 <= seqlen_k[b] <= max_seqlen_k, and,
// where the plan was made with keys_within_queries, seqlen_k[b] <= seqlen_q[b] (self-attention, where
// cu_seqlens_k is cu_seqlens_q, meets it). check_varlen_lengths says whether a vector is admitted.
//
// Which schedules, and why (n_b, m_b: key/value and query tiles of sequence b; each sequence's heads are heads of
// the maximum plan, and their dQ tiles are theirs alone, so each head is argued alone and the keys below order
// visits across heads as for a dense plan):
//  - ascending, descending, shortest-first, nondeterministic: every admitted vector (no promise needed). Dynamic
//    dispatch; a fitted job is the sequence problem's job of the same key/value tile, or none when the tile lies
//    past n_b. Hypothesis M of kv_order_proof.hpp holds for every pair of lengths, 0 included (its argument is
//    there; test_varlen.cpp re-checks every pair up to past three tiles), J holds for the jobs that exist, and
//    the theorem of kv_order_proof.hpp needs of the key (the unit) only that it rise with k (falls, for
//    shortest-first) along each head, which dropping units past n_b keeps. So each tile's ranks run 0 .. C(v) - 1
//    in unit order with no tie: the fast conditions of validator.hpp, hence coverage, permutation and deadlock
//    freedom under every timing.
//  - shift (full mask): every admitted vector of a plan made with keys_within_queries and block_q <= block_kv.
//    Static dispatch; head h's units [h U, h U + n_b) hold tiles 0 .. n_b - 1 and its waves are those units cut at
//    multiples of the CTA count, so the head is a dense shift head of n_b tiles on m_b query tiles whose units
//    start at h U. The theorem of shift_proof.hpp holds for it when every wave R_b <= m_b (hypothesis W): R_b <=
//    n_b = ceil(seqlen_k / block_kv) <= ceil(seqlen_q / block_q) <= m_b. Without the promise a sequence of one
//    query tile and many key/value tiles breaks W (every lane meets on query tile 0 at step 0) and the theorem
//    says nothing: refused, as the dense planner refuses such a shape (enumerating small cases found no failing
//    one, which proves nothing for larger ones).
//  - symmetric shift (causal, no sliding window): every admitted vector of a plan made with keys_within_queries
//    and block_kv a multiple of block_q. The head is a dense symmetric-shift head of n_b tiles (units: the
//    sequence's ceil(n_b / 2) pairs, waves cut as above); M of shift_proof.hpp holds for every seqlen_q >=
//    seqlen_k (b(k) = (k block_kv / block_q + floor((seqlen_q - seqlen_k) / block_q)) H, exactly linear), and M
//    implies W there. Without the promise the first tiles of a sequence with seqlen_k > seqlen_q all start on
//    query tile 0 (b is not linear), outside the theorem: refused, as the dense planner refuses that shape. Under a sliding window the fold depends
//    on the lengths (its first folded tile F) and plans are proven only by enumeration: refused.
// In both shift cases the key of a visit is (wave of its unit, position in the unit), which rises along every
// CTA's chain whatever the lengths (a CTA's next unit is in the next wave; a unit without a job is skipped), and
// the theorems give each tile's ranks in key order without ties; validator.hpp's argument then applies as for a
// dense plan.
//
// prove_varlen_plan checks the plan-level hypotheses (the schedule, the mask, the promise and tile shapes above)
// and proves the maximum plan by structure (shift_proof.hpp, kv_order_proof.hpp), which checks the schedules'
// closed forms on its jobs; the fitted jobs are built by varlen.hpp as the theorems read them, and test_varlen.cpp
// holds them to make_job at the maximum lengths and validates them for adversarial lengths of every schedule.
#pragma once

#include <string>
#include <vector>

#include "dash/types.hpp"
#include "planner/plan_proof.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/validator.hpp"
#include "schedule/varlen.hpp"

namespace dash {

struct VarlenPlan {
  SchedulePlan plan;                 // of the maximum problem (schedule/varlen.hpp)
  bool keys_within_queries = false;  // admits only seqlen_k[b] <= seqlen_q[b]
};

struct VarlenPlanResult {
  VarlenPlan plan{};
  std::string rejected;  // empty when the schedule is planned for every admitted vector of lengths
  bool ok() const { return rejected.empty(); }
};

// What Schedule::kAuto runs on a varlen batch, and why: choose_auto's choice for the maximum problem, except under
// the full mask (no causal mask, no window) when `lengths_fill_maxima` is false, that is when the batch's packed
// rows show that not every sequence can be as long as the maxima (fewer than batch * max_seqlen rows of queries or
// of keys): shortest-first, which measured faster than shift on mixed lengths (varlen_plan.cpp). The hint only
// chooses among schedules proven for every admitted vector of lengths; it admits no vector and refuses none, so a
// plan is as valid for batches whose totals say otherwise (they merely may not run the fastest schedule).
AutoChoice choose_varlen_auto(const TiledProblem& max_problem, bool lengths_fill_maxima, int num_sms);

// The plan of `schedule` (kAuto resolved) for a varlen batch whose maximum problem is `max_problem`
// (make_tiled_problem of the shape with batch = sequences, seqlen_q and seqlen_k = the maximum lengths). Refuses,
// saying why, a schedule not proven for every admitted vector (file comment), and whatever make_schedule_plan
// refuses for the maximum problem. kAuto: choose_varlen_auto's schedule, or ascending where that is refused (shift
// without keys_within_queries). `lengths_fill_maxima` is read for kAuto alone (choose_varlen_auto).
VarlenPlanResult plan_varlen_schedule(const TiledProblem& max_problem, bool keys_within_queries,
                                      bool lengths_fill_maxima, Schedule schedule, int num_sms);

// "valid" when the plan is proven for every admitted vector of lengths (file comment); otherwise why not.
PlanProof prove_varlen_plan(const VarlenPlan& plan);

// Sequence lengths from FlashAttention's cu_seqlens_q and cu_seqlens_k (b + 1 offsets each, starting at 0, never
// decreasing); empty when `error` was set.
std::vector<SequenceLengths> lengths_from_cu_seqlens(const std::vector<int>& cu_seqlens_q,
                                                     const std::vector<int>& cu_seqlens_k, std::string* error);

// Empty when `lengths` are admitted by the plan: one per sequence, within the maxima, and seqlen_k <= seqlen_q
// where promised; otherwise the first that is not, named.
std::string check_varlen_lengths(const VarlenPlan& plan, const std::vector<SequenceLengths>& lengths);

// Every job and visit of the plan fitted to `lengths` (admitted), as expand_schedule enumerates a dense plan: dQ
// tiles numbered as in the maximum problem, each with the contributions of its sequence's mask.
ExpandedSchedule expand_varlen_schedule(const VarlenPlan& plan, const std::vector<SequenceLengths>& lengths);

// validate_schedule for an expanded varlen schedule: coverage against each sequence's problem (every key/value
// tile of every head once, each job on its band, each visit once), then validate_schedule's order checks.
ValidationReport validate_varlen_schedule(const ExpandedSchedule& schedule,
                                          const std::vector<SequenceLengths>& lengths);

}  // namespace dash
