"""Forward and backward TFLOPS of dash_attn next to every peer importable in this process, one timing method
for all, with CSV and Markdown out.

Peers: FlashAttention-3 (`flash_attn_interface`, deterministic and not) when it is on PYTHONPATH, and PyTorch
SDPA's cuDNN and flash backends. dash_attn runs every schedule asked for (`--schedules`).

Timing (the same for every implementation): inputs are made once per shape; each number is the median of
`--repeats` measurements of a loop of N back-to-back calls between two CUDA events, divided by N, after
warm-up. No host work but the calls themselves sits inside the timed window, and N grows for short shapes so
that a loop runs well past launch latency. The backward is `torch.autograd.grad` of the forward's output, so
every implementation pays its own autograd and launch overhead. FLOPs: forward 4*B*Hq*Sq*Sk*D (halved for
causal), backward 2.5x that. Every shape moves more than the H200's 60 MB L2 at 16384 tokens.

Grids: `paper` (head dims 64 and 128, hidden 2048, seqlen 512..16384, full and causal), `gqa` (two GQA layouts
at head dim 128) and `wide` (head dims 96, 192 and 256 at hidden 2048 rounded down to whole heads, seqlen
1024..16384, full and causal). FA3 refuses a deterministic backward at head dim 256, so the tables also give DASH's
best deterministic backward against FA3's non-deterministic one.

Variants: `--window LEFT,RIGHT` (FlashAttention's window_size; the causal rows keep only LEFT, as both libraries
do) and `--softcap CAP` run DASH and FA3 with that mask or cap; SDPA has neither and is left out. A window's FLOPs
count the (query, key) pairs it lets through, so TFLOPS stay comparable across masks.

usage: python3 compare.py [--grid paper,gqa,wide] [--head-dims 256] [--seqlens 1024,4096] [--impls dash,fa3,cudnn,flash]
                          [--schedules ...] [--window LEFT,RIGHT] [--softcap CAP] [--csv OUT.csv] [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from dataclasses import dataclass

import torch
from _common import milliseconds_per_call

DASH_SCHEDULES = ("auto", "ascending", "descending", "shortest-first", "shift", "symmetric-shift")
TOKENS = 16384  # tokens per grid point (batch = TOKENS / seqlen)
PAPER_HIDDEN = 2048  # paper grid: heads = hidden / head_dim
TARGET_FLOPS_PER_LOOP = 2e12
FA3_DETERMINISTIC_MAX_HEAD_DIM = 192  # FA3 (0251105) refuses, or crashes on, a deterministic backward past it


@dataclass(frozen=True)
class Shape:
    tag: str
    batch: int
    seqlen: int
    heads_q: int
    heads_kv: int
    head_dim: int
    causal: bool
    window: tuple[int, int] = (-1, -1)  # FlashAttention's window_size; -1 leaves a side open
    softcap: float = 0.0

    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        heads = f" ({self.heads_q}/{self.heads_kv} heads)" if self.heads_q != self.heads_kv else ""
        variant = f" window{self.window}" if self.window != (-1, -1) else ""
        variant += f" softcap {self.softcap:g}" if self.softcap else ""
        return f"hd{self.head_dim} {mask} {self.seqlen}{heads}{variant}"

    def visible_pairs(self) -> int:
        """(query, key) pairs of one sequence the mask lets through: the causal triangle with its diagonal counted
        as half (the convention of the FLOP counts above, S^2 / 2), otherwise each row's keys in its window."""
        s = self.seqlen
        left, right = self.window
        if left < 0 and (self.causal or right < 0):
            return s * s // 2 if self.causal else s * s
        right = 0 if self.causal else right
        pairs = 0
        for i in range(s):
            low = max(0, i - left) if left >= 0 else 0
            high = min(s - 1, i + right) if right >= 0 else s - 1
            pairs += high - low + 1
        return pairs

    def forward_flops(self) -> float:
        return 4.0 * self.batch * self.heads_q * self.visible_pairs() * self.head_dim


def grid(which: list[str]) -> list[Shape]:
    shapes = []
    if "paper" in which:
        for hd in (64, 128):
            for causal in (False, True):
                for s in (512, 1024, 2048, 4096, 8192, 16384):
                    h = PAPER_HIDDEN // hd
                    shapes.append(Shape("paper", TOKENS // s, s, h, h, hd, causal))
    if "gqa" in which:  # LLaMA3-8B (32/8) and Qwen2.5-7B (28/4) head layouts
        for hq, hkv in ((32, 8), (28, 4)):
            for s in (4096, 8192, 16384):
                shapes.append(Shape("gqa", TOKENS // s, s, hq, hkv, 128, True))
    if "wide" in which:
        for hd in (96, 192, 256):
            for causal in (False, True):
                for s in (1024, 2048, 4096, 8192, 16384):
                    h = PAPER_HIDDEN // hd
                    shapes.append(Shape("wide", TOKENS // s, s, h, h, hd, causal))
    return shapes


def implementations(
    impls: list[str], schedules: list[str], window: tuple[int, int] = (-1, -1), softcap: float = 0.0
) -> dict:
    """name -> call(q, k, v, causal) for every implementation that imports here, with the window and softcap;
    says which are missing."""
    calls = {}
    variant = window != (-1, -1) or softcap != 0.0
    if "dash" in impls:
        import dash_attn

        def dash(schedule: str, deterministic: bool):
            return lambda q, k, v, causal: dash_attn.flash_attn_func(
                q,
                k,
                v,
                causal=causal,
                deterministic=deterministic,
                schedule=schedule,
                window_size=window,
                softcap=softcap,
            )

        for s in schedules:
            calls[f"dash:{s}"] = dash(s, True)
        calls["dash:nondet"] = dash("auto", False)
    if "fa3" in impls:
        try:
            from flash_attn_interface import flash_attn_func as fa3
        except ImportError as e:
            print(f"fa3 not measured: {e}", file=sys.stderr)
        else:

            def fa3_call(deterministic: bool):
                def call(q, k, v, causal):
                    if deterministic and q.shape[-1] > FA3_DETERMINISTIC_MAX_HEAD_DIM:
                        raise NotImplementedError(
                            f"FA3's deterministic backward stops at head dim {FA3_DETERMINISTIC_MAX_HEAD_DIM} "
                            "(at 256 it killed the process)"
                        )
                    out = fa3(q, k, v, causal=causal, deterministic=deterministic, window_size=window, softcap=softcap)
                    return out[0] if isinstance(out, tuple) else out

                return call

            calls["fa3:det"] = fa3_call(True)
            calls["fa3:nondet"] = fa3_call(False)
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(backend):
        def call(q, k, v, causal):
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=causal, enable_gqa=qt.shape[1] != kt.shape[1]
                )
            return out.transpose(1, 2)

        return call

    if variant and ("cudnn" in impls or "flash" in impls):
        print("sdpa not measured: it has no sliding window or softcap", file=sys.stderr)
        return calls
    if "cudnn" in impls:
        calls["sdpa:cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    if "flash" in impls:
        calls["sdpa:flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    return calls


def make_inputs(shape: Shape) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and dout, N(0, 1) in bf16, (B, S, H, D)."""
    b, s, hq, hkv, d = shape.batch, shape.seqlen, shape.heads_q, shape.heads_kv, shape.head_dim
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return q, k, v, torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)


def measure(shape: Shape, call, inputs, repeats: int, warmup: int, backward: bool = True) -> tuple[float, float | None]:
    """(forward ms, backward ms) of one implementation; backward ms is None when `backward` is False."""
    q, k, v, dout = inputs
    n = max(3, min(50, int(TARGET_FLOPS_PER_LOOP / shape.forward_flops())))
    with torch.no_grad():
        for _ in range(warmup):
            call(q, k, v, shape.causal)
        forward_ms = milliseconds_per_call(lambda: call(q, k, v, shape.causal), n, repeats)
    if not backward:
        return forward_ms, None
    out = call(q, k, v, shape.causal)
    grad = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
    for _ in range(warmup):
        grad()
    backward_ms = milliseconds_per_call(grad, max(3, n // 2), repeats)
    return forward_ms, backward_ms


def ratio(a, b):
    return a / b if a and b else None


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def markdown(rows: list[dict], shapes: list[Shape], schedules: list[str]) -> str:
    by = {(r["shape"], r["impl"]): r for r in rows}
    fmt = lambda x: f"{x:.0f}" if x else "-"  # noqa: E731
    fmtr = lambda x: f"{x:.2f}" if x else "-"  # noqa: E731
    lines = [
        "Backward TFLOPS",
        "",
        "| shape | FA3 non-det | FA3 det | DASH non-det | DASH auto | DASH best det (schedule) | cuDNN "
        "| best det / FA3 det | DASH non-det / FA3 non-det | best det / FA3 non-det |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    det_ratios, nondet_ratios, det_to_nondet_ratios, fwd_ratios = [], [], [], []
    for sh in shapes:
        n = sh.name()
        get = lambda impl, key="bwd_tflops", n=n: by.get((n, impl), {}).get(key)  # noqa: E731
        best = max(((get(f"dash:{s}"), s) for s in schedules if get(f"dash:{s}")), default=(None, ""))
        r_det, r_nondet = ratio(best[0], get("fa3:det")), ratio(get("dash:nondet"), get("fa3:nondet"))
        r_det_to_nondet = ratio(best[0], get("fa3:nondet"))
        det_ratios.append(r_det)
        nondet_ratios.append(r_nondet)
        det_to_nondet_ratios.append(r_det_to_nondet)
        lines.append(
            f"| {n} | {fmt(get('fa3:nondet'))} | {fmt(get('fa3:det'))} | {fmt(get('dash:nondet'))} | "
            f"{fmt(get('dash:auto'))} | {fmt(best[0])} ({best[1]}) | {fmt(get('sdpa:cudnn'))} | "
            f"{fmtr(r_det)} | {fmtr(r_nondet)} | {fmtr(r_det_to_nondet)} |"
        )
    lines += [
        "",
        "Forward TFLOPS",
        "",
        "| shape | FA3 | cuDNN | SDPA flash | DASH | DASH / max(FA3, cuDNN) |",
        "|---|---|---|---|---|---|",
    ]
    for sh in shapes:
        n = sh.name()
        get = lambda impl, n=n: by.get((n, impl), {}).get("fwd_tflops")  # noqa: E731
        peers = [x for x in (get("fa3:det") or get("fa3:nondet"), get("sdpa:cudnn")) if x]
        r = ratio(get("dash:auto"), max(peers) if peers else None)
        fwd_ratios.append(r)
        fa3_forward = get("fa3:det") or get("fa3:nondet")
        lines.append(
            f"| {n} | {fmt(fa3_forward)} | {fmt(get('sdpa:cudnn'))} | {fmt(get('sdpa:flash'))} | "
            f"{fmt(get('dash:auto'))} | {fmtr(r)} |"
        )
    lines += [
        "",
        f"Geometric means: DASH best det / FA3 det {fmtr(geomean(det_ratios))}; "
        f"DASH non-det / FA3 non-det {fmtr(geomean(nondet_ratios))}; "
        f"DASH best det / FA3 non-det {fmtr(geomean(det_to_nondet_ratios))}; "
        f"DASH forward / max(FA3, cuDNN) {fmtr(geomean(fwd_ratios))}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="paper,gqa", help="comma-separated: paper, gqa, wide")
    parser.add_argument("--head-dims", help="comma-separated: keep only the grid's shapes of these head dims")
    parser.add_argument("--seqlens", help="comma-separated: keep only the grid's shapes of these sequence lengths")
    parser.add_argument("--window", default="-1,-1", help="LEFT,RIGHT: FlashAttention's window_size for every shape")
    parser.add_argument("--softcap", type=float, default=0.0, help="softcap for every shape (0: none)")
    parser.add_argument("--impls", default="dash,fa3,cudnn,flash", help="comma-separated: dash, fa3, cudnn, flash")
    parser.add_argument("--schedules", default=",".join(DASH_SCHEDULES), help="dash_attn schedules to time")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--forward-only",
        action="store_true",
        help="time the forward alone (a forward kernel's A/B in half the time); no backward columns",
    )
    parser.add_argument("--csv", help="write every row here")
    parser.add_argument("--markdown", help="write the tables here")
    args = parser.parse_args()
    schedules = args.schedules.split(",")
    shapes = grid(args.grid.split(","))
    if args.head_dims:
        kept = {int(d) for d in args.head_dims.split(",")}
        shapes = [sh for sh in shapes if sh.head_dim in kept]
    if args.seqlens:
        kept = {int(s) for s in args.seqlens.split(",")}
        shapes = [sh for sh in shapes if sh.seqlen in kept]
    left, right = (int(x) for x in args.window.split(","))
    shapes = [dataclasses.replace(sh, window=(left, right), softcap=args.softcap) for sh in shapes]
    calls = implementations(args.impls.split(","), schedules, (left, right), args.softcap)
    torch.manual_seed(0)
    rows = []
    for shape in shapes:
        inputs = make_inputs(shape)
        for impl, call in calls.items():
            row = dict(
                shape=shape.name(),
                tag=shape.tag,
                batch=shape.batch,
                seqlen=shape.seqlen,
                heads_q=shape.heads_q,
                heads_kv=shape.heads_kv,
                head_dim=shape.head_dim,
                causal=shape.causal,
                impl=impl,
                fwd_ms=None,
                bwd_ms=None,
                fwd_tflops=None,
                bwd_tflops=None,
                error="",
            )
            try:
                f_ms, b_ms = measure(shape, call, inputs, args.repeats, args.warmup, backward=not args.forward_only)
                flops = shape.forward_flops()
                row.update(
                    fwd_ms=f_ms,
                    bwd_ms=b_ms,
                    fwd_tflops=flops / f_ms / 1e9,
                    bwd_tflops=2.5 * flops / b_ms / 1e9 if b_ms else None,
                )
            except Exception as e:  # a schedule that does not apply to a shape keeps its row, with the reason
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            rows.append(row)
            shown = row["error"] or f"fwd {row['fwd_tflops']:.0f}" + (
                f"  bwd {row['bwd_tflops']:.0f}" if row["bwd_tflops"] else ""
            )
            print(f"{impl:22s} {shape.name():32s} {shown}", flush=True)
        del inputs
        torch.cuda.empty_cache()
    table = markdown(rows, shapes, schedules)
    print(table)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table + "\n")


if __name__ == "__main__":
    main()
