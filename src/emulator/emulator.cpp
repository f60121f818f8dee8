// The emulated backward kernel: CTA threads that take work units as the plan dispatches them, the
// float32 tile arithmetic of each step, the rank-ordered (or, for the nondeterministic schedule,
// arrival-ordered) dQ reduction, the per-split dK/dV postprocess, and the comparison of runs. Tensors are
// addressed by packed row, so that a dense batch is the varlen batch of equal lengths: sequence b's rows start
// at b * seqlen there, at the sum of the lengths before it in a varlen batch.
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
#include "schedule/job_walk.hpp"

namespace dash {
namespace {

// Reading the clock costs more than a yield, so a waiting CTA checks its timeout only this often.
constexpr int kSpinsPerClockCheck = 256;
constexpr uint64_t kFnvOffsetBasis = 14695981039346656037ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;
constexpr int kSeedWordBits = 32;

// Element offsets in packed (rows, H, D) tensors.
struct Layout {
  int64_t heads, dim;
  int64_t at(int64_t row, int64_t h) const { return (row * heads + h) * dim; }
  size_t size(int64_t rows) const { return static_cast<size_t>(rows * heads * dim); }
};

Layout q_layout(const AttentionShape& s) { return {s.heads_q, s.head_dim}; }
Layout kv_layout(const AttentionShape& s) { return {s.heads_kv, s.head_dim}; }

// Where a sequence lies in the packed tensors: its first query and key rows, and its lengths.
struct Sequence {
  int64_t q_row0;
  int64_t k_row0;
  SequenceLengths lengths;
  // Index of (query head h, row) in the row statistics (lse, rowsum(dO o O)): (Hq, seqlen_q) per sequence, in
  // sequence order, which is (B, Hq, S) for a dense batch.
  int64_t stat(int64_t heads_q, int64_t h, int64_t row) const { return q_row0 * heads_q + h * lengths.seqlen_q + row; }
};

std::vector<Sequence> sequences_of(const AttentionShape& shape, const std::vector<SequenceLengths>& lengths) {
  std::vector<Sequence> sequences;
  int64_t q_row = 0;
  int64_t k_row = 0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    const SequenceLengths len =
        lengths.empty() ? SequenceLengths{static_cast<int>(shape.seqlen_q), static_cast<int>(shape.seqlen_k)}
                        : lengths[b];
    sequences.push_back({q_row, k_row, len});
    q_row += len.seqlen_q;
    k_row += len.seqlen_k;
  }
  return sequences;
}
int64_t total_q_rows(const std::vector<Sequence>& sequences) {
  return sequences.empty() ? 0 : sequences.back().q_row0 + sequences.back().lengths.seqlen_q;
}
int64_t total_k_rows(const std::vector<Sequence>& sequences) {
  return sequences.empty() ? 0 : sequences.back().k_row0 + sequences.back().lengths.seqlen_k;
}

float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void check_arguments(const EmulatorInputs& in, const SchedulePlan& plan, const EmulatorOptions& options) {
  const AttentionShape& s = in.shape;
  const std::vector<Sequence> sequences = sequences_of(s, in.lengths);
  const int64_t total_q = total_q_rows(sequences);
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
  const bool sized = in.q.size() == q_layout(s).size(total_q) && in.dout.size() == in.q.size() &&
                     in.out.size() == in.q.size() && in.k.size() == kv_layout(s).size(total_k_rows(sequences)) &&
                     in.v.size() == in.k.size() && in.lse.size() == static_cast<size_t>(total_q * s.heads_q);
  if (!sized) throw std::invalid_argument("emulate: input tensors do not match the shape");
  if (options.runs < 2) throw std::invalid_argument("emulate: comparing bits needs at least 2 runs");
  if (options.max_delay_us < 0) throw std::invalid_argument("emulate: max_delay_us must be >= 0");
  if (!(options.wait_timeout_s > 0.0)) throw std::invalid_argument("emulate: wait_timeout_s must be > 0");
}

// D = rowsum(dO * O) per (sequence, query head, row), as the preprocess kernel computes it once.
std::vector<float> row_deltas(const EmulatorInputs& in, const std::vector<Sequence>& sequences) {
  const AttentionShape& s = in.shape;
  const Layout lq = q_layout(s);
  std::vector<float> delta(in.lse.size());
  for (const Sequence& seq : sequences) {
    for (int64_t h = 0; h < s.heads_q; ++h) {
      for (int64_t i = 0; i < seq.lengths.seqlen_q; ++i) {
        const int64_t at = lq.at(seq.q_row0 + i, h);
        delta[seq.stat(s.heads_q, h, i)] = dot(in.dout.data() + at, in.out.data() + at, static_cast<int>(s.head_dim));
      }
    }
  }
  return delta;
}

// What a run needs besides the inputs: the sequences, the delta, and each sequence's plan (the plan itself for a
// dense batch; sequence_plan for a varlen one), whose problem gives its dQ tiles' contributions.
struct RunContext {
  const EmulatorInputs& inputs;
  std::vector<Sequence> sequences;
  std::vector<float> delta;
  std::vector<SchedulePlan> sequence_plans;
  bool varlen;  // jobs fitted to each sequence's lengths (for_each_varlen_job_of_unit) rather than the plan's
};

// One execution of the plan with fresh accumulators, semaphores and delays.
class EmulatedRun {
 public:
  EmulatedRun(const RunContext& context, const SchedulePlan& plan, const EmulatorOptions& options, int run)
      : in_(context.inputs),
        context_(context),
        delta_(context.delta),
        plan_(plan),
        p_(plan.problem),
        options_(options),
        run_(run),
        lq_(q_layout(in_.shape)),
        lk_(kv_layout(in_.shape)),
        dim_(static_cast<int>(in_.shape.head_dim)),
        scale_(in_.shape.softmax_scale),
        softcap_(in_.shape.softcap),
        k_rows_(total_k_rows(context.sequences)),
        num_dq_tiles_(p_.batch * p_.heads_q() * p_.real_q_tiles()),
        semaphores_(std::make_unique<std::atomic<int>[]>(static_cast<size_t>(num_dq_tiles_))),
        dq_acc_(in_.q.size(), 0.0f),
        dk_splits_(lk_.size(k_rows_) * p_.group_splits, 0.0f),
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

  // The unit's jobs as the kernels' tile scheduler walks them (schedule/job_walk.hpp).
  void run_unit(int unit, int cta, std::mt19937& rng, Scratch& s) {
    const auto run = [&](const Job& job, const SchedulePlan& job_plan) { run_job(job, job_plan, cta, rng, s); };
    if (context_.varlen) {
      for_each_varlen_job_of_unit(plan_, unit, context_.sequences[varlen_sequence_of_unit(plan_, unit)].lengths, run);
    } else {
      for_each_job_of_unit(plan_, unit, run);
    }
  }

  void run_job(const Job& job, const SchedulePlan& plan, int cta, std::mt19937& rng, Scratch& s) {
    const KvJobCoord kv = p_.kv_coord(job.head);
    const int col0 = job.kv_tile * p_.block_kv;
    const int cols = std::min(p_.block_kv, plan.problem.seqlen_k - col0);
    std::fill(s.dk.begin(), s.dk.end(), 0.0f);
    std::fill(s.dv.begin(), s.dv.end(), 0.0f);
    std::uniform_int_distribution<int> delay_us(0, options_.max_delay_us);
    for (int step = 0; step < job.num_steps; ++step) {
      const Visit visit = visit_at(p_, plan, job, step);
      const QTileCoord qc = p_.q_coord(job.head, visit.q_tile);
      const int row0 = qc.q_tile * p_.block_q;
      const int rows = std::min(p_.block_q, plan.problem.seqlen_q - row0);
      compute_step(plan.problem.mask(), kv, col0, cols, qc, row0, rows, s);
      // The delay stands for everything that makes CTAs reach their reductions at varying times on
      // the GPU (clock, memory and scheduling jitter).
      if (const int us = delay_us(rng); us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
      if (!reduce_dq(visit.dq_tile, visit.rank, qc, row0, rows, cta, s)) return;
    }
    store_dk_dv(kv, col0, cols, s);
  }

  // The kernel's arithmetic for one (key/value tile, query tile) visit, in float32: P, dS, the partial
  // dQ tile, and dK, dV accumulated in the job's accumulators in step order.
  void compute_step(const MaskShape& mask, const KvJobCoord& kv, int col0, int cols, const QTileCoord& qc, int row0,
                    int rows, Scratch& s) {
    const Sequence& q_seq = context_.sequences[qc.batch];
    const Sequence& kv_seq = context_.sequences[kv.batch];
    const float* q = in_.q.data();
    const float* k = in_.k.data();
    const float* v = in_.v.data();
    const float* dout = in_.dout.data();
    for (int r = 0; r < rows; ++r) {
      const int row = row0 + r;
      const int64_t stat = q_seq.stat(p_.heads_q(), qc.head_q, row);
      const float lse = in_.lse[stat];
      const float* q_row = q + lq_.at(q_seq.q_row0 + row, qc.head_q);
      const float* dout_row = dout + lq_.at(q_seq.q_row0 + row, qc.head_q);
      for (int c = 0; c < cols; ++c) {
        const int col = col0 + c;
        const float* k_row = k + lk_.at(kv_seq.k_row0 + col, kv.head_kv);
        const float* v_row = v + lk_.at(kv_seq.k_row0 + col, kv.head_kv);
        const bool seen = mask.visible(row, col) && std::isfinite(lse);
        // Under softcap the score is capped to softcap * tanh(score / softcap), and dS picks up the cap's
        // derivative 1 - tanh^2 (the kernels' arithmetic, with tanh exact here).
        float score = scale_ * dot(q_row, k_row, dim_);
        float cap_slope = 1.0f;
        if (softcap_ > 0.0f) {
          const float t = std::tanh(score / softcap_);
          score = softcap_ * t;
          cap_slope = 1.0f - t * t;
        }
        const float p = seen ? std::exp(score - lse) : 0.0f;
        const float dp = dot(dout_row, v_row, dim_);
        s.p[r * cols + c] = p;
        s.ds[r * cols + c] = p * (dp - delta_[stat]) * cap_slope;
      }
    }
    // The products below sum over keys (dQ) or rows (dK, dV) in ascending order for every element; the
    // loops run along head_dim innermost only so that they touch memory contiguously.
    for (int r = 0; r < rows; ++r) {
      float* dq = s.dq.data() + r * dim_;
      std::fill(dq, dq + dim_, 0.0f);
      for (int c = 0; c < cols; ++c) {
        const float ds = s.ds[r * cols + c];
        const float* k_row = k + lk_.at(kv_seq.k_row0 + col0 + c, kv.head_kv);
        for (int d = 0; d < dim_; ++d) dq[d] += ds * k_row[d];
      }
      for (int d = 0; d < dim_; ++d) dq[d] *= scale_;
    }
    std::fill(s.dv_step.begin(), s.dv_step.end(), 0.0f);
    std::fill(s.dk_step.begin(), s.dk_step.end(), 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* q_row = q + lq_.at(q_seq.q_row0 + row0 + r, qc.head_q);
      const float* dout_row = dout + lq_.at(q_seq.q_row0 + row0 + r, qc.head_q);
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
    float* dst = dq_acc_.data() + lq_.at(context_.sequences[qc.batch].q_row0 + row0, qc.head_q);
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
    const size_t split_offset = lk_.size(k_rows_) * kv.split;
    for (int c = 0; c < cols; ++c) {
      const size_t at = split_offset + lk_.at(context_.sequences[kv.batch].k_row0 + col0 + c, kv.head_kv);
      std::copy_n(s.dk.begin() + c * dim_, dim_, dk_splits_.begin() + at);
      std::copy_n(s.dv.begin() + c * dim_, dim_, dv_splits_.begin() + at);
    }
  }

  // The postprocess of GQA: the parts of a query-head group are summed in split order, so dK and dV
  // stay deterministic whichever part finished first.
  void sum_splits(const std::vector<float>& splits, std::vector<float>* out) const {
    const size_t n = lk_.size(k_rows_);
    out->assign(splits.begin(), splits.begin() + n);
    for (int split = 1; split < p_.group_splits; ++split) {
      for (size_t i = 0; i < n; ++i) (*out)[i] += splits[split * n + i];
    }
  }

  std::string check_contributions() const {
    for (int head = 0; head < p_.num_heads(); ++head) {
      const TiledProblem& seq = context_.sequence_plans[p_.kv_coord(head).batch].problem;
      for (int v = 0; v < seq.num_q_tiles(); ++v) {
        const int tile = p_.dq_tile_index(head, v);
        const int got = semaphores_[tile].load();
        if (got != seq.num_contributors(v)) {
          return "dQ tile " + std::to_string(tile) + " received " + std::to_string(got) + " of " +
                 std::to_string(seq.num_contributors(v)) + " contributions";
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
  const RunContext& context_;
  const std::vector<float>& delta_;
  const SchedulePlan& plan_;
  const TiledProblem& p_;
  const EmulatorOptions& options_;
  const int run_;
  const Layout lq_;
  const Layout lk_;
  const int dim_;
  const float scale_;
  const float softcap_;  // 0: no capping
  const int64_t k_rows_;
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

// The runs of `plan` under `context` and their comparison.
EmulationResult run_and_compare(const RunContext& context, const SchedulePlan& plan, const EmulatorOptions& options) {
  const EmulatorInputs& inputs = context.inputs;
  EmulationResult result;
  bool identical = true;
  for (int run = 0; run < options.runs; ++run) {
    Gradients g;
    const std::string error = EmulatedRun(context, plan, options, run).execute(&g);
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

}  // namespace

double GradientErrors::max() const { return std::max({dq, dk, dv}); }

EmulatorInputs make_emulator_inputs(const AttentionShape& shape, uint64_t seed, SlidingWindow window) {
  return make_varlen_emulator_inputs(shape, {}, seed, window);
}

EmulatorInputs make_varlen_emulator_inputs(const AttentionShape& max_shape, const std::vector<SequenceLengths>& lengths,
                                           uint64_t seed, SlidingWindow window) {
  if (!lengths.empty() && static_cast<int64_t>(lengths.size()) != max_shape.batch) {
    throw std::invalid_argument("make_varlen_emulator_inputs: one length pair per sequence (batch) is needed");
  }
  EmulatorInputs in;
  in.shape = max_shape;
  in.window = window;
  in.lengths = lengths;
  const std::vector<Sequence> sequences = sequences_of(max_shape, lengths);
  const int64_t total_q = total_q_rows(sequences);
  const size_t q_size = q_layout(max_shape).size(total_q);
  const size_t kv_size = kv_layout(max_shape).size(total_k_rows(sequences));
  const size_t stat_size = static_cast<size_t>(total_q * max_shape.heads_q);
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
  in.lse.resize(stat_size);
  const auto widen = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const std::vector<double> q = widen(in.q), k = widen(in.k), v = widen(in.v), dout = widen(in.dout);
  std::vector<double> out(q_size), lse(stat_size);
  in.ref_dq.resize(q_size);
  in.ref_dk.resize(kv_size);
  in.ref_dv.resize(kv_size);
  // Each sequence is a batch of one to the references: its rows are contiguous in the packed tensors, and its row
  // statistics are its (Hq, seqlen_q) block.
  const Layout lq = q_layout(max_shape);
  const Layout lk = kv_layout(max_shape);
  for (const Sequence& seq : sequences) {
    AttentionShape one = max_shape;
    one.batch = 1;
    one.seqlen_q = seq.lengths.seqlen_q;
    one.seqlen_k = seq.lengths.seqlen_k;
    const int64_t qo = lq.at(seq.q_row0, 0);
    const int64_t ko = lk.at(seq.k_row0, 0);
    const int64_t so = seq.stat(max_shape.heads_q, 0, 0);
    reference::attention_forward<float>(one, in.q.data() + qo, in.k.data() + ko, in.v.data() + ko, in.out.data() + qo,
                                        in.lse.data() + so, window, max_shape.softcap);
    reference::attention_forward<double>(one, q.data() + qo, k.data() + ko, v.data() + ko, out.data() + qo,
                                         lse.data() + so, window, max_shape.softcap);
    reference::attention_backward<double>(one, q.data() + qo, k.data() + ko, v.data() + ko, out.data() + qo,
                                          dout.data() + qo, lse.data() + so, in.ref_dq.data() + qo,
                                          in.ref_dk.data() + ko, in.ref_dv.data() + ko, window, max_shape.softcap);
  }
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
  if (!inputs.lengths.empty()) throw std::invalid_argument("emulate: varlen inputs need emulate_varlen");
  check_arguments(inputs, plan, options);
  RunContext context{inputs, sequences_of(inputs.shape, inputs.lengths), {}, {}, false};
  context.delta = row_deltas(inputs, context.sequences);
  context.sequence_plans.assign(static_cast<size_t>(plan.problem.batch), plan);
  return run_and_compare(context, plan, options);
}

EmulationResult emulate_varlen(const EmulatorInputs& inputs, const VarlenPlan& plan, const EmulatorOptions& options) {
  if (inputs.lengths.empty()) throw std::invalid_argument("emulate_varlen: the inputs hold no sequence lengths");
  check_arguments(inputs, plan.plan, options);
  if (const std::string refused = check_varlen_lengths(plan, inputs.lengths); !refused.empty()) {
    throw std::invalid_argument("emulate_varlen: " + refused);
  }
  RunContext context{inputs, sequences_of(inputs.shape, inputs.lengths), {}, {}, true};
  context.delta = row_deltas(inputs, context.sequences);
  for (const SequenceLengths& len : inputs.lengths) context.sequence_plans.push_back(sequence_plan(plan.plan, len));
  return run_and_compare(context, plan.plan, options);
}

EmulationResult emulate(const AttentionShape& shape, const SchedulePlan& plan, const EmulatorOptions& options) {
  return emulate(make_emulator_inputs(shape, options.seed, plan.problem.window), plan, options);
}

}  // namespace dash
