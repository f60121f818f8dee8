"""dash_attn.parallel.DashLocalAttention's packed backward (backward_varlen): one dash_attn.attention_backward call
per packed call, with the varlen arguments, whatever its number of sequences.

CPU (attention_backward recorded): the call hands over one offsets tensor for both sides when the offsets agree
(the promise under which the shift schedules are planned) and two otherwise, maxima that count the sequences
without queries too (their keys must be within max_seqlen_k, or the kernels flag the call), and the local kernel's
schedule, determinism and SM margin; unrecorded, the real attention_backward takes every argument it is handed and
stops only at the device check.
GPU (skip without a Hopper GPU or the head-dim-128 bf16 varlen kernels): under the sequence-local schedule
"ascending" (query and key/value heads equal), the bits of the per-sequence path (_PerSequenceBackward, which
TorchLocalAttention keeps) on a call whose offsets differ and which holds a sequence of keys without queries, whose
key rows get exact zeros.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from dash_attn import flash_attn_varlen_func, parallel  # noqa: E402
from dash_attn.parallel import _local  # noqa: E402

HEADS, HEAD_DIM = 4, 128
SCALE = HEAD_DIM**-0.5
# (seqlen_q, seqlen_k) per sequence; the query-less one has more keys than any sequence with queries.
LENGTHS = [(5, 9), (0, 40), (30, 30), (0, 0), (16, 20)]
OFFSETS_Q = tuple(itertools.accumulate((q for q, _ in LENGTHS), initial=0))
OFFSETS_K = tuple(itertools.accumulate((k for _, k in LENGTHS), initial=0))
MAX_SEQLEN_Q = max(q for q, _ in LENGTHS)
MAX_SEQLEN_K = max(k for _, k in LENGTHS)  # the sequence without queries


def packed(device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """dout, q, k, v, out of LENGTHS (bf16) and an fp32 (heads, total_q) LSE."""
    generator = torch.Generator(device).manual_seed(seed)

    def draw(rows: int) -> torch.Tensor:
        return torch.randn(rows, HEADS, HEAD_DIM, generator=generator, device=device).to(torch.bfloat16)

    total_q, total_k = OFFSETS_Q[-1], OFFSETS_K[-1]
    lse = torch.randn(HEADS, total_q, generator=generator, device=device)
    return draw(total_q), draw(total_q), draw(total_k), draw(total_k), draw(total_q), lse


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[tuple, dict]]:
    calls = []

    def attention_backward(*args, **kwargs):
        calls.append((args, kwargs))
        return tuple(torch.zeros_like(t) for t in args[1:4])

    monkeypatch.setattr(_local, "attention_backward", attention_backward)
    return calls


def test_one_call_with_two_offsets_tensors_and_maxima_over_every_sequence(recorded) -> None:
    local = parallel.DashLocalAttention(schedule="descending", sm_margin=3)
    tensors = packed("cpu")
    local.backward_varlen(*tensors, OFFSETS_Q, OFFSETS_K, True, SCALE, (7, 0))
    [(args, kwargs)] = recorded
    assert all(given is handed for given, handed in zip(tensors, args, strict=True))
    cu_seqlens_q, cu_seqlens_k = kwargs.pop("cu_seqlens_q"), kwargs.pop("cu_seqlens_k")
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    assert cu_seqlens_q.tolist() == list(OFFSETS_Q) and cu_seqlens_k.tolist() == list(OFFSETS_K)
    assert kwargs == {
        "softmax_scale": SCALE,
        "causal": True,
        "window_size": (7, 0),
        "deterministic": True,
        "schedule": "descending",
        "sm_margin": 3,
        "max_seqlen_q": MAX_SEQLEN_Q,
        "max_seqlen_k": MAX_SEQLEN_K,
    }


def test_offsets_that_agree_go_as_one_tensor(recorded) -> None:
    local = parallel.DashLocalAttention(deterministic=False)
    dout, q, _, _, out, lse = packed("cpu")
    local.backward_varlen(dout, q, q, q, out, lse, OFFSETS_Q, list(OFFSETS_Q), False, SCALE)
    [(_, kwargs)] = recorded
    assert kwargs["cu_seqlens_q"] is kwargs["cu_seqlens_k"]
    assert kwargs["max_seqlen_q"] == kwargs["max_seqlen_k"] == MAX_SEQLEN_Q
    assert (kwargs["deterministic"], kwargs["schedule"]) == (False, "nondeterministic")


def test_the_call_reaches_attention_backwards_device_check() -> None:
    """Unrecorded: attention_backward accepts every argument backward_varlen hands it; CPU tensors stop at the
    device check."""
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        parallel.DashLocalAttention().backward_varlen(*packed("cpu"), OFFSETS_Q, OFFSETS_K, True, SCALE)


def test_the_reference_kernel_keeps_the_per_sequence_backward() -> None:
    assert issubclass(parallel.TorchLocalAttention, _local._PerSequenceBackward)
    assert not issubclass(parallel.DashLocalAttention, _local._PerSequenceBackward)


# --- on a Hopper GPU --------------------------------------------------------------------------------------


def test_packed_backward_has_the_per_sequence_paths_bits(device, library, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    if not library.kernel_available(HEAD_DIM, library.DTYPE_BF16, varlen=True):
        pytest.skip(f"this build has no varlen kernels for head_dim {HEAD_DIM} / bf16 (DASH_VARLEN_KERNELS)")
    local = parallel.DashLocalAttention(schedule="ascending")
    dout, q, k, v, _, _ = packed("cuda", seed=1)
    # The forward with maxima over every sequence, as backward_varlen takes them.
    cu_seqlens_q, cu_seqlens_k = (torch.tensor(o, dtype=torch.int32, device="cuda") for o in (OFFSETS_Q, OFFSETS_K))
    out, lse = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, MAX_SEQLEN_Q, MAX_SEQLEN_K, causal=True, return_lse=True
    )
    arguments = (dout, q, k, v, out, lse, OFFSETS_Q, OFFSETS_K, True, SCALE)
    one_launch = local.backward_varlen(*arguments)
    per_sequence = _local._PerSequenceBackward.backward_varlen(local, *arguments)
    for name, a, b in zip(("dq", "dk", "dv"), one_launch, per_sequence, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name} differs from the per-sequence path"
    keys_without_queries = slice(OFFSETS_K[1], OFFSETS_K[2])  # sequence 1's
    assert torch.all(one_launch[1][keys_without_queries] == 0) and torch.all(one_launch[2][keys_without_queries] == 0)
