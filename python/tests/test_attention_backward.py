"""dash_attn.attention_backward: the backward alone, on a forward's out and LSE.

What these tests hold it to:
- Every argument is checked before any CUDA call, with a message naming it (CPU tensors reach every check but the
  device check, so this part runs anywhere).
- Under torch.use_deterministic_algorithms(True) the nondeterministic schedule is refused (warned under
  warn_only), since the call runs it; the deterministic ones pass.
- On a Hopper GPU its gradients are autograd's through flash_attn_func, bit for bit, for every schedule the shape
  admits, GQA and uneven lengths included; it runs the custom op under tracing (FakeTensorMode) and its body
  otherwise.
- Packed varlen batches (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k): the four come together or not at
  all (a partial set is refused naming what was given and what is missing); the tensors, offsets, maxima and the
  (heads_q, total_q) LSE get varlen.py's checks by name; the call hands the op the offsets, the maxima and the
  promise of one offsets tensor passed twice (never of equal values), through the op under tracing. On a Hopper
  GPU with the varlen kernels: autograd's gradients through flash_attn_varlen_func bit for bit for every schedule
  the batch admits; under the sequence-local schedules (ascending, descending) the bits of attention_backward run
  on each sequence as a batch of one (query and key/value heads equal: GQA's group splits follow the batch); a
  float64 reference otherwise (GQA, auto, a window); the key rows of a sequence without queries and the rows past
  the last sequence exactly 0.
"""

from __future__ import annotations

import inspect
import re
import warnings

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from dash_attn import (  # noqa: E402
    SCHEDULES,
    LibraryError,
    _arguments,
    _ops,
    attention_backward,
    flash_attn_func,
    flash_attn_varlen_func,
)
from dash_attn.parallel import TorchLocalAttention  # noqa: E402

BATCH, SEQLEN_Q, SEQLEN_K, HEADS_Q, HEADS_KV, HEAD_DIM = 2, 16, 24, 4, 2, 64


def inputs(device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """dout, q, k, v, out, lse of the module's shape (values do not matter to the checks)."""

    def draw(seqlen: int, heads: int) -> torch.Tensor:
        return torch.randn(BATCH, seqlen, heads, HEAD_DIM, device=device).to(dtype)

    return {
        "dout": draw(SEQLEN_Q, HEADS_Q),
        "q": draw(SEQLEN_Q, HEADS_Q),
        "k": draw(SEQLEN_K, HEADS_KV),
        "v": draw(SEQLEN_K, HEADS_KV),
        "out": draw(SEQLEN_Q, HEADS_Q),
        "lse": torch.randn(BATCH, HEADS_Q, SEQLEN_Q, device=device),
    }


def call(tensors: dict[str, torch.Tensor], **flags: object) -> tuple[torch.Tensor, ...]:
    return attention_backward(
        tensors["dout"], tensors["q"], tensors["k"], tensors["v"], tensors["out"], tensors["lse"], **flags
    )


def raises(error: type[Exception], *fragments: str):
    return pytest.raises(error, match=".*".join(re.escape(f) for f in fragments))


@pytest.mark.parametrize("name", ["dout", "out"])
def test_dout_and_out_must_have_q_shape_and_dtype(name: str) -> None:
    tensors = inputs()
    tensors[name] = tensors[name][:, :-1]
    with raises(ValueError, f"{name}.shape", "must equal q.shape"):
        call(tensors)
    tensors = inputs()
    tensors[name] = tensors[name].half()
    with raises(TypeError, f"{name}.dtype (torch.float16) must equal q.dtype (torch.bfloat16)"):
        call(tensors)


def test_lse_must_be_the_forwards_fp32_batch_heads_seqlen_tensor() -> None:
    tensors = inputs()
    tensors["lse"] = tensors["lse"].transpose(1, 2)
    with raises(ValueError, "lse.shape", f"must be (batch, heads_q, seqlen_q) = {(BATCH, HEADS_Q, SEQLEN_Q)}"):
        call(tensors)
    tensors = inputs()
    tensors["lse"] = tensors["lse"].double()
    with raises(TypeError, "lse.dtype must be torch.float32"):
        call(tensors)


@pytest.mark.parametrize("name", ["dout", "lse"])
def test_a_non_tensor_is_named(name: str) -> None:
    tensors = inputs()
    tensors[name] = 0.0
    with raises(TypeError, f"{name} must be a torch.Tensor"):
        call(tensors)


def test_q_k_v_get_the_entry_points_checks() -> None:
    tensors = inputs()
    tensors["k"] = tensors["k"][:, :, :, :32]
    with raises(ValueError, "k.shape[3] (head_dim) = 32 must equal q.shape[3] = 64"):
        call(tensors)


def test_flags_schedule_scale_and_margin_are_checked() -> None:
    with raises(TypeError, "causal must be a bool"):
        call(inputs(), causal="no")
    with raises(ValueError, "schedule must be one of"):
        call(inputs(), schedule="fastest")
    with raises(ValueError, "softmax_scale must be finite and > 0"):
        call(inputs(), softmax_scale=-1.0)
    with raises(ValueError, "sm_margin must satisfy 0 <= sm_margin"):
        call(inputs(), sm_margin=-1)
    with raises(ValueError, "window_size[0] must be >= -1"):
        call(inputs(), window_size=(-3, 0))
    with raises(ValueError, "softcap must be finite and >= 0"):
        call(inputs(), softcap=-2.0)


def test_tensors_on_the_cpu_are_refused_by_the_device_check_last() -> None:
    with raises(ValueError, "must be CUDA tensors"):
        call(inputs())


@pytest.fixture
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True), restored afterwards; the fixture sets warn_only."""
    before, before_warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )

    def enable(warn_only: bool) -> None:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)

    yield enable
    torch.use_deterministic_algorithms(before, warn_only=before_warn_only)


def test_the_determinism_switch_refuses_the_nondeterministic_schedule(deterministic_algorithms) -> None:
    deterministic_algorithms(False)
    with raises(RuntimeError, "attention_backward(deterministic=False)", "torch.use_deterministic_algorithms(True)"):
        call(inputs(), deterministic=False)
    # A deterministic schedule passes the switch and reaches the device check.
    with raises(ValueError, "must be CUDA tensors"):
        call(inputs(), schedule="ascending")


def test_under_warn_only_the_switch_warns_at_the_callers_line(deterministic_algorithms) -> None:
    deterministic_algorithms(True)
    tensors = inputs()
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="must be CUDA tensors"):
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        attention_backward(*tensors.values(), deterministic=False)
    assert len(caught) == 1 and "may differ from run to run" in str(caught[0].message)
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_under_tracing_it_is_the_backward_op() -> None:
    """FakeTensorMode runs the custom op's fake kernel: the gradients' metadata without a GPU or the library."""
    with FakeTensorMode() as mode:
        tensors = {name: mode.from_tensor(t) for name, t in inputs().items()}
        dq, dk, dv = torch.ops.dash_attn.backward(
            tensors["dout"],
            tensors["q"],
            tensors["k"],
            tensors["v"],
            tensors["out"],
            tensors["lse"],
            0.125,
            True,
            "auto",
            0,
        )
    assert (dq.shape, dk.shape, dv.shape) == (tensors["q"].shape, tensors["k"].shape, tensors["v"].shape)


# --- packed varlen batches, on the CPU -----------------------------------------------------------------------

TOTAL_Q, TOTAL_K = 10, 12
VARLEN_NAMES = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def packed_inputs(**overrides: object) -> tuple[dict[str, object], dict[str, object]]:
    """The tensors (dout, q, k, v, out, lse) and the varlen arguments of a valid packed call on CPU tensors (which
    fails only at the device check), with `overrides` applied to either."""
    tensors = {
        "dout": torch.zeros(TOTAL_Q, HEADS_Q, HEAD_DIM, dtype=torch.bfloat16),
        "q": torch.zeros(TOTAL_Q, HEADS_Q, HEAD_DIM, dtype=torch.bfloat16),
        "k": torch.zeros(TOTAL_K, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16),
        "v": torch.zeros(TOTAL_K, HEADS_KV, HEAD_DIM, dtype=torch.bfloat16),
        "out": torch.zeros(TOTAL_Q, HEADS_Q, HEAD_DIM, dtype=torch.bfloat16),
        "lse": torch.zeros(HEADS_Q, TOTAL_Q),
    }
    varlen = {
        "cu_seqlens_q": torch.tensor([0, 4, 10], dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0, 6, 12], dtype=torch.int32),
        "max_seqlen_q": 6,
        "max_seqlen_k": 6,
    }
    for name, value in overrides.items():
        (tensors if name in tensors else varlen)[name] = value
    return tensors, varlen


def packed_call(**overrides: object) -> tuple[torch.Tensor, ...]:
    tensors, varlen = packed_inputs(**overrides)
    return call(tensors, **varlen)


def test_a_valid_packed_call_reaches_the_device_check() -> None:
    with raises(ValueError, "must be CUDA tensors"):
        packed_call()


@pytest.mark.parametrize(
    "given",
    [
        ("cu_seqlens_q",),
        ("cu_seqlens_q", "cu_seqlens_k"),
        ("max_seqlen_q", "max_seqlen_k"),
        ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q"),
        ("cu_seqlens_k", "max_seqlen_k"),
    ],
    ids="+".join,
)
def test_the_varlen_arguments_come_together_or_not_at_all(given: tuple[str, ...]) -> None:
    tensors, varlen = packed_inputs()
    missing = [name for name in VARLEN_NAMES if name not in given]
    with raises(ValueError, "come together", f"got {', '.join(given)} without {', '.join(missing)}"):
        call(tensors, **{name: varlen[name] for name in given})


@pytest.mark.parametrize(
    ("overrides", "error", "fragments"),
    [
        # A dense q with the varlen arguments, or a packed one without them: each layout's own rule.
        ({"q": torch.zeros(1, TOTAL_Q, HEADS_Q, HEAD_DIM, dtype=torch.bfloat16)}, ValueError, ("q must be 3-D",)),
        ({"k": torch.zeros(TOTAL_K, HEADS_KV, 32, dtype=torch.bfloat16)}, ValueError, ("k.shape[2] (head_dim)",)),
        (
            {"q": torch.zeros(TOTAL_Q, 3, HEAD_DIM, dtype=torch.bfloat16)},
            ValueError,
            ("must be a multiple of k.shape",),
        ),
        ({"cu_seqlens_q": torch.tensor([0, 4, 10])}, TypeError, ("cu_seqlens_q.dtype must be torch.int32",)),
        ({"cu_seqlens_k": [0, 6, 12]}, TypeError, ("cu_seqlens_k must be a torch.Tensor",)),
        ({"cu_seqlens_k": torch.tensor([0, 12], dtype=torch.int32)}, ValueError, ("cu_seqlens_k has 2 offsets",)),
        ({"max_seqlen_q": 0}, ValueError, ("1 <= max_seqlen_q <= 1048576",)),
        ({"max_seqlen_k": True}, TypeError, ("max_seqlen_k must be an int",)),
        ({"dout": torch.zeros(TOTAL_Q - 1, HEADS_Q, HEAD_DIM, dtype=torch.bfloat16)}, ValueError, ("dout.shape",)),
        ({"out": torch.zeros(TOTAL_Q, HEADS_Q, HEAD_DIM)}, TypeError, ("out.dtype (torch.float32) must equal",)),
        (
            {"lse": torch.zeros(TOTAL_Q, HEADS_Q)},
            ValueError,
            ("lse.shape (10, 4) must be (heads_q, total_q) = (4, 10), as the varlen forward returns it",),
        ),
        ({"lse": torch.zeros(1, HEADS_Q, TOTAL_Q)}, ValueError, ("lse.shape (1, 4, 10) must be (heads_q, total_q)",)),
        ({"lse": torch.zeros(HEADS_Q, TOTAL_Q).double()}, TypeError, ("lse.dtype must be torch.float32",)),
    ],
)
def test_a_packed_calls_arguments_get_varlens_checks_by_name(overrides, error, fragments) -> None:
    with raises(error, *fragments):
        packed_call(**overrides)


def test_a_packed_q_without_the_varlen_arguments_is_a_dense_call_refused_by_name() -> None:
    tensors, _ = packed_inputs()
    with raises(ValueError, "q must be 4-D (batch, seqlen, heads, head_dim)"):
        call(tensors)


def test_the_offsets_must_be_on_qs_device(monkeypatch) -> None:
    """The offsets join dout, out and lse in the device check (reached here past q, k and v's CUDA check)."""
    monkeypatch.setattr(_arguments, "check_devices", lambda tensors, layout: None)
    with raises(ValueError, "cu_seqlens_k is on meta but q is on cpu"):
        packed_call(cu_seqlens_k=torch.tensor([0, 6, 12], dtype=torch.int32, device="meta"))


def test_the_determinism_switch_refuses_a_packed_call_too(deterministic_algorithms) -> None:
    deterministic_algorithms(False)
    with raises(RuntimeError, "attention_backward(deterministic=False)"):
        packed_call(deterministic=False)


def test_under_warn_only_a_packed_call_warns_at_the_callers_line(deterministic_algorithms) -> None:
    deterministic_algorithms(True)
    tensors, varlen = packed_inputs()
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="must be CUDA tensors"):
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        attention_backward(*tensors.values(), deterministic=False, **varlen)
    assert len(caught) == 1 and (caught[0].filename, caught[0].lineno) == (__file__, line)


@pytest.fixture
def recorded_backward(monkeypatch) -> list[tuple]:
    """The arguments each call hands the backward op's body (which then returns zeros), past the device check."""
    seen = []

    def body(*args):
        seen.append(args)
        return tuple(torch.zeros_like(t) for t in args[1:4])

    monkeypatch.setattr(_arguments, "check_devices", lambda tensors, layout: None)
    monkeypatch.setattr(_ops, "_backward_body", body)
    return seen


def test_a_packed_call_hands_the_op_its_offsets_maxima_and_promise(recorded_backward) -> None:
    tensors, varlen = packed_inputs()
    offsets = torch.tensor([0, 4, 10], dtype=torch.int32)
    same = dict(varlen, cu_seqlens_q=offsets, cu_seqlens_k=offsets, max_seqlen_q=7, max_seqlen_k=8)
    call(tensors, causal=True, schedule="ascending", softmax_scale=0.25, sm_margin=2, window_size=(5, 0), **same)
    call(tensors, **dict(same, cu_seqlens_k=offsets.clone()))  # equal values, but not one tensor: no promise
    call(tensors, **varlen)
    first, copied, distinct = recorded_backward
    assert all(given is handed for given, handed in zip(tensors.values(), first[:6], strict=True))
    assert first[6:13] == (0.25, True, "ascending", 2, 5, 0, 0.0)
    assert first[13] is offsets and first[14] is offsets and first[15:] == (7, 8, True)
    assert copied[15:] == (7, 8, False)
    assert distinct[13] is varlen["cu_seqlens_q"] and distinct[14] is varlen["cu_seqlens_k"]
    assert distinct[15:] == (6, 6, False)


def test_a_dense_call_hands_the_op_no_varlen_arguments(recorded_backward) -> None:
    call(inputs())
    [args] = recorded_backward
    assert len(args) == 13


def test_under_tracing_a_packed_call_is_the_backward_op_with_its_varlen_arguments(monkeypatch) -> None:
    """FakeTensorMode dispatches the op (its fake kernel: the packed gradients' metadata without a GPU)."""
    monkeypatch.setattr(_arguments, "check_devices", lambda tensors, layout: None)
    tensors, varlen = packed_inputs()
    with FakeTensorMode() as mode:
        fakes = {name: mode.from_tensor(t) for name, t in tensors.items()}
        offsets = mode.from_tensor(varlen["cu_seqlens_q"])
        dq, dk, dv = attention_backward(
            *fakes.values(), cu_seqlens_q=offsets, cu_seqlens_k=offsets, max_seqlen_q=6, max_seqlen_k=6
        )
    assert (dq.shape, dk.shape, dv.shape) == (fakes["q"].shape, fakes["k"].shape, fakes["v"].shape)


# --- on a Hopper GPU --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", [{}, {"window_size": (37, 5), "softcap": 6.0}], ids=["plain", "window-softcap"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "nondeterministic"])
def test_gradients_are_autograds_bit_for_bit(device, require_kernel, causal: bool, schedule: str, variant) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    tensors = inputs(device="cuda")
    leaves = {name: tensors[name].clone().requires_grad_() for name in ("q", "k", "v")}
    out, lse = flash_attn_func(
        leaves["q"], leaves["k"], leaves["v"], causal=causal, schedule=schedule, return_lse=True, **variant
    )
    try:
        out.backward(tensors["dout"])
    except LibraryError as error:  # a schedule whose preconditions the shape does not meet (shift needs full)
        pytest.skip(f"schedule {schedule} does not apply to this shape: {error}")
    got = attention_backward(
        tensors["dout"],
        tensors["q"],
        tensors["k"],
        tensors["v"],
        out.detach(),
        lse,
        causal=causal,
        schedule=schedule,
        **variant,
    )
    for name, a, b in zip(("dq", "dk", "dv"), got, (leaves[n].grad for n in ("q", "k", "v")), strict=True):
        assert torch.equal(a, b), f"{name} differs from autograd's through flash_attn_func ({schedule})"


# --- packed varlen batches, on a Hopper GPU ----------------------------------------------------------------

VARLEN_HEAD_DIM = 128
# (seqlen_q, seqlen_k) per sequence: lengths 0 and 1, around the 128-row tiles, seqlen_q < seqlen_k, and keys
# without queries (their key rows must get zero gradients). Every query row sees a key under every mask below
# (seqlen_q <= seqlen_k), as in context parallelism's calls.
VARLEN_LENGTHS = [(1, 1), (127, 127), (129, 200), (100, 300), (0, 50), (0, 0), (64, 64)]
# Self-attention lengths, for one offsets tensor passed as both (the promise seqlen_k <= seqlen_q).
SELF_LENGTHS = [(1, 1), (127, 127), (129, 129), (300, 300), (0, 0), (64, 64)]
PADDING_ROWS = 5  # rows past the last sequence, which get zero gradients
# As test_attention.py: bf16 against a reference of the same bf16 inputs (relative L2, max error).
RELATIVE_L2_TOLERANCE, MAX_ERROR_TOLERANCE, MAGNITUDE_FLOOR = 1.5e-2, 5e-2, 1e-2
VARLEN_VARIANTS = [{}, {"window_size": (37, 5), "softcap": 6.0}]


def skip_without_varlen_kernels(library, require_kernel, softcap: bool = False) -> None:
    """Skips, naming the build options, unless this build has the varlen kernels the packed tests run."""
    require_kernel(VARLEN_HEAD_DIM, torch.bfloat16)
    if not library.kernel_available(VARLEN_HEAD_DIM, library.DTYPE_BF16, softcap, varlen=True):
        options = "DASH_VARLEN_KERNELS, DASH_SOFTCAP_KERNELS" if softcap else "DASH_VARLEN_KERNELS"
        pytest.skip(f"this build has no varlen kernels for head_dim {VARLEN_HEAD_DIM} / bf16 ({options})")


def packed_batch(lengths, heads_q: int, heads_kv: int, one_offsets: bool, seed: int = 0) -> dict[str, object]:
    """A packed bf16 batch of `lengths` on the GPU with PADDING_ROWS rows past its last sequence: dout, q, k, v,
    the offsets as host lists and as the int32 tensors the call takes (one tensor for both with `one_offsets`, whose
    lengths must then agree), and the maxima."""
    generator = torch.Generator("cuda").manual_seed(seed)
    offsets_q, offsets_k = [0], [0]
    for seqlen_q, seqlen_k in lengths:
        offsets_q.append(offsets_q[-1] + seqlen_q)
        offsets_k.append(offsets_k[-1] + seqlen_k)

    def draw(rows: int, heads: int) -> torch.Tensor:
        return torch.randn(rows, heads, VARLEN_HEAD_DIM, generator=generator, device="cuda").to(torch.bfloat16)

    total_q, total_k = offsets_q[-1] + PADDING_ROWS, offsets_k[-1] + PADDING_ROWS
    cu_seqlens_q = torch.tensor(offsets_q, dtype=torch.int32, device="cuda")
    if one_offsets:
        assert offsets_q == offsets_k, "one offsets tensor needs seqlen_q == seqlen_k per sequence"
        cu_seqlens_k = cu_seqlens_q
    else:
        cu_seqlens_k = torch.tensor(offsets_k, dtype=torch.int32, device="cuda")
    return {
        "dout": draw(total_q, heads_q),
        "q": draw(total_q, heads_q),
        "k": draw(total_k, heads_kv),
        "v": draw(total_k, heads_kv),
        "offsets_q": offsets_q,
        "offsets_k": offsets_k,
        "varlen": {
            "cu_seqlens_q": cu_seqlens_q,
            "cu_seqlens_k": cu_seqlens_k,
            "max_seqlen_q": max(1, *(q for q, _ in lengths)),
            "max_seqlen_k": max(1, *(k for _, k in lengths)),
        },
    }


def packed_forward(batch: dict[str, object], **options: object) -> tuple[torch.Tensor, torch.Tensor]:
    """out and the (heads_q, total_q) LSE of flash_attn_varlen_func on the batch."""
    varlen = batch["varlen"]
    return flash_attn_varlen_func(
        batch["q"],
        batch["k"],
        batch["v"],
        varlen["cu_seqlens_q"],
        varlen["cu_seqlens_k"],
        varlen["max_seqlen_q"],
        varlen["max_seqlen_k"],
        return_lse=True,
        **options,
    )


def packed_backward(batch: dict[str, object], out: torch.Tensor, lse: torch.Tensor, **options: object):
    return attention_backward(batch["dout"], batch["q"], batch["k"], batch["v"], out, lse, **batch["varlen"], **options)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def assert_zero_where_no_query_reaches(batch: dict[str, object], dq, dk, dv) -> None:
    """Exact zeros in the key rows of sequences without queries and in the rows past the last sequence."""
    offsets_q, offsets_k = batch["offsets_q"], batch["offsets_k"]
    for b in range(len(offsets_q) - 1):
        if offsets_q[b + 1] == offsets_q[b]:
            rows = slice(offsets_k[b], offsets_k[b + 1])
            assert torch.all(dk[rows] == 0) and torch.all(dv[rows] == 0), f"sequence {b} has keys but no queries"
    assert torch.all(dq[offsets_q[-1] :] == 0), "dq's padding rows"
    assert torch.all(dk[offsets_k[-1] :] == 0) and torch.all(dv[offsets_k[-1] :] == 0), "dk's and dv's padding rows"


@pytest.mark.parametrize("variant", VARLEN_VARIANTS, ids=["plain", "window-softcap"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "nondeterministic"])
def test_packed_gradients_are_autograds_through_flash_attn_varlen_func_bit_for_bit(
    device, library, require_kernel, causal: bool, schedule: str, variant
) -> None:
    skip_without_varlen_kernels(library, require_kernel, softcap="softcap" in variant)
    batch = packed_batch(SELF_LENGTHS, HEADS_Q, HEADS_KV, one_offsets=True, seed=1)
    tensors = {name: batch[name] for name in ("q", "k", "v")}
    leaves = {name: t.clone().requires_grad_() for name, t in tensors.items()}
    out, lse = packed_forward({**batch, **leaves}, causal=causal, schedule=schedule, **variant)
    try:
        out.backward(batch["dout"])
    except LibraryError as error:  # a schedule the varlen planner refuses for this mask
        pytest.skip(f"schedule {schedule} does not apply to this batch: {error}")
    got = packed_backward(batch, out.detach(), lse, causal=causal, schedule=schedule, **variant)
    for name, a, b in zip(("dq", "dk", "dv"), got, (leaves[n].grad for n in ("q", "k", "v")), strict=True):
        assert same_bits(a, b), f"{name} differs from autograd's through flash_attn_varlen_func ({schedule})"


@pytest.mark.parametrize("one_offsets", [True, False], ids=["one-offsets-tensor", "two-offsets-tensors"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("schedule", ["ascending", "descending"])
def test_packed_gradients_under_a_sequence_local_schedule_are_each_sequences_own_bits(
    device, library, require_kernel, schedule: str, causal: bool, one_offsets: bool
) -> None:
    """The packed call against attention_backward run on each sequence as a batch of one (what
    dash_attn.parallel's per-sequence path runs), bit for bit: these schedules' summation order is a function of
    the sequence alone. Query and key/value heads are equal: with GQA the group splits follow the batch's jobs."""
    from dash_attn.parallel._local import _backward_per_sequence

    skip_without_varlen_kernels(library, require_kernel)
    lengths = SELF_LENGTHS if one_offsets else VARLEN_LENGTHS
    batch = packed_batch(lengths, HEADS_Q, HEADS_Q, one_offsets, seed=2)
    out, lse = packed_forward(batch, causal=causal)
    packed = packed_backward(batch, out, lse, causal=causal, schedule=schedule)

    def dense(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return attention_backward(*tensors, causal=causal, schedule=schedule)

    tensors = (batch["dout"], batch["q"], batch["k"], batch["v"], out, lse)
    per_sequence = _backward_per_sequence(dense, *tensors, batch["offsets_q"], batch["offsets_k"])
    for name, a, b in zip(("dq", "dk", "dv"), packed, per_sequence, strict=True):
        assert same_bits(a, b), f"{name} differs from the per-sequence backward ({schedule})"
    assert_zero_where_no_query_reaches(batch, *packed)


@pytest.mark.parametrize("window_size", [(-1, -1), (37, 5)], ids=["no-window", "window"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("schedule", ["auto", "shortest-first", "ascending"])
def test_packed_gqa_gradients_match_a_float64_reference(
    device, library, require_kernel, schedule: str, causal: bool, window_size
) -> None:
    """GQA, queries fewer than keys, sequences without queries: the packed call against the float64 gradients of
    the same bf16 inputs (TorchLocalAttention, which test_parallel.py checks against float64 autograd)."""
    skip_without_varlen_kernels(library, require_kernel)
    batch = packed_batch(VARLEN_LENGTHS, HEADS_Q, HEADS_KV, one_offsets=False, seed=3)
    out, lse = packed_forward(batch, causal=causal, window_size=window_size)
    got = packed_backward(batch, out, lse, causal=causal, schedule=schedule, window_size=window_size)
    reference = TorchLocalAttention()
    q, k, v, dout = (batch[name].double() for name in ("q", "k", "v", "dout"))
    mask = (batch["offsets_q"], batch["offsets_k"], causal, VARLEN_HEAD_DIM**-0.5, window_size)
    out64, lse64 = reference.forward_varlen(q, k, v, *mask)
    expected = reference.backward_varlen(dout, q, k, v, out64, lse64, *mask)
    for name, actual, truth in zip(("dq", "dk", "dv"), got, expected, strict=True):
        error = (actual.double() - truth).abs()
        relative_l2 = error.norm().item() / max(truth.norm().item(), 1e-30)
        bound = MAX_ERROR_TOLERANCE * max(truth.abs().max().item(), MAGNITUDE_FLOOR)
        assert torch.isfinite(actual).all(), f"{name}: non-finite values"
        assert relative_l2 <= RELATIVE_L2_TOLERANCE, f"{name}: relative L2 error {relative_l2:.3g}"
        assert error.max().item() <= bound, f"{name}: max error {error.max().item():.3g} > {bound:.3g}"
    assert_zero_where_no_query_reaches(batch, *got)
