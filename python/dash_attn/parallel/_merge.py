"""LseMerge: the running merge of partial attention results (out, lse) of query rows over disjoint blocks of
keys, in the order they are added.

Invariants:
- The merge is a fixed sequence of elementwise fp32 (fp64 for fp64 inputs) operations per added block:
  lse' = logaddexp(lse, lse_b); out' = out * exp(lse - lse') + out_b * exp(lse_b - lse'). On CUDA fp32 accumulators
  it is DASH's fused merge kernel when the library has one (dash_merge_partial: one launch per block instead of about
  seven, each row by one warp, no atomics); otherwise, and on the CPU, torch's elementwise ops. Either gives the same
  bits for the same inputs, so the result depends only on the blocks and the order of add() calls, which the caller
  fixes by program order (ring step), never by when data arrives. The two evaluations may differ from each other in
  the last bits (the kernel fuses the final multiply-add), never from run to run.
- Rows start empty (out 0, lse -inf). A first block that covers every row is taken as it is (widened exactly),
  which is what the formula gives; a block that covers some rows enters them through the formula, whose weights
  exist because every row of every block sees at least one key (finite lse_b). The fused kernel takes a weight whose
  LSE is -inf as 0, so it gives the same for an empty row and no NaN even where both sides are -inf.
- Blocks arrive from DASH's kernels in fp32 (out before its rounding to the input dtype); blocks of another local
  kernel in the input dtype are widened exactly. The merged out is rounded to the input dtype once, by the caller,
  after the last block. A different split of the keys into blocks (another world size) or another order rounds
  differently: floating-point addition is not associative.
"""

from __future__ import annotations

import torch
from torch import Tensor

_ALL = slice(None)


def _fused_merge_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether DASH's merge kernel can run the merge: fp32 accumulators on a CUDA device and a library that has it."""
    if device.type != "cuda" or dtype != torch.float32:
        return False
    from .. import _library

    try:
        return _library.merge_kernel_available()
    except ImportError:  # no library: the torch formula alone
        return False


def merge_args(
    acc_out: Tensor, acc_lse: Tensor, out: Tensor, lse: Tensor, rows: slice | Tensor
) -> tuple[object, Tensor | None]:
    """The dash_merge_args (_library.MergeArgs) that merge the fp32 block (out, lse) into the fp32 accumulators at
    `rows`, and the int32 index tensor they point to (None for a slice of rows, passed as an offset), which must stay
    alive until the merge is enqueued. The block is read with its strides (head_dim made contiguous if it is not)."""
    from .. import _library
    from .._ops import _c_tensor

    batch, seqlen, heads, head_dim = acc_out.shape
    index, row_offset = None, 0
    if isinstance(rows, slice) and rows.step in (None, 1):
        row_offset = range(seqlen)[rows].start
    else:
        positions = torch.arange(seqlen, device=acc_out.device)[rows] if isinstance(rows, slice) else rows
        index = positions.to(device=acc_out.device, dtype=torch.int32).contiguous()
    if out.stride(-1) != 1:
        out = out.contiguous()
    args = _library.MergeArgs(
        batch=batch,
        rows=out.shape[1],
        seqlen=seqlen,
        heads=heads,
        head_dim=head_dim,
        part_out=_c_tensor(out),
        part_lse=lse.data_ptr(),
        part_lse_strides=lse.stride(),
        acc_out=_c_tensor(acc_out),
        acc_lse=acc_lse.data_ptr(),
        acc_lse_strides=acc_lse.stride(),
        row_index=None if index is None else index.data_ptr(),
        row_offset=row_offset,
    )
    return args, index


class LseMerge:
    """Merges (out, lse) blocks of the rows of `like` (batch, seqlen, heads, head_dim) into accumulators of
    `dtype`; rows are a slice or an index of distinct rows along the sequence dimension."""

    def __init__(self, like: Tensor, dtype: torch.dtype) -> None:
        batch, seqlen, heads, _ = like.shape
        self.out = torch.zeros(like.shape, dtype=dtype, device=like.device)
        self.lse = torch.full((batch, heads, seqlen), float("-inf"), dtype=dtype, device=like.device)
        self.empty = True
        self.fused = _fused_merge_available(like.device, dtype)

    def add(self, out: Tensor, lse: Tensor, rows: slice | Tensor) -> None:
        """Merges a block, out (batch, rows, heads, head_dim) and lse (batch, heads, rows), into rows `rows`."""
        if self.empty and isinstance(rows, slice) and rows == _ALL:
            self.out, self.lse = out.to(self.out.dtype), lse.to(self.lse.dtype).clone()
        elif self.fused:
            self._add_fused(out.to(self.out.dtype), lse.to(self.lse.dtype), rows)
        else:
            old_lse = self.lse[:, :, rows]
            new_lse = torch.logaddexp(old_lse, lse)
            # (batch, heads, rows) weights as (batch, rows, heads, 1) to scale rows of (batch, rows, heads, head_dim).
            old_weight = torch.exp(old_lse - new_lse).transpose(1, 2).unsqueeze(-1)
            new_weight = torch.exp(lse - new_lse).transpose(1, 2).unsqueeze(-1)
            self.out[:, rows] = self.out[:, rows] * old_weight + out.to(self.out.dtype) * new_weight
            self.lse[:, :, rows] = new_lse
        self.empty = False

    def _add_fused(self, out: Tensor, lse: Tensor, rows: slice | Tensor) -> None:
        """add() as one launch of DASH's merge kernel, on the current stream of the accumulators' device."""
        from .. import _library

        args, index = merge_args(self.out, self.lse, out, lse, rows)
        device = self.out.get_device()
        with torch.cuda.device(device):
            _library.merge_partial(args, torch.cuda.current_stream(device).cuda_stream)
        del index  # kept alive until the launch is enqueued; the stream orders its reuse

    def result(self) -> tuple[Tensor, Tensor]:
        """The merged out (accumulator dtype) and lse."""
        return self.out, self.lse
