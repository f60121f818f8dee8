"""attention_backward: DASH's backward as a function of its own, for callers that hold the forward's out and LSE
and need the gradients of one attention without autograd, such as ring attention (dash_attn.parallel), which runs
each block's backward on the output and LSE merged over all blocks. It takes dense (B, S, H, D) batches and, with
cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k, packed varlen batches (varlen.py's layout): one launch
for the whole packed batch.

Invariants:
- The gradients are those autograd computes through flash_attn_func (flash_attn_varlen_func for a packed batch)
  for the same tensors, flags, offsets, maxima and schedule, bit for bit: the same kernels run on the same plans
  (with out and lse from that forward). Passing one tensor as cu_seqlens_q and cu_seqlens_k makes the same promise
  (seqlen_k <= seqlen_q per sequence) as it does to flash_attn_varlen_func.
- The four varlen arguments come together or not at all; a partial set is refused by name, never read as a dense
  call. A packed batch gets varlen.py's checks of its tensors, offsets and maxima.
- Checks run in Python before any CUDA call, naming the argument, as in the other entry points; the determinism
  switch refuses deterministic=False outright under torch.use_deterministic_algorithms(True), since this call runs
  the nondeterministic schedule rather than recording it.
- The result is not differentiable: the backward has no backward of its own.
"""

from __future__ import annotations

from torch import Tensor

from . import _ops
from ._arguments import BSHD, check_backward_call, check_flags, check_tensors, resolve_softcap, resolve_window
from .varlen import _check_cu_seqlens, _check_max_seqlen, _check_packed, _same_offsets

_VARLEN_ARGUMENTS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def _check_varlen_arguments_together(given: dict[str, object]) -> None:
    """Raises ValueError naming the varlen arguments given and those missing unless all four or none are given."""
    passed = [name for name in _VARLEN_ARGUMENTS if given[name] is not None]
    if passed and len(passed) != len(_VARLEN_ARGUMENTS):
        missing = [name for name in _VARLEN_ARGUMENTS if given[name] is None]
        raise ValueError(
            f"cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k come together (a packed varlen batch) or "
            f"not at all (a dense one): got {', '.join(passed)} without {', '.join(missing)}"
        )


def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool = True,
    schedule: str = "auto",
    sm_margin: int = 0,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of attention(q, k, v) for upstream gradient dout, given the forward's out (B, Sq, Hq, D) and fp32
    lse (B, Hq, Sq), as flash_attn_func(..., return_lse=True) returns them. The arguments mean what they mean in
    flash_attn_func (window_size and softcap must be the forward's); the tensors are (batch, seqlen, heads,
    head_dim), GQA by fewer key/value heads.

    A packed varlen batch passes cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k (all four, as
    flash_attn_varlen_func takes them): q, dout and out are then (total_q, heads_q, head_dim), k and v (total_k,
    heads_kv, head_dim), and lse the fp32 (heads_q, total_q) that flash_attn_varlen_func(..., return_lse=True)
    returns. Each sequence gets its own mask, one launch covers them all, and the offsets stay on the device. One
    tensor passed as both cu_seqlens promises seqlen_k <= seqlen_q per sequence (admitting the shift schedules),
    as in flash_attn_varlen_func. Rows no sequence holds, and the key rows of a sequence without queries, get zero
    gradients."""
    if cu_seqlens_q is None and cu_seqlens_k is None and max_seqlen_q is None and max_seqlen_k is None:
        offsets = None
        check_tensors((q, k, v), BSHD)
    else:
        _check_varlen_arguments_together(
            {
                "cu_seqlens_q": cu_seqlens_q,
                "cu_seqlens_k": cu_seqlens_k,
                "max_seqlen_q": max_seqlen_q,
                "max_seqlen_k": max_seqlen_k,
            }
        )
        offsets = (cu_seqlens_q, cu_seqlens_k)
        _check_packed((q, k, v))
        _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
        max_q = _check_max_seqlen(max_seqlen_q, "max_seqlen_q")
        max_k = _check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    check_flags(causal=causal, deterministic=deterministic)
    (left, right), cap = resolve_window(window_size), resolve_softcap(softcap)
    # Called from here directly in both cases: the determinism switch's warning points at this function's caller.
    scale, resolved, margin = check_backward_call(
        dout,
        q,
        k,
        v,
        out,
        lse,
        softmax_scale=softmax_scale,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        entry="attention_backward",
        offsets=offsets,
    )
    arguments = (scale, causal, resolved, margin, left, right, cap)
    if offsets is None:
        return _ops.attention_backward(dout, q, k, v, out, lse, *arguments)
    promise = _same_offsets(cu_seqlens_q, cu_seqlens_k)
    return _ops.attention_backward(
        dout, q, k, v, out, lse, *arguments, cu_seqlens_q, cu_seqlens_k, max_q, max_k, promise
    )
