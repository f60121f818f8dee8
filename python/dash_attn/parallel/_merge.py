"""LseMerge: the running merge of partial attention results (out, lse) of query rows over disjoint blocks of
keys, in the order they are added.

Invariants:
- The merge is a fixed sequence of elementwise fp32 (fp64 for fp64 inputs) operations per added block:
  lse' = logaddexp(lse, lse_b); out' = out * exp(lse - lse') + out_b * exp(lse_b - lse'). Elementwise kernels
  give the same bits for the same inputs, so the result depends only on the blocks and the order of add() calls,
  which the caller fixes by program order (ring step), never by when data arrives.
- Rows start empty (out 0, lse -inf). A first block that covers every row is taken as it is (widened exactly),
  which is what the formula gives; a block that covers some rows enters them through the formula, whose weights
  exist because every row of every block sees at least one key (finite lse_b).
- Each block's out arrives rounded to the input dtype (bf16 from DASH's kernel) and is widened exactly; the
  merged out is rounded to the input dtype once, by the caller, after the last block. A different split of the
  keys into blocks (another world size) or another order rounds differently: floating-point addition is not
  associative.
"""

from __future__ import annotations

import torch
from torch import Tensor

_ALL = slice(None)


class LseMerge:
    """Merges (out, lse) blocks of the rows of `like` (batch, seqlen, heads, head_dim) into accumulators of
    `dtype`; rows are a slice or an index of distinct rows along the sequence dimension."""

    def __init__(self, like: Tensor, dtype: torch.dtype) -> None:
        batch, seqlen, heads, _ = like.shape
        self.out = torch.zeros(like.shape, dtype=dtype, device=like.device)
        self.lse = torch.full((batch, heads, seqlen), float("-inf"), dtype=dtype, device=like.device)
        self.empty = True

    def add(self, out: Tensor, lse: Tensor, rows: slice | Tensor) -> None:
        """Merges a block, out (batch, rows, heads, head_dim) and lse (batch, heads, rows), into rows `rows`."""
        if self.empty and isinstance(rows, slice) and rows == _ALL:
            self.out, self.lse = out.to(self.out.dtype), lse.to(self.lse.dtype).clone()
        else:
            old_lse = self.lse[:, :, rows]
            new_lse = torch.logaddexp(old_lse, lse)
            # (batch, heads, rows) weights as (batch, rows, heads, 1) to scale rows of (batch, rows, heads, head_dim).
            old_weight = torch.exp(old_lse - new_lse).transpose(1, 2).unsqueeze(-1)
            new_weight = torch.exp(lse - new_lse).transpose(1, 2).unsqueeze(-1)
            self.out[:, rows] = self.out[:, rows] * old_weight + out.to(self.out.dtype) * new_weight
            self.lse[:, :, rows] = new_lse
        self.empty = False

    def result(self) -> tuple[Tensor, Tensor]:
        """The merged out (accumulator dtype) and lse."""
        return self.out, self.lse
