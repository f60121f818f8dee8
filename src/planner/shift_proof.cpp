// prove_shift_by_structure: the hypotheses of shift_proof.hpp, cheapest first: the plan's fields, the mask
// (O(n + m)), then the jobs of one head per class (O(U) calls of make_job each, at most S classes). The waves are
// derived here from the definition of static dispatch (unit u runs in wave u / S), not from wave_slot, so that
// make_job's wave bookkeeping is checked rather than reused.
#include "planner/shift_proof.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "schedule/schedule.hpp"

namespace dash {

int first_wave_start(int head, int units_per_head, int num_ctas) {
  const int into_wave = static_cast<int>(1LL * head * units_per_head % num_ctas);
  return std::min(units_per_head, into_wave == 0 ? num_ctas : num_ctas - into_wave);
}

namespace {

// Hypothesis M: b(k) = b(0) + g k with 0 <= b(k) < m, g = b(0) = 0 for the full mask (shift) and g >= 1
// otherwise (symmetric shift), every band ending at m, and tile v seen by exactly the key/value tiles [0, C(v)).
bool mask_holds(const TiledProblem& p, bool full_mask) {
  const int n = p.num_kv_tiles();
  const int m = p.num_q_tiles();
  if (n < 1 || m < 1) return false;
  const long long first = p.q_begin(0);
  // One key/value tile has no slope to speak of: any g >= 1 fits it.
  const long long slope = n > 1 ? p.q_begin(1) - first : (full_mask ? 0 : 1);
  if (full_mask ? (first != 0 || slope != 0) : (first < 0 || slope < 1)) return false;
  for (int kv = 0; kv < n; ++kv) {
    if (p.q_begin(kv) != first + slope * kv || p.q_end(kv) != m) return false;
  }
  if (p.q_begin(n - 1) >= m) return false;
  int seeing = 0;  // #{k : b(k) <= v}, b rising
  for (int v = 0; v < m; ++v) {
    while (seeing < n && p.q_begin(seeing) <= v) ++seeing;
    if (p.kv_begin(v) != 0 || p.kv_end(v) != seeing) return false;
  }
  return true;
}

// Hypotheses J and W for the units of `head`: every job is the one the theorems assume, every wave narrow enough.
bool head_has_the_structure(const SchedulePlan& plan, int head, int units_per_head) {
  const TiledProblem& p = plan.problem;
  const int n = p.num_kv_tiles();
  const int m = p.num_q_tiles();
  const bool symmetric = plan.kind == Schedule::kSymmetricShift;
  const int first_unit = head * units_per_head;
  for (int earlier = 0, size = 0; earlier < units_per_head; earlier += size) {
    const long long wave_end = (1LL * (first_unit + earlier) / plan.num_ctas + 1) * plan.num_ctas;
    size = static_cast<int>(std::min<long long>(first_unit + units_per_head, wave_end)) - (first_unit + earlier);
    // Symmetric shift rotates its long jobs through [rect_begin, m), shift through all m tiles.
    const int rect_begin = symmetric ? p.q_begin(earlier + size - 1) : 0;
    if (size > m - rect_begin) return false;
    const bool holds_middle = n % 2 == 1 && earlier + size == units_per_head;
    const int wave_shorts = size - (symmetric && holds_middle ? 1 : 0);
    // What every job of the wave carries, whichever its tile. Shift reads neither rect_begin nor wave_shorts.
    const auto in_this_wave = [&](const Job& job, int lane, int kv) {
      return job.valid && job.head == head && job.kv_tile == kv && job.lane == lane && job.wave_size == size &&
             job.earlier == earlier && job.q_begin == p.q_begin(kv) && job.q_end == m &&
             job.num_steps == m - job.q_begin &&
             (!symmetric || (job.rect_begin == rect_begin && job.wave_shorts == wave_shorts));
    };
    for (int lane = 0; lane < size; ++lane) {
      const int unit = first_unit + earlier + lane;
      const int kv = earlier + lane;
      const Job job = make_job(plan, unit, 0);
      if (!in_this_wave(job, lane, kv) || job.is_short) return false;
      if (!symmetric) continue;
      const int mirrored = n - 1 - kv;
      const Job short_job = make_job(plan, unit, 1);
      // The middle tile of an odd n is the long job of the head's last unit, which has no short job.
      if (mirrored == kv ? short_job.valid : !in_this_wave(short_job, lane, mirrored) || !short_job.is_short) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

StructuralProof prove_shift_by_structure(const SchedulePlan& plan) {
  StructuralProof result;
  const TiledProblem& p = plan.problem;
  const bool shift = plan.kind == Schedule::kShift;
  const bool symmetric = plan.kind == Schedule::kSymmetricShift;
  if ((!shift && !symmetric) || plan.dispatch != Dispatch::kStatic || plan.jobs_per_unit != (symmetric ? 2 : 1)) {
    return result;
  }
  const int heads = p.num_heads();
  const int n = p.num_kv_tiles();
  const int units_per_head = symmetric ? (n + 1) / 2 : n;
  if (heads < 1 || units_per_head < 1 || plan.num_units != 1LL * heads * units_per_head) return result;
  // Under a sliding window symmetric shift runs another construction (BandSymmetricShift), which the theorems
  // do not describe even where the window leaves the tile-level mask causal: such plans are enumerated.
  if (p.windowed() || !mask_holds(p, shift)) return result;
  // Heads `period` apart begin at the same point of a wave; among the first `period`, one head per distinct
  // first_wave_start stands for all heads with that start (shift_proof.hpp says why).
  const int period = plan.num_ctas / std::gcd(units_per_head, plan.num_ctas);
  std::vector<bool> checked(static_cast<size_t>(units_per_head) + 1, false);  // by first_wave_start, in [1, U]
  for (int head = 0; head < std::min(heads, period); ++head) {
    const int start = first_wave_start(head, units_per_head, plan.num_ctas);
    if (checked[start]) continue;
    checked[start] = true;
    ++result.head_classes;
    if (!head_has_the_structure(plan, head, units_per_head)) return result;
  }
  result.proven = true;
  return result;
}

}  // namespace dash
