// The proof the API runs before a plan's first launch: the verdict and report of
// validate_schedule(expand_schedule(plan)) (coverage, rank permutation, deadlock freedom), without expanding
// the plan.
//
// Plans are proven from their schedule's structure when its hypotheses hold, which every plan the planner makes
// meets but the shift schedules under a sliding window: the shift schedules by shift_proof.hpp (make_job on one
// head per class, bounded by the CTA count), the key/value-order ones by kv_order_proof.hpp (the mask in
// O(n + m) and make_job on every unit); neither enumerates a visit. Otherwise heads whose jobs are equal but for the head index are proven once: the
// plan's heads are grouped into classes by their jobs (make_job on every unit, O(jobs)), and the visits
// (q_tile_at, rank_of, O(visits)) of one representative per class are checked against sufficient conditions
// that imply every check of the validator. validator.hpp says why that is sound. Visits are checked in chunks
// on several threads, keeping a few integers per query tile of one head per chunk, so memory depends neither
// on batch and heads nor on the number of visits. When a condition does not hold,
// streamed_validation_summary() (streamed_validator.hpp) decides, and words the finding as the validator would.
#pragma once

#include <string>

#include "schedule/plan.hpp"

namespace dash {

struct ProofStats {
  int heads = 0;                   // schedule heads of the plan
  int head_classes = 0;            // heads whose jobs (and visits, unless by_structure) were checked, one per class
  long long visits = 0;            // tile visits enumerated by the fast conditions
  int threads = 1;                 // threads that checked them
  bool by_structure = false;       // proven from the schedule's closed forms (shift_proof.hpp, kv_order_proof.hpp)
  bool streamed_fallback = false;  // a fast condition failed: the streamed validator decided
};

struct PlanProof {
  std::string summary;  // "valid", or the validator's first finding ("coverage: ...", "ranks: ...", "deadlock: ...")
  ProofStats stats;
  bool ok() const { return summary == "valid"; }
};

struct ProofOptions {
  // Off: every plan is enumerated (tests, and dash-attn prove --enumerate, to check the structural proofs against
  // the enumeration and to time the latter).
  bool by_structure = true;
  int max_threads = 0;  // 0: one per hardware thread
  // A class is cut into chunks of at least this many visits (whole waves), one thread each at a time: fewer
  // visits than this do not pay for a thread. Tests lower it to cut small plans into many chunks.
  long long min_visits_per_chunk = 1LL << 21;
};

PlanProof prove_plan(const SchedulePlan& plan, const ProofOptions& options = {});

}  // namespace dash
