"""dash_attn.parallel.FlashAttention3LocalAttention on the CPU: its calls into flash_attn_interface, checked
against a stand-in module whose two functions take exactly the keywords FA3's _flash_attn_forward and
_flash_attn_backward take (a wrong or missing keyword raises TypeError) and compute what TorchLocalAttention
computes. So the adapter must hand over every argument under FA3's name and return the gradients FA3 writes into
the buffers it is given. FA3 itself runs only on Hopper GPUs (python/benchmarks/context_parallel.py uses it).
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from dash_attn import parallel  # noqa: E402


class StandInFlashAttentionInterface:
    """flash_attn_interface's two private entry points, keyword for keyword, over TorchLocalAttention."""

    def __init__(self) -> None:
        self.reference = parallel.TorchLocalAttention()
        self.calls: list[tuple[str, dict]] = []

    def _flash_attn_forward(self, q, k, v, *, softmax_scale, causal, sm_margin):
        self.calls.append(("forward", {"softmax_scale": softmax_scale, "causal": causal, "sm_margin": sm_margin}))
        out, lse = self.reference.forward(q, k, v, causal, softmax_scale)
        return out, lse, torch.empty(0), torch.empty(0)

    def _flash_attn_backward(
        self, dout, q, k, v, out, softmax_lse, *, dq, dk, dv, softmax_scale, is_causal, deterministic, sm_margin
    ):
        self.calls.append(
            (
                "backward",
                {
                    "softmax_scale": softmax_scale,
                    "is_causal": is_causal,
                    "deterministic": deterministic,
                    "sm_margin": sm_margin,
                },
            )
        )
        grads = self.reference.backward(dout, q, k, v, out, softmax_lse, is_causal, softmax_scale)
        for buffer, grad in zip((dq, dk, dv), grads):
            buffer.copy_(grad)
        return torch.empty(0)  # FA3 returns rowsum(dout * out)


def _inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)

    def draw(seqlen: int, heads: int) -> torch.Tensor:
        return torch.randn((2, seqlen, heads, 16), generator=generator, dtype=torch.float32)

    # GQA (4 query heads on 2 key/value heads) and seqlen_q != seqlen_k, so the bottom-right causal mask matters.
    return draw(6, 4), draw(10, 2), draw(10, 2), draw(6, 4)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_are_the_interfaces_and_take_its_keywords(causal):
    q, k, v, dout = _inputs()
    scale = 0.25
    interface = StandInFlashAttentionInterface()
    local = parallel.FlashAttention3LocalAttention(deterministic=True, sm_margin=8, interface=interface)
    reference = parallel.TorchLocalAttention()

    out, lse = local.forward(q, k, v, causal, scale)
    want_out, want_lse = reference.forward(q, k, v, causal, scale)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)

    grads = local.backward(dout, q, k, v, out, lse, causal, scale)
    want = reference.backward(dout, q, k, v, out, lse, causal, scale)
    for name, got, expected in zip(("dq", "dk", "dv"), grads, want):
        assert got.shape == expected.shape, name
        assert torch.equal(got, expected), name

    assert interface.calls == [
        ("forward", {"softmax_scale": scale, "causal": causal, "sm_margin": 8}),
        ("backward", {"softmax_scale": scale, "is_causal": causal, "deterministic": True, "sm_margin": 8}),
    ]


def test_deterministic_flag_reaches_fa3s_backward():
    q, k, v, dout = _inputs(1)
    interface = StandInFlashAttentionInterface()
    local = parallel.FlashAttention3LocalAttention(deterministic=False, interface=interface)
    assert local.deterministic is False
    out, lse = local.forward(q, k, v, True, 0.5)
    local.backward(dout, q, k, v, out, lse, True, 0.5)
    assert interface.calls[-1][1]["deterministic"] is False


def test_without_fa3_the_error_names_the_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # `import flash_attn_interface` fails
    with pytest.raises(ImportError, match="flash_attn_interface"):
        parallel.FlashAttention3LocalAttention()


def test_sm_margin_is_checked_like_dashs():
    with pytest.raises((TypeError, ValueError), match="sm_margin"):
        parallel.FlashAttention3LocalAttention(sm_margin=-1, interface=StandInFlashAttentionInterface())
