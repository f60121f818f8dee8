// Packed varlen problems for the GPU tests and dash-attn check / bench (varlen_harness.hpp): inputs drawn as
// make_problem draws them, each sequence's reference computed by the dense reference on its rows, padding rows
// marked NaN in the references; the plan and FLOPs of a batch.
#include "harness/varlen_harness.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>

#include "reference/attention_reference.hpp"

namespace dash::harness {
namespace {

constexpr size_t kHalfBytes = 2;
constexpr double kPadding = std::numeric_limits<double>::quiet_NaN();

// N(0, 1) values rounded to the dtype, uploaded; the rounded values returned.
std::vector<double> random_rounded(size_t count, DType dtype, uint64_t seed, DeviceBuffer& device) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> bits(count);
  std::vector<double> values(count);
  for (size_t i = 0; i < count; ++i) {
    bits[i] = to_bits(normal(rng), dtype);
    values[i] = from_bits(bits[i], dtype);
  }
  device = DeviceBuffer(std::max<size_t>(count, 1) * kHalfBytes);
  device.upload(bits.data(), count * kHalfBytes);
  return values;
}

std::vector<int32_t> offsets(const std::vector<SequenceLengths>& lengths, bool queries) {
  std::vector<int32_t> cu{0};
  for (const SequenceLengths& l : lengths) cu.push_back(cu.back() + (queries ? l.seqlen_q : l.seqlen_k));
  return cu;
}

void upload_halves(const std::vector<double>& values, DType dtype, DeviceBuffer& device) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = to_bits(static_cast<float>(values[i]), dtype);
  device.upload(bits.data(), bits.size() * kHalfBytes);
}

Strides packed_row_strides(int64_t heads, int64_t head_dim) { return Strides{0, heads * head_dim, head_dim, 1}; }

}  // namespace

size_t VarlenProblem::q_elements() const { return static_cast<size_t>(total_q * shape.heads_q * shape.head_dim); }
size_t VarlenProblem::kv_elements() const { return static_cast<size_t>(total_k * shape.heads_kv * shape.head_dim); }
size_t VarlenProblem::lse_elements() const { return static_cast<size_t>(shape.heads_q * total_q); }

VarlenProblem make_varlen_problem(AttentionShape shape, const std::vector<SequenceLengths>& lengths,
                                  int64_t padding_rows, uint64_t seed, SequenceLengths max_lengths,
                                  bool with_reference) {
  if (lengths.empty()) throw std::invalid_argument("make_varlen_problem: at least one sequence");
  VarlenProblem p;
  p.cu_seqlens_q = offsets(lengths, true);
  p.cu_seqlens_k = offsets(lengths, false);
  p.total_q = p.cu_seqlens_q.back() + padding_rows;
  p.total_k = p.cu_seqlens_k.back() + padding_rows;
  p.keys_within_queries =
      std::all_of(lengths.begin(), lengths.end(), [](const SequenceLengths& l) { return l.seqlen_k <= l.seqlen_q; });
  shape.batch = static_cast<int64_t>(lengths.size());
  shape.seqlen_q = max_lengths.seqlen_q;
  shape.seqlen_k = max_lengths.seqlen_k;
  for (const SequenceLengths& l : lengths) {
    shape.seqlen_q = std::max<int64_t>(shape.seqlen_q, l.seqlen_q);
    shape.seqlen_k = std::max<int64_t>(shape.seqlen_k, l.seqlen_k);
  }
  p.shape = shape;
  const int64_t hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  p.q = random_rounded(p.q_elements(), shape.dtype, seed, p.d_q);
  p.k = random_rounded(p.kv_elements(), shape.dtype, seed + 1, p.d_k);
  p.v = random_rounded(p.kv_elements(), shape.dtype, seed + 2, p.d_v);
  p.dout = random_rounded(p.q_elements(), shape.dtype, seed + 3, p.d_dout);
  for (DeviceBuffer* b : {&p.d_out, &p.d_ref_out, &p.d_dq}) *b = DeviceBuffer(p.q_elements() * kHalfBytes);
  for (DeviceBuffer* b : {&p.d_dk, &p.d_dv}) *b = DeviceBuffer(p.kv_elements() * kHalfBytes);
  for (DeviceBuffer* b : {&p.d_lse, &p.d_ref_lse}) *b = DeviceBuffer(p.lse_elements() * sizeof(float));
  p.d_cu_seqlens_q = DeviceBuffer(p.cu_seqlens_q.size() * sizeof(int32_t));
  p.d_cu_seqlens_q.upload(p.cu_seqlens_q.data(), p.cu_seqlens_q.size() * sizeof(int32_t));
  p.d_cu_seqlens_k = DeviceBuffer(p.cu_seqlens_k.size() * sizeof(int32_t));
  p.d_cu_seqlens_k.upload(p.cu_seqlens_k.data(), p.cu_seqlens_k.size() * sizeof(int32_t));

  if (!with_reference) {
    const std::vector<uint16_t> zero_halves(p.q_elements(), 0);
    p.d_ref_out.upload(zero_halves.data(), zero_halves.size() * kHalfBytes);
    const std::vector<float> zero_lse(p.lse_elements(), 0.0f);
    p.d_ref_lse.upload(zero_lse.data(), zero_lse.size() * sizeof(float));
    return p;
  }
  p.out.assign(p.q_elements(), kPadding);
  p.dq.assign(p.q_elements(), kPadding);
  p.dk.assign(p.kv_elements(), kPadding);
  p.dv.assign(p.kv_elements(), kPadding);
  p.lse.assign(p.lse_elements(), kPadding);
  std::vector<double> out_rounded(p.q_elements(), 0.0);
  const SlidingWindow window = reference_window(shape);
  // Each sequence's reference on its own thread (they write disjoint rows): the reference is the slow part.
  std::vector<std::thread> threads;
  const auto reference_of = [&](size_t b) {
    const int64_t sq = lengths[b].seqlen_q, sk = lengths[b].seqlen_k;
    const size_t qo = static_cast<size_t>(p.cu_seqlens_q[b] * hq * d);
    const size_t ko = static_cast<size_t>(p.cu_seqlens_k[b] * hkv * d);
    const size_t nq = static_cast<size_t>(sq * hq * d), nk = static_cast<size_t>(sk * hkv * d);
    // Keys no query sees (a sequence without queries) get zero gradients; queries without keys O = 0, LSE = -inf.
    std::fill_n(p.dk.begin() + ko, nk, 0.0);
    std::fill_n(p.dv.begin() + ko, nk, 0.0);
    if (sq == 0) return;
    std::vector<double> lse(static_cast<size_t>(hq * sq), -INFINITY);
    std::fill_n(p.out.begin() + qo, nq, 0.0);
    std::fill_n(p.dq.begin() + qo, nq, 0.0);
    if (sk > 0) {
      AttentionShape one = shape;
      one.batch = 1;
      one.seqlen_q = sq;
      one.seqlen_k = sk;
      reference::attention_forward(one, &p.q[qo], &p.k[ko], &p.v[ko], &p.out[qo], lse.data(), window, shape.softcap);
      for (size_t i = qo; i < qo + nq; ++i) {
        out_rounded[i] = from_bits(to_bits(static_cast<float>(p.out[i]), shape.dtype), shape.dtype);
      }
      reference::attention_backward(one, &p.q[qo], &p.k[ko], &p.v[ko], &out_rounded[qo], &p.dout[qo], lse.data(),
                                    &p.dq[qo], &p.dk[ko], &p.dv[ko], window, shape.softcap);
    }
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = 0; i < sq; ++i) p.lse[h * p.total_q + p.cu_seqlens_q[b] + i] = lse[h * sq + i];
    }
  };
  for (size_t b = 0; b < lengths.size(); ++b) threads.emplace_back(reference_of, b);
  for (std::thread& t : threads) t.join();
  upload_halves(out_rounded, shape.dtype, p.d_ref_out);
  std::vector<float> lse_float(p.lse.size());
  // Padding rows of the reference LSE the backward reads: any finite value, no call may read it.
  for (size_t i = 0; i < p.lse.size(); ++i) lse_float[i] = std::isnan(p.lse[i]) ? 0.0f : static_cast<float>(p.lse[i]);
  p.d_ref_lse.upload(lse_float.data(), lse_float.size() * sizeof(float));
  return p;
}

VarlenBatch varlen_batch(const VarlenProblem& p) {
  VarlenBatch v;
  v.cu_seqlens_q = static_cast<const int32_t*>(p.d_cu_seqlens_q.get());
  v.cu_seqlens_k = static_cast<const int32_t*>(p.d_cu_seqlens_k.get());
  v.total_q = p.total_q;
  v.total_k = p.total_k;
  v.keys_within_queries = p.keys_within_queries;
  return v;
}

ForwardArgs forward_args(VarlenProblem& p) {
  ForwardArgs a;
  a.shape = p.shape;
  const Strides q = packed_row_strides(p.shape.heads_q, p.shape.head_dim);
  const Strides kv = packed_row_strides(p.shape.heads_kv, p.shape.head_dim);
  a.q = {p.d_q.get(), q};
  a.k = {p.d_k.get(), kv};
  a.v = {p.d_v.get(), kv};
  a.out = {p.d_out.get(), q};
  a.lse = static_cast<float*>(p.d_lse.get());
  a.varlen = varlen_batch(p);
  return a;
}

BackwardArgs backward_args(VarlenProblem& p, Schedule schedule) {
  BackwardArgs a;
  a.shape = p.shape;
  const Strides q = packed_row_strides(p.shape.heads_q, p.shape.head_dim);
  const Strides kv = packed_row_strides(p.shape.heads_kv, p.shape.head_dim);
  a.q = {p.d_q.get(), q};
  a.k = {p.d_k.get(), kv};
  a.v = {p.d_v.get(), kv};
  a.out = {p.d_ref_out.get(), q};
  a.dout = {p.d_dout.get(), q};
  a.dq = {p.d_dq.get(), q};
  a.dk = {p.d_dk.get(), kv};
  a.dv = {p.d_dv.get(), kv};
  a.lse = static_cast<const float*>(p.d_ref_lse.get());
  a.schedule = schedule;
  a.varlen = varlen_batch(p);
  return a;
}

void use_forward_outputs_for_backward(VarlenProblem& p) {
  copy_forward_outputs_to_reference(p.d_out, p.d_lse, p.d_ref_out, p.d_ref_lse);
}

Status plan_backward_for(const VarlenProblem& p, Schedule schedule, int sm_margin, BackwardPlan* plan) {
  const bool fill = varlen_lengths_fill_maxima(p.shape, p.cu_seqlens_q.back(), p.cu_seqlens_k.back());
  return plan_varlen_backward(p.shape, p.keys_within_queries, fill, schedule, sm_margin, plan);
}

double forward_flops(const AttentionShape& shape, const std::vector<SequenceLengths>& lengths) {
  double flops = 0.0;
  for (const SequenceLengths& l : lengths) {
    if (l.seqlen_q == 0 || l.seqlen_k == 0) continue;
    AttentionShape one = shape;
    one.batch = 1;
    one.seqlen_q = l.seqlen_q;
    one.seqlen_k = l.seqlen_k;
    flops += forward_flops(one);
  }
  return flops;
}

PackedComparison compare_packed(const DeviceBuffer& device, const std::vector<double>& reference, DType dtype,
                                bool is_float) {
  std::vector<double> values(reference.size());
  if (is_float) {
    std::vector<float> host(reference.size());
    device.download(host.data(), host.size() * sizeof(float));
    std::copy(host.begin(), host.end(), values.begin());
  } else {
    std::vector<uint16_t> host(reference.size());
    device.download(host.data(), host.size() * kHalfBytes);
    for (size_t i = 0; i < host.size(); ++i) values[i] = from_bits(host[i], dtype);
  }
  PackedComparison result;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double ref = reference[i];
    if (std::isnan(ref)) {
      // A padding row: the call clears it, 0 in a tensor and -inf in the LSE (the only float output).
      const double cleared = is_float ? -std::numeric_limits<double>::infinity() : 0.0;
      result.padding_not_cleared += !(values[i] == cleared);
      continue;
    }
    if (std::isinf(ref)) {  // LSE of rows that see no key
      if (values[i] != ref) ++result.stats.not_finite;
      continue;
    }
    if (!std::isfinite(values[i])) {
      ++result.stats.not_finite;
      continue;
    }
    const double err = std::abs(values[i] - ref);
    err2 += err * err;
    ref2 += ref * ref;
    result.stats.max_abs_error = std::max(result.stats.max_abs_error, err);
    result.stats.max_abs_reference = std::max(result.stats.max_abs_reference, std::abs(ref));
  }
  result.stats.relative_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return result;
}

}  // namespace dash::harness
