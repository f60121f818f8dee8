"""End-to-end reproducibility: a small transformer (embedding, RMSNorm, GQA attention through dash_attn, MLP)
trained for 50 steps twice from one seed on the same data must give bitwise-identical losses and weights
with deterministic=True, and must not with deterministic=False, the negative control showing that the
comparison can fail and that attention is the only nondeterministic part of this training step.

Everything else is made deterministic by torch.use_deterministic_algorithms(True) (embedding backward,
cuBLAS with a fixed workspace, see conftest.py). That switch refuses deterministic=False, so the control runs
under warn_only=True, which keeps every other op deterministic and lets the nondeterministic schedule through
with a warning.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from torch import nn  # noqa: E402

from dash_attn import flash_attn_func  # noqa: E402

VOCAB = 1000
SEQLEN = 1024
BATCH = 2
HIDDEN = 512
HEAD_DIM = 128
HEADS = HIDDEN // HEAD_DIM
KV_HEADS = 2
MLP_HIDDEN = 4 * HIDDEN
LAYERS = 3
STEPS = 50
LEARNING_RATE = 1e-3
# Fraction of input tokens replaced by random ones; the model learns to restore them (see make_batches).
CORRUPTION = 0.15
SEED = 1234


class Attention(nn.Module):
    def __init__(self, causal: bool, deterministic: bool) -> None:
        super().__init__()
        self.causal = causal
        self.deterministic = deterministic
        self.qkv = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.out = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seqlen, _ = x.shape
        # q, k and v stay strided views into the fused projection, as in real models: no copy.
        q, k, v = self.qkv(x).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        o = flash_attn_func(
            q.unflatten(-1, (HEADS, HEAD_DIM)),
            k.unflatten(-1, (KV_HEADS, HEAD_DIM)),
            v.unflatten(-1, (KV_HEADS, HEAD_DIM)),
            causal=self.causal,
            deterministic=self.deterministic,
        )
        return self.out(o.reshape(batch, seqlen, HEADS * HEAD_DIM))


class Block(nn.Module):
    def __init__(self, causal: bool, deterministic: bool) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(HIDDEN)
        self.attention = Attention(causal, deterministic)
        self.mlp_norm = nn.RMSNorm(HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, MLP_HIDDEN), nn.SiLU(), nn.Linear(MLP_HIDDEN, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, causal: bool, deterministic: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block(causal, deterministic) for _ in range(LAYERS))
        self.norm = nn.RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_batches(device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS (corrupted, clean) batches from a fixed CPU generator. Clean sequences follow a simple
    recurrence, so the task (restore the corrupted tokens) is learnable under a causal or a full mask alike."""
    generator = torch.Generator().manual_seed(SEED)
    for _ in range(STEPS):
        start = torch.randint(VOCAB, (BATCH, 1), generator=generator)
        stride = torch.randint(1, VOCAB, (BATCH, 1), generator=generator)
        clean = (start + stride * torch.arange(SEQLEN)) % VOCAB
        noise = torch.randint(VOCAB, clean.shape, generator=generator)
        corrupted = torch.where(torch.rand(clean.shape, generator=generator) < CORRUPTION, noise, clean)
        yield corrupted.to(device), clean.to(device)


def train(device: torch.device, causal: bool, deterministic: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses of every step and the final weights of one training run from SEED."""
    torch.manual_seed(SEED)
    model = Transformer(causal, deterministic).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for corrupted, clean in make_batches(device):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(corrupted)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), clean.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.fixture
def deterministic_torch():
    """torch.use_deterministic_algorithms(True) for one test, restored afterwards."""
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


@pytest.fixture
def deterministic_torch_warn_only():
    """torch.use_deterministic_algorithms(True, warn_only=True) for one test, restored afterwards."""
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def differing_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return [name for name in a if not torch.equal(a[name], b[name])]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_training_is_bitwise_reproducible(device, require_kernel, deterministic_torch, causal) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    losses_a, weights_a = train(device, causal, deterministic=True)
    losses_b, weights_b = train(device, causal, deterministic=True)
    assert losses_a[-1] < losses_a[0], f"the model did not learn: losses {losses_a[0]:.3f} -> {losses_a[-1]:.3f}"
    assert losses_a == losses_b, next(
        f"loss of step {i} differs: {a!r} vs {b!r}" for i, (a, b) in enumerate(zip(losses_a, losses_b)) if a != b
    )
    assert not differing_weights(weights_a, weights_b)


def test_negative_control_nondeterministic_training_diverges(
    device, require_kernel, deterministic_torch_warn_only
) -> None:
    """Full attention over 1024 keys: many key tiles add into each dQ tile at once, so the unordered
    reduction races in every backward; over 50 steps the bits of the losses or weights must differ."""
    require_kernel(HEAD_DIM, torch.bfloat16)
    with pytest.warns(UserWarning, match=r"deterministic=False\) runs the nondeterministic backward schedule"):
        losses_a, weights_a = train(device, causal=False, deterministic=False)
        losses_b, weights_b = train(device, causal=False, deterministic=False)
    assert losses_a != losses_b or differing_weights(weights_a, weights_b), (
        "deterministic=False trained bitwise-identical models twice: this test cannot detect nondeterminism"
    )
