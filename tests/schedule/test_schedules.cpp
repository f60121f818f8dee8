// Unit tests of the schedule layer's pure functions (src/schedule): the mask (sliding windows included) and
// tiling arithmetic against brute force, the full and causal masks' jobs, visits and ranks as they were before
// sliding windows, the wave bookkeeping, each schedule's job/visit/rank formulas against the notes' closed
// formulas and the band's, and the planner's preconditions with the reasons it gives.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "planner/expanded_schedule.hpp"
#include "planner/schedule_plan.hpp"
#include "schedule/schedule.hpp"
#include "schedule_test_support.hpp"

namespace dash {
namespace {

using testing::abstract_problem;
using testing::accumulation_order;
using testing::must_plan;

// FlashAttention's rule, written out here rather than taken from mask.hpp: row i sees key j iff
// i + d - left <= j <= i + d + right (d = seqlen_k - seqlen_q), a negative bound leaving its side open and
// causal setting right to 0.
bool flash_attention_sees(int sq, int sk, bool causal, SlidingWindow w, int row, int col) {
  const int diagonal = row + sk - sq;
  const int right = causal ? 0 : w.right;
  return (w.left < 0 || col >= diagonal - w.left) && (right < 0 || col <= diagonal + right);
}

SlidingWindow random_window(std::mt19937& rng, int reach) {
  std::uniform_int_distribution<int> bound(-1, reach);
  return SlidingWindow{bound(rng), bound(rng)};
}

TEST(Mask, SlidingWindowsFollowFlashAttentionsRule) {
  std::mt19937 rng(12);
  for (int iter = 0; iter < 400; ++iter) {
    const int sq = std::uniform_int_distribution<int>(1, 24)(rng);
    const int sk = std::uniform_int_distribution<int>(1, 24)(rng);
    const bool causal = iter % 3 == 0;
    const SlidingWindow w = random_window(rng, 30);
    const MaskShape mask{sq, sk, causal, w};
    const std::string what = std::to_string(sq) + "x" + std::to_string(sk) + (causal ? " causal" : "") + " window " +
                             std::to_string(w.left) + "," + std::to_string(w.right);
    int previous_first = 0, previous_end = 0;
    for (int row = 0; row < sq; ++row) {
      int first = sk, end = 0;
      for (int col = 0; col < sk; ++col) {
        const bool sees = flash_attention_sees(sq, sk, causal, w, row, col);
        ASSERT_EQ(mask.visible(row, col), sees) << what << " row " << row << " col " << col;
        if (sees) {
          first = std::min(first, col);
          end = col + 1;
        }
      }
      if (end > 0) {
        EXPECT_EQ(mask.first_visible_key(row), first) << what << " row " << row;
        EXPECT_EQ(mask.visible_keys(row), end) << what << " row " << row;
      } else {
        EXPECT_GE(mask.first_visible_key(row), mask.visible_keys(row)) << what << " row " << row << " sees nothing";
      }
      EXPECT_GE(mask.first_visible_key(row), previous_first) << what << " row " << row;
      EXPECT_GE(mask.visible_keys(row), previous_end) << what << " row " << row;
      previous_first = mask.first_visible_key(row);
      previous_end = mask.visible_keys(row);
    }
    for (int col = 0; col < sk; ++col) {
      int first = sq, end = 0;
      for (int row = sq - 1; row >= 0; --row) {
        if (flash_attention_sees(sq, sk, causal, w, row, col)) {
          first = row;
          end = std::max(end, row + 1);
        }
      }
      EXPECT_EQ(mask.first_row_seeing(col), first) << what << " col " << col;
      if (first < sq) {
        EXPECT_EQ(mask.rows_seeing_end(col), end) << what << " col " << col;
      }
    }
  }
}

// The masks of the kernels, unchanged: the causal rule of mask.hpp before sliding windows.
TEST(Mask, CausalAndFullMasksKeepTheirRule) {
  for (int sq : {1, 5, 8, 13}) {
    for (int sk : {1, 5, 8, 13}) {
      const MaskShape mask{sq, sk, true};
      for (int row = 0; row < sq; ++row) {
        EXPECT_EQ(mask.visible_keys(row), std::clamp(row + 1 + sk - sq, 0, sk));
        EXPECT_EQ(mask.first_visible_key(row), 0);
      }
      for (int col = 0; col < sk; ++col) EXPECT_EQ(mask.first_row_seeing(col), std::max(0, col + sq - sk));
      const MaskShape full{sq, sk, false};
      EXPECT_EQ(full.visible_keys(0), sk);
      EXPECT_EQ(full.first_row_seeing(sk - 1), 0);
    }
  }
}

// A random tiled problem: GQA folding and splits, ragged lengths, both tile ratios, and (every other draw) a
// sliding window.
TiledProblem random_tiled_problem(std::mt19937& rng, bool windowed) {
  TiledProblem p{};
  p.batch = 1;
  p.heads_kv = 1;
  p.group_size = std::uniform_int_distribution<int>(1, 4)(rng);
  p.group_splits = p.group_size % 2 == 0 && rng() % 2 == 0 ? 2 : 1;
  p.block_q = std::uniform_int_distribution<int>(1, 4)(rng);
  p.block_kv = p.block_q * std::uniform_int_distribution<int>(1, 3)(rng);
  p.seqlen_q = std::uniform_int_distribution<int>(1, 40)(rng);
  p.seqlen_k = std::uniform_int_distribution<int>(1, 40)(rng);
  p.causal = rng() % 4 != 0;
  if (windowed) p.window = random_window(rng, 24);
  return p;
}

// The bands [q_begin, q_end) and contributor ranges [kv_begin, kv_end) must describe exactly the tile pairs that
// share a visible element, including ragged last tiles, seqlen_q != seqlen_k, GQA's virtual query tiles and
// sliding windows; their ends never decrease, and an empty range sits at 0.
TEST(TiledProblem, TileRangesMatchBruteForce) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 600; ++iter) {
    const TiledProblem p = random_tiled_problem(rng, iter % 2 == 1);
    const MaskShape mask = p.mask();
    const int hpj = p.heads_per_job();
    const auto tiles_see = [&](int v, int kv) {
      const int q = v / hpj;
      for (int row = q * p.block_q; row < std::min((q + 1) * p.block_q, p.seqlen_q); ++row) {
        for (int col = kv * p.block_kv; col < std::min((kv + 1) * p.block_kv, p.seqlen_k); ++col) {
          if (mask.visible(row, col)) return true;
        }
      }
      return false;
    };
    int previous_begin = 0, previous_end = 0;  // of the last nonempty range
    for (int v = 0; v < p.num_q_tiles(); ++v) {
      int begin = 0, end = 0;
      for (int kv = 0; kv < p.num_kv_tiles(); ++kv) {
        if (!tiles_see(v, kv)) continue;
        if (end == 0) begin = kv;
        ASSERT_TRUE(end == 0 || end == kv) << "contributors must be contiguous: v " << v << " kv " << kv;
        end = kv + 1;
      }
      EXPECT_EQ(p.kv_begin(v), begin) << "v " << v;
      EXPECT_EQ(p.kv_end(v), end) << "v " << v;
      EXPECT_EQ(p.num_contributors(v), end - begin) << "v " << v;
      if (end > begin) {
        EXPECT_GE(begin, previous_begin) << "v " << v;
        EXPECT_GE(end, previous_end) << "v " << v;
        previous_begin = begin;
        previous_end = end;
      }
    }
    previous_begin = previous_end = 0;
    for (int kv = 0; kv < p.num_kv_tiles(); ++kv) {
      int begin = 0, end = 0;
      for (int v = 0; v < p.num_q_tiles(); ++v) {
        if (!tiles_see(v, kv)) continue;
        if (end == 0) begin = v;
        ASSERT_TRUE(end == 0 || end == v) << "a band must be contiguous: kv " << kv << " v " << v;
        end = v + 1;
      }
      EXPECT_EQ(p.q_begin(kv), begin) << "kv " << kv;
      EXPECT_EQ(p.q_end(kv), end) << "kv " << kv;
      if (end > begin) {
        EXPECT_GE(begin, previous_begin) << "kv " << kv;
        EXPECT_GE(end, previous_end) << "kv " << kv;
        previous_begin = begin;
        previous_end = end;
      }
    }
  }
}

// Without a window the ranges are those of the tiled problem before sliding windows, written out here from
// its formulas: bands [first row seeing the tile's first key / block_q * hpj, num_q_tiles), contributors
// [0, ceil(keys the tile's last row sees / block_kv)).
TEST(TiledProblem, FullAndCausalMasksKeepTheirTileRanges) {
  std::mt19937 rng(70);
  for (int iter = 0; iter < 600; ++iter) {
    const TiledProblem p = random_tiled_problem(rng, false);
    const int sq = p.seqlen_q, sk = p.seqlen_k, hpj = p.heads_per_job();
    for (int kv = 0; kv < p.num_kv_tiles(); ++kv) {
      const int first_row = p.causal ? std::max(0, kv * p.block_kv + sq - sk) : 0;
      EXPECT_EQ(p.q_begin(kv), first_row / p.block_q * hpj) << "kv " << kv;
      EXPECT_EQ(p.q_end(kv), p.num_q_tiles()) << "kv " << kv;
    }
    for (int v = 0; v < p.num_q_tiles(); ++v) {
      const int last_row = std::min((v / hpj + 1) * p.block_q, sq) - 1;
      const int keys = p.causal ? std::clamp(last_row + 1 + sk - sq, 0, sk) : sk;
      EXPECT_EQ(p.kv_begin(v), 0) << "v " << v;
      EXPECT_EQ(p.kv_end(v), ceil_div(keys, p.block_kv)) << "v " << v;
    }
  }
}

// Every job, visit and rank of every schedule on 400 random full and causal shapes (GQA folded and split,
// ragged lengths, both tile shapes, 1-150 SMs), reduced to one digest per schedule and one of the tile ranges.
// The digests are those of commit 17d2a7b, before sliding windows generalized jobs and tile ranges: the
// existing masks keep exactly their jobs, visits and ranks, which the kernels compute with these functions.
TEST(Schedules, FullAndCausalMasksKeepTheirJobsVisitsAndRanks) {
  struct Digest {
    uint64_t value = 1469598103934665603ULL;  // FNV-1a over 64-bit words
    void mix(long long x) { value = (value ^ static_cast<uint64_t>(x)) * 1099511628211ULL; }
  };
  // mt19937's raw outputs are fixed by the standard; its distributions are not.
  std::mt19937 rng(20261202);
  const auto draw = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<uint32_t>(hi - lo + 1)); };
  Digest digests[7];
  for (int i = 0; i < 400; ++i) {
    AttentionShape s;
    s.batch = draw(1, 3);
    s.heads_kv = draw(1, 4);
    const int groups[] = {1, 2, 4, 3};
    const int g = groups[draw(0, 3)];
    s.heads_q = s.heads_kv * g;
    s.seqlen_q = draw(1, 1500);
    s.seqlen_k = i % 3 == 0 ? s.seqlen_q : draw(1, 1500);
    s.head_dim = draw(0, 1) ? 64 : 128;
    s.causal = draw(0, 1) == 1;
    const int splits = draw(0, 1) ? 0 : (g % 2 == 0 ? 2 : g);
    const TiledProblem p = make_tiled_problem(s, splits);
    const int sms = draw(1, 150);
    Digest& ranges = digests[6];
    ranges.mix(p.group_splits);
    for (int kv = 0; kv < p.num_kv_tiles(); ++kv) ranges.mix(p.q_begin(kv));
    for (int v = 0; v < p.num_q_tiles(); ++v) ranges.mix(p.num_contributors(v));
    for (int k = 0; k < 6; ++k) {
      Digest& d = digests[k];
      const PlanResult planned = make_schedule_plan(p, testing::kSchedules[k], sms);
      d.mix(planned.ok());
      if (!planned.ok()) continue;
      const SchedulePlan& plan = planned.plan;
      for (long long field : {static_cast<int>(plan.dispatch), plan.num_units, plan.num_ctas, plan.jobs_per_unit}) {
        d.mix(field);
      }
      for (int unit = 0; unit < plan.num_units; ++unit) {
        for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
          const Job job = make_job(plan, unit, sub);
          d.mix(job.valid);
          if (!job.valid) continue;
          EXPECT_EQ(job.q_end, job.q_begin + job.num_steps);
          for (long long field : {job.head, job.kv_tile, job.q_begin, job.num_steps, job.lane, job.wave_size,
                                  job.earlier, job.wave_shorts, job.rect_begin, static_cast<int>(job.is_short)}) {
            d.mix(field);
          }
          for (int step = 0; step < job.num_steps; ++step) {
            const int v = q_tile_at(plan, job, step);
            for (long long x : {v, p.dq_tile_index(job.head, v), rank_of(plan, job, v)}) d.mix(x);
          }
        }
      }
    }
  }
  const uint64_t expected[7] = {0x67620daec43aab23ULL, 0x76f0764faacdbb1bULL, 0xb183d1bacdd94dcdULL,
                                0xa9a8fecee09cb798ULL, 0xe3f68f9d996c3556ULL, 0x7264c7e540b17bf8ULL,
                                0x2b87d7fc039b2295ULL};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(digests[k].value, expected[k]) << schedule_name(testing::kSchedules[k]);
  EXPECT_EQ(digests[6].value, expected[6]) << "tile ranges";
}

TEST(TiledProblem, DqTileIndexIsABijection) {
  TiledProblem p{};
  p.batch = 3;
  p.heads_kv = 2;
  p.group_size = 4;
  p.group_splits = 2;
  p.seqlen_q = 300;
  p.seqlen_k = 200;
  p.block_q = 64;
  p.block_kv = 128;
  p.causal = false;
  ASSERT_EQ(p.num_heads(), 12);
  ASSERT_EQ(p.num_q_tiles(), 5 * 2);
  std::set<int> seen;
  for (int head = 0; head < p.num_heads(); ++head) {
    for (int v = 0; v < p.num_q_tiles(); ++v) {
      const QTileCoord c = p.q_coord(head, v);
      const KvJobCoord kv = p.kv_coord(head);
      EXPECT_EQ(c.head_q / p.group_size, kv.head_kv) << "a query head must belong to its job's key/value head";
      seen.insert(p.dq_tile_index(head, v));
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), p.batch * p.heads_q() * p.real_q_tiles());
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), p.batch * p.heads_q() * p.real_q_tiles() - 1);
}

TEST(WaveSlot, HeadsStraddlingWaves) {
  // 6 units per head on 4 CTAs: wave 0 = head 0 units 0-3; wave 1 = head 0 units 4-5 and head 1 units 0-1;
  // wave 2 = head 1 units 2-5.
  const WaveSlot a = wave_slot(2, 0, 6, 4);
  EXPECT_EQ(a.lane, 2);
  EXPECT_EQ(a.size, 4);
  EXPECT_EQ(a.earlier, 0);
  const WaveSlot b = wave_slot(5, 0, 6, 4);
  EXPECT_EQ(b.lane, 1);
  EXPECT_EQ(b.size, 2);
  EXPECT_EQ(b.earlier, 4);
  const WaveSlot c = wave_slot(7, 6, 6, 4);
  EXPECT_EQ(c.lane, 1);
  EXPECT_EQ(c.size, 2);
  EXPECT_EQ(c.earlier, 0);
  const WaveSlot d = wave_slot(8, 6, 6, 4);
  EXPECT_EQ(d.lane, 0);
  EXPECT_EQ(d.size, 4);
  EXPECT_EQ(d.earlier, 2);
  EXPECT_EQ(positive_mod(-1, 4), 3);
  EXPECT_EQ(positive_mod(-4, 4), 0);
  EXPECT_EQ(positive_mod(5, 4), 1);
}

TEST(StaticDispatch, UnitsAreDealtRoundRobin) {
  SchedulePlan plan{};
  plan.num_units = 10;
  plan.num_ctas = 4;
  EXPECT_EQ(static_unit_count(plan, 0), 3);
  EXPECT_EQ(static_unit_count(plan, 1), 3);
  EXPECT_EQ(static_unit_count(plan, 2), 2);
  EXPECT_EQ(static_unit_count(plan, 3), 2);
  EXPECT_EQ(static_unit(plan, 1, 2), 9);
  plan.num_ctas = 12;
  EXPECT_EQ(static_unit_count(plan, 11), 0);
}

// The notes' formula w(q, j) = F + ((min(q, R - 1) - j) mod R) on a problem whose heads straddle waves.
TEST(ShiftSchedule, RanksFollowTheWaveFormula) {
  const int n = 6;
  const int m = 7;
  const SchedulePlan plan = must_plan(abstract_problem(3, n, m, false), Schedule::kShift, 4);
  for (int unit = 0; unit < plan.num_units; ++unit) {
    const Job job = make_job(plan, unit, 0);
    const WaveSlot slot = wave_slot(unit, unit / n * n, n, 4);
    ASSERT_EQ(job.head, unit / n);
    ASSERT_EQ(job.kv_tile, unit % n);
    ASSERT_EQ(job.lane, slot.lane);
    ASSERT_EQ(job.wave_size, slot.size);
    ASSERT_EQ(job.earlier, slot.earlier);
    ASSERT_EQ(job.num_steps, m);
    for (int step = 0; step < m; ++step) {
      const int q = q_tile_at(plan, job, step);
      EXPECT_EQ(q, (slot.lane + step) % m);
      const int row = std::min(q, slot.size - 1);
      EXPECT_EQ(rank_of(plan, job, q), slot.earlier + positive_mod(row - slot.lane, slot.size));
    }
  }
}

TEST(SymmetricShiftSchedule, PairsLongAndShortTilesIntoEqualWork) {
  for (int stride : {1, 2, 4}) {
    const int n = 8;
    const SchedulePlan plan =
        must_plan(abstract_problem(2, n, stride * n, true, stride), Schedule::kSymmetricShift, 132);
    ASSERT_EQ(plan.num_units, 2 * n / 2);
    ASSERT_EQ(plan.jobs_per_unit, 2);
    for (int unit = 0; unit < plan.num_units; ++unit) {
      const Job long_job = make_job(plan, unit, 0);
      const Job short_job = make_job(plan, unit, 1);
      const int i = unit % (n / 2);
      EXPECT_EQ(long_job.kv_tile, i);
      EXPECT_EQ(short_job.kv_tile, n - 1 - i);
      EXPECT_FALSE(long_job.is_short);
      EXPECT_TRUE(short_job.is_short);
      EXPECT_EQ(long_job.num_steps, stride * (n - i));
      EXPECT_EQ(short_job.num_steps, stride * (i + 1));
      EXPECT_EQ(long_job.num_steps + short_job.num_steps, stride * (n + 1));
      // Short chains run from the last query tile down to their diagonal.
      for (int step = 0; step < short_job.num_steps; ++step) {
        EXPECT_EQ(q_tile_at(plan, short_job, step), stride * n - 1 - step);
      }
    }
  }
}

TEST(SymmetricShiftSchedule, OddTileCountLeavesTheMiddleTileAlone) {
  const int n = 7;
  const SchedulePlan plan = must_plan(abstract_problem(1, n, n, true), Schedule::kSymmetricShift, 132);
  ASSERT_EQ(plan.num_units, 4);
  for (int unit = 0; unit < 3; ++unit) EXPECT_TRUE(make_job(plan, unit, 1).valid);
  const Job middle = make_job(plan, 3, 0);
  EXPECT_TRUE(middle.valid);
  EXPECT_EQ(middle.kv_tile, 3);
  EXPECT_FALSE(make_job(plan, 3, 1).valid) << "the middle tile must not be run twice";
  EXPECT_EQ(middle.wave_shorts, 3);
  const ExpandedSchedule s = expand_schedule(plan);
  EXPECT_EQ(s.jobs.size(), 7u);
  EXPECT_EQ(s.unit_first_job, (std::vector<int>{0, 2, 4, 6, 7}));
}

TEST(KvOrderSchedules, VisitAndRankFormulas) {
  const int n = 5;
  const int m = 6;
  for (bool causal : {false, true}) {
    const TiledProblem p = abstract_problem(2, n, m, causal);
    const SchedulePlan asc = must_plan(p, Schedule::kAscending, 3);
    const SchedulePlan desc = must_plan(p, Schedule::kDescending, 3);
    const SchedulePlan spt = must_plan(p, Schedule::kShortestFirst, 3);
    const SchedulePlan nondet = must_plan(p, Schedule::kNondeterministic, 3);
    for (const SchedulePlan* plan : {&asc, &desc, &spt, &nondet}) {
      EXPECT_EQ(plan->dispatch, Dispatch::kDynamic);
      EXPECT_EQ(plan->num_units, 2 * n);
      EXPECT_EQ(plan->jobs_per_unit, 1);
    }
    for (int unit = 0; unit < 2 * n; ++unit) {
      const Job a = make_job(asc, unit, 0);
      const Job d = make_job(desc, unit, 0);
      const Job f = make_job(spt, unit, 0);
      EXPECT_EQ(a.head, unit / n);
      EXPECT_EQ(a.kv_tile, unit % n);
      EXPECT_EQ(d.kv_tile, unit % n);
      EXPECT_EQ(f.kv_tile, n - 1 - unit % n) << "shortest-first dispatches the last key/value tile first";
      for (int step = 0; step < a.num_steps; ++step) {
        const int qa = q_tile_at(asc, a, step);
        const int qd = q_tile_at(desc, d, step);
        const int qf = q_tile_at(spt, f, step);
        EXPECT_EQ(qa, a.q_begin + step);
        EXPECT_EQ(qd, m - 1 - step);
        EXPECT_EQ(qf, f.q_begin + step);
        EXPECT_EQ(rank_of(asc, a, qa), a.kv_tile);
        EXPECT_EQ(rank_of(desc, d, qd), d.kv_tile);
        EXPECT_EQ(rank_of(spt, f, qf), p.num_contributors(qf) - 1 - f.kv_tile);
        EXPECT_EQ(rank_of(nondet, a, qa), kUnordered);
      }
    }
  }
}

TEST(KvOrderSchedules, NondeterministicVisitsLikeAuto) {
  // Causal: descending visits with folded GQA heads, shortest-first's jobs otherwise; full: ascending.
  TiledProblem grouped = abstract_problem(2, 4, 4, true);
  grouped.group_size = 2;
  TiledProblem grouped_full = grouped;
  grouped_full.causal = false;
  for (const TiledProblem& p :
       {grouped, grouped_full, abstract_problem(2, 4, 4, true), abstract_problem(2, 4, 4, false)}) {
    const SchedulePlan nondet = must_plan(p, Schedule::kNondeterministic, 3);
    const bool descending = p.causal && p.heads_per_job() > 1;
    const Schedule jobs_of = p.causal && p.heads_per_job() == 1 ? Schedule::kShortestFirst : Schedule::kAscending;
    for (int unit = 0; unit < nondet.num_units; ++unit) {
      const Job job = make_job(nondet, unit, 0);
      EXPECT_EQ(job.kv_tile, make_job(must_plan(p, jobs_of, 3), unit, 0).kv_tile) << "unit " << unit;
      for (int step = 0; step < job.num_steps; ++step) {
        EXPECT_EQ(q_tile_at(nondet, job, step), descending ? p.num_q_tiles() - 1 - step : job.q_begin + step)
            << "causal " << p.causal << ", heads per job " << p.heads_per_job() << ", unit " << unit;
      }
    }
  }
}

TEST(KvOrderSchedules, ShortestFirstSumsInArrivalOrder) {
  const ExpandedSchedule s = expand_schedule(must_plan(abstract_problem(1, 4, 4, true), Schedule::kShortestFirst, 4));
  EXPECT_EQ(accumulation_order(s, 0, 0), (std::vector<int>{0}));
  EXPECT_EQ(accumulation_order(s, 0, 3), (std::vector<int>{3, 2, 1, 0}));
}

// Under a sliding window the key/value-order schedules visit each job's band and count ranks from the first
// tile that sees the query tile (ascending, descending) or back from the last (shortest-first).
TEST(KvOrderSchedules, BandRanksCountFromTheFirstContributor) {
  for (const SlidingWindow window : {SlidingWindow{3, -1}, SlidingWindow{2, 2}, SlidingWindow{-1, 1}}) {
    for (bool causal : {false, true}) {
      TiledProblem p = abstract_problem(2, 9, 11, causal);
      p.window = window;
      const SchedulePlan asc = must_plan(p, Schedule::kAscending, 3);
      const SchedulePlan desc = must_plan(p, Schedule::kDescending, 3);
      const SchedulePlan spt = must_plan(p, Schedule::kShortestFirst, 3);
      for (int unit = 0; unit < asc.num_units; ++unit) {
        const Job a = make_job(asc, unit, 0);
        const Job d = make_job(desc, unit, 0);
        const Job f = make_job(spt, unit, 0);
        EXPECT_EQ(a.q_end, p.q_end(a.kv_tile));
        EXPECT_EQ(a.num_steps, a.q_end - a.q_begin);
        for (int step = 0; step < a.num_steps; ++step) {
          const int qa = q_tile_at(asc, a, step);
          const int qd = q_tile_at(desc, d, step);
          EXPECT_EQ(qa, a.q_begin + step);
          EXPECT_EQ(qd, d.q_end - 1 - step);
          EXPECT_EQ(rank_of(asc, a, qa), a.kv_tile - p.kv_begin(qa));
          EXPECT_EQ(rank_of(desc, d, qd), d.kv_tile - p.kv_begin(qd));
        }
        for (int step = 0; step < f.num_steps; ++step) {
          const int qf = q_tile_at(spt, f, step);
          EXPECT_EQ(rank_of(spt, f, qf), p.kv_end(qf) - 1 - f.kv_tile);
        }
      }
    }
  }
}

// make_tiled_problem(shape, window) puts the window in one form, so that a window that adds nothing to the
// full or causal mask plans exactly as that mask does.
TEST(Preconditions, WindowsAreCanonical) {
  const AttentionShape full = testing::make_shape(1, 2, 1, 1000, 700, 64, false);
  AttentionShape causal = full;
  causal.causal = true;
  const auto same = [](const TiledProblem& a, const TiledProblem& b) {
    return a.causal == b.causal && a.window.left == b.window.left && a.window.right == b.window.right &&
           a.seqlen_q == b.seqlen_q && a.seqlen_k == b.seqlen_k && a.group_splits == b.group_splits;
  };
  EXPECT_TRUE(same(make_tiled_problem(full, SlidingWindow{-1, 0}), make_tiled_problem(causal)))
      << "(-1, 0) is the causal mask";
  EXPECT_TRUE(same(make_tiled_problem(causal, SlidingWindow{-1, 5}), make_tiled_problem(causal)))
      << "causal sets the right bound to 0";
  EXPECT_TRUE(same(make_tiled_problem(full, SlidingWindow{699, -1}), make_tiled_problem(full)))
      << "left >= seqlen_k - 1 reaches key 0 from every row";
  EXPECT_TRUE(same(make_tiled_problem(full, SlidingWindow{-1, 999}), make_tiled_problem(full)))
      << "right >= seqlen_q - 1 reaches the last key from every row";
  const TiledProblem left = make_tiled_problem(full, SlidingWindow{698, 998});
  EXPECT_EQ(left.window.left, 698);
  EXPECT_EQ(left.window.right, 998);
  EXPECT_TRUE(left.windowed());
  const TiledProblem mistral = make_tiled_problem(full, SlidingWindow{255, 0});
  EXPECT_TRUE(mistral.causal) << "a right bound of 0 is the causal mask's";
  EXPECT_EQ(mistral.window.left, 255);
  EXPECT_EQ(mistral.window.right, kNoWindowBound);
  EXPECT_TRUE(mistral.windowed());
  EXPECT_FALSE(make_tiled_problem(causal).windowed());
  EXPECT_TRUE(same(make_tiled_problem(full, SlidingWindow{-5, -7}), make_tiled_problem(full)))
      << "any negative bound is an open side";
}

TEST(Preconditions, WindowRejectionsSayWhy) {
  const auto reason = [](const TiledProblem& p, Schedule schedule) {
    return make_schedule_plan(p, schedule, 8).rejected;
  };
  TiledProblem causal_band = abstract_problem(2, 8, 16, true, 2);
  causal_band.window = {4, kNoWindowBound};
  EXPECT_NE(reason(causal_band, Schedule::kShift).find("full mask"), std::string::npos);
  EXPECT_EQ(reason(causal_band, Schedule::kSymmetricShift), "") << "head dim 128's slope of 2";
  TiledProblem two_sided = abstract_problem(2, 8, 16, false, 2);
  two_sided.window = {4, 3};
  EXPECT_NE(reason(two_sided, Schedule::kSymmetricShift).find("right bound"), std::string::npos);
  TiledProblem unit_slope = abstract_problem(2, 8, 8, true);
  unit_slope.window = {4, kNoWindowBound};
  const std::string odd = reason(unit_slope, Schedule::kSymmetricShift);
  EXPECT_NE(odd.find("even number"), std::string::npos) << odd;
  EXPECT_NE(odd.find("(here 1"), std::string::npos) << odd;
  unit_slope.group_size = 2;  // two query heads folded per job: a slope of 2
  EXPECT_EQ(reason(unit_slope, Schedule::kSymmetricShift), "");
  for (Schedule s :
       {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst, Schedule::kNondeterministic}) {
    EXPECT_EQ(reason(two_sided, s), "") << schedule_name(s);
    EXPECT_EQ(reason(causal_band, s), "") << schedule_name(s);
  }
  // Under a window auto takes a dynamic schedule (the kernels build no windowed symmetric shift), as does the
  // nondeterministic one.
  const AutoChoice choice = choose_auto(causal_band, 132);
  EXPECT_EQ(choice.schedule, Schedule::kShortestFirst);
  EXPECT_NE(std::string(choice.reason).find("sliding window"), std::string::npos);
  const SchedulePlan nondet = must_plan(causal_band, Schedule::kNondeterministic, 8);
  const SchedulePlan spt = must_plan(causal_band, Schedule::kShortestFirst, 8);
  for (int unit = 0; unit < nondet.num_units; ++unit) {
    const Job job = make_job(nondet, unit, 0);
    EXPECT_EQ(job.kv_tile, make_job(spt, unit, 0).kv_tile);
    for (int step = 0; step < job.num_steps; ++step) EXPECT_EQ(q_tile_at(nondet, job, step), job.q_begin + step);
  }
}

// The example of shift_schedules.hpp (BandSymmetricShift): stride 2, 8 key/value x 16 query tiles, a left window
// of 4 rows, 7 CTAs.
TEST(BandSymmetricShift, WorkedExample) {
  TiledProblem p = abstract_problem(1, 8, 16, true, 2);
  p.window = {4, kNoWindowBound};
  const SchedulePlan plan = must_plan(p, Schedule::kSymmetricShift, 7);
  ASSERT_EQ(plan.num_units, 7);
  const ExpandedSchedule s = expand_schedule(plan);
  const auto visits = testing::cta_visits(s, static_cta_jobs(s));
  for (int cta = 0; cta < 6; ++cta) {
    ASSERT_EQ(visits[cta].size(), 6u);
    for (int step = 0; step < 6; ++step) {
      EXPECT_EQ(visits[cta][step].kv, cta);
      EXPECT_EQ(visits[cta][step].q, 2 * cta + step);
    }
  }
  std::vector<std::pair<int, int>> last;  // (kv, q) of CTA 6
  for (const testing::Visit& v : visits[6]) last.push_back({v.kv, v.q});
  EXPECT_EQ(last, (std::vector<std::pair<int, int>>{{6, 12}, {6, 13}, {6, 14}, {6, 15}, {7, 15}, {7, 14}}));
  EXPECT_EQ(accumulation_order(s, 0, 14), (std::vector<int>{6, 5, 7}));
  EXPECT_EQ(accumulation_order(s, 0, 15), (std::vector<int>{6, 7, 5}));
  EXPECT_EQ(accumulation_order(s, 0, 3), (std::vector<int>{1, 0}));
}

// The fold: full-length bands first, then the tiles whose bands the last query tile shortens, paired from both
// ends; pairs have one length, and every tile of the head is held by exactly one job.
TEST(BandSymmetricShift, FoldPairsTheShortenedBands) {
  std::mt19937 rng(31);
  int folded = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const int stride = 2 * std::uniform_int_distribution<int>(1, 2)(rng);
    const int n = std::uniform_int_distribution<int>(1, 20)(rng);
    TiledProblem p = abstract_problem(std::uniform_int_distribution<int>(1, 3)(rng), n,
                                      n * stride + std::uniform_int_distribution<int>(0, 5)(rng), true, stride);
    p.window = {std::uniform_int_distribution<int>(0, 3 * stride * n / 2)(rng), kNoWindowBound};
    const PlanResult planned = make_schedule_plan(p, Schedule::kSymmetricShift, 5);
    ASSERT_TRUE(planned.ok()) << planned.rejected;
    int fold = n;
    for (int kv = n - 1; kv >= 1; --kv) {
      if (p.q_end(kv) - p.q_begin(kv) < p.q_end(0) - p.q_begin(0)) fold = kv;
    }
    const int units = fold + (n - fold + 1) / 2;
    ASSERT_EQ(planned.plan.num_units, p.num_heads() * units);
    std::vector<int> held(static_cast<size_t>(n), 0);
    std::set<int> pair_lengths;
    for (int u = 0; u < units; ++u) {
      const Job first = make_job(planned.plan, u, 0);
      const Job second = make_job(planned.plan, u, 1);
      EXPECT_EQ(first.kv_tile, u);
      EXPECT_FALSE(first.is_short);
      EXPECT_EQ(first.fold_begin, fold);
      ++held[first.kv_tile];
      if (second.valid) {
        EXPECT_GE(u, fold);
        EXPECT_EQ(second.kv_tile, n - 1 - (u - fold));
        EXPECT_TRUE(second.is_short);
        ++held[second.kv_tile];
        pair_lengths.insert(first.num_steps + second.num_steps);
      }
    }
    EXPECT_EQ(held, std::vector<int>(static_cast<size_t>(n), 1));
    EXPECT_LE(pair_lengths.size(), 1u);
    folded += pair_lengths.empty() ? 0 : 1;
  }
  EXPECT_GT(folded, 100);
}

TEST(Preconditions, RejectionsSayWhy) {
  const auto reason = [](const TiledProblem& p, Schedule schedule, int sms) {
    return make_schedule_plan(p, schedule, sms).rejected;
  };
  EXPECT_NE(reason(abstract_problem(1, 4, 4, true), Schedule::kShift, 4).find("full mask"), std::string::npos);
  EXPECT_NE(reason(abstract_problem(1, 4, 4, false), Schedule::kSymmetricShift, 4).find("causal"), std::string::npos);
  // Shift needs m >= R: 6 key/value tiles running together cannot share 5 query tiles.
  const std::string few_q = reason(abstract_problem(1, 6, 5, false), Schedule::kShift, 132);
  EXPECT_NE(few_q.find("(5)"), std::string::npos) << few_q;
  EXPECT_NE(few_q.find("(6)"), std::string::npos) << few_q;
  // ...but on 4 CTAs the waves hold at most 4 tiles of the head, so 5 query tiles suffice.
  EXPECT_TRUE(make_schedule_plan(abstract_problem(1, 6, 5, false), Schedule::kShift, 4).ok());
  const std::string short_q = reason(abstract_problem(1, 8, 6, true), Schedule::kSymmetricShift, 4);
  EXPECT_NE(short_q.find("seqlen_q >= seqlen_k"), std::string::npos) << short_q;
  TiledProblem unaligned = abstract_problem(1, 4, 12, true, 3);
  unaligned.block_q = 2;
  EXPECT_NE(reason(unaligned, Schedule::kSymmetricShift, 4).find("multiple of block_q"), std::string::npos);
  EXPECT_NE(reason(abstract_problem(1, 4, 4, false), Schedule::kAuto, 4).find("choose_schedule"), std::string::npos);
  for (Schedule s :
       {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst, Schedule::kNondeterministic}) {
    EXPECT_TRUE(make_schedule_plan(abstract_problem(1, 5, 3, true), s, 7).ok());
  }
}

TEST(Preconditions, AutoFollowsTheMeasurements) {
  EXPECT_EQ(choose_schedule(abstract_problem(2, 8, 8, false), 132), Schedule::kShift) << "full mask";
  EXPECT_EQ(choose_schedule(abstract_problem(2, 8, 16, false, 2), 132), Schedule::kShift) << "64x128 tiles";
  EXPECT_EQ(choose_schedule(abstract_problem(1, 8, 4, false), 132), Schedule::kAscending) << "shift not applicable";
  EXPECT_EQ(choose_schedule(abstract_problem(1, 65, 65, false), 132), Schedule::kAscending)
      << "past 64 key/value tiles";
  EXPECT_EQ(choose_schedule(abstract_problem(2, 8, 8, true), 132), Schedule::kShortestFirst);
  TiledProblem grouped = abstract_problem(2, 8, 8, true);
  grouped.group_size = 4;
  EXPECT_EQ(choose_schedule(grouped, 132), Schedule::kDescending) << "GQA groups folded into the jobs";
  grouped.group_splits = 4;
  EXPECT_EQ(choose_schedule(grouped, 132), Schedule::kShortestFirst) << "one query head per job";
  EXPECT_EQ(plan_schedule(abstract_problem(1, 8, 6, true), Schedule::kAuto, 132).plan.kind, Schedule::kShortestFirst);
  EXPECT_NE(std::string(choose_auto(grouped, 132).reason).find("shortest-first"), std::string::npos);
}

TEST(Preconditions, GroupSplitsReachTheTargetJobCount) {
  // 1 x 1 x 40 jobs per split: 264 jobs need 8 splits (320); 4 splits (160) are not enough.
  EXPECT_EQ(choose_group_splits(1, 1, 8, 40), 8);
  EXPECT_EQ(choose_group_splits(1, 1, 8, 70), 4) << "4 x 70 = 280 >= 264";
  EXPECT_EQ(choose_group_splits(4, 8, 8, 64), 1);
  EXPECT_EQ(choose_group_splits(1, 1, 6, 50), 6) << "only divisors of the group size are allowed";
}

}  // namespace
}  // namespace dash
