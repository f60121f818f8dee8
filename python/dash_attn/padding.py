"""unpad_input and pad_input: between padded (batch, seqlen, ...) tensors and the packed (total_tokens, ...) rows
that flash_attn_varlen_func takes, with the arguments and results of FlashAttention-2's flash_attn.bert_padding
helpers of the same names, so code that unpads for FA2's varlen call works unchanged.

Invariants:
- unpad_input returns FA2's five values (its recent form): the kept rows, their int64 indices into the flattened
  (batch * seqlen) tokens in row-major order, int32 cu_seqlens (batch + 1, starting at 0), the longest kept
  sequence as a host int, and each row's used length (int32, the attention_mask's tokens alone). A token is kept
  when attention_mask, or unused_mask (allocated but unused tokens, FA3's seqused), is nonzero there: the masks are
  read as booleans, so a token counts once whatever the values.
- Both moves are pure copies, differentiable, whose backward is the other copy (zeros elsewhere): no sum of two
  values ever happens, so the gradients are bitwise reproducible, under torch.use_deterministic_algorithms too.
- unpad_input reads the longest length on the host (one device-to-host copy), as FA2's does: flash_attn_varlen_func
  needs it as an int. pad_input reads nothing on the host.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._arguments import check_is_tensor


class _GatherRows(torch.autograd.Function):
    """rows[indices] of a (rows, ...) tensor; the backward puts the gradient back at those rows, zeros elsewhere."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, rows: Tensor, indices: Tensor) -> Tensor:
        ctx.save_for_backward(indices)
        ctx.row_count = rows.shape[0]
        return rows.index_select(0, indices)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        (indices,) = ctx.saved_tensors
        return _scatter_rows(grad, indices, ctx.row_count), None


class _ScatterRows(torch.autograd.Function):
    """A (row_count, ...) tensor of zeros holding values[i] at row indices[i]; the backward gathers those rows."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, values: Tensor, indices: Tensor, row_count: int) -> Tensor:
        ctx.save_for_backward(indices)
        return _scatter_rows(values, indices, row_count)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None, None]:
        (indices,) = ctx.saved_tensors
        return grad.index_select(0, indices), None, None


def _scatter_rows(values: Tensor, indices: Tensor, row_count: int) -> Tensor:
    out = values.new_zeros((row_count, *values.shape[1:]))
    # The indices are distinct (unpad_input's), so each row is written once: a copy, not a sum.
    out[indices] = values
    return out


def _check_mask(mask: object, name: str, hidden_states: Tensor) -> Tensor:
    check_is_tensor(mask, name)
    if mask.dim() != 2 or tuple(mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(
            f"{name} must be (batch, seqlen) = {tuple(hidden_states.shape[:2])} (hidden_states' first two "
            f"dimensions), got shape {tuple(mask.shape)}"
        )
    if mask.is_floating_point() or mask.is_complex():
        raise TypeError(f"{name} must be a bool or integer tensor (nonzero marks a token), got {mask.dtype}")
    if mask.device != hidden_states.device:
        raise ValueError(f"{name} is on {mask.device} but hidden_states on {hidden_states.device}")
    return mask.bool()


def unpad_input(
    hidden_states: Tensor, attention_mask: Tensor, unused_mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """The tokens of a padded batch, packed: hidden_states (batch, seqlen, ...) and attention_mask (batch, seqlen),
    nonzero for a token, zero for padding; unused_mask marks further tokens that are kept but not used.

    Returns (rows, indices, cu_seqlens, max_seqlen, seqused): rows (total_tokens, ...) are the kept tokens in
    row-major order, indices (total_tokens,) int64 their positions in the flattened (batch * seqlen) tokens,
    cu_seqlens (batch + 1,) int32 the packed offsets for flash_attn_varlen_func, max_seqlen the longest kept row
    (host int), seqused (batch,) int32 the attention_mask's tokens of each row. pad_input(rows, indices, batch,
    seqlen) undoes it."""
    check_is_tensor(hidden_states, "hidden_states")
    if hidden_states.dim() < 2:
        raise ValueError(f"hidden_states must be (batch, seqlen, ...), got shape {tuple(hidden_states.shape)}")
    used = _check_mask(attention_mask, "attention_mask", hidden_states)
    kept = used if unused_mask is None else used | _check_mask(unused_mask, "unused_mask", hidden_states)
    lengths = kept.sum(dim=-1, dtype=torch.int32)
    indices = kept.reshape(-1).nonzero().reshape(-1)
    cu_seqlens = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=lengths.device)
    torch.cumsum(lengths, dim=0, dtype=torch.int32, out=cu_seqlens[1:])
    max_seqlen = int(lengths.max()) if lengths.numel() else 0
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return _GatherRows.apply(rows, indices), indices, cu_seqlens, max_seqlen, used.sum(dim=-1, dtype=torch.int32)


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """The padded (batch, seqlen, ...) batch of packed rows hidden_states (total_tokens, ...): row i lands at the
    flattened position indices[i] (unpad_input's indices), zeros everywhere else. Differentiable in
    hidden_states."""
    check_is_tensor(hidden_states, "hidden_states")
    check_is_tensor(indices, "indices")
    for value, name in ((batch, "batch"), (seqlen, "seqlen")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int >= 0, got {type(value).__name__} {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value}")
    # A bool tensor would index as a mask, not as rows; a float or complex one does not index at all.
    integer = not (indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool)
    if indices.dim() != 1 or indices.shape[0] != hidden_states.shape[0] or not integer:
        raise ValueError(
            f"indices must be a 1-D integer tensor with one entry per row of hidden_states "
            f"({hidden_states.shape[0]}), got {indices.dtype} of shape {tuple(indices.shape)}"
        )
    out = _ScatterRows.apply(hidden_states, indices, batch * seqlen)
    return out.view(batch, seqlen, *hidden_states.shape[1:])


__all__ = ["pad_input", "unpad_input"]
