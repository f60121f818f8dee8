"""Tests of dash_attn.integrations.transformers, the "dash_attn" attention implementation of Hugging Face
Transformers.

On the CPU, dash_attn.flash_attn_func and dash_attn.flash_attn_varlen_func are replaced by stand-ins that record
their arguments (bound to the real signatures) and compute attention with torch's SDPA in float32 under DASH's
bottom-right causal mask (the varlen one sequence at a time), so whole models run forward and backward. These
tests check: registration (idempotent, accepted by from_config and from_pretrained, made by `import dash_attn`
alone when transformers loads, without dash_attn importing transformers); the layout (transposed views in, (batch,
seqlen, heads, head_dim) out); scaling, is_causal, GQA, deterministic and schedule reaching the kernel call; packed
sequences (from position_ids or cu_seq_lens_*) reaching the varlen call as views with int32 offsets, read once per
forward; sliding_window reaching the kernels as window_size; every refusal, with its message naming the argument;
the mask hook, packed, padded and sliding-window masks included; padded batches (left and right padding) through
unpad -> varlen -> pad on tiny Llama, Qwen2, Mistral (window) and Gemma 2 (head dim 256, softcap, window) models
against each sequence alone, padding rows zero and without gradient, and generate() on a left-padded batch;
deterministic=True whatever transformers' FLASH_ATTENTION_DETERMINISTIC says; tiny Llama and Qwen2 models against
their SDPA implementation, dense and packed, and packed against each document run alone; tiny Mistral and mixed-layer
Qwen2 models with sliding windows against their SDPA implementation; decoding with a DynamicCache; and, without the
stand-ins, that the real entry point applies torch's determinism switch and refuses CPU tensors.

The GPU tests at the end run the real kernels: a tiny Llama trained twice, on dense or on packed batches (and a
tiny Mistral with a sliding window on packed ones), gives bitwise-identical losses, gradients and weights, close to
the SDPA implementation's. Without transformers (5.4 or
newer) the whole module skips; without a Hopper GPU and the library, the GPU tests skip, saying why.
"""

from __future__ import annotations

import inspect
import itertools
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
    Gemma2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    StaticCache,
    masking_utils,  # noqa: E402
)
from transformers.masking_utils import (  # noqa: E402
    AttentionMaskInterface,
    and_masks,
    bidirectional_mask_function,
    causal_mask_function,
    chunked_causal_mask_function,
    find_packed_sequence_indices,
    packed_sequence_mask_function,
    sliding_window_bidirectional_mask_function,
    sliding_window_causal_mask_function,
)

import dash_attn  # noqa: E402
from dash_attn.integrations import transformers as integration  # noqa: E402

BATCH, SEQLEN, HEADS, KV_HEADS, HEAD_DIM = 2, 16, 4, 2, 64
VOCAB = 256
SEED = 1234
WINDOW = 4  # the sliding window of the tiny windowed models


@dataclass
class KernelCall:
    """One call of dash_attn.flash_attn_func or flash_attn_varlen_func (`function`): its tensors and every
    argument, defaults included."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    arguments: dict[str, object]
    function: str = "flash_attn_func"


def bottom_right_mask(seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int]) -> torch.Tensor:
    """DASH's mask: with d = seqlen_k - seqlen_q, query row i sees key j iff i + d - left <= j <= i + d + right,
    right = 0 when causal, -1 leaving a side open."""
    left, right = window_size
    right = 0 if causal else right
    shift = torch.arange(seqlen_k)[None, :] - torch.arange(seqlen_q)[:, None] - (seqlen_k - seqlen_q)
    return ((shift <= right) | (right < 0)) & ((shift >= -left) | (left < 0))


def attention_by_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    window_size=(-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """What DASH computes, on (batch, seqlen, heads, head_dim) tensors, by torch's SDPA in float32 (by hand with
    softcap > 0, which caps each scaled score to softcap * tanh(score / softcap))."""
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))
    mask = bottom_right_mask(q.shape[1], k.shape[1], causal, window_size)
    if softcap > 0:
        group = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
        scores = softcap * torch.tanh(qh @ kh.transpose(-1, -2) * scale / softcap)
        out = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).nan_to_num() @ vh
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).to(q.dtype)


def packed_attention_by_sdpa(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float = 0.0,
) -> torch.Tensor:
    """What DASH's varlen computes, on packed (total, heads, head_dim) tensors: each sequence by attention_by_sdpa
    alone; rows after the last sequence are 0."""
    out = torch.zeros_like(q)
    bounds = zip(cu_seqlens_q.tolist(), cu_seqlens_q.tolist()[1:], cu_seqlens_k.tolist(), cu_seqlens_k.tolist()[1:])
    for q_start, q_end, k_start, k_end in bounds:
        document = (q[None, q_start:q_end], k[None, k_start:k_end], v[None, k_start:k_end])
        out[q_start:q_end] = attention_by_sdpa(*document, scale, causal, window_size, softcap)[0]
    return out


def bound_arguments(function: object, args: tuple, kwargs: dict) -> dict[str, object]:
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> list[KernelCall]:
    """Replaces the integration's flash_attn_func and flash_attn_varlen_func by the SDPA stand-ins; the list
    collects their calls."""
    calls: list[KernelCall] = []

    def dense_stand_in(*args: object, **kwargs: object) -> torch.Tensor:
        arguments = bound_arguments(dash_attn.flash_attn_func, args, kwargs)
        q, k, v = arguments.pop("q"), arguments.pop("k"), arguments.pop("v")
        calls.append(KernelCall(q, k, v, arguments))
        return attention_by_sdpa(
            q, k, v, arguments["softmax_scale"], arguments["causal"], arguments["window_size"], arguments["softcap"]
        )

    def varlen_stand_in(*args: object, **kwargs: object) -> torch.Tensor:
        arguments = bound_arguments(dash_attn.flash_attn_varlen_func, args, kwargs)
        q, k, v = arguments.pop("q"), arguments.pop("k"), arguments.pop("v")
        calls.append(KernelCall(q, k, v, arguments, "flash_attn_varlen_func"))
        return packed_attention_by_sdpa(
            q,
            k,
            v,
            *(arguments[name] for name in ("cu_seqlens_q", "cu_seqlens_k", "softmax_scale", "causal")),
            arguments["window_size"],
            arguments["softcap"],
        )

    monkeypatch.setattr(integration, "flash_attn_func", dense_stand_in)
    monkeypatch.setattr(integration, "flash_attn_varlen_func", varlen_stand_in)
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


def run_fresh(code: str, **env: str) -> str:
    """stdout of `python -c code` in a new interpreter that imports the dash_attn this process imported."""
    environment = {**os.environ, "PYTHONPATH": str(Path(dash_attn.__file__).parents[1]), **env}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


REGISTERED = (
    "from transformers import AttentionInterface; from transformers.masking_utils import AttentionMaskInterface; "
    "print('dash_attn' in AttentionInterface._global_mapping and 'dash_attn' in AttentionMaskInterface._global_mapping)"
)


def test_import_dash_attn_registers_with_transformers_when_transformers_loads():
    code = (
        "import sys, dash_attn; from dash_attn.integrations import _transformers_hook as hook; "
        "print('transformers' in sys.modules); " + REGISTERED + "; print(hook._finder in sys.meta_path)"
    )
    # dash_attn imports no transformers; transformers' registry has "dash_attn" once loaded; the finder is gone.
    assert run_fresh(code).split() == ["False", "True", "False"]


def test_import_dash_attn_after_transformers_registers_at_once():
    code = "import transformers.modeling_utils, dash_attn; " + REGISTERED
    assert run_fresh(code) == "True"


def test_a_model_takes_dash_attn_without_an_explicit_register():
    code = (
        "import dash_attn; from transformers import AutoModelForCausalLM, LlamaConfig; "
        "config = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1, "
        "num_attention_heads=2, num_key_value_heads=1); "
        "print(AutoModelForCausalLM.from_config(config, attn_implementation='dash_attn').config._attn_implementation)"
    )
    assert run_fresh(code) == "dash_attn"


def test_an_integration_that_cannot_load_warns_and_leaves_transformers_alone(monkeypatch):
    from dash_attn.integrations import _transformers_hook

    monkeypatch.setitem(sys.modules, "dash_attn.integrations.transformers", None)  # its import raises ImportError
    with pytest.warns(UserWarning, match='dash_attn did not register "dash_attn" with transformers: ModuleNotFound'):
        _transformers_hook._register()
    monkeypatch.setattr(integration, "register", lambda: 1 / 0)  # transformers' internals changed under it
    monkeypatch.setitem(sys.modules, "dash_attn.integrations.transformers", integration)
    with pytest.warns(UserWarning, match="ZeroDivisionError"):
        _transformers_hook._register()


def test_the_hook_answers_only_its_module():
    from dash_attn.integrations import _transformers_hook

    assert _transformers_hook._finder.find_spec("json", None) is None
    assert _transformers_hook._finder.find_spec("transformers", None) is None


def test_a_models_own_flash_deterministic_flag_does_not_turn_determinism_off(kernel):
    # ModernBERT passes config.deterministic_flash_attn (False by default, as in FlashAttention) to every attention
    # call; DASH stays deterministic unless schedule="nondeterministic" asks otherwise.
    module = AttentionModule()
    module.deterministic_flash_attn = False
    query, key, value = states()
    integration.dash_attention_forward(module, query, key, value, None, deterministic=False)
    integration.dash_attention_forward(module, query, key, value, None, deterministic=True)
    integration.dash_attention_forward(
        module, query, key, value, None, deterministic=False, schedule="nondeterministic"
    )
    # Elsewhere schedule="nondeterministic" alone asks for it too.
    integration.dash_attention_forward(AttentionModule(), query, key, value, None, schedule="nondeterministic")
    seen = [(call.arguments["deterministic"], call.arguments["schedule"]) for call in kernel]
    assert seen == [(True, "auto"), (True, "auto"), (False, "nondeterministic"), (False, "nondeterministic")]


@pytest.mark.parametrize("flag", [None, "0", "1"])
def test_a_model_stays_deterministic_whatever_transformers_flash_flag_says(kernel, monkeypatch, flag):
    # transformers' flash-attention wrapper reads FLASH_ATTENTION_DETERMINISTIC (default off); DASH's path does not.
    if flag is None:
        monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC", raising=False)
    else:
        monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", flag)
    model = tiny_model(tiny_config())
    ids, mask, positions = padded_batch("right")
    model(ids)
    model(ids, attention_mask=mask, position_ids=positions)
    assert [call.arguments["deterministic"] for call in kernel] == [True] * 4
    model(ids, deterministic=False)  # the user's own choice, passed to the model's forward
    assert [call.arguments["deterministic"] for call in kernel[4:]] == [False] * 2


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


def test_softcap_reaches_the_varlen_kernel_with_packed_sequences(kernel):
    """Packed sequences found either way (cu_seq_lens_*, position_ids) take softcap as dense calls do."""
    packed_by = [packing_keywords(), {"position_ids": packed_positions(8, 8).expand(BATCH, -1)}]
    for keywords in packed_by:
        integration.dash_attention_forward(**call_arguments(softcap=30.0, **keywords))
    assert [(call.function, call.arguments["softcap"]) for call in kernel] == [("flash_attn_varlen_func", 30.0)] * 2


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


def packed_positions(*lengths: int) -> torch.Tensor:
    """position_ids of one row holding documents of `lengths`, as DataCollatorWithFlattening makes them."""
    return torch.cat([torch.arange(length) for length in lengths])[None]


def offsets(*lengths: int) -> torch.Tensor:
    """cu_seq_lens of documents of `lengths`, as DataCollatorWithFlattening makes them (int32)."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def packing_keywords(**overrides: object) -> dict[str, object]:
    """cu_seq_lens_q/k and max_length_q/k of two documents of 8 and 24 tokens (both rows of states() flattened),
    as two equal tensors, then `overrides`."""
    return {
        "cu_seq_lens_q": offsets(8, 24),
        "cu_seq_lens_k": offsets(8, 24),
        "max_length_q": 24,
        "max_length_k": 24,
        **overrides,
    }


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
    ({"sliding_window": 0}, ValueError, r"sliding_window must be an int >= 1 \(the keys a query sees\), got 0"),
    (
        {"sliding_window": 8, "is_causal": False},
        NotImplementedError,
        r"sliding_window=8 is not supported without causal attention \(is_causal=False\)",
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
        ValueError,
        r"cu_seq_lens_q passed without cu_seq_lens_k, max_length_q, max_length_k: packed sequences need all",
    ),
    (
        {"cu_seq_lens_k": torch.tensor([0, 8, 16]), "max_length_k": 8},
        ValueError,
        r"cu_seq_lens_k, max_length_k passed without cu_seq_lens_q, max_length_q",
    ),
    (
        packing_keywords(cu_seq_lens_q=torch.tensor([0.0, 8.0, 16.0])),
        ValueError,
        r"cu_seq_lens_q must be a 1-D integer tensor",
    ),
    (
        packing_keywords(cu_seq_lens_k=torch.tensor([0, 16])),
        ValueError,
        r"cu_seq_lens_k has 2 offsets but cu_seq_lens_q 3",
    ),
    (packing_keywords(max_length_q=8.0), ValueError, r"max_length_q must be an int \(the longest sequence\), got 8\.0"),
    (
        {"position_ids": torch.tensor([[0, 1, 2, 0, 1, 2]])},
        NotImplementedError,
        r"position_ids of shape \(1, 6\) restart within a row.*do not give one position per query token",
    ),
    (
        {"position_ids": packed_positions(8, 8).expand(BATCH, -1), "key": states(seqlen_k=2 * SEQLEN)[1]},
        NotImplementedError,
        r"position_ids restart within a row \(packed sequences\), but the layer has 32 keys for 16 queries",
    ),
    (
        {"seq_idx": torch.tensor([[0] * 8 + [1] * 8] * BATCH, dtype=torch.int32)},
        NotImplementedError,
        r"seq_idx marks several sequences in a row, but neither position_ids",
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
def test_padding_becomes_the_real_tokens_rows_and_offsets(mask_function):
    padded = torch.ones(BATCH, SEQLEN, dtype=torch.bool)
    padded[1, :3] = False  # left padding
    padded[0, -2:] = False  # right padding
    batch = integration.dash_attention_mask(
        q_length=SEQLEN, kv_length=SEQLEN, mask_function=mask_function, attention_mask=padded
    )
    assert isinstance(batch, integration.PaddedBatch)
    expected_rows = padded.reshape(-1).nonzero().reshape(-1)
    assert torch.equal(batch.indices_q, expected_rows) and batch.indices_k is batch.indices_q
    assert batch.cu_seqlens_q.dtype == torch.int32 and batch.cu_seqlens_q.tolist() == [0, SEQLEN - 2, 2 * SEQLEN - 5]
    # One offsets tensor for queries and keys: the self-attention promise that lets the backward use shift.
    assert batch.cu_seqlens_k is batch.cu_seqlens_q
    assert (batch.max_seqlen_q, batch.max_seqlen_k, batch.kv_length) == (SEQLEN - 2, SEQLEN - 2, SEQLEN)


def test_decoding_padding_takes_the_last_query_column_and_a_sliding_layer_the_last_keys():
    mask = torch.ones(BATCH, SEQLEN, dtype=torch.bool)
    mask[0, :5] = False
    decode = integration.dash_attention_mask(
        q_length=1, kv_length=SEQLEN, q_offset=SEQLEN - 1, mask_function=causal_mask_function, attention_mask=mask
    )
    assert decode.indices_q.tolist() == [0, 1] and decode.cu_seqlens_q.tolist() == [0, 1, 2]
    assert decode.cu_seqlens_k.tolist() == [0, SEQLEN - 5, 2 * SEQLEN - 5] and decode.max_seqlen_k == SEQLEN
    # A sliding layer's cache keeps the last 8 keys: the mask's last 8 columns, of which row 0 has all.
    sliding = integration.dash_attention_mask(
        q_length=1, kv_length=8, q_offset=7, kv_offset=0, mask_function=causal_mask_function, attention_mask=mask
    )
    assert sliding.cu_seqlens_k.tolist() == [0, 8, 16] and sliding.kv_length == 8


def test_all_padding_rows_keep_the_lower_bound_of_one():
    mask = torch.zeros(BATCH, SEQLEN, dtype=torch.bool)
    batch = integration.dash_attention_mask(
        q_length=SEQLEN, kv_length=SEQLEN, mask_function=causal_mask_function, attention_mask=mask
    )
    assert batch.indices_q.numel() == 0 and batch.cu_seqlens_q.tolist() == [0, 0, 0] and batch.max_seqlen_q == 1


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


# Newer transformers (5.25, not 5.17) wrap the base mask of a packed batch in this; older ones compose it bare.
remap_positions_for_packed_sequence = getattr(masking_utils, "remap_positions_for_packed_sequence", None)


def packed_mask_function(base, positions: torch.Tensor):
    """The mask transformers' mask creation hands the hook for packed `positions` (one row) and no cache, as the
    installed version builds it."""
    documents = find_packed_sequence_indices(positions)
    if remap_positions_for_packed_sequence is not None:
        base = remap_positions_for_packed_sequence(base, positions)
    return and_masks(base, packed_sequence_mask_function(documents))


@pytest.mark.parametrize(
    "mask_function",
    [
        packed_mask_function(causal_mask_function, packed_positions(5, 11)),
        packed_mask_function(bidirectional_mask_function, packed_positions(5, 11)),
        # Before remap_positions_for_packed_sequence, transformers composed the packed mask without it.
        and_masks(
            causal_mask_function, packed_sequence_mask_function(find_packed_sequence_indices(packed_positions(5, 11)))
        ),
    ],
    ids=["causal", "full", "causal_unmapped"],
)
def test_a_packed_causal_or_full_mask_becomes_the_documents_offsets(mask_function):
    packing = integration.dash_attention_mask(q_length=SEQLEN, kv_length=SEQLEN, mask_function=mask_function)
    assert isinstance(packing, integration.PackedSequences)
    assert packing.cu_seqlens_q is packing.cu_seqlens_k and packing.cu_seqlens_q.dtype == torch.int32
    assert packing.cu_seqlens_q.tolist() == [0, 5, 16] and packing.max_seqlen_q == packing.max_seqlen_k == 11


def test_packed_sequences_from_the_mask_reach_the_varlen_kernel_without_position_ids(kernel):
    mask_function = packed_mask_function(causal_mask_function, packed_positions(5, 11))
    packing = integration.dash_attention_mask(q_length=SEQLEN, kv_length=SEQLEN, mask_function=mask_function)
    query, key, value = (t[:1] for t in states())
    integration.dash_attention_forward(AttentionModule(), query, key, value, packing)
    (call,) = kernel
    assert call.function == "flash_attn_varlen_func" and call.arguments["cu_seqlens_q"] is packing.cu_seqlens_q
    assert call.arguments["max_seqlen_q"] == 11


def test_a_sliding_window_causal_mask_is_none_or_the_documents_offsets():
    window = sliding_window_causal_mask_function(4)
    assert integration.dash_attention_mask(q_length=SEQLEN, kv_length=SEQLEN, mask_function=window) is None
    # A DynamicCache's sliding layer keeps the last window - 1 keys: they still end where the queries end.
    decoding = {"q_length": 1, "kv_length": 4, "q_offset": 20, "kv_offset": 17}
    assert integration.dash_attention_mask(mask_function=window, **decoding) is None
    packed = packed_mask_function(window, packed_positions(5, 11))
    packing = integration.dash_attention_mask(q_length=SEQLEN, kv_length=SEQLEN, mask_function=packed)
    assert packing.cu_seqlens_q.tolist() == [0, 5, 16]


@pytest.mark.parametrize(
    "mask_function",
    [
        chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long)),
        sliding_window_bidirectional_mask_function(4),
        and_masks(causal_mask_function, sliding_window_causal_mask_function(4)),
        and_masks(
            packed_mask_function(causal_mask_function, packed_positions(5, 11)),
            packed_sequence_mask_function(find_packed_sequence_indices(packed_positions(5, 11))),
        ),
    ],
    ids=["chunked", "bidirectional_window", "overlay", "packed_twice"],
)
def test_other_masks_are_refused(mask_function):
    with pytest.raises(
        NotImplementedError, match=r"an attention mask other than the causal, sliding-window causal or full one"
    ):
        integration.dash_attention_mask(q_length=SEQLEN, kv_length=SEQLEN, mask_function=mask_function)


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


# Padded batches: unpad -> varlen -> pad.

PADDING = {"right": (slice(0, 1), slice(SEQLEN - 5, None)), "left": (slice(1, 2), slice(0, 6))}


def padded_batch(side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """token ids, attention_mask and position_ids (as generate() makes them: counting real tokens only) of a batch
    whose row 0 (right) or row 1 (left) is padded."""
    ids = token_ids()
    mask = torch.ones_like(ids)
    mask[PADDING[side]] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def each_sequence_alone(model, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    return [model(row[keep.bool()][None]).logits[0] for row, keep in zip(ids, mask)]


def padded_families() -> list:
    return [
        pytest.param(tiny_config(LlamaConfig), id="llama"),
        pytest.param(tiny_config(Qwen2Config), id="qwen2"),
        pytest.param(tiny_config(MistralConfig, sliding_window=WINDOW), id="mistral_window"),
        pytest.param(
            tiny_config(
                Gemma2Config,
                head_dim=256,
                sliding_window=WINDOW,
                attn_logit_softcapping=50.0,
                query_pre_attn_scalar=256,
            ),
            id="gemma2",
        ),
    ]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("config", padded_families())
def test_a_padded_batch_matches_each_sequence_alone_on_its_real_tokens(kernel, config, side):
    model = tiny_model(config)
    ids, mask, positions = padded_batch(side)
    logits = model(ids, attention_mask=mask, position_ids=positions).logits
    layers = config.num_hidden_layers
    assert [call.function for call in kernel] == ["flash_attn_varlen_func"] * layers
    real = int(mask.sum())
    assert all(call.q.shape[0] == real and call.k.shape[0] == real for call in kernel)
    for row, (expected, keep) in enumerate(zip(each_sequence_alone(model, ids, mask), mask)):
        assert relative_error(logits[row][keep.bool()], expected) < 1e-2


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_matches_the_sdpa_implementation_on_real_tokens(kernel, side):
    model = tiny_model(tiny_config())
    ids, mask, positions = padded_batch(side)
    logits = model(ids, attention_mask=mask, position_ids=positions).logits
    model.set_attn_implementation("sdpa")
    expected = model(ids, attention_mask=mask, position_ids=positions).logits
    keep = mask.bool()
    assert relative_error(logits[keep], expected[keep]) < 1e-2


def test_padding_query_rows_come_out_zero(kernel):
    query, key, value = states()
    mask = torch.ones(BATCH, SEQLEN, dtype=torch.bool)
    mask[0, -4:] = False
    padded = integration.dash_attention_mask(
        q_length=SEQLEN, kv_length=SEQLEN, mask_function=causal_mask_function, attention_mask=mask
    )
    out, weights = integration.dash_attention_forward(AttentionModule(), query, key, value, padded)
    assert weights is None and out.shape == (BATCH, SEQLEN, HEADS, HEAD_DIM)
    assert not out[0, -4:].any() and out[0, :-4].any()


def test_a_padded_batch_trains_and_padding_gets_no_gradient(kernel):
    model = tiny_model(tiny_config()).train()
    ids, mask, positions = padded_batch("right")
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    labels = ids.masked_fill(mask == 0, -100)
    model(inputs_embeds=embeddings, attention_mask=mask, position_ids=positions, labels=labels).loss.backward()
    assert torch.isfinite(embeddings.grad.float()).all()
    # A padding token is never attended to and its own output is not used: no gradient reaches it.
    assert not embeddings.grad[~mask.bool()].any() and embeddings.grad[mask.bool()].any()


def test_generate_works_on_a_left_padded_batch(kernel):
    model = tiny_model(tiny_config())
    ids, mask, _ = padded_batch("left")
    new_tokens = 4
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    assert out.shape == (BATCH, SEQLEN + new_tokens) and torch.equal(out[:, :SEQLEN], ids)
    # The prefill and every decoding step go through the varlen call on the real tokens.
    assert len(kernel) == 2 * new_tokens and all(call.function == "flash_attn_varlen_func" for call in kernel)
    assert kernel[-1].q.shape[0] == BATCH and kernel[-1].arguments["cu_seqlens_k"].tolist() == [
        0,
        SEQLEN + new_tokens - 1,
        2 * (SEQLEN + new_tokens - 1) - 6,
    ]


@pytest.mark.parametrize("config", padded_families())
def test_generate_on_a_left_padded_batch_scores_as_eager_attention_does(kernel, config):
    new_tokens = 5
    model = tiny_model(config)
    ids, mask, _ = padded_batch("left")
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    # Sliding layers decode with their cache's last keys only, full layers with every real key.
    assert all(call.function == "flash_attn_varlen_func" for call in kernel)
    # Each step's logits against eager attention on the sequence generated so far (logits, not tokens: a tiny
    # random model's greedy choice can hang on a tie that rounding breaks either way). The stand-in attends in
    # float32 and eager attention in bf16, which alone puts them about 1e-2 apart on a full forward.
    model.set_attn_implementation("eager")
    full_mask = torch.cat((mask, torch.ones(BATCH, new_tokens, dtype=mask.dtype)), dim=1)
    expected = model(out.sequences, attention_mask=full_mask, position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0))
    for step, logits in enumerate(out.logits):
        assert relative_error(logits, expected.logits[:, SEQLEN - 1 + step]) < 2e-2, f"step {step}"


def test_padding_and_packing_together_are_refused(kernel):
    ids, mask, _ = padded_batch("right")
    query, key, value = states()
    padded = integration.dash_attention_mask(
        q_length=SEQLEN, kv_length=SEQLEN, mask_function=causal_mask_function, attention_mask=mask.bool()
    )
    with pytest.raises(NotImplementedError, match=r"attention_mask marks padding and cu_seq_lens_q"):
        integration.dash_attention_forward(AttentionModule(), query, key, value, padded, **packing_keywords())
    assert not kernel


def test_padding_between_real_tokens_matches_sdpa_without_a_window_and_is_refused_with_one(kernel):
    """A mask with a hole (padding between two real tokens of a row) under a sliding window: the varlen call packs the
    row's real tokens together, so its window would reach keys that transformers' window, counted in columns, does
    not; it must be refused, not computed with another window. Without a window the packed rows give transformers'
    mask on every real token (the negative control), and so does a window with left or right padding only."""
    ids = token_ids()
    mask = torch.ones_like(ids)
    mask[0, 5:9] = 0  # a hole of 4 columns in row 0, as wide as the window
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    keep = mask.bool()
    model = tiny_model(tiny_config())
    logits = model(ids, attention_mask=mask, position_ids=positions).logits
    model.set_attn_implementation("sdpa")
    expected = model(ids, attention_mask=mask, position_ids=positions).logits
    assert relative_error(logits[keep], expected[keep]) < 1e-2
    windowed = tiny_model(tiny_config(MistralConfig, sliding_window=WINDOW))
    kernel.clear()
    with pytest.raises(NotImplementedError, match=r"padding between two real tokens.*sliding_window=4"):
        windowed(ids, attention_mask=mask, position_ids=positions)
    assert not kernel
    # The mask hook records the hole; left and right padding have none.
    holed = integration.dash_attention_mask(
        q_length=SEQLEN, kv_length=SEQLEN, mask_function=causal_mask_function, attention_mask=keep
    )
    assert holed.holes
    for side in ("left", "right"):
        _, sided, _ = padded_batch(side)
        batch = integration.dash_attention_mask(
            q_length=SEQLEN, kv_length=SEQLEN, mask_function=causal_mask_function, attention_mask=sided.bool()
        )
        assert not batch.holes, side


# Packed sequences: the attention function alone.


def test_packed_position_ids_reach_the_varlen_kernel_as_views(kernel):
    query, key, value = (t[:1] for t in states())
    out, _ = integration.dash_attention_forward(
        AttentionModule(), query, key, value, None, scaling=0.3, position_ids=packed_positions(5, 11)
    )
    (call,) = kernel
    assert call.function == "flash_attn_varlen_func"
    for sent, received in ((query, call.q), (key, call.k), (value, call.v)):
        assert received.shape == (SEQLEN, sent.shape[1], HEAD_DIM) and received.data_ptr() == sent.data_ptr()
    arguments = call.arguments
    assert arguments["cu_seqlens_q"] is arguments["cu_seqlens_k"]  # one tensor: the self-attention promise
    assert arguments["cu_seqlens_q"].dtype == torch.int32 and arguments["cu_seqlens_q"].tolist() == [0, 5, 16]
    assert arguments["max_seqlen_q"] == arguments["max_seqlen_k"] == 11
    assert arguments["causal"] is True and arguments["softmax_scale"] == 0.3 and arguments["deterministic"] is True
    assert call.k.shape[1] == KV_HEADS  # GQA heads are not repeated
    assert out.shape == (1, SEQLEN, HEADS, HEAD_DIM)
    documents = [
        attention_by_sdpa(*(t.transpose(1, 2)[:, start:end] for t in (query, key, value)), 0.3, True)
        for start, end in ((0, 5), (5, 16))
    ]
    assert torch.equal(out, torch.cat(documents, dim=1))


@pytest.mark.parametrize(
    ("position_ids", "expected_offsets"),
    [
        # Each row its own documents; a jump starts one too, as in transformers' packed-sequence mask.
        (
            torch.cat([packed_positions(4, 12), torch.cat([torch.arange(6), torch.arange(20, 30)])[None]]),
            [0, 4, 16, 22, 32],
        ),
        # One row of positions for both rows of states (unsqueezed, not expanded).
        (packed_positions(3, 13), [0, 3, 16, 19, 32]),
        # Documents restarting at another first position (RoBERTa-like models).
        (packed_positions(8, 8).expand(BATCH, -1) + 2, [0, 8, 16, 24, 32]),
    ],
    ids=["per_row", "unsqueezed", "offset_start"],
)
def test_packed_rows_are_flattened_into_one_batch_of_documents(kernel, position_ids, expected_offsets):
    integration.dash_attention_forward(**call_arguments(position_ids=position_ids))
    (call,) = kernel
    assert call.arguments["cu_seqlens_q"].tolist() == expected_offsets
    assert call.q.shape == (BATCH * SEQLEN, HEADS, HEAD_DIM)


def test_consecutive_position_ids_take_the_dense_kernel(kernel):
    integration.dash_attention_forward(**call_arguments(position_ids=torch.arange(SEQLEN).expand(BATCH, -1)))
    integration.dash_attention_forward(**call_arguments(position_ids=torch.tensor([[7]]), query=states(seqlen_q=1)[0]))
    assert [call.function for call in kernel] == ["flash_attn_func"] * 2


@pytest.mark.parametrize("one_tensor", [True, False], ids=["one_tensor", "equal_tensors"])
def test_cu_seq_lens_reach_the_varlen_kernel_and_win_over_position_ids(kernel, one_tensor):
    cu_seq_lens = offsets(8, 24).long()
    keywords = packing_keywords(cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens if one_tensor else offsets(8, 24))
    position_ids = packed_positions(4, 12).expand(BATCH, -1)
    integration.dash_attention_forward(**call_arguments(position_ids=position_ids, **keywords))
    (call,) = kernel
    arguments = call.arguments
    assert arguments["cu_seqlens_q"].dtype == torch.int32 and arguments["cu_seqlens_q"].tolist() == [0, 8, 32]
    assert arguments["cu_seqlens_k"] is arguments["cu_seqlens_q"]  # equal offsets go in as one tensor
    assert arguments["max_seqlen_q"] == arguments["max_seqlen_k"] == 24


def test_different_cu_seq_lens_go_in_as_two_tensors(kernel):
    keywords = packing_keywords(cu_seq_lens_k=offsets(16, 16), max_length_k=16)
    integration.dash_attention_forward(**call_arguments(**keywords))
    arguments = kernel[0].arguments
    assert arguments["cu_seqlens_q"].tolist() == [0, 8, 32] and arguments["cu_seqlens_k"].tolist() == [0, 16, 32]
    assert (arguments["max_seqlen_q"], arguments["max_seqlen_k"]) == (24, 16)


def test_seq_idx_passes_alongside_packing_or_with_one_sequence_per_row(kernel):
    two_documents = torch.tensor([[0] * 8 + [1] * 8] * BATCH, dtype=torch.int32)
    integration.dash_attention_forward(
        **call_arguments(seq_idx=two_documents, position_ids=packed_positions(8, 8).expand(BATCH, -1))
    )
    integration.dash_attention_forward(**call_arguments(seq_idx=torch.zeros(BATCH, SEQLEN, dtype=torch.int32)))
    assert [call.function for call in kernel] == ["flash_attn_varlen_func", "flash_attn_func"]


def test_position_ids_are_read_once_for_all_layers_and_again_when_changed(kernel, monkeypatch):
    reads = []
    read = integration._packing_from_positions
    monkeypatch.setattr(integration, "_packing_from_positions", lambda *args: reads.append(args) or read(*args))
    position_ids = packed_positions(8, 8).expand(BATCH, -1).clone()
    for _ in range(3):  # three layers of one forward
        integration.dash_attention_forward(**call_arguments(position_ids=position_ids))
    assert len(reads) == 1
    position_ids[:, 8:] += 8  # in place: one document per row now
    integration.dash_attention_forward(**call_arguments(position_ids=position_ids))
    assert len(reads) == 2
    assert [call.function for call in kernel] == ["flash_attn_varlen_func"] * 3 + ["flash_attn_func"]


@pytest.mark.parametrize(
    ("use_cache", "position_reads"),
    # Without a cache the mask hook makes the offsets from transformers' document ids; with one, the first layer
    # makes them from position_ids.
    [(False, 0), (True, 1)],
    ids=["by_the_mask", "by_the_attention"],
)
def test_a_forward_reads_the_packing_once(kernel, monkeypatch, use_cache, position_reads):
    reads = {"offsets_made": 0, "position_ids_read": 0}
    read_positions, read_starts = integration._packing_from_positions, integration._packing_from_starts

    def counting_positions(*args):
        reads["position_ids_read"] += 1
        return read_positions(*args)

    def counting_starts(*args):
        reads["offsets_made"] += 1
        return read_starts(*args)

    monkeypatch.setattr(integration, "_packing_from_positions", counting_positions)
    monkeypatch.setattr(integration, "_packing_from_starts", counting_starts)
    model = tiny_model(tiny_config())
    model(token_ids(batch=1), position_ids=packed_positions(5, 7, 4), use_cache=use_cache)
    assert len(kernel) == 2 and reads == {"offsets_made": 1, "position_ids_read": position_reads}


# Packed sequences through whole models.

DOCUMENTS = (5, 7, 4)  # three documents packed into one row of SEQLEN tokens


@pytest.mark.parametrize("use_cache", [False, True], ids=["found_by_the_mask", "found_by_the_attention"])
@pytest.mark.parametrize("family", [LlamaConfig, Qwen2Config], ids=["llama", "qwen2"])
def test_a_packed_row_matches_sdpa_and_each_document_alone(kernel, family, use_cache):
    model = tiny_model(tiny_config(family))
    ids = token_ids(batch=1)
    positions = packed_positions(*DOCUMENTS)
    # Without a cache, transformers' mask creation finds the packing and hands the hook its packed mask; with one
    # (config.use_cache is on by default) it does not look, and the attention function finds it.
    logits = model(ids, position_ids=positions, use_cache=use_cache).logits
    assert [call.function for call in kernel] == ["flash_attn_varlen_func"] * 2
    alone = torch.cat([model(document[None]).logits for document in ids[0].split(DOCUMENTS)], dim=1)
    assert relative_error(logits, alone) < 1e-2
    model.set_attn_implementation("sdpa")
    assert relative_error(logits, model(ids, position_ids=positions, use_cache=False).logits) < 1e-2


def test_a_packed_row_with_cu_seq_lens_matches_each_document_alone(kernel):
    model = tiny_model(tiny_config())
    ids = token_ids(batch=1)
    keywords = {
        "cu_seq_lens_q": offsets(*DOCUMENTS),
        "cu_seq_lens_k": offsets(*DOCUMENTS),
        "max_length_q": max(DOCUMENTS),
        "max_length_k": max(DOCUMENTS),
    }
    logits = model(ids, position_ids=packed_positions(*DOCUMENTS), **keywords).logits
    assert [call.arguments["cu_seqlens_q"].tolist() for call in kernel] == [[0, 5, 12, 16]] * 2
    alone = torch.cat([model(document[None]).logits for document in ids[0].split(DOCUMENTS)], dim=1)
    assert relative_error(logits, alone) < 1e-2


def test_a_packed_row_trains_through_the_stand_in(kernel):
    model = tiny_model(tiny_config()).train()
    ids = token_ids(batch=1)
    model(ids, labels=ids, position_ids=packed_positions(*DOCUMENTS)).loss.backward()
    assert all(call.function == "flash_attn_varlen_func" for call in kernel)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g.float()).all() for g in grads)


def test_a_packed_row_with_padding_is_refused(kernel):
    model = tiny_model(tiny_config())
    ids = token_ids(batch=1)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    with pytest.raises(NotImplementedError, match=r"position_ids restart among a row's real tokens"):
        model(ids, attention_mask=mask, position_ids=packed_positions(*DOCUMENTS))
    assert not kernel


def test_packed_position_ids_after_cached_tokens_are_refused(kernel):
    model = tiny_model(tiny_config())
    ids = token_ids(batch=1)
    cache = DynamicCache(config=model.config)
    model(ids[:, :4], **cache_keyword(model, cache), use_cache=True)
    with pytest.raises(NotImplementedError, match=r"position_ids restart within a row \(packed sequences\), but"):
        model(ids[:, 4:], position_ids=packed_positions(5, 7), **cache_keyword(model, cache), use_cache=True)


def test_a_static_cache_is_refused(kernel):
    model = tiny_model(tiny_config())
    with pytest.raises(NotImplementedError, match=r"static cache"):
        static = StaticCache(config=model.config, max_cache_len=4 * SEQLEN)
        model(token_ids(), **cache_keyword(model, static), use_cache=True)
    assert not kernel


# Sliding windows.


def test_sliding_window_reaches_the_kernel_as_a_left_window(kernel):
    integration.dash_attention_forward(**call_arguments(sliding_window=4096))
    integration.dash_attention_forward(**call_arguments(sliding_window=WINDOW, position_ids=packed_positions(8, 8)))
    assert [call.arguments["window_size"] for call in kernel] == [(4095, 0), (WINDOW - 1, 0)]
    assert kernel[1].function == "flash_attn_varlen_func"


# Each model's config for a window, and the window_size its two layers reach the kernel with for WINDOW.
SLIDING_MODELS = {
    "mistral": (lambda window: tiny_config(MistralConfig, sliding_window=window), [(WINDOW - 1, 0)] * 2),
    # One sliding layer, one full one: each gets its own mask and its own sliding_window.
    "qwen2_mixed": (
        lambda window: tiny_config(
            Qwen2Config,
            use_sliding_window=True,
            sliding_window=window,
            layer_types=["sliding_attention", "full_attention"],
        ),
        [(WINDOW - 1, 0), (-1, -1)],
    ),
}


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "cache"])
@pytest.mark.parametrize(("config", "windows"), SLIDING_MODELS.values(), ids=SLIDING_MODELS.keys())
def test_a_sliding_window_model_matches_its_sdpa_implementation(kernel, config, windows, use_cache, packed):
    model = tiny_model(config(WINDOW))
    ids = token_ids(batch=1) if packed else token_ids()
    packing = {"position_ids": packed_positions(*DOCUMENTS)} if packed else {}
    logits = model(ids, use_cache=use_cache, **packing).logits
    assert [call.arguments["window_size"] for call in kernel] == windows
    model.set_attn_implementation("sdpa")
    expected = model(ids, use_cache=False, **packing).logits
    assert relative_error(logits, expected) < 1e-2
    # The window changes the result: the same weights under a window wider than the sequence give other logits.
    unwindowed = tiny_model(config(4 * SEQLEN), attn_implementation="sdpa")
    assert relative_error(unwindowed(ids, use_cache=False, **packing).logits, expected) > 1e-1


def test_decoding_a_sliding_window_model_with_a_dynamic_cache(kernel):
    model = tiny_model(tiny_config(MistralConfig, sliding_window=WINDOW))
    ids = token_ids()
    full = model(ids).logits[:, -1]
    cache = DynamicCache(config=model.config)
    model(ids[:, :-2], **cache_keyword(model, cache), use_cache=True)
    model(ids[:, -2:-1], **cache_keyword(model, cache), use_cache=True)
    last = model(ids[:, -1:], **cache_keyword(model, cache), use_cache=True).logits[:, -1]
    assert kernel[-1].q.shape[1] == 1 and kernel[-1].arguments["window_size"] == (WINDOW - 1, 0)
    assert relative_error(last, full) < 1e-2


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
GPU_DOCUMENTS = (100, 37, 200, 175)  # a packed batch: one row of GPU_SEQLEN tokens
GPU_WINDOW = 64
# What a GPU training run trains: its model's config, and whether its batch is packed.
GPU_RUNS = {
    "dense": (lambda: tiny_config(max_position_embeddings=GPU_SEQLEN), False),
    "packed": (lambda: tiny_config(max_position_embeddings=GPU_SEQLEN), True),
    "packed_sliding_window": (
        lambda: tiny_config(MistralConfig, max_position_embeddings=GPU_SEQLEN, sliding_window=GPU_WINDOW),
        True,
    ),
}


def train(device: torch.device, attn_implementation: str, steps: int, run: str) -> dict[str, object]:
    """`steps` AdamW steps of the tiny model of GPU_RUNS[run] in bf16 on fixed random tokens, BATCH rows of one
    sequence each or (packed) one row of GPU_DOCUMENTS marked by position_ids, without a cache so that the SDPA
    implementation finds the packing too: the losses, and the first step's logits and gradients, and the final
    weights."""
    config, packed = GPU_RUNS[run]
    model = tiny_model(config(), attn_implementation).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = token_ids(batch=1 if packed else BATCH, seqlen=GPU_SEQLEN).to(device)
    packing = {"position_ids": packed_positions(*GPU_DOCUMENTS).to(device), "use_cache": False} if packed else {}
    losses, first = [], {}
    for step in range(steps):
        output = model(ids, labels=ids, **packing)
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


@pytest.mark.parametrize("run", GPU_RUNS)
def test_training_on_the_gpu_is_bitwise_reproducible(device, require_kernel, deterministic_algorithms, run):
    require_kernel(HEAD_DIM, torch.bfloat16)
    torch.use_deterministic_algorithms(True)
    first, second = (train(device, "dash_attn", GPU_STEPS, run) for _ in range(2))
    assert first["losses"] == second["losses"]
    assert torch.equal(first["logits"], second["logits"])
    for name, grad in first["grads"].items():
        assert torch.equal(grad, second["grads"][name]), name
    for name, weight in first["weights"].items():
        assert torch.equal(weight, second["weights"][name]), name


@pytest.mark.parametrize("run", GPU_RUNS)
def test_training_on_the_gpu_is_close_to_sdpa(device, require_kernel, run):
    require_kernel(HEAD_DIM, torch.bfloat16)
    dash, sdpa = (train(device, implementation, 1, run) for implementation in ("dash_attn", "sdpa"))
    assert relative_error(dash["logits"], sdpa["logits"]) < 1e-2
    for name, grad in dash["grads"].items():
        assert relative_error(grad, sdpa["grads"][name]) < 3e-2, name
