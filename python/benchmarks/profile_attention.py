"""One forward or backward call of one implementation inside a cudaProfilerStart/Stop range, for `ncu
--profile-from-start off` (scripts/dev/ncu_attention.sh runs it for DASH and FlashAttention-3 at one shape).

The shape follows compare.py's paper grid: 16384 tokens (batch = 16384 / seqlen), heads = 2048 / head_dim unless
given, bf16. The pass runs three times before the profiled call (the backward after one forward), so the profiled
call finds plans, proofs and autotuning done and its kernels alone are in the range.

usage: python3 profile_attention.py {forward,backward} IMPL HEAD_DIM SEQLEN {causal,full} [HEADS_Q HEADS_KV]
       IMPL: dash-det | dash-nondet | fa3-det | fa3-nondet | cudnn (FA3 needs flash_attn_interface on PYTHONPATH;
       cudnn is PyTorch SDPA's cuDNN backend, forward only); the -det/-nondet choice is the backward's and changes
       nothing in the forward
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

TOKENS = 16384
PAPER_HIDDEN = 2048
WARMUP_CALLS = 3


def forward_of(impl: str, causal: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    deterministic = impl.endswith("-det")
    if impl.startswith("dash"):
        import dash_attn

        return lambda q, k, v: dash_attn.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    if impl == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention

        def cudnn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # SDPA takes (batch, heads, seqlen, head_dim); the views keep the (batch, seqlen, heads) memory.
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return scaled_dot_product_attention(
                    q.transpose(1, 2),
                    k.transpose(1, 2),
                    v.transpose(1, 2),
                    is_causal=causal,
                    enable_gqa=k.shape[2] != q.shape[2],
                )

        return cudnn_forward
    from flash_attn_interface import flash_attn_func as fa3

    def fa3_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = fa3(q, k, v, causal=causal, deterministic=deterministic)
        return out[0] if isinstance(out, tuple) else out

    return fa3_forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pass_", metavar="pass", choices=["forward", "backward"])
    parser.add_argument("impl", choices=["dash-det", "dash-nondet", "fa3-det", "fa3-nondet", "cudnn"])
    parser.add_argument("head_dim", type=int)
    parser.add_argument("seqlen", type=int)
    parser.add_argument("mask", choices=["causal", "full"])
    parser.add_argument("heads_q", type=int, nargs="?")
    parser.add_argument("heads_kv", type=int, nargs="?")
    args = parser.parse_args()
    heads_q = args.heads_q or PAPER_HIDDEN // args.head_dim
    heads_kv = args.heads_kv or heads_q
    batch = TOKENS // args.seqlen

    def tensor(heads: int, requires_grad: bool) -> torch.Tensor:
        return torch.randn(
            batch, args.seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=requires_grad
        )

    backward = args.pass_ == "backward"
    if backward and args.impl == "cudnn":
        parser.error("cudnn: forward only (its backward is not one of the peers this script profiles)")
    q, k, v = tensor(heads_q, backward), tensor(heads_kv, backward), tensor(heads_kv, backward)
    forward = forward_of(args.impl, args.mask == "causal")
    if backward:
        dout = tensor(heads_q, False)
        out = forward(q, k, v)

        def call() -> None:
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    else:

        def call() -> None:
            forward(q, k, v)

    for _ in range(WARMUP_CALLS):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
