"""Which blocks of attention a ring step computes, as local-kernel calls (Call): rows of the rank's queries
against rows of the key/value shard it holds at that step, with the mask that makes them the global attention.

A rank's shard of one sequence (shard length s) is made of segments of global positions (_layout): "contiguous"
holds [r * s, (r + 1) * s); "zigzag" holds chunks r and 2P - 1 - r of length s / 2 (one segment when they are
adjacent, on the middle rank). Blocks are planned per sequence (Piece) and then batched into calls:

- Without a window, one piece per step (the coarse blocks): the full mask sees everything; under the causal
  mask with zigzag, step 0 is the own shard under the local causal mask (the rank's tokens are in position
  order, so the local mask is the global one restricted to them), an earlier rank's shard is seen in its first
  chunk by every local query, a later rank's shard whole by the second local chunk only.
- With a sliding window (left, right; causal makes right 0), each (query segment, key segment) pair is trimmed
  to the query rows that see at least one of its keys and the keys that at least one of those rows sees; a pair
  the window cannot reach is dropped, and a step with no pair left makes no call. The trimmed pair keeps the
  global mask when its window is moved by the offset between the pair's ends: with global query rows [qa, qb)
  and keys [ka, kb), row i sees key j iff i - left <= j <= i + right, and the local kernel's bottom-right aligned
  mask over the pair says the same with left' = left + (kb - qb) and right' = right - (kb - qb). Trimming makes
  both >= 0; a side that cannot bind inside the pair becomes -1, and right' = 0 is the causal mask.

Invariants:
- Every row of every call sees at least one key of it, so its LSE is finite and every merge weight exists.
- The calls of a step and their order depend only on (layout, rank, world size, step, lengths, mask), never on
  data or timing; a packed call holds at most one piece of each sequence, so its query rows are distinct.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ._local import NO_WINDOW, Window

_ALL = slice(None)


@dataclasses.dataclass(frozen=True)
class Segment:
    """Global positions [start, start + length) of a sequence, held from local row `local` of the shard."""

    start: int
    length: int
    local: int


def segments(layout: str, rank: int, world_size: int, shard_length: int) -> tuple[Segment, ...]:
    """The segments of a sequence that `rank` holds (module docstring)."""
    if layout == "contiguous":
        return (Segment(rank * shard_length, shard_length, 0),)
    chunk = shard_length // 2
    first, second = rank, 2 * world_size - 1 - rank
    if second == first + 1:
        return (Segment(first * chunk, shard_length, 0),)
    return (Segment(first * chunk, chunk, 0), Segment(second * chunk, chunk, chunk))


@dataclasses.dataclass(frozen=True)
class Piece:
    """One block of one sequence: local query rows [q[0], q[1]), local key/value rows [kv[0], kv[1]), the mask."""

    q: tuple[int, int]
    kv: tuple[int, int]
    causal: bool
    window: Window


def _coarse(causal: bool, step: int, source: int, rank: int, shard_length: int) -> list[Piece]:
    whole = (0, shard_length)
    if not causal:
        return [Piece(whole, whole, False, NO_WINDOW)]
    if step == 0:
        return [Piece(whole, whole, True, NO_WINDOW)]
    half = shard_length // 2
    if source < rank:
        return [Piece(whole, (0, half), False, NO_WINDOW)]
    return [Piece((half, shard_length), whole, False, NO_WINDOW)]


def _trimmed(query: Segment, key: Segment, left: float, right: float) -> Piece | None:
    """The pair's piece under the window, or None if no query of it sees a key of it (module docstring)."""
    q0, q1 = query.start, query.start + query.length
    k0, k1 = key.start, key.start + key.length
    qa, qb = max(q0, k0 - right), min(q1, k1 + left)
    if qa >= qb:
        return None
    ka, kb = max(k0, qa - left), min(k1, qb + right)
    if ka >= kb:
        return None
    local_left, local_right = left + (kb - qb), right - (kb - qb)
    window_left = -1 if local_left >= (kb - ka) - 1 else int(local_left)
    window_right = -1 if local_right >= (qb - qa) - 1 else int(local_right)
    causal = window_right == 0
    return Piece(
        (query.local + qa - q0, query.local + qb - q0),
        (key.local + ka - k0, key.local + kb - k0),
        causal,
        (window_left, -1 if causal else window_right),
    )


def pieces(
    layout: str, causal: bool, window: Window, step: int, rank: int, world_size: int, shard_length: int
) -> list[Piece]:
    """The pieces of one sequence (shard length `shard_length`) that `rank` computes at ring `step`."""
    source = (rank - step) % world_size
    if shard_length == 0:
        return []
    if window == NO_WINDOW:
        return _coarse(causal, step, source, rank, shard_length)
    left = math.inf if window[0] < 0 else window[0]
    right = 0 if causal else (math.inf if window[1] < 0 else window[1])
    mine = segments(layout, rank, world_size, shard_length)
    theirs = segments(layout, source, world_size, shard_length)
    found = (_trimmed(q, k, left, right) for q in mine for k in theirs)
    return [piece for piece in found if piece is not None]


@dataclasses.dataclass(frozen=True)
class Call:
    """One local-kernel call: the rows of the local queries and of the held keys/values it takes (a slice along
    the sequence dimension, or for packed batches an index of rows), the mask, and for packed batches the
    offsets of the call's sequences in the gathered rows (None for dense batches)."""

    q_rows: slice | Tensor
    kv_rows: slice | Tensor
    causal: bool
    window: Window
    offsets_q: tuple[int, ...] | None = None
    offsets_kv: tuple[int, ...] | None = None


def dense_calls(layout: str, causal: bool, window: Window, step: int, rank: int, world_size: int, seqlen: int):
    """The calls of a step on a dense batch: every sequence has the same pieces, so each piece is one call."""
    return [
        Call(
            slice(*p.q) if p.q != (0, seqlen) else _ALL,
            slice(*p.kv) if p.kv != (0, seqlen) else _ALL,
            p.causal,
            p.window,
        )
        for p in pieces(layout, causal, window, step, rank, world_size, seqlen)
    ]


def _rows(ranges: list[tuple[int, int]], total: int, device: torch.device) -> tuple[slice | Tensor, tuple[int, ...]]:
    """The gathered rows of `ranges` (everything in order: a slice) and their offsets."""
    offsets = [0]
    for lo, hi in ranges:
        offsets.append(offsets[-1] + hi - lo)
    contiguous = all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    if contiguous and ranges[0][0] == 0 and ranges[-1][1] == total:
        return _ALL, tuple(offsets)
    index = torch.cat([torch.arange(lo, hi) for lo, hi in ranges]).to(device)
    return index, tuple(offsets)


def packed_calls(
    layout: str,
    causal: bool,
    window: Window,
    step: int,
    rank: int,
    world_size: int,
    local_offsets: Sequence[int],
    device: torch.device,
) -> list[Call]:
    """The calls of a step on a packed batch whose sequence b is local rows local_offsets[b]:local_offsets[b + 1]
    on every rank: the sequences' pieces with the same mask go into one call, the n-th such piece of each
    sequence into the n-th call (module docstring)."""
    groups: dict[tuple, list[tuple[int, Piece]]] = {}
    for b in range(len(local_offsets) - 1):
        seen: dict[tuple, int] = {}
        for piece in pieces(layout, causal, window, step, rank, world_size, local_offsets[b + 1] - local_offsets[b]):
            mask = (piece.causal, piece.window)
            ordinal = seen.get(mask, 0)
            seen[mask] = ordinal + 1
            groups.setdefault((*mask, ordinal), []).append((local_offsets[b], piece))
    total = local_offsets[-1]
    calls = []
    for (causal_call, window_call, _), members in groups.items():
        q_rows, offsets_q = _rows([(base + p.q[0], base + p.q[1]) for base, p in members], total, device)
        kv_rows, offsets_kv = _rows([(base + p.kv[0], base + p.kv[1]) for base, p in members], total, device)
        calls.append(Call(q_rows, kv_rows, causal_call, window_call, offsets_q, offsets_kv))
    return calls
