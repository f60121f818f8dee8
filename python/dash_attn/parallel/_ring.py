"""Ring (point-to-point) context-parallel attention, forward and backward, as one torch.autograd.Function.

Each of the P ranks of the group holds its query, key and value tokens (zigzag layout under the causal mask,
see _layout.py). In P steps the key/value shards travel the ring: at step s, rank r computes its queries against
the shard of rank (r - s) mod P while it already sends that shard to rank r + 1 and receives the next from
r - 1 (one isend/irecv pair per step, started before the step's compute so the transfer overlaps it).

Which block a step computes (_block): step 0 is the rank's own shard, the causal mask on the diagonal. Under the
causal mask with zigzag, a shard of an earlier rank (source < rank) is seen whole by all local queries, but only
its first chunk (its second one lies after both local chunks); a shard of a later rank is seen whole, with no
mask, by the second local chunk only (the first chunk lies before all of it). Without the mask every block is
full. So the local kernel only ever runs full attention or the causal mask with seqlen_q == seqlen_k.

Invariants (what makes the bits independent of timing):
- Forward: the partial (out, lse) are merged (LseMerge) in step order, the order the loop computes them, on each
  rank: sources r, r - 1, ..., r + 1 (mod P). A transfer's completion only unblocks the next step; it never
  chooses an order.
- Backward: the key/value shards travel the ring again, and with each one travels an accumulator of its dK/dV
  (fp32, or fp64 for fp64 inputs). The shard of rank j starts at j with j's contribution added to zeros; each
  following rank adds its contribution to the accumulator it received and passes it on, so dK/dV of shard j is
  (((c_j + c_{j+1}) + c_{j+2}) + ... + c_{j+P-1}) (ranks mod P), and the P-th transfer hands it back to j. dQ is
  summed locally in step order, in the same accumulator dtype.
- Every partial is rounded by the local kernel to the input dtype and widened exactly; each sum is rounded to
  the input dtype once, at the end. Nothing is reduced by the communication library (no all-reduce or
  reduce-scatter, whose order NCCL chooses): only data moves.
- The communication pattern is the same on every rank and every call: P - 1 key/value transfers in the forward,
  P - 1 key/value and P gradient transfers in the backward.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import Tensor

from ._local import LocalAttention, accumulator_dtype
from ._merge import LseMerge

_ALL = slice(None)


@dataclasses.dataclass(frozen=True)
class _Ring:
    """This rank's place in the ring: its index in the group, the group's size, the global ranks of its
    neighbours (point-to-point calls name global ranks)."""

    group: dist.ProcessGroup
    rank: int
    world_size: int
    next_peer: int
    previous_peer: int

    @classmethod
    def of(cls, group: dist.ProcessGroup) -> _Ring:
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        return cls(
            group=group,
            rank=rank,
            world_size=world_size,
            next_peer=dist.get_global_rank(group, (rank + 1) % world_size),
            previous_peer=dist.get_global_rank(group, (rank - 1) % world_size),
        )

    def source(self, step: int) -> int:
        """The rank whose key/value shard this rank holds at `step`."""
        return (self.rank - step) % self.world_size

    def start_shift(self, send: Tensor) -> _Transfer:
        """Starts sending `send` to the next rank and receiving the previous rank's into a new tensor. Both go in
        one batch so that NCCL groups them: separate blocking-order sends around a ring would deadlock."""
        received = torch.empty_like(send)
        works = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, send, self.next_peer, self.group),
                dist.P2POp(dist.irecv, received, self.previous_peer, self.group),
            ]
        )
        return _Transfer(received, works)


@dataclasses.dataclass(frozen=True)
class _Transfer:
    """A shift in flight: the tensor being received, and the works of the send and the receive."""

    received: Tensor
    works: list[dist.Work]

    def wait(self) -> Tensor:
        """The received tensor, once both the send and the receive are done (the sent tensor may then be reused;
        on NCCL, the current stream waits for the transfer)."""
        for work in self.works:
            work.wait()
        return self.received


@dataclasses.dataclass(frozen=True)
class _Block:
    """The part of a step's attention that the mask leaves: local query rows, key/value rows, and whether the
    causal mask applies within it."""

    q_rows: slice
    kv_rows: slice
    causal: bool


def _block(causal: bool, step: int, source: int, rank: int, half: int) -> _Block:
    """The block of a step (module docstring); `half` is the length of one zigzag chunk."""
    if not causal:
        return _Block(_ALL, _ALL, causal=False)
    if step == 0:
        return _Block(_ALL, _ALL, causal=True)
    if source < rank:
        return _Block(_ALL, slice(0, half), causal=False)
    return _Block(slice(half, None), _ALL, causal=False)


class RingAttention(torch.autograd.Function):
    """out, lse = ring attention of the local shards; differentiable in q, k and v (not through lse)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        causal: bool,
        softmax_scale: float,
        group: dist.ProcessGroup,
        local: LocalAttention,
    ) -> tuple[Tensor, Tensor]:
        ring = _Ring.of(group)
        half = q.shape[1] // 2
        # Keys and values travel as one tensor: one transfer per step instead of two.
        kv = torch.stack((k, v))
        merge: LseMerge | None = None
        for step in range(ring.world_size):
            next_kv = ring.start_shift(kv) if step < ring.world_size - 1 else None
            block = _block(causal, step, ring.source(step), ring.rank, half)
            out_b, lse_b = local.forward(
                q[:, block.q_rows], kv[0][:, block.kv_rows], kv[1][:, block.kv_rows], block.causal, softmax_scale
            )
            if merge is None:
                merge = LseMerge(out_b, lse_b)  # step 0's block covers every local row
            else:
                merge.add(out_b, lse_b, block.q_rows)
            if next_kv is not None:
                kv = next_kv.wait()
        out_acc, lse = merge.result()
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.softmax_scale, ctx.group, ctx.local = causal, softmax_scale, group, local
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dout: Tensor | None, dlse: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        if dout is None:
            return (None,) * 7
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring.of(ctx.group)
        half = q.shape[1] // 2
        dtype = accumulator_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
        kv = torch.stack((k, v))
        incoming_dkv: _Transfer | None = None  # the accumulator of the next step's shard, from the previous rank
        for step in range(ring.world_size):
            next_kv = ring.start_shift(kv) if step < ring.world_size - 1 else None
            block = _block(ctx.causal, step, ring.source(step), ring.rank, half)
            rows = block.q_rows
            dq_b, dk_b, dv_b = ctx.local.backward(
                dout[:, rows],
                q[:, rows],
                kv[0][:, block.kv_rows],
                kv[1][:, block.kv_rows],
                out[:, rows],
                lse[:, :, rows],
                block.causal,
                ctx.softmax_scale,
            )
            dq[:, rows] += dq_b
            if incoming_dkv is None:
                dkv = torch.zeros(kv.shape, dtype=dtype, device=kv.device)  # step 0: this rank's own shard starts here
            else:
                dkv = incoming_dkv.wait()
            dkv[0][:, block.kv_rows] += dk_b
            dkv[1][:, block.kv_rows] += dv_b
            if ring.world_size > 1:
                incoming_dkv = ring.start_shift(dkv)
            if next_kv is not None:
                kv = next_kv.wait()
        if incoming_dkv is not None:
            dkv = incoming_dkv.wait()  # the last transfer brings this rank's own shard's accumulator home
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None
