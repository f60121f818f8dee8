"""The two paths of an attention call (_ops.attention): in plain eager mode the custom ops' bodies run directly,
under the torch.autograd.Function _EagerAttention when autograd records the call; wherever torch traces
(torch.compile, a dispatch mode such as FakeTensorMode or make_fx, functorch, jit.trace, forward-mode AD, a tensor
subclass) the call is the custom op dash_attn::forward, whose autograd formula calls dash_attn::backward.

Invariants these tests hold the paths to:
- Eager calls never dispatch the custom ops; compiled and traced calls always do (the compiled graph holds the op).
- Both paths share the autograd context: the LSE is non-differentiable (a loss through it is refused), no zero
  gradient is materialized for it, a missing gradient of `out` gives no gradients, a saved input or output
  modified in place makes the backward raise, and a double backward raises.
- On a GPU both paths give the same bits: out, LSE and gradients.

Without a GPU the eager path runs with the op bodies replaced by recorders (their outputs have the real metadata)
and the device check accepting CPU tensors; the custom-op path runs on meta tensors, where the ops run their fake
kernels. The GPU section skips, saying why, without a Hopper GPU, the library or a compiled kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from dash_attn import _arguments, _ops, flash_attn_func  # noqa: E402

BATCH, SEQLEN, HEADS, KV_HEADS, HEAD_DIM = 2, 16, 4, 2, 64


@dataclasses.dataclass
class Calls:
    """What the stand-ins saw: (path, arguments) in call order."""

    seen: list[tuple[str, tuple]] = dataclasses.field(default_factory=list)

    def paths(self) -> list[str]:
        return [path for path, _ in self.seen]


def _gradients_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Distinct, recognizable stand-in gradients."""
    return torch.full_like(q, 1.0), torch.full_like(k, 2.0), torch.full_like(v, 3.0)


@pytest.fixture
def cpu_bodies(monkeypatch) -> Calls:
    """The eager path on CPU: the device check accepts CPU tensors, and the op bodies and the ops themselves
    record their calls and return outputs of the real metadata."""
    calls = Calls()

    def check_devices_on_cpu(tensors, layout) -> None:
        assert all(t.device.type == "cpu" for t in tensors)

    def forward_body(q, k, v, softmax_scale, causal, schedule, sm_margin, window_left=-1, window_right=-1, softcap=0.0):
        assert (window_left, window_right, softcap) == (-1, -1, 0.0)
        calls.seen.append(("forward body", (q, k, v, softmax_scale, causal, sm_margin)))
        out, lse = _ops._forward_outputs(q)
        return out.copy_(q), lse.zero_()

    def backward_body(*args):
        calls.seen.append(("backward body", args))
        return _gradients_of(*args[1:4])

    def forward_op(*args):
        calls.seen.append(("forward op", args))
        raise AssertionError("an eager call dispatched dash_attn::forward")

    def backward_op(*args):
        calls.seen.append(("backward op", args))
        return _gradients_of(*args[1:4])

    monkeypatch.setattr(_arguments, "check_devices", check_devices_on_cpu)
    monkeypatch.setattr(_ops, "_forward_body", forward_body)
    monkeypatch.setattr(_ops, "_backward_body", backward_body)
    monkeypatch.setattr(torch.ops.dash_attn, "forward", forward_op)
    monkeypatch.setattr(torch.ops.dash_attn, "backward", backward_op)
    return calls


def bshd(heads: int = HEADS, requires_grad: bool = True, device: str = "cpu") -> torch.Tensor:
    t = torch.randn(BATCH, SEQLEN, heads, HEAD_DIM, device=device).to(torch.bfloat16)
    return t.requires_grad_(requires_grad)


def qkv(requires_grad: bool = True, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        bshd(HEADS, requires_grad, device),
        bshd(KV_HEADS, requires_grad, device),
        bshd(KV_HEADS, requires_grad, device),
    )


# --- without a GPU: which path runs ----------------------------------------------------------------------------


def test_an_eager_call_runs_the_op_bodies_under_the_autograd_function(cpu_bodies: Calls) -> None:
    q, k, v = qkv()
    out, lse = flash_attn_func(
        q, k, v, softmax_scale=0.3, causal=True, schedule="ascending", sm_margin=3, return_lse=True
    )
    assert cpu_bodies.paths() == ["forward body"]
    assert cpu_bodies.seen[0][1][3:] == (0.3, True, 3)
    assert type(out.grad_fn).__name__ == "_EagerAttentionBackward"

    dout = torch.randn_like(out)
    out.backward(dout)
    assert cpu_bodies.paths() == ["forward body", "backward body"]
    args = cpu_bodies.seen[1][1]
    assert args[0] is dout
    for saved, given in zip(args[1:6], (q, k, v, out, lse)):
        assert saved.data_ptr() == given.data_ptr() and saved.shape == given.shape
    assert args[6:] == (0.3, True, "ascending", 3, -1, -1, 0.0)
    for grad, expected in zip((q.grad, k.grad, v.grad), _gradients_of(q, k, v)):
        assert torch.equal(grad, expected)


@pytest.mark.parametrize("recording", ["no_grad", "inference_mode", "inputs_without_grad"])
def test_a_call_autograd_does_not_record_runs_the_forward_body_alone(cpu_bodies: Calls, recording: str) -> None:
    q, k, v = qkv(requires_grad=recording != "inputs_without_grad")
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(recording, torch.enable_grad)
    with context():
        out = flash_attn_func(q, k, v, causal=True)
    assert cpu_bodies.paths() == ["forward body"]
    assert out.grad_fn is None and not out.requires_grad


def _meta_qkv() -> tuple[torch.Tensor, ...]:
    return tuple(t.to("meta").detach().requires_grad_() for t in qkv(requires_grad=False))


def test_a_compiled_call_records_the_custom_op_and_never_runs_the_eager_path(monkeypatch) -> None:
    """Meta tensors: Dynamo traces the entry point (is_compiling() alone must pick the op, since nothing else
    traces), and the compiled graph runs the op's fake kernels, forward and backward."""
    eager_calls = []
    monkeypatch.setattr(_arguments, "check_devices", lambda tensors, layout: None)
    monkeypatch.setattr(_ops, "_forward_body", lambda *args: eager_calls.append(args))
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    compiled = torch.compile(
        lambda q, k, v: flash_attn_func(q, k, v, causal=True), backend=recording_backend, fullgraph=True
    )
    q, k, v = _meta_qkv()
    out = compiled(q, k, v)
    out.backward(torch.ones_like(out))
    torch._dynamo.reset()

    (graph,) = graphs
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert torch.ops.dash_attn.forward.default in targets or torch.ops.dash_attn.forward in targets, targets
    assert not eager_calls
    assert q.grad is not None and q.grad.shape == q.shape


def _in_fake_tensor_mode(probe: Callable[[torch.Tensor], bool]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return probe(torch.zeros(2))


def _under_make_fx(probe: Callable[[torch.Tensor], bool]) -> bool:
    from torch.fx.experimental.proxy_tensor import make_fx

    seen = []
    make_fx(lambda t: seen.append(probe(t)) or t + 1)(torch.zeros(2))
    return seen[0]


def _under_vmap(probe: Callable[[torch.Tensor], bool]) -> bool:
    seen = []
    torch.vmap(lambda t: seen.append(probe(t)) or t + 1)(torch.zeros(3, 2))
    return seen[0]


def _under_jit_trace(probe: Callable[[torch.Tensor], bool]) -> bool:
    seen = []
    torch.jit.trace(lambda t: seen.append(probe(t)) or t + 1, (torch.zeros(2),), check_trace=False)
    return seen[0]


def _under_forward_ad(probe: Callable[[torch.Tensor], bool]) -> bool:
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        return probe(fwAD.make_dual(torch.zeros(2), torch.ones(2)))


class _Subclass(torch.Tensor):
    pass


TRACING_CONTEXTS: dict[str, Callable[[Callable[[torch.Tensor], bool]], bool]] = {
    "FakeTensorMode": _in_fake_tensor_mode,
    "make_fx": _under_make_fx,
    "vmap": _under_vmap,
    "jit.trace": _under_jit_trace,
    "forward-AD": _under_forward_ad,
    "tensor-subclass": lambda probe: probe(torch.zeros(2).as_subclass(_Subclass)),
}


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")
@pytest.mark.parametrize("context", TRACING_CONTEXTS.values(), ids=TRACING_CONTEXTS.keys())
def test_every_tracing_context_takes_the_custom_op(context) -> None:
    assert context(lambda t: _ops._traced(t, t, t)) is True


def test_plain_eager_tensors_take_the_eager_path() -> None:
    t = torch.zeros(2, requires_grad=True)
    assert _ops._traced(t, t, t) is False
    with torch.no_grad():
        assert _ops._traced(t, t, t) is False


def test_dynamo_folds_the_path_choice_to_the_custom_op_without_a_graph_break() -> None:
    torch._dynamo.reset()
    choose = torch.compile(lambda t: t + 1 if _ops._traced(t) else t - 1, backend="eager", fullgraph=True)
    assert torch.equal(choose(torch.zeros(2)), torch.ones(2))
    torch._dynamo.reset()


# --- without a GPU: the autograd context both paths share ----------------------------------------------------


class _ZeroFills(TorchDispatchMode):
    """Records every aten op that makes or fills zeros: what materializing a missing gradient runs."""

    ZERO_OPS = ("aten.zeros", "aten.zeros_like", "aten.new_zeros", "aten.zero_", "aten.fill_")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func.overloadpacket) in self.ZERO_OPS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_eager_path_materializes_no_gradient_for_the_lse(cpu_bodies: Calls, monkeypatch) -> None:
    grads_of_lse = []
    eager_gradients = _ops._eager_gradients

    def recording(ctx, grad_out, grad_lse):
        grads_of_lse.append(grad_lse)
        return eager_gradients(ctx, grad_out, grad_lse)

    monkeypatch.setattr(_ops, "_eager_gradients", recording)
    q, k, v = qkv()
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    out.backward(torch.ones_like(out))
    assert grads_of_lse == [None]


def test_the_custom_op_materializes_no_gradient_for_the_lse() -> None:
    q, k, v = _meta_qkv()
    out, _ = torch.ops.dash_attn.forward(q, k, v, HEAD_DIM**-0.5, True, "auto", 0)
    dout = torch.ones_like(out)
    with _ZeroFills() as zero_fills:
        out.backward(dout)
    assert zero_fills.seen == []
    assert q.grad is not None


def test_a_missing_gradient_of_out_gives_no_gradients() -> None:
    def never(*args):
        raise AssertionError("the backward ran without a gradient of out")

    assert _ops._gradients(object(), None, never) == (None,) * 3


def test_a_loss_of_out_and_lse_differentiates_out_only(cpu_bodies: Calls) -> None:
    q, k, v = qkv()
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    (out.float().sum() + lse.sum()).backward()
    assert cpu_bodies.paths() == ["forward body", "backward body"]
    assert torch.equal(q.grad, _gradients_of(q, k, v)[0])


def test_the_lse_is_not_differentiable_on_the_eager_path(cpu_bodies: Calls) -> None:
    q, k, v = qkv()
    _, lse = flash_attn_func(q, k, v, return_lse=True)
    assert not lse.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        lse.sum().backward()


def test_the_lse_is_not_differentiable_through_the_custom_op() -> None:
    q, k, v = _meta_qkv()
    _, lse = torch.ops.dash_attn.forward(q, k, v, HEAD_DIM**-0.5, True, "auto", 0)
    assert not lse.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        lse.sum().backward()


@pytest.mark.parametrize("modified", ["q", "out"])
def test_a_saved_tensor_modified_in_place_makes_the_eager_backward_raise(cpu_bodies: Calls, modified: str) -> None:
    leaves = qkv()
    q, k, v = (t * 1 for t in leaves)  # not leaves, so they can be modified in place
    out = flash_attn_func(q, k, v)
    loss = out.float().sum()
    with torch.no_grad():
        {"q": q, "out": out}[modified].add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_double_backward_of_the_eager_path_raises(cpu_bodies: Calls) -> None:
    q, k, v = qkv()
    out = flash_attn_func(q, k, v)
    dout = torch.randn_like(out).requires_grad_()
    dq, _, _ = torch.autograd.grad(out, (q, k, v), dout, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.float().sum().backward()


# --- on a Hopper GPU: the two paths give the same bits --------------------------------------------------------


class _PassThrough(TorchDispatchMode):
    """Runs every op as it is. While it is active a call is traced (a dispatch mode is on), so attention takes
    the custom ops, forward and backward, on the real kernels."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@dataclasses.dataclass(frozen=True)
class GpuCase:
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: torch.dtype
    causal: bool
    schedule: str = "auto"
    sm_margin: int = 0
    strided: bool = False  # q, k, v as views the kernels cannot read in place (see _views)

    @property
    def id(self) -> str:
        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]
        return (
            f"Hq{self.heads_q}-Hkv{self.heads_kv}-Sq{self.seqlen_q}-Sk{self.seqlen_k}-D{self.head_dim}-{dtype}"
            f"-{'causal' if self.causal else 'full'}-{self.schedule}-margin{self.sm_margin}"
            + ("-strided" if self.strided else "")
        )


GPU_CASES = [
    GpuCase(1, 1, 128, 128, 64, torch.bfloat16, True),
    GpuCase(4, 2, 200, 328, 128, torch.bfloat16, True, schedule="ascending", sm_margin=8),
    GpuCase(4, 4, 256, 256, 64, torch.float16, False, schedule="shortest-first"),
    GpuCase(8, 2, 96, 160, 128, torch.bfloat16, False, strided=True),
]


def _gpu_inputs(case: GpuCase, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v and dout, N(0, 1) rounded to the case's dtype; when case.strided, q, k and v are each the first
    head_dim of a tensor one element wider (see _views)."""
    generator = torch.Generator(device).manual_seed(seed)
    pad = 1 if case.strided else 0

    def draw(seqlen: int, heads: int, pad: int) -> torch.Tensor:
        return torch.randn(2, seqlen, heads, case.head_dim + pad, generator=generator, device=device).to(case.dtype)

    q = draw(case.seqlen_q, case.heads_q, pad)
    k, v = draw(case.seqlen_k, case.heads_kv, pad), draw(case.seqlen_k, case.heads_kv, pad)
    return q, k, v, draw(case.seqlen_q, case.heads_q, 0)


def _views(case: GpuCase, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The attention inputs of _gpu_inputs' tensors: views with an odd row stride when case.strided, which the
    kernels cannot read in place, so both paths copy them."""
    return tuple(t[..., : case.head_dim] for t in tensors)


def _step(case: GpuCase, inputs: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], str]:
    """out, lse and the gradients of one forward and backward on fresh leaves, and the name of out's grad_fn."""
    q, k, v, dout = inputs
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = flash_attn_func(
        *_views(case, leaves), causal=case.causal, schedule=case.schedule, sm_margin=case.sm_margin, return_lse=True
    )
    out.backward(dout)
    return (out.detach(), lse, *(t.grad for t in leaves)), type(out.grad_fn).__name__


@pytest.mark.parametrize("case", GPU_CASES, ids=[case.id for case in GPU_CASES])
def test_the_eager_path_gives_the_custom_ops_bits(device, require_kernel, case: GpuCase) -> None:
    require_kernel(case.head_dim, case.dtype)
    inputs = _gpu_inputs(case, device, seed=11)
    eager, eager_node = _step(case, inputs)
    with _PassThrough():
        through_ops, op_node = _step(case, inputs)
    assert eager_node == "_EagerAttentionBackward" and eager_node != op_node, (eager_node, op_node)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), eager, through_ops, strict=True):
        assert torch.equal(a, b), f"{name} differs between the eager path and the custom ops"


@pytest.mark.parametrize("path", ["eager", "custom-op"])
def test_q_modified_in_place_after_the_forward_makes_the_backward_raise(device, require_kernel, path: str) -> None:
    require_kernel(64, torch.bfloat16)
    case = GPU_CASES[0]
    leaves = tuple(t.requires_grad_() for t in _gpu_inputs(case, device, seed=12)[:3])
    q, k, v = (t * 1 for t in leaves)  # not leaves, so q can be modified in place
    mode = _PassThrough() if path == "custom-op" else torch.enable_grad()
    with mode:
        out = flash_attn_func(q, k, v, causal=True)
        with torch.no_grad():
            q.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.float().sum().backward()


def test_a_call_on_a_device_that_is_not_current_gives_its_bits(device, require_kernel) -> None:
    """The ops make the tensors' device current only when it is not; with two GPUs, a call on the second one
    while the first is current gives the bits of the same call with the second current."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    require_kernel(64, torch.bfloat16)
    case = GPU_CASES[0]
    other = torch.device("cuda", (device.index + 1) % torch.cuda.device_count())
    inputs = _gpu_inputs(case, other, seed=13)
    with torch.cuda.device(other):
        expected, _ = _step(case, inputs)
    with torch.cuda.device(device):
        got, _ = _step(case, inputs)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, expected, strict=True):
        assert torch.equal(a, b), f"{name} differs with another device current"


def test_the_first_backward_of_a_process_runs_on_the_autograd_thread(device, require_kernel, fresh_interpreter) -> None:
    """In a fresh interpreter, the first backward runs on torch's autograd device thread, where no CUDA context
    is current until something binds it. The library binds it (cudaSetDevice) before encoding TMA descriptors;
    without that, the driver refused the encoding (CUDA_ERROR_INVALID_CONTEXT) and the kernel ran on a garbage
    descriptor (an illegal instruction). In this process earlier tests have bound the thread, hence the subprocess."""
    require_kernel(64, torch.bfloat16)
    program = (
        "import torch, dash_attn\n"
        "q, k, v = (torch.randn(2, 300, 4, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True)"
        " for _ in range(3))\n"
        "dash_attn.flash_attn_func(q, k, v, causal=True).float().sum().backward()\n"
        "torch.cuda.synchronize()\n"
        "assert all(torch.isfinite(t.grad.float()).all() and t.grad.abs().sum() > 0 for t in (q, k, v))\n"
        "print('ok')\n"
    )
    result = fresh_interpreter(program, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
