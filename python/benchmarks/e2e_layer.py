"""End-to-end cost of deterministic attention in training: the forward+backward step time of one decoder
layer (RMSNorm, fused QKV projection, optional RoPE, causal GQA attention, output projection, RMSNorm,
SwiGLU MLP) shaped like LLaMA3-8B and Qwen2.5-7B, at batch 1 in bf16, for each attention implementation
in the same run: dash_attn deterministic, dash_attn nondeterministic, FlashAttention-3 deterministic and
nondeterministic when flash_attn_interface imports (FA3's hopper/ built from source), and PyTorch SDPA's cuDNN and
flash backends. Kernel-level speedups matter to a user only in proportion to attention's share of the step;
this measures that share.

    python python/benchmarks/e2e_layer.py [--seqlens 4096 8192 16384] [--csv e2e_layer.csv]

Prints a Markdown table and writes a CSV (one row per model, seqlen and implementation).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from _common import environment, markdown_table, median_ms
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from dash_attn import flash_attn_func

ROPE_BASE = 500_000.0  # LLaMA3's rotary base; Qwen2.5 uses 1e6, which costs the same


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    qkv_bias: bool


MODELS = {
    "llama3-8b": ModelShape("llama3-8b", hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336, qkv_bias=False),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", hidden=3584, heads=28, kv_heads=4, head_dim=128, mlp=18944, qkv_bias=True),
}

# Attention on (B, S, H, D) query and (B, S, Hkv, D) key/value tensors, causal, returning (B, S, H, D).
Attention = Callable[[Tensor, Tensor, Tensor], Tensor]


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding in the rotate-half form (LLaMA, Qwen)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def rope_tables(seqlen: int, head_dim: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin of shape (S, 1, D) in bf16, broadcast over heads."""
    inverse = ROPE_BASE ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seqlen, device=device, dtype=torch.float32), inverse)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos().bfloat16(), angles.sin().bfloat16()


class DecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        q_width, kv_width = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        self.attention_norm = nn.RMSNorm(shape.hidden)
        self.qkv = nn.Linear(shape.hidden, q_width + 2 * kv_width, bias=shape.qkv_bias)
        self.out = nn.Linear(q_width, shape.hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(shape.hidden)
        self.gate_up = nn.Linear(shape.hidden, 2 * shape.mlp, bias=False)
        self.down = nn.Linear(shape.mlp, shape.hidden, bias=False)

    def forward(self, x: Tensor, attention: Attention, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        s = self.shape
        q, k, v = self.qkv(self.attention_norm(x)).split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
        )
        q, k, v = (t.unflatten(-1, (-1, s.head_dim)) for t in (q, k, v))
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        x = x + self.out(attention(q, k, v).flatten(-2))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def dash(deterministic: bool) -> Attention:
    return lambda q, k, v: flash_attn_func(q, k, v, causal=True, deterministic=deterministic)


def sdpa_supports_gqa(backend: SDPBackend, device: torch.device) -> bool:
    """Whether `backend` takes fewer key/value heads (enable_gqa); PyTorch documents it for flash only."""
    q = torch.randn(1, 4, 128, 128, device=device, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 128, 128, device=device, dtype=torch.bfloat16)
    try:
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    except RuntimeError:
        return False
    return True


def sdpa(backend: SDPBackend, native_gqa: bool) -> Attention:
    """SDPA on one backend. Without native GQA the key/value heads are repeated first, as a user of that
    backend must, and the step time includes that copy and its backward."""

    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if not native_gqa:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=native_gqa)
        return out.transpose(1, 2)

    return attention


def fa3(flash_attn_func_v3: Callable, deterministic: bool) -> Attention:
    """FlashAttention-3 (flash_attn_interface, built from FA3's hopper/), which takes GQA natively."""

    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out = flash_attn_func_v3(q, k, v, causal=True, deterministic=deterministic)
        return out[0] if isinstance(out, tuple) else out  # some FA3 versions also return the LSE

    return attention


def implementations(device: torch.device) -> dict[str, Attention]:
    found = {"dash-deterministic": dash(True), "dash-nondeterministic": dash(False)}
    try:
        from flash_attn_interface import flash_attn_func as flash_attn_func_v3
    except ImportError as e:
        print(f"e2e_layer: FA3 not measured ({e}); put its hopper/ directory on PYTHONPATH", file=sys.stderr)
    else:
        found["fa3-deterministic"] = fa3(flash_attn_func_v3, True)
        found["fa3-nondeterministic"] = fa3(flash_attn_func_v3, False)
    for label, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        native = sdpa_supports_gqa(backend, device)
        found[label if native else f"{label} (kv repeated)"] = sdpa(backend, native)
    return found


def step_time(layer: DecoderLayer, attention: Attention, seqlen: int, rope: bool, warmup: int, iters: int) -> float:
    """Median ms of one training step of `layer`: forward, then backward of a fixed upstream gradient into
    the input and every weight (gradients are dropped each step, as zero_grad(set_to_none=True) does)."""
    device = next(layer.parameters()).device
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(1, seqlen, layer.shape.hidden, device=device, dtype=torch.bfloat16, generator=generator)
    x.requires_grad_()
    grad = torch.randn(x.shape, device=device, dtype=torch.bfloat16, generator=generator)
    tables = rope_tables(seqlen, layer.shape.head_dim, device) if rope else None

    def step() -> None:
        for t in (x, *layer.parameters()):
            t.grad = None
        layer(x, attention, tables).backward(grad)

    return median_ms(step, warmup, iters)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--seqlens", nargs="+", type=int, default=[4096, 8192, 16384])
    parser.add_argument("--rope", action=argparse.BooleanOptionalAction, default=True, help="apply RoPE to q, k")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--csv", default="e2e_layer.csv", help="output CSV path")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("e2e_layer.py needs a CUDA GPU", file=sys.stderr)
        return 1

    device = torch.device("cuda")
    env = environment()
    attentions = implementations(device)
    records = []
    for model in args.models:
        torch.manual_seed(0)
        layer = DecoderLayer(MODELS[model]).to(device=device, dtype=torch.bfloat16)
        for seqlen in args.seqlens:
            for label, attention in attentions.items():
                try:
                    ms = step_time(layer, attention, seqlen, args.rope, args.warmup, args.iters)
                except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
                    print(f"{model} seqlen {seqlen} {label}: {error}", file=sys.stderr)
                    ms = float("nan")
                records.append({"model": model, "seqlen": seqlen, "batch": 1, "implementation": label, "ms": ms})
                print(f"{model:>10} seqlen {seqlen:>6} {label:<32} {ms:9.3f} ms", file=sys.stderr)
        del layer
        torch.cuda.empty_cache()

    with open(args.csv, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=[*records[0], *env])
        writer.writeheader()
        writer.writerows({**r, **env} for r in records)

    labels = list(attentions)
    reference = labels[0]
    rows = []
    for model in args.models:
        for seqlen in args.seqlens:
            times = {r["implementation"]: r["ms"] for r in records if r["model"] == model and r["seqlen"] == seqlen}
            rows.append(
                [model, seqlen, *(f"{times[label]:.2f}" for label in labels)]
                + [f"{times[reference] / times[label]:.3f}" for label in labels[1:]]
            )
    print(", ".join(f"{key} {value}" for key, value in env.items()) + f", RoPE {'on' if args.rope else 'off'}")
    print(
        f"Median step time (ms) of one decoder layer, forward + backward, batch 1, bf16, causal; ratio = "
        f"{reference} time / other time.\n"
    )
    headers = [
        "model",
        "seqlen",
        *(f"{label} ms" for label in labels),
        *(f"{reference} / {label}" for label in labels[1:]),
    ]
    print(markdown_table(headers, rows))
    print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
