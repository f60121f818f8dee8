#!/usr/bin/env python3
"""Where one step of a backward kernel's MMA warps spends its time, from an Nsight Compute source page.

Reads the SASS source page that scripts/dev/ncu_attention.sh exports (`<impl>_source.csv`) and prints, in address
order, the instructions of the step loop: those executed once per MMA warp and step. Synchronisation points
(waits on mbarriers, named barriers, wgmma waits, fences, arrives) and every instruction holding at least
--min-share of the stall samples are printed on their own line, with their two largest stall reasons; the runs
of other instructions between them are folded into one line with their count and summed share; a last line sums the
step loop's samples by reason. "unnamed" is what the page's per-reason columns leave of an instruction's samples: in
DASH's and FA3's backward on an H100 most of it sits on the first wgmma of each GEMM. Stall samples
are proportional to warp time, so a phase's share, divided by the MMA warps' share of all samples, is the
fraction of a step it takes (both kernels' shares are printed in the first line to make that division).

The step loop is told apart by execution count: `Instructions Executed` of a step-loop instruction is
(MMA warps) x (steps), and the masked and unmasked paths of a step give two such counts. Pass them with
--counts (the most frequent counts are printed first to choose from), e.g. 1064960,1032192 for DASH at hd64
causal 8192 (133,120 CTA steps x 8 MMA warps, of which 4,096 x 8 take the masked path).

usage: scripts/dev/ncu_step_phases.py SOURCE_CSV [--counts N,N,...] [--min-share 0.6]
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
SYNC_OPCODES = ("DEPBAR", "FENCE", "BAR", "SYNCS", "WARPSYNC", "ARRIVE")


def read_source_page(path: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(open(path, newline="")))
    header_at = next((i for i, r in enumerate(rows) if SAMPLES in r), None)
    if header_at is None:
        sys.exit(f"{path}: no '{SAMPLES}' column (was the kernel profiled with the SourceCounters section?)")
    return rows[header_at], [r for r in rows[header_at + 1 :] if len(r) > 5]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_csv")
    parser.add_argument("--counts", default="", help="execution counts of the step loop's instructions")
    parser.add_argument("--min-share", type=float, default=0.6, help="percent of samples that earns its own line")
    args = parser.parse_args()

    header, body = read_source_page(args.source_csv)
    column = {name: i for i, name in enumerate(header)}

    def value(row: list[str], name: str) -> float:
        try:
            return float(row[column[name]].replace(",", ""))
        except (KeyError, ValueError, IndexError):
            return 0.0

    total = sum(value(r, SAMPLES) for r in body) or 1.0
    share_by_count: dict[int, float] = collections.defaultdict(float)
    for r in body:
        share_by_count[int(value(r, EXECUTED))] += 100 * value(r, SAMPLES) / total
    ranked = sorted(share_by_count.items(), key=lambda kv: -kv[1])[:8]
    print("share of stall samples by execution count: " + ", ".join(f"{n}: {s:.1f}%" for n, s in ranked))
    if not args.counts:
        print("pass the step loop's counts with --counts to see its phases")
        return
    counts = {int(c) for c in args.counts.split(",")}
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    folded_share, folded_count, folded_from = 0.0, 0, None
    loop_by_reason: dict[str, float] = collections.defaultdict(float)

    def by_reason(row: list[str]) -> list[tuple[float, str]]:
        named = [(value(row, name), name[len("stall_") :]) for name in reasons]
        unnamed = value(row, SAMPLES) - sum(v for v, _ in named)
        return named + [(unnamed if unnamed > 0 else 0.0, "unnamed")]

    def flush(until: int) -> None:
        nonlocal folded_share, folded_count, folded_from
        if folded_count:
            print(f"   [{folded_from}-{until}] {folded_count} other instructions  {folded_share:.2f}%")
        folded_share, folded_count, folded_from = 0.0, 0, None

    for index, r in enumerate(body):
        if int(value(r, EXECUTED)) not in counts:
            continue
        source = r[column["Source"]].strip()
        opcode = re.sub(r"^@!?U?P\w+\s+", "", source).split(" ")[0]
        share = 100 * value(r, SAMPLES) / total
        for v, name in by_reason(r):
            loop_by_reason[name] += v
        if share >= args.min_share or any(s in opcode for s in SYNC_OPCODES):
            flush(index - 1)
            top = sorted(by_reason(r), reverse=True)[:2]
            why = " ".join(f"{name}:{100 * v / total:.1f}" for v, name in top if v)
            print(f"{index:5d} {share:5.2f}%  {source[:64]:64s} {why}")
        else:
            folded_from = index if folded_from is None else folded_from
            folded_share += share
            folded_count += 1
    flush(len(body) - 1)
    loop_total = sum(loop_by_reason.values())
    ranked_reasons = sorted(((v, name) for name, v in loop_by_reason.items() if v), reverse=True)
    print(
        f"step loop: {loop_total:.0f} samples ({100 * loop_total / total:.1f}%); by reason: "
        + ", ".join(f"{name} {100 * v / total:.1f}%" for v, name in ranked_reasons)
    )


if __name__ == "__main__":
    main()
