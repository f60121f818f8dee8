"""A small language model trained with context parallelism: P processes share every packed batch of documents,
each holding its zigzag share of every document (dash_attn.parallel.shard_packed shards input_ids, labels and
position_ids alike), and attention runs over the whole documents through
dash_attn.parallel.context_parallel_attn_func in ring mode. The model is trained twice from the same seed; the
example prints the loss, and exits 1 unless the loss fell and the two runs' losses and final weights are
bitwise identical.

    python examples/context_parallel.py [--world-size 2] [--steps 30] [--device auto|cpu|cuda] [--control]

--control is the comparison's negative control: the second run adds the ranks' gradients in reverse order, and
the example must then report different bits.

Where it runs:
- on a Hopper GPU with DASH's library (--device auto picks it when present): DASH's kernels, bf16 autocast. With
  P GPUs, one process per GPU over NCCL; with fewer, the P processes share GPU 0 over gloo, moving data through
  host memory (HostStagedTransport);
- otherwise on the CPU: gloo, and the pure-torch TorchLocalAttention as the local kernel (fp32).

What makes the runs repeat their bits: the attention's own order-fixed merge and sums, torch's deterministic
algorithms, and the gradient sync, which gathers every rank's gradient and adds them in rank order instead of an
all-reduce (whose summation order the backend chooses). Labels are shifted on the whole batch before sharding:
after sharding, a token's successor usually lives on another rank.
"""

from __future__ import annotations

import os

# cuBLAS reads its workspace configuration when its first handle is made: fixed workspaces, before torch starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import datetime  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import dash_attn  # noqa: E402
from dash_attn import parallel  # noqa: E402

HOPPER = (9, 0)
IGNORE = -100  # the label of a document's last token, which has no successor
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    width: int = 128
    heads: int = 2  # head dim 64
    layers: int = 2
    documents: int = 6  # per batch, of ragged lengths
    chunks_per_document: int = 8  # lengths are multiples of 2P tokens, up to this many multiples
    steps: int = 30
    learning_rate: float = 3e-3
    seed: int = 0


@dataclass(frozen=True)
class Setup:
    """Where a rank runs: its device, the attention's local kernel (None: DASH's), the transport, autocast."""

    device: torch.device
    local_attention: parallel.LocalAttention | None
    transport: parallel.Transport
    autocast: bool


class Block(nn.Module):
    """Pre-norm transformer block; causal self-attention over the packed documents through context parallelism."""

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

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, setup: Setup) -> torch.Tensor:
        tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(tokens, 3, self.heads, width // self.heads).unbind(1)
        attention = parallel.context_parallel_attn_func(
            q,
            k,
            v,
            cu_seqlens=cu_seqlens,
            causal=True,
            local_attention=setup.local_attention,
            transport=setup.transport,
        )
        x = x + self.proj(attention.reshape(tokens, width))
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self, config: Config, longest: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.width)
        self.position = nn.Embedding(longest, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)

    def forward(self, input_ids, position_ids, cu_seqlens, setup: Setup) -> torch.Tensor:
        x = self.embed(input_ids) + self.position(position_ids)
        for block in self.blocks:
            x = block(x, cu_seqlens, setup)
        return self.head(self.norm(x))


def make_batch(config: Config, world_size: int, step: int) -> dict[str, torch.Tensor]:
    """The whole packed batch of a step, the same on every rank: documents counting up from a random start
    (modulo the vocabulary), of lengths that are multiples of 2P, with next-token labels and positions."""
    generator = torch.Generator().manual_seed(config.seed * config.steps + step)  # one seed per (seed, step)
    unit = 2 * world_size
    lengths = (
        torch.randint(1, config.chunks_per_document + 1, (config.documents,), generator=generator) * unit
    ).tolist()
    ids, labels, positions = [], [], []
    for length in lengths:
        start = int(torch.randint(config.vocab, (1,), generator=generator))
        document = (start + torch.arange(length)) % config.vocab
        ids.append(document)
        labels.append(torch.cat((document[1:], torch.tensor([IGNORE]))))
        positions.append(torch.arange(length))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "input_ids": torch.cat(ids),
        "labels": torch.cat(labels),
        "position_ids": torch.cat(positions),
        "cu_seqlens": cu_seqlens,
    }


def sum_in_rank_order(tensor: torch.Tensor, group_backend: str, reverse: bool = False) -> torch.Tensor:
    """The sum over the ranks of `tensor`, added in rank order (gathered first, so no backend picks the order);
    reverse=True adds them in the reverse order, the negative control's change."""
    staged = tensor.cpu() if group_backend == "gloo" else tensor
    gathered = [torch.empty_like(staged) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, staged.contiguous())
    if reverse:
        gathered.reverse()
    total = gathered[0].clone()
    for part in gathered[1:]:
        total += part
    return total.to(tensor.device)


def train(config: Config, setup: Setup, rank: int, world_size: int, backend: str, reverse_sum: bool = False):
    """Losses of every step (whole batch) and the final weights; reverse_sum: the gradients' sum in reverse rank
    order."""
    torch.manual_seed(config.seed)
    longest = config.chunks_per_document * 2 * world_size
    model = LanguageModel(config, longest).to(setup.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    losses = []
    for step in range(config.steps):
        batch = make_batch(config, world_size, step)
        cu_seqlens = batch["cu_seqlens"]
        shard = {
            name: parallel.shard_packed(batch[name], cu_seqlens, rank, world_size).to(setup.device)
            for name in ("input_ids", "labels", "position_ids")
        }
        predicted = int((batch["labels"] != IGNORE).sum())
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=setup.autocast):
            logits = model(shard["input_ids"], shard["position_ids"], cu_seqlens, setup)
        loss_sum = F.cross_entropy(logits.float(), shard["labels"], ignore_index=IGNORE, reduction="sum")
        (loss_sum / predicted).backward()
        for parameter in model.parameters():
            parameter.grad = sum_in_rank_order(parameter.grad, backend, reverse_sum)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(sum_in_rank_order(loss_sum.detach(), backend)) / predicted)
    return losses, {name: p.detach().cpu() for name, p in model.named_parameters()}


def _dash_usable() -> bool:
    """Whether DASH's kernels run here: a Hopper GPU, the library, and its head-dim-64 bf16 varlen kernels (one
    tiny call tells)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != HOPPER:
        return False
    probe = torch.zeros(2, 1, 64, dtype=torch.bfloat16, device="cuda")
    offsets = torch.tensor([0, 2], dtype=torch.int32, device="cuda")
    try:
        dash_attn.flash_attn_varlen_func(probe, probe, probe, offsets, offsets, 2, 2)
    except (ImportError, dash_attn.LibraryError, NotImplementedError):
        return False
    return True


def worker(rank: int, world_size: int, device_kind: str, config: Config, control: bool, directory: str) -> None:
    torch.set_num_threads(1)  # P processes share the cores; a fixed thread count keeps the CPU bits
    store = f"file://{directory}/store"
    if device_kind == "cuda":
        torch.use_deterministic_algorithms(True)
        own_gpus = torch.cuda.device_count() >= world_size
        backend = "nccl" if own_gpus else "gloo"
        torch.cuda.set_device(rank if own_gpus else 0)
        transport = parallel.ProcessGroupTransport() if own_gpus else parallel.HostStagedTransport()
        setup = Setup(torch.device("cuda", torch.cuda.current_device()), None, transport, autocast=True)
    else:
        backend = "gloo"
        setup = Setup(torch.device("cpu"), parallel.TorchLocalAttention(), parallel.ProcessGroupTransport(), False)
    dist.init_process_group(backend, init_method=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    runs = [train(config, setup, rank, world_size, backend, reverse_sum=control and again) for again in (False, True)]
    if rank == 0:
        torch.save(runs, Path(directory) / "runs.pt")
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="processes (ranks) sharing each batch")
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--control",
        action="store_true",
        help="negative control: the second run adds the ranks' gradients in reverse order, so the comparison must "
        "report different bits (exits 0 only if it does); needs --world-size >= 3, since a + b == b + a",
    )
    args = parser.parse_args()
    if args.world_size < 1:
        parser.error(f"--world-size must be >= 1, got {args.world_size}")
    if args.control and args.world_size < 3:
        parser.error("--control needs --world-size >= 3: two ranks' gradients add up the same in either order")
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 to see the loss fall, got {args.steps}")
    device_kind = args.device
    if device_kind == "auto":
        device_kind = "cuda" if _dash_usable() else "cpu"
    elif device_kind == "cuda" and not _dash_usable():
        parser.error("--device cuda needs a Hopper GPU and DASH's library (python -m dash_attn.info says why not)")
    config = Config(steps=args.steps)
    kernel = "DASH's kernels, bf16" if device_kind == "cuda" else "the pure-torch kernel, fp32"
    print(f"context parallelism: {args.world_size} processes on {device_kind} ({kernel}), {config.steps} steps, twice")
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(
            worker,
            args=(args.world_size, device_kind, config, args.control, directory),
            nprocs=args.world_size,
            start_method="spawn",
        )
        (losses, weights), (losses_again, weights_again) = torch.load(Path(directory) / "runs.pt")
    shown = sorted({*range(0, config.steps, max(1, config.steps // 6)), config.steps - 1})
    for step in shown:
        print(f"step {step:4d}  loss {losses[step]:.4f}")
    fell = losses[-1] < 0.5 * losses[0]
    identical = losses == losses_again and all(torch.equal(weights[n], weights_again[n]) for n in weights)
    print(f"loss fell from {losses[0]:.4f} to {losses[-1]:.4f}: {'yes' if fell else 'NO'}")
    verdict = "bitwise identical" if identical else "DIFFERENT"
    runs = "run and control run (gradients summed in reverse rank order)" if args.control else "two runs"
    print(f"{runs}: all {config.steps} losses and all {len(weights)} weight tensors {verdict}")
    if args.control:
        return 0 if fell and not identical else 1
    return 0 if fell and identical else 1


if __name__ == "__main__":
    sys.exit(main())
