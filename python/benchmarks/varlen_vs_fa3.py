"""Varlen forward and backward TFLOPS of dash_attn next to FlashAttention-3's varlen, one timing method for both
(issue 12's target, for packed batches: every variant's best deterministic backward >= FA3's deterministic one).

For each point (head dims 64 and 128 unless --head-dims, heads = 2048 / head_dim, full and causal, bf16, 16384
tokens packed as (16384, H, D)), two batches of the same tensors, one cu_seqlens tensor passed as both offsets:
- equal lengths: 16384 / S sequences of S tokens;
- mixed lengths: varlen_vs_fixed.py's lengths (uniform in [S/2, 3S/2], seeded per S, the last cut so that they sum
  to 16384); max_seqlen is the longest.
Each batch runs dash_attn.flash_attn_varlen_func with deterministic=True under every --schedules entry and with
deterministic=False, and FA3's flash_attn_interface.flash_attn_varlen_func with deterministic=True and False when it
imports (else it is left out, saying why; a call it refuses keeps its row, with the error).

Timing as in compare.py and varlen_vs_fixed.py (whose measure() this reuses): inputs made once per point; each
number is the median of --repeats loops of back-to-back calls between two CUDA events, divided by the calls, after
warm-up; the backward is torch.autograd.grad of the forward's output, so each library pays its own autograd. FLOPs
count each sequence's own work, 4 H s^2 D per sequence, halved under the causal mask (compare.py's convention),
backward 2.5x the forward; a mixed batch is judged by the work it holds.

Output: a line per (batch, implementation) as it is measured, then Markdown tables (backward: each
implementation's TFLOPS, DASH's best deterministic schedule, the ratios DASH best det / FA3 det and DASH non-det /
FA3 non-det; forward: DASH / FA3) with their geometric means over all points and over the equal and the mixed
batches apart; --csv writes one row per (batch, implementation).

A separate script rather than a mode of compare.py: compare.py's shapes are (batch, seqlen) grids timed against
SDPA too, which has no varlen; here a point is a list of lengths with its own offsets and FLOPs.

usage: python3 varlen_vs_fa3.py [--head-dims 64,128] [--seqlens 512,1024,2048,4096,8192] [--lengths equal,mixed]
                                [--schedules auto,shortest-first,descending] [--impls dash,fa3] [--repeats 5]
                                [--csv OUT.csv] [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import csv
import inspect
import sys

import torch
from _common import environment, markdown_table
from compare import FA3_DETERMINISTIC_MAX_HEAD_DIM, PAPER_HIDDEN, geomean, ratio
from varlen_vs_fixed import TOKENS, forward_flops, measure, mixed_lengths

DEFAULT_SCHEDULES = "auto,shortest-first,descending"
FA3_ARGUMENTS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def fa3_varlen(impls: list[str]):
    """FA3's flash_attn_varlen_func when it imports and takes what this script passes, else None (saying why)."""
    if "fa3" not in impls:
        return None
    try:
        from flash_attn_interface import flash_attn_varlen_func
    except Exception as e:  # not only ImportError: a build for another GPU or torch fails as it loads its kernels
        print(f"fa3 not measured: flash_attn_interface does not import ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    try:
        parameters = inspect.signature(flash_attn_varlen_func).parameters
    except (TypeError, ValueError):  # no readable signature: its calls will say whether they fit
        return flash_attn_varlen_func
    names = list(parameters)
    open_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    # The seven packed-batch arguments go by position, so their order must be FA3's; causal and deterministic go by
    # keyword. A version without `deterministic` would silently time its default backward under both labels.
    if tuple(names[: len(FA3_ARGUMENTS)]) != FA3_ARGUMENTS:
        print(
            f"fa3 not measured: flash_attn_varlen_func's arguments begin {names[: len(FA3_ARGUMENTS)]}, "
            f"not {list(FA3_ARGUMENTS)}",
            file=sys.stderr,
        )
        return None
    missing = [name for name in ("causal", "deterministic") if name not in parameters and not open_keywords]
    if missing:
        print(f"fa3 not measured: flash_attn_varlen_func takes no {', '.join(missing)}", file=sys.stderr)
        return None
    return flash_attn_varlen_func


def implementations(impls: list[str], schedules: list[str]) -> dict:
    """name -> call(q, k, v, cu, longest, causal) for every implementation that imports here."""
    calls = {}
    if "dash" in impls:
        import dash_attn

        def dash(schedule: str, deterministic: bool):
            # One tensor for both offsets (self-attention; FA3 is given the same): it promises seqlen_k <= seqlen_q,
            # which lets "auto" consider the shift schedules.
            return lambda q, k, v, cu, longest, causal: dash_attn.flash_attn_varlen_func(
                q, k, v, cu, cu, longest, longest, causal=causal, deterministic=deterministic, schedule=schedule
            )

        for s in schedules:
            calls[f"dash:{s}"] = dash(s, True)
        calls["dash:nondet"] = dash("auto", False)
    fa3 = fa3_varlen(impls)
    if fa3 is not None:

        def fa3_call(deterministic: bool):
            def call(q, k, v, cu, longest, causal):
                if deterministic and q.shape[-1] > FA3_DETERMINISTIC_MAX_HEAD_DIM:
                    raise NotImplementedError(
                        f"FA3's deterministic backward stops at head dim {FA3_DETERMINISTIC_MAX_HEAD_DIM} (compare.py)"
                    )
                out = fa3(q, k, v, cu, cu, longest, longest, causal=causal, deterministic=deterministic)
                # Some FA3 versions return (out, lse): the backward is taken of out alone either way.
                return out[0] if isinstance(out, tuple) else out

            return call

        calls["fa3:det"] = fa3_call(True)
        calls["fa3:nondet"] = fa3_call(False)
    return calls


def point_name(head_dim: int, causal: bool, seqlen: int, lengths: str) -> str:
    return f"hd{head_dim} {'causal' if causal else 'full'} {seqlen} {lengths}"


def markdown(rows: list[dict], points: list[tuple[str, str]], schedules: list[str]) -> str:
    """Backward and forward tables over `points` ((name, "equal" or "mixed")), with geometric means."""
    by = {(r["point"], r["impl"]): r for r in rows}
    fmt = lambda x: f"{x:.0f}" if x else "-"  # noqa: E731
    fmtr = lambda x: f"{x:.2f}" if x else "-"  # noqa: E731
    backward_rows, forward_rows = [], []
    det, nondet, fwd = ({"all": [], "equal": [], "mixed": []} for _ in range(3))
    for name, lengths in points:
        get = lambda impl, key="bwd_tflops", name=name: by.get((name, impl), {}).get(key)  # noqa: E731
        best = max(((get(f"dash:{s}"), s) for s in schedules if get(f"dash:{s}")), default=(None, ""))
        r_det, r_nondet = ratio(best[0], get("fa3:det")), ratio(get("dash:nondet"), get("fa3:nondet"))
        # One forward column per library: FA3's forward takes no determinism flag, and DASH's is shown as "auto" runs
        # it (its non-deterministic call's when "auto" is not among --schedules).
        fa3_forward = get("fa3:det", "fwd_tflops") or get("fa3:nondet", "fwd_tflops")
        dash_forward = get("dash:auto", "fwd_tflops") or get("dash:nondet", "fwd_tflops")
        r_fwd = ratio(dash_forward, fa3_forward)
        for means, r in ((det, r_det), (nondet, r_nondet), (fwd, r_fwd)):
            means["all"].append(r)
            means[lengths].append(r)
        backward_rows.append(
            [
                name,
                fmt(get("fa3:nondet")),
                fmt(get("fa3:det")),
                fmt(get("dash:nondet")),
                fmt(get("dash:auto")),
                f"{fmt(best[0])} ({best[1]})",
                fmtr(r_det),
                fmtr(r_nondet),
            ]
        )
        forward_rows.append([name, fmt(fa3_forward), fmt(dash_forward), fmtr(r_fwd)])
    means = "\n".join(
        f"Geometric means over {which} points: DASH best det / FA3 det {fmtr(geomean(det[which]))}; "
        f"DASH non-det / FA3 non-det {fmtr(geomean(nondet[which]))}; DASH forward / FA3 {fmtr(geomean(fwd[which]))}."
        for which in ("all", "equal", "mixed")
    )
    return "\n".join(
        [
            "Backward TFLOPS",
            "",
            markdown_table(
                [
                    "point",
                    "FA3 non-det",
                    "FA3 det",
                    "DASH non-det",
                    "DASH auto",
                    "DASH best det (schedule)",
                    "best det / FA3 det",
                    "DASH non-det / FA3 non-det",
                ],
                backward_rows,
            ),
            "",
            "Forward TFLOPS",
            "",
            markdown_table(["point", "FA3", "DASH", "DASH / FA3"], forward_rows),
            "",
            means,
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument(
        "--seqlens",
        default="512,1024,2048,4096,8192",
        help="S: the equal batch's length, the middle of the mixed batch's range",
    )
    parser.add_argument("--lengths", default="equal,mixed", help="comma-separated: equal, mixed")
    parser.add_argument(
        "--schedules",
        default=DEFAULT_SCHEDULES,
        help="dash_attn's deterministic schedules to time (the best of them is DASH's best det)",
    )
    parser.add_argument("--impls", default="dash,fa3", help="comma-separated: dash, fa3")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--csv", help="write every row here")
    parser.add_argument("--markdown", help="write the tables here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("varlen_vs_fa3.py needs a CUDA GPU", file=sys.stderr)
        return 2
    schedules = args.schedules.split(",")
    kinds = args.lengths.split(",")
    if set(kinds) - {"equal", "mixed"}:
        parser.error(f"--lengths takes equal and mixed, not {args.lengths}")
    calls = implementations(args.impls.split(","), schedules)
    if not calls:
        print("nothing to measure: no implementation of --impls imports here", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows, points = [], []
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        heads = PAPER_HIDDEN // head_dim
        for causal in (False, True):
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                q, k, v = (
                    torch.randn(TOKENS, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3)
                )
                inputs = (q, k, v, torch.randn(TOKENS, heads, head_dim, device="cuda", dtype=torch.bfloat16))
                for kind in kinds:
                    lengths = [seqlen] * (TOKENS // seqlen) if kind == "equal" else mixed_lengths(seqlen)
                    offsets = [0]
                    for s in lengths:
                        offsets.append(offsets[-1] + s)
                    cu = torch.tensor(offsets, device="cuda", dtype=torch.int32)
                    longest = max(lengths)
                    flops = forward_flops(lengths, heads, head_dim, causal)
                    name = point_name(head_dim, causal, seqlen, kind)
                    points.append((name, kind))
                    for impl, call in calls.items():
                        row = dict(
                            point=name,
                            head_dim=head_dim,
                            heads=heads,
                            causal=causal,
                            seqlen=seqlen,
                            lengths=kind,
                            sequences=len(lengths),
                            max_seqlen=longest,
                            impl=impl,
                            fwd_tflops=None,
                            bwd_tflops=None,
                            error="",
                        )

                        def forward(q, k, v, call=call, cu=cu, longest=longest, causal=causal):
                            return call(q, k, v, cu, longest, causal)

                        try:
                            row["fwd_tflops"], row["bwd_tflops"] = measure(
                                forward, inputs, flops, args.repeats, args.warmup
                            )
                        except Exception as e:  # a refused call keeps its row, with the reason
                            row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                        rows.append(row)
                        shown = row["error"] or f"fwd {row['fwd_tflops']:.0f}  bwd {row['bwd_tflops']:.0f}"
                        print(f"{impl:22s} {name:28s} {shown}", flush=True)
                del q, k, v, inputs
                torch.cuda.empty_cache()
    text = f"Varlen against FA3's varlen, {TOKENS} tokens, {environment()}\n\n{markdown(rows, points, schedules)}\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
