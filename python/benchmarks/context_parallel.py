"""Per-GPU throughput of deterministic context-parallel attention (dash_attn.parallel, ring and ulysses) against
one GPU: forward+backward of bf16 attention (head_dim 128, GQA) at 32k-128k total tokens over the processes of a
torchrun job, next to single-GPU DASH at the same tokens per GPU and, on rank 0, at all the tokens.

    torchrun --standalone --nproc_per_node 2 python/benchmarks/context_parallel.py \\
        [--tokens 32768 65536 131072] [--sm-margins 0 8 16] [--csv context_parallel.csv]

Every configuration's time is the median of CUDA-event intervals per call after warm-up calls (_common.median_ms)
on each rank; a context-parallel row reports the slowest rank's median, since the step ends when it does.
Throughput is TFLOP/s per GPU: the attention FLOPs of the whole sequence (4 * batch * heads * seqlen^2 *
head_dim forward, halved under the causal mask, times 3.5 for forward and backward) divided by the GPU count and
the time. "single, same tokens/GPU" runs every rank alone on seqlen / world_size tokens (no communication): the
per-GPU rate the kernels reach on the local size, which context parallelism pays communication and block merging
against. "single, all tokens" (rank 0, the others idle) is the step time context parallelism divides; speedup is
its time over the context-parallel time. When flash_attn_interface imports (FA3's hopper/ directory on the
Python path), each mode also runs on FA3's kernels, deterministic and not
(parallel.FlashAttention3LocalAttention): the comparison with ring attention made of FA3. Prints a Markdown table
and writes an optional CSV.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
from _common import environment, markdown_table, median_ms
from torch import Tensor

from dash_attn import flash_attn_func, parallel

# The backward of attention costs 2.5 forwards (FlashAttention's convention); forward+backward is 3.5.
FORWARD_BACKWARD_FACTOR = 3.5


def attention_flops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool) -> float:
    forward = 4.0 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
    return FORWARD_BACKWARD_FACTOR * forward


def make_inputs(args: argparse.Namespace, seqlen: int, device: torch.device) -> tuple[Tensor, ...]:
    generator = torch.Generator(device).manual_seed(0)

    def draw(heads: int) -> Tensor:
        shape = (args.batch, seqlen, heads, args.head_dim)
        return torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16)

    q, k, v = (
        draw(args.heads).requires_grad_(),
        draw(args.kv_heads).requires_grad_(),
        draw(args.kv_heads).requires_grad_(),
    )
    return q, k, v, draw(args.heads)


def training_step(
    attention: Callable[[Tensor, Tensor, Tensor], Tensor], inputs: tuple[Tensor, ...]
) -> Callable[[], object]:
    """Forward, then backward of a fixed upstream gradient; gradients are returned, not accumulated."""
    q, k, v, dout = inputs
    return lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), dout)


def single_gpu_ms(args: argparse.Namespace, seqlen: int, causal: bool, device: torch.device) -> float:
    """This rank's median step time of flash_attn_func alone on `seqlen` tokens."""
    attention = functools.partial(flash_attn_func, causal=causal, schedule=args.schedule)
    return median_ms(training_step(attention, make_inputs(args, seqlen, device)), args.warmup, args.iters)


def context_parallel_ms(
    args: argparse.Namespace,
    mode: str,
    sm_margin: int,
    local_seqlen: int,
    causal: bool,
    device: torch.device,
    local_attention: parallel.LocalAttention | None = None,
) -> float:
    """The slowest rank's median step time of context_parallel_attn_func with `local_seqlen` tokens per rank, on
    DASH's kernels or on `local_attention`'s."""
    attention = functools.partial(
        parallel.context_parallel_attn_func,
        mode=mode,
        causal=causal,
        schedule=args.schedule,
        sm_margin=sm_margin,
        local_attention=local_attention,
    )
    step = training_step(attention, make_inputs(args, local_seqlen, device))
    dist.barrier()
    return slowest(median_ms(step, args.warmup, args.iters), device)


def slowest(ms: float, device: torch.device) -> float:
    """The largest of every rank's `ms`."""
    value = torch.tensor([ms], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32768, 65536, 131072], help="total sequence lengths")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=list(parallel.MODES), choices=parallel.MODES)
    parser.add_argument("--masks", nargs="+", default=["causal", "full"], choices=["causal", "full"])
    parser.add_argument("--sm-margins", type=int, nargs="+", default=[0, 8, 16], help="SMs left to NCCL")
    parser.add_argument("--schedule", default="auto", help="the local kernel's backward schedule")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-single-all-tokens", action="store_true", help="skip single-GPU runs at all tokens")
    parser.add_argument("--no-fa3", action="store_true", help="skip the rows on FlashAttention-3's kernels")
    parser.add_argument("--csv", help="also write the rows to this CSV file (rank 0)")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    shape = f"batch {args.batch}, heads {args.heads}/{args.kv_heads}, head_dim {args.head_dim}, bf16"
    fa3_locals = {}
    if not args.no_fa3:
        try:
            fa3_locals = {
                "FA3 deterministic": parallel.FlashAttention3LocalAttention(deterministic=True),
                "FA3": parallel.FlashAttention3LocalAttention(deterministic=False),
            }
        except ImportError as error:
            if rank == 0:
                print(f"context_parallel: FA3 rows skipped: {error}")

    headers = ["tokens", "mask", "configuration", "ms", "TFLOP/s per GPU", "speedup vs single, all tokens"]
    rows = []
    for tokens in args.tokens:
        for mask in args.masks:
            causal = mask == "causal"
            total_flops = attention_flops(args.batch, args.heads, tokens, args.head_dim, causal)
            local_tokens = tokens // world_size

            all_tokens_ms = None
            if not args.no_single_all_tokens:
                all_tokens_ms = slowest(single_gpu_ms(args, tokens, causal, device) if rank == 0 else 0.0, device)
                rows.append(
                    [tokens, mask, "single GPU, all tokens", all_tokens_ms, total_flops / all_tokens_ms / 1e9, 1.0]
                )
            local_ms = slowest(single_gpu_ms(args, local_tokens, causal, device), device)
            local_flops = attention_flops(args.batch, args.heads, local_tokens, args.head_dim, causal)
            label = f"single GPU, {local_tokens} tokens (same per GPU)"
            rows.append([tokens, mask, label, local_ms, local_flops / local_ms / 1e9, None])
            for mode in args.modes:
                for margin in args.sm_margins:
                    ms = context_parallel_ms(args, mode, margin, local_tokens, causal, device)
                    speedup = all_tokens_ms / ms if all_tokens_ms else None
                    label = f"{mode} x{world_size}, sm_margin {margin}"
                    rows.append([tokens, mask, label, ms, total_flops / world_size / ms / 1e9, speedup])
                # The same context parallelism on FlashAttention-3's kernels, deterministic and not.
                for name, local in fa3_locals.items():
                    ms = context_parallel_ms(args, mode, 0, local_tokens, causal, device, local)
                    speedup = all_tokens_ms / ms if all_tokens_ms else None
                    label = f"{mode} x{world_size} on {name}, sm_margin 0"
                    rows.append([tokens, mask, label, ms, total_flops / world_size / ms / 1e9, speedup])

    if rank == 0:
        print(", ".join(f"{key} {value}" for key, value in environment().items()))
        print(f"{world_size} GPUs, {shape}, schedule {args.schedule}\n")

        def shown(value: object) -> str:
            return f"{value:.3g}" if isinstance(value, float) else ("-" if value is None else str(value))

        print(markdown_table(headers, [[shown(cell) for cell in row] for row in rows]))
        if args.csv:
            with open(args.csv, "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["world_size", "shape", *headers])
                writer.writerows([world_size, shape, *row] for row in rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
