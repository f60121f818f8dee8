"""Hugging Face models on DASH's kernels: tiny random-weight Llama, Qwen2 (GQA), Mistral (sliding window) and
Gemma 2 (head dim 256, softcap, alternating sliding and full layers) built from config objects (nothing is
downloaded), with attn_implementation="dash_attn" reached by `import dash_attn` alone.

Each family, in bf16 on the GPU:
- logits and every parameter's gradient against transformers' eager attention on the same weights: relative L2
  error below LOGITS_TOLERANCE and GRADIENT_TOLERANCE (bf16 attention against bf16 eager attention, whose
  probabilities are rounded to bf16 before the value product);
- the gradients of two runs bitwise identical under torch.use_deterministic_algorithms(True), dense and padded;
- a padded batch (right and left padding, with generate()'s position_ids) against each sequence alone, on the real
  tokens (relative L2 error below PADDING_TOLERANCE: the other layers' matmuls see other batch shapes);
- generate() on a left-padded batch: each step's logits against eager attention on the generated sequence
  (LOGITS_TOLERANCE).
Every test skips without transformers (5.4 or newer), a Hopper GPU and the library, or, naming it, without the
kernels of the family's head dim (and softcap).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")
pytest.importorskip("transformers", minversion="5.4", reason="the integration needs transformers>=5.4")

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    Gemma2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
)

import dash_attn  # noqa: E402,F401  (its import registers "dash_attn" with transformers)

VOCAB, SEQLEN, BATCH, WINDOW, SEED = 256, 96, 2, 32, 1234
NEW_TOKENS = 8
LOGITS_TOLERANCE = 2e-2
GRADIENT_TOLERANCE = 5e-2
PADDING_TOLERANCE = 2e-2

COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 512,
    "attention_dropout": 0.0,
}
FAMILIES = {
    "llama": lambda: LlamaConfig(**COMMON),
    "qwen2": lambda: Qwen2Config(**COMMON),
    "mistral_window": lambda: MistralConfig(**COMMON, sliding_window=WINDOW),
    "gemma2": lambda: Gemma2Config(
        **{**COMMON, "head_dim": 256, "num_attention_heads": 2, "num_key_value_heads": 1},
        query_pre_attn_scalar=256,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        sliding_window=WINDOW,
    ),
}


@pytest.fixture
def deterministic_algorithms():
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


@pytest.fixture
def family_config(request, device, library, require_kernel):
    """The family's config, after skipping where this build lacks its kernels (dense and varlen, with softcap
    where the family caps its scores)."""
    config = FAMILIES[request.param]()
    softcap = bool(getattr(config, "attn_logit_softcapping", None))
    require_kernel(config.head_dim, torch.bfloat16)
    if not library.kernel_available(config.head_dim, library.DTYPE_BF16, softcap, varlen=True):
        pytest.skip(
            f"this build has no varlen kernels for head_dim {config.head_dim} / bf16"
            f"{' with softcap' if softcap else ''} (DASH_VARLEN_KERNELS, DASH_SOFTCAP_KERNELS)"
        )
    return config


families = pytest.mark.parametrize("family_config", list(FAMILIES), indirect=True)


def model_of(config, implementation: str, device) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation, dtype=torch.bfloat16).to(device)


def token_ids(device) -> torch.Tensor:
    return torch.randint(VOCAB, (BATCH, SEQLEN), generator=torch.Generator().manual_seed(SEED)).to(device)


def padded_inputs(device, side: str) -> dict[str, torch.Tensor]:
    ids = token_ids(device)
    mask = torch.ones_like(ids)
    if side == "right":
        mask[0, SEQLEN - 37 :] = 0
    else:
        mask[1, :41] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm().clamp(min=1e-30)).item()


def logits_and_grads(model, **inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train()
    mask = inputs.get("attention_mask")
    labels = inputs["input_ids"] if mask is None else inputs["input_ids"].masked_fill(mask == 0, -100)
    output = model(**inputs, labels=labels, use_cache=False)
    output.loss.backward()
    return output.logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@families
def test_logits_and_gradients_match_eager_attention(family_config, device):
    ids = token_ids(device)
    dash_logits, dash_grads = logits_and_grads(model_of(family_config, "dash_attn", device), input_ids=ids)
    eager_logits, eager_grads = logits_and_grads(model_of(family_config, "eager", device), input_ids=ids)
    assert relative_error(dash_logits, eager_logits) < LOGITS_TOLERANCE
    for name, grad in dash_grads.items():
        assert relative_error(grad, eager_grads[name]) < GRADIENT_TOLERANCE, name


@families
@pytest.mark.parametrize("batch", ["dense", "padded"])
def test_gradients_are_bitwise_identical_across_two_runs(family_config, device, deterministic_algorithms, batch):
    inputs = {"input_ids": token_ids(device)} if batch == "dense" else padded_inputs(device, "right")
    (first_logits, first), (second_logits, second) = (
        logits_and_grads(model_of(family_config, "dash_attn", device), **inputs) for _ in range(2)
    )
    assert torch.equal(first_logits, second_logits)
    for name, grad in first.items():
        assert torch.isfinite(grad.float()).all(), name
        assert torch.equal(grad, second[name]), name


@families
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_matches_each_sequence_alone(family_config, device, side):
    model = model_of(family_config, "dash_attn", device).eval()
    inputs = padded_inputs(device, side)
    with torch.no_grad():
        logits = model(**inputs).logits
        for row in range(BATCH):
            keep = inputs["attention_mask"][row].bool()
            alone = model(inputs["input_ids"][row, keep][None]).logits[0]
            assert relative_error(logits[row, keep], alone) < PADDING_TOLERANCE, f"row {row}"


@families
def test_generate_works_on_a_left_padded_batch(family_config, device):
    model = model_of(family_config, "dash_attn", device).eval()
    inputs = padded_inputs(device, "left")
    mask = inputs["attention_mask"]
    with torch.no_grad():
        out = model.generate(
            input_ids=inputs["input_ids"],
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        sequences = out.sequences
        assert sequences.shape == (BATCH, SEQLEN + NEW_TOKENS)
        assert torch.equal(sequences[:, :SEQLEN], inputs["input_ids"])
        # Each step's logits against eager attention on the sequence generated so far (logits, not tokens: a
        # random model's greedy choice can hang on a tie that rounding breaks either way).
        full_mask = torch.cat((mask, torch.ones(BATCH, NEW_TOKENS, dtype=mask.dtype, device=device)), dim=1)
        eager = model_of(family_config, "eager", device).eval()
        expected = eager(
            sequences, attention_mask=full_mask, position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)
        ).logits
    for step, logits in enumerate(out.logits):
        assert relative_error(logits, expected[:, SEQLEN - 1 + step]) < LOGITS_TOLERANCE, f"step {step}"
