"""Tests of dash_attn.integrations.transformers, the "dash_attn" attention implementation of Hugging Face
Transformers.

On the CPU, dash_attn.flash_attn_func is replaced by a stand-in that records its arguments (bound to the real
signature) and computes attention with torch's SDPA in float32 under DASH's bottom-right causal mask, so whole
models run forward and backward. These tests check: registration (idempotent, accepted by from_config and
from_pretrained); the layout (transposed views in, (batch, seqlen, heads, head_dim) out); scaling, is_causal,
GQA, deterministic and schedule reaching the kernel call; every refusal, with its message naming the argument;
tiny Llama and Qwen2 models against their SDPA implementation; decoding with a DynamicCache; and, without the
stand-in, that the real entry point applies torch's determinism switch and refuses CPU tensors.

The GPU tests at the end run the real kernels: a tiny Llama trained twice gives bitwise-identical losses,
gradients and weights, close to the SDPA implementation's. Without transformers (5.4 or newer) the whole module
skips; without a Hopper GPU and the library, the GPU tests skip, saying why.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")
pytest.importorskip("transformers", minversion="5.4", reason="the integration needs transformers>=5.4")

import torch.nn.functional as F  # noqa: E402
from transformers import (  # noqa: E402
    AttentionInterface,
    AutoModelForCausalLM,
    DynamicCache,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    StaticCache,
)
from transformers.masking_utils import (  # noqa: E402
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
    sliding_window_causal_mask_function,
)

import dash_attn  # noqa: E402
from dash_attn.integrations import transformers as integration  # noqa: E402

BATCH, SEQLEN, HEADS, KV_HEADS, HEAD_DIM = 2, 16, 4, 2, 64
VOCAB = 256
SEED = 1234


@dataclass
class KernelCall:
    """One call of dash_attn.flash_attn_func: its tensors and every argument, defaults included."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    arguments: dict[str, object]


def bottom_right_causal(seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """DASH's causal mask: query row i sees key j iff j <= i + seqlen_k - seqlen_q."""
    rows = torch.arange(seqlen_q)[:, None]
    return torch.arange(seqlen_k)[None, :] <= rows + (seqlen_k - seqlen_q)


def attention_by_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """What DASH computes, on (batch, seqlen, heads, head_dim) tensors, by torch's SDPA in float32."""
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))
    mask = bottom_right_causal(q.shape[1], k.shape[1]) if causal else None
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).to(q.dtype)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> list[KernelCall]:
    """Replaces the integration's flash_attn_func by the SDPA stand-in; the list collects its calls."""
    calls: list[KernelCall] = []
    signature = inspect.signature(dash_attn.flash_attn_func)

    def stand_in(*args: object, **kwargs: object) -> torch.Tensor:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        q, k, v = arguments.pop("q"), arguments.pop("k"), arguments.pop("v")
        calls.append(KernelCall(q, k, v, arguments))
        return attention_by_sdpa(q, k, v, arguments["softmax_scale"], arguments["causal"])

    monkeypatch.setattr(integration, "flash_attn_func", stand_in)
    return calls


@pytest.fixture
def deterministic_algorithms():
    """Restores torch's determinism switch after a test that sets it."""
    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


class AttentionModule(torch.nn.Module):
    """What dash_attention_forward reads from the calling module: is_causal and config.output_attentions."""

    def __init__(self, is_causal: bool = True, output_attentions: bool = False) -> None:
        super().__init__()
        self.is_causal = is_causal
        self.config = LlamaConfig(output_attentions=output_attentions)


def states(
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    seqlen_q: int = SEQLEN,
    seqlen_k: int = SEQLEN,
    head_dim: int = HEAD_DIM,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query, key, value in transformers' (batch, heads, seqlen, head_dim), made as its models make them: a
    projection viewed as (batch, seqlen, heads, head_dim), then transposed."""
    generator = torch.Generator().manual_seed(SEED)

    def draw(seqlen: int, n: int) -> torch.Tensor:
        return torch.randn(BATCH, seqlen, n, head_dim, generator=generator).to(dtype).transpose(1, 2)

    return draw(seqlen_q, heads), draw(seqlen_k, kv_heads), draw(seqlen_k, kv_heads)


def tiny_config(family: type = LlamaConfig, **overrides: object):
    """A 2-layer model of hidden size 128: 2 query heads of dim 64 sharing 1 key/value head (GQA)."""
    settings = {
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 512,
    }
    return family(**{**settings, **overrides})


def tiny_model(config, attn_implementation: str = "dash_attn", dtype: torch.dtype = torch.bfloat16):
    torch.manual_seed(SEED)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype).eval()


def token_ids(batch: int = BATCH, seqlen: int = SEQLEN) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, seqlen), generator=torch.Generator().manual_seed(SEED))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.fixture(autouse=True)
def registered() -> None:
    integration.register()


# Registration.


def test_register_is_idempotent_and_returns_the_name():
    attention_names, mask_names = set(AttentionInterface._global_mapping), set(AttentionMaskInterface._global_mapping)
    assert integration.register() == integration.register() == "dash_attn"
    assert AttentionInterface._global_mapping["dash_attn"] is integration.dash_attention_forward
    assert AttentionMaskInterface._global_mapping["dash_attn"] is integration.dash_attention_mask
    assert set(AttentionInterface._global_mapping) == attention_names
    assert set(AttentionMaskInterface._global_mapping) == mask_names


def test_the_package_imports_the_integration_only_on_request():
    code = "import sys, dash_attn, dash_attn.integrations; print('transformers' in sys.modules)"
    # The child imports the dash_attn this process imported, installed or not.
    env = {**os.environ, "PYTHONPATH": str(Path(dash_attn.__file__).parents[1])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip() == "False"


def test_from_config_and_from_pretrained_accept_dash_attn(tmp_path, kernel):
    model = tiny_model(tiny_config())
    assert model.config._attn_implementation == "dash_attn"
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=integration.register())
    assert loaded.config._attn_implementation == "dash_attn"
    loaded(token_ids())
    assert len(kernel) == 2  # one call per layer


# The attention function: layouts and forwarded arguments.


def test_states_go_in_as_transposed_views_and_the_output_comes_back_in_bshd(kernel):
    query, key, value = states()
    out, weights = integration.dash_attention_forward(AttentionModule(), query, key, value, None, scaling=0.3)
    assert weights is None
    (call,) = kernel
    for sent, received in ((query, call.q), (key, call.k), (value, call.v)):
        assert received.shape == sent.transpose(1, 2).shape
        assert received.data_ptr() == sent.data_ptr() and received.stride() == sent.transpose(1, 2).stride()
    assert out.shape == (BATCH, SEQLEN, HEADS, HEAD_DIM)
    assert torch.equal(out, attention_by_sdpa(call.q, call.k, call.v, 0.3, True))
    # GQA: the key/value heads go in as they are, never repeated.
    assert call.k.shape[2] == KV_HEADS


def test_scale_causal_and_determinism_reach_the_kernel(kernel):
    query, key, value = states()
    integration.dash_attention_forward(AttentionModule(is_causal=False), query, key, value, None, scaling=0.25)
    integration.dash_attention_forward(AttentionModule(), query, key, value, None)
    integration.dash_attention_forward(
        AttentionModule(), query, key, value, None, is_causal=False, deterministic=False, schedule="auto"
    )
    integration.dash_attention_forward(AttentionModule(), query, key, value, None, schedule="shortest-first")
    seen = [
        {name: call.arguments[name] for name in ("softmax_scale", "causal", "deterministic", "schedule")}
        for call in kernel
    ]
    assert seen == [
        {"softmax_scale": 0.25, "causal": False, "deterministic": True, "schedule": "auto"},
        {"softmax_scale": HEAD_DIM**-0.5, "causal": True, "deterministic": True, "schedule": "auto"},
        {"softmax_scale": HEAD_DIM**-0.5, "causal": False, "deterministic": False, "schedule": "auto"},
        {"softmax_scale": HEAD_DIM**-0.5, "causal": True, "deterministic": True, "schedule": "shortest-first"},
    ]
    for call in kernel:
        assert call.arguments["dropout_p"] == 0.0 and call.arguments["window_size"] == (-1, -1)


def test_softcap_reaches_the_kernel(kernel):
    query, key, value = states()
    integration.dash_attention_forward(AttentionModule(), query, key, value, None, softcap=50.0)
    integration.dash_attention_forward(AttentionModule(), query, key, value, None, softcap=None)
    assert [call.arguments["softcap"] for call in kernel] == [50.0, 0.0]


def test_a_module_without_is_causal_is_causal(kernel):
    query, key, value = states()
    integration.dash_attention_forward(torch.nn.Module(), query, key, value, None)
    assert kernel[0].arguments["causal"] is True


def test_no_op_values_and_unrelated_keywords_pass(kernel):
    query, key, value = states()
    integration.dash_attention_forward(
        AttentionModule(),
        query,
        key,
        value,
        None,
        dropout=0,
        sliding_window=None,
        softcap=0.0,
        s_aux=None,
        cu_seq_lens_q=None,
        output_attentions=False,
        position_ids=torch.arange(3, SEQLEN + 3)[None],
        use_cache=False,
        num_items_in_batch=torch.tensor(7),
    )
    assert len(kernel) == 1


def test_multimodal_rotary_positions_are_not_read_as_packing(kernel):
    query, key, value = states()
    # (3, batch, seqlen): temporal, height and width positions, which repeat for the tokens of one image.
    positions = torch.zeros(3, BATCH, SEQLEN, dtype=torch.long)
    integration.dash_attention_forward(AttentionModule(), query, key, value, None, position_ids=positions)
    assert len(kernel) == 1


def test_fp32_states_are_cast_under_autocast(kernel):
    query, key, value = states(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = integration.dash_attention_forward(AttentionModule(), query, key, value, None)
    assert kernel[0].q.dtype == kernel[0].k.dtype == kernel[0].v.dtype == torch.bfloat16
    assert out.dtype == torch.bfloat16


# The attention function: refusals. Each names the argument; none reaches the kernel.


def call_arguments(**overrides: object) -> dict[str, object]:
    """The attention function's arguments, by name: a causal module, states(), no mask, then `overrides`."""
    query, key, value = states()
    return {
        "module": AttentionModule(),
        "query": query,
        "key": key,
        "value": value,
        "attention_mask": None,
        **overrides,
    }


REFUSALS = [
    (
        {"attention_mask": torch.ones(BATCH, 1, SEQLEN, SEQLEN, dtype=torch.bool)},
        NotImplementedError,
        r"attention_mask=<torch\.bool tensor.*prepared 4-D mask",
    ),
    (
        {"dropout": 0.1},
        NotImplementedError,
        r"dropout=0\.1 is not supported: DASH has no attention dropout.*config\.attention_dropout",
    ),
    (
        {"sliding_window": 4096},
        NotImplementedError,
        r"sliding_window=4096 is not supported: DASH's transformers integration has no sliding-window",
    ),
    ({"softcap": -1.0}, ValueError, r"softcap must be finite and >= 0 \(0: no capping\), got -1\.0"),
    ({"s_aux": torch.zeros(HEADS)}, NotImplementedError, r"s_aux=<.*> is not supported: DASH has no attention sinks"),
    ({"sinks": torch.zeros(HEADS)}, NotImplementedError, r"sinks=<.*> is not supported: DASH has no attention sinks"),
    (
        {"position_bias": torch.zeros(1, HEADS, SEQLEN, SEQLEN)},
        NotImplementedError,
        r"position_bias=<.*> is not supported: DASH has no additive position bias",
    ),
    (
        {"cu_seq_lens_q": torch.tensor([0, 8, 16])},
        NotImplementedError,
        r"cu_seq_lens_q=<.*> is not supported: DASH's transformers integration takes no variable-length",
    ),
    (
        {"cu_seq_lens_k": torch.tensor([0, 8, 16])},
        NotImplementedError,
        r"cu_seq_lens_k=<.*> is not supported: DASH's transformers integration takes no variable-length",
    ),
    ({"max_length_q": 8}, NotImplementedError, r"max_length_q=8 is not supported: DASH's transformers integration takes no variable-length"),
    ({"max_length_k": 8}, NotImplementedError, r"max_length_k=8 is not supported: DASH's transformers integration takes no variable-length"),
    (
        {"seq_idx": torch.zeros(BATCH, SEQLEN, dtype=torch.int32)},
        NotImplementedError,
        r"seq_idx=<.*> is not supported: DASH's transformers integration takes no variable-length",
    ),
    (
        {"position_ids": torch.tensor([[0, 1, 2, 0, 1, 2]])},
        NotImplementedError,
        r"position_ids restart or jump within a row",
    ),
    (
        {"position_ids": torch.tensor([[0, 1, 2], [5, 6, 8]])},
        NotImplementedError,
        r"position_ids restart or jump within a row",
    ),
    ({"output_attentions": True}, NotImplementedError, r"output_attentions=True is not supported.*eager"),
    (
        {"module": AttentionModule(output_attentions=True)},
        NotImplementedError,
        r"output_attentions=True is not supported",
    ),
    ({"is_causal": 1}, TypeError, r"is_causal must be a bool"),
    ({"scaling": 0.0}, ValueError, r"scaling must be finite and > 0"),
]


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    REFUSALS,
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_refusals_name_the_argument(kernel, overrides, error, message):
    with pytest.raises(error, match=message):
        integration.dash_attention_forward(**call_arguments(**overrides))
    assert not kernel


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": torch.float32}, r"query\.dtype=torch\.float32 is not supported.*dtype=torch\.bfloat16"),
        (
            {"head_dim": 80},
            r"head_dim=80 \(query\.shape\[3\]\) is not supported: DASH has kernels for head dims "
            r"\(64, 96, 128, 192, 256\)",
        ),
    ],
    ids=["fp32", "head_dim_80"],
)
def test_states_dash_has_no_kernel_for_are_refused(kernel, kwargs, message):
    query, key, value = states(**kwargs)
    with pytest.raises(NotImplementedError, match=message):
        integration.dash_attention_forward(AttentionModule(), query, key, value, None)
    assert not kernel


def test_a_value_head_dim_other_than_the_query_one_is_refused(kernel):
    query, key, _ = states()
    value = states(head_dim=128)[2]
    with pytest.raises(
        NotImplementedError, match=r"value's head_dim=128 \(value\.shape\[3\]\) differs from query's \(64\)"
    ):
        integration.dash_attention_forward(AttentionModule(), query, key, value, None)
    assert not kernel


# The mask function.


@pytest.mark.parametrize(
    "sizes",
    [
        {"q_length": SEQLEN, "kv_length": SEQLEN},  # training, prefill
        {"q_length": 1, "kv_length": SEQLEN, "q_offset": SEQLEN - 1},  # decoding with a DynamicCache
        {"q_length": 4, "kv_length": SEQLEN, "q_offset": torch.tensor(SEQLEN - 4)},  # the offset as a 0-d tensor
    ],
    ids=["training", "decoding", "tensor_offset"],
)
def test_the_plain_causal_mask_is_none(sizes):
    assert integration.dash_attention_mask(mask_function=causal_mask_function, batch_size=BATCH, **sizes) is None
    all_ones = torch.ones(BATCH, sizes["kv_length"], dtype=torch.bool)
    assert integration.dash_attention_mask(mask_function=causal_mask_function, attention_mask=all_ones, **sizes) is None


def test_the_full_mask_is_none_for_any_lengths():
    mask = integration.dash_attention_mask(
        q_length=SEQLEN, kv_length=3 * SEQLEN, mask_function=bidirectional_mask_function
    )
    assert mask is None


@pytest.mark.parametrize("mask_function", [causal_mask_function, bidirectional_mask_function], ids=["causal", "full"])
def test_padding_is_refused(mask_function):
    padded = torch.ones(BATCH, SEQLEN, dtype=torch.bool)
    padded[1, :3] = False
    with pytest.raises(NotImplementedError, match=r"attention_mask marks padding \(zeros\): DASH has no padding masks"):
        integration.dash_attention_mask(
            q_length=SEQLEN, kv_length=SEQLEN, mask_function=mask_function, attention_mask=padded
        )


def test_a_mask_of_another_length_is_refused():
    short = torch.ones(BATCH, SEQLEN - 2, dtype=torch.bool)
    with pytest.raises(
        NotImplementedError, match=rf"attention_mask covers {SEQLEN - 2} keys but the attention has {SEQLEN}"
    ):
        integration.dash_attention_mask(
            q_length=SEQLEN, kv_length=SEQLEN, mask_function=bidirectional_mask_function, attention_mask=short
        )


def test_keys_that_are_not_the_tokens_seen_are_refused():
    with pytest.raises(
        NotImplementedError, match=r"keys cover positions \[0, 64\) but the queries end at position 16.*DynamicCache"
    ):
        integration.dash_attention_mask(q_length=SEQLEN, kv_length=64, mask_function=causal_mask_function)


def test_other_masks_are_refused():
    with pytest.raises(
        NotImplementedError, match=r"an attention mask other than the causal or full one: a sliding window"
    ):
        integration.dash_attention_mask(
            q_length=SEQLEN, kv_length=SEQLEN, mask_function=sliding_window_causal_mask_function(4)
        )


# Whole models on the CPU, with the stand-in kernel.


@pytest.mark.parametrize("family", [LlamaConfig, Qwen2Config], ids=["llama", "qwen2"])
def test_a_tiny_model_matches_its_sdpa_implementation(kernel, family):
    model = tiny_model(tiny_config(family))
    ids = token_ids()
    logits = model(ids).logits
    assert len(kernel) == 2 and all(call.arguments["causal"] for call in kernel)
    assert [tuple(call.q.shape) for call in kernel] == [(BATCH, SEQLEN, 2, HEAD_DIM)] * 2
    assert [tuple(call.k.shape) for call in kernel] == [(BATCH, SEQLEN, 1, HEAD_DIM)] * 2
    model.set_attn_implementation("sdpa")
    assert relative_error(logits, model(ids).logits) < 1e-2


def test_a_tiny_model_trains_through_the_stand_in(kernel):
    model = tiny_model(tiny_config()).train()
    ids = token_ids()
    model(ids, labels=ids).loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g.float()).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def cache_keyword(model, cache) -> dict:
    """The cache as the keyword this transformers takes: `past_key_values` until 5.2x renamed it `cache`. A
    wrong name would be swallowed by **kwargs and run without the cache, so ask the signature."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def test_decoding_with_a_dynamic_cache_sees_every_cached_key(kernel):
    model = tiny_model(tiny_config())
    ids = token_ids()
    full = model(ids).logits[:, -1]
    cache = DynamicCache(config=model.config)
    model(ids[:, :-1], **cache_keyword(model, cache), use_cache=True)
    last = model(ids[:, -1:], **cache_keyword(model, cache), use_cache=True).logits[:, -1]
    decode = kernel[-1]
    assert decode.q.shape[1] == 1 and decode.k.shape[1] == SEQLEN and decode.arguments["causal"] is True
    assert relative_error(last, full) < 1e-2


def test_an_all_ones_attention_mask_is_accepted(kernel):
    model = tiny_model(tiny_config())
    ids = token_ids()
    assert torch.equal(model(ids, attention_mask=torch.ones_like(ids)).logits, model(ids).logits)


def test_a_padded_batch_is_refused(kernel):
    model = tiny_model(tiny_config())
    ids = token_ids()
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with pytest.raises(NotImplementedError, match=r"attention_mask marks padding"):
        model(ids, attention_mask=mask)
    assert not kernel


@pytest.mark.parametrize(
    ("use_cache", "message"),
    [
        # Without a cache, transformers' mask creation finds the packing and asks for its mask.
        (False, r"packed sequences \(position_ids that restart within a row"),
        # With one (config.use_cache is on by default), it does not look: the attention function does.
        (True, r"position_ids restart or jump within a row, which marks packed sequences"),
    ],
    ids=["found_by_the_mask", "found_by_the_attention"],
)
def test_a_packed_batch_is_refused(kernel, use_cache, message):
    model = tiny_model(tiny_config())
    ids = token_ids(batch=1)
    packed = torch.cat([torch.arange(SEQLEN // 2), torch.arange(SEQLEN // 2)])[None]
    with pytest.raises(NotImplementedError, match=message):
        model(ids, position_ids=packed, use_cache=use_cache)
    assert not kernel


def test_a_static_cache_is_refused(kernel):
    model = tiny_model(tiny_config())
    with pytest.raises(NotImplementedError, match=r"static cache"):
        static = StaticCache(config=model.config, max_cache_len=4 * SEQLEN)
        model(token_ids(), **cache_keyword(model, static), use_cache=True)
    assert not kernel


def test_a_sliding_window_model_is_refused(kernel):
    model = tiny_model(tiny_config(MistralConfig, sliding_window=8))
    with pytest.raises(NotImplementedError, match=r"a sliding window \(config\.sliding_window"):
        model(token_ids())
    assert not kernel


def test_attention_dropout_is_refused_in_training_only(kernel):
    model = tiny_model(tiny_config(attention_dropout=0.1))
    model(token_ids())
    model.train()
    with pytest.raises(NotImplementedError, match=r"dropout=0\.1 is not supported"):
        model(token_ids())


def test_output_attentions_is_refused_through_the_model(kernel):
    model = tiny_model(tiny_config())
    with pytest.raises(NotImplementedError, match=r"output_attentions=True is not supported"):
        model(token_ids(), output_attentions=True)


def test_an_fp32_model_is_refused_and_runs_under_autocast(kernel):
    model = tiny_model(tiny_config(), dtype=torch.float32)
    with pytest.raises(NotImplementedError, match=r"query\.dtype=torch\.float32 is not supported"):
        model(token_ids())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(token_ids())
    assert [call.q.dtype for call in kernel] == [torch.bfloat16] * 2


# The real entry point behind the integration, on the CPU: no stand-in.


def test_the_real_entry_point_refuses_cpu_tensors():
    model = tiny_model(tiny_config())
    with pytest.raises(ValueError, match=r"must be CUDA tensors"):
        model(token_ids())


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"deterministic": "yes"}, TypeError, r"deterministic must be a bool"),
        ({"schedule": "fastest"}, ValueError, r"schedule must be one of"),
        ({"deterministic": True, "schedule": "nondeterministic"}, ValueError, r"contradicts deterministic=True"),
    ],
    ids=["deterministic", "schedule", "contradiction"],
)
def test_the_real_entry_point_checks_deterministic_and_schedule(overrides, error, message):
    with pytest.raises(error, match=message):
        integration.dash_attention_forward(**call_arguments(**overrides))


def test_the_determinism_switch_refuses_deterministic_false_through_the_model(deterministic_algorithms):
    model = tiny_model(tiny_config()).train()
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=r"deterministic=False.*use_deterministic_algorithms\(True\)"):
        model(token_ids(), deterministic=False)


# GPU: the real kernels.

GPU_SEQLEN = 512
GPU_STEPS = 5


def train(device: torch.device, attn_implementation: str, steps: int) -> dict[str, object]:
    """`steps` AdamW steps of the tiny Llama in bf16 on fixed random tokens: the losses, and the first step's
    logits and gradients, and the final weights."""
    model = tiny_model(tiny_config(max_position_embeddings=GPU_SEQLEN), attn_implementation).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = token_ids(seqlen=GPU_SEQLEN).to(device)
    losses, first = [], {}
    for step in range(steps):
        output = model(ids, labels=ids)
        output.loss.backward()
        if step == 0:
            first = {
                "logits": output.logits.detach(),
                "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            }
        losses.append(output.loss.item())
        optimizer.step()
        optimizer.zero_grad()
    return dict(losses=losses, **first, weights={n: p.detach().clone() for n, p in model.state_dict().items()})


def test_training_on_the_gpu_is_bitwise_reproducible(device, require_kernel, deterministic_algorithms):
    require_kernel(HEAD_DIM, torch.bfloat16)
    torch.use_deterministic_algorithms(True)
    first, second = (train(device, "dash_attn", GPU_STEPS) for _ in range(2))
    assert first["losses"] == second["losses"]
    assert torch.equal(first["logits"], second["logits"])
    for name, grad in first["grads"].items():
        assert torch.equal(grad, second["grads"][name]), name
    for name, weight in first["weights"].items():
        assert torch.equal(weight, second["weights"][name]), name


def test_training_on_the_gpu_is_close_to_sdpa(device, require_kernel):
    require_kernel(HEAD_DIM, torch.bfloat16)
    dash, sdpa = (train(device, implementation, 1) for implementation in ("dash_attn", "sdpa"))
    assert relative_error(dash["logits"], sdpa["logits"]) < 1e-2
    for name, grad in dash["grads"].items():
        assert relative_error(grad, sdpa["grads"][name]) < 3e-2, name
