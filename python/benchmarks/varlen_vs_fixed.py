"""Varlen against fixed length at equal total tokens: the forward and the deterministic backward of
dash_attn.flash_attn_varlen_func on packed batches, next to flash_attn_func on the (batch, seqlen) batch of the same
16384 tokens, one timing method for all (issue 12's target: varlen at >= 0.95x DASH's own fixed-length speed).

For each point of the paper grid (head dims 64 and 128, full and causal, heads = 2048 / head_dim, bf16):
- fixed: flash_attn_func on (16384 / S, S, H, D);
- varlen, equal lengths: the same tokens packed as (16384, H, D) with cu_seqlens 0, S, 2S, ...: the same work, so
  its ratio to fixed is what the packed layout and per-sequence bookkeeping cost;
- varlen, mixed lengths: lengths drawn uniformly from [S/2, 3S/2] (seeded) and the last cut so that they sum to
  16384; max_seqlen is the longest. TFLOPS count each sequence's own work (4 H s_q s_k D, half under the causal
  mask, as for the fixed batch), so a mixed batch is judged by the work it holds.
Timing as in compare.py: a loop of back-to-back calls between two CUDA events, median of the repeats, after
warm-up; the backward is torch.autograd.grad of the forward's output (deterministic, schedule --schedule, "auto"
by default).

With --kernel-times the forward of each batch also runs under torch.profiler, and the rows add the GPU time of
its kernels per call (summed over every kernel a call launches, padding clears included): where the loop's time
per call is well above it, the calls are bound by their host path rather than by their kernels. The kernels of
each call are listed on stderr.

usage: python3 varlen_vs_fixed.py [--seqlens 512,1024,2048,4096,8192] [--repeats 5] [--kernel-times]
                                  [--schedule auto] [--csv OUT] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import csv
import random
import sys

import torch
from _common import environment, markdown_table, milliseconds_per_call

TOKENS = 16384
PAPER_HIDDEN = 2048
TARGET_FLOPS_PER_LOOP = 2e12
MIXED_SEED = 20261202


def mixed_lengths(seqlen: int) -> list[int]:
    """Lengths from [seqlen/2, 3 seqlen/2] summing to TOKENS, the same for every run (seeded per seqlen)."""
    rng = random.Random(MIXED_SEED + seqlen)
    lengths: list[int] = []
    while sum(lengths) < TOKENS:
        lengths.append(rng.randint(seqlen // 2, 3 * seqlen // 2))
    lengths[-1] -= sum(lengths) - TOKENS
    if lengths[-1] == 0:
        lengths.pop()
    return lengths


def forward_flops(lengths: list[int], heads: int, head_dim: int, causal: bool) -> float:
    return sum(4.0 * heads * s * s * head_dim * (0.5 if causal else 1.0) for s in lengths)


def measure(forward, inputs, flops: float, repeats: int, warmup: int = 3) -> tuple[float, float]:
    """(forward TFLOPS, backward TFLOPS) of `forward` on (q, k, v, dout)."""
    q, k, v, dout = inputs
    n = max(3, min(50, int(TARGET_FLOPS_PER_LOOP / flops)))
    with torch.no_grad():
        for _ in range(warmup):
            forward(q, k, v)
        forward_ms = milliseconds_per_call(lambda: forward(q, k, v), n, repeats)
    out = forward(q, k, v)

    def grad() -> None:
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    for _ in range(warmup):
        grad()
    backward_ms = milliseconds_per_call(grad, max(3, n // 2), repeats)
    return flops / forward_ms / 1e9, 2.5 * flops / backward_ms / 1e9


def forward_kernel_microseconds(forward, inputs, label: str, calls: int = 10) -> float:
    """GPU time of the kernels one forward call launches, in µs (mean over `calls` profiled calls); each kernel's
    share goes to stderr under `label`."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v, _ = inputs
    with torch.no_grad():
        forward(q, k, v)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                forward(q, k, v)
            torch.cuda.synchronize()
    total = 0.0
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None)
        if device_us is None:
            device_us = event.cuda_time_total
        if device_us <= 0:
            continue
        total += device_us
        print(
            f"  {label}: {device_us / calls:9.1f} us/call  {event.count // calls} x {event.key[:100]}", file=sys.stderr
        )
    return total / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--kernel-times", action="store_true", help="also profile each forward's kernels (GPU µs per call, see above)"
    )
    parser.add_argument(
        "--schedule",
        default="auto",
        help="the deterministic backward's schedule, for the fixed and the varlen batches (one that "
        "every mask admits: auto, ascending, descending, shortest-first)",
    )
    parser.add_argument("--csv")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("varlen_vs_fixed.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import dash_attn

    rows = []
    for head_dim in (64, 128):
        heads = PAPER_HIDDEN // head_dim
        for causal in (False, True):
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                batch = TOKENS // seqlen

                def tensor(*shape: int, grad: bool = True) -> torch.Tensor:
                    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=grad)

                fixed = (
                    tensor(batch, seqlen, heads, head_dim),
                    tensor(batch, seqlen, heads, head_dim),
                    tensor(batch, seqlen, heads, head_dim),
                    tensor(batch, seqlen, heads, head_dim, grad=False),
                )
                packed = tuple(
                    t.detach().reshape(TOKENS, heads, head_dim).requires_grad_(t.requires_grad) for t in fixed
                )
                mask = "causal" if causal else "full"
                shape = f"hd{head_dim} {mask} {seqlen}"

                def fixed_forward(q, k, v, causal=causal):
                    return dash_attn.flash_attn_func(q, k, v, causal=causal, schedule=args.schedule)

                results = {
                    "fixed": measure(
                        fixed_forward, fixed, forward_flops([seqlen] * batch, heads, head_dim, causal), args.repeats
                    )
                }
                kernel_us = {}
                if args.kernel_times:
                    kernel_us["fixed"] = forward_kernel_microseconds(fixed_forward, fixed, f"{shape} fixed")
                for name, lengths in (("varlen equal", [seqlen] * batch), ("varlen mixed", mixed_lengths(seqlen))):
                    offsets = [0]
                    for s in lengths:
                        offsets.append(offsets[-1] + s)
                    cu = torch.tensor(offsets, device="cuda", dtype=torch.int32)
                    longest = max(lengths)

                    def varlen_forward(q, k, v, cu=cu, longest=longest, causal=causal):
                        return dash_attn.flash_attn_varlen_func(
                            q, k, v, cu, cu, longest, longest, causal=causal, schedule=args.schedule
                        )

                    results[name] = measure(
                        varlen_forward, packed, forward_flops(lengths, heads, head_dim, causal), args.repeats
                    )
                    if args.kernel_times:
                        kernel_us[name] = forward_kernel_microseconds(varlen_forward, packed, f"{shape} {name}")
                row = {"shape": shape}
                for name, (fwd, bwd) in results.items():
                    row[f"{name} fwd"], row[f"{name} bwd"] = round(fwd, 1), round(bwd, 1)
                for name in ("varlen equal", "varlen mixed"):
                    row[f"{name} / fixed fwd"] = round(results[name][0] / results["fixed"][0], 3)
                    row[f"{name} / fixed bwd"] = round(results[name][1] / results["fixed"][1], 3)
                for name, us in kernel_us.items():
                    row[f"{name} fwd kernels us"] = round(us, 1)
                rows.append(row)
                print(row, flush=True)
    headers = list(rows[0].keys())
    table = markdown_table(headers, [[r[h] for h in headers] for r in rows])
    env = environment()
    text = f"Varlen against fixed length, TFLOPS, schedule {args.schedule}, {env}\n\n{table}\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=headers)
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
