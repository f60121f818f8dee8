"""Two pieces of context parallelism on one GPU, each against what it replaced: a packed call's backward as one
varlen launch (dash_attn.attention_backward with cu_seqlens) against one dense launch per sequence, and a block's
merge into the running (out, LSE) through DASH's merge kernel against the torch formula of parallel/_merge.py.

    python3 python/benchmarks/context_parallel_pieces.py

Times are medians of CUDA-event intervals after warm-up (_common.median_ms); bf16 inputs, causal, head dim 128.
Needs a Hopper GPU and a build with the varlen and merge kernels.
"""

from __future__ import annotations

import torch
from _common import median_ms

from dash_attn import attention_backward, flash_attn_varlen_func
from dash_attn.parallel import _merge

WARMUP, ITERS = 5, 20
HEADS, HEAD_DIM = 16, 128


def packed_backward(sequences: int, length: int, generator: torch.Generator) -> tuple[float, float]:
    """(one varlen launch, one launch per sequence) in ms for `sequences` causal sequences of `length` tokens."""
    total = sequences * length
    q, k, v, dout = (
        torch.randn(total, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=generator) for _ in range(4)
    )
    offsets = torch.arange(0, total + 1, length, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_varlen_func(q, k, v, offsets, offsets, length, length, causal=True, return_lse=True)
    options = dict(causal=True, schedule="descending")

    def one_launch() -> None:
        attention_backward(
            dout, q, k, v, out, lse, cu_seqlens_q=offsets, cu_seqlens_k=offsets, max_seqlen_q=length,
            max_seqlen_k=length, **options,
        )  # fmt: skip

    def per_sequence() -> None:
        for b in range(sequences):
            rows = slice(b * length, (b + 1) * length)
            dense = (t[None, rows] for t in (dout, q, k, v, out))
            attention_backward(*dense, lse[None, :, rows].contiguous(), **options)

    return median_ms(one_launch, WARMUP, ITERS), median_ms(per_sequence, WARMUP, ITERS)


def merge(rows: int, heads: int, generator: torch.Generator, fused: bool) -> float:
    """ms of merging a block of `rows` rows into the first half of 2 * rows accumulator rows (after two blocks)."""
    like = torch.empty(1, 2 * rows, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    part = torch.randn(1, rows, heads, HEAD_DIM, device="cuda", generator=generator)
    part_lse = torch.randn(1, heads, rows, device="cuda", generator=generator)
    merged = _merge.LseMerge(like, torch.float32)
    merged.fused = fused and merged.fused
    merged.add(part, part_lse, slice(0, rows))
    merged.add(part, part_lse, slice(rows, 2 * rows))
    return median_ms(lambda: merged.add(part, part_lse, slice(0, rows)), WARMUP, ITERS)


def main() -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    print(f"packed causal backward, d = {HEAD_DIM}, {HEADS} heads, bf16, descending")
    for sequences, length in ((64, 256), (16, 1024), (4, 4096)):
        one, per = packed_backward(sequences, length, generator)
        print(f"  {sequences} x {length}: one varlen launch {one:.3f} ms, per sequence {per:.3f} ms, {per / one:.2f}x")
    print(f"merge of a block (fp32, 32 heads of {HEAD_DIM})")
    for rows in (4096, 16384):
        fused, formula = (merge(rows, 32, generator, f) for f in (True, False))
        print(f"  {rows} rows: merge kernel {fused:.3f} ms, torch formula {formula:.3f} ms, {formula / fused:.2f}x")


if __name__ == "__main__":
    main()
