"""The torch.library custom ops dash_attn::forward and dash_attn::backward, with fake kernels and autograd, and
attention(), the call the entry points make: the forward op, or in plain eager mode the same op bodies without
the custom-op dispatch.

Custom ops (not a torch.autograd.Function) keep the C library opaque to torch.compile: Dynamo records one
node per call instead of tracing into ctypes, the fake kernels give it the output metadata, and the
autograd formula wires the backward op in. Their dispatch (and the autograd wrapper torch generates for them)
costs more host time than the kernels' launches on small shapes, so where nothing traces (see _traced) attention()
runs the ops' bodies directly, under _EagerAttention when autograd records the call. Both paths run the same
bodies, so the same kernels and plans and the same bits, and share the autograd context (_save_for_backward: the
inputs and outputs through save_for_backward, so an input modified in place before the backward makes it raise;
the LSE non-differentiable; no zero gradient materialized for it) and the backward formula (_gradients).

Both ops take (B, S, H, D) tensors that passed the checks in _arguments.py; they fix only what the kernels cannot
take but a caller may legitimately pass (odd strides, misaligned views, broadcast gradients) by copying. The
backward runs the plan of its device, shape, schedule and SM margin from _plans, so a training loop plans and
proves each shape once. The launches run on torch's current stream of the tensors' device, made current only when
it is not. sm_margin (SMs left to other work, as in FlashAttention-3) is an input of the forward op, so that
autograd hands the backward the same margin.

Call descriptors (_ForwardCall, _BackwardCall): every call of a training loop repeats a handful of signatures
(the tensors' shapes and strides, dtype, device, scale, mask, schedule, margin), so each signature is worked out
once, on its first call: its C shape, the forward's workspace size (asked of the loaded library, which keys the
forward's descriptors), the backward's plan key, whether the kernels read its tensors' strides in place, and its
dash_tensor structs with their strides filled in. A later call of the signature checks only what its key cannot
hold (the data pointers' alignment, the LSE's contiguity), writes its data pointers into the structs and launches.
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


class _TensorStructs:
    """The dash_tensor structs of one call signature, their strides filled in once, which its calls reuse: a call
    that takes them writes its data pointers into them and gives them back after its C call. Taking is a
    non-blocking lock, so a call that finds them taken (by another thread, whose C call may be reading them with
    the GIL released, or by a call re-entered from a finalizer) writes into fresh ones instead of into ones in use.
    The callers write the pointers themselves, one attribute each: a loop over the structs costs twice as much."""

    __slots__ = ("_lock", "_strides", "shared")

    def __init__(self, strides: tuple[tuple[int, ...], ...]) -> None:
        self._strides = strides
        self.shared = tuple(_c_tensor_at(0, s) for s in strides)
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Whether the caller has `shared` to itself, until it calls give_back()."""
        return self._lock.acquire(False)  # non-blocking

    def give_back(self) -> None:
        self._lock.release()

    def fresh(self) -> tuple[_library.Tensor, ...]:
        """New structs with the strides of `shared`, for a call that could not take them."""
        return tuple(_c_tensor_at(0, strides) for strides in self._strides)


class _ForwardCall:
    """What every forward of one signature shares: its C shape, its workspace size, whether the kernels read q, k
    and v in place (their strides; each call checks its pointers), whether q is packed, and the structs of q, k, v
    and out."""

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
    ) -> None:
        # `library`, the loaded library, is only part of the key: forward_workspace_size asks it.
        self.shape = _make_c_shape(q_shape, k_shape, dtype, softmax_scale, causal, window_left, window_right, softcap)
        # The library validates the shape here, so a refused one raises before anything is cached.
        self.workspace_bytes = _library.forward_workspace_size(self.shape)
        layouts = ((q_shape, q_strides), (k_shape, k_strides), (v_shape, v_strides))
        self.in_place = all(_strides_ok(shape, strides) for shape, strides in layouts)
        out_strides = _packed_strides(q_shape)
        self.q_packed = q_strides == out_strides
        self.structs = _TensorStructs((q_strides, k_strides, v_strides, out_strides))


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
    )


class _BackwardCall:
    """What every backward of one signature shares: its C shape, its plan's key in _plans, whether the kernels read
    dout, q, k, v and out in place (their strides; each call checks its pointers), whether q, k and v are packed,
    and the structs of q, k, v, out, dout, dq, dk and dv, in the C call's order. The plan itself is looked up at
    every call, so the plan cache's recency and eviction stay its own."""

    __slots__ = ("in_place", "inputs_packed", "plan_key", "shape", "structs")

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
    ) -> None:
        self.shape = _make_c_shape(q_shape, k_shape, dtype, softmax_scale, causal, window_left, window_right, softcap)
        self.plan_key = _plans.plan_key(device, _plans.shape_fields(self.shape), schedule, sm_margin)
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
        self.structs = _TensorStructs((q_strides, k_strides, v_strides, out_strides, dout_strides, *gradient_strides))


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


def _forward_outputs(q: Tensor, q_packed: bool = False) -> tuple[Tensor, Tensor]:
    """Packed (B, Sq, Hq, D) output and (B, Hq, Sq) fp32 LSE; the fake kernel uses it too, so metadata agree."""
    batch, seqlen_q, heads_q, _ = q.shape
    # Sizes as separate arguments: torch parses them faster than one tuple.
    lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device)
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
    index: int, call: _ForwardCall, pointers: tuple[int, int, int], out: Tensor, lse: Tensor, sm_margin: int
) -> None:
    workspace = _workspace(call.workspace_bytes, out.device)
    structs = call.structs
    taken = structs.take()
    try:
        q_c, k_c, v_c, out_c = structs.shared if taken else structs.fresh()
        q_c.data, k_c.data, v_c.data = pointers
        out_c.data = out.data_ptr()
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
        )
    finally:
        if taken:
            structs.give_back()


def _forward_body(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    sm_margin: int,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """What the forward op runs, and the eager path too: out, lse on the current stream of q's device."""
    call = _forward_call(q, k, v, softmax_scale, causal, window_left, window_right, softcap)
    pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    aligned = (pointers[0] | pointers[1] | pointers[2]) % _TMA_ALIGNMENT_BYTES == 0  # one test for the three
    if not (call.in_place and aligned):
        q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
        call = _forward_call(q, k, v, softmax_scale, causal, window_left, window_right, softcap)
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    out, lse = _forward_outputs(q, call.q_packed)
    index = q.get_device()
    _on_device(index, _launch_forward, index, call, pointers, out, lse, sm_margin)
    return out, lse


def _launch_backward(
    index: int,
    call: _BackwardCall,
    pointers: tuple[int, int, int, int, int],
    lse: Tensor,
    gradients: tuple[Tensor, Tensor, Tensor],
) -> None:
    # Planned and proven once per (device, shape, schedule, margin); the plan sizes the workspace and runs.
    plan = _plans.backward_plans.get(call.plan_key)
    workspace = _workspace(plan.workspace_bytes, lse.device)
    dq, dk, dv = gradients
    structs = call.structs
    taken = structs.take()
    try:
        q_c, k_c, v_c, out_c, dout_c, dq_c, dk_c, dv_c = structs.shared if taken else structs.fresh()
        dout_c.data, q_c.data, k_c.data, v_c.data, out_c.data = pointers
        dq_c.data, dk_c.data, dv_c.data = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
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
    sm_margin: int,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """What the backward op runs, and the eager path too: dq, dk, dv on the current stream of q's device."""
    index = q.get_device()
    mask = (window_left, window_right, softcap)
    call = _backward_call(index, dout, q, k, v, out, softmax_scale, causal, schedule, sm_margin, *mask)
    pointers = (dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    aligned = (pointers[0] | pointers[1] | pointers[2] | pointers[3] | pointers[4]) % _TMA_ALIGNMENT_BYTES == 0
    if not (call.in_place and aligned):
        dout, q, k, v, out = (_kernel_ready(t) for t in (dout, q, k, v, out))
        call = _backward_call(index, dout, q, k, v, out, softmax_scale, causal, schedule, sm_margin, *mask)
        pointers = (dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    lse = lse.contiguous()
    gradients = _backward_outputs(q, k, v, call.inputs_packed)
    _on_device(index, _launch_backward, index, call, pointers, lse, gradients)
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
) -> tuple[Tensor, Tensor]:
    """out, lse = attention(q, k, v), leaving `sm_margin` SMs to other work, under the sliding window
    (window_left, window_right) (FlashAttention's window_size; -1 leaves a side open) and with the scores capped
    to softcap * tanh(score / softcap) when softcap > 0. `schedule` is not used here: it is an input so that
    autograd records the summation order the backward must use."""
    return _forward_body(q, k, v, softmax_scale, causal, sm_margin, window_left, window_right, softcap)


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
) -> tuple[Tensor, Tensor]:
    return _forward_outputs(q)


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
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of attention for upstream gradient `dout`, dQ summed in the order `schedule` fixes as planned
    for the device's SMs less `sm_margin`, under the forward's window and softcap."""
    return _backward_body(
        dout, q, k, v, out, lse, softmax_scale, causal, schedule, sm_margin, window_left, window_right, softcap
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
) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_outputs(q, k, v)


def _traced(*tensors: Tensor) -> bool:
    """Whether torch must see this call as the custom op rather than run the op's body directly: under
    torch.compile or export (Dynamo folds is_compiling() to True and stops there, so it never meets the queries
    after it), under any torch dispatch mode (FakeTensorMode, make_fx's proxy mode, functionalization,
    FlopCounterMode, ...), a functorch transform (vmap, grad), torch.jit.trace, forward-mode AD (the op refuses
    dual tensors rather than drop their tangents), or with a tensor subclass (FakeTensor, DTensor, ...) that
    must see the op through its __torch_dispatch__. Each query costs tens of nanoseconds."""
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
        if type(t) is not Tensor:
            return True
    return False


# The non-tensor inputs of the forward op, which the backward repeats: softmax_scale, causal, schedule, sm_margin,
# window_left, window_right, softcap.
_Arguments = tuple[float, bool, str, int, int, int, float]


def _save_for_backward(
    ctx: torch.autograd.function.FunctionCtx, tensors: tuple, arguments: _Arguments, output: tuple
) -> None:
    """The autograd context of both paths: the inputs and outputs (save_for_backward, so an input modified in
    place before the backward makes it raise), the arguments the backward repeats (one tuple: one attribute to
    set and read), and no gradient for the LSE."""
    q, k, v = tensors
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.arguments = arguments
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
    q, k, v, out, lse = ctx.saved_tensors
    return run_backward(grad_out, q, k, v, out, lse, *ctx.arguments)


def _op_gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The forward op's autograd formula: the backward op, whatever the tensors (meta ones run its fake kernel);
    no gradient for its seven other inputs."""
    dq, dk, dv = _gradients(ctx, grad_out, torch.ops.dash_attn.backward)
    return dq, dk, dv, None, None, None, None, None, None, None


forward.register_autograd(_op_gradients, setup_context=_op_setup_context)


def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of torch.ops.dash_attn.backward, bitwise the same: that op where torch traces (also a backward
    traced though its forward ran eagerly: compiled autograd, a dispatch mode around .backward()), its body
    directly otherwise. The eager path's backward and dash_attn.attention_backward both run it."""
    mask = (window_left, window_right, softcap)
    if _traced(dout, q, k, v, out, lse):
        return torch.ops.dash_attn.backward(dout, q, k, v, out, lse, softmax_scale, causal, schedule, sm_margin, *mask)
    return _backward_body(dout, q, k, v, out, lse, softmax_scale, causal, schedule, sm_margin, *mask)


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
    small shapes. Its non-tensor inputs come as one tuple, which apply() parses faster than four arguments."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, q: Tensor, k: Tensor, v: Tensor, arguments: _Arguments
    ) -> tuple[Tensor, Tensor]:
        softmax_scale, causal, _schedule, sm_margin, window_left, window_right, softcap = arguments
        output = _forward_body(q, k, v, softmax_scale, causal, sm_margin, window_left, window_right, softcap)
        _save_for_backward(ctx, (q, k, v), arguments, output)
        return output

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        if torch.is_grad_enabled():
            return _eager_gradients_once_differentiable(ctx, grad_out, grad_lse)
        return _eager_gradients(ctx, grad_out, grad_lse)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    schedule: str,
    sm_margin: int,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """out, lse of torch.ops.dash_attn.forward(q, k, v, ...), differentiable as it is, bitwise the same. Where torch
    traces (see _traced) it is that op; in plain eager mode the op's body runs directly, under _EagerAttention when
    autograd records the call."""
    if _traced(q, k, v):
        return torch.ops.dash_attn.forward(
            q, k, v, softmax_scale, causal, schedule, sm_margin, window_left, window_right, softcap
        )
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(
            q, k, v, (softmax_scale, causal, schedule, sm_margin, window_left, window_right, softcap)
        )
    return _forward_body(q, k, v, softmax_scale, causal, sm_margin, window_left, window_right, softcap)
