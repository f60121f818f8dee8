"""PyTorch SDPA anchors for the kernel benchmark: times SDPA's cuDNN and flash backends, forward and backward
separately, on the DASH paper's grid (16384 tokens, batch = 16384 / seqlen, heads = 2048 / head_dim, head
dims 64 and 128, seqlen 512..16384, full and causal, bf16), so `dash-attn bench --anchors FILE` can put
DASH's numbers next to them from the same machine and day.

    python python/benchmarks/sdpa_anchors.py [--csv sdpa_anchors.csv]

The forward is timed as in training (inputs require grad, so the backends also save their softmax
statistics, as DASH always does); the backward as autograd's backward of that forward's output with a fixed
upstream gradient. TFLOPS count 4 * B * H * S^2 * D for the forward (halved for causal) and 2.5 times that
for the backward. The CSV columns are read by tools/dash-attn/cmd_bench.cpp: keep them as they are.
"""

from __future__ import annotations

import argparse
import csv
import sys

import torch
import torch.nn.functional as F
from _common import environment, markdown_table, median_ms
from torch.nn.attention import SDPBackend, sdpa_kernel

GRID_TOKENS = 16384
GRID_HIDDEN = 2048
GRID_SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
GRID_HEAD_DIMS = [64, 128]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
# Two GEMMs (Q K^T and P V) of 2 FLOPs per multiply-add; the backward does five GEMMs to the forward's two.
FORWARD_FLOPS_PER_SCORE_AND_DIM = 4
BACKWARD_FLOPS_PER_FORWARD_FLOP = 2.5
COLUMNS = ["hdim", "mask", "seqlen", "batch", "heads", "backend", "direction", "ms", "tflops"]


def forward_flops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool) -> float:
    flops = FORWARD_FLOPS_PER_SCORE_AND_DIM * batch * heads * seqlen * seqlen * head_dim
    return flops / 2 if causal else flops


def measure(
    backend: SDPBackend, batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, warmup: int, iters: int
) -> tuple[float, float]:
    """Median forward and backward milliseconds of one SDPA backend on one shape."""
    generator = torch.Generator("cuda").manual_seed(0)

    def draw(grad: bool) -> torch.Tensor:
        t = torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16, generator=generator)
        return t.requires_grad_(grad)

    q, k, v, dout = draw(True), draw(True), draw(True), draw(False)
    with sdpa_kernel(backend):
        forward_ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup, iters)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # autograd.grad returns the gradients instead of accumulating them into .grad, which would add a kernel.
    backward_ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup, iters)
    return forward_ms, backward_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", nargs="+", type=int, default=GRID_HEAD_DIMS)
    parser.add_argument("--seqlens", nargs="+", type=int, default=GRID_SEQLENS)
    parser.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--csv", default="sdpa_anchors.csv", help="output CSV path")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sdpa_anchors.py needs a CUDA GPU", file=sys.stderr)
        return 1

    rows = []
    for head_dim in args.head_dims:
        heads = GRID_HIDDEN // head_dim
        for causal in (False, True):
            mask = "causal" if causal else "full"
            for seqlen in args.seqlens:
                batch = GRID_TOKENS // seqlen
                for name in args.backends:
                    try:
                        times = measure(BACKENDS[name], batch, heads, seqlen, head_dim, causal, args.warmup, args.iters)
                    except RuntimeError as error:  # the backend refuses the shape: leave the row out
                        print(f"hdim {head_dim} {mask} seqlen {seqlen} {name}: {error}", file=sys.stderr)
                        continue
                    fwd = forward_flops(batch, heads, seqlen, head_dim, causal)
                    for direction, ms, flops in (
                        ("fwd", times[0], fwd),
                        ("bwd", times[1], BACKWARD_FLOPS_PER_FORWARD_FLOP * fwd),
                    ):
                        tflops = flops / (ms * 1e-3) / 1e12
                        rows.append(
                            [head_dim, mask, seqlen, batch, heads, name, direction, f"{ms:.4f}", f"{tflops:.1f}"]
                        )
                        print(
                            f"hdim {head_dim} {mask:>6} seqlen {seqlen:>5} {name:>5} {direction}: "
                            f"{ms:8.3f} ms {tflops:6.1f} TFLOPS",
                            file=sys.stderr,
                        )

    with open(args.csv, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(COLUMNS)
        writer.writerows(rows)

    print(", ".join(f"{key} {value}" for key, value in environment().items()))
    print("PyTorch SDPA on the paper's grid, bf16, median of CUDA-event times.\n")
    print(markdown_table(COLUMNS, rows))
    print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
