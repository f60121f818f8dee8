"""How a sequence is split over the ranks of a group: the layouts "zigzag" and "contiguous", and the functions
that shard a full sequence and gather it back.

- "contiguous": rank r holds tokens [r * s, (r + 1) * s) of a sequence of world_size * s tokens.
- "zigzag": the sequence is cut into 2 * world_size equal chunks, and rank r holds chunk r followed by chunk
  2 * world_size - 1 - r. Under the causal mask every rank then has the same amount of work in ring attention
  (an early chunk, which sees few keys, paired with a late one, which sees many), and each rank's tokens stay in
  increasing position order, so a causal mask on the local tokens is the global one restricted to them.

Packed batches (cu_seqlens) are laid out per sequence: each sequence is cut as above (its length a multiple of 2P
for zigzag, of P for contiguous) and rank r holds its share of every sequence, in sequence order. So every rank
holds the same number of tokens of each sequence, its local cu_seqlens are the global ones divided by P, and
zigzag keeps the causal work balanced within each sequence.

Invariants: gather_sequence([shard_sequence(x, r, P, layout) for r in range(P)], layout) == x, and likewise
gather_packed of shard_packed, for both layouts.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from ._plan import segments

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
    _check_world_size(world_size)
    _check_rank(rank, world_size)
    _check_divisible(x.shape[dim], layout, world_size)
    chunks = x.chunk(_pieces(layout, world_size), dim=dim)
    if layout == "contiguous":
        return chunks[rank]
    return torch.cat((chunks[rank], chunks[2 * world_size - 1 - rank]), dim=dim)


def gather_sequence(shards: Sequence[Tensor], layout: str = "zigzag", dim: int = 1) -> Tensor:
    """The full sequence from the shards of every rank, in rank order: the inverse of shard_sequence."""
    check_layout(layout)
    _check_shards(shards)
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


def check_cu_seqlens(cu_seqlens: object, world_size: int, layout: str, name: str = "cu_seqlens") -> tuple[int, ...]:
    """The offsets of a packed batch as host ints, after checking them: a 1-D integer tensor (any device; a CUDA
    tensor is copied to the host) or a sequence of ints, starting at 0, non-decreasing, each sequence's length a
    multiple of the pieces the layout cuts it into. Raises TypeError or ValueError naming `name` and the rule."""
    if isinstance(cu_seqlens, Tensor):
        # A bool tensor is no offsets: its True and False would read as 1 and 0.
        if (
            cu_seqlens.dim() != 1
            or cu_seqlens.dtype.is_floating_point
            or cu_seqlens.dtype.is_complex
            or cu_seqlens.dtype == torch.bool
        ):
            raise TypeError(f"{name} must be a 1-D integer tensor or a sequence of ints, got {cu_seqlens!r}")
        offsets = tuple(int(x) for x in cu_seqlens.tolist())
    elif isinstance(cu_seqlens, Sequence) and all(
        isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in cu_seqlens
    ):
        offsets = tuple(int(x) for x in cu_seqlens)
    else:
        raise TypeError(f"{name} must be a 1-D integer tensor or a sequence of ints, got {type(cu_seqlens).__name__}")
    if len(offsets) < 2 or offsets[0] != 0:
        raise ValueError(f"{name} must hold 0 and then each sequence's end (at least 2 offsets), got {offsets}")
    pieces = _pieces(layout, world_size)
    for b in range(len(offsets) - 1):
        length = offsets[b + 1] - offsets[b]
        if length < 0:
            raise ValueError(f"{name} must be non-decreasing; sequence {b} has length {length}")
        if length % pieces:
            raise ValueError(
                f"the {layout} layout over {world_size} ranks cuts every sequence into {pieces} equal pieces; "
                f"{name} gives sequence {b} length {length}, not a multiple of {pieces} (pad it)"
            )
    return offsets


def packed_rows(offsets: Sequence[int], rank: int, world_size: int, layout: str) -> Tensor:
    """The rows of the whole packed batch (global offsets `offsets`) that `rank` holds, in its local order."""
    rows = []
    for b in range(len(offsets) - 1):
        shard = (offsets[b + 1] - offsets[b]) // world_size
        for segment in segments(layout, rank, world_size, shard):
            start = offsets[b] + segment.start
            rows.append(torch.arange(start, start + segment.length))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)


def _check_world_size(world_size: object) -> None:
    """world_size must be an int >= 1: 0 would divide by zero, a bool or a float would index or divide wrongly."""
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise TypeError(f"world_size must be an int >= 1, got {type(world_size).__name__} {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size}")


def _check_shards(shards: object) -> None:
    """The shards of every rank: a sequence of at least one tensor (one per rank)."""
    if not isinstance(shards, Sequence) or isinstance(shards, (str, Tensor)):
        raise TypeError(f"shards must be a sequence of tensors, one per rank in order, got {type(shards).__name__}")
    if not shards:
        raise ValueError("shards must hold one tensor per rank (at least one), got none")
    for r, shard in enumerate(shards):
        if not isinstance(shard, Tensor):
            raise TypeError(f"shards[{r}] must be a torch.Tensor (rank {r}'s shard), got {type(shard).__name__}")


def _check_rank(rank: object, world_size: int) -> None:
    # A bool would pass the range test as 0 or 1 and a float would fail deep inside indexing.
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TypeError(f"rank must be an int, got {type(rank).__name__} {rank!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must satisfy 0 <= rank < world_size = {world_size}, got {rank}")


def shard_packed(
    x: Tensor, cu_seqlens: object, rank: int, world_size: int, layout: str = "zigzag", dim: int = 0
) -> Tensor:
    """Rank `rank`'s shard of the packed batch `x` (tokens along `dim`, sequences as cu_seqlens, the global
    offsets, says): its share of every sequence in `layout`, in sequence order. Works for q, k, v and for
    per-token tensors such as input_ids, labels and position_ids; the rank's cu_seqlens are
    local_cu_seqlens(cu_seqlens, world_size)."""
    check_layout(layout)
    _check_world_size(world_size)
    _check_rank(rank, world_size)
    offsets = check_cu_seqlens(cu_seqlens, world_size, layout)
    if x.shape[dim] != offsets[-1]:
        raise ValueError(f"x has {x.shape[dim]} tokens along dim {dim} but cu_seqlens ends at {offsets[-1]}")
    return x.index_select(dim, packed_rows(offsets, rank, world_size, layout).to(x.device))


def gather_packed(shards: Sequence[Tensor], cu_seqlens: object, layout: str = "zigzag", dim: int = 0) -> Tensor:
    """The whole packed batch from the shards of every rank, in rank order: the inverse of shard_packed."""
    check_layout(layout)
    _check_shards(shards)
    world_size = len(shards)
    offsets = check_cu_seqlens(cu_seqlens, world_size, layout)
    rows = torch.cat([packed_rows(offsets, r, world_size, layout) for r in range(world_size)])
    concatenated = torch.cat(tuple(shards), dim=dim)
    if concatenated.shape[dim] != offsets[-1]:
        raise ValueError(f"the shards hold {concatenated.shape[dim]} tokens but cu_seqlens ends at {offsets[-1]}")
    return concatenated.index_select(dim, torch.argsort(rows).to(concatenated.device))


def local_cu_seqlens(cu_seqlens: Tensor, world_size: int) -> Tensor:
    """The cu_seqlens of every rank's shard of a packed batch: the global ones divided by world_size (each rank
    holds 1 / world_size of every sequence). The global ones are checked as shard_packed checks them, each
    sequence's length a multiple of world_size (a CUDA tensor is copied to the host): a length that is not would
    give every rank offsets rounded down, which no shard has."""
    _check_world_size(world_size)
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor (1-D, integer), got {type(cu_seqlens).__name__}")
    check_cu_seqlens(cu_seqlens, world_size, "contiguous")
    return torch.div(cu_seqlens, world_size, rounding_mode="floor")
