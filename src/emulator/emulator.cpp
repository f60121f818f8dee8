// The emulated backward kernel: CTA threads that take work units as the plan dispatches them, the
// float32 tile arithmetic of each step, the rank-ordered (or, for the nondeterministic schedule,
// arrival-ordered) dQ reduction, the per-split dK/dV postprocess, and the comparison of runs.
#include "emulator/emulator.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "planner/schedule_plan.hpp"
#include "reference/attention_reference.hpp"
#include "schedule/schedule.hpp"

namespace dash {
namespace {

// Reading the clock costs more than a yield, so a waiting CTA checks its timeout only this often.
constexpr int kSpinsPerClockCheck = 256;
constexpr uint64_t kFnvOffsetBasis = 14695981039346656037ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;
constexpr int kSeedWordBits = 32;

// Element offsets in packed (B, S, H, D) tensors.
struct Layout {
  int64_t seqlen, heads, dim;
  int64_t at(int64_t b, int64_t s, int64_t h) const { return ((b * seqlen + s) * heads + h) * dim; }
  size_t size(int64_t batch) const { return static_cast<size_t>(batch * seqlen * heads * dim); }
};

Layout q_layout(const AttentionShape& s) { return {s.seqlen_q, s.heads_q, s.head_dim}; }
Layout kv_layout(const AttentionShape& s) { return {s.seqlen_k, s.heads_kv, s.head_dim}; }
size_t row_stat_size(const AttentionShape& s) { return static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q); }

float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void check_arguments(const EmulatorInputs& in, const SchedulePlan& plan, const EmulatorOptions& options) {
  const AttentionShape& s = in.shape;
  const TiledProblem& p = plan.problem;
  const TiledProblem inputs_problem = make_tiled_problem(s, in.window, 1);  // the inputs' mask, canonical
  const bool same_mask = p.causal == inputs_problem.causal && p.window.left == inputs_problem.window.left &&
                         p.window.right == inputs_problem.window.right;
  const bool same_problem = p.batch == s.batch && p.heads_kv == s.heads_kv && p.heads_q() == s.heads_q &&
                            p.seqlen_q == s.seqlen_q && p.seqlen_k == s.seqlen_k && same_mask;
  if (!same_problem) {
    throw std::invalid_argument("emulate: the plan's tiled problem does not describe the input shape and window");
  }
  if (p.block_q <= 0 || p.block_kv <= 0 || p.group_splits <= 0 || p.group_size % p.group_splits != 0) {
    throw std::invalid_argument("emulate: the plan's tile sizes or group splits are invalid");
  }
  if (plan.kind == Schedule::kAuto) throw std::invalid_argument("emulate: resolve Schedule::kAuto before emulating");
  if (plan.num_ctas <= 0 || plan.num_units < 0 || plan.jobs_per_unit <= 0) {
    throw std::invalid_argument("emulate: the plan needs at least one CTA and one job per unit");
  }
  const bool sized = in.q.size() == q_layout(s).size(s.batch) && in.dout.size() == in.q.size() &&
                     in.out.size() == in.q.size() && in.k.size() == kv_layout(s).size(s.batch) &&
                     in.v.size() == in.k.size() && in.lse.size() == row_stat_size(s);
  if (!sized) throw std::invalid_argument("emulate: input tensors do not match the shape");
  if (options.runs < 2) throw std::invalid_argument("emulate: comparing bits needs at least 2 runs");
  if (options.max_delay_us < 0) throw std::invalid_argument("emulate: max_delay_us must be >= 0");
  if (!(options.wait_timeout_s > 0.0)) throw std::invalid_argument("emulate: wait_timeout_s must be > 0");
}

// D = rowsum(dO * O) per (batch, query head, row), as the preprocess kernel computes it once.
std::vector<float> row_deltas(const EmulatorInputs& in) {
  const AttentionShape& s = in.shape;
  const Layout lq = q_layout(s);
  std::vector<float> delta(row_stat_size(s));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads_q; ++h) {
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        delta[(b * s.heads_q + h) * s.seqlen_q + i] =
            dot(in.dout.data() + lq.at(b, i, h), in.out.data() + lq.at(b, i, h), static_cast<int>(s.head_dim));
      }
    }
  }
  return delta;
}

// One execution of the plan with fresh accumulators, semaphores and delays.
class EmulatedRun {
 public:
  EmulatedRun(const EmulatorInputs& in, const std::vector<float>& delta, const SchedulePlan& plan,
              const EmulatorOptions& options, int run)
      : in_(in), delta_(delta), plan_(plan), p_(plan.problem), options_(options), run_(run),
        lq_(q_layout(in.shape)), lk_(kv_layout(in.shape)), dim_(static_cast<int>(in.shape.head_dim)),
        scale_(in.shape.softmax_scale), num_dq_tiles_(p_.batch * p_.heads_q() * p_.real_q_tiles()),
        semaphores_(std::make_unique<std::atomic<int>[]>(static_cast<size_t>(num_dq_tiles_))),
        dq_acc_(lq_.size(in.shape.batch), 0.0f),
        dk_splits_(lk_.size(in.shape.batch) * p_.group_splits, 0.0f),
        dv_splits_(dk_splits_.size(), 0.0f) {}

  // Runs every CTA to completion; returns why the run failed, or an empty string.
  std::string execute(Gradients* out) {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(plan_.num_ctas));
    try {
      for (int cta = 0; cta < plan_.num_ctas; ++cta) threads.emplace_back([this, cta] { cta_main(cta); });
    } catch (const std::system_error& e) {
      fail(std::string("could not start a thread per CTA: ") + e.what());
    }
    for (std::thread& t : threads) t.join();
    if (aborted_.load()) return error_;
    if (std::string missing = check_contributions(); !missing.empty()) return missing;
    out->dq = std::move(dq_acc_);
    sum_splits(dk_splits_, &out->dk);
    sum_splits(dv_splits_, &out->dv);
    return {};
  }

 private:
  // Per-CTA buffers: the job's dK/dV accumulators and one step's tiles (P, dS, the partial dQ, and
  // the step's P^T dO and dS^T Q before they are added to the accumulators).
  struct Scratch {
    std::vector<float> p, ds, dq, dk, dv, dk_step, dv_step;
  };

  void cta_main(int cta) {
    try {
      std::seed_seq seq{static_cast<uint32_t>(options_.seed), static_cast<uint32_t>(options_.seed >> kSeedWordBits),
                        static_cast<uint32_t>(run_), static_cast<uint32_t>(cta)};
      std::mt19937 rng(seq);
      Scratch scratch;
      scratch.p.resize(static_cast<size_t>(p_.block_q) * p_.block_kv);
      scratch.ds.resize(scratch.p.size());
      scratch.dq.resize(static_cast<size_t>(p_.block_q) * dim_);
      scratch.dk.resize(static_cast<size_t>(p_.block_kv) * dim_);
      scratch.dv.resize(scratch.dk.size());
      scratch.dk_step.resize(scratch.dk.size());
      scratch.dv_step.resize(scratch.dk.size());
      if (plan_.dispatch == Dispatch::kStatic) {
        for (int i = 0; i < static_unit_count(plan_, cta) && !aborted_.load(); ++i) {
          run_unit(static_unit(plan_, cta, i), cta, rng, scratch);
        }
      } else {
        for (int unit = next_unit_.fetch_add(1); unit < plan_.num_units && !aborted_.load();
             unit = next_unit_.fetch_add(1)) {
          run_unit(unit, cta, rng, scratch);
        }
      }
    } catch (const std::exception& e) {
      fail("CTA " + std::to_string(cta) + ": " + e.what());
    }
  }

  void run_unit(int unit, int cta, std::mt19937& rng, Scratch& s) {
    for (int sub = 0; sub < plan_.jobs_per_unit; ++sub) {
      const Job job = make_job(plan_, unit, sub);
      if (job.valid) run_job(job, cta, rng, s);
    }
  }

  void run_job(const Job& job, int cta, std::mt19937& rng, Scratch& s) {
    const KvJobCoord kv = p_.kv_coord(job.head);
    const int col0 = job.kv_tile * p_.block_kv;
    const int cols = std::min(p_.block_kv, p_.seqlen_k - col0);
    std::fill(s.dk.begin(), s.dk.end(), 0.0f);
    std::fill(s.dv.begin(), s.dv.end(), 0.0f);
    std::uniform_int_distribution<int> delay_us(0, options_.max_delay_us);
    for (int step = 0; step < job.num_steps; ++step) {
      const int v = q_tile_at(plan_, job, step);
      const QTileCoord qc = p_.q_coord(job.head, v);
      const int row0 = qc.q_tile * p_.block_q;
      const int rows = std::min(p_.block_q, p_.seqlen_q - row0);
      compute_step(kv, col0, cols, qc, row0, rows, s);
      // The delay stands for everything that makes CTAs reach their reductions at varying times on
      // the GPU (clock, memory and scheduling jitter).
      if (const int us = delay_us(rng); us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
      if (!reduce_dq(p_.dq_tile_index(job.head, v), rank_of(plan_, job, v), qc, row0, rows, cta, s)) return;
    }
    store_dk_dv(kv, col0, cols, s);
  }

  // The kernel's arithmetic for one (key/value tile, query tile) visit, in float32: P, dS, the partial
  // dQ tile, and dK, dV accumulated in the job's accumulators in step order.
  void compute_step(const KvJobCoord& kv, int col0, int cols, const QTileCoord& qc, int row0, int rows, Scratch& s) {
    const MaskShape mask = p_.mask();
    const float* q = in_.q.data();
    const float* k = in_.k.data();
    const float* v = in_.v.data();
    const float* dout = in_.dout.data();
    for (int r = 0; r < rows; ++r) {
      const int row = row0 + r;
      const size_t stat = (static_cast<size_t>(qc.batch) * p_.heads_q() + qc.head_q) * p_.seqlen_q + row;
      const float lse = in_.lse[stat];
      const float* q_row = q + lq_.at(qc.batch, row, qc.head_q);
      const float* dout_row = dout + lq_.at(qc.batch, row, qc.head_q);
      for (int c = 0; c < cols; ++c) {
        const int col = col0 + c;
        const float* k_row = k + lk_.at(kv.batch, col, kv.head_kv);
        const float* v_row = v + lk_.at(kv.batch, col, kv.head_kv);
        const bool seen = mask.visible(row, col) && std::isfinite(lse);
        const float p = seen ? std::exp(scale_ * dot(q_row, k_row, dim_) - lse) : 0.0f;
        const float dp = dot(dout_row, v_row, dim_);
        s.p[r * cols + c] = p;
        s.ds[r * cols + c] = p * (dp - delta_[stat]);
      }
    }
    // The products below sum over keys (dQ) or rows (dK, dV) in ascending order for every element; the
    // loops run along head_dim innermost only so that they touch memory contiguously.
    for (int r = 0; r < rows; ++r) {
      float* dq = s.dq.data() + r * dim_;
      std::fill(dq, dq + dim_, 0.0f);
      for (int c = 0; c < cols; ++c) {
        const float ds = s.ds[r * cols + c];
        const float* k_row = k + lk_.at(kv.batch, col0 + c, kv.head_kv);
        for (int d = 0; d < dim_; ++d) dq[d] += ds * k_row[d];
      }
      for (int d = 0; d < dim_; ++d) dq[d] *= scale_;
    }
    std::fill(s.dv_step.begin(), s.dv_step.end(), 0.0f);
    std::fill(s.dk_step.begin(), s.dk_step.end(), 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* q_row = q + lq_.at(qc.batch, row0 + r, qc.head_q);
      const float* dout_row = dout + lq_.at(qc.batch, row0 + r, qc.head_q);
      for (int c = 0; c < cols; ++c) {
        const float p = s.p[r * cols + c];
        const float ds = s.ds[r * cols + c];
        float* dv_step = s.dv_step.data() + c * dim_;
        float* dk_step = s.dk_step.data() + c * dim_;
        for (int d = 0; d < dim_; ++d) {
          dv_step[d] += p * dout_row[d];
          dk_step[d] += ds * q_row[d];
        }
      }
    }
    for (int i = 0; i < cols * dim_; ++i) {
      s.dv[i] += s.dv_step[i];
      s.dk[i] += scale_ * s.dk_step[i];
    }
  }

  // Adds the partial dQ tile into the global accumulator in its rank's turn, or, unordered, with
  // atomic adds in whatever order the CTAs arrive. Returns false when the run was aborted.
  bool reduce_dq(int tile, int rank, const QTileCoord& qc, int row0, int rows, int cta, const Scratch& s) {
    float* dst = dq_acc_.data() + lq_.at(qc.batch, row0, qc.head_q);
    const int64_t row_stride = lq_.heads * lq_.dim;
    std::atomic<int>& semaphore = semaphores_[tile];
    if (rank == kUnordered) {
      for (int r = 0; r < rows; ++r) {
        for (int d = 0; d < dim_; ++d) {
          std::atomic_ref<float>(dst[r * row_stride + d]).fetch_add(s.dq[r * dim_ + d], std::memory_order_relaxed);
        }
      }
      // Counts arrivals, so that the end-of-run check sees a missing contribution here too.
      semaphore.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    if (!wait_for_rank(semaphore, tile, rank, cta)) return false;
    for (int r = 0; r < rows; ++r) {
      for (int d = 0; d < dim_; ++d) dst[r * row_stride + d] += s.dq[r * dim_ + d];
    }
    semaphore.store(rank + 1, std::memory_order_release);
    return true;
  }

  bool wait_for_rank(const std::atomic<int>& semaphore, int tile, int rank, int cta) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.wait_timeout_s);
    for (int spins = 1; semaphore.load(std::memory_order_acquire) != rank; ++spins) {
      if (aborted_.load(std::memory_order_relaxed)) return false;
      if (spins % kSpinsPerClockCheck == 0 && std::chrono::steady_clock::now() > deadline) {
        fail("deadlock: CTA " + std::to_string(cta) + " waited more than " + std::to_string(options_.wait_timeout_s) +
             " s on dQ tile " + std::to_string(tile) + " for rank " + std::to_string(rank) + " (semaphore at " +
             std::to_string(semaphore.load()) + ")");
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  }

  // A job owns its (batch, head_kv, kv_tile, split) rows alone, so the store needs no synchronization.
  void store_dk_dv(const KvJobCoord& kv, int col0, int cols, const Scratch& s) {
    const size_t split_offset = lk_.size(in_.shape.batch) * kv.split;
    for (int c = 0; c < cols; ++c) {
      const size_t at = split_offset + lk_.at(kv.batch, col0 + c, kv.head_kv);
      std::copy_n(s.dk.begin() + c * dim_, dim_, dk_splits_.begin() + at);
      std::copy_n(s.dv.begin() + c * dim_, dim_, dv_splits_.begin() + at);
    }
  }

  // The postprocess of GQA: the parts of a query-head group are summed in split order, so dK and dV
  // stay deterministic whichever part finished first.
  void sum_splits(const std::vector<float>& splits, std::vector<float>* out) const {
    const size_t n = lk_.size(in_.shape.batch);
    out->assign(splits.begin(), splits.begin() + n);
    for (int split = 1; split < p_.group_splits; ++split) {
      for (size_t i = 0; i < n; ++i) (*out)[i] += splits[split * n + i];
    }
  }

  std::string check_contributions() const {
    for (int head = 0; head < p_.num_heads(); ++head) {
      for (int v = 0; v < p_.num_q_tiles(); ++v) {
        const int tile = p_.dq_tile_index(head, v);
        const int got = semaphores_[tile].load();
        if (got != p_.num_contributors(v)) {
          return "dQ tile " + std::to_string(tile) + " received " + std::to_string(got) + " of " +
                 std::to_string(p_.num_contributors(v)) + " contributions";
        }
      }
    }
    return {};
  }

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_.empty()) error_ = why;
    aborted_.store(true);
  }

  const EmulatorInputs& in_;
  const std::vector<float>& delta_;
  const SchedulePlan& plan_;
  const TiledProblem& p_;
  const EmulatorOptions& options_;
  const int run_;
  const Layout lq_;
  const Layout lk_;
  const int dim_;
  const float scale_;
  const int num_dq_tiles_;
  std::unique_ptr<std::atomic<int>[]> semaphores_;
  std::vector<float> dq_acc_;
  std::vector<float> dk_splits_;  // group_splits copies of dK, summed after the run
  std::vector<float> dv_splits_;
  std::atomic<int> next_unit_{0};
  std::atomic<bool> aborted_{false};
  std::mutex error_mutex_;
  std::string error_;
};

void hash_bits(const std::vector<float>& values, uint64_t* hash) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) *hash = (*hash ^ bytes[i]) * kFnvPrime;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double relative_error(const std::vector<float>& x, const std::vector<double>& ref) {
  double max_err = 0.0;
  double max_ref = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_err = std::max(max_err, std::abs(static_cast<double>(x[i]) - ref[i]));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  return max_ref > 0.0 ? max_err / max_ref : max_err;
}

}  // namespace

double GradientErrors::max() const { return std::max({dq, dk, dv}); }

EmulatorInputs make_emulator_inputs(const AttentionShape& shape, uint64_t seed, SlidingWindow window) {
  EmulatorInputs in;
  in.shape = shape;
  in.window = window;
  const size_t q_size = q_layout(shape).size(shape.batch);
  const size_t kv_size = kv_layout(shape).size(shape.batch);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::vector<float>* t : {&in.q, &in.dout}) {
    t->resize(q_size);
    for (float& x : *t) x = uniform(rng);
  }
  for (std::vector<float>* t : {&in.k, &in.v}) {
    t->resize(kv_size);
    for (float& x : *t) x = uniform(rng);
  }
  in.out.resize(q_size);
  in.lse.resize(row_stat_size(shape));
  reference::attention_forward<float>(shape, in.q.data(), in.k.data(), in.v.data(), in.out.data(), in.lse.data(),
                                      window);

  const auto widen = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const std::vector<double> q = widen(in.q), k = widen(in.k), v = widen(in.v), dout = widen(in.dout);
  std::vector<double> out(q_size), lse(row_stat_size(shape));
  reference::attention_forward<double>(shape, q.data(), k.data(), v.data(), out.data(), lse.data(), window);
  in.ref_dq.resize(q_size);
  in.ref_dk.resize(kv_size);
  in.ref_dv.resize(kv_size);
  reference::attention_backward<double>(shape, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(),
                                        in.ref_dq.data(), in.ref_dk.data(), in.ref_dv.data(), window);
  return in;
}

TiledProblem make_emulator_problem(const AttentionShape& shape, TileShape tiles, int group_splits,
                                   SlidingWindow window) {
  TiledProblem p = make_tiled_problem(shape, window, std::max(group_splits, 1));
  p.block_q = tiles.block_q;
  p.block_kv = tiles.block_kv;
  if (group_splits <= 0) {
    p.group_splits = choose_group_splits(p.batch, p.heads_kv, p.group_size, p.num_kv_tiles());
  }
  return p;
}

EmulationResult emulate(const EmulatorInputs& inputs, const SchedulePlan& plan, const EmulatorOptions& options) {
  check_arguments(inputs, plan, options);
  const std::vector<float> delta = row_deltas(inputs);
  EmulationResult result;
  bool identical = true;
  for (int run = 0; run < options.runs; ++run) {
    Gradients g;
    const std::string error = EmulatedRun(inputs, delta, plan, options, run).execute(&g);
    if (!error.empty()) {
      result.error = "run " + std::to_string(run) + ": " + error;
      return result;
    }
    uint64_t hash = kFnvOffsetBasis;
    for (const std::vector<float>* t : {&g.dq, &g.dk, &g.dv}) hash_bits(*t, &hash);
    result.run_hashes.push_back(hash);
    GradientErrors& e = result.error_vs_reference;
    e.dq = std::max(e.dq, relative_error(g.dq, inputs.ref_dq));
    e.dk = std::max(e.dk, relative_error(g.dk, inputs.ref_dk));
    e.dv = std::max(e.dv, relative_error(g.dv, inputs.ref_dv));
    if (run == 0) {
      result.gradients = std::move(g);
    } else {
      identical = identical && same_bits(g.dq, result.gradients.dq) && same_bits(g.dk, result.gradients.dk) &&
                  same_bits(g.dv, result.gradients.dv);
    }
    ++result.runs;
  }
  result.completed = true;
  result.bitwise_identical = identical;
  return result;
}

EmulationResult emulate(const AttentionShape& shape, const SchedulePlan& plan, const EmulatorOptions& options) {
  return emulate(make_emulator_inputs(shape, options.seed, plan.problem.window), plan, options);
}

}  // namespace dash
