// prove_kv_order_by_structure: the hypotheses of kv_order_proof.hpp, cheapest first: the plan's fields, the mask
// (O(n + m)), then every unit's job and the closed forms at the ends of its band (O(units)).
#include "planner/kv_order_proof.hpp"

#include "schedule/schedule.hpp"

namespace dash {
namespace {

// How a schedule maps a head's units to key/value tiles and visits a band, as kv_order_schedules.hpp defines it.
struct Form {
  bool reversed_tiles;   // unit a of a head holds tile n - 1 - a (shortest-first) rather than a
  bool descending;       // the band is visited from its last tile down
  bool ranked_from_end;  // rank L(v) - 1 - k (shortest-first) rather than k - K(v); unused when unordered
};

// The form of a key/value-order plan, or false for the other schedules. The nondeterministic schedule takes
// another schedule's tiles and visits, whichever suits the problem (kv_order_schedules.hpp); it has no ranks, so
// coverage is all its proof needs, which holds for either tile order and either visiting direction: its form is
// read off its first unit's job, and unit_has_the_structure then holds every unit to it.
bool form_of(const SchedulePlan& plan, Form* form) {
  switch (plan.kind) {
    case Schedule::kAscending:
      *form = {false, false, false};
      return true;
    case Schedule::kDescending:
      *form = {false, true, false};
      return true;
    case Schedule::kShortestFirst:
      *form = {true, false, true};
      return true;
    case Schedule::kNondeterministic: {
      const int n = plan.problem.num_kv_tiles();
      const Job first = make_job(plan, 0, 0);
      const bool reversed = n > 1 && first.kv_tile == n - 1;
      const bool descending = first.num_steps > 1 && q_tile_at(plan, first, 0) == first.q_end - 1;
      *form = {reversed, descending, false};
      return true;
    }
    case Schedule::kShift:
    case Schedule::kSymmetricShift:
    case Schedule::kAuto:
      break;
  }
  return false;
}

// Hypothesis M.
bool mask_holds(const TiledProblem& p) {
  const int n = p.num_kv_tiles();
  const int m = p.num_q_tiles();
  const auto empty = [&](int k) { return p.q_begin(k) >= p.q_end(k); };
  int k0 = 0;
  while (k0 < n && empty(k0)) ++k0;
  int k1 = k0;
  while (k1 < n && !empty(k1)) ++k1;
  for (int k = k1; k < n; ++k) {
    if (!empty(k)) return false;  // the tiles that see something are not one range
  }
  for (int k = k0; k < k1; ++k) {
    if (p.q_begin(k) < 0 || p.q_end(k) > m) return false;
    if (k > k0 && (p.q_begin(k) < p.q_begin(k - 1) || p.q_end(k) < p.q_end(k - 1))) return false;
  }
  int a = k0;  // first k in [k0, k1) with E(k) > v
  int b = k0;  // first k in [k0, k1) with B(k) > v
  for (int v = 0; v < m; ++v) {
    while (a < k1 && p.q_end(a) <= v) ++a;
    while (b < k1 && p.q_begin(b) <= v) ++b;
    const bool seen = a < b;
    const bool listed = p.kv_begin(v) < p.kv_end(v);
    if (seen != listed || (seen && (p.kv_begin(v) != a || p.kv_end(v) != b))) return false;
  }
  return true;
}

// Hypotheses J and F for unit `unit`.
bool unit_has_the_structure(const SchedulePlan& plan, const Form& form, int unit) {
  const TiledProblem& p = plan.problem;
  const int n = p.num_kv_tiles();
  const int a = unit % n;
  const int kv = form.reversed_tiles ? n - 1 - a : a;
  const Job job = make_job(plan, unit, 0);
  const int begin = p.q_begin(kv);
  const int end = p.q_end(kv);
  if (!job.valid || job.is_short || job.head != unit / n || job.kv_tile != kv || job.q_begin != begin ||
      job.q_end != end || job.num_steps != (end > begin ? end - begin : 0)) {
    return false;
  }
  if (job.num_steps == 0) return true;
  const int last = job.num_steps - 1;
  if (q_tile_at(plan, job, 0) != (form.descending ? end - 1 : begin) ||
      q_tile_at(plan, job, last) != (form.descending ? begin : end - 1)) {
    return false;
  }
  if (!sums_in_order(plan)) return true;
  for (const int v : {begin, end - 1}) {
    const int expected = form.ranked_from_end ? p.kv_end(v) - 1 - kv : kv - p.kv_begin(v);
    if (rank_of(plan, job, v) != expected) return false;
  }
  return true;
}

}  // namespace

StructuralProof prove_kv_order_by_structure(const SchedulePlan& plan) {
  StructuralProof result;
  Form form{};
  if (!form_of(plan, &form) || plan.dispatch != Dispatch::kDynamic || plan.jobs_per_unit != 1) return result;
  const TiledProblem& p = plan.problem;
  const int heads = p.num_heads();
  const int n = p.num_kv_tiles();
  if (heads < 1 || n < 1 || p.num_q_tiles() < 1 || plan.num_units != 1LL * heads * n) return result;
  if (!mask_holds(p)) return result;
  for (int unit = 0; unit < plan.num_units; ++unit) {
    if (!unit_has_the_structure(plan, form, unit)) return result;
  }
  result.head_classes = 1;  // the jobs of every head are equal but for the head, as the loop checked
  result.proven = true;
  return result;
}

}  // namespace dash
