"""attention_backward: DASH's backward as a function of its own, for callers that hold the forward's out and LSE
and need the gradients of one attention without autograd, such as ring attention (dash_attn.parallel), which runs
each block's backward on the output and LSE merged over all blocks.

Invariants:
- The gradients are those autograd computes through flash_attn_func for the same tensors, flags and schedule,
  bit for bit: the same kernels run on the same plans (with out and lse from that forward).
- Checks run in Python before any CUDA call, naming the argument, as in the other entry points; the determinism
  switch refuses deterministic=False outright under torch.use_deterministic_algorithms(True), since this call runs
  the nondeterministic schedule rather than recording it.
- The result is not differentiable: the backward has no backward of its own.
"""

from __future__ import annotations

from torch import Tensor

from . import _ops
from ._arguments import BSHD, check_backward_call, check_flags, check_tensors, resolve_softcap, resolve_window


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
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of attention(q, k, v) for upstream gradient dout, given the forward's out (B, Sq, Hq, D) and fp32
    lse (B, Hq, Sq), as flash_attn_func(..., return_lse=True) returns them. The arguments mean what they mean in
    flash_attn_func (window_size and softcap must be the forward's); the tensors are (batch, seqlen, heads,
    head_dim), GQA by fewer key/value heads."""
    check_tensors((q, k, v), BSHD)
    check_flags(causal=causal, deterministic=deterministic)
    (left, right), cap = resolve_window(window_size), resolve_softcap(softcap)
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
    )
    return _ops.attention_backward(dout, q, k, v, out, lse, scale, causal, resolved, margin, left, right, cap)
