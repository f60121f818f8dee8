"""Same-run A/B of builds of libdash_attn_c.so: the way a kernel change is judged on a shared GPU, whose
absolute numbers drift by 5-8% between calls while ratios within one call agree within about 1-2%.

Runs compare.py (dash only, the schedules given) once per library per round, alternating A, B, C, ... in one
process tree on one GPU, each in its own interpreter (a process loads one library), then prints, for each
library after A, per shape the ratio to A of forward TFLOPS and of backward TFLOPS per schedule, averaged over
the rounds, their geometric means over the shapes, and A's round-to-round ratio (the noise floor of the
comparison). Several changes share one call this way, each judged against the same baseline. Needs a Hopper GPU.

usage: python3 ab_libraries.py A.so B.so [C.so ...] [--rounds 2] [--schedules auto] [--forward-only] [--out DIR]
                               [--compare-args "--grid paper --head-dims 128 --softcap 50"]
       e.g. A = the commit before the change, B = after; all built on the CPU machine and carried.
       LIB.so@DIR runs that library's interpreter with DIR first on PYTHONPATH: the dash_attn package of the
       library's own commit, where a change moved the C ABI version and the checkout's package refuses it.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

COMPARE = Path(__file__).resolve().parent / "compare.py"


def split_library(argument: str) -> tuple[Path, str | None]:
    """LIB.so or LIB.so@DIR: the library and the Python package directory that loads it (None: the checkout's)."""
    library, _, package = argument.partition("@")
    return Path(library), package or None


def run_compare(argument: str, schedules: str, out_csv: Path, forward_only: bool, extra: list[str]) -> None:
    library, package = split_library(argument)
    env = {**os.environ, "DASH_ATTN_LIBRARY": str(library.resolve())}
    if package:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(package).resolve()), env.get("PYTHONPATH")]))
    command = [sys.executable, str(COMPARE), "--impls", "dash", "--schedules", schedules, "--csv", str(out_csv)]
    command += ["--forward-only"] if forward_only else []
    command += extra
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
    parser.add_argument("a", help="library A (the baseline), LIB.so or LIB.so@PYTHON_PACKAGE_DIR")
    parser.add_argument("changes", nargs="+", help="libraries B, C, ... (the changes), as A")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--schedules", default="auto", help="dash_attn schedules, as compare.py takes them")
    parser.add_argument("--forward-only", action="store_true", help="time the forward alone (compare.py's flag)")
    parser.add_argument("--out", type=Path, default=Path("ab_out"), help="where the per-run CSVs go")
    parser.add_argument(
        "--compare-args", default="", help='more compare.py arguments, one string, e.g. "--head-dims 128 --softcap 50"'
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    libraries = {"a": args.a} | {chr(ord("b") + i): library for i, library in enumerate(args.changes)}
    runs: dict[str, list[dict]] = {name: [] for name in libraries}
    for round_index in range(1, args.rounds + 1):
        for name, library in libraries.items():
            out_csv = args.out / f"{name}_{round_index}.csv"
            run_compare(library, args.schedules, out_csv, args.forward_only, shlex.split(args.compare_args))
            runs[name].append(load(out_csv))
    for name in list(libraries)[1:]:
        print(f"\n{name.upper()} = {libraries[name]} against A = {args.a}\n")
        print_ratios(runs["a"], runs[name], name.upper())
    if args.rounds > 1:
        first, last = runs["a"][0], runs["a"][-1]
        for pass_name, field in (("forward", "fwd_tflops"), ("backward", "bwd_tflops")):
            noise = [
                float(last[k][field]) / float(first[k][field])
                for k in first
                if k in last and first[k][field] and last[k][field]
            ]
            print(f"A's last round / first round, {pass_name}, geometric mean: {geomean(noise):.4f} (the noise floor)")


def print_ratios(baseline: list[dict], change: list[dict], label: str) -> None:
    keys = list(baseline[0])
    shapes = list(dict.fromkeys(shape for shape, _ in keys))
    impls = list(dict.fromkeys(impl for _, impl in keys))
    columns = [("fwd", "dash:auto", "fwd_tflops")] + [
        (f"bwd {impl.split(':', 1)[1]}", impl, "bwd_tflops") for impl in impls
    ]
    print("| shape | " + " | ".join(f"{title} {label}/A" for title, _, _ in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    ratios: dict[str, list[float]] = {title: [] for title, _, _ in columns}
    for shape in shapes:
        cells = []
        for title, impl, field in columns:
            a = mean_over_rounds(baseline, (shape, impl), field)
            b = mean_over_rounds(change, (shape, impl), field)
            if a and b:
                ratios[title].append(b / a)
                cells.append(f"{b / a:.3f}")
            else:
                cells.append("-")
        print(f"| {shape} | " + " | ".join(cells) + " |")
    print("| geometric mean | " + " | ".join(f"{geomean(ratios[t]):.4f}" for t, _, _ in columns) + " |")


if __name__ == "__main__":
    main()
