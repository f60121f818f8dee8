"""Host time per attention call on a tiny shape, where the GPU work is negligible and the host path is
all that shows: dash_attn next to SDPA (and FA3 when `flash_attn_interface` imports).

For each implementation: `--iters` forward+backward steps (forward, then torch.autograd.grad) issued back to
back after warm-up, timed on the host clock with one synchronize at the end; and the forward alone. The
shape is (1, 128, 1, 64), causal, bf16, so every microsecond measured is host work (Python, the library's
validation and planning, launches). dash_attn varlen is flash_attn_varlen_func on the same tokens packed as one
sequence, (128, 1, 64) with cu_seqlens (0, 128). --rounds repeats the whole table, implementations alternating,
since the host clock of a shared machine drifts between rounds.

--paired BLOCKS answers one question under that drift: is dash_attn's forward+backward step (flash_attn_func) at
most SDPA's? It times BLOCKS short blocks of each (--block-steps steps each, timed as above), alternating block by
block in ABBA order (dash, SDPA, SDPA, dash, dash, SDPA, ...), so that a clock drifting linearly over the run adds
as much to each side every four blocks. Each dash block is paired with its neighbouring SDPA block (blocks 1-2,
3-4, ...), which ran under nearly the same clock. It reports, per implementation, the median and the least block
time per step, and the median and interquartile range of the per-pair ratio dash / SDPA, with how many pairs had
dash at most SDPA; the default table is not printed then.

usage: python3 overhead.py [--iters N] [--rounds R]
       python3 overhead.py --paired BLOCKS [--block-steps N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SHAPE = (1, 128, 1, 64)
PACKED_SHAPE = (SHAPE[0] * SHAPE[1], SHAPE[2], SHAPE[3])
PAIRED = ("dash_attn", "sdpa:flash")  # --paired's two implementations, in the order of its ratio


def implementations() -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import dash_attn

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            ).transpose(1, 2)

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


def forward_and_step(call, shape):
    """The forward alone (no grad) and the forward+backward step of `call`, on inputs of `shape` made here."""
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def forward():
        with torch.no_grad():
            call(q, k, v)

    def step():
        out = call(q, k, v)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out, (q, k, v), dout)

    return forward, step


def block_microseconds(step, steps: int) -> float:
    """Host microseconds per call of `steps` back-to-back calls, from an idle GPU to the last call's completion."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e6


def microseconds_per_call(step, iters: int) -> float:
    for _ in range(20):
        step()
    return block_microseconds(step, iters)


def abba_pairs(pairs: int) -> list[tuple[int, int]]:
    """The order of the two implementations (0 and 1) in each of `pairs` pairs of blocks: 0 first in even pairs,
    1 first in odd ones, so that over every two pairs each side runs once first and once second."""
    return [(0, 1) if index % 2 == 0 else (1, 0) for index in range(pairs)]


def paired_blocks(steps: tuple, pairs: int, block_steps: int) -> tuple[list[float], list[float], list[float]]:
    """Block times per step (µs) of steps[0] and of steps[1], and their ratio within each pair, in ABBA order."""
    times: tuple[list[float], list[float]] = ([], [])
    for order in abba_pairs(pairs):
        for side in order:
            times[side].append(block_microseconds(steps[side], block_steps))
    return times[0], times[1], [a / b for a, b in zip(*times)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), inclusive of the extremes so that a handful of pairs has them."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    first, median, third = statistics.quantiles(values, n=4, method="inclusive")
    return first, median, third


def paired_report(
    names: tuple[str, str], times: tuple[list[float], list[float]], ratios: list[float], block_steps: int
) -> str:
    lines = [
        f"Paired blocks of {block_steps} forward + backward steps, ABBA order, {len(ratios)} pairs",
        "",
        "| implementation | blocks | median (us/step) | least (us/step) |",
        "|---|---|---|---|",
    ]
    for name, block_times in zip(names, times):
        lines.append(f"| {name} | {len(block_times)} | {statistics.median(block_times):.1f} | {min(block_times):.1f} |")
    first, median, third = quartiles(ratios)
    at_most = sum(r <= 1.0 for r in ratios)
    lines += [
        "",
        f"{names[0]} / {names[1]} per pair: median {median:.3f}, interquartile range "
        f"[{first:.3f}, {third:.3f}]; {names[0]} <= {names[1]} in {at_most} of {len(ratios)} pairs.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--paired",
        type=int,
        metavar="BLOCKS",
        help=f"time BLOCKS blocks of each of {' and '.join(PAIRED)} in ABBA order (see above)",
    )
    parser.add_argument("--block-steps", type=int, default=200, help="steps per block of --paired")
    args = parser.parse_args()
    if args.paired is not None and (args.paired < 1 or args.block_steps < 1):
        parser.error("--paired and --block-steps take positive counts")
    calls = implementations()
    if args.paired is not None:
        steps = tuple(forward_and_step(*calls[name])[1] for name in PAIRED)
        for step in steps:  # one untimed block each: allocator growth, plan caches, lazy loading
            block_microseconds(step, args.block_steps)
        first, second, ratios = paired_blocks(steps, args.paired, args.block_steps)
        print(paired_report(PAIRED, (first, second), ratios, args.block_steps))
        return
    print("| round | implementation | forward (us/call) | forward + backward (us/step) |")
    print("|---|---|---|---|")
    for round_index in range(args.rounds):
        for name, (call, shape) in calls.items():
            forward, step = forward_and_step(call, shape)
            print(
                f"| {round_index + 1} | {name} | {microseconds_per_call(forward, args.iters):.0f} | "
                f"{microseconds_per_call(step, args.iters):.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
