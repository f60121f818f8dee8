"""flash_attn_varlen_func: attention on packed variable-length batches (FlashAttention's varlen), differentiable in
q, k and v, and its custom ops torch.ops.dash_attn.varlen_forward and varlen_backward.

Layout: q is (total_q, heads_q, head_dim), k and v (total_k, heads_kv, head_dim); sequence b's queries are rows
cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q, its keys rows cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v. Each
sequence attends only to itself, under its own mask (causal and the window bottom-right aligned per sequence, as
in FlashAttention). The LSE is (heads_q, total_q) fp32.

Invariants:
- cu_seqlens stay on the device: nothing here reads them on the host, so a call is CUDA-graph capturable. The plan
  is made from (sequences, max_seqlen_q, max_seqlen_k, heads, ...) and the kernels fit each sequence's lengths.
  Their contract (unchecked, it would take a copy): int32, starting at 0, non-decreasing, lengths within the
  maxima, last offsets within the row counts. Offsets that break it give the sequences concerned unspecified
  values but never a hang or an access outside the tensors (the kernels clamp each sequence to the bounds).
- Passing the same tensor as cu_seqlens_q and cu_seqlens_k (self-attention) promises seqlen_k <= seqlen_q per
  sequence, under which the backward may run shift and symmetric shift (schedule="auto" picks them); otherwise
  those two schedules are refused by name.
- Rows after the last sequence (cu_seqlens_q[-1] <= row < total_q) come out as out = 0, lse = -inf and zero
  gradients: the library clears them after its kernels (only those rows, on the device), so the outputs are
  allocated uncleared; a batch without query or key rows needs no kernel, and its outputs are cleared here.
- Every check runs before any CUDA call and names the argument; the C library repeats the ones it needs. softcap
  with varlen is refused by the library build (its varlen kernels are built without softcap) with a message
  naming softcap.
"""

from __future__ import annotations

import functools
import numbers

import torch
from torch import Tensor

from . import _library, _ops, _plans
from ._arguments import (
    _check_determinism_switch,
    check_flags,
    check_is_tensor,
    check_sm_margin,
    resolve_scale,
    resolve_schedule,
    resolve_softcap,
    resolve_window,
)
from ._library import HEAD_DIMS

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)

# The longest sequence the kernels take (kMaxSeqlen, src/api/limits.hpp).
MAX_SEQLEN = 1 << 20

_ENTRY = "dash_attn.flash_attn_varlen_func"


def _check_packed(tensors: tuple[object, object, object]) -> None:
    """q, k, v as packed (total, heads, head_dim) tensors: TypeError or ValueError naming the argument."""
    for t, name in zip(tensors, ("q", "k", "v")):
        check_is_tensor(t, name)
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total_tokens, heads, head_dim), got shape {tuple(t.shape)}")
    q, k, v = tensors
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q.dtype must be torch.bfloat16 or torch.float16, got {q.dtype}")
    for t, name in ((k, "k"), (v, "v")):
        if t.dtype is not q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must equal q.dtype ({q.dtype})")
    head_dim = q.shape[2]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim (q.shape[2]) must be one of {HEAD_DIMS}, got {head_dim}")
    for t, name in ((k, "k"), (v, "v")):
        if t.shape[2] != head_dim:
            raise ValueError(f"{name}.shape[2] (head_dim) = {t.shape[2]} must equal q.shape[2] = {head_dim}")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v.shape[:2] {tuple(v.shape[:2])} (total_k, heads) must equal k.shape[:2] "
                         f"{tuple(k.shape[:2])}")
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"q and k must have at least one head, got q.shape {tuple(q.shape)}, k.shape {tuple(k.shape)}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q.shape[1] (query heads) = {q.shape[1]} must be a multiple of k.shape[1] (key/value "
                         f"heads) = {k.shape[1]}: each key/value head serves a whole group of query heads")


def _check_cu_seqlens(cu_seqlens_q: object, cu_seqlens_k: object) -> int:
    """The number of sequences, after checking both offset tensors: int32, 1-D, the same length of at least 2."""
    for t, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        check_is_tensor(t, name)
        if t.dtype != torch.int32:
            raise TypeError(f"{name}.dtype must be torch.int32 (FlashAttention's cu_seqlens), got {t.dtype}")
        if t.dim() != 1 or t.numel() < 2:
            raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 offsets (0, then each sequence's end), got "
                             f"shape {tuple(t.shape)}")
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(f"cu_seqlens_k has {cu_seqlens_k.numel()} offsets but cu_seqlens_q {cu_seqlens_q.numel()}: "
                         f"both must hold batch + 1")
    return cu_seqlens_q.numel() - 1


def _check_max_seqlen(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= value <= MAX_SEQLEN:
        raise ValueError(f"{name} must satisfy 1 <= {name} <= {MAX_SEQLEN} (the longest sequence of the batch; the "
                         f"plan is made for it), got {value}")
    return int(value)


def _check_devices(tensors: tuple[Tensor, ...], names: tuple[str, ...]) -> None:
    """All on q's CUDA device; runs after every other check, so those work with CPU tensors without a GPU."""
    q = tensors[0]
    for t, name in zip(tensors[1:], names[1:]):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all must be on one device")
    if q.device.type != "cuda":
        raise ValueError(f"q, k, v, cu_seqlens_q and cu_seqlens_k must be CUDA tensors, got device {q.device}")


def _same_offsets(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor) -> bool:
    """Whether both offset tensors are one (the promise seqlen_k <= seqlen_q per sequence holds): the same object,
    or views of the same memory, which needs no copy from the device."""
    if cu_seqlens_k is cu_seqlens_q:
        return True
    if _ops._traced(cu_seqlens_q, cu_seqlens_k):
        return False
    return (cu_seqlens_q.data_ptr() == cu_seqlens_k.data_ptr() and cu_seqlens_q.stride() == cu_seqlens_k.stride()
            and cu_seqlens_q.numel() == cu_seqlens_k.numel())


def _c_shape(q: Tensor, k: Tensor, batch: int, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
             causal: bool, window_left: int, window_right: int, softcap: float) -> _library.Shape:
    """The maximum problem's C shape: batch = sequences, seqlen_q and seqlen_k = the maxima."""
    return _ops._make_c_shape((batch, max_seqlen_q, q.shape[1], q.shape[2]), (batch, max_seqlen_k, k.shape[1],
                              k.shape[2]), q.dtype, softmax_scale, causal, window_left, window_right, softcap)


def _packed_c_tensor(t: Tensor) -> _library.Tensor:
    """A packed (total, heads, head_dim) tensor as a dash_tensor: no batch dimension (stride 0)."""
    return _ops._c_tensor_at(t.data_ptr(), (0, *t.stride()))


def _c_varlen(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, total_q: int, total_k: int,
              keys_within_queries: bool) -> _library.Varlen:
    return _library.Varlen(cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), total_q, total_k,
                           int(keys_within_queries))


def _forward_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    """out (total_q, heads_q, head_dim) and lse (heads_q, total_q) fp32, uncleared: the library writes every row."""
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    return torch.empty_like(q, memory_format=torch.contiguous_format), lse


def _empty_batch(q: Tensor, k: Tensor) -> bool:
    """No query or key rows: nothing for a kernel to do (the library refuses empty packed tensors)."""
    return q.shape[0] == 0 or k.shape[0] == 0


@functools.lru_cache(maxsize=_ops._CALL_CACHE_CAPACITY)
def _forward_workspace_bytes(library: object, shape_fields: tuple) -> int:
    """The forward's workspace for a shape, asked of the loaded `library` once per shape (part of the key, so a
    library loaded anew is asked again); a shape the library refuses raises, and nothing is cached."""
    return _library.forward_workspace_size(_library.Shape(*shape_fields))


@torch.library.custom_op("dash_attn::varlen_forward", mutates_args=(), device_types="cuda")
def varlen_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int,
    window_left: int,
    window_right: int,
    softcap: float,
    keys_within_queries: bool,
) -> tuple[Tensor, Tensor]:
    """out, lse of a packed varlen batch. `schedule` is not used here: autograd hands it to the backward."""
    out, lse = _forward_outputs(q)
    if _empty_batch(q, k):  # no kernel runs: rows that see no key
        return out.zero_(), lse.fill_(float("-inf"))
    q, k, v = (_ops._kernel_ready(t) for t in (q, k, v))
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    batch = cu_seqlens_q.numel() - 1
    shape = _c_shape(q, k, batch, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                     softcap)
    workspace_bytes = _forward_workspace_bytes(_library.load(), _plans.shape_fields(shape))
    index = q.get_device()
    workspace = _ops._workspace(workspace_bytes, q.device)
    varlen = _c_varlen(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], keys_within_queries)

    def launch() -> None:
        _library.forward_varlen(shape, varlen, _packed_c_tensor(q), _packed_c_tensor(k), _packed_c_tensor(v),
                                _packed_c_tensor(out), lse.data_ptr(), workspace.data_ptr(), workspace_bytes,
                                torch._C._cuda_getCurrentRawStream(index), sm_margin)

    _ops._on_device(index, launch)
    return out, lse


@varlen_forward.register_fake
def _varlen_forward_fake(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, schedule: str,
                         sm_margin: int, window_left: int, window_right: int, softcap: float,
                         keys_within_queries: bool) -> tuple[Tensor, Tensor]:
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(
        (q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("dash_attn::varlen_backward", mutates_args=(), device_types="cuda")
def varlen_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int,
    window_left: int,
    window_right: int,
    softcap: float,
    keys_within_queries: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of a packed varlen batch, dQ summed in the order `schedule` fixes (its plan is the maximum
    problem's, made once per shape and promise); zero in rows no sequence holds (the library clears them)."""
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    if _empty_batch(q, k):  # no kernel runs: no query sees a key
        return dq.zero_(), dk.zero_(), dv.zero_()
    dout, q, k, v, out = (_ops._kernel_ready(t) for t in (dout, q, k, v, out))
    lse = lse.contiguous()
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    batch = cu_seqlens_q.numel() - 1
    shape = _c_shape(q, k, batch, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                     softcap)
    index = q.get_device()
    varlen = _c_varlen(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], keys_within_queries)

    def launch() -> None:
        key = _plans.varlen_plan_key(index, shape, schedule, sm_margin, keys_within_queries, q.shape[0], k.shape[0])
        plan = _plans.varlen_backward_plans.get(key)
        workspace = _ops._workspace(plan.workspace_bytes, q.device)
        plan.backward_varlen(shape, varlen, _packed_c_tensor(q), _packed_c_tensor(k), _packed_c_tensor(v),
                             _packed_c_tensor(out), _packed_c_tensor(dout), lse.data_ptr(), _packed_c_tensor(dq),
                             _packed_c_tensor(dk), _packed_c_tensor(dv), workspace.data_ptr(), plan.workspace_bytes,
                             torch._C._cuda_getCurrentRawStream(index))

    _ops._on_device(index, launch)
    return dq, dk, dv


@varlen_backward.register_fake
def _varlen_backward_fake(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                          cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                          softmax_scale: float, causal: bool, schedule: str, sm_margin: int, window_left: int,
                          window_right: int, softcap: float,
                          keys_within_queries: bool) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.arguments = inputs[5:]
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _gradients(ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None,
               grad_lse: Tensor | None) -> tuple[Tensor | None, ...]:
    """dq, dk, dv; none for the offsets and the other arguments."""
    none = (None,) * 12
    if grad_out is None:
        return (None, None, None, *none)
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = torch.ops.dash_attn.varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                                     *ctx.arguments)
    return (dq, dk, dv, *none)


varlen_forward.register_autograd(_gradients, setup_context=_setup_context)


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = True,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention on a packed variable-length batch (FlashAttention's varlen), differentiable in q, k and v.

    q is (total_q, heads_q, head_dim), k and v (total_k, heads_kv, head_dim) (GQA/MQA: fewer key/value heads);
    cu_seqlens_q and cu_seqlens_k are int32 CUDA tensors of batch + 1 offsets: sequence b's queries are rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q, its keys those of cu_seqlens_k in k and v. max_seqlen_q and max_seqlen_k
    bound every sequence's lengths (1 <= max <= 2^20); the backward's plan is made from them, never from the
    offsets, which stay on the device (no copy per call; CUDA-graph capturable). Lengths 0 are allowed.

    causal, window_size and softcap mean what they mean in flash_attn_func, per sequence: with causal=True query row
    i of a sequence sees its key j iff j <= i + seqlen_k - seqlen_q (bottom-right aligned). A query row that sees no
    key gets out = 0 and lse = -inf. softcap > 0 is refused by the library (no varlen softcap kernels are built).

    Passing one tensor as both cu_seqlens_q and cu_seqlens_k (self-attention) promises seqlen_k <= seqlen_q per
    sequence, which lets schedule="auto" pick the shift schedules; schedule="shift" or "symmetric-shift" without it
    is refused, naming the rule. deterministic and schedule are flash_attn_func's: every schedule but
    "nondeterministic" (deterministic=False) gives bitwise identical gradients from run to run.

    Returns out (total_q, heads_q, head_dim), and with return_lse=True (out, lse) where lse is fp32
    (heads_q, total_q), natural-log, without gradient. Rows after cu_seqlens_q[-1] come out 0 (lse -inf) and get
    zero gradients.
    """
    check_flags(causal=causal, deterministic=deterministic, return_lse=return_lse)
    left, right = resolve_window(window_size)
    cap = resolve_softcap(softcap)
    _check_packed((q, k, v))
    _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    max_q = _check_max_seqlen(max_seqlen_q, "max_seqlen_q")
    max_k = _check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    scale = resolve_scale(softmax_scale, q.shape[2], "softmax_scale")
    resolved = resolve_schedule(schedule, deterministic)
    margin = check_sm_margin(sm_margin)
    _check_determinism_switch(resolved, (q, k, v), _ENTRY)
    _check_devices((q, k, v, cu_seqlens_q, cu_seqlens_k), ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
    promise = _same_offsets(cu_seqlens_q, cu_seqlens_k)
    out, lse = torch.ops.dash_attn.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale, causal,
                                                  resolved, margin, left, right, cap, promise)
    return (out, lse) if return_lse else out


__all__ = ["flash_attn_varlen_func"]
