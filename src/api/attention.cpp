// The public entry points: validate, check the device, plan and prove the schedule (api/backward_plan.cpp),
// carve the workspace, dispatch to the compiled kernel instance. Every failure becomes a Status. A launch
// of a BackwardPlan checks the call against the plan and does no planning; the entry points without a plan
// make one and launch it through the same path. Every call that reaches a device first reports a fault the kernels
// recorded there in an earlier call (api/wait_timeouts.hpp); a call being captured into a CUDA graph makes its
// one-time work in the relaxed capture mode (api/device.hpp).
#include "dash/attention.hpp"

#include <algorithm>
#include <string>

#include <cuda_runtime_api.h>

#include "api/backward_plan.hpp"
#include "api/device.hpp"
#include "api/validate.hpp"
#include "api/wait_timeouts.hpp"
#include "kernels/kernel_params.hpp"

namespace dash {
namespace {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::success();
  cudaGetLastError();  // clear the sticky-free error so later calls start clean
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

// The status of a launcher's result; `what` names the launch.
Status launch_status(const kernels::LaunchResult& result, const char* what) {
  if (result.unencoded_tensor != nullptr) {
    return {StatusCode::kCudaError, std::string(what) + ": the TMA descriptor of " + result.unencoded_tensor +
                                        " cannot be encoded: " + result.broken_rule +
                                        " (a rule of cuTensorMapEncodeTiled), so no kernel was launched"};
  }
  return cuda_status(static_cast<cudaError_t>(result.cuda_error), what);
}

// What every call that runs on a device does first: the current device (usable_current_device), its fault record,
// and the report of a fault an earlier call left there, which fails this call.
Status begin_device_call(const DeviceInfo** device, kernels::FaultRecord** fault) {
  if (Status s = usable_current_device(device); !s.ok()) return s;
  if (Status s = device_fault_record((*device)->index, fault); !s.ok()) return s;
  return take_fault(**fault, (*device)->index);
}

Status find_instance(const AttentionShape& shape, const kernels::KernelInstance** instance) {
  const auto instances = kernels::kernel_instances();
  const bool softcap = shape.softcap > 0.0f;
  const auto it = std::find_if(instances.begin(), instances.end(), [&](const kernels::KernelInstance& k) {
    return k.head_dim == shape.head_dim && k.dtype == shape.dtype && k.softcap == softcap;
  });
  if (it == instances.end()) {
    return {StatusCode::kNotAvailable, "this build has no kernel for head_dim " + std::to_string(shape.head_dim) +
                                           " and dtype " + dtype_name(shape.dtype) + (softcap ? " with softcap" : "") +
                                           (instances.empty() ? " (built without DASH_BUILD_KERNELS)"
                                            : softcap ? " (see DASH_HEAD_DIMS / DASH_DTYPES / DASH_SOFTCAP_KERNELS)"
                                                      : " (see DASH_HEAD_DIMS / DASH_DTYPES)")};
  }
  *instance = &*it;
  return Status::success();
}

enum class Pass { kForward, kBackward };

// find_instance for a call, varlen or not: a varlen call needs the instance's varlen kernel of its pass.
Status find_call_instance(const AttentionShape& shape, const VarlenBatch& varlen, Pass pass,
                          const kernels::KernelInstance** instance) {
  if (Status s = find_instance(shape, instance); !s.ok()) return s;
  const bool has_varlen =
      pass == Pass::kForward ? (*instance)->forward_varlen != nullptr : (*instance)->backward_varlen != nullptr;
  if (varlen.packed() && !has_varlen) {
    return {StatusCode::kNotAvailable, "this build has no varlen kernel for head_dim " +
                                           std::to_string(shape.head_dim) + " and dtype " + dtype_name(shape.dtype) +
                                           (shape.softcap > 0.0f ? " with softcap" : "") +
                                           " (built without DASH_VARLEN_KERNELS)"};
  }
  return Status::success();
}

// The device pointers of a varlen call's offsets; nothing for a dense call.
Status check_varlen_pointers(const VarlenBatch& varlen) {
  if (!varlen.packed()) return Status::success();
  if (Status s = check_device_pointer(varlen.cu_seqlens_q, "varlen.cu_seqlens_q"); !s.ok()) return s;
  return check_device_pointer(varlen.cu_seqlens_k, "varlen.cu_seqlens_k");
}

Status check_pointers(std::initializer_list<std::pair<const void*, const char*>> pointers) {
  for (const auto& [p, name] : pointers) {
    if (Status s = check_device_pointer(p, name); !s.ok()) return s;
  }
  return Status::success();
}

Status check_workspace(const void* workspace, size_t given, size_t needed) {
  if (needed == 0) return Status::success();
  if (workspace == nullptr || given < needed) {
    return {StatusCode::kWorkspaceTooSmall, "workspace must hold " + std::to_string(needed) + " bytes, got " +
                                                std::to_string(workspace == nullptr ? 0 : given) + " bytes at " +
                                                (workspace == nullptr ? "null" : "a valid address")};
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kernels::BackwardWorkspace::kAlignment != 0) {
    return {StatusCode::kInvalidArgument, "workspace must be " +
                                              std::to_string(kernels::BackwardWorkspace::kAlignment) +
                                              "-byte aligned (cudaMalloc memory is)"};
  }
  return check_device_pointer(workspace, "workspace");
}

// Launches `plan` for `args`, which passed validate() and check_args_match_plan(), with `instance`, the
// kernel of their head dim and dtype.
Status launch_backward(const BackwardArgs& args, const BackwardPlanData& plan, const kernels::KernelInstance& instance,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  // From here on the call works on the device in the relaxed capture mode: a device's first call reads its
  // properties, allocates its fault record and loads kernels, which a capture in the global mode would otherwise
  // refuse (api/device.hpp).
  const RelaxedCaptureMode relaxed;
  const DeviceInfo* device = nullptr;
  kernels::FaultRecord* fault = nullptr;
  if (Status s = begin_device_call(&device, &fault); !s.ok()) return s;
  // A static schedule planned for more SMs than the device has would wait forever on CTAs that never start. The
  // plan's grid is planned_sm_count CTAs at most (its sm_margin less than the device's SMs).
  if (device->index != plan.device_index || device->multiprocessor_count != plan.multiprocessor_count) {
    return {StatusCode::kInvalidArgument, "plan: it was made for device " + std::to_string(plan.device_index) +
                                              " with " + std::to_string(plan.multiprocessor_count) +
                                              " SMs, but the current device is " + std::to_string(device->index) +
                                              " with " + std::to_string(device->multiprocessor_count) +
                                              " SMs (make the plan on the device that runs it)"};
  }
  if (Status s = check_pointers({{args.q.data, "q"},
                                 {args.k.data, "k"},
                                 {args.v.data, "v"},
                                 {args.out.data, "out"},
                                 {args.dout.data, "dout"},
                                 {args.lse, "lse"},
                                 {args.dq.data, "dq"},
                                 {args.dk.data, "dk"},
                                 {args.dv.data, "dv"}});
      !s.ok()) {
    return s;
  }
  if (Status s = check_varlen_pointers(args.varlen); !s.ok()) return s;
  if (Status s = check_workspace(workspace, workspace_bytes, plan.workspace.total_bytes); !s.ok()) return s;
  kernels::BackwardParams params{};
  if (Status s = wait_bound_ns(&params.wait_bound_ns); !s.ok()) return s;
  params.fault = fault;
  params.args = args;
  params.plan = plan.schedule_plan;
  params.buffers = plan.workspace.carve(workspace);
  const kernels::BackwardLauncher launch = plan.varlen ? instance.backward_varlen : instance.backward;
  return launch_status(launch(params, stream), "backward launch");
}

}  // namespace

bool kernels_available() { return !kernels::kernel_instances().empty(); }

bool merge_kernel_available() { return kernels::merge_partial_launcher() != nullptr; }

bool kernel_available(int64_t head_dim, DType dtype, bool softcap) {
  const auto instances = kernels::kernel_instances();
  return std::any_of(instances.begin(), instances.end(), [&](const kernels::KernelInstance& k) {
    return k.head_dim == head_dim && k.dtype == dtype && k.softcap == softcap;
  });
}

bool varlen_kernel_available(int64_t head_dim, DType dtype, bool softcap) {
  const auto instances = kernels::kernel_instances();
  return std::any_of(instances.begin(), instances.end(), [&](const kernels::KernelInstance& k) {
    return k.head_dim == head_dim && k.dtype == dtype && k.softcap == softcap && k.forward_varlen != nullptr &&
           k.backward_varlen != nullptr;
  });
}

// The workspace queries validate everything they are given before any device query or plan: the planner
// and the workspace layout assume a valid shape (they divide by heads_kv and size buffers from it).
Status forward_workspace_size(const AttentionShape& shape, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "forward_workspace_size: bytes must not be null"};
  if (Status s = validate(shape); !s.ok()) return s;
  *bytes = kernels::kForwardWorkspaceBytes;
  return Status::success();
}

Status backward_workspace_size(const AttentionShape& shape, Schedule schedule, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::kInvalidArgument, "backward_workspace_size: bytes must not be null"};
  BackwardPlan plan;
  if (Status s = plan_backward(shape, schedule, &plan); !s.ok()) return s;
  *bytes = plan.workspace_bytes();
  return Status::success();
}

namespace {

Status run_forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (Status s = validate(args); !s.ok()) return s;
  if (Status s = check_workspace_overlap(args, workspace, workspace_bytes); !s.ok()) return s;
  const kernels::KernelInstance* instance = nullptr;
  if (Status s = find_call_instance(args.shape, args.varlen, Pass::kForward, &instance); !s.ok()) return s;
  const RelaxedCaptureMode relaxed;  // as in launch_backward
  const DeviceInfo* device = nullptr;
  kernels::FaultRecord* fault = nullptr;
  if (Status s = begin_device_call(&device, &fault); !s.ok()) return s;
  if (Status s = check_sm_margin(args.sm_margin, *device); !s.ok()) return s;
  if (Status s = check_pointers(
          {{args.q.data, "q"}, {args.k.data, "k"}, {args.v.data, "v"}, {args.out.data, "out"}, {args.lse, "lse"}});
      !s.ok()) {
    return s;
  }
  if (Status s = check_varlen_pointers(args.varlen); !s.ok()) return s;
  if (Status s = check_workspace(workspace, workspace_bytes, kernels::kForwardWorkspaceBytes); !s.ok()) return s;
  kernels::ForwardParams params{};
  params.args = args;
  params.tile_counter = static_cast<int*>(workspace);
  // The forward's grid is persistent (tiles come from a counter, no CTA waits on another): it needs no SM to be
  // free, but it leaves sm_margin SMs to other work as the backward does.
  params.num_sms = device->multiprocessor_count - args.sm_margin;
  params.fault = fault;
  const kernels::ForwardLauncher launch = args.varlen.packed() ? instance->forward_varlen : instance->forward;
  return launch_status(launch(params, stream), "forward launch");
}

Status run_merge(const MergeArgs& args, cudaStream_t stream) {
  if (Status s = validate(args); !s.ok()) return s;
  const kernels::MergeLauncher launch = kernels::merge_partial_launcher();
  if (launch == nullptr) {
    return {StatusCode::kNotAvailable, "this build has no merge kernel (built without DASH_BUILD_KERNELS)"};
  }
  const RelaxedCaptureMode relaxed;  // as in launch_backward
  const DeviceInfo* device = nullptr;
  kernels::FaultRecord* fault = nullptr;
  if (Status s = begin_device_call(&device, &fault); !s.ok()) return s;
  if (Status s = check_pointers({{args.part_out.data, "part_out"},
                                 {args.part_lse, "part_lse"},
                                 {args.acc_out.data, "acc_out"},
                                 {args.acc_lse, "acc_lse"}});
      !s.ok()) {
    return s;
  }
  if (args.row_index != nullptr) {
    if (Status s = check_device_pointer(args.row_index, "row_index"); !s.ok()) return s;
  }
  return cuda_status(static_cast<cudaError_t>(launch(args, fault, stream)), "merge launch");
}

Status run_planned_backward(const BackwardArgs& args, const BackwardPlan& plan, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream) {
  const BackwardPlanData* data = BackwardPlanAccess::data(plan);
  if (data == nullptr) return {StatusCode::kInvalidArgument, "plan is empty (make it with plan_backward())"};
  if (Status s = check_args_match_plan(args, *data); !s.ok()) return s;
  if (Status s = validate(args); !s.ok()) return s;
  if (Status s = check_workspace_overlap(args, workspace, workspace_bytes); !s.ok()) return s;
  const kernels::KernelInstance* instance = nullptr;
  if (Status s = find_call_instance(args.shape, args.varlen, Pass::kBackward, &instance); !s.ok()) return s;
  return launch_backward(args, *data, *instance, workspace, workspace_bytes, stream);
}

// The kernel is looked up before planning, so a build without it says so before any device query.
Status run_backward(const BackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (Status s = validate(args); !s.ok()) return s;
  if (Status s = check_workspace_overlap(args, workspace, workspace_bytes); !s.ok()) return s;
  const kernels::KernelInstance* instance = nullptr;
  if (Status s = find_call_instance(args.shape, args.varlen, Pass::kBackward, &instance); !s.ok()) return s;
  BackwardPlan plan;
  const Status planned =
      args.varlen.packed()
          ? plan_varlen_backward(args.shape, args.varlen.keys_within_queries,
                                 varlen_lengths_fill_maxima(args.shape, args.varlen.total_q, args.varlen.total_k),
                                 args.schedule, args.sm_margin, &plan)
          : plan_backward(args.shape, args.schedule, args.sm_margin, &plan);
  if (!planned.ok()) return planned;
  return launch_backward(args, *BackwardPlanAccess::data(plan), *instance, workspace, workspace_bytes, stream);
}

}  // namespace

Status forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return capture_advice(run_forward(args, workspace, workspace_bytes, stream), stream);
}

Status merge_partial(const MergeArgs& args, cudaStream_t stream) {
  return capture_advice(run_merge(args, stream), stream);
}

Status backward(const BackwardArgs& args, const BackwardPlan& plan, void* workspace, size_t workspace_bytes,
                cudaStream_t stream) {
  return capture_advice(run_planned_backward(args, plan, workspace, workspace_bytes, stream), stream);
}

Status backward(const BackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return capture_advice(run_backward(args, workspace, workspace_bytes, stream), stream);
}

}  // namespace dash
