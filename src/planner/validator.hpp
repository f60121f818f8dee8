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
  DagAnalysis dag;             // on the validated CTA assignment: critical path and lemma check

  bool ok() const { return coverage_error.empty() && rank_error.empty() && deadlock_free; }
  // The first failure, or "valid".
  std::string summary() const;
};

ValidationReport validate_schedule(const ExpandedSchedule& schedule);

}  // namespace dash
