"""Hugging Face Transformers on DASH: register() adds the attention implementation "dash_attn", so that

    import dash_attn
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="dash_attn")

runs every attention layer of the model through dash_attn.flash_attn_func (dash_attn.flash_attn_varlen_func for
packed sequences), with the bitwise-reproducible backward by default. Written against transformers 5.24 and 5.25;
it needs 5.4 or newer, where mask functions receive q_length and q_offset. `import dash_attn` calls register() as
soon as transformers loads its attention registry (integrations/_transformers_hook.py); calling it by hand is never
needed, and harmless.

Invariants:
- register() registers two functions under one name, as transformers does for its flash-attention paths:
  dash_attention_mask with AttentionMaskInterface and dash_attention_forward with AttentionInterface. The mask
  function is not optional: for an implementation without one, transformers builds no mask at all, and padding
  would be dropped without a word. Registering again changes nothing.
- Nothing transformers passes is ignored in a way that changes the result. What DASH cannot compute (chunked
  attention, bidirectional windows, mask overlays, caches whose keys are not exactly the tokens seen,
  dropout, attention sinks, position biases, attention weights, head dims the package does not take
  (_library.HEAD_DIMS), fp32 outside autocast) raises NotImplementedError naming the argument as transformers
  spells it, before any kernel runs.
- Packed sequences (several documents in one row, as DataCollatorWithFlattening makes them) go to
  dash_attn.flash_attn_varlen_func, each document attending only to itself, causal or full as the layer asks.
  The documents are, in this order of precedence: cu_seq_lens_q/k with max_length_q/k, when all four are passed
  (as transformers' flash-attention path takes them); those of transformers' packed-sequence mask, which the mask
  hook turns into offsets (PackedSequences, the layers' attention_mask); those of 2-D position_ids, read by the
  attention layer, since transformers looks for packing in the mask only without a cache. Both of the last two
  start a document at every row's first token and wherever a position is not its predecessor's plus one (so any
  batch size and any first position). seq_idx (the Mamba kernels' view of the same packing) is accepted with
  packing found that way, and refused when it marks several sequences in a row that nothing else marks.
- Packing costs one device-to-host read per forward, not per layer, and int32 offsets sent to the device once:
  the mask hook reads transformers' document ids, or else the first layer reads position_ids (8 bytes a token);
  with cu_seq_lens_q/k passed, the first layer compares them (equal offsets go in as one tensor, which lets the
  backward use the shift schedules), unless one tensor is passed as both. What a layer reads is cached per tensor
  object (the model hands the same one to every layer; checked against the tensor's version counter, so an
  in-place change is read again); inference-mode tensors have no version counter and are read in every layer. A
  forward with a cache and position_ids pays the read to find nothing packed; decoding (one position a row) reads
  nothing. The read is a graph break under torch.compile and cannot be captured in a CUDA graph.
- Padded batches (a 2-D attention_mask with zeros, as tokenizers pad and generate() extends it) go through
  unpad -> flash_attn_varlen_func -> pad, as transformers' flash-attention path does: the mask hook reads the
  mask once per forward (one device-to-host read for the longest lengths) into PaddedBatch, the row indices and
  offsets of the real query and key tokens, which the layers receive as their attention_mask. The queries are the
  last q_length columns of the mask and the keys its last kv_length columns (a sliding layer's cache keeps the
  last keys), so the keys must end where the queries do (checked, as for the causal mask). Each sequence attends
  to its own real tokens, bottom-right aligned per sequence: with left padding (generate()'s) or right padding
  (training) that is transformers' mask on every real token, and so it is for padding between real tokens under the
  causal or full mask. Under a sliding window it is not (the packed rows close the gaps the window would count), so
  a sliding layer refuses a mask with such holes. Padding query rows come out 0. Padding with packing
  markers (cu_seq_lens_q/k) is refused as ambiguous; position_ids are not read for packing when the batch is
  padded (generate() gives padding tokens positions that restart).
- softcap (Gemma 2's config.attn_logit_softcapping) goes to the softcap of flash_attn_func, or of
  flash_attn_varlen_func for packed sequences.
- sliding_window (config.sliding_window, per layer with layer_types), which a causal layer passes, becomes
  window_size=(sliding_window - 1, 0), dense or packed: transformers' sliding-window causal mask. The mask hook
  accepts that mask (any window, recognized by the functions transformers composes it from) and the layer applies
  the window it is passed, as transformers' flash-attention path does.
- dash_attention_mask runs once per forward, in transformers' mask creation. It returns None for the causal, the
  sliding-window causal and the full mask, PackedSequences for any of them restricted to each packed sequence (the
  mask transformers builds when position_ids restart and there is no cache, recognized by the functions
  transformers composes it from), and raises for anything else. So a packed mask reaches the layers as the
  documents' offsets, also in a model whose layers receive no position_ids. Any other mask that reaches
  dash_attention_forward did not come from the hook (a prepared 4-D mask, or a model that builds its own) and is
  refused.
- Causal attention: DASH aligns the causal mask to the bottom-right corner, which is transformers' causal mask
  exactly when the keys are the tokens seen so far (kv_offset + kv_length == q_offset + q_length): training
  without a cache, and prefill and decoding with a DynamicCache. dash_attention_mask checks that equality; packed
  sequences further need the keys to be the queries' own tokens (no cached ones).
- Layout: transformers passes (batch, heads, seqlen, head_dim) and expects (batch, seqlen, heads, head_dim) back,
  which is dash_attn.flash_attn_func's layout: the states go in as transposed views, with no copy, and the output
  comes back as the kernel wrote it. Packed states go to flash_attn_varlen_func as (batch * seqlen, heads,
  head_dim) views of the same memory (a copy only where the memory does not allow one, never for one row), and
  its output is viewed back as (batch, seqlen, heads, head_dim). Fewer key/value heads (GQA) go in as they are,
  never repeated.
- deterministic defaults to True. The keyword arguments deterministic and schedule, passed to the model's forward
  (transformers hands extra keywords to every attention layer), choose the backward schedule as in
  dash_attn.flash_attn_func; torch.use_deterministic_algorithms(True) governs them as it does there. This path
  does not go through transformers' flash-attention wrapper (_flash_attention_forward), whose deterministic comes
  from its FLASH_ATTENTION_DETERMINISTIC environment flag (off by default); that flag has no effect here. A model
  that passes FlashAttention's deterministic flag from its own config (ModernBERT's deterministic_flash_attn,
  False by default) does not turn DASH's backward nondeterministic either; schedule="nondeterministic" does.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

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

from transformers import AttentionInterface, masking_utils  # noqa: E402  (after the version check)
from transformers.masking_utils import (  # noqa: E402
    AttentionMaskInterface,
    and_masks,
    bidirectional_mask_function,
    causal_mask_function,
    packed_sequence_mask_function,
    sliding_window_overlay,
)

from .._arguments import (  # noqa: E402
    NONDETERMINISTIC,
    SUPPORTED_DTYPES,
    check_flags,
    refuse_unsupported,
    resolve_scale,
    resolve_softcap,
)
from .._library import HEAD_DIMS  # noqa: E402
from ..fa2 import flash_attn_func  # noqa: E402
from ..padding import _GatherRows, pad_input  # noqa: E402
from ..varlen import flash_attn_varlen_func  # noqa: E402

ATTN_IMPLEMENTATION = "dash_attn"

# Keyword arguments some models pass to their attention function, each asking for something DASH does not compute.
# Any value but None is refused; the reason says what it would have asked for.
_UNSUPPORTED_KEYWORDS = {
    "s_aux": "DASH has no attention sinks",
    "sinks": "DASH has no attention sinks",
    "position_bias": "DASH has no additive position bias",
}

# Attributes of attention modules whose model passes FlashAttention's deterministic flag from its config to the
# attention function (ModernBERT: config.deterministic_flash_attn, default False): that value is FlashAttention's
# default, not a user's request for a nondeterministic backward.
_FLASH_DETERMINISTIC_ATTRIBUTES = ("deterministic_flash_attn",)

# transformers' keywords that mark packed sequences explicitly (DataCollatorWithFlattening(return_flash_attn_kwargs=
# True)); they are used together or not at all.
_PACKING_KEYWORDS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")

# The mask functions transformers composes a packed batch's mask from, known by their code objects (every closure a
# factory returns shares its code): and_masks(base, packed_sequence_mask_function(ids)), where base is the causal or
# full mask, wrapped by newer versions (5.25 does) in remap_positions_for_packed_sequence, which changes nothing
# within a document, whose positions are consecutive. A composition of anything else is not recognized, and is
# refused.
_AND_MASKS_CODE = and_masks(causal_mask_function).__code__
_PACKED_SEQUENCE_CODE = packed_sequence_mask_function(None).__code__
# A sliding-window causal mask is and_masks(sliding_window_overlay(window), causal_mask_function).
_SLIDING_WINDOW_OVERLAY_CODE = sliding_window_overlay(1).__code__
_REMAP_POSITIONS_CODE = (
    masking_utils.remap_positions_for_packed_sequence(causal_mask_function, None).__code__
    if hasattr(masking_utils, "remap_positions_for_packed_sequence")
    else None
)


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
) -> PackedSequences | PaddedBatch | None:
    """transformers' mask hook for "dash_attn": None when the mask is the plain causal, sliding-window causal or full
    one, which dash_attention_forward computes from is_causal and sliding_window; PackedSequences (the documents'
    offsets, read here once per forward) when it is any of them within each packed sequence, and PaddedBatch (the
    real tokens' rows and offsets, read here once per forward) when attention_mask marks padding, which the
    attention layers receive as their attention_mask; NotImplementedError naming what else was asked for.

    The keywords in _mask_materialization (batch_size, dtype, device, config, SDPA's options) describe how to build
    a mask tensor, which DASH never needs."""
    base_mask_function, document_ids = _unpacked(mask_function)
    if _is_sliding_window_causal(base_mask_function):
        # The layer passes the window as sliding_window, and dash_attention_forward applies it.
        base_mask_function = causal_mask_function
    if base_mask_function is not causal_mask_function and base_mask_function is not bidirectional_mask_function:
        raise NotImplementedError(
            "the model asks for an attention mask other than the causal, sliding-window causal or full one (within "
            "each packed sequence or not): chunked attention, a bidirectional window, or the model's own overlay "
            "(e.g. for image tokens). DASH computes only those three"
        )
    padded = attention_mask is not None and not bool(attention_mask.all())
    if base_mask_function is causal_mask_function or padded:
        # q_offset is a 0-d tensor for static cache layers; int() reads it once per forward.
        queries_end = int(q_offset) + q_length
        if kv_offset + kv_length != queries_end:
            raise NotImplementedError(
                f"the keys cover positions [{kv_offset}, {kv_offset + kv_length}) but the queries end at position "
                f"{queries_end}: the cache holds slots not yet filled (a static cache) or has dropped old tokens, "
                f"and DASH's causal mask and its padding both need the keys to end where the queries do. Use a "
                f"DynamicCache (the default)"
            )
    if attention_mask is not None and attention_mask.shape[-1] < kv_length:
        raise NotImplementedError(
            f"attention_mask covers {attention_mask.shape[-1]} keys but the attention has {kv_length}: pass "
            f"attention_mask=None or one with a column for every key"
        )
    if padded:
        if document_ids is not None:
            raise NotImplementedError(
                "attention_mask marks padding and the mask packs sequences too: DASH takes one or the other"
            )
        return _padding_from_mask(attention_mask, q_length, kv_length)
    if document_ids is None:
        return None
    # transformers looks for packing only without a cache, so the keys are the queries' own tokens.
    starts = torch.ones(document_ids.shape, dtype=torch.bool)
    starts[:, 1:] = document_ids.detach().to("cpu").diff(dim=-1) != 0
    return _packing_from_starts(starts, document_ids.device)


@dataclass(frozen=True, eq=False)
class PaddedBatch:
    """A padded batch as flash_attn_varlen_func takes it, made once per forward by dash_attention_mask from the 2-D
    attention_mask: the flattened (batch * seqlen) positions of the real query and key tokens, their int32 offsets
    (one tensor for both when the queries are the keys, which lets the backward use the shift schedules), the
    longest real sequences as host ints (at least 1, the varlen call's lower bound), and the layer's key count."""

    indices_q: Tensor
    indices_k: Tensor
    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    kv_length: int
    # Whether some row's real keys are not one run of columns (padding between two real tokens): the varlen call
    # packs each row's real tokens together, so a sliding window would count the keys it reaches in packed rows,
    # not in the columns transformers' window counts.
    holes: bool = False

    def on(self, device: torch.device) -> PaddedBatch:
        """This batch on `device` (itself when it is there: a model split over devices copies it)."""
        if self.indices_q.device == device:
            return self
        moved = {name: getattr(self, name).to(device) for name in ("indices_q", "indices_k", "cu_seqlens_q")}
        same = self.cu_seqlens_k is self.cu_seqlens_q
        cu_seqlens_k = moved["cu_seqlens_q"] if same else self.cu_seqlens_k.to(device)
        same_rows = self.indices_k is self.indices_q
        indices_k = moved["indices_q"] if same_rows else moved["indices_k"]
        return PaddedBatch(
            moved["indices_q"],
            indices_k,
            moved["cu_seqlens_q"],
            cu_seqlens_k,
            self.max_seqlen_q,
            self.max_seqlen_k,
            self.kv_length,
            self.holes,
        )


def _real_tokens(mask: Tensor) -> tuple[Tensor, Tensor, int, bool]:
    """The flattened positions of the tokens `mask` (batch, length) marks, their int32 offsets, the longest row
    (at least 1) and whether some row's tokens are not one run of columns (a hole: padding between two tokens); one
    read on the host for both."""
    lengths = mask.sum(dim=-1, dtype=torch.int32)
    offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=mask.device)
    torch.cumsum(lengths, dim=0, dtype=torch.int32, out=offsets[1:])
    # A row's tokens are one run iff at most one of them follows a padding column (or starts the row).
    runs = mask[:, :1].sum(dim=-1, dtype=torch.int32) + (mask[:, 1:] & ~mask[:, :-1]).sum(dim=-1, dtype=torch.int32)
    longest, most_runs = torch.stack((lengths.max(), runs.max())).tolist()
    return mask.reshape(-1).nonzero().reshape(-1), offsets, max(longest, 1), most_runs > 1


def _padding_from_mask(attention_mask: Tensor, q_length: int, kv_length: int) -> PaddedBatch:
    """PaddedBatch of transformers' 2-D padding mask: keys are its last kv_length columns, queries its last
    q_length (the keys end where the queries do: dash_attention_mask checked it)."""
    key_mask = attention_mask[:, -kv_length:].bool()
    indices_k, cu_seqlens_k, max_k, holes = _real_tokens(key_mask)
    if q_length == kv_length:
        return PaddedBatch(indices_k, indices_k, cu_seqlens_k, cu_seqlens_k, max_k, max_k, kv_length, holes)
    indices_q, cu_seqlens_q, max_q, _ = _real_tokens(key_mask[:, -q_length:])
    return PaddedBatch(indices_q, indices_k, cu_seqlens_q, cu_seqlens_k, max_q, max_k, kv_length, holes)


def _unpacked(mask_function: object) -> tuple[object, Tensor | None]:
    """When `mask_function` is transformers' restriction of a mask function to packed sequences (see
    _AND_MASKS_CODE): that function and transformers' (batch, seqlen) document ids, each token's document in its
    row. Else `mask_function` itself and None."""
    parts = _closure(mask_function, _AND_MASKS_CODE).get("mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return mask_function, None
    document_ids = _closure(parts[1], _PACKED_SEQUENCE_CODE).get("packed_sequence_mask")
    if not isinstance(document_ids, Tensor) or document_ids.dim() != 2:
        return mask_function, None
    base = parts[0]
    remapped = _closure(base, _REMAP_POSITIONS_CODE).get("mask_function") if _REMAP_POSITIONS_CODE else None
    return (base if remapped is None else remapped), document_ids


def _is_sliding_window_causal(mask_function: object) -> bool:
    """Whether `mask_function` is transformers' sliding-window causal mask (see _SLIDING_WINDOW_OVERLAY_CODE)."""
    parts = _closure(mask_function, _AND_MASKS_CODE).get("mask_functions")
    return (
        isinstance(parts, tuple)
        and len(parts) == 2
        and getattr(parts[0], "__code__", None) is _SLIDING_WINDOW_OVERLAY_CODE
        and parts[1] is causal_mask_function
    )


def _closure(function: object, code: object) -> dict[str, object]:
    """The variables `function` closes over, by name, when it is a closure of `code`; else empty."""
    if code is None or getattr(function, "__code__", None) is not code or function.__closure__ is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, function.__closure__)}


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
    scaling to head_dim ** -0.5; sliding_window to window_size=(sliding_window - 1, 0). Packed sequences
    (cu_seq_lens_q/k with max_length_q/k, the mask hook's PackedSequences, or position_ids that restart within a
    row) go to flash_attn_varlen_func, one document at a time; so do the real tokens of a padded batch (the mask
    hook's PaddedBatch), whose output is padded back with zeros. Keyword arguments that DASH has no use for and
    that do not change attention (use_cache, num_items_in_batch, ...) pass."""
    packed_by_mask = attention_mask if isinstance(attention_mask, PackedSequences) else None
    padded = attention_mask if isinstance(attention_mask, PaddedBatch) else None
    refuse_unsupported(
        "attention_mask",
        None if packed_by_mask is not None or padded is not None else attention_mask,
        (None,),
        'DASH has no attention mask but the causal one, and the "dash_attn" mask function returns None, '
        "PackedSequences or PaddedBatch for every mask it accepts, so this one is a prepared 4-D mask or one the "
        "model built itself",
    )
    refuse_unsupported(
        "dropout",
        dropout,
        (0.0,),
        "DASH has no attention dropout (the model passes config.attention_dropout while training: set it to 0.0)",
    )
    cap = resolve_softcap(softcap)
    for name, reason in _UNSUPPORTED_KEYWORDS.items():
        refuse_unsupported(name, kwargs.get(name), (None,), reason)
    _refuse_attention_weights(module, kwargs.get("output_attentions"))
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    check_flags(is_causal=causal)
    window_size = _window_size(sliding_window, causal)
    scale = resolve_scale(scaling, query.shape[-1], "scaling")
    batch, seqlen_q, seqlen_k = query.shape[0], query.shape[2], key.shape[2]
    query, key, value = _half_precision(query, key, value)
    deterministic = _resolve_deterministic(module, deterministic, schedule)
    if padded is not None:
        return _padded_attention(
            padded,
            kwargs,
            query,
            key,
            value,
            softmax_scale=scale,
            causal=causal,
            window_size=window_size,
            deterministic=deterministic,
            schedule=schedule,
            softcap=cap,
        )
    packing = _packing(kwargs, batch, seqlen_q, query.device, packed_by_mask)
    if packing is not None:
        _check_packable(packing, seqlen_q, seqlen_k)
    if packing is None:
        out = flash_attn_func(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            softmax_scale=scale,
            causal=causal,
            window_size=window_size,
            deterministic=deterministic,
            schedule=schedule,
            softcap=cap,
        )
        return out, None
    # (batch, heads, seqlen, head_dim) -> (batch * seqlen, heads, head_dim): a view of the projection's memory.
    query_rows, key_rows, value_rows = (
        t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (query, key, value)
    )
    out = flash_attn_varlen_func(
        query_rows,
        key_rows,
        value_rows,
        packing.cu_seqlens_q,
        packing.cu_seqlens_k,
        packing.max_seqlen_q,
        packing.max_seqlen_k,
        softmax_scale=scale,
        causal=causal,
        window_size=window_size,
        deterministic=deterministic,
        schedule=schedule,
        softcap=cap,
    )
    return out.view(batch, seqlen_q, *out.shape[1:]), None


def _resolve_deterministic(module: torch.nn.Module, deterministic: object, schedule: object) -> object:
    """The deterministic flag for flash_attn_func: True unless the user asked otherwise, with deterministic=False
    passed to the model's forward or schedule="nondeterministic". A model that passes FlashAttention's own flag
    from its config to every attention call (_FLASH_DETERMINISTIC_ATTRIBUTES, False by default as in
    FlashAttention) has not asked: only schedule="nondeterministic" turns DASH's backward nondeterministic there."""
    passed_by_model = any(hasattr(module, name) for name in _FLASH_DETERMINISTIC_ATTRIBUTES)
    if deterministic is None or passed_by_model:
        return schedule != NONDETERMINISTIC
    return deterministic


def _padded_attention(
    padded: PaddedBatch, kwargs: dict, query: Tensor, key: Tensor, value: Tensor, **options: object
) -> tuple[Tensor, None]:
    """Attention on the real tokens of a padded batch: unpad (the rows PaddedBatch names, as differentiable
    gathers), flash_attn_varlen_func, pad (zeros for padding query rows)."""
    passed = [name for name in _PACKING_KEYWORDS if kwargs.get(name) is not None]
    if passed:
        raise NotImplementedError(
            f"attention_mask marks padding and {', '.join(passed)} mark packed sequences: DASH takes one or the "
            f"other (pad, or pack with DataCollatorWithFlattening, not both)"
        )
    batch, seqlen_q, seqlen_k = query.shape[0], query.shape[2], key.shape[2]
    if seqlen_k != padded.kv_length:
        raise NotImplementedError(
            f"the layer has {seqlen_k} keys but its padding mask covers {padded.kv_length}: a layer whose keys "
            f"differ from the mask transformers made for it"
        )
    if padded.holes and options["window_size"] != (-1, -1):
        raise NotImplementedError(
            f"attention_mask has padding between two real tokens of a row (not only left or right padding), and "
            f"the layer has sliding_window={options['window_size'][0] + 1}: DASH packs each row's real tokens "
            f"together, so its window would count the keys it reaches without the padding between them, while "
            f"transformers' counts every column. Pad on the left or the right only"
        )
    padded = padded.on(query.device)
    position_ids = kwargs.get("position_ids")
    if isinstance(position_ids, Tensor) and position_ids.dim() == 2 and seqlen_q > 1:
        if _read_once(
            position_ids,
            (padded, batch, seqlen_q),
            lambda: _restarts_within_real_tokens(position_ids, padded, batch, seqlen_q),
        ):
            raise NotImplementedError(
                "attention_mask marks padding and position_ids restart among a row's real tokens (packed "
                "sequences): DASH takes one or the other (pad, or pack with DataCollatorWithFlattening, not both)"
            )
    # (batch, heads, seqlen, head_dim) -> (batch * seqlen, heads, head_dim) -> the real tokens' rows.
    query_rows, key_rows, value_rows = (
        _GatherRows.apply(t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]), indices)
        for t, indices in ((query, padded.indices_q), (key, padded.indices_k), (value, padded.indices_k))
    )
    out = flash_attn_varlen_func(
        query_rows,
        key_rows,
        value_rows,
        padded.cu_seqlens_q,
        padded.cu_seqlens_k,
        padded.max_seqlen_q,
        padded.max_seqlen_k,
        **options,
    )
    return pad_input(out, padded.indices_q, batch, seqlen_q), None


def _restarts_within_real_tokens(position_ids: Tensor, padded: PaddedBatch, batch: int, seqlen: int) -> bool:
    """Whether position_ids (batch or 1, seqlen) restart between two real query tokens of one row, which marks
    packed sequences inside a padded batch. Positions of padding tokens do not count (generate() gives them
    positions that restart). One device-to-host read."""
    if position_ids.shape[-1] != seqlen or position_ids.shape[0] not in (1, batch):
        return False
    indices = padded.indices_q
    positions = position_ids.detach().to(indices.device).expand(batch, -1).reshape(-1).index_select(0, indices)
    rows = torch.div(indices, seqlen, rounding_mode="floor")
    return bool(((rows[1:] == rows[:-1]) & (positions.diff() != 1)).any())


def _window_size(sliding_window: object, causal: bool) -> tuple[int, int]:
    """flash_attn_func's window_size for transformers' sliding_window: a query sees the sliding_window keys ending
    at its own (transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window), so (sliding_window - 1, 0),
    bottom-right aligned, which matches transformers' mask when the keys are the tokens seen so far, as for the
    causal mask (a DynamicCache's sliding layers keep the last sliding_window - 1 keys, whose end is still the
    queries' end). (-1, -1) for none."""
    if sliding_window is None:
        return (-1, -1)
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise ValueError(f"sliding_window must be an int >= 1 (the keys a query sees), got {sliding_window!r}")
    if not causal:
        raise NotImplementedError(
            f"sliding_window={sliding_window} is not supported without causal attention (is_causal=False): "
            f"transformers' bidirectional window is not DASH's"
        )
    return (sliding_window - 1, 0)


@dataclass(frozen=True)
class PackedSequences:
    """A packed batch as flash_attn_varlen_func takes it: int32 offsets (one tensor for queries and keys when their
    sequences are the same, which lets the backward use the shift schedules), the longest sequences as host ints,
    and the argument that marked it, for error messages. dash_attention_mask returns one for transformers'
    packed-sequence mask, and the attention layers receive it as attention_mask."""

    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    source: str

    def on(self, device: torch.device) -> PackedSequences:
        """These offsets on `device` (themselves when they are there: a model split over devices copies them)."""
        if self.cu_seqlens_q.device == device:
            return self
        cu_seqlens_q = self.cu_seqlens_q.to(device)
        same = self.cu_seqlens_k is self.cu_seqlens_q
        cu_seqlens_k = cu_seqlens_q if same else self.cu_seqlens_k.to(device)
        return PackedSequences(cu_seqlens_q, cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k, self.source)


# What the first layer of a forward read on the host, for the layers after it: tensor -> (stamp, companions, value),
# where the stamp holds the tensor's version counter and whatever else the value depends on, and companions weak
# references to the other tensors it was read with.
_host_reads: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _read_once(
    tensor: Tensor, depends_on: tuple, read: Callable[[], object], companion: Tensor | None = None
) -> object:
    """read(), or what it returned for this tensor object, unchanged since (its version counter), with the same
    `depends_on` and the same companion tensor object, unchanged too. Inference-mode tensors have no version
    counter: they are read every time."""
    tensors = (tensor,) if companion is None else (tensor, companion)
    if any(t.is_inference() for t in tensors):
        return read()
    stamp = (tuple(t._version for t in tensors), *depends_on)
    cached = _host_reads.get(tensor)
    if cached is not None and cached[0] == stamp and (companion is None or cached[1]() is companion):
        return cached[2]
    value = read()
    _host_reads[tensor] = (stamp, None if companion is None else weakref.ref(companion), value)
    return value


def _packing(
    kwargs: dict, batch: int, seqlen: int, device: torch.device, packed_by_mask: PackedSequences | None
) -> PackedSequences | None:
    """The packed sequences the layer's keywords or its mask (`packed_by_mask`) mark, or None for one sequence per
    row (see the module's invariants for the rules and the cost)."""
    passed = [name for name in _PACKING_KEYWORDS if kwargs.get(name) is not None]
    if passed:
        missing = [name for name in _PACKING_KEYWORDS if name not in passed]
        if missing:
            raise ValueError(
                f"{', '.join(passed)} passed without {', '.join(missing)}: packed sequences need all of "
                f"{', '.join(_PACKING_KEYWORDS)} (as DataCollatorWithFlattening(return_flash_attn_kwargs=True) "
                f"makes them), or none and position_ids restarting at each sequence"
            )
        return _packing_from_offsets(kwargs, device)
    if packed_by_mask is not None:
        return packed_by_mask.on(device)
    position_ids = kwargs.get("position_ids")
    packing = None
    # (3, batch, seqlen) multimodal rotary positions are not consecutive by design and mark no packing.
    if isinstance(position_ids, Tensor) and position_ids.dim() == 2 and position_ids.shape[-1] > 1:
        packing = _read_once(
            position_ids, (batch, seqlen, device), lambda: _packing_from_positions(position_ids, batch, seqlen, device)
        )
    seq_idx = kwargs.get("seq_idx")
    if packing is None and isinstance(seq_idx, Tensor) and seq_idx.numel() > 1:
        if _read_once(seq_idx, (), lambda: bool((seq_idx.detach().diff(dim=-1) != 0).any())):
            raise NotImplementedError(
                "seq_idx marks several sequences in a row, but neither position_ids (restarting at each sequence) "
                "nor cu_seq_lens_q/k with max_length_q/k do, and DASH reads the packing from those, as transformers' "
                "attention paths do: pass position_ids (DataCollatorWithFlattening's default) or "
                "return_flash_attn_kwargs=True"
            )
    return packing


def _packing_from_positions(
    position_ids: Tensor, batch: int, seqlen: int, device: torch.device
) -> PackedSequences | None:
    """The documents position_ids mark: one starts at each row's first token and wherever a position is not its
    predecessor's plus one. None when every row holds one. Reads position_ids on the host: the forward's sync."""
    positions = position_ids.detach().to("cpu")
    starts = torch.ones(positions.shape, dtype=torch.bool)
    starts[:, 1:] = positions.diff(dim=-1) != 1
    if not starts[:, 1:].any():
        return None
    if positions.shape[-1] != seqlen or positions.shape[0] not in (1, batch):
        raise NotImplementedError(
            f"position_ids of shape {tuple(positions.shape)} restart within a row, which marks packed sequences, "
            f"but do not give one position per query token (batch {batch}, seqlen {seqlen}), so DASH cannot tell "
            f"where the sequences lie"
        )
    return _packing_from_starts(starts.expand(batch, -1), device)


def _packing_from_starts(starts: Tensor, device: torch.device) -> PackedSequences:
    """The documents whose first tokens `starts` (a host (batch, seqlen) bool tensor) marks, its rows laid end to
    end: one offsets tensor for queries and keys, on `device`."""
    first_tokens = starts.reshape(-1).nonzero().reshape(-1)
    offsets = torch.cat((first_tokens, torch.tensor([starts.numel()]))).to(torch.int32)
    cu_seqlens = offsets.to(device)
    longest = int(offsets.diff().max())
    return PackedSequences(cu_seqlens, cu_seqlens, longest, longest, "position_ids")


def _packing_from_offsets(kwargs: dict, device: torch.device) -> PackedSequences:
    """cu_seq_lens_q/k and max_length_q/k as flash_attn_varlen_func takes them: int32 on the states' device, and
    host ints (a 0-d tensor is read, a sync). The offsets are compared once per forward, unless one tensor is
    passed as both (transformers' collator makes two equal ones): equal offsets go in as one tensor."""
    offsets = {}
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        value = kwargs[name]
        if not isinstance(value, Tensor) or value.dim() != 1 or value.numel() < 2 or value.is_floating_point():
            raise ValueError(
                f"{name} must be a 1-D integer tensor of sequences + 1 offsets (0, then each sequence's end), got "
                f"{value!r}"
            )
        offsets[name] = value
    cu_q, cu_k = offsets["cu_seq_lens_q"], offsets["cu_seq_lens_k"]
    if cu_q.numel() != cu_k.numel():
        raise ValueError(
            f"cu_seq_lens_k has {cu_k.numel()} offsets but cu_seq_lens_q {cu_q.numel()}: both hold sequences + 1"
        )
    lengths = {}
    for name in ("max_length_q", "max_length_k"):
        value = kwargs[name]
        if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int (the longest sequence), got {value!r}")
        lengths[name] = value
    cu_seqlens_q = cu_q.to(device=device, dtype=torch.int32)
    if cu_k is cu_q:
        cu_seqlens_k = cu_seqlens_q
    else:
        same = _read_once(cu_q, (), lambda: torch.equal(cu_q, cu_k.to(cu_q.device)), companion=cu_k)
        cu_seqlens_k = cu_seqlens_q if same else cu_k.to(device=device, dtype=torch.int32)
    max_q, max_k = lengths["max_length_q"], lengths["max_length_k"]
    return PackedSequences(cu_seqlens_q, cu_seqlens_k, max_q, max_k, "cu_seq_lens_q")


def _check_packable(packing: PackedSequences, seqlen_q: int, seqlen_k: int) -> None:
    """Refuses what flash_attn_varlen_func cannot compute for a packed batch found by transformers' arguments."""
    if packing.source == "position_ids" and seqlen_k != seqlen_q:
        raise NotImplementedError(
            f"position_ids restart within a row (packed sequences), but the layer has {seqlen_k} keys for "
            f"{seqlen_q} queries: the cache holds earlier tokens, and DASH cannot tell which sequences they belong "
            f"to. Run packed batches without a cache (use_cache=False) or with an empty one"
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
