// Varlen plans: which schedules are admitted for every vector of lengths (the argument is in varlen_plan.hpp), what
// auto runs on a varlen batch, the proof of a plan, the lengths from cu_seqlens, and the expansion and validation of
// a plan fitted to concrete lengths.
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
    case Schedule::kNondeterministic:
      return {};
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
      return symmetric_shift_tile_refusal(p);
    case Schedule::kAuto:
      return "auto is not a schedule; resolve it first";
  }
  return "Schedule(" + std::to_string(static_cast<int>(plan.kind)) + ") is not a schedule";
}

std::string sequence_name(size_t b) { return "sequence " + std::to_string(b); }

// Head h of the maximum problem covers its sequence's problem.
HeadProblem sequence_of_head(const TiledProblem& max_problem, const std::vector<SequenceLengths>& lengths) {
  return [&max_problem, &lengths](int head) {
    return sequence_problem(max_problem, lengths[max_problem.kv_coord(head).batch]);
  };
}

}  // namespace

// From measurements of these kernels on an H200 (docs/HISTORY.md; bf16, 16384 tokens, 2048 / head_dim heads): under the
// full mask, shift beat shortest-first by up to 15% on sequences all at the maxima, but on lengths uniform in
// [S/2, 3S/2] shortest-first beat shift by 7-15% (hd128, S 1024: 338 against 298 TFLOPS; hd128, S 2048: 432 against
// 376; hd64, S 1024: 318 against 283). Under the causal mask choose_auto already picks shortest-first (without
// folded GQA groups), the fastest there, so only the full mask reads the hint. The host cannot read the lengths
// (cu_seqlens stay on the device), but the packed rows bound them: fewer than batch * maximum rows leave some
// sequence shorter than the maxima.
AutoChoice choose_varlen_auto(const TiledProblem& max_problem, bool lengths_fill_maxima, int num_sms) {
  if (!lengths_fill_maxima && !max_problem.causal && !max_problem.windowed()) {
    return {Schedule::kShortestFirst,
            "full mask on a varlen batch whose packed rows leave some sequence shorter than the maxima: "
            "shortest-first measured 7-15% faster than shift on mixed lengths"};
  }
  return choose_auto(max_problem, num_sms);
}

VarlenPlanResult plan_varlen_schedule(const TiledProblem& max_problem, bool keys_within_queries,
                                      bool lengths_fill_maxima, Schedule schedule, int num_sms) {
  const auto plan_of = [&](Schedule kind) {
    VarlenPlanResult result;
    const PlanResult dense = make_schedule_plan(max_problem, kind, num_sms);
    result.plan = VarlenPlan{dense.plan, keys_within_queries};
    result.rejected = dense.ok() ? varlen_refusal(result.plan) : dense.rejected;
    return result;
  };
  if (schedule != Schedule::kAuto) return plan_of(schedule);
  VarlenPlanResult chosen = plan_of(choose_varlen_auto(max_problem, lengths_fill_maxima, num_sms).schedule);
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
    proof.summary =
        "varlen: the maximum plan was proven by enumeration, not by structure, so its proof says "
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
  return expand_schedule(plan, sequence_of_head(plan.problem, lengths), [&](int unit, const OnJob& on_job) {
    for_each_varlen_job_of_unit(plan, unit, lengths[varlen_sequence_of_unit(plan, unit)], on_job);
  });
}

ValidationReport validate_varlen_schedule(const ExpandedSchedule& s, const std::vector<SequenceLengths>& lengths) {
  return validate_schedule(s, sequence_of_head(s.plan.problem, lengths));
}

}  // namespace dash
