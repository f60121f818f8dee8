"""Host time of each piece of a tiny dash_attn step, on a machine with a Hopper GPU: where overhead.py's total goes.

Each row times a loop of back-to-back calls of one piece after warm-up: "issue" is the host time per call before
the final synchronize, "total" includes it. The shape is overhead.py's, (1, 128, 1, 64), causal, bf16, so the GPU
work is negligible. Rows: a bare torch launch and allocation (the machine's floor), the device and stream
queries, the ctypes calls with prebuilt arguments (the C++ side), the ops' Python bodies without the custom-op
dispatch, the custom ops, the public entry point with and without autograd, a minimal torch.autograd.Function
over the op bodies, and SDPA's step for comparison. It reaches into dash_attn's private modules (_ops, _library,
_plans) on purpose: it measures them.

usage: python3 host_breakdown.py [--iters N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import dash_attn
from dash_attn import _library, _ops, _plans

SCALE = 0.125  # 64 ** -0.5
SCHEDULE = "shortest-first"
WARMUP = 30


def report(name: str, call: Callable[[], object], iters: int) -> None:
    for _ in range(WARMUP):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    print(f"{name:48s} issue {issued / iters * 1e6:7.1f} us  total {total / iters * 1e6:7.1f} us", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=400)
    iters = parser.parse_args().iters

    def row(name: str, call: Callable[[], object]) -> None:
        report(name, call, iters)

    q, k, v = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    qd, kd, vd = (t.detach() for t in (q, k, v))

    floor = torch.zeros(16, device="cuda")
    row("torch launch x.add_(1)", lambda: floor.add_(1))
    row("torch.empty_like(q)", lambda: torch.empty_like(q))
    row("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream(q.device).cuda_stream)

    def device_guard() -> None:
        with torch.cuda.device(q.device):
            pass

    row("with torch.cuda.device(q.device)", device_guard)

    # The C calls alone, with every argument built once.
    with torch.no_grad():
        out, lse = torch.ops.dash_attn.forward(qd, kd, vd, SCALE, True, SCHEDULE, 0)
    forward_call = _ops._forward_call(qd, kd, vd, SCALE, True)
    shape, forward_bytes = forward_call.shape, forward_call.workspace_bytes
    stream = torch.cuda.current_stream().cuda_stream
    forward_workspace = torch.empty(max(forward_bytes, 1), dtype=torch.uint8, device="cuda")
    forward_tensors = [_ops._c_tensor(t) for t in (qd, kd, vd, out)]
    row(
        "ctypes forward (prebuilt args)",
        lambda: _library.forward(
            shape, *forward_tensors, lse.data_ptr(), forward_workspace.data_ptr(), forward_bytes, stream, 0
        ),
    )
    backward_call = _ops._backward_call(q.device.index, dout, qd, kd, vd, out, SCALE, True, SCHEDULE, 0)
    plan = _plans.backward_plans.get(backward_call.plan_key)
    backward_workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    grads = [torch.empty_like(t) for t in (qd, kd, vd)]
    backward_tensors = (
        [_ops._c_tensor(t) for t in (qd, kd, vd, out, dout)] + [lse.data_ptr()] + [_ops._c_tensor(t) for t in grads]
    )
    row(
        "ctypes backward (prebuilt args, plan)",
        lambda: plan.backward(shape, *backward_tensors, backward_workspace.data_ptr(), plan.workspace_bytes, stream),
    )

    # The functions torch.library.custom_op wraps, then the ops through the dispatcher.
    forward_body, backward_body = _ops.forward._init_fn, _ops.backward._init_fn
    row("_ops.forward python body (no custom op)", lambda: forward_body(qd, kd, vd, SCALE, True, SCHEDULE, 0))
    row(
        "_ops.backward python body (no custom op)",
        lambda: backward_body(dout, qd, kd, vd, out, lse, SCALE, True, SCHEDULE, 0),
    )
    row(
        "torch.ops.dash_attn.forward (detached)",
        lambda: torch.ops.dash_attn.forward(qd, kd, vd, SCALE, True, SCHEDULE, 0),
    )
    row(
        "torch.ops.dash_attn.backward",
        lambda: torch.ops.dash_attn.backward(dout, qd, kd, vd, out, lse, SCALE, True, SCHEDULE, 0),
    )

    def forward_without_grad() -> None:
        with torch.no_grad():
            dash_attn.flash_attn_func(q, k, v, causal=True)

    def step() -> None:
        torch.autograd.grad(dash_attn.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)

    def sdpa_step() -> None:
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        torch.autograd.grad(o, (q, k, v), dout.transpose(1, 2))

    class MinimalFunction(torch.autograd.Function):
        """The op bodies under the least autograd wrapping torch allows: the floor of an eager path."""

        @staticmethod
        def forward(ctx, q, k, v):
            o, lse_ = forward_body(q, k, v, SCALE, True, SCHEDULE, 0)
            ctx.save_for_backward(q, k, v, o, lse_)
            return o

        @staticmethod
        def backward(ctx, grad):
            return backward_body(grad, *ctx.saved_tensors, SCALE, True, SCHEDULE, 0)

    def minimal_step() -> None:
        torch.autograd.grad(MinimalFunction.apply(q, k, v), (q, k, v), dout)

    row("flash_attn_func no_grad", forward_without_grad)
    row("flash_attn_func with grad (fwd only)", lambda: dash_attn.flash_attn_func(q, k, v, causal=True))
    row("flash_attn_func fwd+bwd", step)
    row("sdpa fwd+bwd", sdpa_step)
    row("autograd.Function over the op bodies fwd+bwd", minimal_step)


if __name__ == "__main__":
    main()
