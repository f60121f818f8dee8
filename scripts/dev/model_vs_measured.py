#!/usr/bin/env python3
"""How well the DAG model orders the schedules that the GPU measured: for every shape of one or more
`python/benchmarks/compare.py` CSVs, every pair of deterministic schedules (and the nondeterministic one)
whose measured backward times differ by more than --tie (a relative difference; closer pairs are within
run-to-run noise), checks whether `dash-attn plan` with the given cost model orders them the same way.
Prints the share of pairs ordered right and lists the wrong ones. No GPU needed.

usage: scripts/dev/model_vs_measured.py --dash-attn build/dash-attn --csv A.csv [--csv B.csv]
                                    [--jitter 0.2] [--job-overhead 0] [--reduce-cost 0.25] [--tie 0.03]
Several CSVs are averaged per (shape, schedule). `auto` is left out: it is one of the others.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import re
import subprocess
from collections import defaultdict

SHAPE = re.compile(r"hd(\d+) (full|causal) (\d+)(?: \((\d+)/(\d+) heads\))?$")
TOKENS = 16384  # compare.py: tokens per grid point
PAPER_HIDDEN = 2048  # compare.py: heads = hidden / head_dim on the paper grid


def measured_times(paths: list[str]) -> dict[str, dict[str, float]]:
    """shape -> schedule -> mean of 1 / TFLOPS over the CSVs (proportional to time at fixed FLOPs)."""
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                impl, tflops = row["impl"], row["bwd_tflops"]
                if not impl.startswith("dash:") or impl == "dash:auto" or not tflops:
                    continue
                schedule = "nondeterministic" if impl == "dash:nondet" else impl[len("dash:") :]
                samples[row["shape"]][schedule].append(1.0 / float(tflops))
    return {shape: {s: sum(v) / len(v) for s, v in by.items()} for shape, by in samples.items()}


def modelled_makespans(dash_attn: str, shape: str, costs: list[str]) -> dict[str, float]:
    match = SHAPE.match(shape)
    if not match:
        raise SystemExit(f"model_vs_measured: cannot read shape '{shape}'")
    head_dim, mask, seqlen, heads_q, heads_kv = match.groups()
    heads_q = int(heads_q) if heads_q else PAPER_HIDDEN // int(head_dim)
    heads_kv = int(heads_kv) if heads_kv else heads_q
    args = [
        dash_attn,
        "plan",
        "--json",
        "--batch",
        str(TOKENS // int(seqlen)),
        "--heads",
        str(heads_q),
        "--heads-kv",
        str(heads_kv),
        "--seqlen",
        seqlen,
        "--head-dim",
        head_dim,
        *costs,
    ]
    if mask == "causal":
        args.append("--causal")
    report = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return {s["name"]: s["makespan"] for s in report["schedules"] if s["valid"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dash-attn", required=True, help="the dash-attn binary")
    parser.add_argument("--csv", action="append", required=True, help="a compare.py CSV (repeatable)")
    parser.add_argument("--jitter", default="0")
    parser.add_argument("--job-overhead", default="0")
    parser.add_argument("--reduce-cost", default="0.25")
    parser.add_argument("--tie", type=float, default=0.03, help="measured pairs closer than this are ties")
    a = parser.parse_args()
    costs = ["--jitter", a.jitter, "--job-overhead", a.job_overhead, "--reduce-cost", a.reduce_cost]
    right, wrong = 0, []
    for shape, times in sorted(measured_times(a.csv).items()):
        model = modelled_makespans(a.dash_attn, shape, costs)
        schedules = [s for s in times if s in model]
        for x, y in itertools.combinations(schedules, 2):
            if abs(math.log(times[x] / times[y])) < a.tie:
                continue
            if (model[x] < model[y]) == (times[x] < times[y]):
                right += 1
            else:
                wrong.append(f"{shape}: {x} / {y}: model {model[x] / model[y]:.3f}, measured {times[x] / times[y]:.3f}")
    total = right + len(wrong)
    print(
        f"jitter {a.jitter}, job overhead {a.job_overhead}, reduce {a.reduce_cost}: "
        f"{right} of {total} measured orders right ({right / max(total, 1):.0%})"
    )
    for line in wrong:
        print("  wrong:", line)


if __name__ == "__main__":
    main()
