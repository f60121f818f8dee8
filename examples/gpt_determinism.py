"""A small GPT trained twice from the same seed on random tokens, with DASH's attention: the two runs' losses and
final weights are bitwise identical. Trained twice more with deterministic=False (the atomic-add backward), they
are not. Prints both facts; exits 1 if the deterministic runs differ, which would be a bug.

    python examples/gpt_determinism.py [--steps 300] [--seqlen 1024]

Needs a Hopper GPU, torch and dash_attn (the kernels for head dim 64, bf16). The only difference between the two
pairs of runs is the `deterministic` argument of dash_attn.flash_attn_func: everything else in the step (cuBLAS,
the embedding's backward, AdamW) runs torch's deterministic algorithms in both, so the second pair's differences
come from the attention backward's unordered dQ sums alone.
"""

from __future__ import annotations

import os

# cuBLAS reads its workspace configuration when its first handle is made: fixed workspaces, before torch starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import dash_attn  # noqa: E402

HOPPER = (9, 0)


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    width: int = 256
    heads: int = 4  # head dim 64
    layers: int = 2
    seqlen: int = 1024  # eight 128-token key/value tiles per head: many dQ partial sums to order
    batch: int = 4
    steps: int = 300
    learning_rate: float = 3e-4
    seed: int = 0


class Block(nn.Module):
    """Pre-norm transformer block; causal self-attention through dash_attn.flash_attn_func."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, 4 * config.width), nn.GELU(), nn.Linear(4 * config.width, config.width)
        )

    def forward(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        batch, seqlen, width = x.shape
        # (batch, seqlen, heads, head_dim): FlashAttention's layout, a view of the projection's output.
        q, k, v = self.qkv(self.norm1(x)).view(batch, seqlen, 3, self.heads, width // self.heads).unbind(2)
        attended = dash_attn.flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
        x = x + self.proj(attended.reshape(batch, seqlen, width))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.seqlen, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)

    def forward(self, ids: torch.Tensor, deterministic: bool) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x, deterministic)
        return self.head(self.norm(x))


@dataclass
class Run:
    losses: torch.Tensor  # float32 (steps,)
    weights: dict[str, torch.Tensor]


def train(config: Config, deterministic: bool, device: torch.device) -> Run:
    """One training run from config.seed: the same initial weights and the same token stream every time."""
    torch.manual_seed(config.seed)
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    data = torch.Generator().manual_seed(config.seed)
    losses = []
    for _ in range(config.steps):
        tokens = torch.randint(config.vocab, (config.batch, config.seqlen + 1), generator=data).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):  # DASH takes bf16 q, k, v
            logits = model(tokens[:, :-1], deterministic)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return Run(torch.stack(losses).cpu(), {name: t.detach().cpu() for name, t in model.state_dict().items()})


def compare(a: Run, b: Run) -> tuple[bool, str]:
    """Whether two runs are bitwise identical, and a sentence saying how they compare."""
    same_losses = torch.equal(a.losses, b.losses)
    differing = [name for name in a.weights if not torch.equal(a.weights[name], b.weights[name])]
    if same_losses and not differing:
        return True, f"all {len(a.losses)} losses and all {len(a.weights)} weight tensors bitwise identical"
    steps = (a.losses != b.losses).nonzero()
    first = f"first differing loss at step {steps[0].item()}" if len(steps) else "losses identical"
    return False, (
        f"{first}; final losses {a.losses[-1].item():.7f} and {b.losses[-1].item():.7f}; "
        f"{len(differing)} of {len(a.weights)} weight tensors differ"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--seqlen", type=int, default=Config.seqlen)
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != HOPPER:
        print("gpt_determinism: needs a Hopper GPU (compute capability 9.0); none is visible", file=sys.stderr)
        return 2
    config = Config(steps=args.steps, seqlen=args.seqlen)
    device = torch.device("cuda")
    print(f"gpt_determinism: {config} on {torch.cuda.get_device_name()}")

    torch.use_deterministic_algorithms(True)
    deterministic_same, deterministic_words = compare(train(config, True, device), train(config, True, device))
    print(f"deterministic=True,  two runs: {deterministic_words}")

    # DASH refuses deterministic=False under torch.use_deterministic_algorithms(True); warn_only keeps torch's own
    # deterministic algorithms and lets the attention backward alone be nondeterministic.
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*deterministic.*", category=UserWarning)
        nondeterministic_same, nondeterministic_words = compare(
            train(config, False, device), train(config, False, device)
        )
    print(f"deterministic=False, two runs: {nondeterministic_words}")
    if nondeterministic_same:
        print("  (the atomic-add backward happened to sum in the same order both times; rerun, or raise --steps)")

    if not deterministic_same:
        print("gpt_determinism: FAILED: the deterministic runs differ", file=sys.stderr)
        return 1
    print("gpt_determinism: PASSED: with DASH's deterministic backward, training is bitwise reproducible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
