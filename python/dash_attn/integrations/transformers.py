"""Hugging Face Transformers on DASH: register() adds the attention implementation "dash_attn", so that

    from dash_attn.integrations.transformers import register
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=register())

runs every attention layer of the model through dash_attn.flash_attn_func, with the bitwise-reproducible backward
by default. Written against transformers 5.24; it needs 5.4 or newer, where mask functions receive q_length and
q_offset.

Invariants:
- register() registers two functions under one name, as transformers does for its flash-attention paths:
  dash_attention_mask with AttentionMaskInterface and dash_attention_forward with AttentionInterface. The mask
  function is not optional: for an implementation without one, transformers builds no mask at all, and padding
  would be dropped without a word. Registering again changes nothing.
- Nothing transformers passes is ignored in a way that changes the result. What DASH cannot compute (padding,
  packed sequences marked by position_ids or cu_seq_lens_*, sliding windows, mask overlays, caches whose keys are
  not exactly the tokens seen, dropout, attention sinks, position biases, attention weights, head dims the package
  does not take (_library.HEAD_DIMS), fp32 outside autocast) raises NotImplementedError naming the argument as transformers
  spells it, before any CUDA call.
- softcap (Gemma 2's config.attn_logit_softcapping) goes to flash_attn_func's softcap.
- dash_attention_mask runs once per forward, in transformers' mask creation. It returns None, the plain mask,
  or raises. A mask that reaches dash_attention_forward therefore did not come from it (a prepared 4-D mask, or a
  model that builds its own) and is refused.
- Causal attention: DASH aligns the causal mask to the bottom-right corner, which is transformers' causal mask
  exactly when the keys are the tokens seen so far (kv_offset + kv_length == q_offset + q_length): training
  without a cache, and prefill and decoding with a DynamicCache. dash_attention_mask checks that equality.
- Layout: transformers passes (batch, heads, seqlen, head_dim) and expects (batch, seqlen, heads, head_dim) back,
  which is dash_attn.flash_attn_func's layout: the states go in as transposed views, with no copy, and the output
  comes back as the kernel wrote it. Fewer key/value heads (GQA) go in as they are, never repeated.
- deterministic defaults to True. The keyword arguments deterministic and schedule, passed to the model's forward
  (transformers hands extra keywords to every attention layer), choose the backward schedule as in
  dash_attn.flash_attn_func; torch.use_deterministic_algorithms(True) governs them as it does there.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import transformers
except ModuleNotFoundError as _error:
    if _error.name != "transformers":
        raise
    raise ImportError(
        "dash_attn.integrations.transformers needs transformers>=5.4, which is not installed: "
        "pip install 'dash-attn[transformers]'"
    ) from _error
from packaging.version import Version  # a dependency of transformers

MIN_TRANSFORMERS_VERSION = "5.4"
if Version(transformers.__version__) < Version(MIN_TRANSFORMERS_VERSION):
    raise ImportError(
        f"dash_attn.integrations.transformers needs transformers>={MIN_TRANSFORMERS_VERSION}, where mask functions "
        f"receive q_length and q_offset; transformers {transformers.__version__} is installed"
    )

from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
)

from .._arguments import SUPPORTED_DTYPES, check_flags, refuse_unsupported, resolve_scale, resolve_softcap  # noqa: E402
from .._library import HEAD_DIMS  # noqa: E402
from ..fa2 import flash_attn_func  # noqa: E402

ATTN_IMPLEMENTATION = "dash_attn"

# Keyword arguments some models pass to their attention function, each asking for something DASH does not compute.
# Any value but None is refused; the reason says what it would have asked for.
# Packed batches reach the kernels through dash_attn.flash_attn_varlen_func; transformers marks them with a mask
# function this hook cannot read, so the integration does not route them yet.
_PACKED_REFUSAL = (
    "DASH's transformers integration takes no variable-length (packed) batches yet "
    "(dash_attn.flash_attn_varlen_func does, called directly)"
)
_UNSUPPORTED_KEYWORDS = {
    "s_aux": "DASH has no attention sinks",
    "sinks": "DASH has no attention sinks",
    "position_bias": "DASH has no additive position bias",
    "cu_seq_lens_q": _PACKED_REFUSAL,
    "cu_seq_lens_k": _PACKED_REFUSAL,
    "max_length_q": _PACKED_REFUSAL,
    "max_length_k": _PACKED_REFUSAL,
    "seq_idx": _PACKED_REFUSAL,
}


def register() -> str:
    """Registers DASH with transformers under the name "dash_attn" and returns that name, for
    from_pretrained(..., attn_implementation=register()). Calling it again changes nothing."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, dash_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, dash_attention_mask)
    return ATTN_IMPLEMENTATION


def dash_attention_mask(
    *,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function: object = causal_mask_function,
    attention_mask: Tensor | None = None,
    **_mask_materialization: object,
) -> None:
    """transformers' mask hook for "dash_attn": None when the mask is the plain causal or full one, which
    dash_attention_forward computes from is_causal; NotImplementedError naming what else was asked for.

    The keywords in _mask_materialization (batch_size, dtype, device, config, SDPA's options) describe how to build
    a mask tensor, which DASH never needs."""
    if mask_function is not causal_mask_function and mask_function is not bidirectional_mask_function:
        compile_note = (
            " Under torch.compile, transformers cannot tell from position_ids whether a batch is packed and builds "
            "the packed-sequence mask for every batch: compile the decoder layers rather than the whole model, so "
            "the mask is built outside the compiled region."
            if torch.compiler.is_compiling()
            else ""
        )
        raise NotImplementedError(
            "the model asks for an attention mask other than the causal or full one: a sliding window "
            "(config.sliding_window or layer_types), chunked attention, packed sequences (position_ids that "
            "restart within a row, with no attention_mask), or the model's own overlay (e.g. for image tokens). "
            f"DASH computes only the causal and the full mask.{compile_note}"
        )
    if mask_function is causal_mask_function:
        # q_offset is a 0-d tensor for static cache layers; int() reads it once per forward.
        queries_end = int(q_offset) + q_length
        if kv_offset + kv_length != queries_end:
            raise NotImplementedError(
                f"the keys cover positions [{kv_offset}, {kv_offset + kv_length}) but the queries end at position "
                f"{queries_end}: the cache holds slots not yet filled (a static cache) or has dropped old tokens, "
                f"and DASH's causal mask attends to every key it is given. Use a DynamicCache (the default)"
            )
    if attention_mask is not None:
        if attention_mask.shape[-1] != kv_length:
            raise NotImplementedError(
                f"attention_mask covers {attention_mask.shape[-1]} keys but the attention has {kv_length}: DASH has "
                f"no padding masks; pass attention_mask=None or one with a column for every key"
            )
        if not attention_mask.all():
            raise NotImplementedError(
                "attention_mask marks padding (zeros): DASH has no padding masks or variable-length batches yet; "
                "pass batches of sequences of one length, with attention_mask=None or all ones"
            )


def dash_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    deterministic: bool | None = None,
    schedule: str = "auto",
    **kwargs: object,
) -> tuple[Tensor, None]:
    """transformers' attention function for "dash_attn": query (batch, heads_q, seqlen_q, head_dim), key and value
    (batch, heads_kv, seqlen_k, head_dim) in, (attn_output (batch, seqlen_q, heads_q, head_dim), None) out.

    is_causal defaults to module.is_causal (True for a module without one, as in transformers' SDPA path);
    scaling to head_dim ** -0.5. Keyword arguments that DASH has no use for and that do not change attention
    (position_ids, use_cache, num_items_in_batch, ...) pass."""
    refuse_unsupported(
        "attention_mask",
        attention_mask,
        (None,),
        'DASH has no attention mask but the causal one, and the "dash_attn" mask function returns None for every '
        "mask it accepts, so this one is a prepared 4-D mask or one the model built itself",
    )
    refuse_unsupported(
        "dropout",
        dropout,
        (0.0,),
        "DASH has no attention dropout (the model passes config.attention_dropout while training: set it to 0.0)",
    )
    # The kernels take a window (flash_attn_func's window_size), but transformers hands the "dash_attn" mask hook
    # a sliding-window mask function whose size it cannot read, so a windowed model is refused there and here.
    refuse_unsupported(
        "sliding_window",
        sliding_window,
        (None,),
        "DASH's transformers integration has no sliding-window attention (config.sliding_window; "
        "dash_attn.flash_attn_func takes window_size)",
    )
    cap = resolve_softcap(softcap)
    for name, reason in _UNSUPPORTED_KEYWORDS.items():
        refuse_unsupported(name, kwargs.get(name), (None,), reason)
    _refuse_packed_positions(kwargs.get("position_ids"))
    _refuse_attention_weights(module, kwargs.get("output_attentions"))
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    check_flags(is_causal=causal)
    query, key, value = _half_precision(query, key, value)
    scale = resolve_scale(scaling, query.shape[-1], "scaling")
    out = flash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=scale,
        causal=causal,
        deterministic=True if deterministic is None else deterministic,
        schedule=schedule,
        softcap=cap,
    )
    return out, None


def _refuse_packed_positions(position_ids: object) -> None:
    """Refuses position_ids that restart or jump within a row, the mark of packed sequences (one row holding
    several, as DataCollatorWithFlattening makes them). transformers' mask creation looks for them only without a
    cache, and models make a DynamicCache whenever config.use_cache is on, in training too; so the check is here,
    in every layer, at the price of one device sync per layer (transformers' flash-attention path pays the same).
    (3, batch, seqlen) multimodal rotary positions are not consecutive by design and are not checked."""
    if not isinstance(position_ids, Tensor) or position_ids.dim() != 2 or position_ids.shape[-1] < 2:
        return
    if (position_ids.diff(dim=-1) != 1).any():
        raise NotImplementedError(
            "position_ids restart or jump within a row, which marks packed sequences (e.g. from "
            f"DataCollatorWithFlattening): {_PACKED_REFUSAL}; pass one sequence per "
            "row, with consecutive position_ids"
        )


def _refuse_attention_weights(module: torch.nn.Module, output_attentions: object) -> None:
    """Refuses output_attentions, from the call or, as transformers reads it when the call has none, from the
    model's config: the weights would come back as None."""
    if output_attentions is None:
        output_attentions = getattr(getattr(module, "config", None), "output_attentions", False)
    if output_attentions:
        raise NotImplementedError(
            "output_attentions=True is not supported: DASH never materializes the attention probabilities; "
            'load the model with attn_implementation="eager" to inspect them'
        )


def _half_precision(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The states in the dtype the kernels compute in. Under torch.autocast, fp32 states (the rotary embedding
    promotes them) are cast to autocast's dtype, as transformers' flash-attention path casts them; any other
    dtype that is not bf16 or fp16 is refused, as are head dims without a kernel."""
    if query.dtype not in SUPPORTED_DTYPES and torch.is_autocast_enabled(query.device.type):
        autocast_dtype = torch.get_autocast_dtype(query.device.type)
        if autocast_dtype in SUPPORTED_DTYPES:
            query, key, value = (t.to(autocast_dtype) for t in (query, key, value))
    if query.dtype not in SUPPORTED_DTYPES:
        raise NotImplementedError(
            f"query.dtype={query.dtype} is not supported: DASH computes in torch.bfloat16 or torch.float16; load "
            f"the model with dtype=torch.bfloat16 (or float16), or run it under torch.autocast with one of them"
        )
    head_dim, value_head_dim = query.shape[-1], value.shape[-1]
    if head_dim not in HEAD_DIMS:
        raise NotImplementedError(
            f"head_dim={head_dim} (query.shape[3]) is not supported: DASH has kernels for head dims {HEAD_DIMS} "
            f"(the model's config.head_dim, or hidden_size / num_attention_heads)"
        )
    if value_head_dim != head_dim:
        raise NotImplementedError(
            f"value's head_dim={value_head_dim} (value.shape[3]) differs from query's ({head_dim}): DASH needs one "
            f"head dim for query, key and value"
        )
    return query, key, value
