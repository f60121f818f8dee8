"""All-to-all (Ulysses) context-parallel attention, forward and backward, as one torch.autograd.Function.

Each of the P ranks holds a shard of the sequence with all heads. One all_to_all_single per tensor trades
sequence for heads: afterwards rank r holds the whole sequence for query heads [r * H / P, (r + 1) * H / P), runs
the local kernel once on it, and a second all-to-all trades back. The backward mirrors it: dout goes to the
head-sharded layout, the local kernel's backward runs on the saved full-sequence tensors, and the gradients come
back sequence-sharded.

Heads: H must be a multiple of P. For GQA, rank r needs the key/value heads of its query heads:
- heads_kv a multiple of P: rank r gets key/value heads [r * heads_kv / P, ...), exactly those of its query
  heads (the groups do not straddle ranks because H / heads_kv divides H / P).
- P a multiple of heads_kv (fewer key/value heads than ranks, MQA included): each key/value head is repeated
  P / heads_kv times before the exchange, so that every rank receives the one head its query heads use. The
  gradient of a repeated head comes back as P / heads_kv partials, summed in the accumulator dtype in replica
  order (the order of the ranks that computed them), then rounded once.
- Anything else is refused (check_heads): some rank's query heads would need parts of two key/value heads.

Packed batches (cu_seqlens) go the same way as a batch of one: after the exchange the rows are put in the whole
batch's order (each sequence in position order), the local kernel's varlen call runs once on every sequence, and
the rows go back before the second exchange. Sliding windows are the local kernel's: it sees whole sequences.

Invariants: only data moves through the collective (no reduction), the local kernel runs once per call on the
full sequence in position order (a zigzag layout is put in position order after the exchange and back before
it), so the bits are those of the local kernel plus, for repeated key/value heads, the fixed-order replica sum.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import Tensor

from ._layout import natural_order, packed_rows
from ._local import LocalAttention, Window, accumulator_dtype
from ._transport import Transport


def kv_replicas(heads_q: int, heads_kv: int, world_size: int) -> int:
    """How many times each key/value head is repeated before the exchange (1: the heads are split)."""
    check_heads(heads_q, heads_kv, world_size)
    return 1 if heads_kv % world_size == 0 else world_size // heads_kv


def check_heads(heads_q: int, heads_kv: int, world_size: int) -> None:
    """Raises ValueError unless all-to-all mode can split these heads over world_size ranks (module docstring)."""
    if heads_q % world_size:
        raise ValueError(
            f"all-to-all mode splits the query heads over the ranks: heads ({heads_q}) must be a multiple of the "
            f"group size ({world_size})"
        )
    if heads_kv % world_size and world_size % heads_kv:
        raise ValueError(
            f"all-to-all mode needs the key/value heads ({heads_kv}) to be a multiple of the group size "
            f"({world_size}), to be split, or a divisor of it, to be repeated"
        )


def _scatter_heads_gather_sequence(
    x: Tensor, group: dist.ProcessGroup, world_size: int, transport: Transport
) -> Tensor:
    """(batch, s, heads, dim) sharded by sequence -> (batch, world_size * s, heads / world_size, dim) sharded by
    heads; the sequence comes out as the ranks' shards concatenated in rank order."""
    batch, seqlen, heads, dim = x.shape
    send = x.reshape(batch, seqlen, world_size, heads // world_size, dim).permute(2, 0, 1, 3, 4).contiguous()
    received = torch.empty_like(send)
    transport.all_to_all(received, send, group)
    return received.permute(1, 0, 2, 3, 4).reshape(batch, world_size * seqlen, heads // world_size, dim)


def _scatter_sequence_gather_heads(
    x: Tensor, group: dist.ProcessGroup, world_size: int, transport: Transport
) -> Tensor:
    """The inverse of _scatter_heads_gather_sequence."""
    batch, seqlen, heads, dim = x.shape
    send = x.reshape(batch, world_size, seqlen // world_size, heads, dim).permute(1, 0, 2, 3, 4).contiguous()
    received = torch.empty_like(send)
    transport.all_to_all(received, send, group)
    return received.permute(1, 2, 0, 3, 4).reshape(batch, seqlen // world_size, world_size * heads, dim)


def _reorder(x: Tensor, order: Tensor | None) -> Tensor:
    return x if order is None else x.index_select(1, order)


def _sum_replicas(dx: Tensor, replicas: int, dtype: torch.dtype) -> Tensor:
    """(batch, s, heads_kv * replicas, dim) gradients of repeated heads -> (batch, s, heads_kv, dim), summed in
    `dtype` in replica order, then rounded."""
    if replicas == 1:
        return dx
    parts = dx.unflatten(2, (dx.shape[2] // replicas, replicas)).unbind(3)
    total = parts[0].to(dtype)
    for part in parts[1:]:
        total = total + part
    return total.to(dx.dtype)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The layout, the mask, and for a packed batch the global offsets of its sequences (None: dense)."""

    layout: str
    causal: bool
    window: Window
    offsets: tuple[int, ...] | None

    def order(self, seqlen: int, world_size: int, device: torch.device) -> Tensor | None:
        """The indices that put the gathered rows (the ranks' shards concatenated in rank order) in the whole
        batch's order; None when they already are."""
        if self.offsets is None:
            return natural_order(seqlen, world_size, self.layout, device)
        rows = torch.cat([packed_rows(self.offsets, r, world_size, self.layout) for r in range(world_size)])
        return torch.argsort(rows).to(device)


class UlyssesAttention(torch.autograd.Function):
    """out, lse = all-to-all attention of the local shards; differentiable in q, k and v (not through lse). Dense
    tensors are (batch, s, heads, dim) with lse (batch, heads, s); packed ones (total, heads, dim) with lse
    (heads, total)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        geometry: Geometry,
        softmax_scale: float,
        group: dist.ProcessGroup,
        local: LocalAttention,
        transport: Transport,
    ) -> tuple[Tensor, Tensor]:
        world_size = dist.get_world_size(group)
        packed = geometry.offsets is not None
        if packed:
            q, k, v = q[None], k[None], v[None]
        replicas = kv_replicas(q.shape[2], k.shape[2], world_size)
        if replicas > 1:
            k, v = k.repeat_interleave(replicas, dim=2), v.repeat_interleave(replicas, dim=2)
        order = geometry.order(q.shape[1] * world_size, world_size, q.device)
        q_full, k_full, v_full = (
            _reorder(_scatter_heads_gather_sequence(t, group, world_size, transport), order) for t in (q, k, v)
        )
        out_full, lse_full = _local_forward(local, geometry, q_full, k_full, v_full, softmax_scale)
        # The whole sequence's out, rounded once to the input dtype (DASH's local kernel hands it over in fp32): the
        # local kernel's own bits, and the out its backward is given, as on one GPU.
        out_full = out_full.to(q.dtype)
        inverse = None if order is None else torch.argsort(order)
        out = _scatter_sequence_gather_heads(_reorder(out_full, inverse), group, world_size, transport)
        # The LSE (batch, heads, seqlen) travels as a (batch, seqlen, heads, 1) tensor through the same exchange.
        lse_bshd = _reorder(lse_full.transpose(1, 2).unsqueeze(-1), inverse)
        lse = _scatter_sequence_gather_heads(lse_bshd, group, world_size, transport)
        lse = lse.squeeze(-1).transpose(1, 2).contiguous()
        ctx.save_for_backward(q_full, k_full, v_full, out_full, lse_full)
        ctx.order, ctx.inverse, ctx.replicas = order, inverse, replicas
        ctx.geometry, ctx.softmax_scale, ctx.group, ctx.local, ctx.transport = (
            geometry,
            softmax_scale,
            group,
            local,
            transport,
        )
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return (out[0], lse[0]) if packed else (out, lse)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dout: Tensor | None, dlse: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        if dout is None:
            return (None,) * 8
        q_full, k_full, v_full, out_full, lse_full = ctx.saved_tensors
        group, transport, packed = ctx.group, ctx.transport, ctx.geometry.offsets is not None
        world_size = dist.get_world_size(group)
        if packed:
            dout = dout[None]
        dout_full = _reorder(_scatter_heads_gather_sequence(dout, group, world_size, transport), ctx.order)
        grads_full = _local_backward(
            ctx.local, ctx.geometry, dout_full, q_full, k_full, v_full, out_full, lse_full, ctx.softmax_scale
        )
        dq, dk, dv = (
            _scatter_sequence_gather_heads(_reorder(g, ctx.inverse), group, world_size, transport) for g in grads_full
        )
        dtype = accumulator_dtype(dq.dtype)
        grads = dq, _sum_replicas(dk, ctx.replicas, dtype), _sum_replicas(dv, ctx.replicas, dtype)
        if packed:
            grads = tuple(g[0] for g in grads)
        return (*grads, *(None,) * 5)


def _local_forward(
    local: LocalAttention, geometry: Geometry, q: Tensor, k: Tensor, v: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """The local kernel on the whole sequences: dense, or packed as a batch of one."""
    if geometry.offsets is None:
        return local.forward(q, k, v, geometry.causal, scale, geometry.window)
    offsets = geometry.offsets
    out, lse = local.forward_varlen(q[0], k[0], v[0], offsets, offsets, geometry.causal, scale, geometry.window)
    return out[None], lse[None]


def _local_backward(
    local: LocalAttention,
    geometry: Geometry,
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    if geometry.offsets is None:
        return local.backward(dout, q, k, v, out, lse, geometry.causal, scale, geometry.window)
    offsets = geometry.offsets
    grads = local.backward_varlen(
        dout[0], q[0], k[0], v[0], out[0], lse[0], offsets, offsets, geometry.causal, scale, geometry.window
    )
    return tuple(g[None] for g in grads)
