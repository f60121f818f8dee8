"""Fine-tuning a Hugging Face model with DASH's attention: `import dash_attn`, then attn_implementation="dash_attn".

    python examples/hf_finetune.py [--steps 60] [--twice] [--output DIR]

The model is a small Llama (GQA: 4 query heads on 2 key/value heads, head dim 64) built from a config with random
weights, and the data are random token sequences, so nothing is downloaded. It trains in mixed precision (fp32
weights, bf16 autocast: DASH receives bf16 states) on a fixed set of sequences, and prints the loss as it falls.
--twice trains a second time from the same seed and checks that the losses and weights are bitwise identical;
--output saves the fine-tuned model with save_pretrained. Exits 1 if the loss does not fall or, with --twice, if
the runs differ. Needs a Hopper GPU, torch, transformers and dash_attn (kernels for head dim 64, bf16).
"""

from __future__ import annotations

import os

# cuBLAS reads its workspace configuration when its first handle is made: fixed workspaces, before torch starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

import dash_attn  # noqa: E402, F401  (makes attn_implementation="dash_attn" known to transformers)

HOPPER = (9, 0)
SEED = 0
SEQUENCES = 16  # the fine-tuning set: few enough that a few dozen steps visibly fit it
SEQLEN = 256
BATCH = 4
LEARNING_RATE = 1e-3


def small_llama() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQLEN,
    )


def finetune(steps: int, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    """Builds the model from SEED and trains it for `steps`; returns it and its float32 losses."""
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(small_llama(), attn_implementation="dash_attn").to(device)
    model.train()
    data = torch.randint(small_llama().vocab_size, (SEQUENCES, SEQLEN), generator=torch.Generator().manual_seed(SEED))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for step in range(steps):
        rows = torch.arange(step * BATCH, (step + 1) * BATCH) % SEQUENCES
        ids = data[rows].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().float())
    return model, torch.stack(losses).cpu()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--twice", action="store_true", help="train again and check the bits agree")
    parser.add_argument("--output", type=Path, help="save the fine-tuned model here (save_pretrained)")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != HOPPER:
        print("hf_finetune: needs a Hopper GPU (compute capability 9.0); none is visible", file=sys.stderr)
        return 2
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda")

    model, losses = finetune(args.steps, device)
    print(
        f"hf_finetune: {type(model).__name__}, attn_implementation={model.config._attn_implementation!r}, "
        f"{sum(p.numel() for p in model.parameters())} parameters, {torch.cuda.get_device_name()}"
    )
    for step in range(0, len(losses), max(1, len(losses) // 6)):
        print(f"  step {step:4d}  loss {losses[step].item():.4f}")
    print(f"  step {len(losses) - 1:4d}  loss {losses[-1].item():.4f}")
    failed = False
    if not losses[-1] < losses[0]:
        print("hf_finetune: FAILED: the loss did not fall", file=sys.stderr)
        failed = True

    if args.twice:
        again, again_losses = finetune(args.steps, device)
        weights = model.state_dict()
        same = torch.equal(losses, again_losses) and all(
            torch.equal(weights[name], tensor) for name, tensor in again.state_dict().items()
        )
        print(
            f"hf_finetune: a second run from the same seed: losses and weights "
            f"{'bitwise identical' if same else 'DIFFER'}"
        )
        failed |= not same

    if args.output is not None:
        model.save_pretrained(args.output)
        print(f"hf_finetune: saved to {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
