"""Randomized GPU sweep of dash_attn: random shapes, every schedule, bitwise repeat checks, a hang watchdog.

    python3 python/tests/random_sweep.py --seed S --shapes N [--fp64-every K] [--watchdog-seconds T]
                                         [--csv OUT] [--only INDEX ...]

Hand-picked test shapes let a whole class of bugs hide: issue 15's forward hung only on ragged shapes such as
batch 3, heads 7, seqlen 1950 (a full-mask warp shuffle that only some lanes reached). This script draws
shapes at random, biased towards ragged lengths, and for each one runs the forward twice, the backward of
every schedule (twice for the deterministic ones), and compares every result with a float32 reference and,
bit for bit, with its repeat. test_random_sweep.py runs a fixed-seed subset and every seqlen remainder mod
128 through the same functions; scripts/dev/gpu_run.sh's `sweep` step runs 300 shapes with a new seed each time.
Needs PyTorch, a Hopper GPU and libdash_attn_c.so (python/README.md); PYTHONPATH=python for a CMake build.

Invariants:
- Shape INDEX of run SEED and its inputs depend on (SEED, INDEX) alone (draw_shape), so
  `--seed SEED --only INDEX` replays exactly the shape and tensors that failed, whatever --shapes was.
- Every kernel call writes into outputs filled with NaN first. The public ops allocate their own outputs
  (torch.empty, which may hand back a block holding another schedule's correct result), so the calls go
  through the package's C-ABI binding (dash_attn._library) with preallocated outputs; an element a kernel
  never writes stays NaN and fails the finiteness check. The public path (flash_attn_func and autograd)
  runs once per shape and must match the binding's forward and "auto" backward bit for bit.
- Every kernel call is followed by a device synchronize in this thread while a watchdog thread waits; a call
  that has not finished after --watchdog-seconds prints "HANG: seed S shape index I SHAPE (CALL)" to stderr
  and ends the process with exit status 3 (a hung kernel cannot be recovered from inside the process).
- A schedule whose preconditions fail for the shape is skipped, matched narrowly: LibraryError with status
  "schedule-rejected" and the planner's message "schedule 'NAME' cannot run this shape: ..."
  (src/api/attention.cpp). "auto" is never skipped, and a plan that fails the deadlock proof ("the NAME plan
  failed validation ...", same status) is a failure.
- The per-shape work batch * heads_q * seqlen_q * seqlen_k is capped at WORK_CAP (CAP_RULE), which bounds
  memory and time; the reference runs in row blocks of at most REFERENCE_BLOCK_ELEMENTS scores.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import math
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

import dash_attn
from dash_attn import _library, _ops, flash_attn_func

SEQLEN_MAX = 8192
BATCH_MAX = 8
HEADS_KV_MAX = 16
HEADS_Q_MAX = 48
HEAD_DIMS = (64, 128)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_CODES = {"bf16": _library.DTYPE_BF16, "fp16": _library.DTYPE_FP16}
# Self-attention (seqlen_q == seqlen_k) is the common training shape, and the one of issue 15, but two
# independent draws almost never agree: this share of shapes draws one length for both.
EQUAL_LENGTHS_PROBABILITY = 1 / 3

WORK_CAP = 2**28
CAP_RULE = (
    f"work = batch * heads_q * seqlen_q * seqlen_k is capped at 2^{WORK_CAP.bit_length() - 1}: a draw over it "
    f"keeps its lengths (their product is at most {SEQLEN_MAX}^2 = 2^26) and shrinks batch to the largest "
    f"value that fits, then heads_kv, then the GQA group"
)

# Tolerances against the float32 reference: those of the C++ kernel tests (src/harness/device_harness.cpp,
# tolerance_for and within) and of test_attention.py. bf16 keeps 8 significant bits (unit roundoff 2^-9,
# about 2e-3) and fp16 11 (2^-12, about 2.4e-4). The inputs are exact in both, but P, dS and the outputs are
# each rounded once to the 16-bit type, so a correct kernel lands a few roundoffs from the reference: a
# relative L2 error of a few units and a largest error a little larger, relative to the largest reference
# value. An indexing, masking or missed-tile bug misses by O(1). Checked on the CPU at seqlen_k 8192: a
# kernel emulated with those roundings lands at 0.16 (bf16) and 0.07 (fp16) of these bounds, and the float32
# reference is within 1e-6 relative L2 of the float64 one, so the same bounds serve against float64 (checked
# on every --fp64-every-th shape: it would catch a reference that silently lost precision, e.g. to TF32).


@dataclasses.dataclass(frozen=True)
class Tolerance:
    relative_l2: float
    max_error_fraction: float  # of max(|reference|, MAGNITUDE_FLOOR)


TOLERANCES = {"bf16": Tolerance(1.5e-2, 5e-2), "fp16": Tolerance(4e-3, 1.5e-2)}
# A gradient that is exactly zero in exact arithmetic (one visible key: dS = 0) comes out at rounding level,
# so neither bound drops below unit magnitude times this floor (inputs are N(0, 1)): the max error is taken
# against max(|reference|, floor) and the L2 error against max(||reference||, floor * sqrt(n)).
MAGNITUDE_FLOOR = 1e-2
# The LSE is fp32 arithmetic on exact 16-bit inputs on both sides; only the summation order differs. Each
# element must satisfy |lse - ref| <= LSE_TOLERANCE * (1 + |ref|) (test_attention.py's atol = rtol = 1e-3),
# and a row that sees no key must be exactly -inf.
LSE_TOLERANCE = 1e-3

DEFAULT_SHAPES = 300
DEFAULT_FP64_EVERY = 25
DEFAULT_WATCHDOG_SECONDS = 60.0
HANG_EXIT_CODE = 3
# Scores (query heads of one key/value head x query rows x keys) per reference block: 128 MiB in float32.
REFERENCE_BLOCK_ELEMENTS = 2**25

NONDETERMINISTIC = "nondeterministic"
# The schedule of the public path (flash_attn_func's default), whose binding run is repeated through
# flash_attn_func and autograd rather than through the binding, and checked against float64.
API_SCHEDULE = "auto"
# The raw bits of 2- and 4-byte elements, for bit-for-bit comparison (NaN payloads and -0.0 included).
BIT_VIEWS = {2: torch.int16, 4: torch.int32}


# --- shapes ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepShape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str  # a key of DTYPES
    causal: bool

    def __str__(self) -> str:
        mask = "causal" if self.causal else "full"
        return (
            f"B{self.batch}_Sq{self.seqlen_q}_Sk{self.seqlen_k}_Hq{self.heads_q}_Hkv{self.heads_kv}"
            f"_D{self.head_dim}_{self.dtype}_{mask}"
        )

    @property
    def work(self) -> int:
        return self.batch * self.heads_q * self.seqlen_q * self.seqlen_k


def draw_seqlen(rng: random.Random) -> int:
    """A length in [1, SEQLEN_MAX], biased towards what breaks tiled kernels: small lengths (less than one
    tile), lengths one to three off a multiple of 64, 128 or 192 (the tile sizes), ragged lengths that are no
    multiple of 8; aligned multiples of 128 stay in as the easy case."""
    kind = rng.choices(("small", "near-tile", "ragged", "aligned"), weights=(2, 3, 4, 1))[0]
    if kind == "small":
        return rng.randint(1, 192)
    if kind == "near-tile":
        tile = rng.choice((64, 128, 192))
        boundary = tile * rng.randint(1, SEQLEN_MAX // tile)
        return min(max(boundary + rng.choice((-3, -2, -1, 1, 2, 3)), 1), SEQLEN_MAX)
    if kind == "aligned":
        return 128 * rng.randint(1, SEQLEN_MAX // 128)
    while True:
        length = rng.randint(1, SEQLEN_MAX)
        if length % 8:
            return length


def fit_work_cap(batch: int, heads_kv: int, group: int, seqlen_q: int, seqlen_k: int) -> tuple[int, int, int]:
    """(batch, heads_kv, group) shrunk by CAP_RULE so that batch * heads_kv * group * seqlen_q * seqlen_k
    <= WORK_CAP; it always fits, since batch = heads_kv = group = 1 leaves at most SEQLEN_MAX^2 <= WORK_CAP."""
    positions = seqlen_q * seqlen_k
    batch = min(batch, max(1, WORK_CAP // (heads_kv * group * positions)))
    heads_kv = min(heads_kv, max(1, WORK_CAP // (batch * group * positions)))
    group = min(group, max(1, WORK_CAP // (batch * heads_kv * positions)))
    return batch, heads_kv, group


def draw_shape(seed: int, index: int) -> tuple[SweepShape, int]:
    """Shape `index` of the run with `seed` and the seed of its input tensors, from a generator of their own
    (seeded by both numbers), so a shape replays without drawing the ones before it."""
    rng = random.Random(f"dash_attn random sweep {seed} {index}")
    seqlen_q = draw_seqlen(rng)
    seqlen_k = seqlen_q if rng.random() < EQUAL_LENGTHS_PROBABILITY else draw_seqlen(rng)
    heads_kv = rng.randint(1, HEADS_KV_MAX)
    group = rng.randint(1, HEADS_Q_MAX // heads_kv)
    batch, heads_kv, group = fit_work_cap(rng.randint(1, BATCH_MAX), heads_kv, group, seqlen_q, seqlen_k)
    shape = SweepShape(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        heads_q=heads_kv * group,
        heads_kv=heads_kv,
        head_dim=rng.choice(HEAD_DIMS),
        dtype=rng.choice(tuple(DTYPES)),
        causal=rng.random() < 0.5,
    )
    return shape, rng.getrandbits(63)


# --- inputs, kernel calls, watchdog ----------------------------------------------------------------


@dataclasses.dataclass
class Inputs:
    """q, k, v, dout in (B, S, H, D): N(0, 1) draws rounded to the shape's dtype."""

    shape: SweepShape
    q: Tensor
    k: Tensor
    v: Tensor
    dout: Tensor

    @property
    def softmax_scale(self) -> float:
        return self.shape.head_dim**-0.5


class Forward(NamedTuple):
    out: Tensor
    lse: Tensor


class Gradients(NamedTuple):
    dq: Tensor
    dk: Tensor
    dv: Tensor


def make_inputs(shape: SweepShape, seed: int, device: torch.device) -> Inputs:
    generator = torch.Generator(device).manual_seed(seed)

    def draw(seqlen: int, heads: int) -> Tensor:
        values = torch.randn(shape.batch, seqlen, heads, shape.head_dim, generator=generator, device=device)
        return values.to(DTYPES[shape.dtype])

    return Inputs(
        shape,
        q=draw(shape.seqlen_q, shape.heads_q),
        k=draw(shape.seqlen_k, shape.heads_kv),
        v=draw(shape.seqlen_k, shape.heads_kv),
        dout=draw(shape.seqlen_q, shape.heads_q),
    )


class Watchdog:
    """Waits for the device after each call; ends the process when that takes longer than `seconds`."""

    def __init__(self, label: str, seconds: float) -> None:
        self.label = label  # names the shape in the HANG line, e.g. "seed 7 shape index 12 B3_Sq1950_..."
        self.seconds = seconds

    @contextlib.contextmanager
    def guard(self, call: str) -> Iterator[None]:
        """Runs the body (which launches `call`), then synchronizes the device, with the timer running."""
        timer = threading.Timer(self.seconds, self._hang, args=(call,))
        timer.daemon = True
        timer.start()
        try:
            yield
            torch.cuda.synchronize()  # releases the GIL, so the timer thread can fire while it waits
        finally:
            timer.cancel()

    def _hang(self, call: str) -> None:
        sys.stdout.flush()
        print(f"HANG: {self.label} ({call}) did not finish within {self.seconds:g} s", file=sys.stderr, flush=True)
        os._exit(HANG_EXIT_CODE)


def _poisoned_like(t: Tensor) -> Tensor:
    return torch.full_like(t, math.nan, memory_format=torch.contiguous_format)


def _c_shape(inputs: Inputs) -> _library.Shape:
    return _ops._c_shape(inputs.q, inputs.k, inputs.softmax_scale, inputs.shape.causal)


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def launch_forward(inputs: Inputs, watchdog: Watchdog, call: str) -> Forward:
    """One forward through the C-ABI binding into NaN-filled O and LSE, waited for under the watchdog."""
    shape = inputs.shape
    device = inputs.q.device
    out = _poisoned_like(inputs.q)
    lse = torch.full((shape.batch, shape.heads_q, shape.seqlen_q), math.nan, dtype=torch.float32, device=device)
    c_shape = _c_shape(inputs)
    workspace_bytes = _library.forward_workspace_size(c_shape)
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=device)
    with watchdog.guard(call):
        tensors = (_ops._c_tensor(t) for t in (inputs.q, inputs.k, inputs.v, out))
        _library.forward(c_shape, *tensors, lse.data_ptr(), workspace.data_ptr(), workspace_bytes, _stream(device))
    return Forward(out, lse)


def launch_backward(inputs: Inputs, forward: Forward, schedule: str, watchdog: Watchdog, call: str) -> Gradients:
    """One backward with `schedule` through the C-ABI binding into NaN-filled dQ, dK, dV, waited for under the
    watchdog. Raises LibraryError (before launching) when the schedule is refused for this shape."""
    device = inputs.q.device
    c_shape = _c_shape(inputs)
    workspace_bytes = _library.backward_workspace_size(c_shape, schedule)
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=device)
    gradients = Gradients(*(_poisoned_like(t) for t in (inputs.q, inputs.k, inputs.v)))
    with watchdog.guard(call):
        tensors = (_ops._c_tensor(t) for t in (inputs.q, inputs.k, inputs.v, forward.out, inputs.dout))
        _library.backward(
            c_shape,
            *tensors,
            forward.lse.data_ptr(),
            *(_ops._c_tensor(t) for t in gradients),
            schedule,
            workspace.data_ptr(),
            workspace_bytes,
            _stream(device),
        )
    return gradients


def run_flash_attn_func(inputs: Inputs, with_gradients: bool, watchdog: Watchdog) -> tuple[Forward, Gradients | None]:
    """The public path: flash_attn_func(return_lse=True) and, if asked, its autograd backward (API_SCHEDULE)."""
    leaves = tuple(t.detach().requires_grad_(with_gradients) for t in (inputs.q, inputs.k, inputs.v))
    with watchdog.guard("flash_attn_func forward" + (" and autograd backward" if with_gradients else "")):
        out, lse = flash_attn_func(*leaves, causal=inputs.shape.causal, schedule=API_SCHEDULE, return_lse=True)
        gradients = Gradients(*torch.autograd.grad(out, leaves, inputs.dout)) if with_gradients else None
    return Forward(out.detach(), lse), gradients


def is_precondition_rejection(error: _library.LibraryError, schedule: str) -> bool:
    """Whether `error` is the planner refusing `schedule` because its preconditions fail for this shape
    (plan_backward in src/api/attention.cpp), the one refusal the sweep skips rather than fails."""
    return (
        schedule != API_SCHEDULE
        and error.status == "schedule-rejected"
        and error.message.startswith(f"schedule '{schedule}' cannot run this shape: ")
    )


# --- reference ------------------------------------------------------------------------------------


@contextlib.contextmanager
def full_precision_matmul() -> Iterator[None]:
    """float32 matmuls in full float32 on the GPU (TF32 off), restoring the caller's setting afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def reference_attention(
    inputs: Inputs, compute_dtype: torch.dtype, device: torch.device, with_gradients: bool
) -> tuple[Forward, Gradients | None]:
    """O, LSE (B, Hq, Sq) and, if asked, dQ, dK, dV in `compute_dtype` on `device`, from the same 16-bit inputs.

    Explicit formulas, one key/value head and block of query rows at a time (at most REFERENCE_BLOCK_ELEMENTS
    scores): S = scale Q K^T with the bottom-right causal mask (row i sees key j iff j <= i + Sk - Sq),
    LSE = logsumexp(S), P = exp(S - LSE), O = P V; dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)),
    dQ = scale dS K, dK = scale dS^T Q, with dK and dV summed over the group's query heads (GQA). A row that
    sees no key gets LSE = -inf, P = 0, so O = 0 and dQ = 0.
    """
    shape = inputs.shape
    q, k, v, dout = (t.to(device) for t in (inputs.q, inputs.k, inputs.v, inputs.dout))
    group = shape.heads_q // shape.heads_kv
    rows_per_block = max(1, REFERENCE_BLOCK_ELEMENTS // (group * shape.seqlen_k))
    scale = inputs.softmax_scale
    out = torch.empty(q.shape, dtype=compute_dtype, device=device)
    lse = torch.empty((shape.batch, shape.heads_q, shape.seqlen_q), dtype=compute_dtype, device=device)
    gradients = (
        Gradients(*(torch.empty(t.shape, dtype=compute_dtype, device=device) for t in (q, k, v)))
        if with_gradients
        else None
    )
    key_positions = torch.arange(shape.seqlen_k, device=device)

    def rows_of(t: Tensor) -> Tensor:  # (G * R, D) from (G, R, D)
        return t.reshape(-1, t.shape[-1])

    for b in range(shape.batch):
        for kv_head in range(shape.heads_kv):
            heads = slice(kv_head * group, (kv_head + 1) * group)
            k_head, v_head = (t[b, :, kv_head].to(compute_dtype) for t in (k, v))  # (Sk, D)
            dk_head = torch.zeros_like(k_head)
            dv_head = torch.zeros_like(v_head)
            for start in range(0, shape.seqlen_q, rows_per_block):
                rows = slice(start, min(start + rows_per_block, shape.seqlen_q))
                q_block = q[b, rows, heads].to(compute_dtype).transpose(0, 1)  # (G, R, D)
                scores = q_block @ k_head.T * scale  # (G, R, Sk)
                if shape.causal:
                    query_positions = torch.arange(rows.start, rows.stop, device=device)
                    hidden = key_positions[None, :] > query_positions[:, None] + (shape.seqlen_k - shape.seqlen_q)
                    scores.masked_fill_(hidden, -math.inf)
                row_lse = torch.logsumexp(scores, dim=-1)  # (G, R), -inf where a row sees no key
                probs = torch.exp(scores - row_lse.masked_fill(torch.isinf(row_lse), 0)[..., None])
                o_block = probs @ v_head  # (G, R, D)
                out[b, rows, heads] = o_block.transpose(0, 1)
                lse[b, heads, rows] = row_lse
                if gradients is None:
                    continue
                do_block = dout[b, rows, heads].to(compute_dtype).transpose(0, 1)  # (G, R, D)
                dv_head += rows_of(probs).T @ rows_of(do_block)
                dprobs = do_block @ v_head.T
                dscores = probs * (dprobs - (do_block * o_block).sum(dim=-1, keepdim=True))
                gradients.dq[b, rows, heads] = (dscores @ k_head * scale).transpose(0, 1)
                dk_head += rows_of(dscores).T @ rows_of(q_block) * scale
            if gradients is not None:
                gradients.dk[b, :, kv_head] = dk_head
                gradients.dv[b, :, kv_head] = dv_head
    return Forward(out, lse), gradients


# --- checks ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    usage: float  # fraction of the tolerance used: passes at <= 1; inf for differing bits or non-finite values
    detail: str

    @property
    def passed(self) -> bool:
        return self.usage <= 1.0  # NaN fails too


def error_check(name: str, actual: Tensor, reference: Tensor, tolerance: Tolerance) -> Check:
    """The C++ harness's `within` (src/harness/device_harness.cpp), on the reference's device in float64;
    every element must be finite (the outputs start as NaN, so this also catches unwritten elements)."""
    actual = actual.to(device=reference.device, dtype=torch.float64)
    expected = reference.to(torch.float64)
    finite = torch.isfinite(actual)
    not_finite = actual.numel() - int(finite.sum())
    error = torch.where(finite, actual - expected, 0.0).abs()
    max_error = float(error.max())
    max_reference = float(expected.abs().max())
    # A reference that is zero in exact arithmetic (one visible key gives dS = 0, so dQ = dK = 0) is
    # rounding noise in float32, and so is the kernel's result: the norm is floored at MAGNITUDE_FLOOR per
    # element, as the max error is (seen on Sq 1581, Sk 1, causal: reference RMS 1e-6, error 2e-6).
    reference_norm = max(float(expected.norm()), MAGNITUDE_FLOOR * math.sqrt(expected.numel()))
    relative_l2 = float(error.norm()) / reference_norm
    bound = tolerance.max_error_fraction * max(max_reference, MAGNITUDE_FLOOR)
    usage = max(relative_l2 / tolerance.relative_l2, max_error / bound)
    detail = (
        f"rel_l2 {relative_l2:.3g} (tolerance {tolerance.relative_l2:g}), "
        f"max error {max_error:.3g} (tolerance {bound:.3g})"
    )
    if not_finite:
        return Check(name, math.inf, f"{not_finite} non-finite values (unwritten NaN poison or computed); {detail}")
    return Check(name, usage, detail)


def lse_check(name: str, actual: Tensor, reference: Tensor) -> Check:
    """|lse - ref| <= LSE_TOLERANCE * (1 + |ref|) where a row sees a key; exactly -inf where it sees none."""
    actual = actual.to(device=reference.device, dtype=torch.float64)
    expected = reference.to(torch.float64)
    sees_a_key = torch.isfinite(expected)
    finite = torch.isfinite(actual)
    wrong = int((sees_a_key & ~finite).sum()) + int((~sees_a_key & (actual != expected)).sum())
    ratio = torch.where(sees_a_key & finite, (actual - expected).abs() / (LSE_TOLERANCE * (1 + expected.abs())), 0.0)
    usage = float(ratio.max())
    detail = f"max |lse - ref| / (1 + |ref|) = {usage * LSE_TOLERANCE:.3g} (tolerance {LSE_TOLERANCE:g})"
    if wrong:
        return Check(name, math.inf, f"{wrong} rows non-finite, or not -inf where the row sees no key; {detail}")
    return Check(name, usage, detail)


def bitwise_check(name: str, first: Tensor, second: Tensor) -> Check:
    first_bits, second_bits = (t.view(BIT_VIEWS[t.element_size()]) for t in (first, second))
    if torch.equal(first_bits, second_bits):
        return Check(name, 0.0, "bitwise identical")
    differing = int((first_bits != second_bits).sum())
    return Check(name, math.inf, f"{differing} of {first.numel()} elements differ bit for bit")


def forward_checks(name: str, actual: Forward, reference: Forward, dtype: str) -> list[Check]:
    return [
        error_check(f"{name} out", actual.out, reference.out, TOLERANCES[dtype]),
        lse_check(f"{name} lse", actual.lse, reference.lse),
    ]


def gradient_checks(name: str, actual: Gradients, reference: Gradients, dtype: str) -> list[Check]:
    return [
        error_check(f"{name} {field}", a, r, TOLERANCES[dtype])
        for field, a, r in zip(Gradients._fields, actual, reference)
    ]


def bitwise_checks(name: str, first: Forward | Gradients, second: Forward | Gradients) -> list[Check]:
    return [bitwise_check(f"{name} {field}", a, b) for field, a, b in zip(first._fields, first, second)]


# --- one shape ------------------------------------------------------------------------------------


@dataclasses.dataclass
class ShapeResult:
    shape: SweepShape
    checks: list[Check] = dataclasses.field(default_factory=list)
    schedules_run: list[str] = dataclasses.field(default_factory=list)
    schedules_rejected: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def worst(self) -> Check | None:
        return max(self.checks, key=lambda c: math.inf if math.isnan(c.usage) else c.usage, default=None)


def run_shape(
    shape: SweepShape,
    input_seed: int,
    label: str,
    *,
    with_backward: bool = True,
    fp64: bool = False,
    watchdog_seconds: float = DEFAULT_WATCHDOG_SECONDS,
) -> ShapeResult:
    """Every check of one shape on the current CUDA device (see the module docstring); `label` names the shape
    in a HANG line. A LibraryError other than a schedule's precondition rejection becomes a failed check."""
    started = time.perf_counter()
    result = ShapeResult(shape)
    checks = result.checks
    device = torch.device("cuda", torch.cuda.current_device())
    inputs = make_inputs(shape, input_seed, device)
    watchdog = Watchdog(label, watchdog_seconds)
    with full_precision_matmul():
        reference, reference_gradients = reference_attention(inputs, torch.float32, device, with_backward)
    try:
        forward = launch_forward(inputs, watchdog, "forward run 1")
        repeat = launch_forward(inputs, watchdog, "forward run 2")
        api_forward, api_gradients = run_flash_attn_func(inputs, with_backward, watchdog)
    except _library.LibraryError as error:
        checks.append(Check("library call", math.inf, str(error)))
        result.seconds = time.perf_counter() - started
        return result
    checks += forward_checks("forward vs fp32", forward, reference, shape.dtype)
    checks += bitwise_checks("forward run 1 vs run 2", forward, repeat)
    checks += bitwise_checks("forward run 1 vs flash_attn_func", forward, api_forward)
    del repeat, api_forward

    api_schedule_gradients = None  # the binding's run of API_SCHEDULE
    schedules = dash_attn.SCHEDULES if with_backward else ()
    for schedule in schedules:
        try:
            first = launch_backward(inputs, forward, schedule, watchdog, f"backward {schedule} run 1")
            result.schedules_run.append(schedule)
            checks += gradient_checks(f"{schedule} vs fp32", first, reference_gradients, shape.dtype)
            if schedule == NONDETERMINISTIC:  # its bits may change from run to run: values only
                continue
            if schedule == API_SCHEDULE:
                api_schedule_gradients = first
                checks += bitwise_checks(f"{schedule} run 1 vs flash_attn_func", first, api_gradients)
            else:
                second = launch_backward(inputs, forward, schedule, watchdog, f"backward {schedule} run 2")
                checks += bitwise_checks(f"{schedule} run 1 vs run 2", first, second)
        except _library.LibraryError as error:
            if is_precondition_rejection(error, schedule):
                result.schedules_rejected.append(schedule)
            else:
                checks.append(Check(f"backward {schedule}", math.inf, str(error)))

    if fp64:
        cpu = torch.device("cpu")
        with_gradients = api_schedule_gradients is not None
        exact, exact_gradients = reference_attention(inputs, torch.float64, cpu, with_gradients)
        checks += forward_checks("forward vs fp64", forward, exact, shape.dtype)
        if with_gradients:
            checks += gradient_checks(f"{API_SCHEDULE} vs fp64", api_schedule_gradients, exact_gradients, shape.dtype)
    result.seconds = time.perf_counter() - started
    return result


def unavailable_reason() -> str | None:
    """Why this process cannot run the sweep (no CUDA, no library, not a Hopper GPU), or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    try:
        _library.load()
        _library.check_device()
    except (ImportError, _library.LibraryError) as error:
        return str(error)
    return None


def kernel_available(shape: SweepShape) -> bool:
    return _library.kernel_available(shape.head_dim, DTYPE_CODES[shape.dtype])


# --- command line ---------------------------------------------------------------------------------

CSV_FIELDS = (
    "index", "input_seed", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "dtype", "causal",
    "status", "worst_check", "worst_usage", "schedules_run", "schedules_rejected", "seconds", "failures",
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="run seed (default: the current time, printed)")
    parser.add_argument("--shapes", type=int, default=DEFAULT_SHAPES, help="shapes 0..N-1 (default %(default)s)")
    parser.add_argument(
        "--only", type=int, action="append", metavar="INDEX", help="run only shape INDEX of the seed (repeatable)"
    )
    parser.add_argument(
        "--fp64-every",
        type=int,
        default=DEFAULT_FP64_EVERY,
        metavar="K",
        help="also check shapes whose index is a multiple of K against a float64 CPU reference; 0: never "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--watchdog-seconds",
        type=float,
        default=DEFAULT_WATCHDOG_SECONDS,
        metavar="T",
        help=f"a kernel call not finished after T s is a hang: exit {HANG_EXIT_CODE} (default %(default)s)",
    )
    parser.add_argument("--csv", metavar="OUT", help="write one row per shape to this CSV file")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = int(time.time())
    return args


def describe(index: int, result: ShapeResult) -> str:
    status = "FAIL" if result.failures else "ok"
    worst = result.worst
    if worst is None:
        worst_text = "no checks"
    elif math.isfinite(worst.usage):
        worst_text = f"worst {worst.name} at {worst.usage:.2f} of tolerance"
    else:
        worst_text = f"failed {worst.name}"
    schedules = f"{len(result.schedules_run)} schedules" + (
        f" ({', '.join(result.schedules_rejected)} rejected)" if result.schedules_rejected else ""
    )
    return f"{index:5d} {result.shape}  {status}  {worst_text}; {schedules}; {result.seconds:.1f} s"


def csv_row(index: int, input_seed: int, status: str, result: ShapeResult | None) -> dict[str, object]:
    row: dict[str, object] = {"index": index, "input_seed": input_seed, "status": status}
    if result is None:
        return row
    row.update(dataclasses.asdict(result.shape))
    worst = result.worst
    row.update(
        worst_check=worst.name if worst else "",
        worst_usage=f"{worst.usage:.4g}" if worst else "",
        schedules_run=" ".join(result.schedules_run),
        schedules_rejected=" ".join(result.schedules_rejected),
        seconds=f"{result.seconds:.2f}",
        failures="; ".join(f"{c.name}: {c.detail}" for c in result.failures),
    )
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    replay = f"python3 python/tests/random_sweep.py --seed {args.seed} --only INDEX"
    print(f"random_sweep: seed {args.seed} (replay one shape: {replay})", flush=True)
    print(f"random_sweep: {CAP_RULE}", flush=True)
    reason = unavailable_reason()
    if reason is not None:
        print(f"random_sweep: cannot run: {reason}", file=sys.stderr)
        return 2
    indices = args.only if args.only else range(args.shapes)
    fp64 = f"on shapes whose index is a multiple of {args.fp64_every}" if args.fp64_every > 0 else "never"
    print(
        f"random_sweep: {len(indices)} shapes on {torch.cuda.get_device_name()}, float64 CPU reference {fp64}, "
        f"watchdog {args.watchdog_seconds:g} s",
        flush=True,
    )
    failed = no_kernel = 0
    with open(args.csv, "w", newline="") if args.csv else contextlib.nullcontext() as csv_file:
        writer = csv.DictWriter(csv_file, fieldnames=CSV_FIELDS) if csv_file else None

        def log(row: dict[str, object] | None) -> None:
            """Writes a CSV row (the header for None) at once: a hang ends the process without flushing."""
            if writer is None:
                return
            if row is None:
                writer.writeheader()
            else:
                writer.writerow(row)
            csv_file.flush()

        log(None)
        for index in indices:
            shape, input_seed = draw_shape(args.seed, index)
            if not kernel_available(shape):
                no_kernel += 1
                print(f"{index:5d} {shape}  skipped: this build has no kernel for D{shape.head_dim} {shape.dtype}")
                log(csv_row(index, input_seed, "skipped", None))
                continue
            try:
                result = run_shape(
                    shape,
                    input_seed,
                    f"seed {args.seed} shape index {index} {shape}",
                    fp64=args.fp64_every > 0 and index % args.fp64_every == 0,
                    watchdog_seconds=args.watchdog_seconds,
                )
            except Exception:  # a CUDA error leaves the context unusable: name the shape, then stop
                print(f"{index:5d} {shape}  FAIL  exception; replay: {replay.replace('INDEX', str(index))}", flush=True)
                raise
            torch.cuda.empty_cache()  # random sizes fragment the caching allocator; start each shape clean
            print(describe(index, result), flush=True)
            if result.failures:
                failed += 1
                for check in result.failures:
                    print(f"        FAIL {check.name}: {check.detail}")
                print(f"        replay: {replay.replace('INDEX', str(index))}", flush=True)
            log(csv_row(index, input_seed, "FAIL" if result.failures else "ok", result))
    if no_kernel:
        print(f"random_sweep: {no_kernel} shapes skipped: this build lacks their kernel (DASH_HEAD_DIMS, DASH_DTYPES)")
    print(f"sweep: {len(indices)} shapes, {failed} failed, seed {args.seed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
