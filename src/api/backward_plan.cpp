// plan_backward() and what a BackwardPlan answers. Planning validates the shape, the schedule and the SM margin
// before anything uses them (the planner and the workspace layout assume a valid shape), resolves kAuto, plans
// for the device's SM count less the margin and proves the plan; only a proven plan becomes a BackwardPlan. Launching is in
// attention.cpp; what it checks of a call against a plan (check_args_match_plan) is here.
#include "api/backward_plan.hpp"

#include <limits>
#include <sstream>
#include <string>

#include "api/device.hpp"
#include "api/proven_schedules.hpp"
#include "api/validate.hpp"
#include "planner/schedule_plan.hpp"
#include "planner/varlen_plan.hpp"
#include "schedule/shift_schedules.hpp"

namespace dash {
namespace {

// What an empty plan's accessors read: zeros, kAuto.
const BackwardPlanData& empty_plan_data() {
  static const BackwardPlanData empty{};
  return empty;
}

const BackwardPlanData& data_or_empty(const BackwardPlan& plan) {
  const BackwardPlanData* data = BackwardPlanAccess::data(plan);
  return data != nullptr ? *data : empty_plan_data();
}

Status check_device_info(const DeviceInfo& device) {
  if (device.index < 0) {
    return {StatusCode::kInvalidArgument, "device.index must be >= 0, got " + std::to_string(device.index)};
  }
  if (device.multiprocessor_count <= 0) {
    return {StatusCode::kInvalidArgument,
            "device.multiprocessor_count must be > 0, got " + std::to_string(device.multiprocessor_count)};
  }
  return Status::success();
}

// The values of one field a call and its plan disagree on, in the words of the message.
template <typename Value>
Status mismatch(const char* field, const Value& given, const Value& planned) {
  std::ostringstream message;
  // Enough digits that two different softmax scales never print alike.
  message.precision(std::numeric_limits<float>::max_digits10);
  message << std::boolalpha << field << " is " << given << ", but the plan was made for " << planned
          << " (make a plan for this call)";
  return {StatusCode::kInvalidArgument, message.str()};
}

std::string quoted(Schedule schedule) { return std::string("'").append(schedule_name(schedule)).append("'"); }

// The checks of plan_backward()'s own arguments, which the planner relies on; sm_margin's upper bound needs the
// device, so make_plan() checks it.
Status check_plan_request(const AttentionShape& shape, Schedule schedule, int sm_margin, const BackwardPlan* plan) {
  if (plan == nullptr) return {StatusCode::kInvalidArgument, "plan_backward: plan must not be null"};
  if (Status s = validate(shape); !s.ok()) return s;
  if (Status s = check_backward_head_dim(shape); !s.ok()) return s;
  if (Status s = check_schedule(schedule); !s.ok()) return s;
  return check_sm_margin(sm_margin);
}

// What a plan is for beyond its shape: a dense batch, or a packed varlen batch with or without the promise that
// every sequence has seqlen_k <= seqlen_q, and the hint for auto whether every sequence can be as long as the maxima.
struct BatchKind {
  bool varlen = false;
  bool keys_within_queries = false;
  bool lengths_fill_maxima = true;
};

// The varlen plan of `schedule` for the maximum problem `problem`, proven for every admitted vector of lengths
// (planner/varlen_plan.hpp); kScheduleRejected saying why where it is not.
Status plan_varlen(const TiledProblem& problem, BatchKind batch, Schedule schedule, int planned_sm_count,
                   SchedulePlan* plan) {
  const VarlenPlanResult planned =
      plan_varlen_schedule(problem, batch.keys_within_queries, batch.lengths_fill_maxima, schedule, planned_sm_count);
  if (!planned.ok()) {
    return {StatusCode::kScheduleRejected, "schedule '" + std::string(schedule_name(schedule)) +
                                               "' cannot run this varlen batch: " + planned.rejected};
  }
  if (const PlanProof proof = prove_varlen_plan(planned.plan); !proof.ok()) {
    return {StatusCode::kScheduleRejected, "the " + std::string(schedule_name(planned.plan.plan.kind)) +
                                               " plan failed validation for this varlen batch: " + proof.summary};
  }
  *plan = planned.plan.plan;
  return Status::success();
}

// Plans and proves a request that passed check_plan_request() for a device that passed check_device_info(), on
// the device's SMs less sm_margin.
Status make_plan(const AttentionShape& shape, BatchKind batch, Schedule schedule, int sm_margin,
                 const DeviceInfo& device, BackwardPlan* plan) {
  if (Status s = check_sm_margin(sm_margin, device); !s.ok()) return s;
  const int planned_sm_count = device.multiprocessor_count - sm_margin;
  const TiledProblem problem = make_tiled_problem(shape);
  if (batch.varlen) {
    SchedulePlan varlen_plan{};
    if (Status s = plan_varlen(problem, batch, schedule, planned_sm_count, &varlen_plan); !s.ok()) {
      return s;
    }
    *plan = BackwardPlanAccess::make(BackwardPlanData{
        .shape = shape,
        .requested_schedule = schedule,
        .device_index = device.index,
        .multiprocessor_count = device.multiprocessor_count,
        .sm_margin = sm_margin,
        .planned_sm_count = planned_sm_count,
        .varlen = true,
        .keys_within_queries = batch.keys_within_queries,
        .schedule_plan = varlen_plan,
        .workspace = kernels::BackwardWorkspace::layout(shape, varlen_plan.problem),
    });
    return Status::success();
  }
  const PlanResult planned = plan_schedule(problem, schedule, planned_sm_count);
  if (!planned.ok()) {
    return {StatusCode::kScheduleRejected,
            "schedule '" + std::string(schedule_name(schedule)) + "' cannot run this shape: " + planned.rejected};
  }
  // The planner folds a causal window's band for symmetric shift (BandSymmetricShift), but the kernels are built
  // without the fold (shift_schedules.hpp): they would run the unwindowed pairs' jobs on a windowed plan.
  if (!kBandFoldInKernels && planned.plan.kind == Schedule::kSymmetricShift && problem.windowed()) {
    return {StatusCode::kScheduleRejected,
            "schedule '" + std::string(schedule_name(schedule)) +
                "' cannot run this shape: symmetric-shift under a sliding window is planned and proven on the CPU "
                "but not built into the kernels (its band fold spills the backward loader's registers); use "
                "shortest-first, descending or ascending (auto picks shortest-first)"};
  }
  if (Status s = prove_schedule(planned.plan); !s.ok()) return s;
  *plan = BackwardPlanAccess::make(BackwardPlanData{
      .shape = shape,
      .requested_schedule = schedule,
      .device_index = device.index,
      .multiprocessor_count = device.multiprocessor_count,
      .sm_margin = sm_margin,
      .planned_sm_count = planned_sm_count,
      .schedule_plan = planned.plan,
      .workspace = kernels::BackwardWorkspace::layout(shape, planned.plan.problem),
  });
  return Status::success();
}

}  // namespace

const AttentionShape& BackwardPlan::shape() const { return data_or_empty(*this).shape; }
Schedule BackwardPlan::requested_schedule() const { return data_or_empty(*this).requested_schedule; }
Schedule BackwardPlan::schedule() const { return data_or_empty(*this).schedule_plan.kind; }
int BackwardPlan::device_index() const { return data_or_empty(*this).device_index; }
int BackwardPlan::multiprocessor_count() const { return data_or_empty(*this).multiprocessor_count; }
int BackwardPlan::sm_margin() const { return data_or_empty(*this).sm_margin; }
int BackwardPlan::planned_sm_count() const { return data_or_empty(*this).planned_sm_count; }
size_t BackwardPlan::workspace_bytes() const { return data_or_empty(*this).workspace.total_bytes; }
bool BackwardPlan::varlen() const { return data_or_empty(*this).varlen; }
bool BackwardPlan::keys_within_queries() const { return data_or_empty(*this).keys_within_queries; }

Status plan_backward(const AttentionShape& shape, Schedule schedule, int sm_margin, const DeviceInfo& device,
                     BackwardPlan* plan) {
  if (Status s = check_plan_request(shape, schedule, sm_margin, plan); !s.ok()) return s;
  if (Status s = check_device_info(device); !s.ok()) return s;
  return make_plan(shape, BatchKind{}, schedule, sm_margin, device, plan);
}

// The request is checked before the device, so a bad one gets its own message on any machine.
Status plan_backward(const AttentionShape& shape, Schedule schedule, int sm_margin, BackwardPlan* plan) {
  if (Status s = check_plan_request(shape, schedule, sm_margin, plan); !s.ok()) return s;
  const DeviceInfo* device = nullptr;
  if (Status s = usable_current_device(&device); !s.ok()) return s;
  return make_plan(shape, BatchKind{}, schedule, sm_margin, *device, plan);
}

Status plan_varlen_backward(const AttentionShape& shape, bool keys_within_queries, bool lengths_fill_maxima,
                            Schedule schedule, int sm_margin, const DeviceInfo& device, BackwardPlan* plan) {
  if (Status s = check_plan_request(shape, schedule, sm_margin, plan); !s.ok()) return s;
  if (Status s = check_device_info(device); !s.ok()) return s;
  return make_plan(shape, BatchKind{true, keys_within_queries, lengths_fill_maxima}, schedule, sm_margin, device, plan);
}

Status plan_varlen_backward(const AttentionShape& shape, bool keys_within_queries, bool lengths_fill_maxima,
                            Schedule schedule, int sm_margin, BackwardPlan* plan) {
  if (Status s = check_plan_request(shape, schedule, sm_margin, plan); !s.ok()) return s;
  const DeviceInfo* device = nullptr;
  if (Status s = usable_current_device(&device); !s.ok()) return s;
  return make_plan(shape, BatchKind{true, keys_within_queries, lengths_fill_maxima}, schedule, sm_margin, *device,
                   plan);
}

bool varlen_lengths_fill_maxima(const AttentionShape& shape, int64_t total_q, int64_t total_k) {
  return total_q >= shape.batch * shape.seqlen_q && total_k >= shape.batch * shape.seqlen_k;
}

Status plan_backward(const AttentionShape& shape, Schedule schedule, const DeviceInfo& device, BackwardPlan* plan) {
  return plan_backward(shape, schedule, /*sm_margin=*/0, device, plan);
}

Status plan_backward(const AttentionShape& shape, Schedule schedule, BackwardPlan* plan) {
  return plan_backward(shape, schedule, /*sm_margin=*/0, plan);
}

Status check_args_match_plan(const BackwardArgs& args, const BackwardPlanData& plan) {
  const AttentionShape& given = args.shape;
  const AttentionShape& planned = plan.shape;
  struct Size {
    const char* field;
    int64_t given;
    int64_t planned;
  };
  for (const Size& size :
       {Size{"shape.batch", given.batch, planned.batch}, Size{"shape.seqlen_q", given.seqlen_q, planned.seqlen_q},
        Size{"shape.seqlen_k", given.seqlen_k, planned.seqlen_k}, Size{"shape.heads_q", given.heads_q, planned.heads_q},
        Size{"shape.heads_kv", given.heads_kv, planned.heads_kv},
        Size{"shape.head_dim", given.head_dim, planned.head_dim}}) {
    if (size.given != size.planned) return mismatch(size.field, size.given, size.planned);
  }
  if (given.dtype != planned.dtype) {
    return mismatch("shape.dtype", std::string(dtype_name(given.dtype)), std::string(dtype_name(planned.dtype)));
  }
  // Exact: validate() refuses NaN, and the plan is for the scale it was made with.
  if (given.softmax_scale != planned.softmax_scale) {
    return mismatch("shape.softmax_scale", given.softmax_scale, planned.softmax_scale);
  }
  if (given.causal != planned.causal) return mismatch("shape.causal", given.causal, planned.causal);
  if (given.window_left != planned.window_left) {
    return mismatch("shape.window_left", given.window_left, planned.window_left);
  }
  if (given.window_right != planned.window_right) {
    return mismatch("shape.window_right", given.window_right, planned.window_right);
  }
  // Exact, as the scale: validate() refuses NaN.
  if (given.softcap != planned.softcap) return mismatch("shape.softcap", given.softcap, planned.softcap);
  if (args.schedule != plan.requested_schedule) {
    return mismatch("schedule", quoted(args.schedule), quoted(plan.requested_schedule));
  }
  if (args.sm_margin != plan.sm_margin) return mismatch("sm_margin", args.sm_margin, plan.sm_margin);
  // A varlen plan's units and workspace are the maximum problem's, read per sequence from cu_seqlens: a dense call
  // on it (or a varlen call on a dense plan) would run the wrong kernels on the wrong layout.
  if (args.varlen.packed() != plan.varlen) {
    return mismatch("varlen", std::string(args.varlen.packed() ? "a packed batch" : "none"),
                    std::string(plan.varlen ? "a packed batch (plan_varlen_backward)" : "none"));
  }
  if (plan.varlen && args.varlen.keys_within_queries != plan.keys_within_queries) {
    return mismatch("varlen.keys_within_queries", args.varlen.keys_within_queries, plan.keys_within_queries);
  }
  // Not compared, nor kept: the hint lengths_fill_maxima the plan was made with. It only chose among schedules
  // proven for every vector of lengths within the maxima (with the promise), so it restricts no batch the plan runs;
  // a call whose packed rows would have given the other hint runs correctly, at worst on the slower schedule.
  return Status::success();
}

}  // namespace dash
