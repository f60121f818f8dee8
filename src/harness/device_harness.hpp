// Harness layer (host only): what the GPU tests and the `dash-attn check` / `bench` commands share to
// drive the public API on real data: device buffers, random inputs rounded to bf16/fp16, the float64
// reference on exactly those inputs, poisoned outputs, a watchdog that turns a hang into an error,
// and error metrics. Talks to the GPU only through the CUDA runtime and the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dash/attention.hpp"
#include "schedule/mask.hpp"

namespace dash::harness {

// float <-> bf16/fp16 bit patterns, round to nearest even.
uint16_t to_bits(float value, DType dtype);
float from_bits(uint16_t bits, DType dtype);

// A device allocation freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* get() const { return data_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  // Every byte 0xFF: NaN in bf16, fp16 and fp32, so an element the kernel never writes stays visible.
  void poison();

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Throws std::runtime_error naming `what` when a CUDA call fails (harness code only, never the library).
void check_cuda(int error, const char* what);

// Waits for all work on `stream`; returns false if it has not finished after `seconds` (a hang).
bool synchronize_with_watchdog(cudaStream_t stream, double seconds);

// One attention problem on the device: packed (B, S, H, D) inputs drawn from N(0, 1), rounded to the
// shape's dtype, and their float64 reference forward (O, LSE) and backward (dQ, dK, dV), under the shape's
// mask (causal, sliding window) and softcap.
struct Problem {
  AttentionShape shape;
  std::vector<double> q, k, v, dout;                 // the rounded inputs, exactly as the GPU sees them
  std::vector<double> out, lse;                      // reference forward
  std::vector<double> dq, dk, dv;                    // reference backward (with `out` rounded to the dtype)
  DeviceBuffer d_q, d_k, d_v, d_dout, d_out, d_lse;  // inputs, and the forward's outputs
  DeviceBuffer d_ref_out, d_ref_lse;                 // the reference O (rounded) and LSE, for backward-only checks
  DeviceBuffer d_dq, d_dk, d_dv;
  DeviceBuffer workspace;

  size_t q_elements() const;
  size_t kv_elements() const;
};

// Builds a problem; `with_reference` false skips the CPU reference (benchmarks).
Problem make_problem(const AttentionShape& shape, uint64_t seed, bool with_reference = true);

ForwardArgs forward_args(Problem& p);
// Backward arguments reading the reference O and LSE (so a backward check does not depend on the forward).
BackwardArgs backward_args(Problem& p, Schedule schedule);
// Makes backward_args() read the GPU forward's O and LSE instead (benchmarks, which skip the reference).
void use_forward_outputs_for_backward(Problem& p);
// The copy both problem kinds' use_forward_outputs_for_backward make: a forward's O and LSE over the reference ones.
void copy_forward_outputs_to_reference(const DeviceBuffer& out, const DeviceBuffer& lse, DeviceBuffer& ref_out,
                                       DeviceBuffer& ref_lse);
// The backward plan of p's shape on the current device (plan_backward), so that code written once for dense and
// varlen problems (varlen_harness.hpp has the varlen overload) plans either.
Status plan_backward_for(const Problem& p, Schedule schedule, int sm_margin, BackwardPlan* plan);

struct ErrorStats {
  double relative_l2 = 0;  // ||x - ref|| / ||ref||
  double max_abs_error = 0;
  double max_abs_reference = 0;
  size_t not_finite = 0;  // NaN or inf where the reference is finite (unwritten elements included)
  std::string describe() const;
};

// Compares a device tensor of the dtype (or float32 when `is_float`) with a float64 reference.
ErrorStats compare(const DeviceBuffer& device, const std::vector<double>& reference, DType dtype,
                   bool is_float = false);

// Largest error a correct kernel may show, per dtype: see tests/kernels/test_sm90.cpp for the reasoning.
struct Tolerance {
  double relative_l2;
  double max_error_fraction;  // of max |reference|
};
Tolerance tolerance_for(DType dtype);
// The same for a shape: with softcap > 0 widened for the kernels' tanh approximation (MUFU.TANH, relative error
// about 2^-11: a capped score c is off by up to |c| 2^-11, which changes P by that fraction, about one bf16
// rounding of P at |c| = 4; the widening is two bf16 roundoffs on top of the dtype's tolerance).
Tolerance tolerance_for(const AttentionShape& shape);
// The shape's window as the reference takes it (bounds beyond 2^30 keys are the same as open).
SlidingWindow reference_window(const AttentionShape& shape);
bool within(const ErrorStats& stats, const Tolerance& tol);

// Time of `launch` (which enqueues work on the default stream) after `warmup` untimed calls:
//   gpu_ms   the median over `repeats` loops of `iterations` back-to-back calls between two CUDA events,
//            divided by `iterations`: the GPU time per call once the host keeps the queue full (the
//            host's validation and planning overlap the kernels of earlier calls);
//   host_us  the median host time of one call (validation, planning, launches), from the same loops.
// When host_us exceeds gpu_ms the loop is host-bound and gpu_ms measures the host. Throws when a call
// returns an error or a loop hangs.
struct CallTiming {
  double gpu_ms;
  double host_us;
};
CallTiming time_calls(const std::function<Status()>& launch, int warmup, int iterations, int repeats);

// FLOPs of the attention forward: 4 B Hq Sq Sk_avg D, where Sk_avg counts the keys each query row
// sees on average (half of a square causal matrix: Sq Sk_avg is the area of the bottom-right aligned causal
// triangle or trapezoid); the backward does 2.5 times as many.
double forward_flops(const AttentionShape& shape);
inline constexpr double kBackwardFlopsPerForwardFlop = 2.5;

}  // namespace dash::harness
