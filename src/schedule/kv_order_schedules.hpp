// Schedules that give every key/value tile its own work unit and dispatch units dynamically:
// ascending, descending, shortest-first and nondeterministic.
//
// Their summation orders depend only on key/value tile indices, never on the number of CTAs, so their
// results are bitwise identical on GPUs with different SM counts. Every contribution waits only on
// contributions of units dispatched earlier, so no timing can deadlock them.
#pragma once

#include "schedule/plan.hpp"

namespace dash {

// FlashAttention-3's deterministic baseline: query tiles ascending, dQ summed in ascending key/value
// order (ranks count from the first tile that sees the query tile, 0 unless a window bounds the left).
// All key/value tiles of a head start on the same query tile, so tile k first waits for k reductions: a
// start-up staircase of (n - 1) r. Under a sliding window it is worse: each band starts after the one
// below, so a tile reaches every query tile before the lower tile it must wait for, and the waits chain
// through the whole head (about twice the work bound in the DAG model).
struct AscendingSchedule {
  DASH_HOST_DEVICE static Job make_job(const SchedulePlan& plan, int unit) {
    const int n = plan.problem.num_kv_tiles();
    return make_plain_job(plan.problem, unit / n, unit % n);
  }
  DASH_HOST_DEVICE static int q_tile_at(const Job& job, int step) { return job.q_begin + step; }
  DASH_HOST_DEVICE static int rank_of(const SchedulePlan& plan, const Job& job, int v) {
    return job.kv_tile - plan.problem.kv_begin(v);
  }
};

// Query tiles descending, dQ summed in ascending key/value order. Under the causal mask every tile
// starts on the last query row and short tiles finish first, freeing SMs for the next head early. Under
// a sliding window only the tiles whose bands reach the last query tile start together (the staircase is
// theirs alone); bands ending earlier reach each query tile in summation order.
struct DescendingSchedule {
  DASH_HOST_DEVICE static Job make_job(const SchedulePlan& plan, int unit) {
    return AscendingSchedule::make_job(plan, unit);
  }
  DASH_HOST_DEVICE static int q_tile_at(const Job& job, int step) { return job.q_end - 1 - step; }
  DASH_HOST_DEVICE static int rank_of(const SchedulePlan& plan, const Job& job, int v) {
    return AscendingSchedule::rank_of(plan, job, v);
  }
};

// What FlashAttention-3 ships for causal: the shortest key/value tiles (nearest the diagonal) are
// dispatched first, query tiles ascending, dQ summed in descending key/value order, which is the
// order in which the tiles reach each query tile. Wherever each tile's band starts after the one above's
// (causal, with or without a left window, seqlen_q >= seqlen_k) it never stalls: tile k reaches a query
// tile at least one step after tile k + 1, which was dispatched no later (docs/DESIGN.md, "Banded masks").
// A window reaching past the diagonal gives the first tiles one first query tile: a staircase among them.
struct ShortestFirstSchedule {
  DASH_HOST_DEVICE static Job make_job(const SchedulePlan& plan, int unit) {
    const int n = plan.problem.num_kv_tiles();
    return make_plain_job(plan.problem, unit / n, n - 1 - unit % n);
  }
  DASH_HOST_DEVICE static int q_tile_at(const Job& job, int step) { return job.q_begin + step; }
  DASH_HOST_DEVICE static int rank_of(const SchedulePlan& plan, const Job& job, int v) {
    return plan.problem.kv_end(v) - 1 - job.kv_tile;
  }
};

// dQ added without order (rank kUnordered), visiting like the dynamic schedule auto runs for the shape:
// under the causal mask, descending with folded GQA heads and shortest-first otherwise; ascending under
// the full mask; shortest-first under a sliding window. Measured (H200, docs/HISTORY.md):
// descending made it 1.01-1.23x faster on the GQA rows than its former ascending visits, and deterministic
// shortest-first ran 1.03-1.08x faster than nondeterministic ascending at hd64 causal 512-1024 and hd128
// causal 1024-2048 in the same runs.
struct NondeterministicSchedule {
  DASH_HOST_DEVICE static Job make_job(const SchedulePlan& plan, int unit) {
    const TiledProblem& p = plan.problem;
    const bool shortest_first = p.windowed() || (p.causal && p.heads_per_job() == 1);
    return shortest_first ? ShortestFirstSchedule::make_job(plan, unit) : AscendingSchedule::make_job(plan, unit);
  }
  DASH_HOST_DEVICE static int q_tile_at(const SchedulePlan& plan, const Job& job, int step) {
    const TiledProblem& p = plan.problem;
    const bool descending = !p.windowed() && p.causal && p.heads_per_job() > 1;
    return descending ? DescendingSchedule::q_tile_at(job, step) : AscendingSchedule::q_tile_at(job, step);
  }
};

}  // namespace dash
