// Planner layer: the tiled problem of a shape (tile sizes, GQA group splits, the canonical sliding window), each
// schedule's plan with the precondition that fails, and the schedule that `auto` stands for (measurements below).
#include "planner/schedule_plan.hpp"

#include <algorithm>
#include <string>

#include "schedule/schedule.hpp"

namespace dash {

int choose_group_splits(int batch, int heads_kv, int group_size, int num_kv_tiles) {
  const long long jobs_per_split = 1LL * batch * heads_kv * num_kv_tiles;
  for (int splits = 1; splits < group_size; ++splits) {
    if (group_size % splits == 0 && jobs_per_split * splits >= kTargetJobs) return splits;
  }
  return group_size;
}

TiledProblem make_tiled_problem(const AttentionShape& shape, SlidingWindow window, int group_splits) {
  AttentionShape windowed = shape;
  windowed.window_left = window.left;
  windowed.window_right = window.right;
  return make_tiled_problem(windowed, group_splits);
}

TiledProblem make_tiled_problem(const AttentionShape& shape, int group_splits) {
  const TileShape tile = backward_tile_shape(static_cast<int>(shape.head_dim));
  TiledProblem p{};
  p.batch = static_cast<int>(shape.batch);
  p.heads_kv = static_cast<int>(shape.heads_kv);
  p.group_size = static_cast<int>(shape.heads_q / shape.heads_kv);
  p.seqlen_q = static_cast<int>(shape.seqlen_q);
  p.seqlen_k = static_cast<int>(shape.seqlen_k);
  p.block_q = tile.block_q;
  p.block_kv = tile.block_kv;
  const MaskShape mask = canonical_mask(p.seqlen_q, p.seqlen_k, shape.causal, shape.window_left, shape.window_right);
  p.causal = mask.causal;
  p.window = mask.window;
  p.group_splits =
      group_splits > 0 ? group_splits : choose_group_splits(p.batch, p.heads_kv, p.group_size, p.num_kv_tiles());
  return p;
}

std::string symmetric_shift_tile_refusal(const TiledProblem& problem) {
  if (problem.block_kv % problem.block_q == 0) return {};
  return "symmetric-shift needs block_kv to be a multiple of block_q, and the backward's tiles at this head dim are " +
         std::to_string(problem.block_q) + "x" + std::to_string(problem.block_kv) +
         " (block_q x block_kv): consecutive key/value tiles' causal ranges would not start a whole number of query "
         "tiles apart; use shortest-first or descending (auto picks one)";
}

namespace {

// Largest number of one head's units that run in the same wave of `num_ctas` units.
int max_wave_size(int num_heads, int units_per_head, int num_ctas) {
  int largest = 0;
  for (int head = 0; head < num_heads; ++head) {
    const int first = head * units_per_head;
    const int last = first + units_per_head - 1;
    for (int wave = first / num_ctas; wave <= last / num_ctas; ++wave) {
      largest = std::max(largest, wave_slot(std::max(first, wave * num_ctas), first, units_per_head, num_ctas).size);
      if (largest == std::min(units_per_head, num_ctas)) return largest;
    }
  }
  return largest;
}

std::string check_shift(const TiledProblem& p, int num_ctas) {
  // The advice names symmetric shift only where the tiles admit it (not at d = 192's 64x96 or d = 256's 64x80).
  const bool symmetric_fits = symmetric_shift_tile_refusal(p).empty();
  if (p.windowed()) {
    return symmetric_fits ? "shift needs the full mask (use symmetric-shift or shortest-first for a sliding window)"
                          : "shift needs the full mask (use shortest-first for a sliding window)";
  }
  if (p.causal) {
    return symmetric_fits ? "shift needs the full mask (use symmetric-shift for causal)"
                          : "shift needs the full mask (use shortest-first or descending for causal)";
  }
  const int wave = max_wave_size(p.num_heads(), p.num_kv_tiles(), num_ctas);
  if (p.num_q_tiles() < wave) {
    return "shift needs at least as many query tiles per head (" + std::to_string(p.num_q_tiles()) +
           ") as key/value tiles of one head running at once (" + std::to_string(wave) + ")";
  }
  return {};
}

// Under a causal window the bands start g query tiles apart; the folded short tiles never meet the
// ascending ones only when g is even (shift_schedules.hpp, BandSymmetricShift).
std::string check_band_symmetric_shift(const TiledProblem& p) {
  const int g = BandSymmetricShift::slope(p);
  if (g % 2 != 0) {
    return "symmetric-shift under a sliding window needs an even number of query tiles between consecutive "
           "key/value tiles' bands (here " +
           std::to_string(g) +
           ": block_kv / block_q times the query heads "
           "per job), or its folded short tiles meet the others; shortest-first does not stall on this band";
  }
  return {};
}

std::string check_symmetric_shift(const SchedulePlan& plan) {
  const TiledProblem& p = plan.problem;
  if (!p.causal) {
    return p.windowed() ? "symmetric-shift needs the window's right bound at 0 (causal): a window reaching past "
                          "the diagonal gives the first key/value tiles the same first query tile"
                        : "symmetric-shift needs the causal mask (use shift for the full mask)";
  }
  if (std::string refusal = symmetric_shift_tile_refusal(p); !refusal.empty()) return refusal;
  if (p.seqlen_q < p.seqlen_k) {
    return "symmetric-shift needs seqlen_q >= seqlen_k (here " + std::to_string(p.seqlen_q) + " < " +
           std::to_string(p.seqlen_k) +
           "), so that each key/value tile's causal range starts a fixed "
           "number of query tiles after the previous one's";
  }
  if (p.windowed()) return check_band_symmetric_shift(p);
  // Every long job's rectangle must be at least as tall as its wave, or two lanes would meet on one
  // query tile at the same step. Units of a wave share the check, so test each head's first unit per wave.
  const int pairs = SymmetricShiftSchedule::units_per_head(p);
  for (int unit = 0; unit < plan.num_units; ++unit) {
    const Job job = SymmetricShiftSchedule::make_job(plan, unit, 0);
    if (job.lane != 0) continue;
    const int rect_steps = p.num_q_tiles() - job.rect_begin;
    if (rect_steps < job.wave_size) {
      return "symmetric-shift needs the query tiles all long key/value tiles of a wave see (" +
             std::to_string(rect_steps) + ") to be at least the wave's size (" + std::to_string(job.wave_size) +
             " units of head " + std::to_string(unit / pairs) + ")";
    }
  }
  return {};
}

}  // namespace

// Both switches below name every Schedule and have no default (-Werror=switch): a new schedule must state its
// dispatch, its jobs per unit and its preconditions here rather than silently plan as a dynamic one.
PlanResult make_schedule_plan(const TiledProblem& problem, Schedule schedule, int num_sms) {
  PlanResult result;
  SchedulePlan& plan = result.plan;
  plan.kind = schedule;
  plan.problem = problem;
  plan.dispatch = Dispatch::kDynamic;
  plan.jobs_per_unit = 1;
  int units_per_head = problem.num_kv_tiles();
  switch (schedule) {
    case Schedule::kAscending:
    case Schedule::kDescending:
    case Schedule::kShortestFirst:
    case Schedule::kNondeterministic:
    case Schedule::kAuto:
      break;  // one job per unit from a global counter (kAuto is refused below)
    case Schedule::kShift:
      plan.dispatch = Dispatch::kStatic;
      break;
    case Schedule::kSymmetricShift:
      plan.dispatch = Dispatch::kStatic;
      plan.jobs_per_unit = 2;  // a long and a short key/value tile
      units_per_head = SymmetricShiftSchedule::units_per_head(problem);
      break;
  }
  plan.num_units = problem.num_heads() * units_per_head;
  plan.num_ctas = std::max(1, std::min(plan.num_units, num_sms));
  switch (schedule) {
    case Schedule::kAscending:
    case Schedule::kDescending:
    case Schedule::kShortestFirst:
    case Schedule::kNondeterministic:
      return result;  // dynamic dispatch holds for any problem
    case Schedule::kShift:
      result.rejected = check_shift(problem, plan.num_ctas);
      return result;
    case Schedule::kSymmetricShift:
      result.rejected = check_symmetric_shift(plan);
      return result;
    case Schedule::kAuto:
      result.rejected = "auto is not a schedule; resolve it with choose_schedule()";
      return result;
  }
  // A value cast from outside the enum (the API refuses it before planning; a plan of it would get no jobs).
  result.rejected = "Schedule(" + std::to_string(static_cast<int>(schedule)) + ") is not a schedule";
  return result;
}

// From measurements of these kernels on an H200 (docs/HISTORY.md, commit e1dd9f0: the paper's
// grid and the LLaMA3-8B / Qwen2.5-7B GQA rows, python/benchmarks/compare.py):
//  - causal, query-head groups folded into the jobs (GQA): descending, 8-48% faster than shortest-first
//    and symmetric shift on every GQA row;
//  - causal, one query head per job: shortest-first, the fastest or within 1.1% of it at every point
//    (symmetric shift ran 1-7% slower: its static assignment gives up the dynamic load balancing that
//    the DAG model does not price);
//  - full mask: shift up to 64 key/value tiles per head, 1-6% faster than the next schedule there;
//    beyond, ascending (shift fell 2-5% behind at seqlen 16384).
inline constexpr int kShiftMaxKvTiles = 64;

AutoChoice choose_auto(const TiledProblem& problem, int num_sms) {
  if (problem.windowed()) {
    return {Schedule::kShortestFirst,
            "sliding window: shortest-first, which the DAG model finds free of stalls wherever each key/value "
            "tile's band starts after the previous one's (the kernels build no windowed symmetric shift, and no "
            "schedule has been measured against it under a window)"};
  }
  if (problem.causal) {
    if (problem.heads_per_job() > 1) {
      return {Schedule::kDescending, "causal with query-head groups folded into each job: descending measured fastest"};
    }
    return {Schedule::kShortestFirst, "causal: shortest-first measured fastest, or within 1% of the fastest"};
  }
  if (problem.num_kv_tiles() <= kShiftMaxKvTiles) {
    if (make_schedule_plan(problem, Schedule::kShift, num_sms).ok()) {
      return {Schedule::kShift, "full mask, at most 64 key/value tiles per head: shift measured fastest"};
    }
    return {Schedule::kAscending, "full mask: shift measured fastest but its preconditions fail here; ascending"};
  }
  return {Schedule::kAscending, "full mask, more than 64 key/value tiles per head: ascending measured fastest"};
}

PlanResult plan_schedule(const TiledProblem& problem, Schedule schedule, int num_sms) {
  return make_schedule_plan(problem, schedule == Schedule::kAuto ? choose_schedule(problem, num_sms) : schedule,
                            num_sms);
}

}  // namespace dash
