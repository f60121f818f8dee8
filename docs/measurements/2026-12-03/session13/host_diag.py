"""Where flash_attn_func's step spends host time beyond a minimal autograd.Function (diagnosis, not committed)."""
import cProfile, io, pstats, statistics, sys, time
import torch
import torch.nn.functional as F
import dash_attn
from dash_attn import _ops

SCALE = 0.125
q, k, v = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn_like(q)

class Minimal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = _ops._forward_body(q, k, v, SCALE, True, 0)
        ctx.save_for_backward(q, k, v, o, lse)
        return o
    @staticmethod
    def backward(ctx, g):
        return _ops._backward_body(g, *ctx.saved_tensors, SCALE, True, "shortest-first", 0)

class Minimal2(torch.autograd.Function):
    """Minimal, but returning (out, lse) with lse non-differentiable and grads not materialized."""
    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = _ops._forward_body(q, k, v, SCALE, True, 0)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse
    @staticmethod
    def backward(ctx, g, glse):
        return _ops._backward_body(g, *ctx.saved_tensors, SCALE, True, "shortest-first", 0)

steps = {
    "flash_attn_func": lambda: torch.autograd.grad(dash_attn.flash_attn_func(q, k, v, causal=True), (q, k, v), dout),
    "flash_attn_func sf": lambda: torch.autograd.grad(dash_attn.flash_attn_func(q, k, v, causal=True, schedule="shortest-first"), (q, k, v), dout),
    "_ops.attention auto": lambda: torch.autograd.grad(_ops.attention(q, k, v, SCALE, True, "auto", 0)[0], (q, k, v), dout),
    "_ops.attention sf": lambda: torch.autograd.grad(_ops.attention(q, k, v, SCALE, True, "shortest-first", 0)[0], (q, k, v), dout),
    "minimal": lambda: torch.autograd.grad(Minimal.apply(q, k, v), (q, k, v), dout),
    "minimal2 (out,lse)": lambda: torch.autograd.grad(Minimal2.apply(q, k, v)[0], (q, k, v), dout),
    "sdpa": lambda: torch.autograd.grad(F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True), (q, k, v), dout.transpose(1, 2)),
    "fwd only flash_attn_func": lambda: dash_attn.flash_attn_func(q, k, v, causal=True),
    "fwd only minimal": lambda: Minimal.apply(q, k, v),
    "bwd only (attention_backward)": None,
}
o, lse = _ops._forward_body(q.detach(), k.detach(), v.detach(), SCALE, True, 0)
steps["bwd only (attention_backward)"] = lambda: _ops.attention_backward(dout, q.detach(), k.detach(), v.detach(), o, lse, SCALE, True, "shortest-first", 0)
steps["bwd body"] = lambda: _ops._backward_body(dout, q.detach(), k.detach(), v.detach(), o, lse, SCALE, True, "shortest-first", 0)

def block(call, n=200):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6

for call in steps.values():
    for _ in range(50):
        call()
results = {name: [] for name in steps}
for r in range(15):
    for name, call in (steps.items() if r % 2 == 0 else reversed(list(steps.items()))):
        results[name].append(block(call))
print("| step | median us | least us |")
for name, xs in results.items():
    print(f"| {name} | {statistics.median(xs):.1f} | {min(xs):.1f} |")
sys.stdout.flush()

for name in ("flash_attn_func", "minimal", "_ops.attention sf"):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        steps[name]()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
    print(f"\n=== cProfile {name} (2000 steps) ===\n" + s.getvalue())

from torch.profiler import profile, ProfilerActivity
for name in ("flash_attn_func", "minimal", "sdpa"):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            steps[name]()
        torch.cuda.synchronize()
    print(f"\n=== torch.profiler {name} (20 steps) ===")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
