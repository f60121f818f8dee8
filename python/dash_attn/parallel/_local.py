"""The local attention kernel that context parallelism runs on each rank's blocks, behind one interface
(LocalAttention) with three implementations: DashLocalAttention (DASH's kernels, the default),
TorchLocalAttention (pure torch on any device and dtype, the reference the CPU tests inject) and
FlashAttention3LocalAttention (FlashAttention-3's kernels, for comparing the same ring or all-to-all on FA3).

Contract of a LocalAttention, which the ring and all-to-all modes rely on:
- forward(q, k, v, causal, softmax_scale, window) -> (out, lse) on (batch, seqlen, heads, head_dim) tensors. k
  and v may have fewer heads (GQA: query head h uses key/value head h // (heads_q // heads_kv)). The mask is
  FlashAttention's, bottom-right aligned with d = seqlen_k - seqlen_q: causal=True lets query row i see key j
  iff j <= i + d; window = (left, right) further limits it to i + d - left <= j <= i + d + right, -1 leaving a
  side open (causal makes right 0). Context parallelism only passes blocks in which every query row sees at
  least one key. out has q's dtype or accumulator_dtype(q.dtype) (DASH's kernels return it unrounded, so that the
  merge of the blocks rounds once, at the end); lse is (batch, heads_q, seqlen_q), natural-log, in
  accumulator_dtype(q.dtype).
- backward(dout, q, k, v, out, lse, causal, softmax_scale, window) -> (dq, dk, dv): the contribution of this
  block of keys to the gradients, where out and lse are the FINAL ones of these query rows (over all keys,
  merged from every block), not this block's. With P = exp(scale * q k^T - lse) masked,
  dS = P * (dout v^T - rowsum(dout * out)): dq = scale * dS k, dk = scale * dS^T q, dv = P^T dout (dk and dv
  summed over each GQA group). The blocks' contributions then sum to the gradients of the whole attention. This
  is the identity FlashAttention's backward kernel evaluates from the out and LSE it is handed, so a kernel that
  takes both implements it.
- forward_varlen and backward_varlen: the same on a packed batch, q (total_q, heads_q, head_dim) and k, v
  (total_k, heads_kv, head_dim), whose sequence b is rows offsets_q[b]:offsets_q[b + 1] of q and
  offsets_k[b]:offsets_k[b + 1] of k and v (offsets: host ints), each under its own mask; lse is (heads_q,
  total_q). Sequences without queries have nothing to compute; every other one has at least one key.
- All are called outside autograd and must be pure functions of their arguments: same inputs, same bits. The
  attribute `deterministic` says whether the implementation promises that (the nondeterministic DASH schedule
  does not); dash_attn.parallel applies torch's determinism switch to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from .. import attention_backward
from .._arguments import NONDETERMINISTIC, check_sm_margin, resolve_schedule
from .._ops import forward_partial

Window = tuple[int, int]
NO_WINDOW: Window = (-1, -1)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of LSEs and of every partial sum context parallelism keeps: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


class LocalAttention(Protocol):
    """The per-rank attention kernel (see the module docstring for the exact contract)."""

    deterministic: bool

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float, window: Window = NO_WINDOW
    ) -> tuple[Tensor, Tensor]: ...

    def backward(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor, Tensor]: ...

    def forward_varlen(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        offsets_q: Sequence[int],
        offsets_k: Sequence[int],
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor]: ...

    def backward_varlen(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        offsets_q: Sequence[int],
        offsets_k: Sequence[int],
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor, Tensor]: ...


def _sequences(offsets_q: Sequence[int], offsets_k: Sequence[int]) -> list[tuple[slice, slice]]:
    """The (query rows, key rows) of each sequence of a packed call that has queries (an empty sequence, which
    all-to-all mode can pass, has nothing to compute)."""
    return [
        (slice(offsets_q[b], offsets_q[b + 1]), slice(offsets_k[b], offsets_k[b + 1]))
        for b in range(len(offsets_q) - 1)
        if offsets_q[b + 1] > offsets_q[b]
    ]


def _longest(offsets: Sequence[int]) -> int:
    """The longest sequence of `offsets`, at least 1 (a varlen call's max_seqlen, which may not be 0)."""
    return max([1, *(offsets[b + 1] - offsets[b] for b in range(len(offsets) - 1))])


def _device_offsets(
    offsets_q: Sequence[int], offsets_k: Sequence[int], device: torch.device
) -> tuple[Tensor, Tensor, bool]:
    """cu_seqlens_q and cu_seqlens_k of a packed call on `device`, and whether they agree. When they do, one tensor
    serves as both: the promise that the keys of each sequence are within its queries, which flash_attn_varlen_func
    infers from one tensor in a self-attention call made directly, and under which the backward may run the shift
    schedules."""
    cu_seqlens_q = torch.tensor(offsets_q, dtype=torch.int32, device=device)
    same = tuple(offsets_q) == tuple(offsets_k)
    cu_seqlens_k = cu_seqlens_q if same else torch.tensor(offsets_k, dtype=torch.int32, device=device)
    return cu_seqlens_q, cu_seqlens_k, same


def _backward_per_sequence(
    dense_backward,
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    offsets_q: Sequence[int],
    offsets_k: Sequence[int],
) -> tuple[Tensor, Tensor, Tensor]:
    """A packed call's gradients from a dense backward run on each sequence as a batch of one (lse is
    (heads, total_q)); the sequences own disjoint rows, so each gradient row is written at most once. Rows no
    sequence with queries reaches (the keys of a sequence without queries) get zero gradients."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for rows_q, rows_k in _sequences(offsets_q, offsets_k):
        grads = dense_backward(
            dout[None, rows_q],
            q[None, rows_q],
            k[None, rows_k],
            v[None, rows_k],
            out[None, rows_q],
            lse[None, :, rows_q].contiguous(),
        )
        dq[rows_q], dk[rows_k], dv[rows_k] = (g[0] for g in grads)
    return dq, dk, dv


class _PerSequenceBackward:
    """backward_varlen as the class's dense backward run on each sequence (_backward_per_sequence)."""

    def backward_varlen(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        offsets_q: Sequence[int],
        offsets_k: Sequence[int],
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor, Tensor]:
        def dense(*tensors: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            return self.backward(*tensors, causal, softmax_scale, window)

        return _backward_per_sequence(dense, dout, q, k, v, out, lse, offsets_q, offsets_k)


class DashLocalAttention:
    """DASH's kernels as the local kernel: the forward kernel of dash_attn.flash_attn_func or flash_attn_varlen_func
    with its out in fp32 (the values before their rounding to q's dtype: the merge of the blocks then rounds once), and
    the backward kernel run on the caller's out and LSE (dash_attn.attention_backward, with the varlen arguments for a
    packed call: one launch per call, whatever its number of sequences).

    schedule, deterministic and sm_margin mean what they mean in flash_attn_func. sm_margin leaves SMs to the
    NCCL kernels that move K/V (ring) while a block computes; for the "shift" and "symmetric-shift" schedules the
    bits depend on it, so reproducing a run needs the same margin."""

    def __init__(self, schedule: str = "auto", deterministic: bool = True, sm_margin: int = 0) -> None:
        self.schedule = resolve_schedule(schedule, deterministic)
        self.deterministic = self.schedule != NONDETERMINISTIC
        self.sm_margin = check_sm_margin(sm_margin)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float, window: Window = NO_WINDOW
    ) -> tuple[Tensor, Tensor]:
        return forward_partial(q, k, v, softmax_scale, causal, *window, self.sm_margin)

    def backward(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor, Tensor]:
        # The kernel reads out and lse only through D = rowsum(dout * out) and P = exp(S - lse), so handing it the
        # merged ones gives this block's share of the gradients (module docstring).
        return attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window,
            deterministic=self.deterministic,
            schedule=self.schedule,
            sm_margin=self.sm_margin,
        )

    def backward_varlen(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        offsets_q: Sequence[int],
        offsets_k: Sequence[int],
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor, Tensor]:
        # One varlen launch for the call. The varlen kernels give the key rows of a sequence without queries zero
        # gradients, as the per-sequence path does: each of its key/value tiles is a job with no query step, whose
        # cleared accumulators are stored (make_varlen_job in src/schedule/varlen.hpp, the job loop and epilogue in
        # src/kernels/sm90/bwd_job_loop.cuh; tests/kernels/test_sm90_varlen.cpp's (0, 50) sequences on poisoned
        # gradients). The maxima count those sequences too, or their keys would be past max_seqlen_k, which the
        # kernels answer with NaN and a fault.
        cu_seqlens_q, cu_seqlens_k, _ = _device_offsets(offsets_q, offsets_k, q.device)
        return attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse,
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window,
            deterministic=self.deterministic,
            schedule=self.schedule,
            sm_margin=self.sm_margin,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=_longest(offsets_q),
            max_seqlen_k=_longest(offsets_k),
        )

    def forward_varlen(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        offsets_q: Sequence[int],
        offsets_k: Sequence[int],
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor]:
        cu_seqlens_q, cu_seqlens_k, same = _device_offsets(offsets_q, offsets_k, q.device)
        # The maxima over every sequence, those without queries included (_longest): the kernels refuse, with NaN and
        # a fault, a sequence longer than its maximum.
        return forward_partial(
            q,
            k,
            v,
            softmax_scale,
            causal,
            *window,
            self.sm_margin,
            cu_seqlens_q,
            cu_seqlens_k,
            _longest(offsets_q),
            _longest(offsets_k),
            same,
        )


class TorchLocalAttention(_PerSequenceBackward):
    """Attention in plain torch ops, materializing the scores: the reference local kernel. It computes in
    accumulator_dtype(q.dtype) and works on any device and dtype, so the context-parallel logic can be tested on
    the CPU with gloo. On one device with fixed thread counts its results are bitwise reproducible."""

    deterministic = True

    @staticmethod
    def _probabilities_inputs(
        q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float, window: Window
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """q, k and v in the accumulator dtype with k and v repeated to q's heads, and the masked, scaled scores
        (batch, heads_q, seqlen_q, seqlen_k)."""
        dtype = accumulator_dtype(q.dtype)
        group = q.shape[2] // k.shape[2]
        qf = q.to(dtype)
        kf = k.to(dtype).repeat_interleave(group, dim=2)
        vf = v.to(dtype).repeat_interleave(group, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * softmax_scale
        left, right = window
        if causal:
            right = 0
        if (left, right) != NO_WINDOW:
            seqlen_q, seqlen_k = q.shape[1], k.shape[1]
            # Key j relative to query row i's bottom-right aligned diagonal i + seqlen_k - seqlen_q.
            relative = (
                torch.arange(seqlen_k, device=q.device)[None, :]
                - torch.arange(seqlen_q, device=q.device)[:, None]
                - (seqlen_k - seqlen_q)
            )
            hidden = torch.zeros_like(relative, dtype=torch.bool)
            if right >= 0:
                hidden |= relative > right
            if left >= 0:
                hidden |= relative < -left
            scores = scores.masked_fill(hidden, float("-inf"))
        return qf, kf, vf, scores

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float, window: Window = NO_WINDOW
    ) -> tuple[Tensor, Tensor]:
        _, _, vf, scores = self._probabilities_inputs(q, k, v, causal, softmax_scale, window)
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", torch.exp(scores - lse[..., None]), vf)
        return out.to(q.dtype), lse

    @staticmethod
    def _sum_groups(per_query_head: Tensor, heads_kv: int) -> Tensor:
        """(batch, seqlen, heads_q, head_dim) gradients of repeated key/value heads summed over each GQA group."""
        batch, seqlen, heads_q, head_dim = per_query_head.shape
        return per_query_head.view(batch, seqlen, heads_kv, heads_q // heads_kv, head_dim).sum(dim=3)

    def backward(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor, Tensor]:
        qf, kf, vf, scores = self._probabilities_inputs(q, k, v, causal, softmax_scale, window)
        dtype = qf.dtype
        dout_f = dout.to(dtype)
        probabilities = torch.exp(scores - lse.to(dtype)[..., None])
        row_dot = (dout_f * out.to(dtype)).sum(dim=-1).transpose(1, 2)  # (batch, heads_q, seqlen_q)
        dprobabilities = torch.einsum("bqhd,bkhd->bhqk", dout_f, vf)
        dscores = probabilities * (dprobabilities - row_dot[..., None])
        dq = torch.einsum("bhqk,bkhd->bqhd", dscores, kf) * softmax_scale
        dk = torch.einsum("bhqk,bqhd->bkhd", dscores, qf) * softmax_scale
        dv = torch.einsum("bhqk,bqhd->bkhd", probabilities, dout_f)
        heads_kv = k.shape[2]
        return (
            dq.to(q.dtype),
            self._sum_groups(dk, heads_kv).to(k.dtype),
            self._sum_groups(dv, heads_kv).to(v.dtype),
        )

    def forward_varlen(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        offsets_q: Sequence[int],
        offsets_k: Sequence[int],
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor]:
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=accumulator_dtype(q.dtype), device=q.device)
        for rows_q, rows_k in _sequences(offsets_q, offsets_k):
            out_b, lse_b = self.forward(
                q[None, rows_q], k[None, rows_k], v[None, rows_k], causal, softmax_scale, window
            )
            out[rows_q], lse[:, rows_q] = out_b[0], lse_b[0]
        return out, lse


def _refuse_window(window: Window) -> None:
    if window != NO_WINDOW:
        raise NotImplementedError(f"FlashAttention3LocalAttention takes no window_size, got {window}")


class FlashAttention3LocalAttention:
    """FlashAttention-3's kernels as the local kernel (flash_attn_interface, from Dao-AILab/flash-attention's
    hopper/ directory, built from source): its forward returns the LSE the contract asks for
    ((batch, heads_q, seqlen_q), fp32, natural log), and its backward takes the caller's out and LSE, so the
    same ring and all-to-all run on FA3 for comparison. deterministic selects FA3's deterministic backward;
    sm_margin is FA3's, which leaves SMs free as DASH's does. FA3 takes GQA natively.

    It takes neither sliding windows nor packed batches: context_parallel_attn_func refuses both with it before
    any communication. Its partial outputs come rounded to q's dtype (FA3 returns no fp32 out), so the merge adds a
    rounding per block that DashLocalAttention's fp32 partials do not.

    interface: the flash_attn_interface module, imported here when not given (the tests pass a stand-in)."""

    def __init__(self, deterministic: bool = True, sm_margin: int = 0, interface: object | None = None) -> None:
        if interface is None:
            try:
                import flash_attn_interface as interface
            except ImportError as error:
                raise ImportError(
                    "FlashAttention3LocalAttention needs FlashAttention-3's flash_attn_interface (its hopper/ "
                    f"directory on the Python path): {error}"
                ) from error
        self.interface = interface
        self.deterministic = bool(deterministic)
        self.sm_margin = check_sm_margin(sm_margin)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float, window: Window = NO_WINDOW
    ) -> tuple[Tensor, Tensor]:
        _refuse_window(window)
        out, lse, *_ = self.interface._flash_attn_forward(
            q, k, v, softmax_scale=softmax_scale, causal=causal, sm_margin=self.sm_margin
        )
        return out, lse

    def backward(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        causal: bool,
        softmax_scale: float,
        window: Window = NO_WINDOW,
    ) -> tuple[Tensor, Tensor, Tensor]:
        _refuse_window(window)
        # FA3 writes the gradients into buffers the caller gives, packed like its inputs.
        dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
        self.interface._flash_attn_backward(
            dout,
            q,
            k,
            v,
            out,
            lse,
            dq=dq,
            dk=dk,
            dv=dv,
            softmax_scale=softmax_scale,
            is_causal=causal,
            deterministic=self.deterministic,
            sm_margin=self.sm_margin,
        )
        return dq, dk, dv
