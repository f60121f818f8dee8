// Tests of the CPU reference attention (src/reference): backward against central finite differences,
// forward and backward against an independent naive float64 formulation written here, float32 against
// float64, rows the mask hides entirely, and that every output element is written. All inputs are fresh
// random tensors over ragged, GQA/MQA, causal and full shapes, with and without FlashAttention's sliding
// window (alone, one-sided, two-sided, and with causal) and softcapping (tight and loose caps; a far cap changes
// nothing, a tight one bounds the scores).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dash/attention.hpp"
#include "reference/attention_reference.hpp"

namespace dash::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct ShapeCase {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  bool causal;
  float scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  SlidingWindow window{};
  double softcap = 0.0;  // > 0: scores capped to softcap * tanh(score / softcap)

  AttentionShape shape() const {
    AttentionShape s;
    s.batch = batch;
    s.seqlen_q = seqlen_q;
    s.seqlen_k = seqlen_k;
    s.heads_q = heads_q;
    s.heads_kv = heads_kv;
    s.head_dim = head_dim;
    s.softmax_scale = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
    s.causal = causal;
    return s;
  }
  size_t q_size() const { return static_cast<size_t>(batch * seqlen_q * heads_q * head_dim); }
  size_t kv_size() const { return static_cast<size_t>(batch * seqlen_k * heads_kv * head_dim); }
  size_t lse_size() const { return static_cast<size_t>(batch * heads_q * seqlen_q); }
};

// Readable test names and parameter printouts, e.g. B2_Sq37_Sk7_Hq4_Hkv1_D16_causal.
void PrintTo(const ShapeCase& c, std::ostream* os) {
  *os << "B" << c.batch << "_Sq" << c.seqlen_q << "_Sk" << c.seqlen_k << "_Hq" << c.heads_q << "_Hkv" << c.heads_kv
      << "_D" << c.head_dim << (c.causal ? "_causal" : "_full");
  if (c.window.left >= 0 || c.window.right >= 0) {
    const auto side = [](int bound) { return bound < 0 ? std::string("inf") : std::to_string(bound); };
    *os << "_window" << side(c.window.left) << "x" << side(c.window.right);
  }
  if (c.softcap > 0) *os << "_softcap" << static_cast<int>(c.softcap * 10) << "tenths";
}

// FlashAttention's rule, written out here rather than taken from schedule/mask.hpp: row i sees key j iff
// i + d - left <= j <= i + d + right (d = seqlen_k - seqlen_q), a negative bound leaving its side open, and
// causal setting right to 0.
bool visible(const ShapeCase& c, int64_t i, int64_t j) {
  const int64_t diagonal = i + c.seqlen_k - c.seqlen_q;
  const int64_t right = c.causal ? 0 : c.window.right;
  const bool after_left = c.window.left < 0 || j >= diagonal - c.window.left;
  const bool before_right = right < 0 || j <= diagonal + right;
  return after_left && before_right;
}

std::string case_name(const testing::TestParamInfo<ShapeCase>& info) { return testing::PrintToString(info.param); }

// Offset of element (b, s, h, d) in a packed (B, S, H, D) tensor.
struct Packed {
  int64_t seqlen, heads, dim;
  size_t operator()(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return static_cast<size_t>(((b * seqlen + s) * heads + h) * dim + d);
  }
};

template <class T>
struct Inputs {
  std::vector<T> q, k, v, dout;
};

template <class T>
struct Results {
  std::vector<T> out, lse, dq, dk, dv;
};

// Uniform in [-1, 1): with softmax_scale = 1/sqrt(D) the scores have standard deviation ~0.6, so softmax
// rows are neither flat nor one-hot and every term of the gradient matters.
std::vector<double> random_tensor(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);  // float draws, so the float32 run sees exactly the same inputs
  return x;
}

Inputs<double> random_inputs(const ShapeCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs<double> in;
  in.q = random_tensor(c.q_size(), rng);
  in.k = random_tensor(c.kv_size(), rng);
  in.v = random_tensor(c.kv_size(), rng);
  in.dout = random_tensor(c.q_size(), rng);
  return in;
}

template <class T>
std::vector<T> cast(const std::vector<double>& x) {
  std::vector<T> y(x.size());
  std::transform(x.begin(), x.end(), y.begin(), [](double e) { return static_cast<T>(e); });
  return y;
}

template <class T>
Results<T> run_reference(const ShapeCase& c, const Inputs<double>& in64, T poison = T(0)) {
  const Inputs<T> in{cast<T>(in64.q), cast<T>(in64.k), cast<T>(in64.v), cast<T>(in64.dout)};
  Results<T> r;
  r.out.assign(c.q_size(), poison);
  r.lse.assign(c.lse_size(), poison);
  r.dq.assign(c.q_size(), poison);
  r.dk.assign(c.kv_size(), poison);
  r.dv.assign(c.kv_size(), poison);
  const AttentionShape shape = c.shape();
  attention_forward(shape, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), c.window, c.softcap);
  attention_backward(shape, in.q.data(), in.k.data(), in.v.data(), r.out.data(), in.dout.data(), r.lse.data(),
                     r.dq.data(), r.dk.data(), r.dv.data(), c.window, c.softcap);
  return r;
}

// The textbook formulation, independent of the reference's loop structure: per (batch, head) materialize
// S = scale Q K^T, capped to c tanh(S / c) under a softcap c, with hidden entries at -inf, P = softmax(S) row by
// row, O = P V, then dV = P^T dO, dP = dO V^T, dS = P o (dP - rowsum(dO o O)) o (1 - (S / c)^2) under a softcap
// (the derivative of the cap, written from the capped S), dQ = scale dS K, dK = scale dS^T Q.
// The mask is visible() above.
Results<double> naive_attention(const ShapeCase& c, const Inputs<double>& in) {
  const int64_t sq = c.seqlen_q, sk = c.seqlen_k, dim = c.head_dim;
  const Packed pq{sq, c.heads_q, dim}, pk{sk, c.heads_kv, dim};
  const double scale = c.shape().softmax_scale;
  Results<double> r;
  r.out.assign(c.q_size(), 0.0);
  r.lse.assign(c.lse_size(), 0.0);
  r.dq.assign(c.q_size(), 0.0);
  r.dk.assign(c.kv_size(), 0.0);
  r.dv.assign(c.kv_size(), 0.0);
  using Matrix = std::vector<std::vector<double>>;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      const int64_t hk = h / (c.heads_q / c.heads_kv);
      Matrix s(sq, std::vector<double>(sk)), p(sq, std::vector<double>(sk, 0.0)), dp = p;
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = 0; j < sk; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += in.q[pq(b, i, h, d)] * in.k[pk(b, j, hk, d)];
          const double capped = c.softcap > 0 ? c.softcap * std::tanh(scale * dot / c.softcap) : scale * dot;
          s[i][j] = visible(c, i, j) ? capped : -kInf;
        }
        const double row_max = *std::max_element(s[i].begin(), s[i].end());
        double& lse = r.lse[static_cast<size_t>((b * c.heads_q + h) * sq + i)];
        if (row_max == -kInf) {  // no visible key: P row stays 0, so O and every gradient of the row are 0
          lse = -kInf;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < sk; ++j) {
          p[i][j] = std::exp(s[i][j] - row_max);
          sum += p[i][j];
        }
        for (int64_t j = 0; j < sk; ++j) p[i][j] /= sum;
        lse = row_max + std::log(sum);
      }
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = 0; j < sk; ++j) {
          for (int64_t d = 0; d < dim; ++d) {
            r.out[pq(b, i, h, d)] += p[i][j] * in.v[pk(b, j, hk, d)];
            r.dv[pk(b, j, hk, d)] += p[i][j] * in.dout[pq(b, i, h, d)];
            dp[i][j] += in.dout[pq(b, i, h, d)] * in.v[pk(b, j, hk, d)];
          }
        }
      }
      for (int64_t i = 0; i < sq; ++i) {
        double delta = 0;
        for (int64_t d = 0; d < dim; ++d) delta += in.dout[pq(b, i, h, d)] * r.out[pq(b, i, h, d)];
        for (int64_t j = 0; j < sk; ++j) {
          const double through_cap = c.softcap > 0 && s[i][j] > -kInf ? 1 - std::pow(s[i][j] / c.softcap, 2) : 1;
          const double ds = p[i][j] * (dp[i][j] - delta) * through_cap;
          for (int64_t d = 0; d < dim; ++d) {
            r.dq[pq(b, i, h, d)] += scale * ds * in.k[pk(b, j, hk, d)];
            r.dk[pk(b, j, hk, d)] += scale * ds * in.q[pq(b, i, h, d)];
          }
        }
      }
    }
  }
  return r;
}

template <class T>
void expect_no_nan(const Results<T>& r) {
  const auto no_nan = [](const std::vector<T>& x) {
    return std::none_of(x.begin(), x.end(), [](T e) { return std::isnan(e); });
  };
  EXPECT_TRUE(no_nan(r.out)) << "out";
  EXPECT_TRUE(no_nan(r.lse)) << "lse";
  EXPECT_TRUE(no_nan(r.dq)) << "dq";
  EXPECT_TRUE(no_nan(r.dk)) << "dk";
  EXPECT_TRUE(no_nan(r.dv)) << "dv";
}

// Largest |actual - expected| relative to max(1, max |expected|). Entries are sums whose terms may cancel,
// so an element-wise relative error would be meaningless near zero; the tensor's own scale is the yardstick.
// Infinite expected entries (LSE of a row that sees no key) must match exactly; NaN never passes.
template <class T>
testing::AssertionResult all_close(const std::vector<T>& actual, const std::vector<double>& expected, double tol) {
  if (actual.size() != expected.size()) return testing::AssertionFailure() << "size mismatch";
  double magnitude = 1.0;
  for (double e : expected) {
    if (std::isfinite(e)) magnitude = std::max(magnitude, std::abs(e));
  }
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]), e = expected[i];
    if (std::isnan(a) || (std::isinf(e) && a != e)) {
      return testing::AssertionFailure() << "element " << i << " is " << a << ", expected " << e;
    }
    const double err = std::isinf(e) ? 0.0 : std::abs(a - e) / magnitude;
    if (err > worst) {
      worst = err;
      worst_at = i;
    }
  }
  if (worst > tol) {
    return testing::AssertionFailure() << "element " << worst_at << " is " << static_cast<double>(actual[worst_at])
                                       << ", expected " << expected[worst_at] << ": error " << worst
                                       << " (relative to tensor scale " << magnitude << ") > " << tol;
  }
  return testing::AssertionSuccess();
}

// --- 1. Backward vs central finite differences -------------------------------------------------------

class FiniteDifference : public testing::TestWithParam<ShapeCase> {};

// L = sum(out * dout) through the float64 reference forward: the scalar whose gradient backward returns.
double loss(const ShapeCase& c, const Inputs<double>& in) {
  std::vector<double> out(c.q_size()), lse(c.lse_size());
  attention_forward(c.shape(), in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), c.window, c.softcap);
  return std::inner_product(out.begin(), out.end(), in.dout.begin(), 0.0);
}

// Checks dL/dx[e] against (L(x + h) - L(x - h)) / 2h for every element of x when it is small, else for a
// random sample. With h = 1e-4 the truncation error is h^2/6 |L'''| ~ 1e-9 (third derivatives of the
// softmax are O(1) for these inputs) and rounding adds ~eps |L| / h ~ 1e-11. The worst error seen over these
// shapes is ~2e-10 relative to max(1, |dL/dx|), so a tolerance of 1e-8 keeps a 50x margin, while any real bug
// (a dropped scale, a missed GQA head, a wrong mask term) shows up as an O(1e-2) or larger error.
void check_gradient(const ShapeCase& c, Inputs<double>& in, std::vector<double>& x, const std::vector<double>& grad,
                    const char* name, std::mt19937& rng) {
  constexpr double kStep = 1e-4;
  constexpr double kTol = 1e-8;
  constexpr size_t kMaxSamples = 48;
  std::vector<size_t> elements(x.size());
  std::iota(elements.begin(), elements.end(), size_t{0});
  if (elements.size() > kMaxSamples) {
    std::shuffle(elements.begin(), elements.end(), rng);
    elements.resize(kMaxSamples);
  }
  double worst = 0.0, worst_numeric = 0.0;
  size_t worst_at = elements.front();
  for (size_t e : elements) {
    const double saved = x[e];
    x[e] = saved + kStep;
    const double plus = loss(c, in);
    x[e] = saved - kStep;
    const double minus = loss(c, in);
    x[e] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    const double err = std::abs(grad[e] - numeric) / std::max(1.0, std::abs(grad[e]));
    if (!(err <= worst)) {  // also catches a NaN gradient
      worst = err;
      worst_numeric = numeric;
      worst_at = e;
    }
  }
  EXPECT_LE(worst, kTol) << name << "[" << worst_at << "]: backward " << grad[worst_at] << ", finite difference "
                         << worst_numeric << " (" << elements.size() << " of " << x.size() << " elements checked)";
}

TEST_P(FiniteDifference, BackwardMatchesCentralDifferences) {
  const ShapeCase c = GetParam();
  Inputs<double> in = random_inputs(c, 1234);
  const Results<double> r = run_reference<double>(c, in);
  std::mt19937 rng(99);
  check_gradient(c, in, in.q, r.dq, "dq", rng);
  check_gradient(c, in, in.k, r.dk, "dk", rng);
  check_gradient(c, in, in.v, r.dv, "dv", rng);
}

// Small head dims keep the two forwards per sampled element cheap; the shapes cover Sq < Sk and Sq > Sk,
// lengths that are not tile multiples, MHA, GQA and MQA, batch > 1, causal and full, and a non-default scale.
INSTANTIATE_TEST_SUITE_P(RaggedShapes, FiniteDifference,
                         testing::Values(ShapeCase{1, 1, 7, 1, 1, 8, false},           // every element checked
                                         ShapeCase{1, 7, 1, 2, 1, 8, true},            // every element, 6 rows hidden
                                         ShapeCase{1, 7, 37, 4, 2, 8, true},           // GQA, Sq < Sk
                                         ShapeCase{2, 37, 7, 4, 1, 16, true},          // MQA, Sq > Sk, batch 2
                                         ShapeCase{1, 65, 130, 4, 2, 16, false},       // GQA, full
                                         ShapeCase{1, 130, 65, 2, 2, 16, true, 0.7f},  // non-default scale
                                         ShapeCase{1, 65, 65, 4, 1, 8, true},          // MQA, square causal
                                         // sliding windows: causal with a left bound (Mistral's), two-sided,
                                         // right only, and rows that see no key below a right bound
                                         ShapeCase{1, 37, 37, 4, 2, 8, true, 0.0f, {5, -1}},
                                         ShapeCase{1, 29, 41, 2, 1, 8, false, 0.0f, {3, 4}},
                                         ShapeCase{2, 23, 23, 2, 2, 8, false, 0.0f, {-1, 2}},
                                         ShapeCase{1, 41, 17, 2, 1, 8, false, 0.0f, {6, 1}},
                                         // softcap: a large scale pushes scores past the cap, where tanh bends
                                         ShapeCase{1, 7, 37, 4, 2, 8, true, 3.0f, {}, 1.5},
                                         ShapeCase{1, 29, 41, 2, 1, 8, false, 2.0f, {3, 4}, 0.8}),
                         case_name);

// --- 2. Forward and backward vs the naive float64 formulation -----------------------------------------

class NaiveFormulation : public testing::TestWithParam<ShapeCase> {};

// Both sides are float64 sums of at most a few hundred O(1) terms, taken in different orders: the rounding
// difference is a few eps of the tensor's scale (~6e-16 seen), so 1e-13 only fails on a genuine disagreement.
TEST_P(NaiveFormulation, ForwardAndBackwardMatch) {
  constexpr double kTol = 1e-13;
  const ShapeCase c = GetParam();
  const Inputs<double> in = random_inputs(c, 2024);
  const Results<double> r = run_reference<double>(c, in);
  const Results<double> expected = naive_attention(c, in);
  EXPECT_TRUE(all_close(r.out, expected.out, kTol)) << "out";
  EXPECT_TRUE(all_close(r.lse, expected.lse, kTol)) << "lse";
  EXPECT_TRUE(all_close(r.dq, expected.dq, kTol)) << "dq";
  EXPECT_TRUE(all_close(r.dk, expected.dk, kTol)) << "dk";
  EXPECT_TRUE(all_close(r.dv, expected.dv, kTol)) << "dv";
}

INSTANTIATE_TEST_SUITE_P(RaggedShapes, NaiveFormulation,
                         testing::Values(ShapeCase{1, 1, 1, 1, 1, 8, true}, ShapeCase{2, 7, 37, 4, 2, 16, true},
                                         ShapeCase{1, 37, 7, 4, 2, 16, true}, ShapeCase{1, 130, 65, 4, 1, 16, true},
                                         ShapeCase{2, 65, 130, 4, 4, 16, false, 1.3f},
                                         ShapeCase{1, 130, 130, 2, 1, 64, true}, ShapeCase{1, 37, 65, 2, 2, 128, false},
                                         ShapeCase{1, 65, 37, 4, 2, 128, true},
                                         ShapeCase{2, 130, 130, 4, 2, 16, true, 0.0f, {17, -1}},
                                         ShapeCase{1, 65, 130, 2, 1, 16, false, 0.0f, {20, 9}},
                                         ShapeCase{1, 130, 65, 4, 4, 16, false, 0.0f, {0, 0}},
                                         ShapeCase{1, 130, 37, 2, 1, 64, true, 1.3f, {12, 40}},
                                         ShapeCase{2, 65, 130, 4, 2, 16, true, 2.5f, {}, 1.0},
                                         ShapeCase{1, 130, 65, 2, 2, 64, false, 1.3f, {9, 9}, 30.0}),
                         case_name);

// --- 3. float32 vs float64 ----------------------------------------------------------------------------

class Precision : public testing::TestWithParam<ShapeCase> {};

// Same inputs (drawn as floats) in both precisions. float32 carries eps = 6e-8, which dot products over
// D <= 128 and sums over Sk <= 130 grow to ~2e-7 of the tensor's scale in both passes (the worst seen here).
// Tolerances of 2e-6 (forward) and 5e-6 (backward, one more level of sums deep) keep a 10x margin over that.
TEST_P(Precision, Float32AgreesWithFloat64) {
  const ShapeCase c = GetParam();
  const Inputs<double> in = random_inputs(c, 7);
  const Results<float> r32 = run_reference<float>(c, in);
  const Results<double> r64 = run_reference<double>(c, in);
  EXPECT_TRUE(all_close(r32.out, r64.out, 2e-6)) << "out";
  EXPECT_TRUE(all_close(r32.lse, r64.lse, 2e-6)) << "lse";
  EXPECT_TRUE(all_close(r32.dq, r64.dq, 5e-6)) << "dq";
  EXPECT_TRUE(all_close(r32.dk, r64.dk, 5e-6)) << "dk";
  EXPECT_TRUE(all_close(r32.dv, r64.dv, 5e-6)) << "dv";
}

INSTANTIATE_TEST_SUITE_P(RaggedShapes, Precision,
                         testing::Values(ShapeCase{1, 37, 130, 4, 2, 16, true}, ShapeCase{2, 130, 37, 4, 1, 16, true},
                                         ShapeCase{1, 130, 130, 2, 1, 64, false},
                                         ShapeCase{1, 65, 130, 2, 2, 128, true},
                                         ShapeCase{1, 130, 130, 4, 2, 64, true, 0.0f, {31, -1}},
                                         ShapeCase{1, 130, 65, 2, 1, 16, false, 0.0f, {9, 9}}),
                         case_name);

// Softcapping: a cap far above every score changes almost nothing (c tanh(x / c) = x - x^3 / (3 c^2) + ...: at
// scores up to about 10, as here, and a cap of 1e6 the change is below 1e-9), and a tight cap bounds every score,
// so each row's LSE is at most log(visible keys) + cap while the uncapped one exceeds that.
TEST(Softcap, AFarCapChangesNothingAndATightOneBoundsTheScores) {
  const ShapeCase plain{1, 37, 65, 4, 2, 16, true, 2.0f};
  ShapeCase far = plain;
  far.softcap = 1e6;
  ShapeCase tight = plain;
  tight.softcap = 0.25;
  const Inputs<double> in = random_inputs(plain, 77);
  const Results<double> uncapped = run_reference<double>(plain, in);
  const Results<double> far_capped = run_reference<double>(far, in);
  EXPECT_TRUE(all_close(far_capped.out, uncapped.out, 1e-9)) << "out";
  EXPECT_TRUE(all_close(far_capped.dq, uncapped.dq, 1e-9)) << "dq";
  EXPECT_TRUE(all_close(far_capped.dk, uncapped.dk, 1e-9)) << "dk";
  const Results<double> capped = run_reference<double>(tight, in);
  bool some_row_exceeds_uncapped = false;
  for (int64_t h = 0; h < plain.heads_q; ++h) {
    for (int64_t i = 0; i < plain.seqlen_q; ++i) {
      int visible_keys = 0;
      for (int64_t j = 0; j < plain.seqlen_k; ++j) visible_keys += visible(plain, i, j) ? 1 : 0;
      const size_t row = static_cast<size_t>(h * plain.seqlen_q + i);
      const double bound = std::log(static_cast<double>(visible_keys)) + tight.softcap;
      EXPECT_LE(capped.lse[row], bound + 1e-12) << "head " << h << " row " << i;
      some_row_exceeds_uncapped = some_row_exceeds_uncapped || uncapped.lse[row] > bound;
    }
  }
  EXPECT_TRUE(some_row_exceeds_uncapped) << "the cap never bit: the test would pass without it";
}

// --- 4. Rows the mask hides entirely ---------------------------------------------------------------------

// A row below the window's right bound sees no key (with causal and seqlen_q > seqlen_k, the first
// seqlen_q - seqlen_k rows; with a right bound r, the first seqlen_q - seqlen_k - r): its O and dQ must be exactly
// 0 and its LSE -inf, in both precisions, with no NaN anywhere (a naive softmax would compute
// exp(-inf - (-inf)) there). The remaining rows are checked by the other tests.
template <class T>
void check_hidden_rows(const ShapeCase& c) {
  SCOPED_TRACE(sizeof(T) == 4 ? "float32" : "float64");
  const Results<T> r = run_reference<T>(c, random_inputs(c, 31));
  const Packed pq{c.seqlen_q, c.heads_q, c.head_dim};
  const auto is_zero = [](T e) { return e == T(0); };
  int64_t hidden_rows = 0;
  int64_t bad_rows = 0;
  std::ostringstream first_bad;
  for (int64_t i = 0; i < c.seqlen_q; ++i) {
    bool sees_a_key = false;
    for (int64_t j = 0; j < c.seqlen_k; ++j) sees_a_key = sees_a_key || visible(c, i, j);
    hidden_rows += sees_a_key ? 0 : 1;
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t h = 0; h < c.heads_q; ++h) {
        const T lse = r.lse[static_cast<size_t>((b * c.heads_q + h) * c.seqlen_q + i)];
        const auto out = r.out.begin() + static_cast<ptrdiff_t>(pq(b, i, h, 0));
        const auto dq = r.dq.begin() + static_cast<ptrdiff_t>(pq(b, i, h, 0));
        const bool ok = sees_a_key ? std::isfinite(lse)
                                   : lse == -std::numeric_limits<T>::infinity() &&
                                         std::all_of(out, out + c.head_dim, is_zero) &&
                                         std::all_of(dq, dq + c.head_dim, is_zero);
        if (!ok && bad_rows++ == 0) {
          first_bad << "b " << b << " h " << h << " row " << i << (sees_a_key ? " (sees a key)" : " (sees no key)")
                    << ": LSE " << lse << ", out[0] " << *out << ", dq[0] " << *dq;
        }
      }
    }
  }
  EXPECT_GT(hidden_rows, 0) << "the case hides no row";
  EXPECT_EQ(bad_rows, 0) << "first bad row: " << first_bad.str();
  expect_no_nan(r);
}

TEST(HiddenRows, ZeroOutputMinusInfLseZeroGradient) {
  for (const ShapeCase& c :
       {ShapeCase{1, 7, 1, 2, 1, 8, true}, ShapeCase{2, 37, 7, 4, 2, 16, true}, ShapeCase{1, 130, 65, 4, 1, 64, true},
        ShapeCase{1, 37, 7, 2, 1, 16, true, 0.0f, {3, -1}}, ShapeCase{2, 40, 9, 2, 2, 16, false, 0.0f, {4, 11}},
        ShapeCase{1, 40, 9, 2, 1, 16, false, 0.0f, {-1, 5}}}) {
    SCOPED_TRACE(testing::PrintToString(c));
    check_hidden_rows<float>(c);
    check_hidden_rows<double>(c);
  }
}

// --- 5. Every output element is written -----------------------------------------------------------------

// Outputs start as NaN; an element the reference skips (or accumulates into without clearing first) keeps or
// spreads the NaN.
template <class T>
void check_all_written(const ShapeCase& c) {
  SCOPED_TRACE(sizeof(T) == 4 ? "float32" : "float64");
  expect_no_nan(run_reference<T>(c, random_inputs(c, 5), std::numeric_limits<T>::quiet_NaN()));
}

TEST(Outputs, EveryElementIsWritten) {
  for (const ShapeCase& c :
       {ShapeCase{2, 37, 7, 4, 2, 16, true}, ShapeCase{2, 7, 37, 4, 1, 16, true},
        ShapeCase{1, 65, 130, 2, 2, 64, false}, ShapeCase{2, 40, 9, 2, 2, 16, false, 0.0f, {4, 11}},
        ShapeCase{1, 9, 40, 2, 1, 16, true, 0.0f, {2, -1}}}) {
    SCOPED_TRACE(testing::PrintToString(c));
    check_all_written<float>(c);
    check_all_written<double>(c);
  }
}

}  // namespace
}  // namespace dash::reference
