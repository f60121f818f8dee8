"""FlashAttention and SDPA callers: tests that the signatures of dash_attn.flash_attn_func,
flash_attn_kvpacked_func and flash_attn_qkvpacked_func (FA2's order), dash_attn.fa3 (FA3's order) and
scaled_dot_product_attention (torch's order) take their arguments as those libraries do.

Without a GPU the entry points run up to the op, under FakeTensorMode with fake CUDA tensors. The op is
replaced by a recorder, so each test sees exactly which q, k, v, scale, mask flag, schedule and SM margin a call
passes.
The tests check: positional calls; the no-op values of options DASH does not implement; NotImplementedError
naming any other value; the returned tuples; packed inputs read as views; a non-contiguous last dimension
copied; and that Dynamo traces every spelling into one graph. The GPU tests at the end check that every
spelling gives the bits and gradients of the plain call.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import dash_attn  # noqa: E402
from dash_attn import (  # noqa: E402
    fa3,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    scaled_dot_product_attention,
)

BATCH, SEQLEN, HEADS, KV_HEADS, HEAD_DIM = 2, 16, 4, 2, 64
DEFAULT_SCALE = HEAD_DIM**-0.5


@dataclass
class ForwardCall:
    """The arguments of one torch.ops.dash_attn.forward call."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    softmax_scale: float
    causal: bool
    schedule: str
    sm_margin: int
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0


@pytest.fixture
def fake_cuda() -> None:
    """Runs the test under FakeTensorMode, so CUDA tensors can be made without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        try:
            torch.empty(1, device="cuda")
        except (RuntimeError, AssertionError) as error:
            pytest.skip(f"this torch build cannot make fake CUDA tensors: {error}")
        yield


@pytest.fixture
def forward_calls(fake_cuda, monkeypatch) -> list[ForwardCall]:
    """Replaces torch.ops.dash_attn.forward by a recorder that returns outputs with the real op's metadata."""
    from dash_attn import _ops

    calls: list[ForwardCall] = []

    def record(q, k, v, softmax_scale, causal, schedule, sm_margin=0, window_left=-1, window_right=-1, softcap=0.0):
        calls.append(
            ForwardCall(q, k, v, softmax_scale, causal, schedule, sm_margin, window_left, window_right, softcap)
        )
        return _ops._forward_outputs(q)

    monkeypatch.setattr(torch.ops.dash_attn, "forward", record)
    return calls


def bshd(heads: int = HEADS, seqlen: int = SEQLEN, head_dim: int = HEAD_DIM) -> torch.Tensor:
    return torch.zeros(BATCH, seqlen, heads, head_dim, dtype=torch.bfloat16, device="cuda")


def bhsd(heads: int = HEADS) -> torch.Tensor:
    return bshd(heads).transpose(1, 2)


def packed(count: int, heads: int = HEADS) -> torch.Tensor:
    return torch.zeros(BATCH, SEQLEN, count, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")


def only_call(calls: list[ForwardCall]) -> ForwardCall:
    assert len(calls) == 1, f"expected one forward call, got {len(calls)}"
    return calls[0]


def raises(error: type[Exception], *fragments: str):
    return pytest.raises(error, match=".*".join(map(re.escape, fragments)))


# --- the signatures themselves: names, order, defaults -----------------------------------------------------

# The argument lists after the tensors, as flash_attn (FA2) and flash_attn_interface (FA3) define them.
FA2_ARGUMENTS = [
    "dropout_p",
    "softmax_scale",
    "causal",
    "window_size",
    "softcap",
    "alibi_slopes",
    "deterministic",
    "return_attn_probs",
]
FA3_ARGUMENTS = [
    "softmax_scale",
    "causal",
    "qv",
    "q_descale",
    "k_descale",
    "v_descale",
    "window_size",
    "attention_chunk",
    "softcap",
    "num_splits",
    "pack_gqa",
    "deterministic",
    "sm_margin",
    "return_attn_probs",
]
FA3_QKVPACKED_ARGUMENTS = [
    "softmax_scale",
    "causal",
    "q_descale",
    "k_descale",
    "v_descale",
    "window_size",
    "attention_chunk",
    "softcap",
    "deterministic",
    "num_heads_q",
    "sm_margin",
    "return_attn_probs",
]
DASH_EXTRAS = ["schedule", "return_lse"]
# FA2's entry points have no sm_margin of their own: DASH adds FA3's as a keyword-only extra.
FA2_DASH_EXTRAS = ["schedule", "sm_margin", "return_lse"]

ALL_ENTRY_POINTS = [
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    fa3.flash_attn_func,
    fa3.flash_attn_qkvpacked_func,
    scaled_dot_product_attention,
]


def entry_point_id(value: object) -> str | None:
    return f"{value.__module__}.{value.__name__}" if callable(value) else None


def positional_and_keyword_only(function) -> tuple[list[str], list[str]]:
    parameters = inspect.signature(function).parameters.values()
    positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword_only = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return positional, keyword_only


@pytest.mark.parametrize(
    ("function", "tensors", "arguments", "extras"),
    [
        (flash_attn_func, ["q", "k", "v"], FA2_ARGUMENTS, FA2_DASH_EXTRAS),
        (flash_attn_kvpacked_func, ["q", "kv"], FA2_ARGUMENTS, FA2_DASH_EXTRAS),
        (flash_attn_qkvpacked_func, ["qkv"], FA2_ARGUMENTS, FA2_DASH_EXTRAS),
        (fa3.flash_attn_func, ["q", "k", "v"], FA3_ARGUMENTS, DASH_EXTRAS),
        (fa3.flash_attn_qkvpacked_func, ["qkv"], FA3_QKVPACKED_ARGUMENTS, DASH_EXTRAS),
        (
            scaled_dot_product_attention,
            ["query", "key", "value"],
            ["attn_mask", "dropout_p", "is_causal"],
            ["scale", "enable_gqa", "deterministic", "schedule", "sm_margin"],
        ),
    ],
    ids=entry_point_id,
)
def test_signature_has_the_original_order_and_dash_extras_keyword_only(function, tensors, arguments, extras) -> None:
    positional, keyword_only = positional_and_keyword_only(function)
    assert positional == tensors + arguments
    assert keyword_only == extras


@pytest.mark.parametrize("function", ALL_ENTRY_POINTS, ids=entry_point_id)
def test_deterministic_defaults_to_true_unlike_flash_attention(function) -> None:
    assert inspect.signature(function).parameters["deterministic"].default is True


def test_packages_export_each_convention_where_its_users_import_it() -> None:
    from dash_attn import fa2, sdpa

    assert dash_attn.flash_attn_func is fa2.flash_attn_func
    assert dash_attn.flash_attn_qkvpacked_func is fa2.flash_attn_qkvpacked_func
    assert dash_attn.flash_attn_kvpacked_func is fa2.flash_attn_kvpacked_func
    assert dash_attn.scaled_dot_product_attention is sdpa.scaled_dot_product_attention
    assert dash_attn.fa3.flash_attn_func is not fa2.flash_attn_func
    # The varlen functions: FA2's order at top level (as `from flash_attn import ...`), FA3's in dash_attn.fa3.
    from dash_attn import varlen

    for name in ("flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func"):
        assert getattr(dash_attn, name) is getattr(varlen, name) and name in dash_attn.__all__
    assert dash_attn.fa3.flash_attn_varlen_func is not varlen.flash_attn_varlen_func
    assert dash_attn.enable_sdpa is sdpa.enable_sdpa and dash_attn.disable_sdpa is sdpa.disable_sdpa


# --- positional calls bind as in the original libraries ----------------------------------------------------


def test_fa2_positional_dropout_then_scale_then_causal(forward_calls) -> None:
    q, kv = bshd(), bshd(KV_HEADS)
    flash_attn_func(q, kv, kv, 0.0, None, True)
    call = only_call(forward_calls)
    assert (call.softmax_scale, call.causal, call.schedule) == (DEFAULT_SCALE, True, "auto")


def test_fa2_every_argument_positional(forward_calls) -> None:
    q, kv = bshd(), bshd(KV_HEADS)
    out, lse, s_dmask = flash_attn_func(q, kv, kv, 0.0, 0.125, True, (-1, -1), 0.0, None, False, True)
    call = only_call(forward_calls)
    assert (call.softmax_scale, call.causal, call.schedule) == (0.125, True, "nondeterministic")
    assert out.shape == q.shape and lse.shape == (BATCH, HEADS, SEQLEN) and s_dmask.numel() == 0


def test_fa3_positional_scale_then_causal(forward_calls) -> None:
    q, kv = bshd(), bshd(KV_HEADS)
    fa3.flash_attn_func(q, kv, kv, 0.125, True)
    call = only_call(forward_calls)
    assert (call.softmax_scale, call.causal, call.schedule) == (0.125, True, "auto")


def test_fa3_every_argument_positional(forward_calls) -> None:
    q, kv = bshd(), bshd(KV_HEADS)
    out, lse = fa3.flash_attn_func(
        q, kv, kv, 0.125, True, None, None, None, None, (-1, -1), 0, 0.0, 1, None, False, 4, True
    )
    call = only_call(forward_calls)
    assert (call.softmax_scale, call.causal, call.schedule, call.sm_margin) == (0.125, True, "nondeterministic", 4)
    assert out.shape == q.shape and lse.shape == (BATCH, HEADS, SEQLEN)


def test_sdpa_positional_mask_dropout_causal(forward_calls) -> None:
    out = scaled_dot_product_attention(bhsd(), bhsd(), bhsd(), None, 0.0, True, scale=0.5)
    call = only_call(forward_calls)
    assert (call.softmax_scale, call.causal, call.schedule) == (0.5, True, "auto")
    assert out.shape == (BATCH, HEADS, SEQLEN, HEAD_DIM)
    # The op sees (B, S, H, D) views of the (B, H, S, D) inputs.
    assert call.q.shape == (BATCH, SEQLEN, HEADS, HEAD_DIM)


def test_sdpa_takes_scale_and_enable_gqa_as_keywords(forward_calls) -> None:
    scaled_dot_product_attention(bhsd(), bhsd(KV_HEADS), bhsd(KV_HEADS), scale=0.25, enable_gqa=True)
    call = only_call(forward_calls)
    assert call.softmax_scale == 0.25 and call.k.shape[2] == KV_HEADS


# --- no-op values are accepted in every spelling ------------------------------------------------------------

FA2_NO_OPS = [
    {"dropout_p": 0.0},
    {"dropout_p": 0},
    {"dropout_p": -0.0},
    {"window_size": (-1, -1)},
    {"window_size": [-1, -1]},
    {"window_size": (None, None)},
    {"window_size": (None, -1)},
    {"softcap": 0.0},
    {"softcap": 0},
    {"alibi_slopes": None},
    {"return_attn_probs": False},
]
FA3_NO_OPS = [
    {"qv": None},
    {"q_descale": None, "k_descale": None, "v_descale": None},
    {"window_size": (-1, -1)},
    {"window_size": (None, None)},
    {"attention_chunk": 0},
    {"softcap": 0.0},
    {"num_splits": 1},
    {"num_splits": 0},
    {"pack_gqa": None},
    {"pack_gqa": True},
    {"pack_gqa": False},
]


@pytest.mark.parametrize("no_op", FA2_NO_OPS, ids=str)
@pytest.mark.parametrize("packing", ["separate", "kvpacked", "qkvpacked"])
def test_fa2_no_op_values_are_accepted(forward_calls, no_op: dict, packing: str) -> None:
    if packing == "separate":
        flash_attn_func(bshd(), bshd(KV_HEADS), bshd(KV_HEADS), causal=True, **no_op)
    elif packing == "kvpacked":
        flash_attn_kvpacked_func(bshd(), packed(2, KV_HEADS), causal=True, **no_op)
    else:
        flash_attn_qkvpacked_func(packed(3), causal=True, **no_op)
    call = only_call(forward_calls)
    assert (call.softmax_scale, call.causal, call.schedule) == (DEFAULT_SCALE, True, "auto")


@pytest.mark.parametrize("no_op", FA3_NO_OPS, ids=str)
def test_fa3_no_op_values_are_accepted(forward_calls, no_op: dict) -> None:
    fa3.flash_attn_func(bshd(), bshd(KV_HEADS), bshd(KV_HEADS), causal=True, **no_op)
    if "qv" not in no_op and "num_splits" not in no_op and "pack_gqa" not in no_op:
        fa3.flash_attn_qkvpacked_func(packed(3), causal=True, **no_op)
    for call in forward_calls:
        assert (call.softmax_scale, call.causal, call.schedule) == (DEFAULT_SCALE, True, "auto")


# --- window_size and softcap reach the op; bad values raise TypeError or ValueError naming them --------------

WINDOWS = [
    ((128, 0), (128, 0)),
    ([64, 64], (64, 64)),
    ((None, 7), (-1, 7)),
    ((0, None), (0, -1)),
    ((-1, 0), (-1, 0)),
]


@pytest.mark.parametrize(("window", "expected"), WINDOWS, ids=str)
@pytest.mark.parametrize("entry", ["fa2", "fa2-kvpacked", "fa2-qkvpacked", "fa3", "fa3-qkvpacked"])
def test_window_size_and_softcap_reach_the_op(forward_calls, window, expected, entry: str) -> None:
    options = {"window_size": window, "softcap": 30.0}
    if entry == "fa2":
        flash_attn_func(bshd(), bshd(KV_HEADS), bshd(KV_HEADS), **options)
    elif entry == "fa2-kvpacked":
        flash_attn_kvpacked_func(bshd(), packed(2, KV_HEADS), **options)
    elif entry == "fa2-qkvpacked":
        flash_attn_qkvpacked_func(packed(3), **options)
    elif entry == "fa3":
        fa3.flash_attn_func(bshd(), bshd(KV_HEADS), bshd(KV_HEADS), **options)
    else:
        fa3.flash_attn_qkvpacked_func(packed(3), **options)
    call = only_call(forward_calls)
    assert (call.window_left, call.window_right, call.softcap) == (*expected, 30.0)


def test_positional_window_and_softcap_mean_what_they_mean_in_fa2() -> None:
    names = list(inspect.signature(flash_attn_func).parameters)
    assert names.index("window_size") == 6 and names.index("softcap") == 7


BAD_WINDOWS_AND_SOFTCAPS = [
    ({"window_size": 4}, TypeError, "window_size must be a pair (left, right) of ints >= -1, got 4"),
    ({"window_size": (1, 2, 3)}, TypeError, "window_size must be a pair"),
    ({"window_size": "ab"}, TypeError, "window_size must be a pair"),
    ({"window_size": (-2, 0)}, ValueError, "window_size[0] must be >= -1", "got -2 in window_size=(-2, 0)"),
    ({"window_size": (0, -5)}, ValueError, "window_size[1] must be >= -1", "got -5"),
    ({"window_size": (1.5, 0)}, TypeError, "window_size[0] must be an int >= -1 (or None), got 1.5"),
    ({"window_size": (True, 0)}, TypeError, "window_size[0] must be an int", "got True"),
    ({"softcap": -1.0}, ValueError, "softcap must be finite and >= 0 (0: no capping), got -1.0"),
    ({"softcap": float("nan")}, ValueError, "softcap must be finite and >= 0", "got nan"),
    ({"softcap": float("inf")}, ValueError, "softcap must be finite and >= 0", "got inf"),
    ({"softcap": "30"}, TypeError, "softcap must be a real number >= 0 (0: no capping), got '30'"),
    ({"softcap": True}, TypeError, "softcap must be a real number", "got True"),
    ({"softcap": 1e300}, ValueError, "softcap must be a finite float32", "got 1e+300"),
]


def test_a_window_bound_past_every_sequence_is_kept_within_int64(forward_calls) -> None:
    flash_attn_func(bshd(), bshd(KV_HEADS), bshd(KV_HEADS), window_size=(2**70, 2**64))
    call = only_call(forward_calls)
    assert call.window_left == call.window_right == 1 << 40


@pytest.mark.parametrize(
    ("options", "error", "fragments"), [(o, e, f) for o, e, *f in BAD_WINDOWS_AND_SOFTCAPS], ids=lambda v: str(v)[:40]
)
@pytest.mark.parametrize("entry", ["fa2", "fa2-qkvpacked", "fa3", "fa3-qkvpacked"])
def test_bad_window_size_and_softcap_are_refused_by_name(options: dict, error, fragments, entry: str) -> None:
    q = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    with raises(error, *fragments):
        if entry == "fa2":
            flash_attn_func(q, q, q, **options)
        elif entry == "fa2-qkvpacked":
            flash_attn_qkvpacked_func(torch.stack([q, q, q], dim=2), **options)
        elif entry == "fa3":
            fa3.flash_attn_func(q, q, q, **options)
        else:
            fa3.flash_attn_qkvpacked_func(torch.stack([q, q, q], dim=2), **options)


# --- other values raise NotImplementedError naming the argument and the value ----------------------------

FA2_UNSUPPORTED = [
    ({"dropout_p": 0.1}, "dropout_p=0.1", "dropout"),
    # False == 0.0, but a bool is no dropout probability: refused, by the fast path's exact-type test too.
    ({"dropout_p": False}, "dropout_p=False", "dropout"),
    ({"alibi_slopes": "slopes"}, "alibi_slopes='slopes'", "ALiBi"),
]
FA3_UNSUPPORTED = [
    ({"qv": "qv"}, "qv='qv'", "query-value"),
    ({"k_descale": 1.0}, "k_descale=1.0", "FP8"),
    ({"attention_chunk": 128}, "attention_chunk=128", "chunked"),
    ({"num_splits": 4}, "num_splits=4", "never splits"),
    ({"pack_gqa": "yes"}, "pack_gqa='yes'", "None or a bool"),
]


@pytest.mark.parametrize(("options", "named", "reason"), FA2_UNSUPPORTED, ids=lambda v: str(v)[:40])
@pytest.mark.parametrize("packing", ["separate", "kvpacked", "qkvpacked"])
def test_fa2_unsupported_values_are_refused_by_name(options: dict, named: str, reason: str, packing: str) -> None:
    q = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    with raises(NotImplementedError, named, "is not supported", reason):
        if packing == "separate":
            flash_attn_func(q, q, q, **options)
        elif packing == "kvpacked":
            flash_attn_kvpacked_func(q, torch.stack([q, q], dim=2), **options)
        else:
            flash_attn_qkvpacked_func(torch.stack([q, q, q], dim=2), **options)


def test_fa2_unsupported_tensor_value_is_shown_by_shape() -> None:
    q = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    with raises(NotImplementedError, "alibi_slopes=<torch.float32 tensor of shape (4,)> is not supported", "ALiBi"):
        flash_attn_func(q, q, q, alibi_slopes=torch.ones(HEADS))


@pytest.mark.parametrize(("options", "named", "reason"), FA3_UNSUPPORTED, ids=lambda v: str(v)[:40])
def test_fa3_unsupported_values_are_refused_by_name(options: dict, named: str, reason: str) -> None:
    q = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    with raises(NotImplementedError, named, "is not supported", reason):
        fa3.flash_attn_func(q, q, q, **options)
    if "qv" not in options and "num_splits" not in options and "pack_gqa" not in options:
        with raises(NotImplementedError, named, "is not supported", reason):
            fa3.flash_attn_qkvpacked_func(torch.stack([q, q, q], dim=2), **options)


# --- sm_margin: FA3's option, taken by every entry point and handed to the op -------------------------------


def every_spelling(**options) -> None:
    """Calls every entry point once with `options` on small fake CUDA tensors."""
    q = bshd()
    flash_attn_func(q, q, q, **options)
    flash_attn_kvpacked_func(q, packed(2), **options)
    flash_attn_qkvpacked_func(packed(3), **options)
    fa3.flash_attn_func(q, q, q, **options)
    fa3.flash_attn_qkvpacked_func(packed(3), **options)
    scaled_dot_product_attention(bhsd(), bhsd(), bhsd(), **options)


@pytest.mark.parametrize("margin", [0, 1, 16, 131])
def test_sm_margin_reaches_the_op_from_every_entry_point(forward_calls, margin: int) -> None:
    every_spelling(sm_margin=margin)
    assert [call.sm_margin for call in forward_calls] == [margin] * 6
    assert all(type(call.sm_margin) is int for call in forward_calls)


def test_sm_margin_defaults_to_zero(forward_calls) -> None:
    every_spelling()
    assert [call.sm_margin for call in forward_calls] == [0] * 6


def test_fa3_takes_sm_margin_positionally_where_fa3_has_it(forward_calls) -> None:
    fa3.flash_attn_qkvpacked_func(packed(3), None, False, None, None, None, (-1, -1), 0, 0.0, True, None, 8)
    assert only_call(forward_calls).sm_margin == 8


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, "sm_margin must be an int, got bool True"),
        (8.0, TypeError, "sm_margin must be an int, got float 8.0"),
        ("8", TypeError, "sm_margin must be an int, got str '8'"),
        (None, TypeError, "sm_margin must be an int, got NoneType None"),
        (-1, ValueError, "sm_margin must satisfy 0 <= sm_margin < the device's SM count, got -1"),
    ],
    ids=repr,
)
def test_sm_margin_must_be_a_non_negative_int(value: object, error: type[Exception], message: str) -> None:
    q = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    for call in (
        lambda: flash_attn_func(q, q, q, sm_margin=value),
        lambda: fa3.flash_attn_func(q, q, q, sm_margin=value),
        lambda: fa3.flash_attn_qkvpacked_func(torch.stack([q, q, q], dim=2), sm_margin=value),
        lambda: scaled_dot_product_attention(q, q, q, sm_margin=value),
    ):
        with raises(error, message):
            call()


def test_sdpa_attn_mask_is_refused_by_name() -> None:
    q = torch.zeros(BATCH, HEADS, SEQLEN, HEAD_DIM, dtype=torch.bfloat16)
    mask = torch.ones(SEQLEN, SEQLEN, dtype=torch.bool)
    with raises(NotImplementedError, "attn_mask=<torch.bool tensor of shape (16, 16)> is not supported", "is_causal"):
        scaled_dot_product_attention(q, q, q, mask)


def test_sdpa_dropout_is_refused_by_name() -> None:
    q = torch.zeros(BATCH, HEADS, SEQLEN, HEAD_DIM, dtype=torch.bfloat16)
    with raises(NotImplementedError, "dropout_p=0.5 is not supported", "dropout"):
        scaled_dot_product_attention(q, q, q, dropout_p=0.5)


def test_sdpa_no_op_mask_and_dropout_are_accepted(forward_calls) -> None:
    scaled_dot_product_attention(bhsd(), bhsd(), bhsd(), attn_mask=None, dropout_p=0.0)
    assert only_call(forward_calls).causal is False


# --- returned tuples ----------------------------------------------------------------------------------------


def test_fa2_return_attn_probs_gives_out_lse_and_an_empty_s_dmask(forward_calls) -> None:
    q = bshd()
    out, lse, s_dmask = flash_attn_func(q, q, q, return_attn_probs=True)
    assert out.shape == q.shape
    assert (lse.shape, lse.dtype) == ((BATCH, HEADS, SEQLEN), torch.float32)
    assert (s_dmask.shape, s_dmask.dtype, s_dmask.device) == ((0,), q.dtype, q.device)
    for function, tensors in ((flash_attn_kvpacked_func, (q, packed(2))), (flash_attn_qkvpacked_func, (packed(3),))):
        assert len(function(*tensors, return_attn_probs=True)) == 3


def test_return_lse_gives_out_and_lse_in_every_convention(forward_calls) -> None:
    q = bshd()
    for result in (
        flash_attn_func(q, q, q, return_lse=True),
        flash_attn_kvpacked_func(q, packed(2), return_lse=True),
        flash_attn_qkvpacked_func(packed(3), return_lse=True),
        fa3.flash_attn_func(q, q, q, return_lse=True),
        fa3.flash_attn_func(q, q, q, return_attn_probs=True),
        fa3.flash_attn_qkvpacked_func(packed(3), return_attn_probs=True),
    ):
        out, lse = result
        assert out.shape == q.shape and lse.shape == (BATCH, HEADS, SEQLEN)


def test_fa2_both_lse_flags_are_refused() -> None:
    q = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    with raises(ValueError, "return_attn_probs=True and return_lse=True", "pass one of them"):
        flash_attn_func(q, q, q, return_attn_probs=True, return_lse=True)


@pytest.mark.parametrize("value", [1, None, "yes"])
def test_return_attn_probs_must_be_a_bool(value: object) -> None:
    q = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    for function in (flash_attn_func, fa3.flash_attn_func):
        with raises(TypeError, "return_attn_probs must be a bool"):
            function(q, q, q, return_attn_probs=value)


# --- packed inputs are views; the messages name the packed argument -----------------------------------------


def assert_view_of(t: torch.Tensor, packed: torch.Tensor, offset: int) -> None:
    assert t.storage_offset() == offset and t.stride()[-1] == 1 and t.untyped_storage().nbytes() == packed.nbytes


def test_fa2_qkvpacked_reads_views_of_qkv(forward_calls) -> None:
    qkv = packed(3)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    call = only_call(forward_calls)
    for index, t in enumerate((call.q, call.k, call.v)):
        assert t.shape == (BATCH, SEQLEN, HEADS, HEAD_DIM)
        assert_view_of(t, qkv, index * qkv.stride(2))
    assert out.shape == (BATCH, SEQLEN, HEADS, HEAD_DIM)


def test_fa2_kvpacked_reads_views_of_kv_with_fewer_heads(forward_calls) -> None:
    kv = packed(2, KV_HEADS)
    flash_attn_kvpacked_func(bshd(), kv)
    call = only_call(forward_calls)
    assert call.k.shape == call.v.shape == (BATCH, SEQLEN, KV_HEADS, HEAD_DIM)
    assert_view_of(call.k, kv, 0)
    assert_view_of(call.v, kv, kv.stride(2))


def test_fa3_qkvpacked_splits_gqa_heads_after_num_heads_q(forward_calls) -> None:
    qkv = torch.zeros(BATCH, SEQLEN, HEADS + 2 * KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    fa3.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=HEADS)
    call = only_call(forward_calls)
    assert call.q.shape[2] == HEADS and call.k.shape[2] == call.v.shape[2] == KV_HEADS
    assert_view_of(call.q, qkv, 0)
    assert_view_of(call.k, qkv, HEADS * HEAD_DIM)
    assert_view_of(call.v, qkv, (HEADS + KV_HEADS) * HEAD_DIM)


def test_fa3_qkvpacked_5d_takes_a_matching_num_heads_q(forward_calls) -> None:
    fa3.flash_attn_qkvpacked_func(packed(3), num_heads_q=HEADS)
    assert only_call(forward_calls).q.shape[2] == HEADS


def test_packed_messages_name_the_packed_argument() -> None:
    q = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    with raises(ValueError, "qkv must be 5-D (batch, seqlen, 3, heads, head_dim)", "(2, 16, 2, 4, 64)"):
        flash_attn_qkvpacked_func(torch.stack([q, q], dim=2))
    with raises(ValueError, "kv must be 5-D (batch, seqlen, 2, heads, head_dim)", "(2, 16, 4, 64)"):
        flash_attn_kvpacked_func(q, q)
    with raises(TypeError, "kv must be a torch.Tensor, got tuple"):
        flash_attn_kvpacked_func(q, (q, q))
    with raises(TypeError, "qkv[:, :, 0].dtype must be torch.bfloat16 or torch.float16", "float32"):
        flash_attn_qkvpacked_func(torch.zeros(BATCH, SEQLEN, 3, HEADS, HEAD_DIM))
    with raises(ValueError, "head_dim (q.shape[3])", "160"):
        flash_attn_kvpacked_func(q[..., :32].repeat(1, 1, 1, 5), torch.stack([q, q], dim=2))
    with raises(ValueError, "kv[:, :, 0].shape[3] (head_dim) = 128 must equal q.shape[3] = 64"):
        flash_attn_kvpacked_func(q, torch.zeros(BATCH, SEQLEN, 2, HEADS, 128, dtype=torch.bfloat16))
    with raises(ValueError, "qkv[:, :, 0], qkv[:, :, 1] and qkv[:, :, 2] must be CUDA tensors"):
        flash_attn_qkvpacked_func(torch.stack([q, q, q], dim=2))


def test_fa3_qkvpacked_shape_and_num_heads_q_errors_are_named() -> None:
    four_d = torch.zeros(BATCH, SEQLEN, 8, HEAD_DIM, dtype=torch.bfloat16)
    with raises(ValueError, "4-D qkv", "needs num_heads_q", "8 heads"):
        fa3.flash_attn_qkvpacked_func(four_d)
    for heads_q in (5, 8, 0, -2):
        with raises(ValueError, f"num_heads_q={heads_q} cannot split qkv.shape[2] = 8"):
            fa3.flash_attn_qkvpacked_func(four_d, num_heads_q=heads_q)
    with raises(TypeError, "num_heads_q must be an int or None, got float 4.0"):
        fa3.flash_attn_qkvpacked_func(four_d, num_heads_q=4.0)
    with raises(ValueError, "num_heads_q=2 contradicts qkv.shape[3] = 4"):
        fa3.flash_attn_qkvpacked_func(
            torch.zeros(BATCH, SEQLEN, 3, HEADS, HEAD_DIM, dtype=torch.bfloat16), num_heads_q=2
        )
    with raises(ValueError, "qkv must be 5-D", "or 4-D", "(2, 16, 64)"):
        fa3.flash_attn_qkvpacked_func(four_d[:, :, 0])
    with raises(ValueError, "qkv[:, :, :4], qkv[:, :, 4:6] and qkv[:, :, 6:] must be CUDA tensors"):
        fa3.flash_attn_qkvpacked_func(four_d, num_heads_q=4)


# --- a last dimension that is not contiguous is copied, as FlashAttention does ----------------------------


def test_non_contiguous_last_dimension_is_made_contiguous(forward_calls) -> None:
    strided = bshd(head_dim=2 * HEAD_DIM)[..., ::2]
    flash_attn_func(bshd(), strided, bshd())
    scaled_dot_product_attention(bhsd(), strided.transpose(1, 2), bhsd())
    for call in forward_calls:
        assert call.k.shape[-1] == HEAD_DIM and call.k.stride(-1) == 1


def test_contiguous_tensors_reach_the_op_uncopied(forward_calls) -> None:
    q, k, v = bshd(), bshd(KV_HEADS), bshd(KV_HEADS)
    flash_attn_func(q, k, v)
    call = only_call(forward_calls)
    assert call.q is q and call.k is k and call.v is v


# --- torch.compile: every entry point traces into one graph ------------------------------------------------

TRACED_CALLS = {
    "fa2 positional": lambda q: flash_attn_func(q, q, q, 0.0, None, True),
    "fa2 kvpacked": lambda q: flash_attn_kvpacked_func(q, torch.stack([q, q], dim=2), return_attn_probs=True)[0],
    "fa3 positional": lambda q: fa3.flash_attn_func(q, q, q, None, True, window_size=(None, None)),
    "fa3 qkvpacked": lambda q: fa3.flash_attn_qkvpacked_func(torch.cat([q, q, q], dim=2), num_heads_q=HEADS)[0],
    "non-contiguous": lambda q: flash_attn_func(q, torch.cat([q, q], dim=-1)[..., ::2], q),
    "sdpa": lambda q: scaled_dot_product_attention(*(q.transpose(1, 2),) * 3, None, 0.0, True),
}


@pytest.mark.parametrize("name", TRACED_CALLS)
def test_dynamo_traces_the_entry_point_without_a_graph_break(fake_cuda, name: str) -> None:
    """The argument handling is plain Python that Dynamo folds away: torch.compile(fullgraph=True) keeps
    working for every spelling (the op's fake kernel gives the output metadata)."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(TRACED_CALLS[name])(bshd().requires_grad_())
    assert explanation.graph_break_count == 0, [str(reason) for reason in explanation.break_reasons]
    assert explanation.graph_count == 1


# --- on a Hopper GPU: every spelling computes the plain call's bits and gradients -------------------------


def random_leaf(*shape: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    t = torch.randn(*shape, generator=generator, device=device).to(torch.bfloat16)
    return t.requires_grad_()


def forward_backward(call, leaves: tuple[torch.Tensor, ...], dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """out, lse and the gradients of `leaves` of out.backward(dout), where call() returns (out, lse, ...)."""
    for t in leaves:
        t.grad = None
    out, lse, *_ = call()
    out.backward(dout)
    return (out.detach(), lse, *(t.grad for t in leaves))


def assert_bitwise(got: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...], what: str) -> None:
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(a, b), f"{what}: result {index} differs from the plain keyword call"


def test_gpu_spellings_give_the_bits_of_the_keyword_call(device, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    generator = torch.Generator(device).manual_seed(21)
    seqlen = 200
    q = random_leaf(BATCH, seqlen, HEADS, HEAD_DIM, device=device, generator=generator)
    k, v = (random_leaf(BATCH, seqlen, KV_HEADS, HEAD_DIM, device=device, generator=generator) for _ in range(2))
    dout = torch.randn(q.shape, generator=generator, device=device).to(torch.bfloat16)
    expected = forward_backward(lambda: flash_attn_func(q, k, v, causal=True, return_lse=True), (q, k, v), dout)

    fa2_positional = forward_backward(
        lambda: flash_attn_func(q, k, v, 0.0, None, True, (-1, -1), 0.0, None, True, True), (q, k, v), dout
    )
    assert_bitwise(fa2_positional, expected, "FA2 positional")
    fa3_positional = forward_backward(
        lambda: fa3.flash_attn_func(q, k, v, None, True, return_attn_probs=True), (q, k, v), dout
    )
    assert_bitwise(fa3_positional, expected, "FA3 positional")

    kv = torch.stack([k.detach(), v.detach()], dim=2).requires_grad_()
    got = forward_backward(lambda: flash_attn_kvpacked_func(q, kv, causal=True, return_lse=True), (q, kv), dout)
    assert_bitwise((*got[:3], got[3][:, :, 0], got[3][:, :, 1]), expected, "FA2 kvpacked")

    qkv = torch.cat([q.detach(), k.detach(), v.detach()], dim=2).requires_grad_()
    got = forward_backward(
        lambda: fa3.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=HEADS, return_attn_probs=True), (qkv,), dout
    )
    dq, dk, dv = got[2].split([HEADS, KV_HEADS, KV_HEADS], dim=2)
    assert_bitwise((*got[:2], dq, dk, dv), expected, "FA3 qkvpacked (GQA)")


def test_gpu_qkvpacked_mha_gives_the_bits_of_the_keyword_call(device, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    generator = torch.Generator(device).manual_seed(22)
    q, k, v = (random_leaf(BATCH, 130, HEADS, HEAD_DIM, device=device, generator=generator) for _ in range(3))
    dout = torch.randn(q.shape, generator=generator, device=device).to(torch.bfloat16)
    expected = forward_backward(lambda: flash_attn_func(q, k, v, causal=True, return_lse=True), (q, k, v), dout)
    qkv = torch.stack([q.detach(), k.detach(), v.detach()], dim=2).requires_grad_()
    for name, call in (
        ("FA2", lambda: flash_attn_qkvpacked_func(qkv, 0.0, None, True, return_attn_probs=True)),
        ("FA3", lambda: fa3.flash_attn_qkvpacked_func(qkv, None, True, return_attn_probs=True)),
    ):
        got = forward_backward(call, (qkv,), dout)
        assert_bitwise((*got[:2], *got[2].unbind(2)), expected, f"{name} qkvpacked")


def test_gpu_return_tuples_hold_the_lse(device, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    q = torch.randn(BATCH, 64, HEADS, HEAD_DIM, device=device).to(torch.bfloat16)
    out, lse = flash_attn_func(q, q, q, return_lse=True)
    fa2_out, fa2_lse, s_dmask = flash_attn_func(q, q, q, return_attn_probs=True)
    fa3_out, fa3_lse = fa3.flash_attn_func(q, q, q, return_attn_probs=True)
    for a, b in ((fa2_out, out), (fa2_lse, lse), (fa3_out, out), (fa3_lse, lse)):
        assert torch.equal(a, b)
    assert s_dmask.numel() == 0 and s_dmask.device == q.device


def test_gpu_non_contiguous_last_dimension_gives_the_bits_of_a_contiguous_copy(device, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    generator = torch.Generator(device).manual_seed(23)
    q, k, v = (random_leaf(1, 96, HEADS, HEAD_DIM, device=device, generator=generator) for _ in range(3))
    dout = torch.randn(q.shape, generator=generator, device=device).to(torch.bfloat16)
    expected = forward_backward(lambda: flash_attn_func(q, k, v, return_lse=True), (q, k, v), dout)
    wide = torch.zeros(*k.shape[:-1], 2 * HEAD_DIM, dtype=k.dtype, device=device)
    wide[..., ::2] = k.detach()
    wide.requires_grad_()
    got = forward_backward(lambda: flash_attn_func(q, wide[..., ::2], v, return_lse=True), (q, wide, v), dout)
    assert_bitwise((*got[:3], got[3][..., ::2], got[4]), expected, "k with stride 2 in head_dim")
    assert torch.count_nonzero(got[3][..., 1::2]) == 0


def test_gpu_sdpa_positional_no_ops_give_the_bits_of_the_keyword_call(device, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    query = torch.randn(BATCH, HEADS, 100, HEAD_DIM, device=device).to(torch.bfloat16)
    expected = scaled_dot_product_attention(query, query, query, is_causal=True)
    assert torch.equal(scaled_dot_product_attention(query, query, query, None, 0.0, True), expected)
