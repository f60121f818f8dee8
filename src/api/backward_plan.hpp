// What a BackwardPlan holds, and the one way into it: BackwardPlanAccess makes plans and reads them for the
// API's own files. A plan is made only by plan_backward() from a validated shape and schedule and a proven
// schedule plan, and never changes afterwards, so whoever holds one may launch it without checking it again.
#pragma once

#include <memory>
#include <utility>

#include "dash/attention.hpp"
#include "kernels/kernel_params.hpp"
#include "schedule/plan.hpp"

namespace dash {

struct BackwardPlanData {
  AttentionShape shape;
  Schedule requested_schedule = Schedule::kAuto;
  int device_index = 0;
  int multiprocessor_count = 0;  // the device's SM count
  int sm_margin = 0;             // SMs left to other work
  int planned_sm_count = 0;      // multiprocessor_count - sm_margin: what the schedule was planned for
  // Packed varlen batches: `shape` is the maximum problem, schedule_plan its plan, proven for every vector of lengths
  // within the maxima (and seqlen_k <= seqlen_q per sequence where keys_within_queries), planner/varlen_plan.hpp.
  bool varlen = false;
  bool keys_within_queries = false;
  SchedulePlan schedule_plan{};          // proven for `shape` on min(units, planned_sm_count) persistent CTAs
  kernels::BackwardWorkspace workspace;  // the layout of schedule_plan's buffers
};

struct BackwardPlanAccess {
  static BackwardPlan make(BackwardPlanData data) {
    BackwardPlan plan;
    plan.data_ = std::make_shared<const BackwardPlanData>(std::move(data));
    return plan;
  }
  // Null for an empty plan.
  static const BackwardPlanData* data(const BackwardPlan& plan) { return plan.data_.get(); }
};

// kOk if `args` is a call of `plan`: args.shape equal to plan.shape in every field, args.schedule the
// requested schedule, args.sm_margin the plan's, and a varlen call for a varlen plan with its promise
// (keys_within_queries; not the hint lengths_fill_maxima auto was resolved with, which restricts no call).
// Otherwise kInvalidArgument naming the first field that differs ("shape.seqlen_q", as validate() names it,
// "schedule", "sm_margin", "varlen" or "varlen.keys_within_queries"), with both values.
Status check_args_match_plan(const BackwardArgs& args, const BackwardPlanData& plan);

}  // namespace dash
