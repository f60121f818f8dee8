"""Same-run A/B of two builds of libdash_attn_c.so: the way a kernel change is judged on a shared GPU, whose
absolute numbers drift by 5-8% between calls while ratios within one call agree within about 1-2%.

Runs compare.py (dash only, the schedules given) once per library per round, alternating A, B, A, B, ... in one
process tree on one GPU, each in its own interpreter (a process loads one library), then prints per shape the
ratio B / A of forward TFLOPS and of backward TFLOPS per schedule, averaged over the rounds, their geometric
means over the shapes, and A's round-to-round ratio (the noise floor of the comparison). Needs a Hopper GPU.

usage: python3 ab_libraries.py A.so B.so [--rounds 2] [--schedules auto] [--out DIR]
       e.g. A = the commit before the change, B = after; both built on the CPU machine and carried.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
from pathlib import Path

COMPARE = Path(__file__).resolve().parent / "compare.py"


def run_compare(library: Path, schedules: str, out_csv: Path) -> None:
    env = {**os.environ, "DASH_ATTN_LIBRARY": str(library)}
    command = [sys.executable, str(COMPARE), "--impls", "dash", "--schedules", schedules, "--csv", str(out_csv)]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)


def load(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with path.open(newline="") as f:
        return {(row["shape"], row["impl"]): row for row in csv.DictReader(f)}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def mean_over_rounds(runs: list[dict], key: tuple[str, str], field: str) -> float | None:
    values = [float(run[key][field]) for run in runs if key in run and run[key][field]]
    return sum(values) / len(values) if len(values) == len(runs) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="library A (the baseline)")
    parser.add_argument("b", type=Path, help="library B (the change)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--schedules", default="auto", help="dash_attn schedules, as compare.py takes them")
    parser.add_argument("--out", type=Path, default=Path("ab_out"), help="where the per-run CSVs go")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for round_index in range(1, args.rounds + 1):
        for name, library in (("a", args.a), ("b", args.b)):
            out_csv = args.out / f"{name}_{round_index}.csv"
            run_compare(library.resolve(), args.schedules, out_csv)
            runs[name].append(load(out_csv))
    keys = list(runs["a"][0])
    shapes = list(dict.fromkeys(shape for shape, _ in keys))
    impls = list(dict.fromkeys(impl for _, impl in keys))
    columns = [("fwd", "dash:auto", "fwd_tflops")] + [(f"bwd {impl.split(':', 1)[1]}", impl, "bwd_tflops")
                                                      for impl in impls]
    print("| shape | " + " | ".join(f"{title} B/A" for title, _, _ in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    ratios: dict[str, list[float]] = {title: [] for title, _, _ in columns}
    for shape in shapes:
        cells = []
        for title, impl, field in columns:
            a = mean_over_rounds(runs["a"], (shape, impl), field)
            b = mean_over_rounds(runs["b"], (shape, impl), field)
            if a and b:
                ratios[title].append(b / a)
                cells.append(f"{b / a:.3f}")
            else:
                cells.append("-")
        print(f"| {shape} | " + " | ".join(cells) + " |")
    print("| geometric mean | " + " | ".join(f"{geomean(ratios[t]):.4f}" for t, _, _ in columns) + " |")
    if args.rounds > 1:
        first, last = runs["a"][0], runs["a"][-1]
        noise = [float(last[k]["bwd_tflops"]) / float(first[k]["bwd_tflops"])
                 for k in keys if k in last and first[k]["bwd_tflops"] and last[k]["bwd_tflops"]]
        print(f"\nA's last round / first round, backward, geometric mean: {geomean(noise):.4f} (the noise floor)")


if __name__ == "__main__":
    main()
