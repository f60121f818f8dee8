"""FlashAttention-2's entry points on DASH kernels, with FA2's argument names and positional order:
flash_attn_func, flash_attn_kvpacked_func and flash_attn_qkvpacked_func as `from flash_attn import ...` gives
them. The package exports these three at top level, as flash_attn does. FA3's order, where softmax_scale comes
fourth, is in fa3.py.

Invariants:
- Positional calls mean what they mean in FA2: flash_attn_func(q, k, v, 0.0, None, True) passes dropout_p=0.0,
  softmax_scale=None and causal=True.
- deterministic defaults to True, not False as in FA2: the backward is bitwise reproducible unless the caller
  passes deterministic=False.
- window_size and softcap are FA2's: a sliding window (left, right), -1 leaving a side open, causal forcing
  right to 0; softcap > 0 caps the scaled scores to softcap * tanh(score / softcap). dropout_p and alibi_slopes
  are accepted at their no-op values (0.0, None); other values raise NotImplementedError naming the argument.
- return_attn_probs=True returns FA2's triple (out, softmax_lse, S_dmask). S_dmask is an empty tensor, which is
  what FA2 returns when dropout is off. return_lse=True (DASH's and FA4's name) returns (out, lse). Passing both
  is refused, because they ask for different tuples.
- schedule, sm_margin and return_lse are keyword-only extras after FA2's arguments. sm_margin is FA3's: SMs the
  forward and backward leave to other work (communication kernels); see dash_attn.flash_attn_func.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._arguments import (
    BSHD,
    attend,
    bshd_named,
    check_flags,
    check_tensors,
    refuse_unsupported,
    resolve_softcap,
    resolve_window,
    unstack,
)


def _fa2_options(
    dropout_p: object, window_size: object, softcap: object, alibi_slopes: object
) -> tuple[tuple[int, int], float]:
    """Refuses what DASH does not implement; returns the checked window and softcap."""
    refuse_unsupported("dropout_p", dropout_p, (0.0,), "DASH has no attention dropout")
    refuse_unsupported("alibi_slopes", alibi_slopes, (None,), "DASH has no ALiBi bias")
    return resolve_window(window_size), resolve_softcap(softcap)


def _check_fa2_flags(causal: object, deterministic: object, return_attn_probs: object, return_lse: object) -> None:
    # Four bools, the common case, pass without check_flags' keyword dict; it names the first that is not one.
    if not (
        type(causal) is bool
        and type(deterministic) is bool
        and type(return_attn_probs) is bool
        and type(return_lse) is bool
    ):
        check_flags(
            causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs, return_lse=return_lse
        )
    if return_attn_probs and return_lse:
        raise ValueError(
            "return_attn_probs=True and return_lse=True ask for different tuples, (out, softmax_lse, S_dmask) "
            "and (out, lse); pass one of them"
        )


def _fa2_result(
    out: Tensor, lse: Tensor, return_attn_probs: bool, return_lse: bool
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    if return_attn_probs:
        return out, lse, torch.empty(0, dtype=out.dtype, device=out.device)
    return (out, lse) if return_lse else out


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """Attention on (batch, seqlen, heads, head_dim) tensors, differentiable in q, k and v.

    GQA/MQA: pass k and v with fewer heads; query heads [g*G, (g+1)*G) use key/value head g. With causal=True,
    query row i sees key j iff j <= i + seqlen_k - seqlen_q (bottom-right aligned, as in FlashAttention).
    softmax_scale defaults to head_dim ** -0.5.

    window_size = (left, right) is FlashAttention's sliding window: query row i sees key j iff
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right; -1 leaves a side open, and causal=True
    makes right 0. A row that sees no key gets out = 0 and lse = -inf. softcap > 0 caps each scaled score s to
    softcap * tanh(s / softcap) before the softmax (Gemma 2); 0 leaves the scores alone. The kernels compute the
    tanh with the GPU's approximation (relative error about 2^-11, as FlashAttention-3 does).

    The forward is always deterministic. The backward is bitwise
    reproducible for every schedule except "nondeterministic", which deterministic=False selects. The default
    "auto" picks the deterministic schedule measured fastest for the shape whose preconditions the shape meets. An
    explicit schedule whose preconditions fail is refused by the backward, naming the rule: "symmetric-shift", for
    one, needs the causal mask, and block_kv a multiple of block_q, which the backward's tiles at head_dim 192
    (64x96) and 256 (64x80) are not.

    sm_margin (as in FlashAttention-3) leaves that many SMs to other work, such as communication kernels that run
    at the same time: the kernels' persistent grids use at most the device's SM count - sm_margin SMs, and the
    backward is planned for that many. 0 <= sm_margin < SM count. The bits of the ascending, descending and
    shortest-first schedules do not depend on it; those of "shift" (which "auto" may pick) and "symmetric-shift"
    are those of a device with that many SMs, so a run must use the same margin to reproduce another's bits.

    Returns out (batch, seqlen_q, heads_q, head_dim); with return_attn_probs=True, (out, softmax_lse, S_dmask)
    as in FA2, where S_dmask is empty; with return_lse=True, (out, lse). The LSE is fp32, natural-log,
    (batch, heads_q, seqlen_q) and carries no gradient.
    """
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    check_tensors((q, k, v), BSHD)
    out, lse = attend(
        (q, k, v),
        BSHD,
        softmax_scale=softmax_scale,
        causal=causal,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        window=window,
        softcap=cap,
        entry="dash_attn.flash_attn_func",
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)


def flash_attn_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_func with k and v stacked as kv (batch, seqlen_k, 2, heads_kv, head_dim). They are read as
    views, with no copy, and the gradient reaches kv. GQA works as in flash_attn_func."""
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    k, v = unstack(kv, "kv", 2)
    layout = bshd_named("q", "kv[:, :, 0]", "kv[:, :, 1]")
    check_tensors((q, k, v), layout)
    out, lse = attend(
        (q, k, v),
        layout,
        softmax_scale=softmax_scale,
        causal=causal,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        window=window,
        softcap=cap,
        entry="dash_attn.flash_attn_kvpacked_func",
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)


def flash_attn_qkvpacked_func(
    qkv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_func with q, k and v stacked as qkv (batch, seqlen, 3, heads, head_dim). They are read as
    views, with no copy, and the gradient reaches qkv. As in FA2, the heads are the same for all three (no
    GQA). fa3.flash_attn_qkvpacked_func also takes GQA heads packed along dimension 2."""
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    q, k, v = unstack(qkv, "qkv", 3)
    layout = bshd_named("qkv[:, :, 0]", "qkv[:, :, 1]", "qkv[:, :, 2]")
    check_tensors((q, k, v), layout)
    out, lse = attend(
        (q, k, v),
        layout,
        softmax_scale=softmax_scale,
        causal=causal,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        window=window,
        softcap=cap,
        entry="dash_attn.flash_attn_qkvpacked_func",
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)
