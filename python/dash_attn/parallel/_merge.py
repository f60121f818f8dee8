"""LseMerge: the running merge of partial attention results (out, lse) of the same query rows over disjoint
blocks of keys, in the order they are added.

Invariants:
- The merge is a fixed sequence of elementwise fp32 (fp64 for fp64 inputs) operations per added block:
  lse' = logaddexp(lse, lse_b); out' = out * exp(lse - lse') + out_b * exp(lse_b - lse'). Elementwise kernels
  give the same bits for the same inputs, so the result depends only on the blocks and the order of add() calls,
  which the caller fixes by program order (ring step), never by when data arrives.
- Each block's out arrives rounded to the input dtype (bf16 from DASH's kernel) and is widened exactly; the
  merged out is rounded to the input dtype once, by the caller, after the last block. A different split of the
  keys into blocks (another world size) or another order rounds differently: floating-point addition is not
  associative.
"""

from __future__ import annotations

import torch
from torch import Tensor


class LseMerge:
    """Merges (out, lse) blocks into accumulators initialized from the first block, which covers every row."""

    def __init__(self, out: Tensor, lse: Tensor) -> None:
        dtype = lse.dtype
        self.out = out.to(dtype)  # (batch, seqlen, heads, head_dim)
        self.lse = lse.clone()  # (batch, heads, seqlen)

    def add(self, out: Tensor, lse: Tensor, rows: slice) -> None:
        """Merges a block that covers query rows `rows` of the accumulators."""
        old_lse = self.lse[:, :, rows]
        new_lse = torch.logaddexp(old_lse, lse)
        # (batch, heads, rows) weights as (batch, rows, heads, 1) to scale rows of (batch, rows, heads, head_dim).
        old_weight = torch.exp(old_lse - new_lse).transpose(1, 2).unsqueeze(-1)
        new_weight = torch.exp(lse - new_lse).transpose(1, 2).unsqueeze(-1)
        self.out[:, rows] = self.out[:, rows] * old_weight + out.to(self.out.dtype) * new_weight
        self.lse[:, :, rows] = new_lse

    def result(self) -> tuple[Tensor, Tensor]:
        """The merged out (accumulator dtype) and lse."""
        return self.out, self.lse
