// The public entry points: validate, check the device, plan and prove the schedule, carve the
// workspace, dispatch to the compiled kernel instance. Every failure becomes a Status.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "api/device.hpp"
#include "api/proven_schedules.hpp"
#include "api/validate.hpp"
#include "dash/attention.hpp"
#include "kernels/kernel_params.hpp"
#include "planner/schedule_plan.hpp"

namespace dash {
namespace {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::success();
  cudaGetLastError();  // clear the sticky-free error so later calls start clean
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

Status find_instance(const AttentionShape& shape, const kernels::KernelInstance** instance) {
  const auto instances = kernels::kernel_instances();
  const auto it = std::find_if(instances.begin(), instances.end(), [&](const kernels::KernelInstance& k) {
    return k.head_dim == shape.head_dim && k.dtype == shape.dtype;
  });
  if (it == instances.end()) {
    return {StatusCode::kNotAvailable, "this build has no kernel for head_dim " + std::to_string(shape.head_dim) +
                                           " and dtype " + dtype_name(shape.dtype) +
                                           (instances.empty() ? " (built without DASH_BUILD_KERNELS)"
                                                              : " (see DASH_HEAD_DIMS / DASH_DTYPES)")};
  }
  *instance = &*it;
  return Status::success();
}

Status multiprocessor_count(int* count) {
  int device = 0;
  if (Status s = cuda_status(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  return cuda_status(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device),
                     "cudaDeviceGetAttribute(multiprocessor count)");
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
    return {StatusCode::kInvalidArgument, "workspace must be " + std::to_string(kernels::BackwardWorkspace::kAlignment) +
                                              "-byte aligned (cudaMalloc memory is)"};
  }
  return check_device_pointer(workspace, "workspace");
}

// Plans the backward schedule for `shape` on the current device and proves it.
Status plan_backward(const AttentionShape& shape, Schedule schedule, SchedulePlan* plan) {
  int sms = 0;
  if (Status s = multiprocessor_count(&sms); !s.ok()) return s;
  const TiledProblem problem = make_tiled_problem(shape);
  const PlanResult planned = plan_schedule(problem, schedule, sms);
  if (!planned.ok()) {
    return {StatusCode::kScheduleRejected,
            "schedule '" + std::string(schedule_name(schedule)) + "' cannot run this shape: " + planned.rejected};
  }
  if (Status s = prove_schedule(planned.plan); !s.ok()) return s;
  *plan = planned.plan;
  return Status::success();
}

}  // namespace

bool kernels_available() { return !kernels::kernel_instances().empty(); }

bool kernel_available(int64_t head_dim, DType dtype) {
  const auto instances = kernels::kernel_instances();
  return std::any_of(instances.begin(), instances.end(),
                     [&](const kernels::KernelInstance& k) { return k.head_dim == head_dim && k.dtype == dtype; });
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
  if (Status s = validate(shape); !s.ok()) return s;
  if (Status s = check_schedule(schedule); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  SchedulePlan plan{};
  if (Status s = plan_backward(shape, schedule, &plan); !s.ok()) return s;
  *bytes = kernels::BackwardWorkspace::layout(shape, plan.problem).total_bytes;
  return Status::success();
}

Status forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (Status s = validate(args); !s.ok()) return s;
  const kernels::KernelInstance* instance = nullptr;
  if (Status s = find_instance(args.shape, &instance); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  if (Status s = check_pointers({{args.q, "q"}, {args.k, "k"}, {args.v, "v"}, {args.out, "out"}, {args.lse, "lse"}});
      !s.ok()) {
    return s;
  }
  if (Status s = check_workspace(workspace, workspace_bytes, kernels::kForwardWorkspaceBytes); !s.ok()) return s;
  kernels::ForwardParams params{};
  params.args = args;
  params.tile_counter = static_cast<int*>(workspace);
  if (Status s = multiprocessor_count(&params.num_sms); !s.ok()) return s;
  return cuda_status(static_cast<cudaError_t>(instance->forward(params, stream)), "forward launch");
}

Status backward(const BackwardArgs& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (Status s = validate(args); !s.ok()) return s;
  const kernels::KernelInstance* instance = nullptr;
  if (Status s = find_instance(args.shape, &instance); !s.ok()) return s;
  if (Status s = check_current_device(); !s.ok()) return s;
  if (Status s = check_pointers({{args.q, "q"}, {args.k, "k"}, {args.v, "v"}, {args.out, "out"}, {args.dout, "dout"},
                                 {args.lse, "lse"}, {args.dq, "dq"}, {args.dk, "dk"}, {args.dv, "dv"}});
      !s.ok()) {
    return s;
  }
  kernels::BackwardParams params{};
  if (Status s = plan_backward(args.shape, args.schedule, &params.plan); !s.ok()) return s;
  const auto layout = kernels::BackwardWorkspace::layout(args.shape, params.plan.problem);
  if (Status s = check_workspace(workspace, workspace_bytes, layout.total_bytes); !s.ok()) return s;
  params.args = args;
  params.buffers = layout.carve(workspace);
  return cuda_status(static_cast<cudaError_t>(instance->backward(params, stream)), "backward launch");
}

}  // namespace dash
