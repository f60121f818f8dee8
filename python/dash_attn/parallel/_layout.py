"""How a sequence is split over the ranks of a group: the layouts "zigzag" and "contiguous", and the functions
that shard a full sequence and gather it back.

- "contiguous": rank r holds tokens [r * s, (r + 1) * s) of a sequence of world_size * s tokens.
- "zigzag": the sequence is cut into 2 * world_size equal chunks, and rank r holds chunk r followed by chunk
  2 * world_size - 1 - r. Under the causal mask every rank then has the same amount of work in ring attention
  (an early chunk, which sees few keys, paired with a late one, which sees many), and each rank's tokens stay in
  increasing position order, so a causal mask on the local tokens is the global one restricted to them.

Invariant: gather_sequence(layout, [shard_sequence(x, r, P, layout) for r in range(P)]) == x, for both layouts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout: object) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}; got {layout!r}")
    return layout


def _pieces(layout: str, world_size: int) -> int:
    """Equal pieces the sequence is cut into: two per rank for zigzag, one for contiguous."""
    return 2 * world_size if layout == "zigzag" else world_size


def _check_divisible(seqlen: int, layout: str, world_size: int) -> None:
    pieces = _pieces(layout, world_size)
    if seqlen % pieces:
        raise ValueError(
            f"the {layout} layout over {world_size} ranks cuts the sequence into {pieces} equal pieces; "
            f"seqlen {seqlen} is not a multiple of {pieces}"
        )


def shard_sequence(x: Tensor, rank: int, world_size: int, layout: str = "zigzag", dim: int = 1) -> Tensor:
    """Rank `rank`'s shard of the full sequence `x` (sequence along `dim`) in `layout`: a view for contiguous,
    a new tensor for zigzag."""
    check_layout(layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must satisfy 0 <= rank < world_size = {world_size}, got {rank}")
    _check_divisible(x.shape[dim], layout, world_size)
    chunks = x.chunk(_pieces(layout, world_size), dim=dim)
    if layout == "contiguous":
        return chunks[rank]
    return torch.cat((chunks[rank], chunks[2 * world_size - 1 - rank]), dim=dim)


def gather_sequence(shards: Sequence[Tensor], layout: str = "zigzag", dim: int = 1) -> Tensor:
    """The full sequence from the shards of every rank, in rank order: the inverse of shard_sequence."""
    check_layout(layout)
    if layout == "contiguous":
        return torch.cat(tuple(shards), dim=dim)
    world_size = len(shards)
    halves = [shard.chunk(2, dim=dim) for shard in shards]
    ordered = [halves[r][0] for r in range(world_size)] + [halves[r][1] for r in reversed(range(world_size))]
    return torch.cat(ordered, dim=dim)


def natural_order(seqlen: int, world_size: int, layout: str, device: torch.device) -> Tensor | None:
    """For a sequence gathered as the ranks' shards concatenated in rank order (what an all-to-all over the
    sequence gives), the indices that put it in position order; None when it already is (contiguous)."""
    if layout == "contiguous":
        return None
    _check_divisible(seqlen, layout, world_size)
    chunk = seqlen // (2 * world_size)
    # Position chunk m sits at concatenated chunk 2m (first half of rank m) for m < world_size, and at
    # 2 * (2 * world_size - 1 - m) + 1 (second half of rank 2 * world_size - 1 - m) otherwise.
    starts = [2 * m if m < world_size else 2 * (2 * world_size - 1 - m) + 1 for m in range(2 * world_size)]
    within = torch.arange(chunk, device=device)
    return torch.cat([start * chunk + within for start in starts])
