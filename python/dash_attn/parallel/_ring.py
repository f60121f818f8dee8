"""Ring (point-to-point) context-parallel attention, forward and backward, as one torch.autograd.Function.

Each of the P ranks of the group holds its query, key and value tokens (zigzag layout under the causal mask,
see _layout.py), as a dense batch (batch, s, heads, head_dim) or a packed one (total, heads, head_dim) with every
sequence sharded on its own. In P steps the key/value shards travel the ring: at step s, rank r computes its
queries against the shard of rank (r - s) mod P while it already sends that shard to rank r + 1 and receives the
next from r - 1 (one shift of the transport per step, started before the step's compute so the transfer
overlaps it). What a step computes is planned by _plan.py: one local-kernel call per step without a window
(the coarse blocks), and under a sliding window only the pairs of chunks the window reaches, each trimmed and
with its window moved to the pair's offsets; a step the window cannot see makes no call (the shards still
travel, since later steps need them).

Invariants (what makes the bits independent of timing):
- Forward: the partial (out, lse) are merged (LseMerge) in step order and, within a step, in the plan's call
  order, on each rank: sources r, r - 1, ..., r + 1 (mod P). A transfer's completion only unblocks the next
  step; it never chooses an order.
- Backward: the key/value shards travel the ring again, and with each one travels an accumulator of its dK/dV
  (fp32, or fp64 for fp64 inputs). The shard of rank j starts at j with j's contribution added to zeros; each
  following rank adds its contribution to the accumulator it received and passes it on, so dK/dV of shard j is
  (((c_j + c_{j+1}) + c_{j+2}) + ... + c_{j+P-1}) (ranks mod P, each c in call order), and the P-th transfer
  hands it back to j. dQ is summed locally in step and call order, in the same accumulator dtype.
- The forward's partial outs arrive in fp32 from DASH's local kernel (another kernel's in the input dtype, widened
  exactly); every gradient partial is rounded by the local kernel to the input dtype and widened exactly; the
  merged out and each gradient sum are rounded to the input dtype once, at the end. Nothing is reduced by the
  communication library (no all-reduce or reduce-scatter, whose order NCCL chooses): only data moves.
- The communication pattern is the same on every rank and every call: P - 1 key/value transfers in the forward,
  P - 1 key/value and P gradient transfers in the backward.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import Tensor

from ._local import LocalAttention, Window, accumulator_dtype
from ._merge import LseMerge
from ._plan import Call, dense_calls, packed_calls
from ._transport import Pending, Transport


@dataclasses.dataclass(frozen=True)
class _Ring:
    """This rank's place in the ring: its index in the group, the group's size, the global ranks of its
    neighbours (point-to-point calls name global ranks), and the transport that carries the shifts."""

    group: dist.ProcessGroup
    rank: int
    world_size: int
    next_peer: int
    previous_peer: int
    transport: Transport

    @classmethod
    def of(cls, group: dist.ProcessGroup, transport: Transport) -> _Ring:
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        return cls(
            group=group,
            rank=rank,
            world_size=world_size,
            next_peer=dist.get_global_rank(group, (rank + 1) % world_size),
            previous_peer=dist.get_global_rank(group, (rank - 1) % world_size),
            transport=transport,
        )

    def start_shift(self, send: Tensor) -> Pending:
        """Starts sending `send` to the next rank and receiving the previous rank's."""
        return self.transport.start_shift(send, self.group, self.next_peer, self.previous_peer)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """What the plan needs besides the ranks: the layout, the mask, and for a packed batch the local offsets of
    its sequences (identical on every rank); None for a dense batch."""

    layout: str
    causal: bool
    window: Window
    local_offsets: tuple[int, ...] | None

    def plan(self, ring: _Ring, seqlen: int, device: torch.device) -> list[list[Call]]:
        """The calls of every step on this rank."""
        args = (self.layout, self.causal, self.window)
        if self.local_offsets is None:
            return [dense_calls(*args, step, ring.rank, ring.world_size, seqlen) for step in range(ring.world_size)]
        return [
            packed_calls(*args, step, ring.rank, ring.world_size, self.local_offsets, device)
            for step in range(ring.world_size)
        ]


def _forward_call(local: LocalAttention, call: Call, q: Tensor, kv: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """A call's (out, lse) as (batch, rows, heads, dim) and (batch, heads, rows); packed tensors are a batch of
    one."""
    q_b, k_b, v_b = q[:, call.q_rows], kv[0][:, call.kv_rows], kv[1][:, call.kv_rows]
    if call.offsets_q is None:
        return local.forward(q_b, k_b, v_b, call.causal, scale, call.window)
    out, lse = local.forward_varlen(
        q_b[0], k_b[0], v_b[0], call.offsets_q, call.offsets_kv, call.causal, scale, call.window
    )
    return out[None], lse[None]


def _backward_call(
    local: LocalAttention, call: Call, dout: Tensor, q: Tensor, kv: Tensor, out: Tensor, lse: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    rows = call.q_rows
    tensors = (dout[:, rows], q[:, rows], kv[0][:, call.kv_rows], kv[1][:, call.kv_rows], out[:, rows])
    if call.offsets_q is None:
        return local.backward(*tensors, lse[:, :, rows], call.causal, scale, call.window)
    grads = local.backward_varlen(
        *(t[0] for t in tensors),
        lse[0][:, rows],
        call.offsets_q,
        call.offsets_kv,
        call.causal,
        scale,
        call.window,
    )
    return tuple(g[None] for g in grads)


class RingAttention(torch.autograd.Function):
    """out, lse = ring attention of the local shards; differentiable in q, k and v (not through lse). Dense
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
        ring = _Ring.of(group, transport)
        packed = geometry.local_offsets is not None
        q4, k4, v4 = (t[None] for t in (q, k, v)) if packed else (q, k, v)
        plan = geometry.plan(ring, q4.shape[1], q.device)
        # Keys and values travel as one tensor: one transfer per step instead of two.
        kv = torch.stack((k4, v4))
        merge = LseMerge(q4, accumulator_dtype(q.dtype))
        for step in range(ring.world_size):
            next_kv = ring.start_shift(kv) if step < ring.world_size - 1 else None
            for call in plan[step]:
                merge.add(*_forward_call(local, call, q4, kv, softmax_scale), call.q_rows)
            if next_kv is not None:
                kv = next_kv.wait()
        out_acc, lse = merge.result()
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q4, k4, v4, out, lse)
        ctx.plan, ctx.packed, ctx.softmax_scale = plan, packed, softmax_scale
        ctx.group, ctx.local, ctx.transport = group, local, transport
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
        q, k, v, out, lse = ctx.saved_tensors
        if ctx.packed:
            dout = dout[None]
        ring = _Ring.of(ctx.group, ctx.transport)
        dtype = accumulator_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
        kv = torch.stack((k, v))
        incoming_dkv: Pending | None = None  # the accumulator of the next step's shard, from the previous rank
        for step in range(ring.world_size):
            next_kv = ring.start_shift(kv) if step < ring.world_size - 1 else None
            plan = ctx.plan[step]
            grads = [_backward_call(ctx.local, call, dout, q, kv, out, lse, ctx.softmax_scale) for call in plan]
            if incoming_dkv is None:
                dkv = torch.zeros(kv.shape, dtype=dtype, device=kv.device)  # step 0: this rank's own shard starts here
            else:
                dkv = incoming_dkv.wait()
            for call, (dq_b, dk_b, dv_b) in zip(plan, grads):
                # A call's rows are distinct, so indexed rows are each added to once.
                dq[:, call.q_rows] += dq_b
                dkv[0][:, call.kv_rows] += dk_b
                dkv[1][:, call.kv_rows] += dv_b
            if ring.world_size > 1:
                incoming_dkv = ring.start_shift(dkv)
            if next_kv is not None:
                kv = next_kv.wait()
        if incoming_dkv is not None:
            dkv = incoming_dkv.wait()  # the last transfer brings this rank's own shard's accumulator home
        grads = dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
        if ctx.packed:
            grads = tuple(g[0] for g in grads)
        return (*grads, None, None, None, None, None)
