"""dash_attn.parallel's ring plan (_plan.py) and packed layout, checked exhaustively on small geometries without
any process: for every world size 1-4, layout, mask, sliding window, rank and ring step, the local-kernel calls
of the step, mapped back to global positions through their rows and their (bottom-right aligned) masks, must
cover exactly the (query, key) pairs the global mask lets through, each once, and every row of every call must
see at least one key (the merge needs a finite LSE). Steps a window cannot see must make no call, and windows
narrower than a chunk must skip some steps. Packed plans likewise, per sequence, with ragged lengths and an
empty sequence. Plus the packed sharding helpers and their refusals.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from dash_attn import parallel  # noqa: E402
from dash_attn.parallel import _layout, _plan  # noqa: E402

WINDOWS = [(-1, -1), (0, 0), (3, -1), (5, 2), (-1, 4), (9, 9), (30, -1)]
SEQLEN = 48  # 2P equal chunks for P = 1..4


def _visible(i: int, j: int, causal: bool, window: tuple[int, int]) -> bool:
    """The global mask of query position i and key position j (self-attention: no offset)."""
    left, right = window
    if causal:
        right = 0
    return (left < 0 or j >= i - left) and (right < 0 or j <= i + right)


def _local_mask(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    """The local kernel's bottom-right aligned mask, written from the contract independently of _plan."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(seqlen_q)[:, None]
    j = torch.arange(seqlen_k)[None, :]
    diagonal = i + seqlen_k - seqlen_q
    seen = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if left >= 0:
        seen &= j >= diagonal - left
    if right >= 0:
        seen &= j <= diagonal + right
    return seen


def _positions(layout: str, rank: int, world_size: int, shard: int) -> list[int]:
    """Global positions of a rank's local rows, from the layout's definition (not from _plan.segments)."""
    if layout == "contiguous":
        return list(range(rank * shard, (rank + 1) * shard))
    chunk = shard // 2
    first, second = rank, 2 * world_size - 1 - rank
    return list(range(first * chunk, (first + 1) * chunk)) + list(range(second * chunk, (second + 1) * chunk))


def _rows(rows, total: int) -> list[int]:
    return list(range(total))[rows] if isinstance(rows, slice) else rows.tolist()


def _covered_pairs(calls, my_positions, their_positions, total: int) -> list[tuple[int, int]]:
    """The global (query, key) pairs the calls compute, one entry per computation."""
    pairs = []
    for call in calls:
        q_rows, kv_rows = _rows(call.q_rows, total), _rows(call.kv_rows, total)
        offsets_q = call.offsets_q or (0, len(q_rows))
        offsets_kv = call.offsets_kv or (0, len(kv_rows))
        for b in range(len(offsets_q) - 1):
            qs = q_rows[offsets_q[b] : offsets_q[b + 1]]
            ks = kv_rows[offsets_kv[b] : offsets_kv[b + 1]]
            seen = _local_mask(len(qs), len(ks), call.causal, call.window)
            assert bool(seen.any(dim=1).all()), f"a row of {call} sees no key"
            for a, c in seen.nonzero().tolist():
                pairs.append((my_positions[qs[a]], their_positions[ks[c]]))
    return pairs


def _geometries():
    for world_size, layout, causal, window in itertools.product(range(1, 5), parallel.LAYOUTS, (False, True), WINDOWS):
        if causal and layout != "zigzag":
            continue  # refused by context_parallel_attn_func
        yield world_size, layout, causal, window


@pytest.mark.parametrize("world_size,layout,causal,window", list(_geometries()))
def test_dense_plan_covers_the_global_mask_exactly_once(world_size, layout, causal, window):
    shard = SEQLEN // world_size
    steps_with_calls = 0
    for rank in range(world_size):
        mine = _positions(layout, rank, world_size, shard)
        computed = []
        for step in range(world_size):
            source = (rank - step) % world_size
            theirs = _positions(layout, source, world_size, shard)
            calls = _plan.dense_calls(layout, causal, window, step, rank, world_size, shard)
            pairs = _covered_pairs(calls, mine, theirs, shard)
            wanted = [(i, j) for i in mine for j in theirs if _visible(i, j, causal, window)]
            assert bool(calls) == bool(wanted), f"rank {rank} step {step}: calls {calls}, visible pairs {len(wanted)}"
            steps_with_calls += bool(calls)
            computed += pairs
        expected = [(i, j) for i in mine for j in range(SEQLEN) if _visible(i, j, causal, window)]
        assert sorted(computed) == sorted(expected), f"rank {rank}"
    if window[0] >= 0 and window[0] < shard // 2 and (causal or 0 <= window[1] < shard // 2) and world_size > 2:
        assert steps_with_calls < world_size * world_size, "a narrow window must skip some ring steps"


PACKED_LENGTHS = [24, 0, 72, 48]  # multiples of 2P for P = 1..4, one empty


@pytest.mark.parametrize("world_size,layout,causal,window", list(_geometries()))
def test_packed_plan_covers_each_sequence_exactly_once(world_size, layout, causal, window):
    offsets = [0, *itertools.accumulate(PACKED_LENGTHS)]
    local_offsets = [o // world_size for o in offsets]
    for rank in range(world_size):
        # Global packed row of each local row, per rank.
        mine = _layout.packed_rows(offsets, rank, world_size, layout).tolist()
        computed = []
        for step in range(world_size):
            source = (rank - step) % world_size
            theirs = _layout.packed_rows(offsets, source, world_size, layout).tolist()
            calls = _plan.packed_calls(
                layout, causal, window, step, rank, world_size, local_offsets, torch.device("cpu")
            )
            for call in calls:
                assert len(set(_rows(call.q_rows, local_offsets[-1]))) == len(_rows(call.q_rows, local_offsets[-1]))
            computed += _covered_pairs(calls, mine, theirs, local_offsets[-1])
        expected = []
        for b in range(len(PACKED_LENGTHS)):
            for row in mine:
                if offsets[b] <= row < offsets[b + 1]:
                    expected += [
                        (row, offsets[b] + j)
                        for j in range(PACKED_LENGTHS[b])
                        if _visible(row - offsets[b], j, causal, window)
                    ]
        assert sorted(computed) == sorted(expected), f"rank {rank}"


def test_shard_and_gather_packed_round_trip():
    offsets = torch.tensor([0, *itertools.accumulate(PACKED_LENGTHS)], dtype=torch.int32)
    x = torch.arange(int(offsets[-1])).repeat(2, 1).T  # (total, 2): tokens along dim 0
    for world_size in range(1, 5):
        for layout in parallel.LAYOUTS:
            shards = [parallel.shard_packed(x, offsets, r, world_size, layout) for r in range(world_size)]
            local = parallel.local_cu_seqlens(offsets, world_size)
            for shard in shards:
                assert shard.shape[0] == int(local[-1])
            assert torch.equal(parallel.gather_packed(shards, offsets, layout), x)
    # Zigzag over 2 ranks: each sequence in 4 chunks, rank 0 holds chunks 0 and 3 of each.
    small = torch.arange(12)
    assert parallel.shard_packed(small, [0, 4, 12], 0, 2).tolist() == [0, 3, 4, 5, 10, 11]
    assert parallel.shard_packed(small, [0, 4, 12], 1, 2).tolist() == [1, 2, 6, 7, 8, 9]
    assert parallel.shard_packed(small, [0, 4, 12], 1, 2, "contiguous").tolist() == [2, 3, 8, 9, 10, 11]


def test_packed_refusals_name_the_argument_and_the_rule():
    x = torch.zeros(12)
    with pytest.raises(ValueError, match=r"cu_seqlens gives sequence 1 length 6, not a multiple of 4 \(pad it\)"):
        parallel.shard_packed(x, [0, 4, 10, 12], 0, 2)
    with pytest.raises(ValueError, match="non-decreasing"):
        parallel.shard_packed(x, [0, 8, 4, 12], 0, 2)
    with pytest.raises(ValueError, match="must hold 0"):
        parallel.shard_packed(x, [4, 12], 0, 2)
    with pytest.raises(TypeError, match="cu_seqlens must be"):
        parallel.shard_packed(x, torch.tensor([0.0, 12.0]), 0, 2)
    with pytest.raises(ValueError, match="cu_seqlens ends at 8"):
        parallel.shard_packed(x, [0, 8], 0, 2)
    with pytest.raises(ValueError, match="rank must satisfy"):
        parallel.shard_packed(x, [0, 12], 2, 2)


def test_context_parallel_refusals_for_packed_and_windows():
    """Refused before the process group is touched (none exists in this process)."""
    call = parallel.context_parallel_attn_func
    q = torch.zeros(8, 4, 16)
    kv = torch.zeros(8, 2, 16)
    with pytest.raises(ValueError, match="3-D"):
        call(q[None], kv[None], kv[None], cu_seqlens=[0, 8])
    with pytest.raises(ValueError, match="4-D"):
        call(q, kv, kv)
    with pytest.raises(TypeError, match="window_size"):
        call(q[None], kv[None], kv[None], window_size=3)
    with pytest.raises(ValueError, match="window_size"):
        call(q[None], kv[None], kv[None], window_size=(-2, 0))
    fa3 = parallel.FlashAttention3LocalAttention(interface=object())
    with pytest.raises(NotImplementedError, match="neither cu_seqlens nor window_size"):
        call(q[None], kv[None], kv[None], window_size=(4, 0), local_attention=fa3)
    with pytest.raises(NotImplementedError, match="neither cu_seqlens nor window_size"):
        call(q, kv, kv, cu_seqlens=[0, 8], local_attention=fa3)
