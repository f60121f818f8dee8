"""dash_attn.attention_backward: the backward alone, on a forward's out and LSE.

What these tests hold it to:
- Every argument is checked before any CUDA call, with a message naming it (CPU tensors reach every check but the
  device check, so this part runs anywhere).
- Under torch.use_deterministic_algorithms(True) the nondeterministic schedule is refused (warned under
  warn_only), since the call runs it; the deterministic ones pass.
- On a Hopper GPU its gradients are autograd's through flash_attn_func, bit for bit, for every schedule the shape
  admits, GQA and uneven lengths included; it runs the custom op under tracing (FakeTensorMode) and its body
  otherwise.
"""

from __future__ import annotations

import inspect
import re
import warnings

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from dash_attn import SCHEDULES, LibraryError, attention_backward, flash_attn_func  # noqa: E402

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
