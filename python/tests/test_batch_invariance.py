"""Batch invariance: a sequence's bits do not depend on the other sequences of its batch.

A varlen batch's kernels are chosen on the host, which knows its packed rows but never reads cu_seqlens. If that
choice followed the lengths, a sequence's bits would change with its neighbours: the forward's wide key tiles move
where a row's online softmax rescales, and its tall query tiles change the LSE's last bits under the causal mask.
The varlen forward therefore runs one tile shape at every length (schedule/tile_config.hpp). The tests place one
sequence alone and then beside long and short ones, so that the batch's mean length crosses each of those tiles'
thresholds (2048 packed rows per sequence for the full mask, 8192 for the causal one), and compare its rows bit for
bit: out and LSE always; dq, dk and dv under the schedules whose summation order is a function of the sequence alone
(ascending, descending, shortest-first). auto, shift and symmetric shift are planned for the batch's maxima and may
order a sequence's sums differently in another batch (python/README.md says so). A dense batch's sequence is compared
with a batch of one. The negative control checks that the comparison finds a one-bit change.

GPU only (skip without a Hopper GPU or the head dim's kernels).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from dash_attn import flash_attn_func, flash_attn_varlen_func

HEADS = 4
TARGET = 1000  # the sequence whose bits are compared
# Neighbours that move the batch's mean length over the tile thresholds of schedule/tile_config.hpp: 2048 packed
# rows per sequence (tall tiles under the full mask at d = 64, wide tiles at d = 128) and 8192 (tall tiles under the
# causal mask).
NEIGHBOURS = {
    "mean_2679": ([7000], [37]),
    "mean_10500": ([20000], []),
}


def bit_differences(a: torch.Tensor, b: torch.Tensor) -> int:
    """The number of elements whose bits differ (NaN payloads included)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    width = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return int((a.contiguous().view(width) != b.contiguous().view(width)).sum())


def varlen_run(lengths, causal, schedule, inputs, dout):
    """out, lse, dq, dk, dv of a packed batch of self-attention sequences with these lengths."""
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (t.detach().requires_grad_() for t in inputs)
    out, lse = flash_attn_varlen_func(
        q, k, v, offsets, offsets, max(lengths), max(lengths), causal=causal, schedule=schedule, return_lse=True
    )
    out.backward(dout)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def packed_inputs(lengths, head_dim, generator, heads_kv=HEADS):
    """q, k, v and dout of a packed batch: HEADS query heads, heads_kv key/value heads."""
    total = sum(lengths)
    heads = (HEADS, heads_kv, heads_kv, HEADS)
    return [torch.randn(total, h, head_dim, generator=generator, device="cuda", dtype=torch.bfloat16) for h in heads]


@pytest.mark.parametrize("schedule", ["ascending", "descending", "shortest-first"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("neighbours", list(NEIGHBOURS), ids=list(NEIGHBOURS))
def test_a_varlen_sequence_has_the_same_bits_whatever_its_neighbours(
    require_kernel, head_dim, causal, neighbours, schedule
):
    require_kernel(head_dim, torch.bfloat16)
    before, after = NEIGHBOURS[neighbours]
    generator = torch.Generator(device="cuda").manual_seed(head_dim + 2 * causal)
    q, k, v, dout = packed_inputs([TARGET], head_dim, generator)
    lengths = [*before, TARGET, *after]
    batch = packed_inputs(lengths, head_dim, generator)
    start = sum(before)
    for whole, part in zip(batch, (q, k, v, dout)):
        whole[start : start + TARGET] = part

    alone = varlen_run([TARGET], causal, schedule, (q, k, v), dout)
    together = varlen_run(lengths, causal, schedule, batch[:3], batch[3])

    rows = slice(start, start + TARGET)
    names = ("out", "lse", "dq", "dk", "dv")
    for name, a, b in zip(names, alone, together):
        b = b[:, rows] if name == "lse" else b[rows]  # the LSE is (heads, total_q)
        assert bit_differences(a, b) == 0, f"{name}: {bit_differences(a, b)} elements differ with neighbours {lengths}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_under_gqa_a_varlen_sequences_out_lse_and_dq_have_the_same_bits_whatever_its_neighbours(
    require_kernel, head_dim, causal
):
    """With fewer key/value heads (GQA), dk and dv sum a group's query heads in parts whose number the backward
    picks for the batch (python/README.md), so only out, LSE and dq are promised invariant."""
    require_kernel(head_dim, torch.bfloat16)
    generator = torch.Generator(device="cuda").manual_seed(head_dim + 2 * causal + 7)
    q, k, v, dout = packed_inputs([TARGET], head_dim, generator, heads_kv=1)
    lengths = [20000, TARGET]
    batch = packed_inputs(lengths, head_dim, generator, heads_kv=1)
    rows = slice(20000, 20000 + TARGET)
    for whole, part in zip(batch, (q, k, v, dout)):
        whole[rows] = part
    alone = varlen_run([TARGET], causal, "ascending", (q, k, v), dout)
    together = varlen_run(lengths, causal, "ascending", batch[:3], batch[3])
    for name, a, b in zip(("out", "lse", "dq"), alone, together):
        b = b[:, rows] if name == "lse" else b[rows]
        assert bit_differences(a, b) == 0, f"{name}: {bit_differences(a, b)} elements differ with neighbours {lengths}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_dense_sequence_has_the_same_bits_in_a_batch_of_one(require_kernel, head_dim, causal):
    require_kernel(head_dim, torch.bfloat16)
    generator = torch.Generator(device="cuda").manual_seed(head_dim)
    shape = (3, 2304, HEADS, head_dim)  # above the full mask's 2048-token tile thresholds
    tensors = [torch.randn(shape, generator=generator, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    together = flash_attn_func(*tensors, causal=causal, deterministic=True)
    alone = flash_attn_func(*(t[1:2] for t in tensors), causal=causal, deterministic=True)
    assert bit_differences(alone, together[1:2]) == 0


def test_the_comparison_finds_a_one_bit_change():
    """Negative control: bit_differences is not blind to the smallest change."""
    values = torch.randn(64, 8, dtype=torch.bfloat16)
    changed = values.clone()
    changed.view(torch.int16)[3, 5] ^= 1
    assert bit_differences(values, changed) == 1
    assert bit_differences(values, values.clone()) == 0
