"""flash_attn_varlen_func: attention on packed variable-length batches (FlashAttention's varlen), differentiable in
q, k and v, with its packed variants flash_attn_varlen_kvpacked_func and flash_attn_varlen_qkvpacked_func (all three
in FlashAttention-2's argument order; dash_attn.fa3 has FA3's), and its custom ops torch.ops.dash_attn.varlen_forward
and varlen_backward.

The two paths of _ops.py, for the same reason: where torch traces (_ops._traced) a call is the custom ops, which
torch.compile records as one node each; in plain eager mode it runs the ops' bodies directly, under
_EagerVarlenAttention when autograd records it, since the custom-op dispatch and its generated autograd cost more
host time than a short batch's kernels. Both run the same bodies (the same kernels, plans and bits) and share the
autograd context and formula. The bodies work from call descriptors (_VarlenForwardCall, _VarlenBackwardCall), as
_ops's do: each signature (the tensors' shapes and strides, dtype, scale, mask, sequences, maxima, and for the
backward the device, schedule, margin and promise) is worked out once into its C shape, workspace size or plan key,
in-place verdict and C structs, held in bounded LRU caches; a later call writes its data pointers and offsets into
the structs and launches.

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
  sequence, under which the backward may run shift and symmetric shift (schedule="auto" may pick shift under the full
  mask; symmetric shift is refused at head_dim 192 and 256, as for dense batches); otherwise those two schedules are
  refused by name.
- Rows after the last sequence (cu_seqlens_q[-1] <= row < total_q) come out as out = 0, lse = -inf and zero
  gradients: the library clears them after its kernels (only those rows, on the device), so the outputs are
  allocated uncleared; a batch without query or key rows needs no kernel, and its outputs are cleared here.
- Every check runs before any CUDA call and names the argument; the C library repeats the ones it needs. A build
  without the varlen kernels of the call's head dim, dtype and softcap variant refuses it by name.
- FA2's options DASH does not implement (dropout_p, alibi_slopes, block_table) are accepted at their no-op values
  only; any other value raises NotImplementedError naming the argument, never ignored.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable

import torch
from torch import Tensor

from . import _library, _ops, _plans
from ._arguments import (
    _check_determinism_switch,
    check_is_tensor,
    check_sm_margin,
    refuse_unsupported,
    resolve_scale,
    resolve_schedule,
)
from ._library import HEAD_DIMS
from .fa2 import _check_fa2_flags, _fa2_options, _fa2_result

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)

# The longest sequence the kernels take (kMaxSeqlen, src/api/limits.hpp).
MAX_SEQLEN = 1 << 20

_ENTRY = "dash_attn.flash_attn_varlen_func"


def _check_packed(tensors: tuple[object, object, object]) -> None:
    """q, k, v as packed (total, heads, head_dim) tensors: TypeError or ValueError naming the argument."""
    q, k, v = tensors
    # The common case in one test (the named checks below cost four times as much): three 3-D tensors of one
    # supported dtype, k and v of one shape, a built head dim shared by all, whole groups of query heads per
    # key/value head.
    if isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor):
        q_shape, k_shape = q.shape, k.shape
        if (
            len(q_shape) == 3
            and k_shape == v.shape
            and len(k_shape) == 3
            and q.dtype in SUPPORTED_DTYPES
            and k.dtype is q.dtype
            and v.dtype is q.dtype
            and q_shape[2] == k_shape[2]
            and q_shape[2] in HEAD_DIMS
            and q_shape[1] > 0
            and k_shape[1] > 0
            and q_shape[1] % k_shape[1] == 0
        ):
            return
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
        raise ValueError(
            f"v.shape[:2] {tuple(v.shape[:2])} (total_k, heads) must equal k.shape[:2] {tuple(k.shape[:2])}"
        )
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"q and k must have at least one head, got q.shape {tuple(q.shape)}, k.shape {tuple(k.shape)}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"q.shape[1] (query heads) = {q.shape[1]} must be a multiple of k.shape[1] (key/value "
            f"heads) = {k.shape[1]}: each key/value head serves a whole group of query heads"
        )


def _check_cu_seqlens(cu_seqlens_q: object, cu_seqlens_k: object) -> int:
    """The number of sequences, after checking both offset tensors: int32, 1-D, the same length of at least 2."""
    if isinstance(cu_seqlens_q, Tensor) and isinstance(cu_seqlens_k, Tensor):  # the common case in one test
        offsets = cu_seqlens_q.shape
        if (
            cu_seqlens_q.dtype is torch.int32
            and cu_seqlens_k.dtype is torch.int32
            and len(offsets) == 1
            and offsets[0] >= 2
            and cu_seqlens_k.shape == offsets
        ):
            return offsets[0] - 1
    for t, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        check_is_tensor(t, name)
        if t.dtype != torch.int32:
            raise TypeError(f"{name}.dtype must be torch.int32 (FlashAttention's cu_seqlens), got {t.dtype}")
        if t.dim() != 1 or t.numel() < 2:
            raise ValueError(
                f"{name} must be 1-D with batch + 1 >= 2 offsets (0, then each sequence's end), got "
                f"shape {tuple(t.shape)}"
            )
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(
            f"cu_seqlens_k has {cu_seqlens_k.numel()} offsets but cu_seqlens_q {cu_seqlens_q.numel()}: "
            f"both must hold batch + 1"
        )
    return cu_seqlens_q.numel() - 1


def _check_max_seqlen(value: object, name: str) -> int:
    if type(value) is int and 1 <= value <= MAX_SEQLEN:  # the common case in one test
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= value <= MAX_SEQLEN:
        raise ValueError(
            f"{name} must satisfy 1 <= {name} <= {MAX_SEQLEN} (the longest sequence of the batch; the "
            f"plan is made for it), got {value}"
        )
    return int(value)


def _check_devices(tensors: tuple[Tensor, ...], names: tuple[str, ...]) -> None:
    """All on q's CUDA device; runs after every other check, so those work with CPU tensors without a GPU."""
    q = tensors[0]
    # CUDA tensors of one device index pass without a torch.device built per tensor.
    if q.is_cuda:
        index = q.get_device()
        for t in tensors:
            if not t.is_cuda or t.get_device() != index:
                break
        else:
            return
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
    return (
        cu_seqlens_q.data_ptr() == cu_seqlens_k.data_ptr()
        and cu_seqlens_q.stride() == cu_seqlens_k.stride()
        and cu_seqlens_q.numel() == cu_seqlens_k.numel()
    )


# What decides a varlen call's maximum problem besides its tensors: dtype, softmax_scale, causal, window_left,
# window_right, softcap, the sequences and the maxima (max_seqlen_q, max_seqlen_k).
_Problem = tuple[torch.dtype, float, bool, int, int, float, int, int, int]

# A tensor's (shape, strides), as a descriptor's key holds it.
_Layout = tuple[torch.Size, tuple[int, ...]]


def _max_problem(problem: _Problem, q_shape: torch.Size, k_shape: torch.Size) -> _library.Shape:
    """The maximum problem's C shape: batch = sequences, seqlen_q and seqlen_k = the maxima."""
    dtype, softmax_scale, causal, window_left, window_right, softcap, batch, max_seqlen_q, max_seqlen_k = problem
    return _ops._make_c_shape(
        (batch, max_seqlen_q, q_shape[1], q_shape[2]),
        (batch, max_seqlen_k, k_shape[1], k_shape[2]),
        dtype,
        softmax_scale,
        causal,
        window_left,
        window_right,
        softcap,
    )


class _VarlenForwardCall:
    """What every varlen forward of one signature (the loaded library, the problem and q's, k's and v's layouts)
    shares, as _ops._ForwardCall for fixed-length batches: the maximum problem's C shape, the workspace size,
    whether the kernels read q, k and v in place (their strides; each call checks its pointers), whether q is
    packed, and the structs of q, k, v and out (no batch dimension) with the dash_varlen struct, which a call takes
    with them."""

    __slots__ = ("in_place", "q_packed", "shape", "structs", "varlen", "workspace_bytes")

    def __init__(self, library: object, problem: _Problem, layouts: tuple[_Layout, _Layout, _Layout]) -> None:
        # `library`, the loaded library, is only part of the key: forward_workspace_size asks it.
        (q_shape, q_strides), (k_shape, _), _ = layouts
        self.shape = _max_problem(problem, q_shape, k_shape)
        # The library validates the shape here, so a refused one raises before anything is cached.
        self.workspace_bytes = _library.forward_workspace_size(self.shape)
        self.in_place = all(_ops._strides_ok(shape, strides) for shape, strides in layouts)
        out_strides = _ops._packed_strides(q_shape)
        self.q_packed = q_strides == out_strides
        c_order = (q_strides, layouts[1][1], layouts[2][1], out_strides)
        self.structs = _ops._TensorStructs(tuple((0, *strides) for strides in c_order))
        self.varlen = _library.Varlen(0, 0, q_shape[0], k_shape[0], 0)


class _VarlenBackwardCall:
    """What every varlen backward of one signature (the device, the problem, schedule, margin and promise, and
    dout's, q's, k's, v's and out's layouts) shares, as _ops._BackwardCall: the maximum problem's C shape, its plan's
    key in _plans.backward_plans, whether the kernels read dout, q, k, v and out in place, whether q, k and v
    are packed, the structs of q, k, v, out, dout, dq, dk and dv in the C call's order, and the dash_varlen
    struct."""

    __slots__ = ("in_place", "inputs_packed", "plan_key", "shape", "structs", "varlen")

    def __init__(
        self,
        device: int,
        problem: _Problem,
        schedule: str,
        sm_margin: int,
        keys_within_queries: bool,
        layouts: tuple[_Layout, _Layout, _Layout, _Layout, _Layout],
    ) -> None:
        dout_layout, (q_shape, q_strides), (k_shape, k_strides), (v_shape, v_strides), out_layout = layouts
        self.shape = _max_problem(problem, q_shape, k_shape)
        # auto's hint (lengths_fill_maxima) comes from the packed row counts, which the signature holds.
        self.varlen = _library.Varlen(0, 0, q_shape[0], k_shape[0], int(keys_within_queries))
        fields = _plans.shape_fields(self.shape)
        self.plan_key = _plans.plan_key(
            device, fields, schedule, sm_margin, _plans.varlen_batch(self.shape, self.varlen)
        )
        self.in_place = all(_ops._strides_ok(shape, strides) for shape, strides in layouts)
        gradient_strides = tuple(_ops._packed_strides(shape) for shape in (q_shape, k_shape, v_shape))
        self.inputs_packed = (q_strides, k_strides, v_strides) == gradient_strides
        c_order = (q_strides, k_strides, v_strides, out_layout[1], dout_layout[1], *gradient_strides)
        self.structs = _ops._TensorStructs(tuple((0, *strides) for strides in c_order))


# The loaded library is part of the forward's key (its first argument), so a library loaded anew is asked again.
_cached_forward_call = functools.lru_cache(maxsize=_ops._CALL_CACHE_CAPACITY)(_VarlenForwardCall)
_cached_backward_call = functools.lru_cache(maxsize=_ops._CALL_CACHE_CAPACITY)(_VarlenBackwardCall)


def _cacheable(softmax_scale: float, softcap: float) -> bool:
    """Whether a call's values can be keys: a scale that is not positive or a softcap that is not a finite number
    >= 0 never is (0.0 == -0.0 and nan != nan; the library must see the value passed and refuses it)."""
    return softmax_scale > 0 and softcap >= 0 and softcap != float("inf")


def _forward_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    batch: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
) -> _VarlenForwardCall:
    make = _cached_forward_call if _cacheable(softmax_scale, softcap) else _VarlenForwardCall
    problem = (q.dtype, softmax_scale, causal, window_left, window_right, softcap, batch, max_seqlen_q, max_seqlen_k)
    return make(_library.load(), problem, ((q.shape, q.stride()), (k.shape, k.stride()), (v.shape, v.stride())))


def _backward_call(
    device: int,
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    batch: int,
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
) -> _VarlenBackwardCall:
    make = _cached_backward_call if _cacheable(softmax_scale, softcap) else _VarlenBackwardCall
    problem = (q.dtype, softmax_scale, causal, window_left, window_right, softcap, batch, max_seqlen_q, max_seqlen_k)
    layouts = (
        (dout.shape, dout.stride()),
        (q.shape, q.stride()),
        (k.shape, k.stride()),
        (v.shape, v.stride()),
        (out.shape, out.stride()),
    )
    return make(device, problem, schedule, sm_margin, keys_within_queries, layouts)


def _empty_batch(q: Tensor, k: Tensor) -> bool:
    """No query or key rows: nothing for a kernel to do (the library refuses empty packed tensors)."""
    return q.shape[0] == 0 or k.shape[0] == 0


def _fresh_varlen(shared: _library.Varlen) -> _library.Varlen:
    """A dash_varlen struct of a descriptor's totals and promise, for a call that could not take the shared one (as
    _ops._TensorStructs.fresh for the tensor structs); the call writes its offsets into it."""
    return _library.Varlen(0, 0, shared.total_q, shared.total_k, shared.keys_within_queries)


def _launch_forward(
    index: int,
    call: _VarlenForwardCall,
    pointers: tuple[int, int, int],
    offsets: tuple[int, int],
    out: Tensor,
    lse: Tensor,
    sm_margin: int,
    keys_within_queries: bool,
) -> None:
    workspace = _ops._workspace(call.workspace_bytes, out.device)
    structs = call.structs
    taken = structs.take()  # the varlen struct goes with the tensor structs
    try:
        q_c, k_c, v_c, out_c = structs.shared if taken else structs.fresh()
        varlen = call.varlen if taken else _fresh_varlen(call.varlen)
        q_c.data, k_c.data, v_c.data = pointers
        out_c.data = out.data_ptr()
        varlen.cu_seqlens_q, varlen.cu_seqlens_k = offsets
        varlen.keys_within_queries = keys_within_queries
        _library.forward(
            call.shape,
            q_c,
            k_c,
            v_c,
            out_c,
            lse.data_ptr(),
            workspace.data_ptr(),
            call.workspace_bytes,
            torch._C._cuda_getCurrentRawStream(index),
            sm_margin,
            varlen,
        )
    finally:
        if taken:
            structs.give_back()


def _forward_body(
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
    """What the forward op runs, and the eager path too: out (total_q, heads_q, head_dim) and lse (heads_q, total_q)
    fp32, allocated uncleared (the library writes every row). `schedule` is not used here: autograd hands it to the
    backward."""
    if _empty_batch(q, k):  # no kernel runs: rows that see no key
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
        return out.zero_(), lse.fill_(float("-inf"))
    batch = cu_seqlens_q.shape[0] - 1
    mask = (causal, window_left, window_right, softcap)
    call = _forward_call(q, k, v, batch, max_seqlen_q, max_seqlen_k, softmax_scale, *mask)
    pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    aligned = (pointers[0] | pointers[1] | pointers[2]) % _ops._TMA_ALIGNMENT_BYTES == 0
    if not (call.in_place and aligned):
        q, k, v = _ops._kernel_ready(q), _ops._kernel_ready(k), _ops._kernel_ready(v)
        call = _forward_call(q, k, v, batch, max_seqlen_q, max_seqlen_k, softmax_scale, *mask)
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    out = _ops._packed_like(q, call.q_packed)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    index = q.get_device()
    _ops._on_device(
        index,
        _launch_forward,
        index,
        call,
        pointers,
        (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()),
        out,
        lse,
        sm_margin,
        keys_within_queries,
    )
    return out, lse


def _launch_backward(
    index: int,
    call: _VarlenBackwardCall,
    pointers: tuple[int, int, int, int, int],
    offsets: tuple[int, int],
    lse: Tensor,
    gradients: tuple[Tensor, Tensor, Tensor],
) -> None:
    # Planned and proven once per (device, maximum problem, schedule, margin, promise).
    plan = _plans.backward_plans.get(call.plan_key, call.varlen)
    workspace = _ops._workspace(plan.workspace_bytes, lse.device)
    dq, dk, dv = gradients
    structs = call.structs
    taken = structs.take()  # the varlen struct goes with the tensor structs
    try:
        q_c, k_c, v_c, out_c, dout_c, dq_c, dk_c, dv_c = structs.shared if taken else structs.fresh()
        varlen = call.varlen if taken else _fresh_varlen(call.varlen)
        dout_c.data, q_c.data, k_c.data, v_c.data, out_c.data = pointers
        dq_c.data, dk_c.data, dv_c.data = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        varlen.cu_seqlens_q, varlen.cu_seqlens_k = offsets
        plan.backward(
            call.shape,
            q_c,
            k_c,
            v_c,
            out_c,
            dout_c,
            lse.data_ptr(),
            dq_c,
            dk_c,
            dv_c,
            workspace.data_ptr(),
            plan.workspace_bytes,
            torch._C._cuda_getCurrentRawStream(index),
            varlen,
        )
    finally:
        if taken:
            structs.give_back()


def _backward_body(
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
    """What the backward op runs, and the eager path too: dq, dk, dv, zero in rows no sequence holds (the library
    clears them), dQ summed in the order `schedule` fixes."""
    if _empty_batch(q, k):  # no kernel runs: no query sees a key
        return tuple(torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    index = q.get_device()
    batch = cu_seqlens_q.shape[0] - 1
    signature = (
        batch,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        schedule,
        sm_margin,
        window_left,
        window_right,
        softcap,
        keys_within_queries,
    )
    call = _backward_call(index, dout, q, k, v, out, *signature)
    pointers = (dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    aligned = (pointers[0] | pointers[1] | pointers[2] | pointers[3] | pointers[4]) % _ops._TMA_ALIGNMENT_BYTES == 0
    if not (call.in_place and aligned):
        dout, q, k, v, out = (_ops._kernel_ready(t) for t in (dout, q, k, v, out))
        call = _backward_call(index, dout, q, k, v, out, *signature)
        pointers = (dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    lse = lse.contiguous()
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    gradients = _ops._backward_outputs(q, k, v, call.inputs_packed)
    _ops._on_device(
        index,
        _launch_backward,
        index,
        call,
        pointers,
        (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()),
        lse,
        gradients,
    )
    return gradients


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
    return _forward_body(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        schedule,
        sm_margin,
        window_left,
        window_right,
        softcap,
        keys_within_queries,
    )


@varlen_forward.register_fake
def _varlen_forward_fake(
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
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(
        (q.shape[1], q.shape[0]), dtype=torch.float32
    )


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
    problem's, made once per shape, promise and auto's hint from the packed rows); zero in rows no sequence holds
    (the library clears them)."""
    return _backward_body(
        dout,
        q,
        k,
        v,
        out,
        lse,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        schedule,
        sm_margin,
        window_left,
        window_right,
        softcap,
        keys_within_queries,
    )


@varlen_backward.register_fake
def _varlen_backward_fake(
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
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


# The non-tensor inputs of the forward op, which the backward repeats: max_seqlen_q, max_seqlen_k, softmax_scale,
# causal, schedule, sm_margin, window_left, window_right, softcap, keys_within_queries.
_Arguments = tuple[int, int, float, bool, str, int, int, int, float, bool]


def _save_for_backward(
    ctx: torch.autograd.function.FunctionCtx, tensors: tuple, arguments: _Arguments, output: tuple
) -> None:
    """The autograd context of both paths, as _ops._save_for_backward's: the inputs, the offsets and the outputs
    through save_for_backward, the arguments as one tuple, no gradient for the LSE (and none materialized)."""
    q, k, v, cu_seqlens_q, cu_seqlens_k = tensors
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.arguments = arguments
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    _save_for_backward(ctx, inputs[:5], inputs[5:], output)


def _gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, run_backward: Callable[..., tuple]
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """dq, dk, dv: the backward formula of both paths around `run_backward`, which has the backward op's
    signature."""
    if grad_out is None:
        return None, None, None
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    return run_backward(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.arguments)


def _op_gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The forward op's autograd formula: the backward op; none for the offsets and the other arguments."""
    dq, dk, dv = _gradients(ctx, grad_out, torch.ops.dash_attn.varlen_backward)
    return (dq, dk, dv, *(None,) * 12)


varlen_forward.register_autograd(_op_gradients, setup_context=_setup_context)


def _attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    *arguments: object,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of torch.ops.dash_attn.varlen_backward, bitwise the same: that op where torch traces, its body
    directly otherwise (as _ops.attention_backward)."""
    tensors = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    if _ops._traced(*tensors):
        return torch.ops.dash_attn.varlen_backward(*tensors, *arguments)
    return _backward_body(*tensors, *arguments)


def _eager_gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor | None, ...]:
    """_EagerVarlenAttention's gradients: dq, dk, dv, and none for the offsets and the argument tuple."""
    dq, dk, dv = _gradients(ctx, grad_out, _attention_backward)
    return dq, dk, dv, None, None, None


# As in _ops: a double backward raises when it runs; only a backward with create_graph=True needs the wrapper.
_eager_gradients_once_differentiable = torch.autograd.function.once_differentiable(_eager_gradients)


class _EagerVarlenAttention(torch.autograd.Function):
    """The varlen ops' autograd formula over their bodies, without the custom-op dispatch (as _ops._EagerAttention:
    the dispatch costs more host time than a short batch's kernels)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cu_seqlens_q: Tensor,
        cu_seqlens_k: Tensor,
        arguments: _Arguments,
    ) -> tuple[Tensor, Tensor]:
        tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k)
        output = _forward_body(*tensors, *arguments)
        _save_for_backward(ctx, tensors, arguments, output)
        return output

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():
            return _eager_gradients_once_differentiable(ctx, grad_out, grad_lse)
        return _eager_gradients(ctx, grad_out, grad_lse)


def _attention(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, arguments: _Arguments
) -> tuple[Tensor, Tensor]:
    """out, lse of torch.ops.dash_attn.varlen_forward, differentiable as it is, bitwise the same: that op where torch
    traces (_ops._traced), its body in plain eager mode, under _EagerVarlenAttention when autograd records the call."""
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k)
    if _ops._traced(*tensors):
        return torch.ops.dash_attn.varlen_forward(*tensors, *arguments)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerVarlenAttention.apply(*tensors, arguments)
    return _forward_body(*tensors, *arguments)


def _varlen_attention(
    q: object,
    k: object,
    v: object,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: object,
    max_seqlen_k: object,
    *,
    softmax_scale: float | None,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
    deterministic: bool,
    schedule: str,
    sm_margin: object,
    entry: str,
) -> tuple[Tensor, Tensor]:
    """out, lse of every varlen entry point, after its own option checks: checks the tensors, offsets and maxima,
    resolves the scale and schedule, applies the determinism switch and runs the call. `entry` is the public name
    the caller used, for the determinism switch's message."""
    left, right = window
    _check_packed((q, k, v))
    _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    max_q = _check_max_seqlen(max_seqlen_q, "max_seqlen_q")
    max_k = _check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    scale = resolve_scale(softmax_scale, q.shape[2], "softmax_scale")
    resolved = resolve_schedule(schedule, deterministic)
    margin = check_sm_margin(sm_margin)
    _check_determinism_switch(resolved, (q, k, v), entry)
    _check_devices((q, k, v, cu_seqlens_q, cu_seqlens_k), ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
    promise = _same_offsets(cu_seqlens_q, cu_seqlens_k)
    return _attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        (max_q, max_k, scale, causal, resolved, margin, left, right, softcap, promise),
    )


def _unstack_rows(packed: object, name: str, count: int) -> tuple[Tensor, ...]:
    """The `count` tensors stacked in dimension 1 of a (total, count, heads, head_dim) tensor, as views (no copy),
    as FlashAttention-2's packed varlen entry points take them."""
    check_is_tensor(packed, name)
    if packed.dim() != 4 or packed.shape[1] != count:
        raise ValueError(
            f"{name} must be 4-D (total_tokens, {count}, heads, head_dim), got shape {tuple(packed.shape)}"
        )
    return packed.unbind(1)


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    block_table: Tensor | None = None,
    *,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """Attention on a packed variable-length batch (FlashAttention's varlen), differentiable in q, k and v, with
    FlashAttention-2's arguments in FA2's order (dash_attn.fa3.flash_attn_varlen_func has FA3's).

    q is (total_q, heads_q, head_dim), k and v (total_k, heads_kv, head_dim) (GQA/MQA: fewer key/value heads);
    cu_seqlens_q and cu_seqlens_k are int32 CUDA tensors of batch + 1 offsets: sequence b's queries are rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q, its keys those of cu_seqlens_k in k and v. max_seqlen_q and max_seqlen_k
    bound every sequence's lengths (1 <= max <= 2^20); the backward's plan is made from them, never from the
    offsets, which stay on the device (no copy per call; CUDA-graph capturable). Lengths 0 are allowed.

    causal, window_size and softcap mean what they mean in flash_attn_func, per sequence: with causal=True query row
    i of a sequence sees its key j iff j <= i + seqlen_k - seqlen_q (bottom-right aligned). A query row that sees no
    key gets out = 0 and lse = -inf. softcap > 0 caps each score as in flash_attn_func (the softcap instances' varlen
    kernels).

    dropout_p, alibi_slopes and block_table are accepted at their no-op values (0.0, None, None); any other value
    raises NotImplementedError naming the argument (DASH has no dropout, no ALiBi and no paged KV cache).

    Passing one tensor as both cu_seqlens_q and cu_seqlens_k (self-attention) promises seqlen_k <= seqlen_q per
    sequence, which lets schedule="auto" pick shift; schedule="shift" or "symmetric-shift" without it
    is refused, naming the rule. deterministic (default True, unlike FA2) and schedule are flash_attn_func's: every
    schedule but "nondeterministic" (deterministic=False) gives bitwise identical gradients from run to run.

    Returns out (total_q, heads_q, head_dim); with return_attn_probs=True, FA2's (out, softmax_lse, S_dmask), where
    S_dmask is empty (what FA2 returns without dropout); with return_lse=True, (out, lse). The LSE is fp32
    (heads_q, total_q), natural-log, without gradient. Rows after cu_seqlens_q[-1] come out 0 (lse -inf) and get
    zero gradients.
    """
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    refuse_unsupported("block_table", block_table, (None,), "DASH has no paged KV cache")
    out, lse = _varlen_attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale=softmax_scale,
        causal=causal,
        window=window,
        softcap=cap,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        entry=_ENTRY,
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)


def flash_attn_varlen_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_varlen_func with k and v stacked as kv (total_k, 2, heads_kv, head_dim), in FA2's order. They are
    read as views, with no copy, and the gradient reaches kv. GQA works as in flash_attn_varlen_func."""
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    k, v = _unstack_rows(kv, "kv", 2)
    out, lse = _varlen_attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale=softmax_scale,
        causal=causal,
        window=window,
        softcap=cap,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        entry="dash_attn.flash_attn_varlen_kvpacked_func",
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)


def flash_attn_varlen_qkvpacked_func(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_varlen_func with q, k and v stacked as qkv (total, 3, heads, head_dim) and one offsets tensor for
    all three, in FA2's order. They are read as views, with no copy, and the gradient reaches qkv. As in FA2, the
    heads are the same for all three (no GQA). One offsets tensor is the self-attention promise, so
    schedule="auto" may pick shift."""
    _check_fa2_flags(causal, deterministic, return_attn_probs, return_lse)
    window, cap = _fa2_options(dropout_p, window_size, softcap, alibi_slopes)
    q, k, v = _unstack_rows(qkv, "qkv", 3)
    out, lse = _varlen_attention(
        q,
        k,
        v,
        cu_seqlens,
        cu_seqlens,
        max_seqlen,
        max_seqlen,
        softmax_scale=softmax_scale,
        causal=causal,
        window=window,
        softcap=cap,
        deterministic=deterministic,
        schedule=schedule,
        sm_margin=sm_margin,
        entry="dash_attn.flash_attn_varlen_qkvpacked_func",
    )
    return _fa2_result(out, lse, return_attn_probs, return_lse)


__all__ = ["flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func"]
