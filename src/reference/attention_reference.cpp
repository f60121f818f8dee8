#include "reference/attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "schedule/mask.hpp"

namespace dash::reference {
namespace {

// Index helpers for packed (B, S, H, D) tensors and packed (B, H, S) row statistics.
struct Layout {
  int64_t seqlen, heads, dim;
  int64_t at(int64_t b, int64_t s, int64_t h) const { return ((b * seqlen + s) * heads + h) * dim; }
};

MaskShape mask_of(const AttentionShape& shape, SlidingWindow window) {
  return MaskShape{static_cast<int>(shape.seqlen_q), static_cast<int>(shape.seqlen_k), shape.causal, window};
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// A scaled score after softcapping, and the derivative of the capped score with respect to the scaled one.
template <class T>
struct CappedScore {
  T value;
  T slope;
};

template <class T>
CappedScore<T> cap(T score, T softcap) {
  if (softcap <= T(0)) return {score, T(1)};
  const T t = std::tanh(score / softcap);
  return {softcap * t, T(1) - t * t};
}

}  // namespace

template <class T>
void attention_forward(const AttentionShape& shape, const T* q, const T* k, const T* v, T* out, T* lse,
                       SlidingWindow window, double softcap) {
  const T score_cap = static_cast<T>(softcap);
  const Layout lq{shape.seqlen_q, shape.heads_q, shape.head_dim};
  const Layout lk{shape.seqlen_k, shape.heads_kv, shape.head_dim};
  const int64_t group = shape.heads_q / shape.heads_kv;
  const T scale = static_cast<T>(shape.softmax_scale);
  const MaskShape mask = mask_of(shape, window);
  std::vector<T> scores(static_cast<size_t>(shape.seqlen_k));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads_q; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        const int64_t first = mask.first_visible_key(static_cast<int>(i));
        const int64_t keys = mask.visible_keys(static_cast<int>(i));
        T* o = out + lq.at(b, i, h);
        std::fill(o, o + shape.head_dim, T(0));
        T& row_lse = lse[(b * shape.heads_q + h) * shape.seqlen_q + i];
        if (first >= keys) {
          row_lse = -std::numeric_limits<T>::infinity();
          continue;
        }
        T row_max = -std::numeric_limits<T>::infinity();
        for (int64_t j = first; j < keys; ++j) {
          scores[j] = cap(scale * dot(q + lq.at(b, i, h), k + lk.at(b, j, hk), shape.head_dim), score_cap).value;
          row_max = std::max(row_max, scores[j]);
        }
        T sum = 0;
        for (int64_t j = first; j < keys; ++j) sum += std::exp(scores[j] - row_max);
        row_lse = row_max + std::log(sum);
        for (int64_t j = first; j < keys; ++j) {
          const T p = std::exp(scores[j] - row_lse);
          const T* vj = v + lk.at(b, j, hk);
          for (int64_t d = 0; d < shape.head_dim; ++d) o[d] += p * vj[d];
        }
      }
    }
  }
}

template <class T>
void attention_backward(const AttentionShape& shape, const T* q, const T* k, const T* v, const T* out, const T* dout,
                        const T* lse, T* dq, T* dk, T* dv, SlidingWindow window, double softcap) {
  const T score_cap = static_cast<T>(softcap);
  const Layout lq{shape.seqlen_q, shape.heads_q, shape.head_dim};
  const Layout lk{shape.seqlen_k, shape.heads_kv, shape.head_dim};
  const int64_t group = shape.heads_q / shape.heads_kv;
  const int64_t dim = shape.head_dim;
  const T scale = static_cast<T>(shape.softmax_scale);
  const MaskShape mask = mask_of(shape, window);
  std::fill(dq, dq + shape.batch * shape.seqlen_q * shape.heads_q * dim, T(0));
  std::fill(dk, dk + shape.batch * shape.seqlen_k * shape.heads_kv * dim, T(0));
  std::fill(dv, dv + shape.batch * shape.seqlen_k * shape.heads_kv * dim, T(0));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads_q; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        const int64_t first = mask.first_visible_key(static_cast<int>(i));
        const int64_t keys = mask.visible_keys(static_cast<int>(i));
        const T* qi = q + lq.at(b, i, h);
        const T* doi = dout + lq.at(b, i, h);
        const T row_lse = lse[(b * shape.heads_q + h) * shape.seqlen_q + i];
        const T delta = dot(doi, out + lq.at(b, i, h), dim);  // D_i = rowsum(dO o O)
        T* dqi = dq + lq.at(b, i, h);
        for (int64_t j = first; j < keys; ++j) {
          const T* kj = k + lk.at(b, j, hk);
          const T* vj = v + lk.at(b, j, hk);
          const CappedScore<T> s = cap(scale * dot(qi, kj, dim), score_cap);
          const T p = std::exp(s.value - row_lse);  // P_ij
          // dS_ij = P_ij (dP_ij - D_i), carried back through the cap to the scaled score.
          const T ds = p * (dot(doi, vj, dim) - delta) * s.slope;
          T* dkj = dk + lk.at(b, j, hk);
          T* dvj = dv + lk.at(b, j, hk);
          for (int64_t d = 0; d < dim; ++d) {
            dqi[d] += scale * ds * kj[d];
            dkj[d] += scale * ds * qi[d];
            dvj[d] += p * doi[d];
          }
        }
      }
    }
  }
}

template void attention_forward<float>(const AttentionShape&, const float*, const float*, const float*, float*, float*,
                                       SlidingWindow, double);
template void attention_forward<double>(const AttentionShape&, const double*, const double*, const double*, double*,
                                        double*, SlidingWindow, double);
template void attention_backward<float>(const AttentionShape&, const float*, const float*, const float*, const float*,
                                        const float*, const float*, float*, float*, float*, SlidingWindow, double);
template void attention_backward<double>(const AttentionShape&, const double*, const double*, const double*,
                                         const double*, const double*, const double*, double*, double*, double*,
                                         SlidingWindow, double);

}  // namespace dash::reference
