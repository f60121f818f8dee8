// Each check below mirrors the one of the same name in validator.cpp (and the simulator's stall report),
// visiting jobs and steps in the expansion's order so that the first finding is the same one. The checks are
// templates over where the schedule functions come from: schedule.hpp's (inlined), or a test's.
#include "planner/streamed_validator.hpp"

#include <string>
#include <vector>

#include "schedule/schedule.hpp"

namespace dash {
namespace {

// The functions the kernels run.
struct KernelFunctions {
  static Job job(const SchedulePlan& plan, int unit, int sub) { return make_job(plan, unit, sub); }
  static int q_tile(const SchedulePlan& plan, const Job& job, int step) { return q_tile_at(plan, job, step); }
  static int rank(const SchedulePlan& plan, const Job& job, int v) { return rank_of(plan, job, v); }
};

// Calls on_job(unit, job_index, job) for every valid job in unit order; job_index counts valid jobs, as the
// expansion's job list does. Stops when on_job returns false; returns whether it went through all jobs.
template <typename Functions, typename OnJob>
bool for_each_job(const SchedulePlan& plan, const Functions& f, OnJob&& on_job) {
  int job_index = 0;
  for (int unit = 0; unit < plan.num_units; ++unit) {
    for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
      const Job job = f.job(plan, unit, sub);
      if (!job.valid) continue;
      if (!on_job(unit, job_index++, job)) return false;
    }
  }
  return true;
}

// Calls on_visit(unit, job_index, job, q_tile) for every visit in the expansion's order, with the same
// early stop.
template <typename Functions, typename OnVisit>
bool for_each_visit(const SchedulePlan& plan, const Functions& f, OnVisit&& on_visit) {
  return for_each_job(plan, f, [&](int unit, int job_index, const Job& job) {
    for (int step = 0; step < job.num_steps; ++step) {
      if (!on_visit(unit, job_index, job, f.q_tile(plan, job, step))) return false;
    }
    return true;
  });
}

int num_dq_tiles(const TiledProblem& p) { return p.batch * p.heads_q() * p.real_q_tiles(); }

std::string job_name(const Job& job) {
  return "job (head " + std::to_string(job.head) + ", kv tile " + std::to_string(job.kv_tile) + ")";
}

template <typename Functions>
std::string check_coverage(const SchedulePlan& plan, const Functions& f) {
  const TiledProblem& p = plan.problem;
  const int n = p.num_kv_tiles();
  const int m = p.num_q_tiles();
  std::vector<bool> job_seen(static_cast<size_t>(p.num_heads()) * n, false);
  std::vector<int> visit_stamp(static_cast<size_t>(m), -1);
  std::string finding;
  for_each_job(plan, f, [&](int /*unit*/, int job_index, const Job& job) {
    if (job.head < 0 || job.head >= p.num_heads() || job.kv_tile < 0 || job.kv_tile >= n) {
      finding = job_name(job) + " is out of range";
      return false;
    }
    const size_t seen = static_cast<size_t>(job.head) * n + job.kv_tile;
    if (job_seen[seen]) {
      finding = job_name(job) + " is scheduled twice";
      return false;
    }
    job_seen[seen] = true;
    if (job.q_begin != p.q_begin(job.kv_tile) || job.q_end != p.q_end(job.kv_tile) ||
        job.num_steps != job.q_end - job.q_begin) {
      finding = job_name(job) + " does not cover the query tiles its mask sees";
      return false;
    }
    for (int step = 0; step < job.num_steps; ++step) {
      const int v = f.q_tile(plan, job, step);
      if (v < job.q_begin || v >= job.q_end) {
        finding = job_name(job) + " visits query tile " + std::to_string(v) + " outside its range";
        return false;
      }
      if (visit_stamp[v] == job_index) {
        finding = job_name(job) + " visits query tile " + std::to_string(v) + " twice";
        return false;
      }
      visit_stamp[v] = job_index;
    }
    return true;
  });
  if (!finding.empty()) return finding;
  for (size_t i = 0; i < job_seen.size(); ++i) {
    if (!job_seen[i]) {
      return "job (head " + std::to_string(i / n) + ", kv tile " + std::to_string(i % n) + ") is never scheduled";
    }
  }
  return {};
}

// Runs after check_coverage passed, so every job's head is in range.
template <typename Functions>
std::string check_ranks(const SchedulePlan& plan, const Functions& f) {
  const TiledProblem& p = plan.problem;
  const int tiles = num_dq_tiles(p);
  std::vector<int> contributions(static_cast<size_t>(tiles), 0);
  for (int head = 0; head < p.num_heads(); ++head) {
    for (int v = 0; v < p.num_q_tiles(); ++v) contributions[p.dq_tile_index(head, v)] = p.num_contributors(v);
  }
  // Rank r of tile t is bit first_bit[t] + r.
  std::vector<long long> first_bit(static_cast<size_t>(tiles) + 1, 0);
  for (int t = 0; t < tiles; ++t) first_bit[t + 1] = first_bit[t] + contributions[t];
  std::vector<bool> taken(static_cast<size_t>(first_bit[tiles]), false);
  std::string finding;
  for_each_visit(plan, f, [&](int /*unit*/, int /*job_index*/, const Job& job, int v) {
    const int tile = p.dq_tile_index(job.head, v);
    const int rank = f.rank(plan, job, v);
    const std::string name = "dQ tile " + std::to_string(tile);
    if (rank < 0 || rank >= contributions[tile]) {
      finding =
          name + " gets rank " + std::to_string(rank) + " outside [0, " + std::to_string(contributions[tile]) + ")";
      return false;
    }
    const size_t bit = static_cast<size_t>(first_bit[tile] + rank);
    if (taken[bit]) {
      finding = name + " gets rank " + std::to_string(rank) + " twice";
      return false;
    }
    taken[bit] = true;
    return true;
  });
  if (!finding.empty()) return finding;
  for (int t = 0; t < tiles; ++t) {
    for (int r = 0; r < contributions[t]; ++r) {
      if (!taken[static_cast<size_t>(first_bit[t] + r)]) {
        return "dQ tile " + std::to_string(t) + " never gets rank " + std::to_string(r);
      }
    }
  }
  return {};
}

// The unit of the visit that gives dQ tile `tile` rank `rank` (the ranks are a permutation: there is one).
template <typename Functions>
int unit_holding(const SchedulePlan& plan, const Functions& f, int tile, int rank) {
  int holder = -1;
  for_each_visit(plan, f, [&](int unit, int /*job_index*/, const Job& job, int v) {
    if (plan.problem.dq_tile_index(job.head, v) != tile || f.rank(plan, job, v) != rank) return true;
    holder = unit;
    return false;
  });
  return holder;
}

// Dynamic dispatch: every wait must point to an earlier unit, or to an earlier step of the same job. Runs after
// check_ranks passed. Walking visits in the expansion's order, a visit's predecessor (rank - 1 of its tile)
// comes earlier exactly when the tile has seen `rank` visits so far: until the first finding, each visit to a
// tile holds the rank equal to the number of visits before it, so those are ranks 0 .. seen - 1.
template <typename Functions>
std::string check_waits_point_backward(const SchedulePlan& plan, const Functions& f) {
  const TiledProblem& p = plan.problem;
  const size_t tiles = static_cast<size_t>(num_dq_tiles(p));
  std::vector<int> seen(tiles, 0);
  std::vector<int> last_unit(tiles, -1);
  std::vector<int> last_job(tiles, -1);
  std::string finding;
  for_each_visit(plan, f, [&](int unit, int job_index, const Job& job, int v) {
    const int tile = p.dq_tile_index(job.head, v);
    const int rank = f.rank(plan, job, v);
    if (rank > 0) {
      const bool predecessor_earlier = seen[tile] == rank;
      // An earlier visit of the same unit belongs to an earlier step of this job or to another job of the unit.
      if (!predecessor_earlier || (last_unit[tile] == unit && last_job[tile] != job_index)) {
        const int waited_on = predecessor_earlier ? last_unit[tile] : unit_holding(plan, f, tile, rank - 1);
        finding = "unit " + std::to_string(unit) + " waits on unit " + std::to_string(waited_on) + " (dQ tile " +
                  std::to_string(tile) + ", rank " + std::to_string(rank) + "), which dynamic dispatch may start later";
        return false;
      }
    }
    ++seen[tile];
    last_unit[tile] = unit;
    last_job[tile] = job_index;
    return true;
  });
  return finding;
}

// Static dispatch: the CTAs run their unit lists, each reduce waiting until its tile's semaphore holds its rank,
// with no notion of time: a CTA runs until it must wait, a release wakes the CTA waiting for the new count.
// Every maximal execution runs the same steps (validator.hpp), so where this one stops the simulator stops too.
template <typename Functions>
class TokenGame {
 public:
  TokenGame(const SchedulePlan& plan, const Functions& functions)
      : plan_(plan),
        functions_(functions),
        ctas_(static_cast<size_t>(plan.num_ctas)),
        semaphore_(static_cast<size_t>(num_dq_tiles(plan.problem)), 0),
        first_waiter_(semaphore_.size(), -1) {}

  // Empty when every CTA finishes; else the simulator's report of the first CTA left waiting.
  std::string run() {
    for (int cta = 0; cta < plan_.num_ctas; ++cta) {
      if (next_visit(cta)) ready_.push_back(cta);
    }
    while (!ready_.empty()) {
      const int cta = ready_.back();
      ready_.pop_back();
      Cta& c = ctas_[cta];
      do {
        if (c.rank != kUnordered) {
          if (semaphore_[c.tile] != c.rank) {
            c.next_waiter = first_waiter_[c.tile];
            first_waiter_[c.tile] = cta;
            break;
          }
          release(c.tile);
        }
      } while (next_visit(cta));
    }
    for (int cta = 0; cta < plan_.num_ctas; ++cta) {
      const Cta& c = ctas_[cta];
      if (c.done) continue;
      return "CTA " + std::to_string(cta) + " waits forever on dQ tile " + std::to_string(c.tile) + " for rank " +
             std::to_string(c.rank) + " (semaphore stays at " + std::to_string(semaphore_[c.tile]) + ")";
    }
    return {};
  }

 private:
  // The visit a CTA is about to reduce, and where it is in its unit list.
  struct Cta {
    int units_begun = 0;
    int unit = -1;
    int next_sub = 0;  // next job of `unit` to fetch
    Job job{};         // current job; num_steps 0 for an invalid one
    int step = -1;
    int tile = -1;
    int rank = 0;
    int next_waiter = -1;  // next CTA waiting on the same dQ tile
    bool done = false;
  };

  // Moves `cta` to its next visit, fetching jobs and units as needed; false (and done) when none is left.
  bool next_visit(int cta) {
    Cta& c = ctas_[cta];
    ++c.step;
    while (c.step >= c.job.num_steps) {
      if (c.unit >= 0 && c.next_sub < plan_.jobs_per_unit) {
        c.job = functions_.job(plan_, c.unit, c.next_sub++);
        if (!c.job.valid) c.job.num_steps = 0;
        c.step = 0;
      } else if (c.units_begun < static_unit_count(plan_, cta)) {
        c.unit = static_unit(plan_, cta, c.units_begun++);
        c.next_sub = 0;
      } else {
        c.done = true;
        return false;
      }
    }
    const int v = functions_.q_tile(plan_, c.job, c.step);
    c.tile = plan_.problem.dq_tile_index(c.job.head, v);
    c.rank = functions_.rank(plan_, c.job, v);
    return true;
  }

  void release(int tile) {
    const int next = ++semaphore_[tile];
    for (int* link = &first_waiter_[tile]; *link >= 0; link = &ctas_[*link].next_waiter) {
      if (ctas_[*link].rank != next) continue;
      ready_.push_back(*link);
      *link = ctas_[*link].next_waiter;
      return;
    }
  }

  const SchedulePlan& plan_;
  const Functions& functions_;
  std::vector<Cta> ctas_;
  std::vector<int> semaphore_;
  std::vector<int> first_waiter_;  // per dQ tile: a CTA waiting on it, or -1
  std::vector<int> ready_;
};

template <typename Functions>
std::string summary_with(const SchedulePlan& plan, const Functions& f) {
  if (const std::string finding = check_coverage(plan, f); !finding.empty()) return "coverage: " + finding;
  // The nondeterministic schedule adds without order: nothing waits, so nothing more can fail.
  if (!sums_in_order(plan)) return "valid";
  if (const std::string finding = check_ranks(plan, f); !finding.empty()) return "ranks: " + finding;
  const std::string finding =
      plan.dispatch == Dispatch::kDynamic ? check_waits_point_backward(plan, f) : TokenGame<Functions>(plan, f).run();
  return finding.empty() ? "valid" : "deadlock: " + finding;
}

}  // namespace

std::string streamed_validation_summary(const SchedulePlan& plan) { return summary_with(plan, KernelFunctions{}); }

std::string streamed_validation_summary(const SchedulePlan& plan, const ScheduleFunctions& functions) {
  return summary_with(plan, functions);
}

}  // namespace dash
