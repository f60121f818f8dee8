// Unit tests of the schedule layer's pure functions (src/schedule): the mask and tiling arithmetic
// against brute force, the wave bookkeeping, each schedule's job/visit/rank formulas against the
// notes' closed formulas, and the planner's preconditions with the reasons it gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "planner/expanded_schedule.hpp"
#include "planner/schedule_plan.hpp"
#include "schedule/schedule.hpp"
#include "schedule_test_support.hpp"

namespace dash {
namespace {

using testing::abstract_problem;
using testing::accumulation_order;
using testing::must_plan;

TEST(Mask, VisibleKeysAndFirstRowAgreeWithTheDefinition) {
  for (int sq : {1, 5, 8, 13}) {
    for (int sk : {1, 5, 8, 13}) {
      const MaskShape mask{sq, sk, true};
      for (int row = 0; row < sq; ++row) {
        for (int col = 0; col < sk; ++col) {
          EXPECT_EQ(mask.visible(row, col), col <= row + sk - sq) << sq << "x" << sk << " " << row << "," << col;
        }
      }
      for (int col = 0; col < sk; ++col) {
        int first = sq;
        for (int row = sq - 1; row >= 0; --row) first = mask.visible(row, col) ? row : first;
        EXPECT_EQ(mask.first_row_seeing(col), first) << sq << "x" << sk << " col " << col;
      }
      const MaskShape full{sq, sk, false};
      EXPECT_EQ(full.visible_keys(0), sk);
      EXPECT_EQ(full.first_row_seeing(sk - 1), 0);
    }
  }
}

// q_begin and num_contributors must describe exactly the tile pairs that share a visible element,
// including ragged last tiles, seqlen_q != seqlen_k and GQA's virtual query tiles.
TEST(TiledProblem, TileRangesMatchBruteForce) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    TiledProblem p{};
    p.batch = 1;
    p.heads_kv = 1;
    p.group_size = std::uniform_int_distribution<int>(1, 3)(rng);
    p.group_splits = 1;
    p.block_q = std::uniform_int_distribution<int>(1, 4)(rng);
    p.block_kv = p.block_q * std::uniform_int_distribution<int>(1, 3)(rng);
    p.seqlen_q = std::uniform_int_distribution<int>(1, 40)(rng);
    p.seqlen_k = std::uniform_int_distribution<int>(1, 40)(rng);
    p.causal = iter % 4 != 0;
    const MaskShape mask = p.mask();
    const int hpj = p.heads_per_job();
    for (int v = 0; v < p.num_q_tiles(); ++v) {
      const int q = v / hpj;
      int contributors = 0;
      for (int kv = 0; kv < p.num_kv_tiles(); ++kv) {
        bool sees = false;
        for (int row = q * p.block_q; row < std::min((q + 1) * p.block_q, p.seqlen_q); ++row) {
          for (int col = kv * p.block_kv; col < std::min((kv + 1) * p.block_kv, p.seqlen_k); ++col) {
            sees = sees || mask.visible(row, col);
          }
        }
        EXPECT_EQ(sees, v >= p.q_begin(kv)) << "v " << v << " kv " << kv;
        if (sees) {
          EXPECT_EQ(kv, contributors++) << "contributors must be a prefix of the key/value tiles";
        }
      }
      EXPECT_EQ(p.num_contributors(v), contributors) << "v " << v;
    }
  }
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
    const SchedulePlan plan = must_plan(abstract_problem(2, n, stride * n, true, stride), Schedule::kSymmetricShift,
                                        132);
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
  for (const TiledProblem& p : {grouped, grouped_full, abstract_problem(2, 4, 4, true), abstract_problem(2, 4, 4, false)}) {
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
  for (Schedule s : {Schedule::kAscending, Schedule::kDescending, Schedule::kShortestFirst,
                     Schedule::kNondeterministic}) {
    EXPECT_TRUE(make_schedule_plan(abstract_problem(1, 5, 3, true), s, 7).ok());
  }
}

TEST(Preconditions, AutoFollowsTheMeasurements) {
  EXPECT_EQ(choose_schedule(abstract_problem(2, 8, 8, false), 132), Schedule::kShift) << "full mask";
  EXPECT_EQ(choose_schedule(abstract_problem(2, 8, 16, false, 2), 132), Schedule::kShift) << "64x128 tiles";
  EXPECT_EQ(choose_schedule(abstract_problem(1, 8, 4, false), 132), Schedule::kAscending) << "shift not applicable";
  EXPECT_EQ(choose_schedule(abstract_problem(1, 65, 65, false), 132), Schedule::kAscending) << "past 64 key/value tiles";
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
