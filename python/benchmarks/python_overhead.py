"""Host time of dash_attn.flash_attn_func's Python path, forward and backward, measured on a CPU-only machine.

This is NOT a GPU measurement. It runs the package's real Python path (argument checks, the eager
torch.autograd.Function or the torch.library custom ops with their dispatch, autograd, the backward plan cache,
ctypes marshalling, tensor allocation) on CPU tensors, with every C call answered at once by a stand-in library
(_stub_library.c, compiled here with `cc` and loaded through $DASH_ATTN_LIBRARY, so the package's loader and
ctypes signatures are the real ones). What it cannot see: the C++ side of each call, the CUDA caching allocator
(CPU allocations stand in for it), and torch's current-device and current-stream queries, which a GPU run pays
and this one answers from Python stand-ins. overhead.py measures the whole host path on the GPU.

flash_attn_func in eager mode runs the ops' bodies under _ops._EagerAttention (no custom-op dispatch); the row
"through the custom ops" times the path torch.compile records, called eagerly, for comparison.

Seams, all in this process and none in the package: check_devices accepts CPU tensors where it demands CUDA
ones (the same tests, its fast path included); the custom ops get their own implementations registered for the
CPU key; torch._C's current-device query answers -1 (a CPU tensor's device index, so no device switch) and its raw
current-stream query the null stream.

Shape (1, 128, 1, 64), causal, bf16, as overhead.py. Each row is the least, over --repeats runs, of the mean
microseconds per call of --iters calls after warm-up (time.perf_counter_ns): the least, not the median, because
the machines this runs on share their CPU with compilers, which only ever add time. Rows marked "=" are
differences of two measured rows. --profile prints a cProfile breakdown of the forward+backward step.

The varlen rows time dash_attn.flash_attn_varlen_func on the same tokens packed as one sequence.

usage: python3 python_overhead.py [--iters N] [--repeats R] [--rows all|fixed|varlen] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

SHAPE = (1, 128, 1, 64)
DTYPE = torch.bfloat16
STUB_SOURCE = Path(__file__).resolve().parent / "_stub_library.c"
C_ABI_HEADER_DIR = Path(__file__).resolve().parents[2] / "src" / "capi"  # dash_c.h, which the stub implements


def build_stub_library(directory: Path) -> Path:
    """Compiles _stub_library.c into `directory` and returns the shared library's path."""
    library = directory / "libdash_attn_c.so"
    subprocess.run(
        [
            "cc",
            "-O2",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Werror",
            f"-I{C_ABI_HEADER_DIR}",
            "-o",
            str(library),
            str(STUB_SOURCE),
        ],
        check=True,
    )
    return library


def install_cpu_seams() -> None:
    """Makes flash_attn_func runnable on CPU tensors for measurement (see the module docstring)."""
    from dash_attn import _arguments, _ops, varlen

    def check_devices_on_cpu(tensors, layout):
        """_arguments.check_devices, fast path included, with CPU where it demands CUDA."""
        q, k, v = tensors
        if q.is_cpu and k.is_cpu and v.is_cpu:
            return
        qn, kn, vn = layout.names
        for t, name in ((k, kn), (v, vn)):
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but {qn} is on {q.device}")
        if q.device.type != "cpu":
            raise ValueError(f"{qn}, {kn} and {vn} must be CPU tensors in this benchmark, got device {q.device}")

    def varlen_check_devices_on_cpu(tensors, names):
        """varlen._check_devices with CPU where it demands CUDA."""
        q = tensors[0]
        for t, name in zip(tensors[1:], names[1:]):
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
        if q.device.type != "cpu":
            raise ValueError(f"q, k, v and the offsets must be CPU tensors in this benchmark, got device {q.device}")

    _arguments.check_devices = check_devices_on_cpu
    varlen._check_devices = varlen_check_devices_on_cpu
    for op in (_ops.forward, _ops.backward):
        op.register_kernel("cpu", op._init_fn)
    # A CPU tensor's device index is -1: the ops find it current and switch nothing; every stream is the null one.
    torch._C._cuda_getDevice = lambda: -1
    torch._C._cuda_getCurrentRawStream = lambda index: 0


def microseconds_per_call(call: Callable[[], object], iters: int, repeats: int) -> float:
    """The least over `repeats` of the mean host microseconds per call of `iters` calls, after warm-up."""
    for _ in range(max(iters // 10, 50)):
        call()
    means = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(iters):
            call()
        means.append((time.perf_counter_ns() - start) / iters / 1e3)
    return min(means)


def torch_floor_steps() -> dict[str, Callable[[], object]]:
    """Forward+backward steps of do-nothing attention on the same tensors, for what torch itself costs: a
    torch.library custom-op pair with dash_attn's schemas and autograd wiring, and a torch.autograd.Function.
    Both only allocate their outputs, as dash_attn does."""

    @torch.library.custom_op("dash_overhead_floor::forward", mutates_args=())
    def floor_forward(
        q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, schedule: str, sm_margin: int = 0
    ) -> tuple[Tensor, Tensor]:
        return torch.empty_like(q), torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)

    @torch.library.custom_op("dash_overhead_floor::backward", mutates_args=())
    def floor_backward(
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        softmax_scale: float,
        causal: bool,
        schedule: str,
        sm_margin: int = 0,
    ) -> tuple[Tensor, Tensor, Tensor]:
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, ctx.softmax_scale, ctx.causal, ctx.schedule, ctx.sm_margin = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.mark_non_differentiable(output[1])

    def formula(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        grads = torch.ops.dash_overhead_floor.backward(
            grad_out, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.schedule, ctx.sm_margin
        )
        return (*grads, None, None, None, None)

    floor_forward.register_autograd(formula, setup_context=setup_context)

    class FloorFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse = torch.empty_like(q), torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    q, k, v = (torch.randn(SHAPE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    dout = torch.randn(SHAPE, dtype=DTYPE)
    scale = SHAPE[-1] ** -0.5
    return {
        "torch floor: do-nothing custom-op pair, forward + backward step": lambda: torch.autograd.grad(
            torch.ops.dash_overhead_floor.forward(q, k, v, scale, True, "auto", 0)[0], (q, k, v), dout
        ),
        "torch floor: do-nothing autograd.Function, forward + backward step": lambda: torch.autograd.grad(
            FloorFunction.apply(q, k, v)[0], (q, k, v), dout
        ),
    }


def measurements(iters: int, repeats: int) -> list[tuple[str, float]]:
    """(row label, microseconds per call) for the whole path and for each of its parts."""
    import dash_attn
    from dash_attn import _library, _ops, _plans

    q, k, v = (torch.randn(SHAPE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    dout = torch.randn(SHAPE, dtype=DTYPE)
    scale = SHAPE[-1] ** -0.5
    schedule = "auto"

    def flash_forward():
        return dash_attn.flash_attn_func(q, k, v, causal=True)

    def step():
        torch.autograd.grad(flash_forward(), (q, k, v), dout)

    def op_step():
        torch.autograd.grad(torch.ops.dash_attn.forward(q, k, v, scale, True, schedule, 0)[0], (q, k, v), dout)

    def flash_forward_no_grad():
        with torch.no_grad():
            flash_forward()

    def op_forward():
        return torch.ops.dash_attn.forward(q, k, v, scale, True, schedule, 0)

    def op_forward_no_grad():
        with torch.no_grad():
            op_forward()

    def forward_body():
        with torch.no_grad():
            _ops._forward_body(q, k, v, scale, True, schedule, 0)

    with torch.no_grad():
        out, lse = op_forward()
    qd, kd, vd = (t.detach() for t in (q, k, v))

    def op_backward():
        torch.ops.dash_attn.backward(dout, qd, kd, vd, out, lse, scale, True, schedule, 0)

    def backward_body():
        _ops._backward_body(dout, qd, kd, vd, out, lse, scale, True, schedule, 0)

    forward_call = _ops._forward_call(qd, kd, vd, scale, True)
    backward_call = _ops._backward_call(-1, dout, qd, kd, vd, out, scale, True, schedule, 0)
    plan = _plans.backward_plans.get(backward_call.plan_key)
    c_tensors = [_ops._c_tensor(t) for t in (qd, kd, vd, out, dout, qd, kd, vd)]
    workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8)
    pointers = [t.data_ptr() for t in (qd, kd, vd, out, dout, qd, kd, vd)]

    def plan_lookup():
        _plans.backward_plans.get(backward_call.plan_key)

    def ctypes_forward():
        _library.forward(forward_call.shape, *c_tensors[:4], lse.data_ptr(), workspace.data_ptr(), 256, 0, 0)

    def ctypes_backward():
        plan.backward(
            backward_call.shape,
            *c_tensors[:5],
            lse.data_ptr(),
            *c_tensors[5:],
            workspace.data_ptr(),
            plan.workspace_bytes,
            0,
        )

    def forward_descriptor():
        _ops._forward_call(qd, kd, vd, scale, True)

    def backward_descriptor():
        _ops._backward_call(-1, dout, qd, kd, vd, out, scale, True, schedule, 0)

    forward_pointers, backward_pointers = tuple(pointers[:4]), tuple(pointers)

    def structs_forward():
        structs = forward_call.structs
        structs.take()
        q_c, k_c, v_c, out_c, _varlen = structs.shared
        q_c.data, k_c.data, v_c.data, out_c.data = forward_pointers
        structs.give_back()

    def structs_backward():
        structs = backward_call.structs
        structs.take()
        q_c, k_c, v_c, out_c, dout_c, dq_c, dk_c, dv_c, _varlen = structs.shared
        q_c.data, k_c.data, v_c.data, out_c.data, dout_c.data, dq_c.data, dk_c.data, dv_c.data = backward_pointers
        structs.give_back()

    def allocation_forward():
        _ops._forward_outputs(qd)
        _ops._workspace(256, qd.device)

    def allocation_backward():
        _ops._backward_outputs(qd, kd, vd)
        _ops._workspace(plan.workspace_bytes, qd.device)

    def time_of(call):
        return microseconds_per_call(call, iters, repeats)

    step_label = "forward + backward step (flash_attn_func, autograd.grad)"
    forward_label = "forward, grad mode (flash_attn_func)"
    no_grad_label = "forward, no grad (flash_attn_func)"
    rows = {
        step_label: time_of(step),
        "forward + backward step through the custom ops (torch.compile's path)": time_of(op_step),
        forward_label: time_of(flash_forward),
        no_grad_label: time_of(flash_forward_no_grad),
        "forward op, grad mode (torch.ops.dash_attn.forward)": time_of(op_forward),
        "forward op, no grad": time_of(op_forward_no_grad),
        "forward body, no grad (_ops._forward_body)": time_of(forward_body),
        "backward op (torch.ops.dash_attn.backward)": time_of(op_backward),
        "backward body (_ops._backward_body)": time_of(backward_body),
        "plan-cache lookup (_plans.backward_plans.get)": time_of(plan_lookup),
        "ctypes forward call, structs built": time_of(ctypes_forward),
        "ctypes backward call (BackwardPlan.backward), structs built": time_of(ctypes_backward),
        "forward call descriptor lookup (_ops._forward_call)": time_of(forward_descriptor),
        "backward call descriptor lookup (_ops._backward_call)": time_of(backward_descriptor),
        "C structs of a forward: take, write 4 pointers, give back": time_of(structs_forward),
        "C structs of a backward: take, write 8 pointers, give back": time_of(structs_backward),
        "allocation of a forward (out, lse, workspace)": time_of(allocation_forward),
        "allocation of a backward (dq, dk, dv, workspace)": time_of(allocation_backward),
    }
    rows.update((label, time_of(step)) for label, step in torch_floor_steps().items())
    backward = rows[step_label] - rows[forward_label]
    derived = {
        "= argument checks (front): forward no grad - forward body": rows[no_grad_label]
        - rows["forward body, no grad (_ops._forward_body)"],
        "= autograd.Function on the forward: forward grad mode - forward no grad": rows[forward_label]
        - rows[no_grad_label],
        "= backward (autograd.grad): step - forward grad mode": backward,
        "= autograd engine and formula: backward - backward body": backward
        - rows["backward body (_ops._backward_body)"],
        "= custom-op dispatch of the forward: op no grad - body": rows["forward op, no grad"]
        - rows["forward body, no grad (_ops._forward_body)"],
        "= custom-op dispatch of the backward: op - body": rows["backward op (torch.ops.dash_attn.backward)"]
        - rows["backward body (_ops._backward_body)"],
    }
    return list(rows.items()) + list(derived.items())


def varlen_measurements(iters: int, repeats: int) -> list[tuple[str, float]]:
    """The same rows for dash_attn.flash_attn_varlen_func on the same tokens packed: (128, 1, 64) with one
    sequence (cu_seqlens 0, 128; self-attention, so one offsets tensor)."""
    import dash_attn
    from dash_attn import _ops

    batch, seqlen, heads, head_dim = SHAPE
    packed = (batch * seqlen, heads, head_dim)
    q, k, v = (torch.randn(packed, dtype=DTYPE, requires_grad=True) for _ in range(3))
    dout = torch.randn(packed, dtype=DTYPE)
    cu_seqlens = torch.arange(0, batch * seqlen + 1, seqlen, dtype=torch.int32)
    scale = head_dim**-0.5
    schedule = "auto"
    # The forward op's arguments after q, k and v, and the backward's after lse (_ops._Arguments).
    arguments = (scale, True, schedule, 0, -1, -1, 0.0, cu_seqlens, cu_seqlens, seqlen, seqlen, True)

    def varlen_forward():
        return dash_attn.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, seqlen, seqlen, causal=True)

    def step():
        torch.autograd.grad(varlen_forward(), (q, k, v), dout)

    def forward_no_grad():
        with torch.no_grad():
            varlen_forward()

    def op_forward_no_grad():
        with torch.no_grad():
            torch.ops.dash_attn.forward(q, k, v, *arguments)

    with torch.no_grad():
        out, lse = torch.ops.dash_attn.forward(q, k, v, *arguments)
    qd, kd, vd = (t.detach() for t in (q, k, v))

    def op_backward():
        torch.ops.dash_attn.backward(dout, qd, kd, vd, out, lse, *arguments)

    def forward_body():
        with torch.no_grad():
            _ops._forward_body(q, k, v, *arguments)

    def backward_body():
        _ops._backward_body(dout, qd, kd, vd, out, lse, *arguments)

    def time_of(call):
        return microseconds_per_call(call, iters, repeats)

    return [
        ("varlen forward + backward step (flash_attn_varlen_func, autograd.grad)", time_of(step)),
        ("varlen forward, grad mode (flash_attn_varlen_func)", time_of(varlen_forward)),
        ("varlen forward, no grad (flash_attn_varlen_func)", time_of(forward_no_grad)),
        ("varlen forward op, no grad (torch.ops.dash_attn.forward)", time_of(op_forward_no_grad)),
        ("varlen forward body, no grad (_ops._forward_body)", time_of(forward_body)),
        ("varlen backward op (torch.ops.dash_attn.backward)", time_of(op_backward)),
        ("varlen backward body (_ops._backward_body)", time_of(backward_body)),
    ]


def profile_step(iters: int, top: int) -> None:
    import dash_attn

    q, k, v = (torch.randn(SHAPE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    dout = torch.randn(SHAPE, dtype=DTYPE)

    def step():
        torch.autograd.grad(dash_attn.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)

    for _ in range(100):
        step()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iters):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    print(f"\ncProfile of {iters} forward+backward steps, top {top} by own time:")
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--rows",
        choices=("all", "fixed", "varlen"),
        default="all",
        help="flash_attn_func's rows, flash_attn_varlen_func's, or both",
    )
    parser.add_argument("--profile", action="store_true", help="also print a cProfile breakdown of the step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        os.environ["DASH_ATTN_LIBRARY"] = str(build_stub_library(Path(directory)))
        torch.set_num_threads(1)
        install_cpu_seams()
        print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, CPU only, C calls stubbed")
        print("| part of the host path | us per call |")
        print("|---|---|")
        rows = measurements(args.iters, args.repeats) if args.rows in ("all", "fixed") else []
        if args.rows in ("all", "varlen"):
            rows += varlen_measurements(args.iters, args.repeats)
        for label, micros in rows:
            print(f"| {label} | {micros:.1f} |", flush=True)
        if args.profile:
            profile_step(args.iters, top=30)


if __name__ == "__main__":
    main()
