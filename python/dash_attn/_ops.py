"""The torch.library custom ops dash_attn::forward and dash_attn::backward, with fake kernels and autograd, and
attention(), the call the entry points make: the forward op, or in plain eager mode the same op bodies without
the custom-op dispatch. One op pair serves dense (B, S, H, D) batches and packed varlen batches (varlen.py): the
varlen arguments come last and are optional (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k and the
promise keys_within_queries; cu_seqlens_q None is a dense call), as the C ABI's dash_varlen pointer is.

Custom ops (not a torch.autograd.Function) keep the C library opaque to torch.compile: Dynamo records one
node per call instead of tracing into ctypes, the fake kernels give it the output metadata, and the
autograd formula wires the backward op in. Their dispatch (and the autograd wrapper torch generates for them)
costs more host time than the kernels' launches on small shapes, so where nothing traces (see _traced) attention()
runs the ops' bodies directly, under _EagerAttention when autograd records the call. Both paths run the same
bodies, so the same kernels and plans and the same bits, and share the autograd context (_save_for_backward: the
inputs and outputs through save_for_backward, so an input modified in place before the backward makes it raise;
the LSE non-differentiable; no zero gradient materialized for it) and the backward formula (_gradients).

Both ops take tensors that passed the checks in _arguments.py or varlen.py: (B, S, H, D), or packed (total, H, D)
with int32 offsets; they fix only what the kernels cannot take but a caller may legitimately pass (odd strides,
misaligned views, broadcast gradients) by copying. The backward runs the plan of its device, shape, schedule and SM
margin (and a varlen batch's promise and hint) from _plans, so a training loop plans and proves each shape once.
A varlen call's C shape is its maximum problem (batch = sequences, seqlen_q and seqlen_k = the maxima), its tensor
structs have no batch stride, its LSE is (H, total_q), and cu_seqlens stay on the device (never read on the host,
so a call is CUDA-graph capturable); a batch without query or key rows runs no kernel and its outputs are cleared
here (the library refuses empty packed tensors, and clears the padding rows of the others itself). The launches
run on torch's current stream of the tensors' device, made current only when it is not. sm_margin (SMs left to
other work, as in FlashAttention-3) is an input of the forward op, so that autograd hands the backward the same
margin.

Call descriptors (_ForwardCall, _BackwardCall): every call of a training loop repeats a handful of signatures
(the tensors' shapes and strides, dtype, device, scale, mask, schedule, margin; a varlen batch's sequences, maxima
and promise), so each signature is worked out once, on its first call: its C shape, the forward's workspace size
(asked of the loaded library, which keys the forward's descriptors), the backward's plan key, whether the kernels
read its tensors' strides in place, and its dash_tensor structs with their strides filled in (and its dash_varlen
struct with the totals and promise). A later call of the signature checks only what its key cannot hold (the data
pointers' alignment, the LSE's contiguity), writes its data pointers (and offsets) into the structs and launches.
The descriptors are kept in bounded LRU caches (a refusal caches nothing); a scale that is not positive is never
a key (0.0 == -0.0 and nan != nan as keys, and the library must see the value the caller passed), so such calls
build a descriptor of their own and the library refuses them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from . import _library, _plans

# TMA needs 16-byte aligned addresses and strides that are multiples of 16 bytes: 8 two-byte elements,
# and below 2^40 bytes (src/api/limits.hpp), even for a dimension of one index.
_TMA_ALIGNMENT_BYTES = 16
_ELEMENT_BYTES = 2
_STRIDE_MULTIPLE = _TMA_ALIGNMENT_BYTES // _ELEMENT_BYTES
_STRIDE_LIMIT = (1 << 40) // _ELEMENT_BYTES

_Result = TypeVar("_Result")

# Distinct (shape, strides) pairs whose layout verdict is kept: several tensors per call shape.
_LAYOUT_CACHE_CAPACITY = 4 * _plans.PLAN_CACHE_CAPACITY

# Call signatures whose descriptors are kept, per direction: as many as backward plans.
_CALL_CACHE_CAPACITY = _plans.PLAN_CACHE_CAPACITY

_DTYPE_CODES = {torch.bfloat16: _library.DTYPE_BF16, torch.float16: _library.DTYPE_FP16}


def _one_to_one(strides: tuple[int, ...], shape: torch.Size) -> bool:
    """Whether no two indices share an element: ordered by stride, each dimension with more than one index must
    step over all that the smaller ones span (broadcast gradients with stride 0 fail here)."""
    reach = 1
    for stride, size in sorted((s, n) for s, n in zip(strides, shape) if n > 1):
        if stride < reach:
            return False
        reach = stride * size
    return True


# A loop passes tensors of a handful of shapes and strides, so each layout is judged once.
@functools.lru_cache(maxsize=_LAYOUT_CACHE_CAPACITY)
def _strides_ok(shape: torch.Size, strides: tuple[int, ...]) -> bool:
    """The stride rules of validate() in src/api/validate.cpp: a contiguous last dimension, the other strides
    non-negative multiples of the TMA alignment below its limit, and no two indices on one element."""
    if strides[-1] != 1:
        return False
    for stride in strides[:-1]:
        if stride < 0 or stride % _STRIDE_MULTIPLE or stride >= _STRIDE_LIMIT:
            return False
    return _one_to_one(strides, shape)


def _layout_ok(t: Tensor) -> bool:
    """Whether the kernels can read or write `t` in place: the rules of validate() in src/api/validate.cpp."""
    return t.data_ptr() % _TMA_ALIGNMENT_BYTES == 0 and _strides_ok(t.shape, t.stride())


def _kernel_ready(t: Tensor) -> Tensor:
    """`t` itself when the kernels can take it, else a packed copy (clone, since .contiguous() keeps a
    misaligned or odd-strided tensor that torch already calls contiguous)."""
    return t if _layout_ok(t) else t.clone(memory_format=torch.contiguous_format)


def _c_tensor_at(data: int, strides: Sequence[int]) -> _library.Tensor:
    c = _library.Tensor()
    c.data = data
    c.strides[:] = strides
    return c


def _c_tensor(t: Tensor) -> _library.Tensor:
    return _c_tensor_at(t.data_ptr(), t.stride())


def _packed_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a packed (row-major) tensor of `shape` as torch gives them (_packed_like), read from a meta
    tensor, which allocates nothing."""
    return torch.empty(shape, device="meta").stride()


def _c_shape(
    q: Tensor,
    k: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> _library.Shape:
    """A new C shape of a call, the caller's own."""
    return _make_c_shape(q.shape, k.shape, q.dtype, softmax_scale, causal, window_left, window_right, softcap)


def _make_c_shape(
    q_shape: Sequence[int],
    k_shape: Sequence[int],
    dtype: torch.dtype,
    softmax_scale: float,
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> _library.Shape:
    batch, seqlen_q, heads_q, head_dim = q_shape
    _, seqlen_k, heads_kv, _ = k_shape
    return _library.Shape(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        heads_q=heads_q,
        heads_kv=heads_kv,
        head_dim=head_dim,
        dtype=_DTYPE_CODES[dtype],
        softmax_scale=softmax_scale,
        causal=int(causal),
        windowed=1,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
    )


# A varlen batch's signature besides its tensors: the sequences, max_seqlen_q, max_seqlen_k and the promise
# keys_within_queries. None in a dense call's.
_Sequences = tuple[int, int, int, bool]


def _problem_shapes(
    q_shape: Sequence[int], k_shape: Sequence[int], sequences: _Sequences | None
) -> tuple[Sequence[int], Sequence[int]]:
    """q's and k's (B, S, H, D) shapes as the C shape takes them: their own, or a varlen batch's maximum problem."""
    if sequences is None:
        return q_shape, k_shape
    batch, max_seqlen_q, max_seqlen_k, _ = sequences
    return (batch, max_seqlen_q, *q_shape[1:]), (batch, max_seqlen_k, *k_shape[1:])


def _c_varlen(q_shape: Sequence[int], k_shape: Sequence[int], sequences: _Sequences | None) -> _library.Varlen | None:
    """The dash_varlen of a varlen signature, its offsets 0 (each call writes its own), or None for a dense one."""
    if sequences is None:
        return None
    return _library.Varlen(0, 0, q_shape[0], k_shape[0], int(sequences[3]))


def _copy_varlen(varlen: _library.Varlen | None) -> _library.Varlen | None:
    """A new dash_varlen of `varlen`'s totals and promise, its offsets 0; None for None."""
    if varlen is None:
        return None
    return _library.Varlen(0, 0, varlen.total_q, varlen.total_k, varlen.keys_within_queries)


class _TensorStructs:
    """The dash_tensor structs of one call signature, their strides filled in once, and its dash_varlen struct (or
    None), which its calls reuse: a call that takes them writes its data pointers (and offsets) into them and gives
    them back after its C call. Taking is a non-blocking lock, so a call that finds them taken (by another thread,
    whose C call may be reading them with the GIL released, or by a call re-entered from a finalizer) writes into
    fresh ones instead of into ones in use. The callers write the pointers themselves, one attribute each: a loop
    over the structs costs twice as much. A varlen signature's tensor structs have no batch stride (0)."""

    __slots__ = ("_lock", "_strides", "_varlen", "shared")

    def __init__(self, strides: tuple[tuple[int, ...], ...], varlen: _library.Varlen | None = None) -> None:
        self._strides = strides if varlen is None else tuple((0, *s) for s in strides)
        self._varlen = varlen
        self.shared = self.fresh()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Whether the caller has `shared` to itself, until it calls give_back()."""
        return self._lock.acquire(False)  # non-blocking

    def give_back(self) -> None:
        self._lock.release()

    def fresh(self) -> tuple[_library.Tensor | _library.Varlen | None, ...]:
        """New structs with the strides (and totals and promise) of `shared`, for a call that could not take them:
        the tensors' in the C call's order, then the dash_varlen or None."""
        return (*(_c_tensor_at(0, strides) for strides in self._strides), _copy_varlen(self._varlen))


class _ForwardCall:
    """What every forward of one signature shares: its C shape, its workspace size, whether the kernels read q, k
    and v in place (their strides; each call checks its pointers), whether q is packed, and the structs of q, k, v
    and out (with the dash_varlen of a varlen signature)."""

    __slots__ = ("in_place", "q_packed", "shape", "structs", "workspace_bytes")

    def __init__(
        self,
        library: object,
        dtype: torch.dtype,
        softmax_scale: float,
        causal: bool,
        q_shape: torch.Size,
        q_strides: tuple[int, ...],
        k_shape: torch.Size,
        k_strides: tuple[int, ...],
        v_shape: torch.Size,
        v_strides: tuple[int, ...],
        window_left: int = -1,
        window_right: int = -1,
        softcap: float = 0.0,
        sequences: _Sequences | None = None,
    ) -> None:
        # `library`, the loaded library, is only part of the key: forward_workspace_size asks it.
        mask = (window_left, window_right, softcap)
        self.shape = _make_c_shape(*_problem_shapes(q_shape, k_shape, sequences), dtype, softmax_scale, causal, *mask)
        # The library validates the shape here, so a refused one raises before anything is cached.
        self.workspace_bytes = _library.forward_workspace_size(self.shape)
        layouts = ((q_shape, q_strides), (k_shape, k_strides), (v_shape, v_strides))
        self.in_place = all(_strides_ok(shape, strides) for shape, strides in layouts)
        out_strides = _packed_strides(q_shape)
        self.q_packed = q_strides == out_strides
        varlen = _c_varlen(q_shape, k_shape, sequences)
        self.structs = _TensorStructs((q_strides, k_strides, v_strides, out_strides), varlen)


# The loaded library is part of the key (the first argument), so a library loaded anew is asked again.
_cached_forward_call = functools.lru_cache(maxsize=_CALL_CACHE_CAPACITY)(_ForwardCall)


def _forward_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sequences: _Sequences | None = None,
) -> _ForwardCall:
    # A softcap that is not a finite number >= 0 is never a key either (nan != nan); the library refuses it.
    cacheable = softmax_scale > 0 and softcap >= 0 and softcap != float("inf")
    make = _cached_forward_call if cacheable else _ForwardCall
    return make(
        _library.load(),
        q.dtype,
        softmax_scale,
        causal,
        q.shape,
        q.stride(),
        k.shape,
        k.stride(),
        v.shape,
        v.stride(),
        window_left,
        window_right,
        softcap,
        sequences,
    )


class _BackwardCall:
    """What every backward of one signature shares: its C shape, its plan's key in _plans, whether the kernels read
    dout, q, k, v and out in place (their strides; each call checks its pointers), whether q, k and v are packed,
    and the structs of q, k, v, out, dout, dq, dk and dv, in the C call's order (with the dash_varlen of a varlen
    signature). The plan itself is looked up at every call, so the plan cache's recency and eviction stay its own;
    `varlen` (None when dense) is what a varlen plan is made from, its offsets never written."""

    __slots__ = ("in_place", "inputs_packed", "plan_key", "shape", "structs", "varlen")

    def __init__(
        self,
        device: int,
        dtype: torch.dtype,
        softmax_scale: float,
        causal: bool,
        schedule: str,
        sm_margin: int,
        dout_shape: torch.Size,
        dout_strides: tuple[int, ...],
        q_shape: torch.Size,
        q_strides: tuple[int, ...],
        k_shape: torch.Size,
        k_strides: tuple[int, ...],
        v_shape: torch.Size,
        v_strides: tuple[int, ...],
        out_shape: torch.Size,
        out_strides: tuple[int, ...],
        window_left: int = -1,
        window_right: int = -1,
        softcap: float = 0.0,
        sequences: _Sequences | None = None,
    ) -> None:
        mask = (window_left, window_right, softcap)
        self.shape = _make_c_shape(*_problem_shapes(q_shape, k_shape, sequences), dtype, softmax_scale, causal, *mask)
        self.varlen = _c_varlen(q_shape, k_shape, sequences)
        # A varlen plan's promise and auto's hint come from the totals, which the signature holds.
        batch = None if self.varlen is None else _plans.varlen_batch(self.shape, self.varlen)
        self.plan_key = _plans.plan_key(device, _plans.shape_fields(self.shape), schedule, sm_margin, batch)
        layouts = (
            (dout_shape, dout_strides),
            (q_shape, q_strides),
            (k_shape, k_strides),
            (v_shape, v_strides),
            (out_shape, out_strides),
        )
        self.in_place = all(_strides_ok(shape, strides) for shape, strides in layouts)
        gradient_strides = (_packed_strides(q_shape), _packed_strides(k_shape), _packed_strides(v_shape))
        self.inputs_packed = (q_strides, k_strides, v_strides) == gradient_strides
        strides = (q_strides, k_strides, v_strides, out_strides, dout_strides, *gradient_strides)
        self.structs = _TensorStructs(strides, self.varlen)


_cached_backward_call = functools.lru_cache(maxsize=_CALL_CACHE_CAPACITY)(_BackwardCall)


def _backward_call(
    device: int,
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sequences: _Sequences | None = None,
) -> _BackwardCall:
    cacheable = softmax_scale > 0 and softcap >= 0 and softcap != float("inf")
    make = _cached_backward_call if cacheable else _BackwardCall
    return make(
        device,
        q.dtype,
        softmax_scale,
        causal,
        schedule,
        sm_margin,
        dout.shape,
        dout.stride(),
        q.shape,
        q.stride(),
        k.shape,
        k.stride(),
        v.shape,
        v.stride(),
        out.shape,
        out.stride(),
        window_left,
        window_right,
        softcap,
        sequences,
    )


def _workspace(nbytes: int, device: torch.device) -> Tensor:
    """Scratch memory from torch's caching allocator, whose blocks are aligned far beyond the 256 bytes needed."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _packed_like(t: Tensor, packed: bool = False) -> Tensor:
    """A packed (row-major) uninitialized tensor of `t`'s shape, dtype and device. empty_like parses one tensor
    where torch.empty(shape, dtype=, device=) parses three arguments: half the host time, on every output. When
    `t` is `packed` already (a descriptor knows), empty_like keeps its strides without being asked for the
    contiguous format, which costs a sixth more."""
    return torch.empty_like(t) if packed else torch.empty_like(t, memory_format=torch.contiguous_format)


def _forward_outputs(
    q: Tensor, q_packed: bool = False, packed_batch: bool = False, out_fp32: bool = False
) -> tuple[Tensor, Tensor]:
    """Packed (B, Sq, Hq, D) output and (B, Hq, Sq) fp32 LSE, or for a `packed_batch` (varlen) the (total_q, Hq, D)
    output and (Hq, total_q) LSE; the fake kernel uses it too, so metadata agree. The output has q's dtype, or fp32
    with `out_fp32` (its packed strides are q's packed strides: the same element strides)."""
    # Sizes as separate arguments: torch parses them faster than one tuple.
    if packed_batch:
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    else:
        batch, seqlen_q, heads_q, _ = q.shape
        lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device)
    if out_fp32:
        return torch.empty(q.shape, dtype=torch.float32, device=q.device), lse
    return _packed_like(q, q_packed), lse


def _backward_outputs(q: Tensor, k: Tensor, v: Tensor, packed: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Packed dq, dk, dv; `packed`: q, k and v are packed already."""
    return _packed_like(q, packed), _packed_like(k, packed), _packed_like(v, packed)


def _on_device(index: int, launch: Callable[..., _Result], *args: object) -> _Result:
    """launch(*args) with CUDA device `index` current, as the library needs (it plans for and launches on the
    current device). Switching only when `index` is not current already skips torch.cuda.device, which costs
    microseconds even when it has nothing to switch."""
    if torch._C._cuda_getDevice() == index:
        return launch(*args)
    with torch.cuda.device(index):
        return launch(*args)


def _launch_forward(
    index: int,
    call: _ForwardCall,
    pointers: tuple[int, int, int],
    out: Tensor,
    lse: Tensor,
    sm_margin: int,
    offsets: tuple[int, int] | None,
    out_fp32: bool = False,
) -> None:
    workspace = _workspace(call.workspace_bytes, out.device)
    structs = call.structs
    taken = structs.take()
    try:
        q_c, k_c, v_c, out_c, varlen = structs.shared if taken else structs.fresh()
        q_c.data, k_c.data, v_c.data = pointers
        out_c.data = out.data_ptr()
        if varlen is not None:
            varlen.cu_seqlens_q, varlen.cu_seqlens_k = offsets
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
            out_fp32,
        )
    finally:
        if taken:
            structs.give_back()


def _empty_batch(q: Tensor, k: Tensor) -> bool:
    """A varlen batch without query or key rows: nothing for a kernel to do (the library refuses empty packed
    tensors)."""
    return q.shape[0] == 0 or k.shape[0] == 0


def _forward_body(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int = 0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    keys_within_queries: bool = False,
    *,
    out_fp32: bool = False,
) -> tuple[Tensor, Tensor]:
    """What the forward op runs, and the eager path too: out, lse on the current stream of q's device, allocated
    uncleared (the library writes every row). `schedule` is not used here: autograd hands it to the backward.
    `out_fp32` (forward_partial alone, never the op) makes out fp32, the values before their rounding to q's
    dtype."""
    sequences = offsets = None
    if cu_seqlens_q is not None:
        if _empty_batch(q, k):  # no kernel runs: rows that see no key
            out, lse = _forward_outputs(q, packed_batch=True, out_fp32=out_fp32)
            return out.zero_(), lse.fill_(float("-inf"))
        sequences = (cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, keys_within_queries)
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
        offsets = (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr())
    mask = (window_left, window_right, softcap, sequences)
    call = _forward_call(q, k, v, softmax_scale, causal, *mask)
    pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    aligned = (pointers[0] | pointers[1] | pointers[2]) % _TMA_ALIGNMENT_BYTES == 0  # one test for the three
    if not (call.in_place and aligned):
        q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
        call = _forward_call(q, k, v, softmax_scale, causal, *mask)
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    out, lse = _forward_outputs(q, call.q_packed, sequences is not None, out_fp32)
    index = q.get_device()
    _on_device(index, _launch_forward, index, call, pointers, out, lse, sm_margin, offsets, out_fp32)
    return out, lse


def forward_partial(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    sm_margin: int = 0,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    keys_within_queries: bool = False,
) -> tuple[Tensor, Tensor]:
    """out, lse of the forward with out in fp32: O / l before its rounding to q's dtype (rounded, the bits of the
    forward op's out), for context parallelism, which merges the partial results of blocks of keys and rounds once at
    the end. Internal and outside autograd (no gradient flows through it): dash_attn.parallel calls it on tensors its
    own checks passed. Dense (B, S, H, D), or with cu_seqlens_q a packed batch as the forward op takes it."""
    return _forward_body(
        q,
        k,
        v,
        softmax_scale,
        causal,
        "auto",
        sm_margin,
        window_left,
        window_right,
        0.0,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        keys_within_queries,
        out_fp32=True,
    )


def _launch_backward(
    index: int,
    call: _BackwardCall,
    pointers: tuple[int, int, int, int, int],
    lse: Tensor,
    gradients: tuple[Tensor, Tensor, Tensor],
    offsets: tuple[int, int] | None,
) -> None:
    # Planned and proven once per (device, shape, schedule, margin, varlen promise and hint); the plan sizes the
    # workspace and runs.
    plan = _plans.backward_plans.get(call.plan_key, call.varlen)
    workspace = _workspace(plan.workspace_bytes, lse.device)
    dq, dk, dv = gradients
    structs = call.structs
    taken = structs.take()
    try:
        q_c, k_c, v_c, out_c, dout_c, dq_c, dk_c, dv_c, varlen = structs.shared if taken else structs.fresh()
        dout_c.data, q_c.data, k_c.data, v_c.data, out_c.data = pointers
        dq_c.data, dk_c.data, dv_c.data = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        if varlen is not None:
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
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int = 0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    keys_within_queries: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """What the backward op runs, and the eager path too: dq, dk, dv on the current stream of q's device (a varlen
    batch's zero in rows no sequence holds: the library clears them)."""
    sequences = offsets = None
    if cu_seqlens_q is not None:
        if _empty_batch(q, k):  # no kernel runs: no query sees a key
            return tuple(torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
        sequences = (cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, keys_within_queries)
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
        offsets = (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr())
    index = q.get_device()
    rest = (softmax_scale, causal, schedule, sm_margin, window_left, window_right, softcap, sequences)
    call = _backward_call(index, dout, q, k, v, out, *rest)
    pointers = (dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    aligned = (pointers[0] | pointers[1] | pointers[2] | pointers[3] | pointers[4]) % _TMA_ALIGNMENT_BYTES == 0
    if not (call.in_place and aligned):
        dout, q, k, v, out = (_kernel_ready(t) for t in (dout, q, k, v, out))
        call = _backward_call(index, dout, q, k, v, out, *rest)
        pointers = (dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    lse = lse.contiguous()
    gradients = _backward_outputs(q, k, v, call.inputs_packed)
    _on_device(index, _launch_backward, index, call, pointers, lse, gradients, offsets)
    return gradients


@torch.library.custom_op("dash_attn::forward", mutates_args=(), device_types="cuda")
def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int = 0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    keys_within_queries: bool = False,
) -> tuple[Tensor, Tensor]:
    """out, lse = attention(q, k, v), leaving `sm_margin` SMs to other work, under the sliding window
    (window_left, window_right) (FlashAttention's window_size; -1 leaves a side open) and with the scores capped
    to softcap * tanh(score / softcap) when softcap > 0. With cu_seqlens_q, a packed varlen batch (varlen.py): its
    offsets, maxima and the promise that every sequence has seqlen_k <= seqlen_q. `schedule` is not used here: it is
    an input so that autograd records the summation order the backward must use."""
    return _forward_body(
        q,
        k,
        v,
        softmax_scale,
        causal,
        schedule,
        sm_margin,
        window_left,
        window_right,
        softcap,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        keys_within_queries,
    )


@forward.register_fake
def _forward_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int = 0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    keys_within_queries: bool = False,
) -> tuple[Tensor, Tensor]:
    return _forward_outputs(q, packed_batch=cu_seqlens_q is not None)


@torch.library.custom_op("dash_attn::backward", mutates_args=(), device_types="cuda")
def backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int = 0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    keys_within_queries: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of attention for upstream gradient `dout`, dQ summed in the order `schedule` fixes as planned
    for the device's SMs less `sm_margin`, under the forward's window, softcap and varlen batch."""
    return _backward_body(
        dout,
        q,
        k,
        v,
        out,
        lse,
        softmax_scale,
        causal,
        schedule,
        sm_margin,
        window_left,
        window_right,
        softcap,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        keys_within_queries,
    )


@backward.register_fake
def _backward_fake(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int = 0,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    keys_within_queries: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_outputs(q, k, v)


def _traced(*tensors: Tensor | None) -> bool:
    """Whether torch must see this call as the custom op rather than run the op's body directly: under
    torch.compile or export (Dynamo folds is_compiling() to True and stops there, so it never meets the queries
    after it), under any torch dispatch mode (FakeTensorMode, make_fx's proxy mode, functionalization,
    FlopCounterMode, ...), a functorch transform (vmap, grad), torch.jit.trace, forward-mode AD (the op refuses
    dual tensors rather than drop their tangents), or with a tensor subclass (FakeTensor, DTensor, ...) that
    must see the op through its __torch_dispatch__. Each query costs tens of nanoseconds. None (a dense call's
    offsets) is no tensor."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack() > 0
        or torch._C._are_functorch_transforms_active()
        or torch._C._get_tracing_state() is not None
        or torch.autograd.forward_ad._current_level >= 0
    ):
        return True
    # A loop rather than any() over a generator, which costs more than the queries above together.
    for t in tensors:
        if type(t) is not Tensor and t is not None:
            return True
    return False


# The inputs of the forward op after q, k and v, which the backward repeats after dout, q, k, v, out and lse:
# softmax_scale, causal, schedule, sm_margin, window_left, window_right, softcap, and, for a varlen batch,
# cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, keys_within_queries (a dense call may leave them out).
_Arguments = tuple
# Where the offsets lie in _Arguments: the tensors among them.
_OFFSETS = slice(7, 9)
_BEFORE_OFFSETS = slice(0, 7)
_AFTER_OFFSETS = slice(9, None)


def _save_for_backward(
    ctx: torch.autograd.function.FunctionCtx, tensors: tuple, arguments: _Arguments, output: tuple
) -> None:
    """The autograd context of both paths: the inputs, the outputs and a varlen call's offsets (save_for_backward,
    so one modified in place before the backward makes it raise), the other arguments the backward repeats (two
    tuples), and no gradient for the LSE."""
    q, k, v = tensors
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *arguments[_OFFSETS])
    ctx.arguments = arguments[_BEFORE_OFFSETS]
    ctx.sequences = arguments[_AFTER_OFFSETS]
    # The backward does not differentiate through the LSE; marking it keeps a loss that uses it from
    # silently getting a wrong gradient.
    ctx.mark_non_differentiable(lse)
    # The LSE never has a gradient, and autograd would otherwise fill a zero tensor for it (a kernel launch) at
    # every backward; a gradient of `out` that is missing (None) means no gradient at all.
    ctx.set_materialize_grads(False)


def _op_setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    _save_for_backward(ctx, inputs[:3], inputs[3:], output)


def _gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, run_backward: Callable[..., tuple]
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """dq, dk, dv: the backward formula of both paths around `run_backward`, which has the backward op's
    signature."""
    if grad_out is None:
        return None, None, None
    q, k, v, out, lse, *offsets = ctx.saved_tensors
    return run_backward(grad_out, q, k, v, out, lse, *ctx.arguments, *offsets, *ctx.sequences)


def _op_gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The forward op's autograd formula: the backward op, whatever the tensors (meta ones run its fake kernel);
    no gradient for its twelve other inputs."""
    dq, dk, dv = _gradients(ctx, grad_out, torch.ops.dash_attn.backward)
    return (dq, dk, dv, *(None,) * 12)


forward.register_autograd(_op_gradients, setup_context=_op_setup_context)


def attention_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *arguments: object
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of torch.ops.dash_attn.backward(dout, q, k, v, out, lse, *arguments), bitwise the same: that op
    where torch traces (also a backward traced though its forward ran eagerly: compiled autograd, a dispatch mode
    around .backward()), its body directly otherwise. The eager path's backward and dash_attn.attention_backward
    both run it."""
    if _traced(dout, q, k, v, out, lse, *arguments[_OFFSETS]):
        return torch.ops.dash_attn.backward(dout, q, k, v, out, lse, *arguments)
    return _backward_body(dout, q, k, v, out, lse, *arguments)


def _eager_gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
    """_EagerAttention's gradients: dq, dk, dv, and none for its argument tuple."""
    dq, dk, dv = _gradients(ctx, grad_out, attention_backward)
    return dq, dk, dv, None


# A double backward of the eager path raises when it runs, as through the backward op, which has no autograd
# formula; only a backward with create_graph=True (grad mode on) needs the wrapper that arranges it.
_eager_gradients_once_differentiable = torch.autograd.function.once_differentiable(_eager_gradients)


class _EagerAttention(torch.autograd.Function):
    """The custom ops' autograd formula as a torch.autograd.Function over their bodies: the same kernels, plans
    and saved tensors without the custom-op dispatch, which costs more host time than the kernels' launches on
    small shapes. Its non-tensor inputs (and a varlen call's offsets, which need no gradient) come as one tuple,
    which apply() parses faster than separate arguments."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, q: Tensor, k: Tensor, v: Tensor, arguments: _Arguments
    ) -> tuple[Tensor, Tensor]:
        output = _forward_body(q, k, v, *arguments)
        _save_for_backward(ctx, (q, k, v), arguments, output)
        return output

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        if torch.is_grad_enabled():
            return _eager_gradients_once_differentiable(ctx, grad_out, grad_lse)
        return _eager_gradients(ctx, grad_out, grad_lse)


def attention(q: Tensor, k: Tensor, v: Tensor, *arguments: object) -> tuple[Tensor, Tensor]:
    """out, lse of torch.ops.dash_attn.forward(q, k, v, *arguments) (_Arguments), differentiable as it is, bitwise
    the same. Where torch traces (see _traced) it is that op; in plain eager mode the op's body runs directly, under
    _EagerAttention when autograd records the call."""
    if _traced(q, k, v, *arguments[_OFFSETS]):
        return torch.ops.dash_attn.forward(q, k, v, *arguments)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(q, k, v, arguments)
    return _forward_body(q, k, v, *arguments)
