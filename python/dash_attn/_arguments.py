"""What every public entry point (fa2.py, fa3.py, sdpa.py) shares: the argument checks, the refusal of options
DASH does not implement, torch's determinism switch, and the one call into _ops.attention (the custom op
torch.ops.dash_attn.forward where torch traces, its body under an autograd.Function in plain eager mode).

Invariants:
- Every check runs in Python before any CUDA call, so a bad call fails with a message that names the argument
  as the caller spelled it (q, query, qkv[:, :, 0]) and fails the same way on a machine without a GPU or without
  the library. The C library repeats the checks it needs; these exist for the messages.
- The device check runs last. The determinism switch runs just before it, so CPU tensors reach both.
- Flags must be real bools: a truthy stand-in such as causal="no" would otherwise switch the mask on.
- sm_margin must be an int >= 0 (a bool or a float is refused); its upper bound, the device's SM count, is the
  library's to check when the forward runs.
- An option that FlashAttention or SDPA takes and DASH does not implement is accepted at the value that leaves
  attention unchanged (dropout_p=0.0, alibi_slopes=None, ...). Any other value raises NotImplementedError that
  names the argument and the value. No option is ever ignored in a way that changes the result. window_size and
  softcap are implemented: resolve_window and resolve_softcap check them (TypeError or ValueError naming them).
- A last dimension that is not contiguous is copied, as FlashAttention does. Other strides go to the op, which
  copies only what the kernels cannot read in place (_ops.py).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import struct
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from . import _ops
from ._library import C_INT_MAX, HEAD_DIMS, SCHEDULES

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)

NONDETERMINISTIC = "nondeterministic"

# warnings.warn's stacklevel that points at the caller of a public entry point, from _warned_instead_of_raising:
# through _refuse_nondeterministic_backward, _check_determinism_switch, attend and the entry point (forward
# entries), or through _refuse_nondeterministic_backward, check_backward_call and attention_backward.
_FORWARD_ENTRY_STACKLEVEL = 6
_BACKWARD_ENTRY_STACKLEVEL = 5


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one entry point spells its tensors: their names and where seqlen and heads sit in the shape."""

    names: tuple[str, str, str]
    seq: int
    heads: int
    spelled: str

    def to_bshd(self, t: Tensor) -> Tensor:
        """`t` as the (B, S, H, D) view the op takes: a transpose (no copy) for (B, H, S, D)."""
        return t if self.seq == 1 else t.transpose(1, 2)

    def from_bshd(self, t: Tensor) -> Tensor:
        """The op's (B, S, H, D) result as a view in this layout."""
        return t if self.seq == 1 else t.transpose(1, 2)


BSHD = Layout(("q", "k", "v"), seq=1, heads=2, spelled="(batch, seqlen, heads, head_dim)")
BHSD = Layout(("query", "key", "value"), seq=2, heads=1, spelled="(batch, heads, seqlen, head_dim)")


def bshd_named(q: str, k: str, v: str) -> Layout:
    """The (B, S, H, D) layout with the tensors named as the caller can find them, e.g. "qkv[:, :, 0]"."""
    return dataclasses.replace(BSHD, names=(q, k, v))


def check_flags(**flags: object) -> None:
    """Raises TypeError naming the first flag that is not a Python bool. numpy and tensor bools are refused
    too: a flag picks the mask or the summation order, which must not depend on how a value converts to truth."""
    for name, value in flags.items():
        if type(value) is not bool:  # bool has no subclasses: isinstance's answer, faster
            raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")


def check_sm_margin(sm_margin: object) -> int:
    """sm_margin as a Python int: SMs the kernels leave to other work (FlashAttention-3's option). Raises TypeError
    unless it is an integer (bools are refused: True is no SM count) and ValueError if it is negative. The library
    refuses a margin of the device's SM count or more when the forward runs, naming the count."""
    # A plain int, the common case, skips the slower isinstance test against the Integral ABC.
    if type(sm_margin) is not int and (isinstance(sm_margin, bool) or not isinstance(sm_margin, numbers.Integral)):
        raise TypeError(f"sm_margin must be an int, got {type(sm_margin).__name__} {sm_margin!r}")
    if sm_margin < 0:
        raise ValueError(f"sm_margin must satisfy 0 <= sm_margin < the device's SM count, got {sm_margin}")
    # The library takes it as a C int: a larger value would reach it as its low bits (2**32 + 5 as 5).
    if sm_margin > C_INT_MAX:
        raise ValueError(
            f"sm_margin must satisfy 0 <= sm_margin < the device's SM count, got {sm_margin}, which is "
            f"past even the C int the library takes it as (at most {C_INT_MAX})"
        )
    return int(sm_margin)


def check_is_tensor(value: object, name: str) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def check_tensors(tensors: tuple[object, object, object], layout: Layout) -> None:
    """Raises TypeError (not a tensor, dtype) or ValueError (shape) naming the argument."""
    q, k, v = tensors
    # Plain tensors, the common case, skip the isinstance tests (a subclass takes them).
    if not (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor):
        for t, name in zip(tensors, layout.names):
            check_is_tensor(t, name)
    qn, kn, vn = layout.names
    # Each shape is read once: every call runs these checks, and each .shape builds a new torch.Size.
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    # Each group of checks tests the common case at once and names the culprit only when it fails.
    if not (
        len(q_shape) == len(k_shape) == len(v_shape) == 4 and 0 not in q_shape and 0 not in k_shape and 0 not in v_shape
    ):
        for shape, name in ((q_shape, qn), (k_shape, kn), (v_shape, vn)):
            if len(shape) != 4:
                raise ValueError(f"{name} must be 4-D {layout.spelled}, got shape {tuple(shape)}")
            if 0 in shape:  # no elements
                raise ValueError(f"{name} must not be empty, got shape {tuple(shape)}")
    dtype = q.dtype
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{qn}.dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    # torch.dtype objects are singletons, so identity is equality.
    if k.dtype is not dtype:
        raise TypeError(f"{kn}.dtype ({k.dtype}) must equal {qn}.dtype ({dtype})")
    if v.dtype is not dtype:
        raise TypeError(f"{vn}.dtype ({v.dtype}) must equal {qn}.dtype ({dtype})")

    batch, head_dim = q_shape[0], q_shape[3]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim ({qn}.shape[3]) must be one of {HEAD_DIMS}, got {head_dim}")
    if not (k_shape[0] == v_shape[0] == batch and k_shape[3] == v_shape[3] == head_dim):
        for shape, name in ((k_shape, kn), (v_shape, vn)):
            if shape[0] != batch:
                raise ValueError(f"{name}.shape[0] (batch) = {shape[0]} must equal {qn}.shape[0] = {batch}")
            if shape[3] != head_dim:
                raise ValueError(f"{name}.shape[3] (head_dim) = {shape[3]} must equal {qn}.shape[3] = {head_dim}")
    s, h = layout.seq, layout.heads
    if v_shape[s] != k_shape[s]:
        raise ValueError(f"{vn}.shape[{s}] (seqlen) = {v_shape[s]} must equal {kn}.shape[{s}] = {k_shape[s]}")
    if v_shape[h] != k_shape[h]:
        raise ValueError(f"{vn}.shape[{h}] (heads) = {v_shape[h]} must equal {kn}.shape[{h}] = {k_shape[h]}")
    if q_shape[h] % k_shape[h] != 0:
        raise ValueError(
            f"{qn}.shape[{h}] (query heads) = {q_shape[h]} must be a multiple of {kn}.shape[{h}] (key/value "
            f"heads) = {k_shape[h]}: each key/value head serves a whole group of query heads"
        )


def unstack(packed: object, name: str, count: int) -> tuple[Tensor, ...]:
    """The `count` tensors stacked in dimension 2 of a (batch, seqlen, count, heads, head_dim) tensor, as
    views (no copy), as FlashAttention's packed entry points take them."""
    check_is_tensor(packed, name)
    if packed.dim() != 5 or packed.shape[2] != count:
        raise ValueError(
            f"{name} must be 5-D (batch, seqlen, {count}, heads, head_dim), got shape {tuple(packed.shape)}"
        )
    return packed.unbind(2)


def _shown(value: object) -> str:
    """A value as an error message shows it: a tensor by its dtype and shape, anything else by repr."""
    if isinstance(value, Tensor):
        return f"<{value.dtype} tensor of shape {tuple(value.shape)}>"
    return repr(value)


def _is_value(value: object, accepted: object) -> bool:
    """Whether `value` is `accepted`: the same object for None and bools, an equal real number otherwise
    (0 and 0.0 both mean no dropout). Never true for a tensor, whose == would not give a bool. Plain ints and
    floats are tested first: this runs several times on every call."""
    if value is accepted:
        return True
    if accepted is None or isinstance(accepted, bool):
        return False
    if type(value) in (int, float):
        return value == accepted
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return is_number and value == accepted


def refuse_unsupported(name: str, value: object, accepted: tuple[object, ...], reason: str) -> None:
    """Raises NotImplementedError naming `name` and `value` unless the value is one of `accepted`, the values
    that leave attention unchanged. `reason` says what DASH lacks."""
    # The common case, the first accepted value itself, without the general test: a value of its exact type
    # (None, a bool, an int or a float, whose == is the plain one) that equals it.
    first = accepted[0]
    if type(value) is type(first) and value == first:
        return
    for candidate in accepted:
        if _is_value(value, candidate):
            return
    raise NotImplementedError(f"{name}={_shown(value)} is not supported: {reason}; pass {name}={accepted[0]!r}")


# Bounds beyond this reach past every key of any sequence the kernels take (2^24 tokens, src/api/limits.hpp).
_WINDOW_BOUND_CAP = 1 << 40
# The largest finite float32 and the smallest normal one: the library takes the scale and the softcap as float32.
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_MIN_NORMAL = 1.1754943508222875e-38


def _float32_image(number: float) -> float:
    """`number` rounded to the nearest float32 (to inf past its range), as the library receives it."""
    try:
        return struct.unpack("f", struct.pack("f", number))[0]
    except OverflowError:  # struct refuses what rounds past the largest float32 rather than giving inf
        return math.copysign(math.inf, number)


def _window_side(side: object, which: str, window_size: object) -> int:
    """One bound of window_size as an int: None (FA4's open side) is -1; otherwise an integer >= -1."""
    if side is None:
        return -1
    if isinstance(side, bool) or not isinstance(side, numbers.Integral):
        raise TypeError(
            f"window_size[{which}] must be an int >= -1 (or None), got {_shown(side)} in "
            f"window_size={_shown(window_size)}"
        )
    value = int(side)
    if value < -1:
        raise ValueError(
            f"window_size[{which}] must be >= -1 (-1 leaves that side of the sliding window open), got "
            f"{value} in window_size={_shown(window_size)}"
        )
    # A bound past every sequence the kernels take is the same as any larger one; kept within the C int64.
    return min(value, _WINDOW_BOUND_CAP)


def resolve_window(window_size: object) -> tuple[int, int]:
    """FlashAttention's window_size = (left, right) as two ints: query row i sees key j iff
    i + d - left <= j <= i + d + right with d = seqlen_k - seqlen_q (bottom-right aligned); -1 (or None, as FA4
    spells it) leaves a side open. With causal=True the right bound is 0 whatever it says, as in FlashAttention
    (the library applies that rule). Raises TypeError or ValueError naming window_size otherwise."""
    if type(window_size) is tuple and window_size == (-1, -1):  # the default, without the general test below
        return -1, -1
    is_pair = isinstance(window_size, Sequence) and not isinstance(window_size, str) and len(window_size) == 2
    if not is_pair:
        raise TypeError(f"window_size must be a pair (left, right) of ints >= -1, got {_shown(window_size)}")
    return _window_side(window_size[0], "0", window_size), _window_side(window_size[1], "1", window_size)


def _checked_real(value: object, name: str, type_rule: str, value_rule: str) -> float:
    """`value` as a float after the checks of the value as given: a real number (TypeError "{name} must be
    {type_rule}" for a str, a bool, a complex, a tensor, ...), then finite and > 0 (ValueError "{name} must be
    {value_rule}")."""
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be {type_rule}, got {_shown(value)}")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be {value_rule}, got {value!r}")
    return number


def _checked_float32(number: float, name: str, given: object) -> float:
    """`number` (finite and > 0) after the checks of its float32 image, which the library computes with: not
    infinite (overflow), not 0 and not subnormal (underflow; the kernels flush subnormals to 0). The ValueError
    says that the value as given passed and which check of its image failed."""
    image = _float32_image(number)
    if math.isinf(image):
        raise ValueError(
            f"{name}={given!r} is finite but rounds to inf in float32: {name} must be a finite float32 "
            f"(at most {_FLOAT32_MAX:.7g}), got {given!r}"
        )
    if image < _FLOAT32_MIN_NORMAL:
        rounded = "0.0" if image == 0.0 else f"the subnormal {image!r}, which the kernels flush to 0,"
        raise ValueError(
            f"{name}={given!r} is positive but rounds to {rounded} in float32: {name} must be a normal "
            f"float32 (at least {_FLOAT32_MIN_NORMAL:.7g}) when > 0"
        )
    return number


def resolve_softcap(softcap: object) -> float:
    """The softcap as a float: 0 (or None) for none, else a real number, finite and > 0, whose float32 image (the
    library's) is a normal float32; each scaled score s becomes softcap * tanh(s / softcap). Raises TypeError or
    ValueError naming softcap and the check that failed otherwise."""
    if type(softcap) is float and softcap == 0.0:  # the default, without the general test below
        return 0.0
    if softcap is None:
        return 0.0
    if isinstance(softcap, numbers.Real) and not isinstance(softcap, bool) and softcap == 0:
        return 0.0
    number = _checked_real(softcap, "softcap", "a real number >= 0 (0: no capping)", "finite and >= 0 (0: no capping)")
    return _checked_float32(number, "softcap", softcap)


def _contiguous_last_dim(t: Tensor) -> Tensor:
    """`t`, or a copy of it when its head_dim elements are not adjacent (the kernels read rows of head_dim)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def check_devices(tensors: tuple[Tensor, Tensor, Tensor], layout: Layout) -> None:
    """Raises ValueError unless the tensors share one CUDA device. It runs after every other check, so those
    can be exercised with CPU tensors on a machine without a GPU."""
    q, k, v = tensors
    # Three CUDA tensors with one device index pass without a torch.device built per tensor.
    if q.is_cuda and k.is_cuda and v.is_cuda and k.get_device() == q.get_device() == v.get_device():
        return
    qn, kn, vn = layout.names
    for t, name in ((k, kn), (v, vn)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but {qn} is on {q.device}: all three must be on one device")
    if q.device.type != "cuda":
        raise ValueError(f"{qn}, {kn} and {vn} must be CUDA tensors, got device {q.device}")


def resolve_scale(softmax_scale: object, head_dim: int, name: str) -> float:
    """The softmax scale, head_dim ** -0.5 by default (None) as in FlashAttention and SDPA; otherwise a real number,
    finite and > 0, whose float32 image (the library's) is a normal float32. Raises TypeError or ValueError naming
    `name` and the check that failed."""
    if softmax_scale is None:
        return head_dim**-0.5
    # The common case in one test: a float whose float32 image is normal and finite.
    if type(softmax_scale) is float and _FLOAT32_MIN_NORMAL <= softmax_scale <= _FLOAT32_MAX:
        return softmax_scale
    number = _checked_real(softmax_scale, name, "a real number (finite and > 0)", "finite and > 0")
    return _checked_float32(number, name, softmax_scale)


def resolve_schedule(schedule: str, deterministic: bool) -> str:
    """The backward schedule name; deterministic=False is shorthand for "nondeterministic", and a request
    that contradicts the flag is refused rather than silently overridden."""
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}; got {schedule!r}")
    if deterministic:
        if schedule == NONDETERMINISTIC:
            raise ValueError('schedule="nondeterministic" contradicts deterministic=True; pass deterministic=False')
        return schedule
    if schedule not in ("auto", NONDETERMINISTIC):
        raise ValueError(
            f"deterministic=False selects the nondeterministic schedule; it cannot be combined "
            f"with schedule={schedule!r}"
        )
    return NONDETERMINISTIC


@torch.compiler.assume_constant_result
def _warned_instead_of_raising(message: str, stacklevel: int) -> bool:
    """Under warn_only, warns with `message` (at `stacklevel`) and returns True; else returns False for the caller
    to raise. torch.compile runs it while tracing (Dynamo can trace neither this flag's query nor warnings.warn),
    so a compiled call warns once per compilation; the state it reads is part of Dynamo's global-state guard."""
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, UserWarning, stacklevel=stacklevel)
        return True
    return False


def _check_determinism_switch(schedule: str, tensors: tuple[Tensor, Tensor, Tensor], entry: str) -> None:
    """Treats the nondeterministic backward as torch treats its own nondeterministic ops once
    torch.use_deterministic_algorithms(True) is on: RuntimeError, or a UserWarning under warn_only=True.

    The schedule is fixed here, by the forward call, and autograd replays it in the backward, so this is the last
    point where the call can be refused. A call that autograd does not record (no grad mode, or no input that
    requires grad) never runs a backward and passes."""
    if schedule != NONDETERMINISTIC or not torch.are_deterministic_algorithms_enabled():
        return
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return
    _refuse_nondeterministic_backward(entry, _FORWARD_ENTRY_STACKLEVEL)


def _refuse_nondeterministic_backward(entry: str, stacklevel: int) -> None:
    """The determinism switch's verdict on a call of `entry` that runs (or records) the nondeterministic backward
    while torch.use_deterministic_algorithms(True) is on: RuntimeError, or a UserWarning under warn_only=True."""
    consequence = (
        f"{entry}(deterministic=False) runs the nondeterministic backward schedule (dQ summed by unordered "
        f"atomics), which does not have a deterministic implementation, but you set "
    )
    advice = "Pass deterministic=True (DASH's default) for gradients that are bitwise identical from run to run"
    warn_message = (
        f"{consequence}'torch.use_deterministic_algorithms(True, warn_only=True)'. Its gradients may differ from "
        f"run to run. {advice}."
    )
    if not _warned_instead_of_raising(warn_message, stacklevel):
        raise RuntimeError(
            f"{consequence}'torch.use_deterministic_algorithms(True)'. {advice}, or use the 'warn_only=True' "
            f"option if run-to-run differences are acceptable for your application."
        )


def attend(
    tensors: tuple[Tensor, Tensor, Tensor],
    layout: Layout,
    *,
    softmax_scale: float | None,
    causal: bool,
    deterministic: bool,
    schedule: str,
    entry: str,
    scale_name: str = "softmax_scale",
    sm_margin: object = 0,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """out (in `layout`) and the fp32 LSE (batch, heads_q, seqlen_q) of tensors and flags that passed
    check_tensors and check_flags: resolves the scale and schedule, checks sm_margin, applies the determinism
    switch, checks the device, calls the op (_ops.attention). `entry` is the public name the caller used, for the
    determinism switch's message, and `scale_name` the name of its softmax scale argument. The forward and,
    through autograd, the backward leave `sm_margin` SMs to other work; the backward's plan is keyed by it.
    `window` and `softcap` come from resolve_window and resolve_softcap."""
    q, k, v = tensors
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = _contiguous_last_dim(q), _contiguous_last_dim(k), _contiguous_last_dim(v)
    scale = resolve_scale(softmax_scale, q.size(-1), scale_name)
    resolved = resolve_schedule(schedule, deterministic)
    margin = check_sm_margin(sm_margin)
    _check_determinism_switch(resolved, (q, k, v), entry)
    check_devices((q, k, v), layout)
    left, right = window
    if layout.seq == 1:  # (B, S, H, D) already: no views to make
        return _ops.attention(q, k, v, scale, causal, resolved, margin, left, right, softcap)
    to_bshd = layout.to_bshd
    out, lse = _ops.attention(to_bshd(q), to_bshd(k), to_bshd(v), scale, causal, resolved, margin, left, right, softcap)
    return layout.from_bshd(out), lse


def check_backward_call(
    dout: object,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: object,
    lse: object,
    *,
    softmax_scale: float | None,
    deterministic: bool,
    schedule: str,
    sm_margin: object,
    entry: str,
    offsets: tuple[Tensor, Tensor] | None = None,
) -> tuple[float, str, int]:
    """The checks of an explicit backward call whose q, k and v passed check_tensors (BSHD) and whose flags passed
    check_flags: dout and out are tensors of q's shape and dtype, lse the fp32 (batch, heads_q, seqlen_q) tensor,
    all on q's CUDA device. For a packed varlen batch, `offsets` holds its (cu_seqlens_q, cu_seqlens_k), which
    passed varlen.py's checks as q, k and v did: lse is then the varlen forward's (heads_q, total_q), and the
    offsets must be on q's device too. Returns the resolved scale, schedule and SM margin; the determinism switch
    refuses the nondeterministic schedule outright, since this call runs it."""
    for t, name in ((dout, "dout"), (out, "out"), (lse, "lse")):
        check_is_tensor(t, name)
    for t, name in ((dout, "dout"), (out, "out")):
        if t.shape != q.shape:
            raise ValueError(f"{name}.shape {tuple(t.shape)} must equal q.shape {tuple(q.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must equal q.dtype ({q.dtype})")
    if offsets is None:
        batch, seqlen_q, heads_q, _ = q.shape
        lse_shape, lse_spelled, forward = (batch, heads_q, seqlen_q), "(batch, heads_q, seqlen_q)", "forward"
    else:
        total_q, heads_q, _ = q.shape
        lse_shape, lse_spelled, forward = (heads_q, total_q), "(heads_q, total_q)", "varlen forward"
    if lse.shape != lse_shape:
        raise ValueError(
            f"lse.shape {tuple(lse.shape)} must be {lse_spelled} = {lse_shape}, as the {forward} returns it"
        )
    if lse.dtype != torch.float32:
        raise TypeError(f"lse.dtype must be torch.float32, as the {forward} returns it, got {lse.dtype}")
    scale = resolve_scale(softmax_scale, q.shape[-1], "softmax_scale")
    resolved = resolve_schedule(schedule, deterministic)
    margin = check_sm_margin(sm_margin)
    if resolved == NONDETERMINISTIC and torch.are_deterministic_algorithms_enabled():
        _refuse_nondeterministic_backward(entry, _BACKWARD_ENTRY_STACKLEVEL)
    check_devices((q, k, v), BSHD)
    others = ((dout, "dout"), (out, "out"), (lse, "lse"))
    if offsets is not None:
        others += ((offsets[0], "cu_seqlens_q"), (offsets[1], "cu_seqlens_k"))
    for t, name in others:
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all must be on one device")
    return scale, resolved, margin
