// prove_plan: every schedule by its structure (shift_proof.hpp, kv_order_proof.hpp) where the hypotheses hold; otherwise
// head classes, then the fast conditions on one representative head per class, in chunks on several threads.
// The conditions and why they imply the validator's verdict are in validator.hpp ("Proving a plan without
// expanding it").
#include "planner/plan_proof.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "planner/kv_order_proof.hpp"
#include "planner/shift_proof.hpp"
#include "planner/streamed_validator.hpp"
#include "schedule/schedule.hpp"

namespace dash {
namespace {

// Per-chunk tile records alive at once, at most (a group of classes is checked together within this).
constexpr size_t kMaxTraceBytes = size_t{256} << 20;

// --- head classes ------------------------------------------------------------------------------------------

// Every field of a Job but its head. The structured binding stops compiling when Job gains a field, which
// must then be added here (and so join the comparison and the hash of heads).
auto fields_but_head(const Job& job) {
  const auto& [head, kv_tile, q_begin, q_end, num_steps, lane, wave_size, earlier, wave_shorts, rect_begin, fold_begin,
               is_short, valid] = job;
  static_cast<void>(head);
  return std::tuple(kv_tile, q_begin, q_end, num_steps, lane, wave_size, earlier, wave_shorts, rect_begin, fold_begin,
                    is_short, valid);
}

// Invalid jobs are all alike: the validator skips them.
bool equal_but_head(const Job& a, const Job& b) {
  if (a.valid != b.valid) return false;
  return !a.valid || fields_but_head(a) == fields_but_head(b);
}

uint64_t mix(uint64_t hash, long long value) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
  return hash ^ (static_cast<uint64_t>(value) + kGolden + (hash << 6) + (hash >> 2));
}

uint64_t hash_but_head(uint64_t hash, const Job& job) {
  if (!job.valid) return mix(hash, -1);
  std::apply([&](auto... field) { ((hash = mix(hash, static_cast<long long>(field))), ...); }, fields_but_head(job));
  return hash;
}

// Head h runs units [h U, (h + 1) U) of the plan, U = units_per_head.
struct HeadClass {
  int representative;  // the first head of the class
  int wave_start;      // see wave_start_of
};

// Where the head's first wave ends (first_wave_start); dynamic dispatch has no waves: 0.
int wave_start_of(const SchedulePlan& plan, int head, int units_per_head) {
  return plan.dispatch == Dispatch::kStatic ? first_wave_start(head, units_per_head, plan.num_ctas) : 0;
}

bool same_jobs_but_head(const SchedulePlan& plan, int head_a, int head_b, int units_per_head) {
  for (int a = 0; a < units_per_head; ++a) {
    for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
      if (!equal_but_head(make_job(plan, head_a * units_per_head + a, sub),
                          make_job(plan, head_b * units_per_head + a, sub))) {
        return false;
      }
    }
  }
  return true;
}

// Groups the heads by (wave start, jobs but head). nullopt when the units do not divide into heads that way:
// some valid job of head h's units names another head.
std::optional<std::vector<HeadClass>> head_classes(const SchedulePlan& plan, int units_per_head) {
  std::vector<HeadClass> classes;
  std::unordered_multimap<uint64_t, size_t> by_hash;
  for (int head = 0; head < plan.problem.num_heads(); ++head) {
    const int wave_start = wave_start_of(plan, head, units_per_head);
    uint64_t hash = mix(0, wave_start);
    for (int a = 0; a < units_per_head; ++a) {
      for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
        const Job job = make_job(plan, head * units_per_head + a, sub);
        if (job.valid && job.head != head) return std::nullopt;
        hash = hash_but_head(hash, job);
      }
    }
    const auto [first, last] = by_hash.equal_range(hash);
    const bool known = std::any_of(first, last, [&](const auto& entry) {
      const HeadClass& c = classes[entry.second];
      return c.wave_start == wave_start && same_jobs_but_head(plan, c.representative, head, units_per_head);
    });
    if (known) continue;
    by_hash.emplace(hash, classes.size());
    classes.push_back({head, wave_start});
  }
  return classes;
}

// --- the representative's jobs -----------------------------------------------------------------------------

// The job conditions (each key/value tile of the head held by one valid job, which covers the query tiles its
// mask sees) and the visits of each unit of the head. nullopt when a condition fails.
std::optional<std::vector<long long>> unit_visits_if_jobs_cover(const SchedulePlan& plan, int head,
                                                                int units_per_head) {
  const TiledProblem& p = plan.problem;
  const int n = p.num_kv_tiles();
  std::vector<bool> held(static_cast<size_t>(n), false);
  std::vector<long long> visits(static_cast<size_t>(units_per_head), 0);
  for (int a = 0; a < units_per_head; ++a) {
    for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
      const Job job = make_job(plan, head * units_per_head + a, sub);
      if (!job.valid) continue;
      if (job.kv_tile < 0 || job.kv_tile >= n || held[job.kv_tile]) return std::nullopt;
      held[job.kv_tile] = true;
      if (job.q_begin != p.q_begin(job.kv_tile) || job.q_end != p.q_end(job.kv_tile) ||
          job.num_steps != job.q_end - job.q_begin) {
        return std::nullopt;
      }
      visits[a] += job.num_steps;
    }
  }
  if (std::find(held.begin(), held.end(), false) != held.end()) return std::nullopt;
  return visits;
}

// --- chunks ------------------------------------------------------------------------------------------------

// What one chunk saw of a query tile v of the head. Its visits, in key order, must hold consecutive ranks
// first_rank, first_rank + 1, ... with no two under one key.
struct TileTrace {
  int first_rank = 0;
  int count = 0;
  uint32_t last_key = 0;
};

// A contiguous range of the representative's units [begin, end) (whole waves under static dispatch).
struct Chunk {
  size_t head_class;
  int begin;
  int end;
  std::vector<TileTrace> traces;  // per query tile; empty for unordered plans
};

bool record(TileTrace& t, int rank, uint32_t key) {
  if (t.count == 0) {
    t.first_rank = rank;
  } else if (rank != t.first_rank + t.count || key == t.last_key) {
    return false;
  }
  t.last_key = key;
  ++t.count;
  return true;
}

// Checks the visits of one chunk: each inside its job's range and, for ordered plans, each tile's ranks
// consecutive in key order with no two visits under one key. Keys: under dynamic dispatch the unit; under
// static dispatch a tick per (relative wave, position of the visit in its unit), the chunk's units walked
// position by position so that the ticks rise. A job that visited a tile twice would give it one rank twice
// (rank_of depends on the job and the tile only), so ordered plans need no separate repeat check; unordered
// ones check repeats with a stamp or a bit per tile.
//
// The loops run on a local copy of the plan whose kind is a compile-time constant: make_job, q_tile_at and
// rank_of then inline to the one schedule's code, and what they derive from the plan alone (tile counts,
// divisions) moves out of the loops, since no store can change a local whose address never escapes.
class ChunkChecker {
 public:
  ChunkChecker(const SchedulePlan& plan, const HeadClass& head_class, int units_per_head)
      : plan_(plan),
        first_unit_(head_class.representative * units_per_head),
        units_per_head_(units_per_head),
        wave_start_(head_class.wave_start),
        m_(plan.problem.num_q_tiles()) {}

  bool check(Chunk& chunk) {
    switch (plan_.kind) {
      case Schedule::kAscending:
        return check_as<Schedule::kAscending>(chunk);
      case Schedule::kDescending:
        return check_as<Schedule::kDescending>(chunk);
      case Schedule::kShortestFirst:
        return check_as<Schedule::kShortestFirst>(chunk);
      case Schedule::kShift:
        return check_as<Schedule::kShift>(chunk);
      case Schedule::kSymmetricShift:
        return check_as<Schedule::kSymmetricShift>(chunk);
      case Schedule::kNondeterministic:
        return check_as<Schedule::kNondeterministic>(chunk);
      case Schedule::kAuto:
        break;
    }
    return false;  // never reached: such a plan has no jobs, so the job conditions failed first
  }

 private:
  // One unit of a wave, walked step by step through its jobs.
  struct Lane {
    size_t job;  // index into wave_jobs_
    size_t jobs_end;
    int step;
    uint64_t* visited;  // unordered plans: query tiles its current job visited, one bit each
  };

  template <Schedule kKind>
  bool check_as(Chunk& chunk) {
    if (is_deterministic(kKind)) chunk.traces.assign(static_cast<size_t>(m_), TileTrace{});
    return plan_.dispatch == Dispatch::kStatic ? check_waves<kKind>(plan_, chunk.traces.data(), chunk.begin, chunk.end)
                                               : check_units<kKind>(plan_, chunk.traces.data(), chunk.begin, chunk.end);
  }

  // `plan` is taken by value and its kind set to kKind: see the class comment.
  template <Schedule kKind>
  bool check_units(SchedulePlan plan, TileTrace* traces, int begin, int end) const {
    plan.kind = kKind;
    constexpr bool kOrdered = is_deterministic(kKind);
    std::vector<int> stamp(kOrdered ? 0 : static_cast<size_t>(m_), -1);
    int job_stamp = 0;
    for (int a = begin; a < end; ++a) {
      for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
        const Job job = make_job(plan, first_unit_ + a, sub);
        if (!job.valid) continue;
        ++job_stamp;
        for (int step = 0; step < job.num_steps; ++step) {
          const int v = q_tile_at(plan, job, step);
          if (v < job.q_begin || v >= job.q_end) return false;
          if constexpr (kOrdered) {
            if (!record(traces[v], rank_of(plan, job, v), static_cast<uint32_t>(a))) return false;
          } else {
            if (stamp[v] == job_stamp) return false;
            stamp[v] = job_stamp;
          }
        }
      }
    }
    return true;
  }

  // Relative waves: wave 0 is [0, wave_start), wave w > 0 is [wave_start + (w - 1) S, wave_start + w S).
  int wave_of(int a) const { return a < wave_start_ ? 0 : 1 + (a - wave_start_) / plan_.num_ctas; }
  int wave_end(int wave) const {
    return static_cast<int>(std::min<long long>(units_per_head_, wave_start_ + 1LL * wave * plan_.num_ctas));
  }

  template <Schedule kKind>
  bool check_waves(SchedulePlan plan, TileTrace* traces, int begin, int end) {
    plan.kind = kKind;
    constexpr bool kOrdered = is_deterministic(kKind);
    const size_t words = kOrdered ? 0 : (static_cast<size_t>(m_) + 63) / 64;
    // One tick per position. Ranks are checked in the order of the walk; ticks only tell ties apart, so even a
    // wrapped tick could at worst make two visits look tied, which fails safe.
    uint32_t tick = 0;
    for (int wave_begin = begin; wave_begin < end;) {
      const int wave_end_unit = std::min(end, wave_end(wave_of(wave_begin)));
      visited_.assign(static_cast<size_t>(wave_end_unit - wave_begin) * words, 0);
      wave_jobs_.clear();
      lanes_.clear();
      for (int a = wave_begin; a < wave_end_unit; ++a) {
        const size_t first_job = wave_jobs_.size();
        for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
          const Job job = make_job(plan, first_unit_ + a, sub);
          if (job.valid && job.num_steps > 0) wave_jobs_.push_back(job);
        }
        if (wave_jobs_.size() > first_job) {
          lanes_.push_back(
              {first_job, wave_jobs_.size(), 0, visited_.data() + static_cast<size_t>(a - wave_begin) * words});
        }
      }
      for (; !lanes_.empty(); ++tick) {
        for (size_t i = 0; i < lanes_.size();) {
          Lane& lane = lanes_[i];
          const Job job = wave_jobs_[lane.job];
          const int v = q_tile_at(plan, job, lane.step);
          if (v < job.q_begin || v >= job.q_end) return false;
          if constexpr (kOrdered) {
            if (!record(traces[v], rank_of(plan, job, v), tick)) return false;
          } else {
            uint64_t& word = lane.visited[v / 64];
            const uint64_t bit = uint64_t{1} << (v % 64);
            if ((word & bit) != 0) return false;
            word |= bit;
          }
          if (++lane.step < job.num_steps) {
            ++i;
            continue;
          }
          // The job is done: on to the lane's next one, or out of the walk.
          lane.step = 0;
          std::fill(lane.visited, lane.visited + words, 0);
          if (++lane.job < lane.jobs_end) {
            ++i;
          } else {
            lane = lanes_.back();
            lanes_.pop_back();
          }
        }
      }
      wave_begin = wave_end_unit;
    }
    return true;
  }

  const SchedulePlan& plan_;
  int first_unit_;
  int units_per_head_;
  int wave_start_;
  int m_;
  std::vector<Job> wave_jobs_;
  std::vector<Lane> lanes_;
  std::vector<uint64_t> visited_;
};

// Cuts [0, U) into about `pieces` ranges of similar visit counts, at wave starts under static dispatch.
std::vector<std::pair<int, int>> cut_into_chunks(const SchedulePlan& plan, const HeadClass& head_class,
                                                 const std::vector<long long>& unit_visits, int pieces) {
  const int units = static_cast<int>(unit_visits.size());
  long long total = 0;
  for (long long v : unit_visits) total += v;
  std::vector<std::pair<int, int>> chunks;
  int begin = 0;
  long long done = 0;
  for (int a = 0; a < units; ++a) {
    done += unit_visits[a];
    const int next = a + 1;
    const bool at_wave_start = plan.dispatch != Dispatch::kStatic || next == head_class.wave_start ||
                               (next > head_class.wave_start && (next - head_class.wave_start) % plan.num_ctas == 0);
    const bool enough = done * pieces >= total * static_cast<long long>(chunks.size() + 1);
    if (next < units && at_wave_start && enough) {
      chunks.emplace_back(begin, next);
      begin = next;
    }
  }
  chunks.emplace_back(begin, units);
  return chunks;
}

// Joins the chunks of one class, in key order: each tile's ranks run on from chunk to chunk, and are exactly
// 0 .. contributors - 1.
bool ranks_run_through(const std::vector<Chunk>& chunks, size_t begin, size_t end, const TiledProblem& p) {
  for (int v = 0; v < p.num_q_tiles(); ++v) {
    int count = 0;
    for (size_t c = begin; c < end; ++c) {
      const TileTrace& t = chunks[c].traces[v];
      if (t.count == 0) continue;
      if (t.first_rank != count) return false;
      count += t.count;
    }
    if (count != p.num_contributors(v)) return false;
  }
  return true;
}

// Checks chunks[begin, end) on up to `threads` threads; false when one fails.
bool check_chunks(const SchedulePlan& plan, const std::vector<HeadClass>& classes, int units_per_head,
                  std::vector<Chunk>& chunks, int threads) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const auto work = [&] {
    for (size_t i; !failed && (i = next.fetch_add(1)) < chunks.size();) {
      ChunkChecker checker(plan, classes[chunks[i].head_class], units_per_head);
      if (!checker.check(chunks[i])) failed = true;
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads && static_cast<size_t>(t) < chunks.size(); ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
  return !failed;
}

// The fast conditions on every class; false when one fails. Fills the statistics.
bool fast_conditions_hold(const SchedulePlan& plan, const ProofOptions& options, ProofStats& stats) {
  const TiledProblem& p = plan.problem;
  if (p.num_heads() <= 0 || plan.num_units <= 0 || plan.num_units % p.num_heads() != 0) return false;
  const int units_per_head = plan.num_units / p.num_heads();
  const std::optional<std::vector<HeadClass>> classes = head_classes(plan, units_per_head);
  if (!classes) return false;
  stats.head_classes = static_cast<int>(classes->size());

  // Plan every class's chunks first (the job conditions come with it), then check them group by group: as many
  // classes at once as their tile records allow, a class in at most as many chunks as there are threads.
  const int threads = options.max_threads > 0 ? options.max_threads
                                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const bool ordered = sums_in_order(plan);
  const size_t trace_bytes = ordered ? static_cast<size_t>(p.num_q_tiles()) * sizeof(TileTrace) : 0;
  const long long most_pieces =
      std::min<long long>(threads, trace_bytes > 0 ? std::max<size_t>(1, kMaxTraceBytes / trace_bytes) : threads);
  std::vector<std::vector<std::pair<int, int>>> class_chunks;
  for (const HeadClass& c : *classes) {
    const std::optional<std::vector<long long>> unit_visits =
        unit_visits_if_jobs_cover(plan, c.representative, units_per_head);
    if (!unit_visits) return false;
    long long visits = 0;
    for (long long v : *unit_visits) visits += v;
    stats.visits += visits;
    const int pieces =
        static_cast<int>(std::clamp<long long>(visits / std::max(1LL, options.min_visits_per_chunk), 1, most_pieces));
    class_chunks.push_back(cut_into_chunks(plan, c, *unit_visits, pieces));
  }
  for (size_t first_class = 0; first_class < classes->size();) {
    std::vector<Chunk> chunks;
    std::vector<size_t> class_first_chunk;
    size_t end_class = first_class;
    while (end_class < classes->size() &&
           (chunks.empty() || (chunks.size() + class_chunks[end_class].size()) * trace_bytes <= kMaxTraceBytes)) {
      class_first_chunk.push_back(chunks.size());
      for (const auto& [begin, end] : class_chunks[end_class]) chunks.push_back({end_class, begin, end, {}});
      ++end_class;
    }
    class_first_chunk.push_back(chunks.size());
    stats.threads = std::max(stats.threads, std::min(threads, static_cast<int>(chunks.size())));
    if (!check_chunks(plan, *classes, units_per_head, chunks, threads)) return false;
    for (size_t c = 0; ordered && c + 1 < class_first_chunk.size(); ++c) {
      if (!ranks_run_through(chunks, class_first_chunk[c], class_first_chunk[c + 1], p)) return false;
    }
    first_class = end_class;
  }
  return true;
}

// The closed-form proof of the plan's schedule family, when its hypotheses hold.
StructuralProof prove_by_structure(const SchedulePlan& plan) {
  const StructuralProof shift = prove_shift_by_structure(plan);
  return shift.proven ? shift : prove_kv_order_by_structure(plan);
}

}  // namespace

PlanProof prove_plan(const SchedulePlan& plan, const ProofOptions& options) {
  PlanProof proof;
  proof.stats.heads = plan.problem.num_heads();
  // Neither can come from make_schedule_plan; the validator itself would divide by zero or misread them.
  if (plan.num_ctas < 1) {
    proof.summary = "deadlock: the plan has no CTA to run its units";
    return proof;
  }
  if (plan.dispatch != Dispatch::kStatic && plan.dispatch != Dispatch::kDynamic) {
    proof.summary = "deadlock: the plan's dispatch is neither static nor dynamic";
    return proof;
  }
  if (const StructuralProof structural = options.by_structure ? prove_by_structure(plan) : StructuralProof{};
      structural.proven) {
    proof.stats.head_classes = structural.head_classes;
    proof.stats.by_structure = true;
    proof.summary = "valid";
    return proof;
  }
  if (fast_conditions_hold(plan, options, proof.stats)) {
    proof.summary = "valid";
    return proof;
  }
  proof.stats.streamed_fallback = true;
  proof.summary = streamed_validation_summary(plan);
  return proof;
}

}  // namespace dash
