#include "harness/device_harness.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <cuda_runtime_api.h>

#include "reference/attention_reference.hpp"

namespace dash::harness {

uint16_t to_bits(float value, DType dtype) {
  if (dtype == DType::kFP16) return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);  // round half to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float from_bits(uint16_t bits, DType dtype) {
  if (dtype == DType::kFP16) return static_cast<float>(std::bit_cast<_Float16>(bits));
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

void check_cuda(int error, const char* what) {
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(static_cast<cudaError_t>(error)));
  }
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}
void DeviceBuffer::upload(const void* host, size_t bytes) {
  check_cuda(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "upload");
}
void DeviceBuffer::download(void* host, size_t bytes) const {
  check_cuda(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "download");
}
void DeviceBuffer::poison() { check_cuda(cudaMemset(data_, 0xFF, bytes_), "poison"); }

bool synchronize_with_watchdog(cudaStream_t stream, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return true;
    if (state != cudaErrorNotReady) check_cuda(state, "kernel execution");
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

size_t Problem::q_elements() const {
  return static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim);
}
size_t Problem::kv_elements() const {
  return static_cast<size_t>(shape.batch * shape.seqlen_k * shape.heads_kv * shape.head_dim);
}

namespace {

constexpr size_t kHalfBytes = 2;

// Draws N(0, 1) values, rounds them to the dtype, uploads the 16-bit patterns; returns the rounded values.
// Chunks are drawn in parallel, each from its own generator seeded by (seed, chunk), so the values do
// not depend on the number of threads.
std::vector<double> random_rounded(size_t count, DType dtype, uint64_t seed, DeviceBuffer& device) {
  constexpr size_t kChunk = size_t{1} << 20;
  const size_t chunks = (count + kChunk - 1) / kChunk;
  const size_t workers = std::max<size_t>(1, std::min<size_t>(chunks, std::thread::hardware_concurrency()));
  std::vector<uint16_t> bits(count);
  std::vector<double> values(count);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (size_t chunk = w; chunk < chunks; chunk += workers) {
        std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + chunk);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (size_t i = chunk * kChunk; i < std::min(count, (chunk + 1) * kChunk); ++i) {
          bits[i] = to_bits(normal(rng), dtype);
          values[i] = from_bits(bits[i], dtype);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  device = DeviceBuffer(count * kHalfBytes);
  device.upload(bits.data(), count * kHalfBytes);
  return values;
}

// Runs `work(b)` for every batch index on its own thread: the reference is the slow part of a check.
template <class Work>
void for_each_batch(int64_t batch, Work work) {
  std::vector<std::thread> threads;
  for (int64_t b = 0; b < batch; ++b) threads.emplace_back(work, b);
  for (auto& t : threads) t.join();
}

}  // namespace

Problem make_problem(const AttentionShape& shape, uint64_t seed, bool with_reference) {
  Problem p;
  p.shape = shape;
  const size_t nq = p.q_elements();
  const size_t nkv = p.kv_elements();
  const size_t rows = static_cast<size_t>(shape.batch * shape.heads_q * shape.seqlen_q);
  p.q = random_rounded(nq, shape.dtype, seed, p.d_q);
  p.k = random_rounded(nkv, shape.dtype, seed + 1, p.d_k);
  p.v = random_rounded(nkv, shape.dtype, seed + 2, p.d_v);
  p.dout = random_rounded(nq, shape.dtype, seed + 3, p.d_dout);
  p.d_out = DeviceBuffer(nq * kHalfBytes);
  p.d_lse = DeviceBuffer(rows * sizeof(float));
  p.d_dq = DeviceBuffer(nq * kHalfBytes);
  p.d_dk = DeviceBuffer(nkv * kHalfBytes);
  p.d_dv = DeviceBuffer(nkv * kHalfBytes);
  p.d_ref_out = DeviceBuffer(nq * kHalfBytes);
  p.d_ref_lse = DeviceBuffer(rows * sizeof(float));
  if (!with_reference) return p;

  p.out.assign(nq, 0.0);
  p.lse.assign(rows, 0.0);
  p.dq.assign(nq, 0.0);
  p.dk.assign(nkv, 0.0);
  p.dv.assign(nkv, 0.0);
  AttentionShape one = shape;
  one.batch = 1;
  const size_t q_per_batch = nq / shape.batch, kv_per_batch = nkv / shape.batch, rows_per_batch = rows / shape.batch;
  std::vector<double> out_rounded(nq);
  const SlidingWindow window = reference_window(shape);
  for_each_batch(shape.batch, [&](int64_t b) {
    const size_t qo = b * q_per_batch, ko = b * kv_per_batch, ro = b * rows_per_batch;
    reference::attention_forward(one, &p.q[qo], &p.k[ko], &p.v[ko], &p.out[qo], &p.lse[ro], window, shape.softcap);
    // The backward sees O as the GPU stores it: rounded to the dtype.
    for (size_t i = qo; i < qo + q_per_batch; ++i)
      out_rounded[i] = from_bits(to_bits(static_cast<float>(p.out[i]), shape.dtype), shape.dtype);
    reference::attention_backward(one, &p.q[qo], &p.k[ko], &p.v[ko], &out_rounded[qo], &p.dout[qo], &p.lse[ro],
                                  &p.dq[qo], &p.dk[ko], &p.dv[ko], window, shape.softcap);
  });
  std::vector<uint16_t> out_bits(nq);
  for (size_t i = 0; i < nq; ++i) out_bits[i] = to_bits(static_cast<float>(out_rounded[i]), shape.dtype);
  p.d_ref_out.upload(out_bits.data(), nq * kHalfBytes);
  std::vector<float> lse_float(p.lse.begin(), p.lse.end());
  p.d_ref_lse.upload(lse_float.data(), rows * sizeof(float));
  return p;
}

namespace {

// Packed (B, S, H, D) strides of the query-side and key/value-side tensors of a problem.
Strides query_strides(const AttentionShape& s) { return packed_strides(s.seqlen_q, s.heads_q, s.head_dim); }
Strides key_strides(const AttentionShape& s) { return packed_strides(s.seqlen_k, s.heads_kv, s.head_dim); }

}  // namespace

ForwardArgs forward_args(Problem& p) {
  ForwardArgs a;
  a.shape = p.shape;
  a.q = {p.d_q.get(), query_strides(p.shape)};
  a.k = {p.d_k.get(), key_strides(p.shape)};
  a.v = {p.d_v.get(), key_strides(p.shape)};
  a.out = {p.d_out.get(), query_strides(p.shape)};
  a.lse = static_cast<float*>(p.d_lse.get());
  return a;
}

BackwardArgs backward_args(Problem& p, Schedule schedule) {
  BackwardArgs a;
  a.shape = p.shape;
  a.q = {p.d_q.get(), query_strides(p.shape)};
  a.k = {p.d_k.get(), key_strides(p.shape)};
  a.v = {p.d_v.get(), key_strides(p.shape)};
  a.out = {p.d_ref_out.get(), query_strides(p.shape)};
  a.dout = {p.d_dout.get(), query_strides(p.shape)};
  a.dq = {p.d_dq.get(), query_strides(p.shape)};
  a.dk = {p.d_dk.get(), key_strides(p.shape)};
  a.dv = {p.d_dv.get(), key_strides(p.shape)};
  a.lse = static_cast<const float*>(p.d_ref_lse.get());
  a.schedule = schedule;
  return a;
}

void use_forward_outputs_for_backward(Problem& p) {
  copy_forward_outputs_to_reference(p.d_out, p.d_lse, p.d_ref_out, p.d_ref_lse);
}

void copy_forward_outputs_to_reference(const DeviceBuffer& out, const DeviceBuffer& lse, DeviceBuffer& ref_out,
                                       DeviceBuffer& ref_lse) {
  check_cuda(cudaMemcpy(ref_out.get(), out.get(), out.bytes(), cudaMemcpyDeviceToDevice), "copy O");
  check_cuda(cudaMemcpy(ref_lse.get(), lse.get(), lse.bytes(), cudaMemcpyDeviceToDevice), "copy LSE");
}

Status plan_backward_for(const Problem& p, Schedule schedule, int sm_margin, BackwardPlan* plan) {
  return plan_backward(p.shape, schedule, sm_margin, plan);
}

std::string ErrorStats::describe() const {
  std::ostringstream out;
  out << "rel_l2 " << relative_l2 << ", max_err " << max_abs_error << " (max |ref| " << max_abs_reference << ")";
  if (not_finite > 0) out << ", " << not_finite << " non-finite";
  return out.str();
}

ErrorStats compare(const DeviceBuffer& device, const std::vector<double>& reference, DType dtype, bool is_float) {
  const size_t n = reference.size();
  std::vector<double> values(n);
  if (is_float) {
    std::vector<float> host(n);
    device.download(host.data(), n * sizeof(float));
    for (size_t i = 0; i < n; ++i) values[i] = host[i];
  } else {
    std::vector<uint16_t> host(n);
    device.download(host.data(), n * kHalfBytes);
    for (size_t i = 0; i < n; ++i) values[i] = from_bits(host[i], dtype);
  }
  ErrorStats stats;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double ref = reference[i];
    if (std::isinf(ref)) {  // LSE of rows that see no key
      if (values[i] != ref) ++stats.not_finite;
      continue;
    }
    if (!std::isfinite(values[i])) {
      ++stats.not_finite;
      continue;
    }
    const double err = std::abs(values[i] - ref);
    err2 += err * err;
    ref2 += ref * ref;
    stats.max_abs_error = std::max(stats.max_abs_error, err);
    stats.max_abs_reference = std::max(stats.max_abs_reference, std::abs(ref));
  }
  stats.relative_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return stats;
}

Tolerance tolerance_for(DType dtype) {
  // bf16 keeps 8 significant bits (unit roundoff 2^-9 ~ 2e-3), fp16 11 (2^-12 ~ 2.4e-4 per rounding);
  // inputs, P, dS and the outputs are each rounded once, so correct kernels land a few roundoffs away.
  if (dtype == DType::kFP16) return Tolerance{4e-3, 1.5e-2};
  return Tolerance{1.5e-2, 5e-2};
}

Tolerance tolerance_for(const AttentionShape& shape) {
  Tolerance tol = tolerance_for(shape.dtype);
  if (shape.softcap > 0.0f) {
    constexpr double kBf16Roundoff = 1.0 / 512;
    tol.relative_l2 += 2 * kBf16Roundoff;
    tol.max_error_fraction += 2 * kBf16Roundoff;
  }
  return tol;
}

SlidingWindow reference_window(const AttentionShape& shape) {
  constexpr int64_t kOpenBeyond = int64_t{1} << 30;
  const auto narrow = [](int64_t bound) {
    return bound < 0 || bound >= kOpenBeyond ? kNoWindowBound : static_cast<int>(bound);
  };
  return SlidingWindow{narrow(shape.window_left), narrow(shape.window_right)};
}

bool within(const ErrorStats& stats, const Tolerance& tol) {
  // A gradient that is exactly zero in exact arithmetic (one visible key: dS = 0) comes out at rounding
  // level, so the max-error bound never drops below a fraction of unit magnitude (inputs are N(0, 1)).
  constexpr double kMagnitudeFloor = 1e-2;
  return stats.not_finite == 0 && stats.relative_l2 <= tol.relative_l2 &&
         stats.max_abs_error <= tol.max_error_fraction * std::max(stats.max_abs_reference, kMagnitudeFloor);
}

CallTiming time_calls(const std::function<Status()>& launch, int warmup, int iterations, int repeats) {
  constexpr double kHangSeconds = 60.0;
  auto call = [&] {
    const Status s = launch();
    if (!s.ok()) throw std::runtime_error(s.to_string());
  };
  for (int i = 0; i < warmup; ++i) call();
  if (!synchronize_with_watchdog(nullptr, kHangSeconds)) throw std::runtime_error("warm-up did not finish (hang)");
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> loop_ms(static_cast<size_t>(repeats));
  std::vector<double> host_us;
  host_us.reserve(static_cast<size_t>(repeats) * iterations);
  for (float& ms : loop_ms) {
    check_cuda(cudaEventRecord(start, nullptr), "cudaEventRecord");
    for (int i = 0; i < iterations; ++i) {
      const auto begin = std::chrono::steady_clock::now();
      call();
      host_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin).count());
    }
    check_cuda(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    if (!synchronize_with_watchdog(nullptr, kHangSeconds)) throw std::runtime_error("timed loop did not finish (hang)");
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const auto median = [](auto values) {
    std::sort(values.begin(), values.end());
    return static_cast<double>(values[values.size() / 2]);
  };
  return CallTiming{median(loop_ms) / iterations, median(host_us)};
}

double forward_flops(const AttentionShape& s) {
  const double sq = static_cast<double>(s.seqlen_q), sk = static_cast<double>(s.seqlen_k);
  // Bottom-right causal: row i sees i + 1 + sk - sq keys, clamped to [0, sk]. Counted as half a square per
  // diagonal block: a trapezoid of area sq (sk - sq / 2) when sq <= sk; when sq > sk the first sq - sk rows see no
  // key and the rest a triangle of area sk^2 / 2.
  double keys = sk;
  if (s.causal) keys = sq <= sk ? sk - sq / 2.0 : sk * sk / (2.0 * sq);
  const SlidingWindow window = reference_window(s);
  if (window.left >= 0 || (!s.causal && window.right >= 0)) {
    // Under a sliding window: the keys each row sees, counted (a row sees [first_visible_key, visible_keys)).
    const MaskShape mask{static_cast<int>(s.seqlen_q), static_cast<int>(s.seqlen_k), s.causal, window};
    double total = 0.0;
    for (int row = 0; row < mask.seqlen_q; ++row) {
      total += std::max(0, mask.visible_keys(row) - mask.first_visible_key(row));
    }
    keys = total / sq;
  }
  constexpr double kFlopsPerScoreAndDim = 4.0;  // two GEMMs (Q K^T and P V), 2 FLOPs per multiply-add
  return kFlopsPerScoreAndDim * static_cast<double>(s.batch * s.heads_q) * sq * keys * static_cast<double>(s.head_dim);
}

}  // namespace dash::harness
