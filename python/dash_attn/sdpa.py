"""scaled_dot_product_attention: torch.nn.functional.scaled_dot_product_attention's signature and
(batch, heads, seqlen, head_dim) convention on DASH kernels.

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
"""

from __future__ import annotations

from torch import Tensor

from ._arguments import BHSD, attend, check_flags, check_tensors, refuse_unsupported


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
