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
proves each shape once. In front of that cache, each distinct call shape builds its C struct once and asks the
loaded library for the forward's workspace size once, and each (shape, strides) pair has its layout judged once
(bounded LRU caches; a refusal caches nothing), since every call of a loop repeats them. The launches run on
torch's current stream of the tensors' device, made current only when it is not. sm_margin (SMs left to other
work, as in FlashAttention-3) is an input of the forward op, so that autograd hands the backward the same margin.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
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


def _c_tensor(t: Tensor) -> _library.Tensor:
    c = _library.Tensor()
    c.data = t.data_ptr()
    c.strides[:] = t.stride()
    return c


def _make_c_shape(
    q_shape: torch.Size, k_shape: torch.Size, dtype: torch.dtype, softmax_scale: float, causal: bool
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
    )


def _c_shape(q: Tensor, k: Tensor, softmax_scale: float, causal: bool) -> _library.Shape:
    """A new C shape of a call, the caller's own."""
    return _make_c_shape(q.shape, k.shape, q.dtype, softmax_scale, causal)


# A training loop repeats a handful of shapes, so the ops build each once; as many are kept as backward plans.
@functools.lru_cache(maxsize=_plans.PLAN_CACHE_CAPACITY)
def _cached_c_shape(
    q_shape: torch.Size, k_shape: torch.Size, dtype: torch.dtype, softmax_scale: float, causal: bool
) -> tuple[_library.Shape, tuple]:
    shape = _make_c_shape(q_shape, k_shape, dtype, softmax_scale, causal)
    return shape, _plans.shape_fields(shape)


def _shared_c_shape(q: Tensor, k: Tensor, softmax_scale: float, causal: bool) -> tuple[_library.Shape, tuple]:
    """The C shape of a call, shared by all calls with the same arguments (the library only reads it: never
    modify it), and its fields as the library reads them, which key the backward plan. Only a positive scale
    keys the cache: positive floats are equal exactly when their bits are, where 0.0 == -0.0 and nan != nan;
    the library refuses the others."""
    if softmax_scale > 0:
        return _cached_c_shape(q.shape, k.shape, q.dtype, softmax_scale, causal)
    shape = _c_shape(q, k, softmax_scale, causal)
    return shape, _plans.shape_fields(shape)


@functools.lru_cache(maxsize=_plans.PLAN_CACHE_CAPACITY)
def _forward_workspace_bytes(library: ctypes.CDLL, shape_fields: tuple) -> int:
    """The forward's workspace size for a shape, queried once per loaded library (the key holds it, so a library
    loaded anew is asked again). A refused shape raises and caches nothing."""
    return _library.forward_workspace_size(_library.Shape(*shape_fields))


def _workspace(nbytes: int, device: torch.device) -> Tensor:
    """Scratch memory from torch's caching allocator, whose blocks are aligned far beyond the 256 bytes needed."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _packed_like(t: Tensor) -> Tensor:
    """A packed (row-major) uninitialized tensor of `t`'s shape, dtype and device. empty_like parses one tensor
    where torch.empty(shape, dtype=, device=) parses three arguments: half the host time, on every output."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _forward_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    """Packed (B, Sq, Hq, D) output and (B, Hq, Sq) fp32 LSE; the fake kernel uses it too, so metadata agree."""
    batch, seqlen_q, heads_q, _ = q.shape
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    return _packed_like(q), lse


def _backward_outputs(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return _packed_like(q), _packed_like(k), _packed_like(v)


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
    shape: _library.Shape,
    shape_fields: tuple,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    sm_margin: int,
) -> None:
    workspace_bytes = _forward_workspace_bytes(_library.load(), shape_fields)
    workspace = _workspace(workspace_bytes, q.device)
    _library.forward(
        shape,
        _c_tensor(q),
        _c_tensor(k),
        _c_tensor(v),
        _c_tensor(out),
        lse.data_ptr(),
        workspace.data_ptr(),
        workspace_bytes,
        torch._C._cuda_getCurrentRawStream(index),
        sm_margin,
    )


def _forward_body(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, sm_margin: int
) -> tuple[Tensor, Tensor]:
    """What the forward op runs, and the eager path too: out, lse on the current stream of q's device."""
    q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
    out, lse = _forward_outputs(q)
    shape, shape_fields = _shared_c_shape(q, k, softmax_scale, causal)
    index = q.get_device()
    _on_device(index, _launch_forward, index, shape, shape_fields, q, k, v, out, lse, sm_margin)
    return out, lse


def _launch_backward(
    index: int, shape: _library.Shape, shape_fields: tuple, schedule: str, sm_margin: int, tensors: tuple[Tensor, ...]
) -> None:
    dout, q, k, v, out, lse, dq, dk, dv = tensors
    # Planned and proven once per (device, shape, schedule, margin); the plan sizes the workspace and runs.
    plan = _plans.backward_plan_of_fields(index, shape_fields, schedule, sm_margin)
    workspace = _workspace(plan.workspace_bytes, q.device)
    plan.backward(
        shape,
        _c_tensor(q),
        _c_tensor(k),
        _c_tensor(v),
        _c_tensor(out),
        _c_tensor(dout),
        lse.data_ptr(),
        _c_tensor(dq),
        _c_tensor(dk),
        _c_tensor(dv),
        workspace.data_ptr(),
        plan.workspace_bytes,
        torch._C._cuda_getCurrentRawStream(index),
    )


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
) -> tuple[Tensor, Tensor, Tensor]:
    """What the backward op runs, and the eager path too: dq, dk, dv on the current stream of q's device."""
    dout, q, k, v, out = _kernel_ready(dout), _kernel_ready(q), _kernel_ready(k), _kernel_ready(v), _kernel_ready(out)
    lse = lse.contiguous()
    dq, dk, dv = _backward_outputs(q, k, v)
    shape, shape_fields = _shared_c_shape(q, k, softmax_scale, causal)
    index = q.get_device()
    tensors = (dout, q, k, v, out, lse, dq, dk, dv)
    _on_device(index, _launch_backward, index, shape, shape_fields, schedule, sm_margin, tensors)
    return dq, dk, dv


@torch.library.custom_op("dash_attn::forward", mutates_args=(), device_types="cuda")
def forward(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, schedule: str, sm_margin: int = 0
) -> tuple[Tensor, Tensor]:
    """out, lse = attention(q, k, v), leaving `sm_margin` SMs to other work. `schedule` is not used here: it is
    an input so that autograd records the summation order the backward must use."""
    return _forward_body(q, k, v, softmax_scale, causal, sm_margin)


@forward.register_fake
def _forward_fake(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, schedule: str, sm_margin: int = 0
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
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of attention for upstream gradient `dout`, dQ summed in the order `schedule` fixes as planned
    for the device's SMs less `sm_margin`."""
    return _backward_body(dout, q, k, v, out, lse, softmax_scale, causal, schedule, sm_margin)


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
) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_outputs(q, k, v)


def _traced(*tensors: Tensor) -> bool:
    """Whether torch must see this call as the custom op rather than run the op's body directly: under
    torch.compile or export (Dynamo folds is_compiling() to True and stops there, so it never meets the queries
    after it), under any torch dispatch mode (FakeTensorMode, make_fx's proxy mode, functionalization,
    FlopCounterMode, ...), a functorch transform (vmap, grad), torch.jit.trace, forward-mode AD (the op refuses
    dual tensors rather than drop their tangents), or with a tensor subclass (FakeTensor, DTensor, ...) that
    must see the op through its __torch_dispatch__. Each query costs tens of nanoseconds."""
    return (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack() > 0
        or torch._C._are_functorch_transforms_active()
        or torch._C._get_tracing_state() is not None
        or torch.autograd.forward_ad._current_level >= 0
        or any(type(t) is not Tensor for t in tensors)
    )


def _save_for_backward(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    """The autograd context of both paths: the inputs and outputs (save_for_backward, so an input modified in
    place before the backward makes it raise), the arguments the backward repeats, and no gradient for the LSE."""
    q, k, v, softmax_scale, causal, schedule, sm_margin = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.schedule = schedule
    ctx.sm_margin = sm_margin
    # The backward does not differentiate through the LSE; marking it keeps a loss that uses it from
    # silently getting a wrong gradient.
    ctx.mark_non_differentiable(lse)
    # The LSE never has a gradient, and autograd would otherwise fill a zero tensor for it (a kernel launch) at
    # every backward; a gradient of `out` that is missing (None) means no gradient at all.
    ctx.set_materialize_grads(False)


def _gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, run_backward: Callable[..., tuple]
) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None, None]:
    """The backward formula of both paths around `run_backward`, which has the backward op's signature."""
    if grad_out is None:
        return None, None, None, None, None, None, None
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = run_backward(grad_out, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.schedule, ctx.sm_margin)
    return dq, dk, dv, None, None, None, None


def _op_gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None, None]:
    """The forward op's autograd formula: the backward op, whatever the tensors (meta ones run its fake kernel)."""
    return _gradients(ctx, grad_out, torch.ops.dash_attn.backward)


forward.register_autograd(_op_gradients, setup_context=_save_for_backward)


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
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of torch.ops.dash_attn.backward, bitwise the same: that op where torch traces (also a backward
    traced though its forward ran eagerly: compiled autograd, a dispatch mode around .backward()), its body
    directly otherwise. The eager path's backward and dash_attn.attention_backward both run it."""
    if _traced(dout, q, k, v, out, lse):
        return torch.ops.dash_attn.backward(dout, q, k, v, out, lse, softmax_scale, causal, schedule, sm_margin)
    return _backward_body(dout, q, k, v, out, lse, softmax_scale, causal, schedule, sm_margin)


def _eager_gradients(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None, None]:
    return _gradients(ctx, grad_out, attention_backward)


# A double backward of the eager path raises when it runs, as through the backward op, which has no autograd
# formula; only a backward with create_graph=True (grad mode on) needs the wrapper that arranges it.
_eager_gradients_once_differentiable = torch.autograd.function.once_differentiable(_eager_gradients)


class _EagerAttention(torch.autograd.Function):
    """The custom ops' autograd formula as a torch.autograd.Function over their bodies: the same kernels, plans
    and saved tensors without the custom-op dispatch, which costs more host time than the kernels' launches on
    small shapes."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        softmax_scale: float,
        causal: bool,
        schedule: str,
        sm_margin: int,
    ) -> tuple[Tensor, Tensor]:
        output = _forward_body(q, k, v, softmax_scale, causal, sm_margin)
        _save_for_backward(ctx, (q, k, v, softmax_scale, causal, schedule, sm_margin), output)
        return output

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor | None, grad_lse: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None, None]:
        if torch.is_grad_enabled():
            return _eager_gradients_once_differentiable(ctx, grad_out, grad_lse)
        return _eager_gradients(ctx, grad_out, grad_lse)


def attention(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, schedule: str, sm_margin: int
) -> tuple[Tensor, Tensor]:
    """out, lse of torch.ops.dash_attn.forward(q, k, v, ...), differentiable as it is, bitwise the same. Where torch
    traces (see _traced) it is that op; in plain eager mode the op's body runs directly, under _EagerAttention when
    autograd records the call."""
    if _traced(q, k, v):
        return torch.ops.dash_attn.forward(q, k, v, softmax_scale, causal, schedule, sm_margin)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(q, k, v, softmax_scale, causal, schedule, sm_margin)
    return _forward_body(q, k, v, softmax_scale, causal, sm_margin)

