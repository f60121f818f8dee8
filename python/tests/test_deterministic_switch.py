"""torch.use_deterministic_algorithms and DASH's nondeterministic schedule: once the switch is on, a call that
records the nondeterministic backward (deterministic=False) fails as torch's own nondeterministic ops fail. It
raises RuntimeError by default and warns under warn_only=True.

The switch is read at call time, in the forward entry, which fixes the schedule the backward will use. It runs
before the device check, so CPU tensors reach it and these tests need no GPU. A call that autograd does not
record cannot run the backward, so it passes. The GPU tests at the end check that the call then really runs, and
that torch.compile(fullgraph=True) sees the same switch.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from dash_attn import (  # noqa: E402
    fa3,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    scaled_dot_product_attention,
)

BATCH, SEQLEN, HEADS, HEAD_DIM = 2, 16, 4, 64
TORCH_STRICT = "'torch.use_deterministic_algorithms(True)'"
TORCH_WARN_ONLY = "'torch.use_deterministic_algorithms(True, warn_only=True)'"


def bshd(requires_grad: bool = True, device: str = "cpu") -> torch.Tensor:
    t = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    return t.requires_grad_(requires_grad)


# Each public entry point with deterministic=False on inputs that require grad, and the name its message uses.
ENTRY_POINTS: dict[str, Callable[..., object]] = {
    "dash_attn.flash_attn_func": lambda t, **kw: flash_attn_func(t, t, t, deterministic=False, **kw),
    "dash_attn.flash_attn_kvpacked_func": lambda t, **kw: flash_attn_kvpacked_func(
        t, torch.stack([t, t], dim=2), deterministic=False, **kw
    ),
    "dash_attn.flash_attn_qkvpacked_func": lambda t, **kw: flash_attn_qkvpacked_func(
        torch.stack([t, t, t], dim=2), deterministic=False, **kw
    ),
    "dash_attn.fa3.flash_attn_func": lambda t, **kw: fa3.flash_attn_func(t, t, t, deterministic=False, **kw),
    "dash_attn.fa3.flash_attn_qkvpacked_func": lambda t, **kw: fa3.flash_attn_qkvpacked_func(
        torch.stack([t, t, t], dim=2), deterministic=False, **kw
    ),
    "dash_attn.scaled_dot_product_attention": lambda t, **kw: scaled_dot_product_attention(
        *(t.transpose(1, 2),) * 3, deterministic=False, **kw
    ),
}


@contextmanager
def deterministic_torch(warn_only: bool) -> Iterator[None]:
    """torch.use_deterministic_algorithms(True, warn_only=warn_only) inside the block, restored afterwards."""
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


@pytest.fixture
def strict() -> Iterator[None]:
    with deterministic_torch(warn_only=False):
        yield


@pytest.fixture
def warn_only() -> Iterator[None]:
    with deterministic_torch(warn_only=True):
        yield


def nondeterministic_message(entry: str, switch: str) -> str:
    """A pattern for the message: the entry and flag the caller used, the reason, torch's switch as set."""
    return ".*".join(
        map(
            re.escape,
            (f"{entry}(deterministic=False)", "nondeterministic backward schedule", switch, "deterministic=True"),
        )
    )


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_strict_switch_refuses_the_nondeterministic_schedule(strict, entry: str) -> None:
    with pytest.raises(RuntimeError, match=nondeterministic_message(entry, TORCH_STRICT)) as caught:
        ENTRY_POINTS[entry](bshd())
    assert "warn_only=True" in str(caught.value)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_warn_only_switch_warns_at_the_callers_line_and_goes_on(warn_only, entry: str) -> None:
    # The call goes on to the next check, which refuses CPU tensors: the switch came first.
    expected = nondeterministic_message(entry, TORCH_WARN_ONLY)
    with pytest.warns(UserWarning, match=expected) as caught, pytest.raises(ValueError, match="must be CUDA tensors"):
        ENTRY_POINTS[entry](bshd())
    ours = [w for w in caught if "nondeterministic backward schedule" in str(w.message)]
    assert len(ours) == 1
    assert ours[0].filename == __file__, "the warning should point at the caller's line"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_switch_off_lets_the_nondeterministic_schedule_through(entry: str) -> None:
    assert not torch.are_deterministic_algorithms_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="must be CUDA tensors"):
            ENTRY_POINTS[entry](bshd())


def test_deterministic_schedules_pass_the_strict_switch(strict) -> None:
    t = bshd()
    for call in (
        lambda: flash_attn_func(t, t, t),
        lambda: flash_attn_func(t, t, t, schedule="shift"),
        lambda: fa3.flash_attn_func(t, t, t, deterministic=True),
        lambda: scaled_dot_product_attention(*(t.transpose(1, 2),) * 3),
    ):
        with pytest.raises(ValueError, match="must be CUDA tensors"):
            call()


def test_calls_autograd_does_not_record_pass_the_strict_switch(strict) -> None:
    """Without grad mode, or with no input that requires grad, no backward can run."""
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        flash_attn_func(*(bshd(requires_grad=False),) * 3, deterministic=False)
    with torch.no_grad(), pytest.raises(ValueError, match="must be CUDA tensors"):
        flash_attn_func(*(bshd(),) * 3, deterministic=False)
    with torch.inference_mode(), pytest.raises(ValueError, match="must be CUDA tensors"):
        flash_attn_func(*(bshd(requires_grad=False),) * 3, deterministic=False)


def test_one_input_that_requires_grad_is_enough(strict) -> None:
    with pytest.raises(RuntimeError, match="nondeterministic backward schedule"):
        flash_attn_func(bshd(requires_grad=False), bshd(requires_grad=False), bshd(), deterministic=False)


def test_the_switch_is_read_at_call_time() -> None:
    t = bshd()
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        flash_attn_func(t, t, t, deterministic=False)
    with deterministic_torch(warn_only=False), pytest.raises(RuntimeError, match="nondeterministic backward"):
        flash_attn_func(t, t, t, deterministic=False)
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        flash_attn_func(t, t, t, deterministic=False)


def test_argument_errors_come_before_the_switch(strict) -> None:
    t = bshd()
    with pytest.raises(NotImplementedError, match="dropout_p=0.1"):
        flash_attn_func(t, t, t, 0.1, deterministic=False)
    with pytest.raises(ValueError, match="schedule must be one of"):
        flash_attn_func(t, t, t, deterministic=False, schedule="fastest")


def test_torch_compile_sees_the_switch(strict) -> None:
    """Dynamo traces the entry point: the strict switch stops the trace with the same message."""
    compiled = torch.compile(lambda t: flash_attn_func(t, t, t, deterministic=False), fullgraph=True, backend="eager")
    with pytest.raises(RuntimeError, match=nondeterministic_message("dash_attn.flash_attn_func", TORCH_STRICT)):
        compiled(bshd())


def test_torch_compile_warns_under_warn_only(warn_only) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: flash_attn_func(t, t, t, deterministic=False), fullgraph=True, backend="eager")
    # Tracing goes on to the device check, which refuses the CPU tensors.
    expected = nondeterministic_message("dash_attn.flash_attn_func", TORCH_WARN_ONLY)
    with pytest.warns(UserWarning, match=expected), pytest.raises(Exception, match="must be CUDA tensors"):
        compiled(bshd())


# --- on a Hopper GPU: the call that passes the switch runs ----------------------------------------------------


def gpu_inputs(device: torch.device) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator(device).manual_seed(31)
    q, k, v = (torch.randn(1, 256, HEADS, HEAD_DIM, generator=generator, device=device) for _ in range(3))
    return tuple(t.to(torch.bfloat16).requires_grad_() for t in (q, k, v))


def test_gpu_strict_switch_runs_deterministic_calls(device, require_kernel, strict) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    q, k, v = gpu_inputs(device)
    flash_attn_func(q, k, v, causal=True).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    with pytest.raises(RuntimeError, match="nondeterministic backward schedule"):
        flash_attn_func(q, k, v, causal=True, deterministic=False)


def test_gpu_warn_only_runs_the_nondeterministic_schedule(device, require_kernel, warn_only) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    q, k, v = gpu_inputs(device)
    with pytest.warns(UserWarning, match="nondeterministic backward schedule"):
        out = flash_attn_func(q, k, v, causal=True, deterministic=False)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_gpu_torch_compile_under_the_switch(device, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    q, k, v = gpu_inputs(device)

    def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attn_func(q * 0.5, k, v, causal=True, deterministic=False).float().square()

    torch._dynamo.reset()
    with deterministic_torch(warn_only=True):
        with pytest.warns(UserWarning, match="nondeterministic backward schedule"):
            torch.compile(block, fullgraph=True)(q, k, v).sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    strict_switch = deterministic_torch(warn_only=False)
    with strict_switch, pytest.raises(RuntimeError, match="nondeterministic backward schedule"):
        torch.compile(block, fullgraph=True)(q, k, v)
