// Varlen plans: which schedules are admitted for every vector of lengths (the argument is in varlen_plan.hpp), the
// proof of a plan, the lengths from cu_seqlens, and the expansion and validation of a plan fitted to concrete
// lengths.
#include "planner/varlen_plan.hpp"

#include <string>
#include <vector>

#include "planner/schedule_plan.hpp"

namespace dash {
namespace {

// Why `plan`'s schedule is not proven for every admitted vector of lengths, or empty. Names every Schedule
// without a default (-Werror=switch): a new schedule must state here whether varlen plans of it are proven.
std::string varlen_refusal(const VarlenPlan& varlen) {
  const SchedulePlan& plan = varlen.plan;
  const TiledProblem& p = plan.problem;
  switch (plan.kind) {
    case Schedule::kAscending:
    case Schedule::kDescending:
    case Schedule::kShortestFirst:
    case Schedule::kNondeterministic: return {};
    case Schedule::kShift:
      if (!varlen.keys_within_queries) {
        return "shift is proven for varlen batches only where every sequence has seqlen_k <= seqlen_q (plan with "
               "keys_within_queries): a sequence of few query tiles and many key/value tiles would put a wave's "
               "lanes on one query tile at once; use ascending";
      }
      if (p.block_q > p.block_kv) return "shift on varlen batches needs block_q <= block_kv";
      return {};
    case Schedule::kSymmetricShift:
      if (p.windowed()) {
        return "symmetric-shift under a sliding window is not proven for varlen batches (the folded triangle "
               "depends on each sequence's lengths); use shortest-first";
      }
      if (!varlen.keys_within_queries) {
        return "symmetric-shift is proven for varlen batches only where every sequence has seqlen_k <= seqlen_q "
               "(plan with keys_within_queries): otherwise a sequence's first key/value tiles start on the same "
               "query tile; use shortest-first";
      }
      if (p.block_kv % p.block_q != 0) return "symmetric-shift on varlen batches needs block_kv a multiple of block_q";
      return {};
    case Schedule::kAuto: return "auto is not a schedule; resolve it first";
  }
  return "Schedule(" + std::to_string(static_cast<int>(plan.kind)) + ") is not a schedule";
}

std::string sequence_name(size_t b) { return "sequence " + std::to_string(b); }

}  // namespace

VarlenPlanResult plan_varlen_schedule(const TiledProblem& max_problem, bool keys_within_queries, Schedule schedule,
                                      int num_sms) {
  const auto plan_of = [&](Schedule kind) {
    VarlenPlanResult result;
    const PlanResult dense = make_schedule_plan(max_problem, kind, num_sms);
    result.plan = VarlenPlan{dense.plan, keys_within_queries};
    result.rejected = dense.ok() ? varlen_refusal(result.plan) : dense.rejected;
    return result;
  };
  if (schedule != Schedule::kAuto) return plan_of(schedule);
  VarlenPlanResult chosen = plan_of(choose_schedule(max_problem, num_sms));
  return chosen.ok() ? chosen : plan_of(Schedule::kAscending);
}

PlanProof prove_varlen_plan(const VarlenPlan& plan) {
  PlanProof proof;
  if (const std::string refusal = varlen_refusal(plan); !refusal.empty()) {
    proof.summary = "varlen: " + refusal;
    return proof;
  }
  proof = prove_plan(plan.plan);
  if (proof.ok() && !proof.stats.by_structure) {
    proof.summary = "varlen: the maximum plan was proven by enumeration, not by structure, so its proof says "
                    "nothing about shorter sequences";
  }
  return proof;
}

std::vector<SequenceLengths> lengths_from_cu_seqlens(const std::vector<int>& cu_seqlens_q,
                                                     const std::vector<int>& cu_seqlens_k, std::string* error) {
  std::vector<SequenceLengths> lengths;
  if (cu_seqlens_q.size() != cu_seqlens_k.size() || cu_seqlens_q.empty()) {
    *error = "cu_seqlens_q and cu_seqlens_k must hold the same number (b + 1 >= 1) of offsets";
    return {};
  }
  if (cu_seqlens_q[0] != 0 || cu_seqlens_k[0] != 0) {
    *error = "cu_seqlens_q and cu_seqlens_k must start at 0";
    return {};
  }
  for (size_t b = 0; b + 1 < cu_seqlens_q.size(); ++b) {
    const SequenceLengths len{cu_seqlens_q[b + 1] - cu_seqlens_q[b], cu_seqlens_k[b + 1] - cu_seqlens_k[b]};
    if (len.seqlen_q < 0 || len.seqlen_k < 0) {
      *error = "cu_seqlens decrease at " + sequence_name(b);
      return {};
    }
    lengths.push_back(len);
  }
  return lengths;
}

std::string check_varlen_lengths(const VarlenPlan& plan, const std::vector<SequenceLengths>& lengths) {
  const TiledProblem& p = plan.plan.problem;
  if (static_cast<long long>(lengths.size()) != p.batch) {
    return "the plan is for " + std::to_string(p.batch) + " sequences, not " + std::to_string(lengths.size());
  }
  for (size_t b = 0; b < lengths.size(); ++b) {
    const SequenceLengths len = lengths[b];
    if (len.seqlen_q < 0 || len.seqlen_q > p.seqlen_q || len.seqlen_k < 0 || len.seqlen_k > p.seqlen_k) {
      return sequence_name(b) + " (seqlen_q " + std::to_string(len.seqlen_q) + ", seqlen_k " +
             std::to_string(len.seqlen_k) + ") exceeds the plan's maxima (" + std::to_string(p.seqlen_q) + ", " +
             std::to_string(p.seqlen_k) + ")";
    }
    if (plan.keys_within_queries && len.seqlen_k > len.seqlen_q) {
      return sequence_name(b) + " has seqlen_k " + std::to_string(len.seqlen_k) + " > seqlen_q " +
             std::to_string(len.seqlen_q) + ", which the plan (keys_within_queries) does not admit";
    }
  }
  return {};
}

ExpandedSchedule expand_varlen_schedule(const VarlenPlan& varlen, const std::vector<SequenceLengths>& lengths) {
  const SchedulePlan& plan = varlen.plan;
  const TiledProblem& p = plan.problem;
  ExpandedSchedule out;
  out.plan = plan;
  out.num_dq_tiles = p.batch * p.heads_q() * p.real_q_tiles();
  out.contributions.assign(static_cast<size_t>(out.num_dq_tiles), 0);
  for (int head = 0; head < p.num_heads(); ++head) {
    const TiledProblem seq = sequence_problem(p, lengths[p.kv_coord(head).batch]);
    for (int v = 0; v < seq.num_q_tiles(); ++v) out.contributions[p.dq_tile_index(head, v)] = seq.num_contributors(v);
  }
  out.unit_first_job.reserve(static_cast<size_t>(plan.num_units) + 1);
  for (int unit = 0; unit < plan.num_units; ++unit) {
    out.unit_first_job.push_back(static_cast<int>(out.jobs.size()));
    const SequenceLengths len = lengths[varlen_sequence_of_unit(plan, unit)];
    const SchedulePlan fitted = sequence_plan(plan, len);
    for (int sub = 0; sub < plan.jobs_per_unit; ++sub) {
      const Job job = make_varlen_job(plan, unit, sub, len);
      if (!job.valid) continue;
      out.jobs.push_back({job, unit, static_cast<int>(out.steps.size())});
      for (int step = 0; step < job.num_steps; ++step) {
        const int v = q_tile_at(fitted, job, step);
        out.steps.push_back({v, p.dq_tile_index(job.head, v), rank_of(fitted, job, v)});
      }
    }
  }
  out.unit_first_job.push_back(static_cast<int>(out.jobs.size()));
  return out;
}

ValidationReport validate_varlen_schedule(const ExpandedSchedule& s, const std::vector<SequenceLengths>& lengths) {
  const TiledProblem& p = s.plan.problem;
  const int n_max = p.num_kv_tiles();
  std::vector<char> job_seen(static_cast<size_t>(p.num_heads()) * n_max, 0);
  std::vector<int> visit_stamp(static_cast<size_t>(p.num_q_tiles()), -1);
  ValidationReport report;
  std::string& error = report.coverage_error;
  for (int j = 0; j < static_cast<int>(s.jobs.size()) && error.empty(); ++j) {
    const Job& job = s.jobs[j].job;
    const std::string name = "job (head " + std::to_string(job.head) + ", kv tile " + std::to_string(job.kv_tile) + ")";
    if (job.head < 0 || job.head >= p.num_heads()) {
      error = name + " is out of range";
      break;
    }
    const TiledProblem seq = sequence_problem(p, lengths[p.kv_coord(job.head).batch]);
    if (job.kv_tile < 0 || job.kv_tile >= seq.num_kv_tiles()) {
      error = name + " lies past its sequence's key/value tiles";
    } else if (job_seen[static_cast<size_t>(job.head) * n_max + job.kv_tile]++) {
      error = name + " is scheduled twice";
    } else if (job.q_begin != seq.q_begin(job.kv_tile) || job.q_end != seq.q_end(job.kv_tile) ||
               job.num_steps != job.q_end - job.q_begin) {
      error = name + " does not cover the query tiles its sequence's mask sees";
    }
    for (int k = s.jobs[j].first_step; k < s.job_end_step(j) && error.empty(); ++k) {
      const int v = s.steps[k].q_tile;
      if (v < job.q_begin || v >= job.q_end) {
        error = name + " visits query tile " + std::to_string(v) + " outside its range";
      } else if (visit_stamp[v] == j) {
        error = name + " visits query tile " + std::to_string(v) + " twice";
      }
      if (error.empty()) visit_stamp[v] = j;
    }
  }
  for (int head = 0; head < p.num_heads() && error.empty(); ++head) {
    const int n = sequence_problem(p, lengths[p.kv_coord(head).batch]).num_kv_tiles();
    for (int k = 0; k < n && error.empty(); ++k) {
      if (!job_seen[static_cast<size_t>(head) * n_max + k]) {
        error = "job (head " + std::to_string(head) + ", kv tile " + std::to_string(k) + ") is never scheduled";
      }
    }
  }
  return error.empty() ? validate_orders(s) : report;
}

}  // namespace dash
