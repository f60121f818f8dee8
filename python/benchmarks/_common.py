"""Timing and reporting shared by the benchmark scripts in this directory (run as scripts, so this module is
importable as `_common`). Times are medians of CUDA-event intervals, one per call, after warm-up calls that
absorb one-time costs (cuDNN plan building, DASH's schedule proof, allocator growth)."""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable, Sequence

import torch


def median_ms(step: Callable[[], object], warmup: int, iters: int) -> float:
    """Median milliseconds of `iters` calls of `step`, each bracketed by CUDA events on the current stream."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, stop in zip(starts, stops):
        start.record()
        step()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in zip(starts, stops))


def milliseconds_per_call(fn: Callable[[], object], calls_per_loop: int, repeats: int) -> float:
    """Median over `repeats` of one loop of `calls_per_loop` back-to-back calls between two CUDA events, divided by
    the calls: per-call GPU time with launches queued ahead, which single-call timing would overstate.

    One untimed call is queued before the start event, so that the GPU is busy when the window opens and the host
    path of the first timed call runs under it: otherwise the window starts with the GPU idle for one call's host
    time, which a loop of 3 long calls spreads as tens of microseconds onto each, more for a slower host path."""
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        start.record()
        for _ in range(calls_per_loop):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls_per_loop)
    return statistics.median(times)


def environment() -> dict[str, str]:
    """What a reader needs to compare numbers across runs: software versions, GPU and date."""
    return {
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
