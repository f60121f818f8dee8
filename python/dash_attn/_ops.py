"""The torch.library custom ops dash_attn::forward and dash_attn::backward, with fake kernels and autograd.

Custom ops (not a torch.autograd.Function) keep the C library opaque to torch.compile: Dynamo records one
node per call instead of tracing into ctypes, the fake kernels give it the output metadata, and the
autograd formula wires the backward op in. Both ops take (B, S, H, D) tensors that passed the checks in
_arguments.py; they fix only what the kernels cannot take but a caller may legitimately pass (odd strides,
misaligned views, broadcast gradients) by copying. The backward runs the plan of its device, shape, schedule and
SM margin from _plans, so a training loop plans and proves each shape once. In front of that cache, each distinct
call shape builds its C struct once and asks the loaded library for the forward's workspace size once (bounded
LRU caches of the plan cache's capacity; a refusal caches nothing), since every call of a loop repeats them. sm_margin (SMs left to other work,
as in FlashAttention-3) is an input of the forward op, so that autograd hands the backward the same margin.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from . import _library, _plans

# TMA needs 16-byte aligned addresses and strides that are multiples of 16 bytes: 8 two-byte elements,
# and below 2^40 bytes (src/api/limits.hpp), even for a dimension of one index.
_TMA_ALIGNMENT_BYTES = 16
_ELEMENT_BYTES = 2
_STRIDE_MULTIPLE = _TMA_ALIGNMENT_BYTES // _ELEMENT_BYTES
_STRIDE_LIMIT = (1 << 40) // _ELEMENT_BYTES

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


def _layout_ok(t: Tensor) -> bool:
    """Whether the kernels can read or write `t` in place: the rules of validate() in src/api/validate.cpp.

    It runs on every tensor of every call, so the one-to-one test first walks the dimensions innermost first,
    which is the stride order of any row-major layout (packed or not) and decides it without sorting; a
    permuted layout falls back to the sorted test, which gives the same answer whenever both apply."""
    strides = t.stride()
    if t.data_ptr() % _TMA_ALIGNMENT_BYTES or strides[-1] != 1:
        return False
    for stride in strides[:-1]:
        if stride < 0 or stride % _STRIDE_MULTIPLE or stride >= _STRIDE_LIMIT:
            return False
    shape = t.shape
    reach = 1
    for stride, size in zip(reversed(strides), reversed(shape)):
        if size > 1:
            if stride < reach:
                return _one_to_one(strides, shape)
            reach = stride * size
    return True


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


@torch.library.custom_op("dash_attn::forward", mutates_args=(), device_types="cuda")
def forward(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, schedule: str, sm_margin: int = 0
) -> tuple[Tensor, Tensor]:
    """out, lse = attention(q, k, v), leaving `sm_margin` SMs to other work. `schedule` is not used here: it is
    an input so that autograd records the summation order the backward must use."""
    q, k, v = (_kernel_ready(t) for t in (q, k, v))
    out, lse = _forward_outputs(q)
    shape, shape_fields = _shared_c_shape(q, k, softmax_scale, causal)
    with torch.cuda.device(q.device):
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
            torch.cuda.current_stream(q.device).cuda_stream,
            sm_margin,
        )
    return out, lse


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
    dout, q, k, v, out = (_kernel_ready(t) for t in (dout, q, k, v, out))
    lse = lse.contiguous()
    dq, dk, dv = _backward_outputs(q, k, v)
    shape, shape_fields = _shared_c_shape(q, k, softmax_scale, causal)
    with torch.cuda.device(q.device):
        # Planned and proven once per (device, shape, schedule, margin); the plan sizes the workspace and runs.
        plan = _plans.backward_plan_of_fields(q.device.index, shape_fields, schedule, sm_margin)
        workspace = _workspace(plan.workspace_bytes, q.device)
        plan.backward(
            shape,
            *(_c_tensor(t) for t in (q, k, v, out, dout)),
            lse.data_ptr(),
            *(_c_tensor(t) for t in (dq, dk, dv)),
            workspace.data_ptr(),
            plan.workspace_bytes,
            torch.cuda.current_stream(q.device).cuda_stream,
        )
    return dq, dk, dv


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


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
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


def _backward_formula(
    ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor, grad_lse: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, None, None, None, None]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.dash_attn.backward(
        grad_out, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.schedule, ctx.sm_margin
    )
    return dq, dk, dv, None, None, None, None


forward.register_autograd(_backward_formula, setup_context=_setup_context)
