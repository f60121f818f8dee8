"""dash_attn.parallel: deterministic context-parallel attention over a torch.distributed process group (NCCL on
GPUs, gloo on the CPU), forward and backward, in two modes:

- ring: K/V shards travel the ring of ranks, each transfer overlapped with the previous step's compute; zigzag
  load balancing under the causal mask; partial outputs merged through the LSE in step order; dK/dV partials
  travel the ring and are summed in ring order.
- ulysses: all-to-all exchanges trade sequence for heads, the local kernel runs on the whole sequence with
  heads / P heads, and an all-to-all trades back; GQA by splitting or repeating key/value heads.

Packed batches (cu_seqlens) are sharded per sequence, each in the zigzag (or contiguous) layout; sliding windows
(window_size) skip the ring blocks the window cannot see. The data moves through an injectable Transport:
torch.distributed on the tensors by default, or HostStagedTransport, which stages through host memory over gloo
so that several ranks can share one GPU.

The local kernel is injectable (LocalAttention): DASH's deterministic kernels by default (DashLocalAttention),
the pure-torch TorchLocalAttention as a reference, FlashAttention-3's kernels for comparison
(FlashAttention3LocalAttention). All sums are in fp32 (fp64 for fp64 inputs) in orders fixed by
the program, never by arrival times, and the collectives only move data, so the results are bitwise reproducible
for the same world size, mode, layout and schedule; docs/CONTEXT_PARALLEL.md says what else must match and why
other world sizes give other bits.

Usage, on each rank:
    q_local = shard_sequence(q, rank, world_size)  # zigzag layout, likewise k, v
    out_local = context_parallel_attn_func(q_local, k_local, v_local, causal=True, mode="ring", sm_margin=8)
    # packed: q_local = shard_packed(q, cu_seqlens, rank, world_size), likewise k, v, input_ids, labels, ...
    out_local = context_parallel_attn_func(q_local, k_local, v_local, cu_seqlens=cu_seqlens, causal=True)
"""

from ._api import MODES, context_parallel_attn_func
from ._layout import LAYOUTS, gather_packed, gather_sequence, local_cu_seqlens, shard_packed, shard_sequence
from ._local import (
    DashLocalAttention,
    FlashAttention3LocalAttention,
    LocalAttention,
    TorchLocalAttention,
    accumulator_dtype,
)
from ._transport import HostStagedTransport, ProcessGroupTransport, Transport

__all__ = [
    "LAYOUTS",
    "MODES",
    "DashLocalAttention",
    "FlashAttention3LocalAttention",
    "HostStagedTransport",
    "LocalAttention",
    "ProcessGroupTransport",
    "TorchLocalAttention",
    "Transport",
    "accumulator_dtype",
    "context_parallel_attn_func",
    "gather_packed",
    "gather_sequence",
    "local_cu_seqlens",
    "shard_packed",
    "shard_sequence",
]
