"""flash_attn_varlen_func: attention on packed variable-length batches (FlashAttention's varlen), differentiable in
q, k and v, with its packed variants flash_attn_varlen_kvpacked_func and flash_attn_varlen_qkvpacked_func (all three
in FlashAttention-2's argument order; dash_attn.fa3 has FA3's). What is varlen's alone lives here: the checks of the
packed tensors, the offsets and the maxima, and the promise read from one offsets tensor passed twice. The call is
_ops.attention with the varlen arguments, the same custom ops (torch.ops.dash_attn.forward and backward), eager path,
call descriptors and plans as a dense batch's.

Layout: q is (total_q, heads_q, head_dim), k and v (total_k, heads_kv, head_dim); sequence b's queries are rows
cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q, its keys rows cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v. Each
sequence attends only to itself, under its own mask (causal and the window bottom-right aligned per sequence, as
in FlashAttention). The LSE is (heads_q, total_q) fp32.

Invariants:
- cu_seqlens stay on the device: nothing here or in _ops reads them on the host, so a call is CUDA-graph capturable.
  The plan is made from (sequences, max_seqlen_q, max_seqlen_k, heads, ...) and the kernels fit each sequence's
  lengths. Their contract (unchecked, it would take a copy): int32, starting at 0, non-decreasing, lengths within the
  maxima, last offsets within the row counts. Offsets that break it give the sequences concerned unspecified
  values but never a hang or an access outside the tensors (the kernels clamp each sequence to the bounds).
- Passing the same tensor as cu_seqlens_q and cu_seqlens_k (self-attention) promises seqlen_k <= seqlen_q per
  sequence, under which the backward may run shift and symmetric shift (schedule="auto" may pick shift under the full
  mask; symmetric shift is refused at head_dim 192 and 256, as for dense batches); otherwise those two schedules are
  refused by name.
- Rows after the last sequence (cu_seqlens_q[-1] <= row < total_q) come out as out = 0, lse = -inf and zero
  gradients: the library clears them after its kernels (only those rows, on the device); a batch without query or
  key rows needs no kernel, and _ops clears its outputs.
- Every check runs before any CUDA call and names the argument; the C library repeats the ones it needs. A build
  without the varlen kernels of the call's head dim, dtype and softcap variant refuses it by name.
- FA2's options DASH does not implement (dropout_p, alibi_slopes, block_table) are accepted at their no-op values
  only; any other value raises NotImplementedError naming the argument, never ignored.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from . import _ops
from ._arguments import (
    _check_determinism_switch,
    check_is_tensor,
    check_sm_margin,
    refuse_unsupported,
    resolve_scale,
    resolve_schedule,
)
from ._library import HEAD_DIMS
from .fa2 import _check_fa2_flags, _fa2_options, _fa2_result

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)

# The longest sequence the kernels take (kMaxSeqlen, src/api/limits.hpp).
MAX_SEQLEN = 1 << 20

_ENTRY = "dash_attn.flash_attn_varlen_func"


def _check_packed(tensors: tuple[object, object, object]) -> None:
    """q, k, v as packed (total, heads, head_dim) tensors: TypeError or ValueError naming the argument."""
    q, k, v = tensors
    # The common case in one test (the named checks below cost four times as much): three 3-D tensors of one
    # supported dtype, k and v of one shape, a built head dim shared by all, whole groups of query heads per
    # key/value head.
    if isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor):
        q_shape, k_shape = q.shape, k.shape
        if (
            len(q_shape) == 3
            and k_shape == v.shape
            and len(k_shape) == 3
            and q.dtype in SUPPORTED_DTYPES
            and k.dtype is q.dtype
            and v.dtype is q.dtype
            and q_shape[2] == k_shape[2]
            and q_shape[2] in HEAD_DIMS
            and q_shape[1] > 0
            and k_shape[1] > 0
            and q_shape[1] % k_shape[1] == 0
        ):
            return
    for t, name in zip(tensors, ("q", "k", "v")):
        check_is_tensor(t, name)
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total_tokens, heads, head_dim), got shape {tuple(t.shape)}")
    q, k, v = tensors
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q.dtype must be torch.bfloat16 or torch.float16, got {q.dtype}")
    for t, name in ((k, "k"), (v, "v")):
        if t.dtype is not q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must equal q.dtype ({q.dtype})")
    head_dim = q.shape[2]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim (q.shape[2]) must be one of {HEAD_DIMS}, got {head_dim}")
    for t, name in ((k, "k"), (v, "v")):
        if t.shape[2] != head_dim:
            raise ValueError(f"{name}.shape[2] (head_dim) = {t.shape[2]} must equal q.shape[2] = {head_dim}")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(
            f"v.shape[:2] {tuple(v.shape[:2])} (total_k, heads) must equal k.shape[:2] {tuple(k.shape[:2])}"
        )
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"q and k must have at least one head, got q.shape {tuple(q.shape)}, k.shape {tuple(k.shape)}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"q.shape[1] (query heads) = {q.shape[1]} must be a multiple of k.shape[1] (key/value "
            f"heads) = {k.shape[1]}: each key/value head serves a whole group of query heads"
        )


def _check_cu_seqlens(cu_seqlens_q: object, cu_seqlens_k: object) -> int:
    """The number of sequences, after checking both offset tensors: int32, 1-D, the same length of at least 2."""
    if isinstance(cu_seqlens_q, Tensor) and isinstance(cu_seqlens_k, Tensor):  # the common case in one test
        offsets = cu_seqlens_q.shape
        if (
            cu_seqlens_q.dtype is torch.int32
            and cu_seqlens_k.dtype is torch.int32
            and len(offsets) == 1
            and offsets[0] >= 2
            and cu_seqlens_k.shape == offsets
        ):
            return offsets[0] - 1
    for t, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        check_is_tensor(t, name)
        if t.dtype != torch.int32:
            raise TypeError(f"{name}.dtype must be torch.int32 (FlashAttention's cu_seqlens), got {t.dtype}")
        if t.dim() != 1 or t.numel() < 2:
            raise ValueError(
                f"{name} must be 1-D with batch + 1 >= 2 offsets (0, then each sequence's end), got "
                f"shape {tuple(t.shape)}"
            )
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(
            f"cu_seqlens_k has {cu_seqlens_k.numel()} offsets but cu_seqlens_q {cu_seqlens_q.numel()}: "
            f"both must hold batch + 1"
        )
    return cu_seqlens_q.numel() - 1


def _check_max_seqlen(value: object, name: str) -> int:
    if type(value) is int and 1 <= value <= MAX_SEQLEN:  # the common case in one test
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= value <= MAX_SEQLEN:
        raise ValueError(
            f"{name} must satisfy 1 <= {name} <= {MAX_SEQLEN} (the longest sequence of the batch; the "
            f"plan is made for it), got {value}"
        )
    return int(value)


def _check_devices(tensors: tuple[Tensor, ...], names: tuple[str, ...]) -> None:
    """All on q's CUDA device; runs after every other check, so those work with CPU tensors without a GPU."""
    q = tensors[0]
    # CUDA tensors of one device index pass without a torch.device built per tensor.
    if q.is_cuda:
        index = q.get_device()
        for t in tensors:
            if not t.is_cuda or t.get_device() != index:
                break
        else:
            return
    for t, name in zip(tensors[1:], names[1:]):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all must be on one device")
    if q.device.type != "cuda":
        raise ValueError(f"q, k, v, cu_seqlens_q and cu_seqlens_k must be CUDA tensors, got device {q.device}")


def _same_offsets(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor) -> bool:
    """Whether both offset tensors are one (the promise seqlen_k <= seqlen_q per sequence holds): the same object,
    or views of the same memory, which needs no copy from the device."""
    if cu_seqlens_k is cu_seqlens_q:
        return True
    if _ops._traced(cu_seqlens_q, cu_seqlens_k):
        return False
    return (
        cu_seqlens_q.data_ptr() == cu_seqlens_k.data_ptr()
        and cu_seqlens_q.stride() == cu_seqlens_k.stride()
        and cu_seqlens_q.numel() == cu_seqlens_k.numel()
    )


def _varlen_attention(
    q: object,
    k: object,
    v: object,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: object,
    max_seqlen_k: object,
    *,
    softmax_scale: float | None,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
    deterministic: bool,
    schedule: str,
    sm_margin: object,
    entry: str,
) -> tuple[Tensor, Tensor]:
    """out, lse of every varlen entry point, after its own option checks: checks the tensors, offsets and maxima,
    resolves the scale and schedule, applies the determinism switch and runs the call. `entry` is the public name
    the caller used, for the determinism switch's message."""
    left, right = window
    _check_packed((q, k, v))
    _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    max_q = _check_max_seqlen(max_seqlen_q, "max_seqlen_q")
    max_k = _check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    scale = resolve_scale(softmax_scale, q.shape[2], "softmax_scale")
    resolved = resolve_schedule(schedule, deterministic)
    margin = check_sm_margin(sm_margin)
    _check_determinism_switch(resolved, (q, k, v), entry)
    _check_devices((q, k, v, cu_seqlens_q, cu_seqlens_k), ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
    promise = _same_offsets(cu_seqlens_q, cu_seqlens_k)
    arguments = (scale, causal, resolved, margin, left, right, softcap)
    return _ops.attention(q, k, v, *arguments, cu_seqlens_q, cu_seqlens_k, max_q, max_k, promise)


def _unstack_rows(packed: object, name: str, count: int) -> tuple[Tensor, ...]:
    """The `count` tensors stacked in dimension 1 of a (total, count, heads, head_dim) tensor, as views (no copy),
    as FlashAttention-2's packed varlen entry points take them."""
    check_is_tensor(packed, name)
    if packed.dim() != 4 or packed.shape[1] != count:
        raise ValueError(
            f"{name} must be 4-D (total_tokens, {count}, heads, head_dim), got shape {tuple(packed.shape)}"
        )
    return packed.unbind(1)


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    block_table: Tensor | None = None,
    *,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """Attention on a packed variable-length batch (FlashAttention's varlen), differentiable in q, k and v, with
    FlashAttention-2's arguments in FA2's order (dash_attn.fa3.flash_attn_varlen_func has FA3's).

    q is (total_q, heads_q, head_dim), k and v (total_k, heads_kv, head_dim) (GQA/MQA: fewer key/value heads);
    cu_seqlens_q and cu_seqlens_k are int32 CUDA tensors of batch + 1 offsets: sequence b's queries are rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q, its keys those of cu_seqlens_k in k and v. max_seqlen_q and max_seqlen_k
    bound every sequence's lengths (1 <= max <= 2^20); the backward's plan is made from them, never from the
    offsets, which stay on the device (no copy per call; CUDA-graph capturable). Lengths 0 are allowed.

    causal, window_size and softcap mean what they mean in flash_attn_func, per sequence: with causal=True query row
    i of a sequence sees its key j iff j <= i + seqlen_k - seqlen_q (bottom-right aligned). A query row that sees no
    key gets out = 0 and lse = -inf. softcap > 0 caps each score as in flash_attn_func (the softcap instances' varlen
    kernels).

    dropout_p, alibi_slopes and block_table are accepted at their no-op values (0.0, None, None); any other value
    raises NotImplementedError naming the argument (DASH has no dropout, no ALiBi and no paged KV cache).

    Passing one tensor as both cu_seqlens_q and cu_seqlens_k (self-attention) promises seqlen_k <= seqlen_q per
    sequence, which lets schedule="auto" pick shift; schedule="shift" or "symmetric-shift" without it
    is refused, naming the rule. deterministic (default True, unlike FA2) and schedule are flash_attn_func's: every
    schedule but "nondeterministic" (deterministic=False) gives bitwise identical gradients from run to run.

    Returns out (total_q, heads_q, head_dim); with return_attn_probs=True, FA2's (out, softmax_lse, S_dmask), where
    S_dmask is empty (what FA2 returns without dropout); with return_lse=True, (out, lse). The LSE is fp32
    (heads_q, total_q), natural-log, without gradient. Rows after cu_seqlens_q[-1] come out 0 (lse -inf) and get
    zero gradients.
    """
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    refuse_unsupported("block_table", block_table, (None,), "DASH has no paged KV cache")
    out, lse = _varlen_attention(
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
        entry=_ENTRY,
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)


def flash_attn_varlen_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
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
    """flash_attn_varlen_func with k and v stacked as kv (total_k, 2, heads_kv, head_dim), in FA2's order. They are
    read as views, with no copy, and the gradient reaches kv. GQA works as in flash_attn_varlen_func."""
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    k, v = _unstack_rows(kv, "kv", 2)
    out, lse = _varlen_attention(
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
        entry="dash_attn.flash_attn_varlen_kvpacked_func",
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)


def flash_attn_varlen_qkvpacked_func(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
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
    """flash_attn_varlen_func with q, k and v stacked as qkv (total, 3, heads, head_dim) and one offsets tensor for
    all three, in FA2's order. They are read as views, with no copy, and the gradient reaches qkv. As in FA2, the
    heads are the same for all three (no GQA). One offsets tensor is the self-attention promise, so
    schedule="auto" may pick shift."""
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    q, k, v = _unstack_rows(qkv, "qkv", 3)
    out, lse = _varlen_attention(
        q,
        k,
        v,
        cu_seqlens,
        cu_seqlens,
        max_seqlen,
        max_seqlen,
        softmax_scale=softmax_scale,
        causal=causal,
        window=window,
        softcap=cap,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        entry="dash_attn.flash_attn_varlen_qkvpacked_func",
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)


__all__ = ["flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func"]
