// Validation the API's entry points share beyond the public validate() overloads of dash/attention.hpp.
// Like them, it never touches the GPU, and each failure names the argument and the rule.
#pragma once

#include "dash/attention.hpp"

namespace dash {

// kOk if `schedule` is one of kAllSchedules; kInvalidArgument naming its raw value otherwise (a Schedule cast
// from an out-of-range int must not reach the planner).
Status check_schedule(Schedule schedule);

// The rule of sm_margin (SMs a launch leaves to other work): 0 <= sm_margin < the device's SM count, so that at
// least one SM runs the kernel. The first form checks the lower bound alone, for checks that run before the device
// is known; the second both, naming the device. kInvalidArgument with the rule otherwise.
Status check_sm_margin(int sm_margin);
Status check_sm_margin(int sm_margin, const DeviceInfo& device);

// The backward's own rule on the head dim, past validate(shape): it must be one of kBackwardHeadDims (every supported
// head dim today, so validate(shape) refuses first). kNotSupported naming the argument and the values otherwise.
Status check_backward_head_dim(const AttentionShape& shape);

// The workspace of a call: it is written, so its workspace_bytes bytes at `workspace` must share no byte with any
// tensor of the call, its LSE or a varlen call's cu_seqlens. kInvalidArgument naming what it overlaps otherwise.
// Only the workspace is checked: arguments validate() refuses pass here (validate() names them), as does a null or
// empty workspace (the workspace size check refuses it). It allocates nothing, for a call to run after validate().
Status check_workspace_overlap(const ForwardArgs& args, const void* workspace, size_t workspace_bytes);
Status check_workspace_overlap(const BackwardArgs& args, const void* workspace, size_t workspace_bytes);

}  // namespace dash
