"""FlashAttention-3's entry points on DASH kernels, with FA3's argument names and positional order:
flash_attn_func, flash_attn_qkvpacked_func and flash_attn_varlen_func as `from flash_attn_interface import ...` gives
them. Import them
as `from dash_attn.fa3 import flash_attn_func`. This module is not named flash_attn_interface, because FA2 has
a module of that name with FA2's order, and a fourth positional argument would then silently change meaning.

Invariants:
- Positional calls mean what they mean in FA3: flash_attn_func(q, k, v, None, True) passes softmax_scale=None
  and causal=True.
- deterministic defaults to True, not False as in FA3: the backward is bitwise reproducible unless the caller
  passes deterministic=False.
- window_size and softcap are implemented as in FA3 (see dash_attn.flash_attn_func). FA3's other options are
  accepted at the values that leave attention unchanged: qv, q_descale, k_descale, v_descale None,
  attention_chunk 0, num_splits 1 (or 0, FA3's heuristic: DASH's forward never splits the keys), pack_gqa None,
  True or False (a layout hint). Other values raise NotImplementedError naming the argument and the value.
- sm_margin is implemented as in FA3: SMs the forward and backward leave to other work (see
  dash_attn.flash_attn_func); an int with 0 <= sm_margin < the device's SM count.
- seqused_q and seqused_k (flash_attn_varlen_func) are accepted only as None: DASH's varlen kernels read each
  sequence's length from the offsets alone, so a used length shorter than the offsets' is refused by name, never
  ignored. Pack the sequences to their used lengths instead (cu_seqlens from the used lengths).
- return_attn_probs=True and return_lse=True both return (out, softmax_lse), as FA3 does.
- schedule and return_lse are keyword-only extras after FA3's arguments.
"""

from __future__ import annotations

from torch import Tensor

from . import varlen
from ._arguments import (
    BSHD,
    Layout,
    attend,
    bshd_named,
    check_flags,
    check_is_tensor,
    check_tensors,
    refuse_unsupported,
    resolve_softcap,
    resolve_window,
    unstack,
)


def _fa3_options(
    q_descale: object,
    k_descale: object,
    v_descale: object,
    window_size: object,
    attention_chunk: object,
    softcap: object,
) -> tuple[tuple[int, int], float]:
    """Refuses what DASH does not implement; returns the checked window and softcap."""
    for name, descale in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        refuse_unsupported(name, descale, (None,), "DASH has no FP8 inputs to descale")
    refuse_unsupported("attention_chunk", attention_chunk, (0,), "DASH has no chunked attention")
    return resolve_window(window_size), resolve_softcap(softcap)


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = True,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """dash_attn.flash_attn_func (see there for the mask, GQA and schedules) in FA3's argument order.

    Returns out (batch, seqlen_q, heads_q, head_dim), or (out, softmax_lse) with return_attn_probs=True or
    return_lse=True. softmax_lse is the fp32 natural-log LSE (batch, heads_q, seqlen_q) and carries no gradient.
    """
    check_flags(causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs, return_lse=return_lse)
    refuse_unsupported("qv", qv, (None,), "DASH has no extra query-value product")
    window, cap = _fa3_options(q_descale, k_descale, v_descale, window_size, attention_chunk, softcap)
    refuse_unsupported("num_splits", num_splits, (1, 0), "DASH's forward never splits the keys")
    refuse_unsupported("pack_gqa", pack_gqa, (None, True, False), "it is a layout hint that takes None or a bool")
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
        entry="dash_attn.fa3.flash_attn_func",
    )
    return (out, lse) if return_attn_probs or return_lse else out


def _split_qkv(qkv: object, num_heads_q: object) -> tuple[tuple[Tensor, Tensor, Tensor], Layout]:
    """q, k and v as views of FA3's packed qkv, and their names: (batch, seqlen, 3, heads, head_dim), or
    (batch, seqlen, heads_q + 2 * heads_kv, head_dim) split after num_heads_q and in half after that (GQA)."""
    check_is_tensor(qkv, "qkv")
    if num_heads_q is not None and (not isinstance(num_heads_q, int) or isinstance(num_heads_q, bool)):
        raise TypeError(f"num_heads_q must be an int or None, got {type(num_heads_q).__name__} {num_heads_q!r}")
    if qkv.dim() == 5:
        heads = qkv.shape[3]
        if num_heads_q is not None and num_heads_q != heads:
            raise ValueError(
                f"num_heads_q={num_heads_q} contradicts qkv.shape[3] = {heads}: a 5-D qkv has the same heads for "
                f"q, k and v; pass num_heads_q=None"
            )
        tensors = unstack(qkv, "qkv", 3)
        return tensors, bshd_named("qkv[:, :, 0]", "qkv[:, :, 1]", "qkv[:, :, 2]")
    if qkv.dim() != 4:
        raise ValueError(
            f"qkv must be 5-D (batch, seqlen, 3, heads, head_dim) or 4-D (batch, seqlen, heads_q + 2 * heads_kv, "
            f"head_dim), got shape {tuple(qkv.shape)}"
        )
    packed_heads = qkv.shape[2]
    if num_heads_q is None:
        raise ValueError(
            f"a 4-D qkv (batch, seqlen, heads_q + 2 * heads_kv, head_dim) needs num_heads_q to split its "
            f"{packed_heads} heads"
        )
    heads_kv, odd = divmod(packed_heads - num_heads_q, 2)
    if not 0 < num_heads_q < packed_heads or odd:
        raise ValueError(
            f"num_heads_q={num_heads_q} cannot split qkv.shape[2] = {packed_heads} into num_heads_q query heads "
            f"and two equal groups of key/value heads"
        )
    q, k, v = qkv.split([num_heads_q, heads_kv, heads_kv], dim=2)
    k_end = num_heads_q + heads_kv
    names = (f"qkv[:, :, :{num_heads_q}]", f"qkv[:, :, {num_heads_q}:{k_end}]", f"qkv[:, :, {k_end}:]")
    return (q, k, v), bshd_named(*names)


def flash_attn_qkvpacked_func(
    qkv: Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    deterministic: bool = True,
    num_heads_q: int | None = None,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """flash_attn_func on q, k and v packed into qkv as FA3 packs them: (batch, seqlen, 3, heads, head_dim), or,
    for GQA, (batch, seqlen, heads_q + 2 * heads_kv, head_dim) with num_heads_q. They are read as views, with no
    copy, and the gradient reaches qkv."""
    check_flags(causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs, return_lse=return_lse)
    window, cap = _fa3_options(q_descale, k_descale, v_descale, window_size, attention_chunk, softcap)
    tensors, layout = _split_qkv(qkv, num_heads_q)
    check_tensors(tensors, layout)
    out, lse = attend(
        tensors,
        layout,
        softmax_scale=softmax_scale,
        causal=causal,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        window=window,
        softcap=cap,
        entry="dash_attn.fa3.flash_attn_qkvpacked_func",
    )
    return (out, lse) if return_attn_probs or return_lse else out


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: Tensor | None = None,
    seqused_k: Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = True,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """dash_attn.flash_attn_varlen_func (see there for the packed layout, the offsets, the maxima and the
    self-attention promise) in FA3's argument order. seqused_q and seqused_k must be None (see the module's
    invariants).

    Returns out (total_q, heads_q, head_dim), or (out, softmax_lse) with return_attn_probs=True or return_lse=True.
    softmax_lse is the fp32 natural-log LSE (heads_q, total_q) and carries no gradient.
    """
    check_flags(causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs, return_lse=return_lse)
    reason = (
        "DASH's varlen kernels take each sequence's length from the offsets alone; pack the sequences to their "
        "used lengths (cu_seqlens from them) instead"
    )
    refuse_unsupported("seqused_q", seqused_q, (None,), reason)
    refuse_unsupported("seqused_k", seqused_k, (None,), reason)
    refuse_unsupported("qv", qv, (None,), "DASH has no extra query-value product")
    window, cap = _fa3_options(q_descale, k_descale, v_descale, window_size, attention_chunk, softcap)
    refuse_unsupported("num_splits", num_splits, (1, 0), "DASH's forward never splits the keys")
    refuse_unsupported("pack_gqa", pack_gqa, (None, True, False), "it is a layout hint that takes None or a bool")
    out, lse = varlen._varlen_attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale=softmax_scale,
        causal=causal,
        window=window,
        softcap=cap,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        entry="dash_attn.fa3.flash_attn_varlen_func",
    )
    return (out, lse) if return_attn_probs or return_lse else out
