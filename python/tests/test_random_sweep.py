"""The randomized sweep (random_sweep.py) as GPU tests: a fixed-seed subset of its shapes, every seqlen
remainder mod 128 (issue 15: the forward hung when a length ended inside a warp's rows), and the negative
control that shows its bit-for-bit comparison can fail.

Every check is random_sweep's: outputs start as NaN, each kernel call is waited for under a watchdog that
ends the process with exit status 3 and a HANG line on stderr (a hung GPU cannot be recovered from inside
pytest), values are compared with a float32 reference and repeats bit for bit. Without PyTorch, the
library or a Hopper GPU every test skips and says why (conftest.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import random_sweep  # noqa: E402
from random_sweep import SweepShape  # noqa: E402

WATCHDOG_SECONDS = 60.0

# A fixed run of the sweep: the first FIXED_SHAPES shapes of FIXED_SEED, a float64 check every 8th.
FIXED_SEED = 20261201
FIXED_SHAPES = 24
FIXED_FP64_EVERY = 8

# Every remainder mod TILE (the tile length) of lengths REMAINDER_BASE + r, at batch 3 with 16 query heads
# over 4 key/value heads: 8 or 9 query tiles x 16 heads x 3 = up to 432 forward tiles, about 3 per
# persistent CTA on a 132-SM H200, as in the C++ Sm90RaggedSweep. The forward (cheap) runs for every
# remainder, the backward of every schedule for every BACKWARD_EVERY-th. Each remainder runs in one dtype,
# taken in turn from those this build has (bf16 for even remainders and fp16 for odd ones in a full build),
# so both dtypes meet both head dims, both masks and every residue mod 64 and mod 8, at half the cost.
TILE = 128
REMAINDER_BASE = 1024
REMAINDER_BATCH, REMAINDER_HEADS_Q, REMAINDER_HEADS_KV = 3, 16, 4
BACKWARD_EVERY = 7
# Which lengths take the remainder: seqlen_q, seqlen_k, or both (self-attention, issue 15's case).
VARIED_LENGTHS = ("seqlen_q", "seqlen_k", "both")

# Negative control: under the full mask every key/value tile of a head reaches the same query tile at once,
# so the nondeterministic schedule's unordered atomic dQ sum races (tests/kernels/test_sm90.cpp,
# Sm90DeterminismControl). The loop stops at the first difference; the C++ control's run count bounds it.
CONTROL_SHAPE = SweepShape(
    batch=2, seqlen_q=1024, seqlen_k=1024, heads_q=4, heads_kv=4, head_dim=128, dtype="bf16", causal=False
)
CONTROL_MAX_REPEATS = 100


def failure_report(label: str, checks: list[random_sweep.Check]) -> str:
    return f"{label}:\n" + "\n".join(f"  {c.name}: {c.detail}" for c in checks)


def fixed_shape_id(index: int) -> str:
    return f"{index}-{random_sweep.draw_shape(FIXED_SEED, index)[0]}"


@pytest.mark.parametrize("index", range(FIXED_SHAPES), ids=fixed_shape_id)
def test_fixed_seed_sweep_shape(device, require_kernel, index) -> None:
    shape, input_seed = random_sweep.draw_shape(FIXED_SEED, index)
    require_kernel(shape.head_dim, random_sweep.DTYPES[shape.dtype])
    label = f"seed {FIXED_SEED} shape index {index} {shape}"
    result = random_sweep.run_shape(
        shape, input_seed, label, fp64=index % FIXED_FP64_EVERY == 0, watchdog_seconds=WATCHDOG_SECONDS
    )
    assert not result.failures, failure_report(label, result.failures)


def remainder_shape(remainder: int, varied: str, head_dim: int, dtypes: list[str], causal: bool) -> SweepShape:
    ragged = REMAINDER_BASE + remainder
    return SweepShape(
        batch=REMAINDER_BATCH,
        seqlen_q=REMAINDER_BASE if varied == "seqlen_k" else ragged,
        seqlen_k=REMAINDER_BASE if varied == "seqlen_q" else ragged,
        heads_q=REMAINDER_HEADS_Q,
        heads_kv=REMAINDER_HEADS_KV,
        head_dim=head_dim,
        dtype=dtypes[remainder % len(dtypes)],
        causal=causal,
    )


@pytest.mark.parametrize("varied", VARIED_LENGTHS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", random_sweep.HEAD_DIMS, ids=lambda d: f"hdim{d}")
def test_every_seqlen_remainder_mod_128(device, library, head_dim, causal, varied) -> None:
    dtypes = [name for name, code in random_sweep.DTYPE_CODES.items() if library.kernel_available(head_dim, code)]
    if not dtypes:
        pytest.skip(f"this build has no kernel for head_dim {head_dim} (see DASH_HEAD_DIMS)")
    failed = []
    for remainder in range(TILE):
        shape = remainder_shape(remainder, varied, head_dim, dtypes, causal)
        label = f"remainder {remainder} of {TILE} {shape}"
        result = random_sweep.run_shape(
            shape,
            input_seed=remainder,
            label=label,
            with_backward=remainder % BACKWARD_EVERY == 0,
            watchdog_seconds=WATCHDOG_SECONDS,
        )
        if result.failures:
            failed.append(failure_report(label, result.failures))
    assert not failed, f"{len(failed)} of {TILE} remainders failed\n" + "\n".join(failed)


def test_negative_control_bitwise_comparison_catches_the_nondeterministic_schedule(device, require_kernel) -> None:
    """The sweep's bit-for-bit comparison must be able to fail, or its passes would mean nothing."""
    shape = CONTROL_SHAPE
    require_kernel(shape.head_dim, random_sweep.DTYPES[shape.dtype])
    inputs = random_sweep.make_inputs(shape, seed=5, device=device)
    watchdog = random_sweep.Watchdog(f"negative control {shape}", WATCHDOG_SECONDS)
    forward = random_sweep.launch_forward(inputs, watchdog, "forward")
    schedule = random_sweep.NONDETERMINISTIC
    first = random_sweep.launch_backward(inputs, forward, schedule, watchdog, "backward run 1")
    for repeat in range(2, CONTROL_MAX_REPEATS + 2):
        again = random_sweep.launch_backward(inputs, forward, schedule, watchdog, f"backward run {repeat}")
        checks = random_sweep.bitwise_checks(f"{schedule} run 1 vs run {repeat}", first, again)
        if any(not c.passed for c in checks):
            return
    pytest.fail(
        f"the nondeterministic schedule gave bitwise identical dq, dk, dv in {CONTROL_MAX_REPEATS} repeats: "
        f"the sweep's bit-for-bit comparison could not detect nondeterminism"
    )
