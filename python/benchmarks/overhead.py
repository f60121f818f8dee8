"""Host time per attention call on a tiny shape, where the GPU work is negligible and the host path is
all that shows: dash_attn next to SDPA (and FA3 when `flash_attn_interface` imports).

For each implementation: `--iters` forward+backward steps (forward, then torch.autograd.grad) issued back to
back after warm-up, timed on the host clock with one synchronize at the end; and the forward alone. The
shape is (1, 128, 1, 64), causal, bf16, so every microsecond measured is host work (Python, the library's
validation and planning, launches). dash_attn varlen is flash_attn_varlen_func on the same tokens packed as one
sequence, (128, 1, 64) with cu_seqlens (0, 128). --rounds repeats the whole table, implementations alternating,
since the host clock of a shared machine drifts between rounds.

usage: python3 overhead.py [--iters N] [--rounds R]
"""

from __future__ import annotations

import argparse
import time

import torch

SHAPE = (1, 128, 1, 64)
PACKED_SHAPE = (SHAPE[0] * SHAPE[1], SHAPE[2], SHAPE[3])


def implementations() -> dict:
    import dash_attn
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True).transpose(1, 2)

    cu_seqlens = torch.tensor([0, SHAPE[1]], dtype=torch.int32, device="cuda")

    def varlen(q, k, v):
        return dash_attn.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, SHAPE[1], SHAPE[1], causal=True)

    calls = {
        "dash_attn": (lambda q, k, v: dash_attn.flash_attn_func(q, k, v, causal=True), SHAPE),
        "dash_attn varlen": (varlen, PACKED_SHAPE),
        "sdpa:flash": (sdpa, SHAPE),
    }
    try:
        from flash_attn_interface import flash_attn_func as fa3
    except ImportError:
        pass
    else:
        calls["fa3"] = (lambda q, k, v: fa3(q, k, v, causal=True), SHAPE)
    return calls


def microseconds_per_call(step, iters: int) -> float:
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print("| round | implementation | forward (us/call) | forward + backward (us/step) |")
    print("|---|---|---|---|")
    calls = implementations()
    for round_index in range(args.rounds):
        for name, (call, shape) in calls.items():
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

            def forward():
                with torch.no_grad():
                    call(q, k, v)

            def step():
                out = call(q, k, v)
                out = out[0] if isinstance(out, tuple) else out
                torch.autograd.grad(out, (q, k, v), dout)

            print(f"| {round_index + 1} | {name} | {microseconds_per_call(forward, args.iters):.0f} | "
                  f"{microseconds_per_call(step, args.iters):.0f} |", flush=True)


if __name__ == "__main__":
    main()
