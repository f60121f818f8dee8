"""context_parallel_attn_func: attention over a sequence sharded across the ranks of a torch.distributed process
group, in ring mode (_ring.py) or all-to-all mode (_ulysses.py), on an injectable local kernel (_local.py), with an
injectable transport (_transport.py); dense batches, or packed ones (cu_seqlens) sharded per sequence.

Invariants:
- Every check that needs no process group runs first, so a bad call fails the same way with or without one, and
  before any rank has sent anything.
- schedule, deterministic and sm_margin configure DASH's kernel; with an injected local kernel they must stay at
  their defaults (an option is never silently ignored): configure the kernel object instead.
- torch.use_deterministic_algorithms(True) refuses, and warn_only warns about, a call that records a backward on
  a local kernel that is not deterministic, as flash_attn_func does.
- What is bitwise reproducible: the same world size, mode, layout, shapes (and cu_seqlens), dtypes, mask and
  window, local kernel and schedule (and sm_margin for the static schedules) on the same GPUs and software,
  whatever the transport. Not across world sizes: docs/CONTEXT_PARALLEL.md says why.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .._arguments import SUPPORTED_DTYPES, _checked_real, check_flags, resolve_scale, resolve_window
from .._library import HEAD_DIMS
from ._layout import check_cu_seqlens, check_layout
from ._local import NO_WINDOW, DashLocalAttention, FlashAttention3LocalAttention, LocalAttention
from ._ring import Geometry as RingGeometry
from ._ring import RingAttention
from ._transport import ProcessGroupTransport, Transport
from ._ulysses import Geometry as UlyssesGeometry
from ._ulysses import UlyssesAttention, check_heads

MODES = ("ring", "ulysses")


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, packed: bool) -> None:
    dims, layout = (3, "(total_tokens, heads, head_dim)") if packed else (4, "(batch, seqlen, heads, head_dim)")
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims:
            given = "with cu_seqlens" if packed else "without cu_seqlens"
            raise ValueError(f"{name} must be {dims}-D {layout} {given}, got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    tokens = q.shape[:-2]
    if k.shape[:-2] != tokens or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k must match q in its tokens (each rank holds the same tokens of q, k and v) and head_dim: "
            f"q is {tuple(q.shape)}, k is {tuple(k.shape)}"
        )
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    if heads_q < 1 or heads_kv < 1:
        raise ValueError(f"q and k must have at least one head, got q.shape {tuple(q.shape)}, k.shape {tuple(k.shape)}")
    if heads_q % heads_kv:
        raise ValueError(f"q's heads ({heads_q}) must be a multiple of k's and v's heads ({heads_kv})")
    # A kernel reads k and v in q's dtype, on q's device: DASH's would reinterpret the bits of another dtype.
    for t, name in ((k, "k"), (v, "v")):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must equal q.dtype ({q.dtype})")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all three must be on one device")


def _check_local_options(local: LocalAttention, q: Tensor, packed: bool, window: tuple[int, int]) -> None:
    if isinstance(local, DashLocalAttention):
        # What flash_attn_func checks; DASH's local kernel is called below those checks.
        if q.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"q.dtype must be torch.bfloat16 or torch.float16 for DASH's kernel (DashLocalAttention), got "
                f"{q.dtype}; TorchLocalAttention takes any dtype"
            )
        if q.shape[-1] not in HEAD_DIMS:
            raise ValueError(f"head_dim (q.shape[-1]) must be one of {HEAD_DIMS} for DASH's kernel, got {q.shape[-1]}")
        if q.device.type != "cuda":
            raise ValueError(
                f"q, k and v must be CUDA tensors for DASH's kernel (DashLocalAttention), got device {q.device}; "
                f"TorchLocalAttention runs on any device"
            )
    if isinstance(local, FlashAttention3LocalAttention) and (packed or window != NO_WINDOW):
        raise NotImplementedError(
            "FlashAttention3LocalAttention takes neither cu_seqlens nor window_size; use DASH's kernel "
            "(DashLocalAttention) for packed batches and sliding windows"
        )


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


def _resolve_scale(softmax_scale: object, local: LocalAttention, head_dim: int) -> float:
    """head_dim ** -0.5 for None; otherwise a real number, finite and > 0, as flash_attn_func takes it (and, for the
    kernels that compute in float32, DASH's and FlashAttention-3's, a normal float32)."""
    if isinstance(local, (DashLocalAttention, FlashAttention3LocalAttention)):
        return resolve_scale(softmax_scale, head_dim, "softmax_scale")
    if softmax_scale is None:
        return head_dim**-0.5
    return _checked_real(softmax_scale, "softmax_scale", "a real number (finite and > 0)", "finite and > 0")


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
    window_size: tuple[int, int] = (-1, -1),
    cu_seqlens: Tensor | Sequence[int] | None = None,
    layout: str = "zigzag",
    deterministic: bool = True,
    schedule: str = "auto",
    sm_margin: int = 0,
    local_attention: LocalAttention | None = None,
    transport: Transport | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of the whole sequence, of which each rank of `group` (default: the world) passes its shard:
    q (batch, s, heads_q, head_dim), k and v (batch, s, heads_kv, head_dim) with heads_q a multiple of heads_kv
    (GQA), s the same on every rank, the shards laid out as `layout` says (shard_sequence makes them). Returns
    this rank's shard of out, and with return_lse=True also its LSE (batch, heads_q, s), fp32 (fp64 for fp64
    inputs), which carries no gradient. Differentiable in q, k and v.

    Packed batches: with cu_seqlens, the offsets of the WHOLE packed batch (the same on every rank; an integer
    tensor, copied to the host if on a GPU, or a sequence of ints), q is (total / P, heads_q, head_dim) and k, v
    (total / P, heads_kv, head_dim): this rank's share of every sequence, as shard_packed makes it. Every
    sequence's length must be a multiple of 2P (zigzag) or P (contiguous); pad the sequences otherwise. The LSE
    is then (heads_q, total / P).

    window_size = (left, right) is flash_attn_func's sliding window over global positions (per sequence when
    packed): query i sees key j iff i - left <= j <= i + right, -1 leaving a side open, causal making right 0.
    Ring mode computes only the blocks the window reaches.

    mode="ring": K/V shards travel the ring, overlapped with compute; causal=True needs layout="zigzag" (load
    balance) and an even s. mode="ulysses" (all-to-all): heads_q must be a multiple of the group size, and
    heads_kv a multiple or a divisor of it (repeated then); either layout.

    The local kernel is DASH (DashLocalAttention(schedule, deterministic, sm_margin)) unless `local_attention`
    is given. sm_margin leaves that many SMs free for the communication kernels that run during the kernels.
    transport moves the data (default ProcessGroupTransport: torch.distributed on the tensors where they are;
    HostStagedTransport lets ranks over gloo share one GPU)."""
    check_flags(causal=causal, deterministic=deterministic, return_lse=return_lse)
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
    check_layout(layout)
    window = resolve_window(window_size)
    packed = cu_seqlens is not None
    _check_shapes(q, k, v, packed)
    if mode == "ring" and causal and layout != "zigzag":
        raise ValueError('ring mode with causal=True needs layout="zigzag" (see dash_attn.parallel.shard_sequence)')
    local = _resolve_local(local_attention, deterministic, schedule, sm_margin)
    scale = _resolve_scale(softmax_scale, local, q.shape[-1])
    _check_local_options(local, q, packed, window)
    _check_determinism_switch(local, (q, k, v))
    transport = ProcessGroupTransport() if transport is None else transport

    group = dist.group.WORLD if group is None else group
    world_size = dist.get_world_size(group)
    offsets = check_cu_seqlens(cu_seqlens, world_size, layout) if packed else None
    if packed and offsets[-1] != q.shape[0] * world_size:
        raise ValueError(
            f"cu_seqlens describes the whole packed batch ({offsets[-1]} tokens), so each of the {world_size} ranks "
            f"must pass {offsets[-1]} / {world_size} tokens; q has {q.shape[0]}"
        )
    if mode == "ring":
        if not packed and layout == "zigzag" and (causal or window != NO_WINDOW) and world_size > 1 and q.shape[1] % 2:
            raise ValueError(f"ring mode splits each zigzag shard into two chunks; s = {q.shape[1]} is odd")
        local_offsets = tuple(o // world_size for o in offsets) if packed else None
        geometry = RingGeometry(layout, causal, window, local_offsets)
        out, lse = RingAttention.apply(q, k, v, geometry, scale, group, local, transport)
    else:
        check_heads(q.shape[-2], k.shape[-2], world_size)
        geometry = UlyssesGeometry(layout, causal, window, offsets)
        out, lse = UlyssesAttention.apply(q, k, v, geometry, scale, group, local, transport)
    return (out, lse) if return_lse else out
