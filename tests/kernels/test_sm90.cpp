// GPU tests of the sm90 kernels through the public API: forward and backward against the float64 CPU
// reference on fresh random inputs of many shapes (ragged lengths, seqlen_q != seqlen_k both ways,
// GQA/MQA, full and causal) with poisoned outputs; every ragged remainder of the forward's other tile
// shapes; bitwise determinism of every deterministic schedule over 100 runs, alone and with a concurrent
// kernel on another stream, and the nondeterministic schedule caught by the same comparison; a
// watchdog turns any hang into a failure.
// Without a Hopper GPU (or without compiled kernels) every test skips and says why.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "harness/device_harness.hpp"
#include "schedule/tile_config.hpp"
#include "sm90_test_support.hpp"

namespace dash {
namespace {

using gpu_testing::count_unwritten_halves;
using gpu_testing::download_gradients;
using gpu_testing::Instance;
using gpu_testing::kWatchdogSeconds;
using gpu_testing::run_forward;
using gpu_testing::skip_reason;
using gpu_testing::wait_or_die;
using harness::DeviceBuffer;
using harness::Problem;

constexpr int kDeterminismRuns = 100;

struct ShapeCase {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  bool causal;
};

std::string shape_name(const ShapeCase& c) {
  std::ostringstream name;
  name << "B" << c.batch << "_Sq" << c.seqlen_q << "_Sk" << c.seqlen_k << "_Hq" << c.heads_q << "_Hkv" << c.heads_kv
       << (c.causal ? "_causal" : "_full");
  return name.str();
}

// Ragged lengths, seqlen_q != seqlen_k both ways (including rows that see no key), GQA and MQA.
const ShapeCase kShapes[] = {
    {2, 256, 256, 4, 4, false},  {2, 256, 256, 4, 4, true}, {1, 130, 130, 2, 2, true}, {1, 77, 300, 4, 2, true},
    {1, 77, 300, 4, 2, false},   {2, 300, 77, 4, 1, true},  {1, 1, 1, 1, 1, false},    {3, 1000, 1000, 2, 1, true},
    {1, 513, 1031, 8, 2, false}, {2, 640, 640, 6, 3, true},
};

// Every head dim and dtype, forward and backward (the backward runs the key split at 192 and 256, on 64x96 and 64x80
// tiles, bwd_mainloop_key_split.cuh; symmetric shift is refused there and skipped).
constexpr Instance kInstances[] = {{64, DType::kBF16},  {64, DType::kFP16},  {96, DType::kBF16},  {96, DType::kFP16},
                                   {128, DType::kBF16}, {128, DType::kFP16}, {192, DType::kBF16}, {192, DType::kFP16},
                                   {256, DType::kBF16}, {256, DType::kFP16}};
static_assert(
    [] {
      for (const Instance& inst : kInstances) {
        if (!has_backward_kernel(inst.head_dim)) return false;
      }
      return true;
    }(),
    "every instance the tests run has a backward kernel");

AttentionShape make_shape(const ShapeCase& c, const Instance& inst) {
  return gpu_testing::make_attention_shape(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.causal, inst);
}

// Runs the backward; returns false (without failing) when the schedule rejects the shape.
bool run_backward(Problem& p, Schedule schedule, cudaStream_t stream = nullptr) {
  size_t bytes = 0;
  Status s = backward_workspace_size(p.shape, schedule, &bytes);
  if (s.code() == StatusCode::kScheduleRejected && schedule != Schedule::kAuto) return false;
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok()) return false;
  if (p.workspace.bytes() < bytes) p.workspace = DeviceBuffer(bytes);
  s = backward(backward_args(p, schedule), p.workspace.get(), p.workspace.bytes(), stream);
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok()) return false;
  if (!harness::synchronize_with_watchdog(stream, kWatchdogSeconds)) {
    std::fprintf(stderr, "HANG: backward with schedule %s did not finish within %.0f s\n",
                 std::string(schedule_name(schedule)).c_str(), kWatchdogSeconds);
    std::_Exit(3);
  }
  return true;
}

class Sm90Correctness : public ::testing::TestWithParam<std::tuple<Instance, ShapeCase>> {};

TEST_P(Sm90Correctness, ForwardMatchesReference) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  Problem p = harness::make_problem(make_shape(c, inst), /*seed=*/0x5eed0000u + c.seqlen_q * 31 + inst.head_dim);
  run_forward(p);
  const auto tol = harness::tolerance_for(inst.dtype);
  const auto out = harness::compare(p.d_out, p.out, inst.dtype);
  const auto lse = harness::compare(p.d_lse, p.lse, inst.dtype, /*is_float=*/true);
  EXPECT_TRUE(harness::within(out, tol)) << "O: " << out.describe();
  EXPECT_TRUE(harness::within(lse, tol)) << "LSE: " << lse.describe();
}

TEST_P(Sm90Correctness, BackwardMatchesReferenceForEverySchedule) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  Problem p = harness::make_problem(make_shape(c, inst), /*seed=*/0xbac0000u + c.seqlen_k * 17 + inst.head_dim);
  const auto tol = harness::tolerance_for(inst.dtype);
  for (Schedule schedule : kAllSchedules) {
    p.d_dq.poison();
    p.d_dk.poison();
    p.d_dv.poison();
    if (!run_backward(p, schedule)) continue;
    const std::string name(schedule_name(schedule));
    const auto dq = harness::compare(p.d_dq, p.dq, inst.dtype);
    const auto dk = harness::compare(p.d_dk, p.dk, inst.dtype);
    const auto dv = harness::compare(p.d_dv, p.dv, inst.dtype);
    EXPECT_TRUE(harness::within(dq, tol)) << name << " dQ: " << dq.describe();
    EXPECT_TRUE(harness::within(dk, tol)) << name << " dK: " << dk.describe();
    EXPECT_TRUE(harness::within(dv, tol)) << name << " dV: " << dv.describe();
  }
}

std::string correctness_name(const ::testing::TestParamInfo<std::tuple<Instance, ShapeCase>>& info) {
  const auto& [inst, c] = info.param;
  std::ostringstream name;
  name << "hdim" << inst.head_dim << "_" << dtype_name(inst.dtype) << "_" << shape_name(c);
  return name.str();
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Correctness,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::ValuesIn(kShapes)),
                         correctness_name);

// --- ragged lengths: every remainder -------------------------------------------------------------
// A length that ends inside a warp's rows (not a multiple of 8) once made lanes leave a full-mask
// shuffle early, and the forward hung. These tests run every remainder mod 128 of seqlen_q and of
// seqlen_k, at batch 3 with enough tiles that each persistent CTA runs several, under the watchdog,
// and check that every output element was written (outputs start poisoned with NaN). Values are
// checked against the float64 reference for a sample of remainders (kReferenceEvery).

constexpr int kTile = 128;
constexpr int64_t kRaggedBase = 1024;  // 8 or 9 query tiles x 16 heads x batch 3: about 3 tiles per CTA
constexpr int kReferenceEvery = 16;

size_t count_nan_floats(const DeviceBuffer& buffer, size_t count) {
  std::vector<float> values(count);
  buffer.download(values.data(), count * sizeof(float));
  size_t bad = 0;
  for (float v : values) bad += std::isnan(v);
  return bad;
}

// The shapes of one remainder sweep: seqlen_q (or seqlen_k) runs over kRaggedBase + [0, kTile).
ShapeCase ragged_case(int remainder, bool vary_keys, bool causal) {
  const int64_t ragged = kRaggedBase + remainder;
  return vary_keys ? ShapeCase{3, kRaggedBase, ragged, 16, 4, causal}
                   : ShapeCase{3, ragged, kRaggedBase, 16, 4, causal};
}

// Whether the forward of shape c wrote every element of O and LSE (outputs start poisoned with NaN).
::testing::AssertionResult forward_wrote_everything(const Problem& p, const ShapeCase& c, DType dtype) {
  const size_t rows = static_cast<size_t>(c.batch * c.heads_q * c.seqlen_q);
  const size_t out = count_unwritten_halves(p.d_out, p.q_elements(), dtype);
  const size_t lse = count_nan_floats(p.d_lse, rows);
  if (out == 0 && lse == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << shape_name(c) << ": " << out << " elements of O and " << lse
                                       << " of LSE not written";
}

// Runs the forward on p (made with its reference, of shape c) and compares O and LSE with the reference.
void expect_forward_matches_reference(Problem& p, const ShapeCase& c, DType dtype) {
  run_forward(p);
  const auto tol = harness::tolerance_for(dtype);
  const auto out = harness::compare(p.d_out, p.out, dtype);
  const auto lse = harness::compare(p.d_lse, p.lse, dtype, /*is_float=*/true);
  EXPECT_TRUE(harness::within(out, tol)) << shape_name(c) << " O: " << out.describe();
  EXPECT_TRUE(harness::within(lse, tol)) << shape_name(c) << " LSE: " << lse.describe();
}

class Sm90RaggedSweep : public ::testing::TestWithParam<std::tuple<Instance, bool>> {};

TEST_P(Sm90RaggedSweep, EveryRemainderTerminatesWritesEveryElementAndMatchesReferenceOnSamples) {
  const auto& [inst, vary_keys] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  // One set of inputs sized for the longest case; each case views a packed prefix of it.
  Problem big = harness::make_problem(make_shape(ragged_case(kTile - 1, vary_keys, true), inst), 0x4a66ed,
                                      /*with_reference=*/false);
  const AttentionShape largest = big.shape;
  for (bool causal : {false, true}) {
    for (int remainder = 0; remainder < kTile; ++remainder) {
      const ShapeCase c = ragged_case(remainder, vary_keys, causal);
      big.shape = make_shape(c, inst);
      run_forward(big);
      ASSERT_TRUE(forward_wrote_everything(big, c, inst.dtype));
      harness::use_forward_outputs_for_backward(big);
      big.d_dq.poison();
      big.d_dk.poison();
      big.d_dv.poison();
      ASSERT_TRUE(run_backward(big, Schedule::kAuto)) << shape_name(c);
      ASSERT_EQ(count_unwritten_halves(big.d_dq, big.q_elements(), inst.dtype), 0u) << shape_name(c) << ": dQ";
      ASSERT_EQ(count_unwritten_halves(big.d_dk, big.kv_elements(), inst.dtype), 0u) << shape_name(c) << ": dK";
      ASSERT_EQ(count_unwritten_halves(big.d_dv, big.kv_elements(), inst.dtype), 0u) << shape_name(c) << ": dV";
      if (remainder % kReferenceEvery != kReferenceEvery - 1) continue;
      // Values: the same lengths with fewer heads, against the float64 reference.
      ShapeCase small = c;
      small.heads_q = 2;
      small.heads_kv = 1;
      Problem p = harness::make_problem(make_shape(small, inst), 0x4a66ed + remainder);
      expect_forward_matches_reference(p, small, inst.dtype);
      ASSERT_TRUE(run_backward(p, Schedule::kAuto));
      const auto tol = harness::tolerance_for(inst.dtype);
      const auto dq = harness::compare(p.d_dq, p.dq, inst.dtype);
      const auto dk = harness::compare(p.d_dk, p.dk, inst.dtype);
      EXPECT_TRUE(harness::within(dq, tol)) << shape_name(small) << " dQ: " << dq.describe();
      EXPECT_TRUE(harness::within(dk, tol)) << shape_name(small) << " dK: " << dk.describe();
    }
  }
  big.shape = largest;
}

std::string ragged_sweep_name(const ::testing::TestParamInfo<std::tuple<Instance, bool>>& info) {
  const auto& [inst, vary_keys] = info.param;
  return "hdim" + std::to_string(inst.head_dim) + "_" + std::string(dtype_name(inst.dtype)) +
         (vary_keys ? "_seqlen_k" : "_seqlen_q");
}

INSTANTIATE_TEST_SUITE_P(Remainders, Sm90RaggedSweep,
                         ::testing::Combine(::testing::Values(Instance{64, DType::kBF16}, Instance{96, DType::kBF16},
                                                              Instance{128, DType::kFP16}, Instance{192, DType::kBF16},
                                                              Instance{256, DType::kFP16}),
                                            ::testing::Bool()),
                         ragged_sweep_name);

// --- the forward's other tile shapes: every remainder --------------------------------------------
// Besides 128x128, the forward runs 192x128 tiles with three MMA warpgroups at d = 64 from
// kForwardTallFromFull query rows (full mask) and kForwardTallFromCausal (causal), and 128x176 tiles at d =
// 128 under a full mask from kForwardWideFromKeys keys, which store O without a staging tile. These run every
// remainder of the tile's length (seqlen_q mod 192, seqlen_k mod 176), under the watchdog, and check that
// every output element was written and, on samples, the values against the float64 reference. The other
// length stays short to keep the reference cheap; under the causal mask the rows before seqlen_q - seqlen_k
// see no key, so the tiles that visit no key/value tile run too.

// Runs the forward for remainder 0 .. count - 1 of shape_for(remainder, heads_q, heads_kv) (batch 2, 8 query
// heads on 2 key/value heads), then on every reference_every-th remainder one head against the reference. The
// buffers hold remainder count - 1's shape, so shape_for's lengths must not fall as the remainder rises.
template <class ShapeFor>
void sweep_forward_remainders(const Instance& inst, int count, int reference_every, int expected_block_q,
                              int expected_block_kv, ShapeFor shape_for) {
  Problem big = harness::make_problem(make_shape(shape_for(count - 1, 8, 2), inst), 0x7a11, /*with_reference=*/false);
  const AttentionShape largest = big.shape;
  for (int remainder = 0; remainder < count; ++remainder) {
    const ShapeCase c = shape_for(remainder, 8, 2);
    ASSERT_TRUE(c.seqlen_q <= largest.seqlen_q && c.seqlen_k <= largest.seqlen_k)
        << shape_name(c) << ": longer than the buffers, which hold the last remainder's shape";
    const TileShape tile = forward_tile_shape(inst.head_dim, c.causal, c.seqlen_q, c.seqlen_k);
    ASSERT_TRUE(tile.block_q == expected_block_q && tile.block_kv == expected_block_kv)
        << shape_name(c) << ": the shape no longer runs the tiles this test is for";
    big.shape = make_shape(c, inst);
    run_forward(big);
    ASSERT_TRUE(forward_wrote_everything(big, c, inst.dtype));
    if (remainder % reference_every != reference_every - 1) continue;
    ShapeCase small = shape_for(remainder, 1, 1);
    small.batch = 1;
    Problem p = harness::make_problem(make_shape(small, inst), 0x7a11 + remainder);
    expect_forward_matches_reference(p, small, inst.dtype);
  }
  big.shape = largest;
}

constexpr int64_t kShortKeys = 1500;
constexpr int64_t kShortQueries = 1031;

class Sm90TallForwardTiles : public ::testing::TestWithParam<std::tuple<Instance, bool>> {};

TEST_P(Sm90TallForwardTiles, EveryRemainderTerminatesWritesEveryElementAndMatchesReferenceOnSamples) {
  const auto& [inst, causal] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  const int64_t base = causal ? kForwardTallFromCausal : kForwardTallFromFull;
  sweep_forward_remainders(inst, kForwardTallBlockQ, /*reference_every=*/96, kForwardTallBlockQ, kForwardBlockKv,
                           [&](int remainder, int64_t heads_q, int64_t heads_kv) {
                             return ShapeCase{2, base + remainder, kShortKeys, heads_q, heads_kv, causal};
                           });
}

class Sm90WideForwardTiles : public ::testing::TestWithParam<Instance> {};

TEST_P(Sm90WideForwardTiles, EveryRemainderTerminatesWritesEveryElementAndMatchesReferenceOnSamples) {
  const Instance inst = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  sweep_forward_remainders(inst, kForwardWideBlockKv, /*reference_every=*/88, kForwardBlockQ, kForwardWideBlockKv,
                           [&](int remainder, int64_t heads_q, int64_t heads_kv) {
                             return ShapeCase{2,       kShortQueries, kForwardWideFromKeys + remainder,
                                              heads_q, heads_kv,      false};
                           });
}

// The short tiles at d = 64 under the full mask (64 query rows, one MMA warpgroup, two CTAs per SM): every remainder
// of seqlen_q mod 64 and of seqlen_k mod 128 up to kForwardShortUpToFull, the other length at the bound.
class Sm90ShortForwardTiles : public ::testing::TestWithParam<std::tuple<Instance, bool>> {};

TEST_P(Sm90ShortForwardTiles, EveryRemainderTerminatesWritesEveryElementAndMatchesReferenceOnSamples) {
  const auto& [inst, query_remainders] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  const TileShape tile = forward_short_tile_shape();
  const int count = query_remainders ? tile.block_q : tile.block_kv;
  const int64_t first = kForwardShortUpToFull - count + 1;  // the last `count` lengths on short tiles
  sweep_forward_remainders(inst, count, /*reference_every=*/count / 2, tile.block_q, tile.block_kv,
                           [&](int remainder, int64_t heads_q, int64_t heads_kv) {
                             const int64_t varied = first + remainder;
                             return query_remainders
                                        ? ShapeCase{2, varied, kForwardShortUpToFull, heads_q, heads_kv, false}
                                        : ShapeCase{2, kForwardShortUpToFull, varied, heads_q, heads_kv, false};
                           });
}

std::string short_tiles_name(const ::testing::TestParamInfo<std::tuple<Instance, bool>>& info) {
  const auto& [inst, query_remainders] = info.param;
  return "hdim" + std::to_string(inst.head_dim) + "_" + std::string(dtype_name(inst.dtype)) +
         (query_remainders ? "_query_remainders" : "_key_remainders");
}

std::string tall_tiles_name(const ::testing::TestParamInfo<std::tuple<Instance, bool>>& info) {
  const auto& [inst, causal] = info.param;
  return "hdim" + std::to_string(inst.head_dim) + "_" + std::string(dtype_name(inst.dtype)) +
         (causal ? "_causal" : "_full");
}

std::string instance_name(const ::testing::TestParamInfo<Instance>& info) {
  return "hdim" + std::to_string(info.param.head_dim) + "_" + std::string(dtype_name(info.param.dtype));
}

INSTANTIATE_TEST_SUITE_P(Remainders, Sm90TallForwardTiles,
                         ::testing::Combine(::testing::Values(Instance{64, DType::kBF16}, Instance{64, DType::kFP16}),
                                            ::testing::Bool()),
                         tall_tiles_name);
INSTANTIATE_TEST_SUITE_P(Remainders, Sm90ShortForwardTiles,
                         ::testing::Combine(::testing::Values(Instance{64, DType::kBF16}, Instance{64, DType::kFP16}),
                                            ::testing::Bool()),
                         short_tiles_name);
static_assert(forward_has_short_tiles(64), "the short-tile remainder tests run the d = 64 instances");
INSTANTIATE_TEST_SUITE_P(Remainders, Sm90WideForwardTiles,
                         ::testing::Values(Instance{128, DType::kBF16}, Instance{128, DType::kFP16}), instance_name);
static_assert(forward_has_tall_tiles(64) && forward_has_wide_tiles(128),
              "the remainder tests above run the d = 64 and d = 128 instances");

// The CTA pairs (forward_may_pair, in builds with DASH_FORWARD_PAIRED_CTAS): two CTAs of a cluster load half of
// each K and V tile into both, and a pair that loaded different tiles, or different counts of them, would compute
// from the other's keys or wait forever. Under a full mask at d = 128, 192 and 256: every remainder of seqlen_q
// within four query tiles (the pairs need an even count), and at d = 128 every remainder of seqlen_k mod the wide
// tiles' 176 keys, under the watchdog; every element written, samples against the float64 reference. The shapes'
// 8 query heads on 2 key/value heads put both tiles of a pair on one key/value head of a GQA group.
class Sm90PairedForwardTiles : public ::testing::TestWithParam<std::tuple<Instance, bool>> {};

TEST_P(Sm90PairedForwardTiles, EveryRemainderTerminatesWritesEveryElementAndMatchesReferenceOnSamples) {
  const auto& [inst, query_remainders] = GetParam();
  if (!kForwardPairedCtasBuilt) GTEST_SKIP() << "this build has no paired forward kernels (DASH_FORWARD_PAIRED_CTAS)";
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  constexpr int kPairedQueryTiles = 2 * kForwardPairCtas;
  constexpr int64_t kLongestQueries = int64_t{kPairedQueryTiles} * kForwardBlockQ;
  const TileShape tile =
      query_remainders ? forward_base_tile_shape(inst.head_dim) : TileShape{kForwardBlockQ, kForwardWideBlockKv};
  const int count = query_remainders ? kForwardBlockQ : kForwardWideBlockKv;
  const auto shape_for = [&](int remainder, int64_t heads_q, int64_t heads_kv) {
    // The query lengths rise to kLongestQueries, the buffers' (sweep_forward_remainders), all in as many tiles.
    return query_remainders
               ? ShapeCase{2, kLongestQueries - (count - 1) + remainder, kShortKeys, heads_q, heads_kv, false}
               : ShapeCase{2, kLongestQueries, kForwardWideFromKeys + remainder, heads_q, heads_kv, false};
  };
  for (const int remainder : {0, count - 1}) {
    const ShapeCase c = shape_for(remainder, 8, 2);
    ASSERT_TRUE(forward_kernel_choice(inst.head_dim, false, false, false, false, false, c.seqlen_q, c.seqlen_k).paired)
        << shape_name(c) << ": the shape no longer runs the CTA pairs this test is for";
  }
  sweep_forward_remainders(inst, count, /*reference_every=*/count / 4, tile.block_q, tile.block_kv, shape_for);
}

std::string paired_tiles_name(const ::testing::TestParamInfo<std::tuple<Instance, bool>>& info) {
  const auto& [inst, query_remainders] = info.param;
  return "hdim" + std::to_string(inst.head_dim) + "_" + std::string(dtype_name(inst.dtype)) +
         (query_remainders ? "_query_remainders" : "_wide_key_remainders");
}

INSTANTIATE_TEST_SUITE_P(Remainders, Sm90PairedForwardTiles,
                         ::testing::Values(std::tuple{Instance{128, DType::kBF16}, true},
                                           std::tuple{Instance{128, DType::kFP16}, false},
                                           std::tuple{Instance{192, DType::kFP16}, true},
                                           std::tuple{Instance{256, DType::kBF16}, true}),
                         paired_tiles_name);
static_assert(forward_has_paired_ctas(128) && forward_has_paired_ctas(192) && forward_has_paired_ctas(256) &&
                  forward_has_wide_tiles(128),
              "the paired remainder tests run the d = 128, 192 and 256 instances, and d = 128's wide tiles");

// The narrower key/value tiles of d = 192 (128x112) and d = 256 (128x80), which also store O without a staging
// tile: every remainder of seqlen_k mod block_kv, under the full and the causal mask (which also takes them).
class Sm90NarrowForwardTiles : public ::testing::TestWithParam<std::tuple<Instance, bool>> {};

TEST_P(Sm90NarrowForwardTiles, EveryRemainderTerminatesWritesEveryElementAndMatchesReferenceOnSamples) {
  const auto& [inst, causal] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  const TileShape tile = forward_base_tile_shape(inst.head_dim);
  sweep_forward_remainders(inst, tile.block_kv, /*reference_every=*/tile.block_kv / 2, tile.block_q, tile.block_kv,
                           [&](int remainder, int64_t heads_q, int64_t heads_kv) {
                             return ShapeCase{2,       kShortQueries, kForwardWideFromKeys + remainder,
                                              heads_q, heads_kv,      causal};
                           });
}

INSTANTIATE_TEST_SUITE_P(Remainders, Sm90NarrowForwardTiles,
                         ::testing::Combine(::testing::Values(Instance{192, DType::kBF16}, Instance{192, DType::kFP16},
                                                              Instance{256, DType::kBF16}, Instance{256, DType::kFP16}),
                                            ::testing::Bool()),
                         tall_tiles_name);
static_assert(forward_base_tile_shape(192).block_kv == kForwardBlockKvD192 &&
                  forward_base_tile_shape(256).block_kv == kForwardBlockKvD256,
              "the remainder tests above run the d = 192 and d = 256 tiles");

// --- determinism ----------------------------------------------------------------------------------

// Runs the backward kDeterminismRuns times; every other run a forward on a second stream competes for
// the SMs (the persistent CTAs then start at different times). Returns how many runs differed from
// the first, bit for bit.
int differing_runs(Problem& p, Problem& load, Schedule schedule) {
  cudaStream_t side = nullptr;
  harness::check_cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreate");
  size_t load_bytes = 0;
  EXPECT_TRUE(forward_workspace_size(load.shape, &load_bytes).ok());
  if (load.workspace.bytes() < load_bytes) load.workspace = DeviceBuffer(load_bytes);
  std::vector<uint16_t> first;
  int differing = 0;
  for (int run = 0; run < kDeterminismRuns; ++run) {
    if (run % 2 == 1) {
      const Status s = forward(forward_args(load), load.workspace.get(), load.workspace.bytes(), side);
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    if (!run_backward(p, schedule)) break;
    if (!harness::synchronize_with_watchdog(side, kWatchdogSeconds)) std::_Exit(3);
    std::vector<uint16_t> bits = download_gradients(p);
    if (run == 0) {
      first = std::move(bits);
    } else if (std::memcmp(bits.data(), first.data(), bits.size() * 2) != 0) {
      ++differing;
    }
  }
  cudaStreamDestroy(side);
  return differing;
}

class Sm90Determinism : public ::testing::TestWithParam<std::tuple<Instance, ShapeCase>> {};

// Inputs for determinism runs: random Q, K, V, dO with a fixed O and LSE (any finite values exercise
// the same summation order; the numbers themselves are checked by Sm90Correctness).
Problem make_determinism_problem(const AttentionShape& shape) {
  Problem p = harness::make_problem(shape, /*seed=*/77, /*with_reference=*/false);
  const size_t rows = static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q);
  p.d_ref_out.upload(std::vector<uint16_t>(p.q_elements(), harness::to_bits(0.5f, shape.dtype)).data(),
                     p.q_elements() * 2);
  p.d_ref_lse.upload(std::vector<float>(rows, 6.0f).data(), rows * sizeof(float));
  return p;
}

Problem make_load_problem(const AttentionShape& shape) {
  AttentionShape load_shape = shape;
  load_shape.batch = 4;
  load_shape.seqlen_q = load_shape.seqlen_k = 4096;
  return harness::make_problem(load_shape, /*seed=*/78, /*with_reference=*/false);
}

TEST_P(Sm90Determinism, EveryDeterministicScheduleIsBitwiseIdentical) {
  const auto& [inst, c] = GetParam();
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  Problem p = make_determinism_problem(make_shape(c, inst));
  Problem load = make_load_problem(p.shape);
  for (Schedule schedule : kAllSchedules) {
    if (schedule == Schedule::kNondeterministic) continue;
    const int differing = differing_runs(p, load, schedule);
    EXPECT_EQ(differing, 0) << schedule_name(schedule) << ": " << differing << " of " << kDeterminismRuns - 1
                            << " runs differed from the first";
  }
}

// At least three key/value tiles reach every dQ tile (two contributions commute bit-exactly).
const ShapeCase kDeterminismShapes[] = {
    {2, 1024, 1024, 4, 4, false}, {2, 1024, 1024, 4, 4, true}, {1, 1536, 1536, 8, 2, true}};

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Determinism,
                         ::testing::Combine(::testing::ValuesIn(kInstances), ::testing::ValuesIn(kDeterminismShapes)),
                         correctness_name);

// Negative control: the comparison above must be able to fail. Under the full mask every key/value
// tile of a head reaches the same query tile at the same moment, so unordered adds race; under the
// causal mask arrivals are steps apart and the unordered order rarely changes, which is why the
// control uses the full mask. One control per head dim with a backward, on the first dtype compiled.
class Sm90DeterminismControl : public ::testing::TestWithParam<int> {};

TEST_P(Sm90DeterminismControl, NondeterministicScheduleIsCaught) {
  const int head_dim = GetParam();
  for (const Instance& inst : kInstances) {
    if (inst.head_dim != head_dim || !skip_reason(inst).empty()) continue;
    Problem p = make_determinism_problem(make_shape({2, 1024, 1024, 4, 4, false}, inst));
    Problem load = make_load_problem(p.shape);
    const int differing = differing_runs(p, load, Schedule::kNondeterministic);
    EXPECT_GT(differing, 0) << "hdim " << inst.head_dim << " " << dtype_name(inst.dtype)
                            << ": the nondeterministic schedule gave identical bits in all " << kDeterminismRuns
                            << " runs, so the determinism test could not detect nondeterminism";
    return;
  }
  GTEST_SKIP() << skip_reason(Instance{head_dim, DType::kBF16});
}

INSTANTIATE_TEST_SUITE_P(HeadDims, Sm90DeterminismControl, ::testing::Values(64, 96, 128, 192, 256),
                         [](const ::testing::TestParamInfo<int>& head_dim) {
                           return "hdim" + std::to_string(head_dim.param);
                         });

// --- bad input on a real device -------------------------------------------------------------------

TEST(Sm90Api, RejectsHostPointersSmallWorkspacesAndInapplicableSchedules) {
  const Instance inst{128, DType::kBF16};
  if (const std::string why = skip_reason(inst); !why.empty()) GTEST_SKIP() << why;
  Problem p = harness::make_problem(make_shape({1, 256, 256, 2, 2, true}, inst), 5, /*with_reference=*/false);
  BackwardArgs args = backward_args(p, Schedule::kShift);
  size_t bytes = 0;
  EXPECT_EQ(backward_workspace_size(p.shape, Schedule::kShift, &bytes).code(), StatusCode::kScheduleRejected);
  ASSERT_TRUE(backward_workspace_size(p.shape, Schedule::kAuto, &bytes).ok());
  DeviceBuffer workspace(bytes);
  args.schedule = Schedule::kAuto;
  EXPECT_EQ(backward(args, workspace.get(), bytes - 1, nullptr).code(), StatusCode::kWorkspaceTooSmall);
  std::vector<uint16_t> host(p.q_elements());
  args.q.data = host.data();
  EXPECT_EQ(backward(args, workspace.get(), bytes, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dash
