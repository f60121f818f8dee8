// The vocabulary shared by every schedule: a plan (which schedule, for which tiled problem, on how
// many persistent CTAs), the jobs it hands out and the wave bookkeeping of the shift schedules.
//
// A schedule is three pure functions of (plan, job):
//   make_job(plan, unit, sub)   which job a work unit holds (its head, key/value tile and state);
//   q_tile_at(plan, job, step)  the query tile the job visits at `step`;
//   rank_of(plan, job, v)       the position of this job's partial dQ for query tile v in that tile's
//                               fixed summation order (0 = added first).
// The CPU validator, simulator and emulator enumerate exactly these functions, and the kernels call
// them inline, so what the CPU proved for a shape is what the GPU runs.
#pragma once

#include <cstdint>

#include "dash/types.hpp"
#include "schedule/host_device.hpp"
#include "schedule/tiled_problem.hpp"

namespace dash {

// How work units reach the persistent CTAs.
enum class Dispatch : uint8_t {
  // Units are taken in increasing order from a global counter as CTAs become free, like the hardware
  // block scheduler with a non-persistent grid. Safe for any timing when every contribution waits only
  // on contributions of earlier units (checked by the validator).
  kDynamic,
  // CTA c runs units c, c + num_ctas, c + 2 num_ctas, ... in order. Needs all CTAs resident at once
  // (the grid never exceeds the SM count); the validator simulates it to prove it cannot deadlock.
  kStatic,
};

// The rank of a contribution that is summed without order (Schedule::kNondeterministic).
inline constexpr int kUnordered = -1;

struct SchedulePlan {
  Schedule kind;  // never kAuto
  Dispatch dispatch;
  TiledProblem problem;
  int num_ctas;
  int num_units;
  int jobs_per_unit;  // 2 for symmetric shift (a long and a short key/value tile), otherwise 1
};

struct Job {
  int head;  // schedule head (see tiled_problem.hpp)
  int kv_tile;
  int q_begin;  // the band of query tiles the mask lets this job see: [q_begin, q_end)
  int q_end;
  int num_steps;  // q_end - q_begin: it visits each tile of its band once, in the schedule's order
  // Wave state of the shift schedules: this head's units running in the same wave as this one.
  int lane;         // index of this unit among them
  int wave_size;    // how many there are
  int earlier;      // units of this head that ran in earlier waves
  int wave_shorts;  // symmetric shift: units of the wave that carry a short job
  int rect_begin;   // symmetric shift: first query tile that every long job of the wave sees
  int fold_begin;   // symmetric shift under a sliding window: first key/value tile of the folded triangle
  bool is_short;    // symmetric shift: the second (short) job of a unit
  bool valid;       // false for the missing short job of the middle unit when num_kv_tiles is odd
};

// Where unit `unit` of a head whose units are [head_first, head_first + head_units) sits in its wave.
struct WaveSlot {
  int lane;
  int size;
  int earlier;
};

DASH_HOST_DEVICE WaveSlot wave_slot(int unit, int head_first, int head_units, int num_ctas) {
  const int wave_first = unit / num_ctas * num_ctas;
  const int lo = wave_first > head_first ? wave_first : head_first;
  const int wave_end = wave_first + num_ctas;
  const int head_end = head_first + head_units;
  const int hi = wave_end < head_end ? wave_end : head_end;
  return WaveSlot{unit - lo, hi - lo, lo - head_first};
}

DASH_HOST_DEVICE int positive_mod(int a, int m) {
  const int r = a % m;
  return r < 0 ? r + m : r;
}

// floor(a / b) for b > 0, also for negative a (C++ division truncates toward zero).
DASH_HOST_DEVICE int floor_div(int a, int b) { return (a - positive_mod(a, b)) / b; }

DASH_HOST_DEVICE Job make_plain_job(const TiledProblem& p, int head, int kv_tile) {
  Job job{};
  job.head = head;
  job.kv_tile = kv_tile;
  job.q_begin = p.q_begin(kv_tile);
  job.q_end = p.q_end(kv_tile);
  job.num_steps = job.q_end - job.q_begin;
  job.valid = true;
  return job;
}

}  // namespace dash
