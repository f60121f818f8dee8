"""The public entry points: flash_attn_func (FlashAttention-3's (B, S, H, D) convention) and
scaled_dot_product_attention (PyTorch SDPA's (B, H, S, D) convention).

Every argument is checked here, in Python and before any CUDA call, so a bad call fails with a message that
names the argument as the caller spelled it (q or query) and works the same on a machine without a GPU or
without the library. The C library repeats the checks it needs; these exist for the messages. Flags must be
real bools: a truthy stand-in such as causal="no" would otherwise switch the mask on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from . import _ops  # noqa: F401  (registers torch.ops.dash_attn.*)
from ._library import SCHEDULES

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_HEAD_DIMS = (64, 128)

_NONDETERMINISTIC = "nondeterministic"


@dataclass(frozen=True)
class _Layout:
    """How one entry point spells its tensors: their names and where seqlen and heads sit in the shape."""

    names: tuple[str, str, str]
    seq: int
    heads: int
    spelled: str


_BSHD = _Layout(("q", "k", "v"), seq=1, heads=2, spelled="(batch, seqlen, heads, head_dim)")
_BHSD = _Layout(("query", "key", "value"), seq=2, heads=1, spelled="(batch, heads, seqlen, head_dim)")


def _check_flags(**flags: object) -> None:
    """Raises TypeError naming the first flag that is not a Python bool. numpy and tensor bools are refused
    too: a flag picks the mask or the summation order, which must not depend on how a value converts to truth."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")


def _check_tensors(tensors: tuple[object, object, object], layout: _Layout) -> None:
    """Raises TypeError (not a tensor, dtype) or ValueError (shape, layout) naming the argument."""
    for t, name in zip(tensors, layout.names):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    q, k, v = tensors
    qn, kn, vn = layout.names
    for t, name in zip(tensors, layout.names):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {layout.spelled}, got shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{qn}.dtype must be torch.bfloat16 or torch.float16, got {q.dtype}")
    for t, name in ((k, kn), (v, vn)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must equal {qn}.dtype ({q.dtype})")

    head_dim = q.shape[-1]
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim ({qn}.shape[3]) must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    for t, name in ((k, kn), (v, vn)):
        if t.shape[0] != q.shape[0]:
            raise ValueError(f"{name}.shape[0] (batch) = {t.shape[0]} must equal {qn}.shape[0] = {q.shape[0]}")
        if t.shape[-1] != head_dim:
            raise ValueError(f"{name}.shape[3] (head_dim) = {t.shape[-1]} must equal {qn}.shape[3] = {head_dim}")
    s, h = layout.seq, layout.heads
    if v.shape[s] != k.shape[s]:
        raise ValueError(f"{vn}.shape[{s}] (seqlen) = {v.shape[s]} must equal {kn}.shape[{s}] = {k.shape[s]}")
    if v.shape[h] != k.shape[h]:
        raise ValueError(f"{vn}.shape[{h}] (heads) = {v.shape[h]} must equal {kn}.shape[{h}] = {k.shape[h]}")
    if q.shape[h] % k.shape[h] != 0:
        raise ValueError(
            f"{qn}.shape[{h}] (query heads) = {q.shape[h]} must be a multiple of {kn}.shape[{h}] (key/value "
            f"heads) = {k.shape[h]}: each key/value head serves a whole group of query heads"
        )
    for t, name in zip(tensors, layout.names):
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name}'s last dimension (head_dim) must be contiguous (stride 1), got stride {t.stride(-1)}"
            )


def _check_devices(tensors: tuple[Tensor, Tensor, Tensor], layout: _Layout) -> None:
    """Raises ValueError unless the tensors share one CUDA device. It runs after every other check, so those
    can be exercised with CPU tensors on a machine without a GPU."""
    q, k, v = tensors
    qn, kn, vn = layout.names
    for t, name in ((k, kn), (v, vn)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but {qn} is on {q.device}: all three must be on one device")
    if q.device.type != "cuda":
        raise ValueError(f"{qn}, {kn} and {vn} must be CUDA tensors, got device {q.device}")


def _resolve_scale(softmax_scale: float | None, head_dim: int, name: str) -> float:
    """The softmax scale, head_dim ** -0.5 by default as in FlashAttention and SDPA."""
    if softmax_scale is None:
        return head_dim**-0.5
    scale = float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{name} must be finite and > 0, got {softmax_scale}")
    return scale


def _resolve_schedule(schedule: str, deterministic: bool) -> str:
    """The backward schedule name; deterministic=False is shorthand for "nondeterministic", and a request
    that contradicts the flag is refused rather than silently overridden."""
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}; got {schedule!r}")
    if deterministic:
        if schedule == _NONDETERMINISTIC:
            raise ValueError('schedule="nondeterministic" contradicts deterministic=True; pass deterministic=False')
        return schedule
    if schedule not in ("auto", _NONDETERMINISTIC):
        raise ValueError(
            f"deterministic=False selects the nondeterministic schedule; it cannot be combined "
            f"with schedule={schedule!r}"
        )
    return _NONDETERMINISTIC


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool = True,
    schedule: str = "auto",
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention on (batch, seqlen, heads, head_dim) tensors, differentiable in q, k and v.

    GQA/MQA: pass k and v with fewer heads; query heads [g*G, (g+1)*G) use key/value head g. With
    causal=True, query row i sees key j iff j <= i + seqlen_k - seqlen_q (bottom-right aligned, as in
    FlashAttention). The forward is always deterministic; the backward is bitwise reproducible for every
    schedule but "nondeterministic", which deterministic=False selects. The default "auto" picks the
    deterministic schedule measured fastest for the mask and head dim whose preconditions hold for the shape.

    Returns out (batch, seqlen_q, heads_q, head_dim), or (out, lse) with the fp32 natural-log LSE
    (batch, heads_q, seqlen_q) when return_lse=True; lse carries no gradient.
    """
    _check_flags(causal=causal, deterministic=deterministic, return_lse=return_lse)
    _check_tensors((q, k, v), _BSHD)
    scale = _resolve_scale(softmax_scale, q.shape[-1], "softmax_scale")
    resolved = _resolve_schedule(schedule, deterministic)
    _check_devices((q, k, v), _BSHD)
    out, lse = torch.ops.dash_attn.forward(q, k, v, scale, causal, resolved)
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    deterministic: bool = True,
    schedule: str = "auto",
) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention's (batch, heads, seqlen, head_dim) convention on
    DASH kernels, without attn_mask or dropout.

    The tensors are viewed as (B, S, H, D) by a transpose, which copies nothing when they are packed; the
    result is such a view too. SDPA aligns is_causal to the top-left corner and DASH to the bottom-right:
    they agree only when seqlen_q == seqlen_k, so other lengths are refused rather than computed with a
    different mask. As in SDPA, fewer key/value heads need enable_gqa=True.
    """
    _check_flags(is_causal=is_causal, enable_gqa=enable_gqa, deterministic=deterministic)
    _check_tensors((query, key, value), _BHSD)
    heads_q, heads_kv = query.shape[1], key.shape[1]
    if heads_q != heads_kv and not enable_gqa:
        raise ValueError(
            f"query has {heads_q} heads but key and value {heads_kv}: pass enable_gqa=True for grouped-query "
            f"attention (torch's SDPA refuses this too)"
        )
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    if is_causal and seqlen_q != seqlen_k:
        raise ValueError(
            f"is_causal=True needs query.shape[2] (seqlen_q) == key.shape[2] (seqlen_k), got {seqlen_q} and "
            f"{seqlen_k}: SDPA's causal mask is aligned to the top-left corner and DASH's to the bottom-right, "
            f"which differ for unequal lengths. flash_attn_func(causal=True) computes the bottom-right mask."
        )
    resolved_scale = _resolve_scale(scale, query.shape[-1], "scale")
    resolved = _resolve_schedule(schedule, deterministic)
    _check_devices((query, key, value), _BHSD)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, _ = torch.ops.dash_attn.forward(q, k, v, resolved_scale, is_causal, resolved)
    return out.transpose(1, 2)
