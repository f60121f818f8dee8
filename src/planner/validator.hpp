// Proves, for one shape, that a schedule is safe to run: every job exists once and visits each query
// tile it sees once; each dQ tile's ranks are a permutation of its contributions; and no timing of the
// persistent CTAs can make a wait last forever. Also checks the paper's lemma.
//
// Why one simulation proves deadlock freedom for every timing (static dispatch): a contribution whose
// rank equals its tile's semaphore stays enabled until it runs, because only the contribution holding
// that rank moves the semaphore. Enabled work is never disabled, so every maximal execution runs the
// same set of steps: if one execution finishes, all do. Under dynamic dispatch a CTA may run any
// unit, so the validator requires instead that each contribution waits only on contributions of
// earlier units (which started before it), and the simulation confirms it.
//
// Proving a plan without expanding it (prove_plan, plan_proof.hpp): conditions on one head per class of
// equal heads that imply every check above.
//  - Equal heads. Head h runs units [h U, (h + 1) U): checked, every valid job of those units names head h.
//    Two heads whose jobs are equal field by field but for the head (checked by make_job on every unit) make
//    the same visits: q_tile_at and rank_of read a job's other fields, never its head (test_plan_proof.cpp
//    checks that they ignore it). dq_tile_index maps (head, query tile v) one to one onto the dQ tiles, head
//    h owning [h m, (h + 1) m), so no tile is shared between heads and coverage and the rank permutation hold
//    for a head exactly when they hold for its class's representative. Which heads are equal follows from
//    the schedules: the key/value-order schedules build a job from unit / n and unit % n only, so all heads
//    are equal; the shift schedules' wave bookkeeping (wave_slot) depends on where a head starts within its
//    wave, so heads fall into at most num_ctas / gcd(U, num_ctas) classes, and all heads that lie inside one
//    wave into one. The class check finds this rather than assuming it.
//  - Coverage. Each job of the representative holds its own key/value tile, starts where its mask starts and
//    makes m - q_begin visits, each to a query tile of its range. A job visiting a tile twice would give that
//    tile one rank twice (rank_of depends on the job and the tile alone), which the rank condition refuses;
//    the unordered schedule, which has no ranks, checks repeats directly.
//  - Ranks and deadlock freedom. Each visit gets a key, and each tile's visits, in key order, must hold ranks
//    0, 1, ..., contributors - 1, no two under one key. So the ranks are a permutation, and every wait (rank
//    r on rank r - 1 of the same tile) points to a strictly smaller key.
//      Dynamic dispatch: key = unit. Every wait points to an earlier unit, which is the dynamic check above,
//      and implies deadlock freedom for any timing: in a state where CTAs wait, take the waiting step of the
//      lowest unit; the unit it waits on is lower, so it was dispatched earlier and, not waiting, runs on.
//      Static dispatch: key = (wave of the unit, position of the visit in its unit's jobs). Along every CTA's
//      chain the key rises (the next unit of a CTA is in the next wave), and waits point to smaller keys, so
//      the DAG of chains and waits has no cycle; then no execution stalls, since the first unexecuted step in
//      a topological order has its predecessors done, its semaphore at its rank, and can run. This is the
//      paper's lemma, wave by wave. The waves of a head's units, counted from its first, depend only on where
//      its first wave starts, which is part of the class, so the keys of a head compare as its class's do.
//  When a condition fails (a schedule that waits across equal positions without deadlocking, or a broken
//  plan), the streamed validator (streamed_validator.hpp) runs the checks above as written and decides.
//  The shift schedules need not enumerate their visits for these conditions: shift_proof.hpp derives them from
//  the schedules' closed forms, under hypotheses it checks on the plan and on the jobs.
#pragma once

#include <string>

#include "planner/dag.hpp"
#include "planner/expanded_schedule.hpp"

namespace dash {

struct ValidationReport {
  std::string coverage_error;  // empty when every job and visit is present exactly once
  std::string rank_error;      // empty when ranks form a permutation per dQ tile
  bool ordered = true;         // false for the nondeterministic schedule (no ranks to check)
  bool deadlock_free = false;
  std::string deadlock_error;
  DagAnalysis dag;  // on the validated CTA assignment: critical path and lemma check

  bool ok() const { return coverage_error.empty() && rank_error.empty() && deadlock_free; }
  // The first failure, or "valid".
  std::string summary() const;
};

ValidationReport validate_schedule(const ExpandedSchedule& schedule);

// validate_schedule where each head covers a problem of its own (a varlen batch's sequence: HeadProblem in
// expanded_schedule.hpp): its jobs must cover that problem's key/value tiles and query ranges.
ValidationReport validate_schedule(const ExpandedSchedule& schedule, const HeadProblem& head_problem);

}  // namespace dash
