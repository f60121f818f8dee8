"""context_parallel_attn_func: attention over a sequence sharded across the ranks of a torch.distributed process
group, in ring mode (_ring.py) or all-to-all mode (_ulysses.py), on an injectable local kernel (_local.py).

Invariants:
- Every check that needs no process group runs first, so a bad call fails the same way with or without one.
- schedule, deterministic and sm_margin configure DASH's kernel; with an injected local kernel they must stay at
  their defaults (an option is never silently ignored): configure the kernel object instead.
- torch.use_deterministic_algorithms(True) refuses, and warn_only warns about, a call that records a backward on
  a local kernel that is not deterministic, as flash_attn_func does.
- What is bitwise reproducible: the same world size, mode, layout, shapes, dtypes, local kernel and schedule
  (and sm_margin for the static schedules) on the same GPUs and software. Not across world sizes:
  docs/CONTEXT_PARALLEL.md says why.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import Tensor

from .._arguments import check_flags
from ._layout import check_layout
from ._local import DashLocalAttention, LocalAttention
from ._ring import RingAttention
from ._ulysses import UlyssesAttention, check_heads

MODES = ("ring", "ulysses")


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, seqlen, heads_q, head_dim = q.shape
    if (k.shape[0], k.shape[1], k.shape[3]) != (batch, seqlen, head_dim):
        raise ValueError(
            f"k must match q in batch, seqlen (each rank holds the same tokens of q, k and v) and head_dim: "
            f"q is {tuple(q.shape)}, k is {tuple(k.shape)}"
        )
    if heads_q % k.shape[2]:
        raise ValueError(f"q's heads ({heads_q}) must be a multiple of k's and v's heads ({k.shape[2]})")


def _resolve_local(
    local_attention: LocalAttention | None, deterministic: bool, schedule: str, sm_margin: int
) -> LocalAttention:
    if local_attention is None:
        return DashLocalAttention(schedule=schedule, deterministic=deterministic, sm_margin=sm_margin)
    if (deterministic, schedule, sm_margin) != (True, "auto", 0):
        raise ValueError(
            "deterministic, schedule and sm_margin configure DASH's kernel; with local_attention given, leave them "
            "at their defaults and configure the kernel (e.g. DashLocalAttention(schedule=..., sm_margin=...))"
        )
    return local_attention


def _check_determinism_switch(local: LocalAttention, tensors: tuple[Tensor, Tensor, Tensor]) -> None:
    if local.deterministic or not torch.are_deterministic_algorithms_enabled():
        return
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return
    message = (
        "context_parallel_attn_func runs a local attention kernel whose backward is not deterministic (e.g. "
        "deterministic=False), but torch.use_deterministic_algorithms(True) is set"
    )
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, UserWarning, stacklevel=3)
    else:
        raise RuntimeError(message)


def context_parallel_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    mode: str = "ring",
    causal: bool = False,
    softmax_scale: float | None = None,
    layout: str = "zigzag",
    deterministic: bool = True,
    schedule: str = "auto",
    sm_margin: int = 0,
    local_attention: LocalAttention | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of the whole sequence, of which each rank of `group` (default: the world) passes its shard:
    q (batch, s, heads_q, head_dim), k and v (batch, s, heads_kv, head_dim) with heads_q a multiple of heads_kv
    (GQA), s the same on every rank, the shards laid out as `layout` says (shard_sequence makes them). Returns
    this rank's shard of out, and with return_lse=True also its LSE (batch, heads_q, s), fp32 (fp64 for fp64
    inputs), which carries no gradient. Differentiable in q, k and v.

    mode="ring": K/V shards travel the ring, overlapped with compute; causal=True needs layout="zigzag" (load
    balance) and an even s. mode="ulysses" (all-to-all): heads_q must be a multiple of the group size, and
    heads_kv a multiple or a divisor of it (repeated then); either layout.

    The local kernel is DASH (DashLocalAttention(schedule, deterministic, sm_margin)) unless `local_attention`
    is given. sm_margin leaves that many SMs free for the communication kernels that run during the kernels."""
    check_flags(causal=causal, deterministic=deterministic, return_lse=return_lse)
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
    check_layout(layout)
    _check_shapes(q, k, v)
    if mode == "ring" and causal and layout != "zigzag":
        raise ValueError('ring mode with causal=True needs layout="zigzag" (see dash_attn.parallel.shard_sequence)')
    local = _resolve_local(local_attention, deterministic, schedule, sm_margin)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    _check_determinism_switch(local, (q, k, v))

    group = dist.group.WORLD if group is None else group
    world_size = dist.get_world_size(group)
    if mode == "ring":
        if causal and world_size > 1 and q.shape[1] % 2:
            raise ValueError(f"causal ring mode splits each shard into two zigzag chunks; s = {q.shape[1]} is odd")
        out, lse = RingAttention.apply(q, k, v, causal, scale, group, local)
    else:
        check_heads(q.shape[2], k.shape[2], world_size)
        out, lse = UlyssesAttention.apply(q, k, v, causal, scale, group, local, layout)
    return (out, lse) if return_lse else out
