#include "planner/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <queue>
#include <tuple>

#include "schedule/schedule.hpp"

namespace dash {
namespace {

enum class EventKind : int { kComputed = 0, kReduced = 1, kFree = 2 };

// A uniform draw on [-sqrt 3, sqrt 3] (mean 0, variance 1) from (seed, index): splitmix64's finalizer,
// so that every step gets an independent-looking value without any state between draws.
double unit_variance_draw(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  constexpr double kTwoPow53 = 9007199254740992.0;
  const double uniform01 = static_cast<double>(z >> 11) / kTwoPow53;
  return (2.0 * uniform01 - 1.0) * std::sqrt(3.0);
}

struct Event {
  double time;
  EventKind kind;
  int cta;
  bool operator>(const Event& o) const { return std::tie(time, kind, cta) > std::tie(o.time, o.kind, o.cta); }
};

struct Waiter {
  int rank;
  int cta;
  double ready;
};

class Simulation {
 public:
  Simulation(const ExpandedSchedule& s, const CostModel& costs, bool record) : s_(s), costs_(costs), record_(record) {
    const int ctas = s.plan.num_ctas;
    cta_.assign(static_cast<size_t>(ctas), CtaState{});
    result_.cta_jobs.assign(static_cast<size_t>(ctas), {});
    if (record_) result_.timeline.assign(static_cast<size_t>(ctas), {});
    counter_.assign(static_cast<size_t>(s.num_dq_tiles), 0);
    released_at_.assign(static_cast<size_t>(s.num_dq_tiles), 0.0);
    released_by_.assign(static_cast<size_t>(s.num_dq_tiles), -1);
    waiters_.assign(static_cast<size_t>(s.num_dq_tiles), {});
  }

  SimulationResult run() {
    for (int cta = 0; cta < s_.plan.num_ctas; ++cta) events_.push({0.0, EventKind::kFree, cta});
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      switch (e.kind) {
        case EventKind::kFree:
          fetch_unit(e.cta, e.time);
          break;
        case EventKind::kComputed:
          request_reduce(e.cta, e.time);
          break;
        case EventKind::kReduced:
          finish_reduce(e.cta, e.time);
          break;
      }
    }
    finish();
    return std::move(result_);
  }

 private:
  struct CtaState {
    int units_taken = 0;  // static dispatch: position in this CTA's unit list
    int job = -1;         // current job
    int job_end = -1;     // one past the last job of the current unit
    int step = -1;        // current global step index
  };

  void fetch_unit(int cta, double t) {
    CtaState& st = cta_[cta];
    int unit = -1;
    if (s_.plan.dispatch == Dispatch::kStatic) {
      if (st.units_taken < static_unit_count(s_.plan, cta)) unit = static_unit(s_.plan, cta, st.units_taken++);
    } else if (next_unit_ < s_.plan.num_units) {
      unit = next_unit_++;
    }
    if (unit < 0) return;
    st.job = s_.unit_first_job[unit];
    st.job_end = s_.unit_first_job[unit + 1];
    start_job(cta, t);
  }

  void start_job(int cta, double t) {
    CtaState& st = cta_[cta];
    while (st.job < st.job_end && s_.jobs[st.job].job.num_steps == 0) {
      result_.cta_jobs[cta].push_back(st.job++);
    }
    if (st.job == st.job_end) {
      events_.push({t, EventKind::kFree, cta});
      return;
    }
    result_.cta_jobs[cta].push_back(st.job);
    st.step = s_.jobs[st.job].first_step;
    start_compute(cta, t, costs_.job_overhead);
  }

  // The step's compute, after `overhead` (the job's fixed cost, on its first step).
  void start_compute(int cta, double t, double overhead = 0.0) {
    double compute = costs_.compute;
    if (costs_.jitter > 0.0) {
      compute *= 1.0 + costs_.jitter * unit_variance_draw(costs_.seed, static_cast<uint64_t>(cta_[cta].step));
    }
    extra_busy_ += overhead + (compute - costs_.compute);
    const double end = t + overhead + compute;
    record(cta, t, end, SegmentKind::kCompute);
    events_.push({end, EventKind::kComputed, cta});
  }

  void request_reduce(int cta, double t) {
    const Step& step = s_.steps[cta_[cta].step];
    if (step.rank == kUnordered) return start_reduce(cta, t, t);
    if (counter_[step.dq_tile] == step.rank) return start_reduce(cta, t, visible_at(step.dq_tile, cta, t));
    waiters_[step.dq_tile].push_back({step.rank, cta, t});
  }

  // When CTA `cta` can see the last release of `dq_tile`, if it arrived at time t.
  double visible_at(int dq_tile, int cta, double t) const {
    if (released_by_[dq_tile] < 0) return t;
    const double latency = released_by_[dq_tile] == cta ? 0.0 : costs_.signal_latency;
    return std::max(t, released_at_[dq_tile] + latency);
  }

  void start_reduce(int cta, double ready, double start) {
    if (start > ready) record(cta, ready, start, SegmentKind::kWait);
    record(cta, start, start + costs_.reduce, SegmentKind::kReduce);
    events_.push({start + costs_.reduce, EventKind::kReduced, cta});
  }

  void finish_reduce(int cta, double t) {
    CtaState& st = cta_[cta];
    const Step& step = s_.steps[st.step];
    result_.makespan = std::max(result_.makespan, t);
    if (step.rank != kUnordered) release(step.dq_tile, cta, t);
    ++st.step;
    if (st.step < s_.job_end_step(st.job)) return start_compute(cta, t);
    ++st.job;
    start_job(cta, t);
  }

  void release(int dq_tile, int cta, double t) {
    const int next_rank = ++counter_[dq_tile];
    released_at_[dq_tile] = t;
    released_by_[dq_tile] = cta;
    auto& waiting = waiters_[dq_tile];
    const auto it = std::find_if(waiting.begin(), waiting.end(), [&](const Waiter& w) { return w.rank == next_rank; });
    if (it == waiting.end()) return;
    const Waiter w = *it;
    waiting.erase(it);
    start_reduce(w.cta, w.ready, visible_at(dq_tile, w.cta, w.ready));
  }

  void record(int cta, double start, double end, SegmentKind kind) {
    if (record_) result_.timeline[cta].push_back({start, end, kind, cta_[cta].job});
  }

  void finish() {
    long long executed = 0;
    result_.completed = true;
    for (int cta = 0; cta < s_.plan.num_ctas; ++cta) {
      const CtaState& st = cta_[cta];
      const bool drained = st.job < 0 || (st.job == st.job_end && (s_.plan.dispatch == Dispatch::kDynamic ||
                                                                   st.units_taken == static_unit_count(s_.plan, cta)));
      if (!drained && result_.completed) {
        const Step& step = s_.steps[st.step];
        result_.completed = false;
        result_.stuck = "CTA " + std::to_string(cta) + " waits forever on dQ tile " + std::to_string(step.dq_tile) +
                        " for rank " + std::to_string(step.rank) + " (semaphore stays at " +
                        std::to_string(counter_[step.dq_tile]) + ")";
      }
    }
    if (result_.completed && s_.plan.dispatch == Dispatch::kDynamic && next_unit_ < s_.plan.num_units) {
      result_.completed = false;
      result_.stuck = "units were left undispatched";
    }
    for (const auto& jobs : result_.cta_jobs) {
      for (int j : jobs) executed += s_.jobs[j].job.num_steps;
    }
    result_.busy = static_cast<double>(executed) * (costs_.compute + costs_.reduce) + extra_busy_;
    const double capacity = result_.makespan * s_.plan.num_ctas;
    result_.bubble_fraction = capacity > 0 ? 1.0 - result_.busy / capacity : 0.0;
  }

  const ExpandedSchedule& s_;
  CostModel costs_;
  bool record_;
  SimulationResult result_;
  std::vector<CtaState> cta_;
  std::vector<int> counter_;
  std::vector<double> released_at_;
  std::vector<int> released_by_;
  std::vector<std::vector<Waiter>> waiters_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  int next_unit_ = 0;
  double extra_busy_ = 0.0;  // job overheads and the jitter's deviations from c
};

}  // namespace

SimulationResult simulate(const ExpandedSchedule& schedule, const CostModel& costs, bool record_timeline) {
  return Simulation(schedule, costs, record_timeline).run();
}

}  // namespace dash
