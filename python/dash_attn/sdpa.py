"""scaled_dot_product_attention: torch.nn.functional.scaled_dot_product_attention's signature and
(batch, heads, seqlen, head_dim) convention on DASH kernels; and enable_sdpa() / disable_sdpa(), which route torch's
own F.scaled_dot_product_attention, where it picks its flash backend, to DASH.

Invariants:
- Positional and keyword arguments mean what they mean in torch's SDPA: (query, key, value, attn_mask=None,
  dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False). deterministic, schedule and sm_margin are
  keyword-only extras. deterministic defaults to True; sm_margin (SMs left to other work) to 0.
- attn_mask and dropout_p are accepted at their no-op values (None, 0.0). Other values raise
  NotImplementedError naming the argument.
- SDPA aligns is_causal to the top-left corner and DASH to the bottom-right. The two agree only when
  seqlen_q == seqlen_k, so other lengths are refused rather than computed with a different mask.
- The tensors are viewed as (B, S, H, D) by a transpose, which copies nothing when they are packed. The result
  is such a view too.
- enable_sdpa() works only through torch's registry of flash attention implementations
  (torch.nn.attention.register_flash_attention_impl and activate_flash_attention_impl). Where the installed torch
  lacks it, enable_sdpa() raises RuntimeError saying so and changes nothing. Once enabled, SDPA's flash forward and
  backward ops (aten::_scaled_dot_product_flash_attention and its backward, CUDA) run DASH until disable_sdpa(),
  which gives torch's own kernels back. Every other SDPA backend (memory-efficient, cuDNN, math) is unchanged, and
  torch still decides when the flash backend applies.
- A call that reaches DASH through SDPA and that DASH cannot compute exactly (dropout, a head dim without a kernel,
  is_causal with seqlen_q != seqlen_k) raises NotImplementedError naming the argument; it never falls back to
  another kernel without a word. The backward is deterministic unless enable_sdpa(deterministic=False) was called,
  and torch.use_deterministic_algorithms(True) governs it as it does dash_attn.flash_attn_func.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from ._arguments import BHSD, BSHD, attend, check_flags, check_tensors, refuse_unsupported
from .gradients import attention_backward

# The name DASH registers under in torch's registry of flash attention implementations.
SDPA_IMPLEMENTATION = "DASH"


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    deterministic: bool = True,
    schedule: str = "auto",
    sm_margin: int = 0,
) -> Tensor:
    """Attention on (batch, heads, seqlen, head_dim) tensors, differentiable in query, key and value, with the
    backward summed in the order `schedule` fixes and `sm_margin` SMs left to other work (see
    dash_attn.flash_attn_func). As in SDPA, fewer key/value heads need enable_gqa=True."""
    refuse_unsupported(
        "attn_mask", attn_mask, (None,), "DASH has no attention mask but the causal one (is_causal=True)"
    )
    refuse_unsupported("dropout_p", dropout_p, (0.0,), "DASH has no attention dropout")
    check_flags(is_causal=is_causal, enable_gqa=enable_gqa, deterministic=deterministic)
    check_tensors((query, key, value), BHSD)
    heads_q, heads_kv = query.shape[1], key.shape[1]
    if heads_q != heads_kv and not enable_gqa:
        raise ValueError(
            f"query has {heads_q} heads but key and value {heads_kv}: pass enable_gqa=True for grouped-query "
            f"attention (torch's SDPA refuses this too)"
        )
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    if is_causal and seqlen_q != seqlen_k:
        raise ValueError(
            f"is_causal=True needs query.shape[2] (seqlen_q) == key.shape[2] (seqlen_k), got {seqlen_q} and "
            f"{seqlen_k}: SDPA's causal mask is aligned to the top-left corner and DASH's to the bottom-right, "
            f"which differ for unequal lengths. flash_attn_func(causal=True) computes the bottom-right mask."
        )
    out, _ = attend(
        (query, key, value),
        BHSD,
        softmax_scale=scale,
        causal=is_causal,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        entry="dash_attn.scaled_dot_product_attention",
        scale_name="scale",
    )
    return out


def _flash_registry() -> object | None:
    """torch.nn.attention where it has the registry of flash attention implementations, else None."""
    from torch.nn import attention

    needed = ("register_flash_attention_impl", "activate_flash_attention_impl")
    return attention if all(hasattr(attention, name) for name in needed) else None


def _refuse_unless_exact(query: Tensor, key: Tensor, dropout_p: float, is_causal: bool) -> None:
    """What SDPA may ask of its flash backend but DASH does not compute, refused by name."""
    refuse_unsupported("dropout_p", dropout_p, (0.0,), "DASH has no attention dropout; disable_sdpa() for dropout")
    if is_causal and query.shape[2] != key.shape[2]:
        raise NotImplementedError(
            f"is_causal=True with query.shape[2] (seqlen_q) = {query.shape[2]} != key.shape[2] (seqlen_k) = "
            f"{key.shape[2]} is not supported: SDPA's causal mask is aligned to the top-left corner and DASH's to "
            f"the bottom-right"
        )


@dataclass
class _Routing:
    """What enable_sdpa() set up: the library of aten kernels it registered (dropping it gives torch's own kernels
    back) and whether the backward is deterministic."""

    library: torch.library.Library | None
    deterministic: bool

    def remove(self) -> None:
        global _routing
        if self.library is not None:
            self.library._destroy()
            self.library = None
        if _routing is self:
            _routing = None


_routing: _Routing | None = None


def _sdpa_flash_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple:
    """aten::_scaled_dot_product_flash_attention on DASH: out (B, H, Sq, D) and the fp32 LSE (B, H, Sq), with the
    placeholders SDPA's flash backend returns beside them (no offsets, an empty RNG state, no debug mask)."""
    _refuse_unless_exact(query, key, dropout_p, is_causal)
    refuse_unsupported("return_debug_mask", return_debug_mask, (False,), "DASH never materializes the probabilities")
    check_tensors((query, key, value), BHSD)
    # The op is called below autograd, which records the op itself; nothing here needs recording.
    with torch.no_grad():
        out, lse = attend(
            (query, key, value),
            BHSD,
            softmax_scale=scale,
            causal=is_causal,
            deterministic=_routing is None or _routing.deterministic,
            schedule="auto",
            entry="torch.nn.functional.scaled_dot_product_attention",
            scale_name="scale",
        )
    rng_state = torch.zeros(2, dtype=torch.uint64, device=query.device)
    offset = torch.zeros((), dtype=torch.uint64, device=query.device)
    debug_mask = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, None, None, query.shape[2], key.shape[2], rng_state, offset, debug_mask


def _sdpa_flash_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    logsumexp: Tensor,
    cum_seq_q: Tensor | None,
    cum_seq_k: Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: Tensor,
    philox_offset: Tensor,
    *,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """aten::_scaled_dot_product_flash_attention_backward on DASH: dquery, dkey, dvalue (B, H, S, D) from the
    forward's out and LSE, summed in the order the deterministic schedule fixes."""
    _refuse_unless_exact(query, key, dropout_p, is_causal)
    tensors = tuple(t.transpose(1, 2) for t in (grad_out, query, key, value, out))
    check_tensors(tensors[1:4], BSHD)
    with torch.no_grad():
        gradients = attention_backward(
            *tensors,
            logsumexp,
            softmax_scale=scale,
            causal=is_causal,
            deterministic=_routing is None or _routing.deterministic,
        )
    return tuple(g.transpose(1, 2) for g in gradients)


def _register_kernels(deterministic: bool) -> _Routing:
    library = torch.library.Library("aten", "IMPL", "CUDA")
    with warnings.catch_warnings():
        # Registering over torch's own CUDA kernels is the point; torch warns about any override.
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*previously registered kernel.*")
        library.impl("_scaled_dot_product_flash_attention", _sdpa_flash_forward, "CUDA")
        library.impl("_scaled_dot_product_flash_attention_backward", _sdpa_flash_backward, "CUDA")
    return _Routing(library, deterministic)


def enable_sdpa(*, deterministic: bool = True) -> None:
    """Routes torch.nn.functional.scaled_dot_product_attention's flash backend to DASH, through torch's registry of
    flash attention implementations (registered as "DASH"; torch.nn.attention.current_flash_attention_impl() then
    names it). Calling it again only updates `deterministic`. Raises RuntimeError, changing nothing, where the
    installed torch has no such registry. See the module's invariants for what is refused."""
    global _routing
    check_flags(deterministic=deterministic)
    registry = _flash_registry()
    if registry is None:
        raise RuntimeError(
            f"torch {torch.__version__} offers no way to register a flash attention implementation for "
            f"F.scaled_dot_product_attention (torch.nn.attention.register_flash_attention_impl and "
            f"activate_flash_attention_impl are missing), so DASH cannot be routed there: call "
            f"dash_attn.scaled_dot_product_attention instead, or install a torch that has them"
        )
    if _routing is not None:
        _routing.deterministic = deterministic
        return

    def install() -> _Routing:
        global _routing
        _routing = _register_kernels(deterministic)
        return _routing

    registry.register_flash_attention_impl(SDPA_IMPLEMENTATION, register_fn=install)
    registry.activate_flash_attention_impl(SDPA_IMPLEMENTATION)


def disable_sdpa() -> None:
    """Gives F.scaled_dot_product_attention's flash backend back to torch's own kernels. Does nothing when
    enable_sdpa() is not in effect."""
    if _routing is None:
        return
    registry = _flash_registry()
    restore = getattr(registry, "restore_flash_attention_impl", None)
    current = getattr(registry, "current_flash_attention_impl", None)
    if restore is not None and current is not None and current() == SDPA_IMPLEMENTATION:
        restore()  # the registry forgets DASH and calls its handle's remove()
    if _routing is not None:
        _routing.remove()


def sdpa_enabled() -> bool:
    """Whether enable_sdpa() is in effect: F.scaled_dot_product_attention's flash backend runs DASH."""
    return _routing is not None
