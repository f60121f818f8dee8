"""torch.ops.dash_attn.forward and backward under the ways PyTorch runs work besides the plain eager call: a
non-default stream, CUDA graph capture and replay, torch.library.opcheck's registration checks, and
torch.compile(mode="reduce-overhead"), which replays the compiled forward and backward as CUDA graphs.

Invariants these tests hold the ops to:
- The ops launch on torch's current stream, and only there: on a side stream they give the default stream's bits.
- Forward+backward can be captured into a CUDA graph in "global" capture mode, which refuses a stream or device
  synchronisation, a blocking device-to-host copy and a raw cudaMalloc/cudaFree from any thread while the capture
  runs: the workspaces come from torch's caching allocator and the ops never wait on the GPU. Each replay on new
  values copied into the static inputs gives the bits of an eager call on those values, for every deterministic
  schedule.
- opcheck finds the schema, the fake kernels, the autograd registration and AOTAutograd's dynamic-shape tracing
  consistent with the real ops.
- The entry point traces into one graph (no graph break) with torch's determinism switch off or on: the front
  folds its argument checks and the switch away while tracing, so none is expected. Compiled with
  mode="reduce-overhead" and fullgraph=True, forward and backward give eager's bits and Inductor skips no CUDA
  graph.
- The fake kernels give packed (contiguous) outputs: out of q's shape and dtype, an fp32 LSE (batch, heads_q,
  seqlen_q), and dq, dk, dv of q's, k's and v's shapes, whatever the inputs' strides.

The first section needs no GPU: fake and meta tensors run the fake kernels, so it checks the output metadata,
symbolic-shape tracing of forward and backward, opcheck on meta tensors (dense and varlen calls), and Dynamo's
graph count. The GPU
section skips, saying why, without a Hopper GPU, the library or a compiled kernel (conftest.py's fixtures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from torch._dynamo.utils import counters  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import dash_attn  # noqa: E402
from dash_attn import flash_attn_func  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention problem: sizes, head dim, dtype and mask. `bhsd` makes q, k and v transposed views of
    (batch, heads, seqlen, head_dim) tensors, as the SDPA entry point hands them to the op."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    causal: bool
    bhsd: bool = False

    @property
    def id(self) -> str:
        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]
        mask = "causal" if self.causal else "full"
        layout = "-bhsd" if self.bhsd else ""
        return (
            f"B{self.batch}-Sq{self.seqlen_q}-Sk{self.seqlen_k}-Hq{self.heads_q}-Hkv{self.heads_kv}"
            f"-D{self.head_dim}-{dtype}-{mask}{layout}"
        )

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


def case_ids(cases: list[Case]) -> list[str]:
    return [case.id for case in cases]


def bshd(case: Case, seqlen: int, heads: int, make: Callable[..., torch.Tensor]) -> torch.Tensor:
    """A (batch, seqlen, heads, head_dim) tensor made by `make(*sizes)`, a transposed view when case.bhsd."""
    if case.bhsd:
        return make(case.batch, heads, seqlen, case.head_dim).transpose(1, 2)
    return make(case.batch, seqlen, heads, case.head_dim)


def packed_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def assert_packed(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, what: str) -> None:
    got = (tuple(t.shape), t.dtype, t.stride(), t.device)
    assert got == (shape, dtype, packed_strides(shape), device), f"{what}: (shape, dtype, strides, device) = {got}"


# --- without a GPU: fake kernels, symbolic tracing, opcheck on meta tensors, Dynamo's graph count --------------


@pytest.fixture
def fake_cuda() -> Iterator[None]:
    """Runs the test under FakeTensorMode, where CUDA tensors can be made without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        try:
            torch.empty(1, device="cuda")
        except (RuntimeError, AssertionError) as error:
            pytest.skip(f"this torch build cannot make fake CUDA tensors: {error}")
        yield


FAKE_CASES = [
    Case(1, 1, 1, 1, 1, 64, torch.bfloat16, False),
    Case(2, 128, 128, 4, 4, 64, torch.float16, True),
    Case(3, 77, 300, 8, 2, 128, torch.bfloat16, True),
    Case(2, 300, 77, 6, 1, 128, torch.float16, False),
    Case(1, 513, 1031, 8, 2, 64, torch.bfloat16, False, bhsd=True),
    Case(2, 200, 200, 4, 2, 128, torch.float16, True, bhsd=True),
]


@pytest.mark.parametrize("case", FAKE_CASES, ids=case_ids(FAKE_CASES))
def test_fake_kernels_give_packed_outputs_of_the_input_shapes(fake_cuda, case: Case) -> None:
    def empty(*sizes: int) -> torch.Tensor:
        return torch.empty(*sizes, dtype=case.dtype, device="cuda")

    q = bshd(case, case.seqlen_q, case.heads_q, empty)
    k, v = (bshd(case, case.seqlen_k, case.heads_kv, empty) for _ in range(2))
    out, lse = torch.ops.dash_attn.forward(q, k, v, case.scale, case.causal, "auto", 0)
    assert_packed(out, tuple(q.shape), case.dtype, q.device, "out")
    assert_packed(lse, (case.batch, case.heads_q, case.seqlen_q), torch.float32, q.device, "lse")

    dout = bshd(case, case.seqlen_q, case.heads_q, empty)
    dq, dk, dv = torch.ops.dash_attn.backward(dout, q, k, v, out, lse, case.scale, case.causal, "auto", 0)
    for name, grad, t in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        assert_packed(grad, tuple(t.shape), case.dtype, t.device, name)


def test_symbolic_trace_of_forward_and_backward_keeps_the_input_sizes() -> None:
    """make_fx with symbolic shapes (what dynamic-shape compilation sees) through the autograd formula: the
    backward op is wired to the forward's saved tensors, and every output size is an input's size symbol. The
    sizes are distinct so that no two share a symbol."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = 3, 40, 56, 6, 2, 64

    def meta(*sizes: int, grad: bool) -> torch.Tensor:
        return torch.zeros(*sizes, dtype=torch.bfloat16, device="meta").requires_grad_(grad)

    def forward_backward(q, k, v, dout):
        out, lse = torch.ops.dash_attn.forward(q, k, v, head_dim**-0.5, True, "auto", 0)
        return (out, lse, *torch.autograd.grad(out, (q, k, v), dout))

    q = meta(batch, seqlen_q, heads_q, head_dim, grad=True)
    k, v = (meta(batch, seqlen_k, heads_kv, head_dim, grad=True) for _ in range(2))
    dout = meta(batch, seqlen_q, heads_q, head_dim, grad=False)
    graph = make_fx(forward_backward, tracing_mode="symbolic")(q, k, v, dout)

    placeholders = [node.meta["val"] for node in graph.graph.nodes if node.op == "placeholder"]
    sym_q, sym_k, sym_v, _ = (tuple(str(size) for size in t.shape) for t in placeholders)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.dash_attn.forward.default) == 1
    assert targets.count(torch.ops.dash_attn.backward.default) == 1
    (outputs,) = [node.args[0] for node in graph.graph.nodes if node.op == "output"]
    out, lse, dq, dk, dv = (tuple(str(size) for size in node.meta["val"].shape) for node in outputs)
    assert len(set(sym_q) | set(sym_k)) == 6, f"sizes should be six distinct symbols: {sym_q}, {sym_k}"
    assert out == sym_q and dq == sym_q and dk == sym_k and dv == sym_v
    assert lse == (sym_q[0], sym_q[2], sym_q[1])


def meta_inputs(case: Case, requires_grad: bool) -> tuple[torch.Tensor, ...]:
    def empty(*sizes: int) -> torch.Tensor:
        return torch.empty(*sizes, dtype=case.dtype, device="meta")

    q = bshd(case, case.seqlen_q, case.heads_q, empty)
    k, v = (bshd(case, case.seqlen_k, case.heads_kv, empty) for _ in range(2))
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


OPCHECK_META_CASES = [FAKE_CASES[1], FAKE_CASES[2], FAKE_CASES[5]]


@pytest.mark.parametrize("case", OPCHECK_META_CASES, ids=case_ids(OPCHECK_META_CASES))
def test_opcheck_on_meta_tensors(case: Case) -> None:
    """On meta tensors both ops dispatch to their fake kernels, so this checks the schema against what the fake
    kernels return (fresh tensors, no aliasing), the autograd registration, and AOTAutograd's dynamic-shape trace
    of forward and backward; test_faketensor compares the fake kernel with itself here. The GPU opcheck below
    runs the same utilities against the real kernels."""
    q, k, v = meta_inputs(case, requires_grad=True)
    torch.library.opcheck(torch.ops.dash_attn.forward.default, (q, k, v, case.scale, case.causal, "auto", 0))
    with torch.no_grad():
        out, lse = torch.ops.dash_attn.forward(q, k, v, case.scale, case.causal, "auto", 0)
    q, k, v = (t.detach() for t in (q, k, v))
    dout = torch.empty_like(out)
    torch.library.opcheck(
        torch.ops.dash_attn.backward.default, (dout, q, k, v, out, lse, case.scale, case.causal, "auto", 0)
    )


@pytest.mark.parametrize("promise", [False, True])
def test_opcheck_of_a_varlen_call_on_meta_tensors(promise: bool) -> None:
    """The same ops with the varlen arguments (packed (total, heads, head_dim) tensors, int32 offsets): the fake
    kernels give the packed output, the (heads_q, total_q) LSE and the gradients of the packed inputs, and the
    autograd registration hands the offsets, maxima and promise to the backward op."""

    def empty(*sizes: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty(*sizes, dtype=dtype, device="meta")

    q, k, v = empty(300, 8, 64).requires_grad_(), empty(77, 2, 64).requires_grad_(), empty(77, 2, 64).requires_grad_()
    cu_q, cu_k = empty(4, dtype=torch.int32), empty(4, dtype=torch.int32)
    varlen = (cu_q, cu_q if promise else cu_k, 150, 40, promise)
    arguments = (64**-0.5, True, "auto", 0, -1, -1, 0.0, *varlen)
    torch.library.opcheck(torch.ops.dash_attn.forward.default, (q, k, v, *arguments))
    with torch.no_grad():
        out, lse = torch.ops.dash_attn.forward(q, k, v, *arguments)
    assert_packed(out, (300, 8, 64), torch.bfloat16, q.device, "out")
    assert_packed(lse, (8, 300), torch.float32, q.device, "lse")
    q, k, v = (t.detach() for t in (q, k, v))
    torch.library.opcheck(torch.ops.dash_attn.backward.default, (torch.empty_like(out), q, k, v, out, lse, *arguments))


def scaled_block(causal: bool, deterministic: bool = True) -> Callable[..., torch.Tensor]:
    """The function the compile tests compile: flash_attn_func between two exact ops (a scale by 0.5, an fp32
    cast), so the compiled graph holds more than the custom op yet the bits must match eager's."""

    def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attn_func(q * 0.5, k, v, causal=causal, deterministic=deterministic).float()

    return block


@pytest.mark.parametrize(
    "switch, deterministic",
    [("off", True), ("strict", True), ("off", False)],
    ids=["switch-off", "strict-switch-deterministic", "switch-off-nondeterministic"],
)
def test_dynamo_traces_the_compiled_block_in_one_graph(fake_cuda, switch: str, deterministic: bool) -> None:
    """No graph break is intended: the argument checks and torch's determinism switch are folded while tracing
    (the strict switch refusing deterministic=False is test_deterministic_switch.py's subject)."""
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(switch == "strict")
    try:
        torch._dynamo.reset()
        q = torch.zeros(2, 64, 4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        kv = torch.zeros(2, 64, 2, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        explanation = torch._dynamo.explain(scaled_block(causal=True, deterministic=deterministic))(q, kv, kv)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    assert explanation.graph_break_count == 0, [str(reason) for reason in explanation.break_reasons]
    assert explanation.graph_count == 1


# --- on a Hopper GPU -----------------------------------------------------------------------------------------

# Cycles torch.cuda._sleep holds the side stream (about 50 ms on an H200) before it writes the inputs: an op
# that launched on another stream than the current one would run meanwhile and read stale memory.
SIDE_STREAM_SLEEP_CYCLES = 100_000_000
# Warm-up iterations on a side stream before capture, as torch.cuda.graph's documentation does.
GRAPH_WARMUP_STEPS = 3
# Input sets replayed through one captured graph; the first is the one captured.
GRAPH_REPLAYS = 4
# torch.compile(mode="reduce-overhead") steps: CUDA graph trees warm up, record, then replay.
COMPILED_STEPS = 4

STREAM_CASES = [
    Case(2, 256, 256, 4, 4, head_dim, dtype, causal)
    for head_dim in (64, 128)
    for dtype in (torch.bfloat16, torch.float16)
    for causal in (False, True)
] + [Case(1, 200, 328, 8, 2, 128, torch.bfloat16, True)]

DETERMINISTIC_SCHEDULES = [s for s in dash_attn.SCHEDULES if s != "nondeterministic"]
# Every deterministic schedule on one shape in both masks (a schedule that does not apply skips), and the
# default schedule with the other head dim and dtype.
GRAPH_SHAPE_CASES = [Case(2, 512, 512, 4, 4, 128, torch.bfloat16, causal) for causal in (False, True)]
GRAPH_CASES = [(schedule, case) for schedule in DETERMINISTIC_SCHEDULES for case in GRAPH_SHAPE_CASES] + [
    ("auto", Case(2, 384, 384, 4, 4, 64, torch.float16, causal)) for causal in (False, True)
]

OPCHECK_CASES = [
    Case(1, 128, 128, 2, 2, 64, torch.bfloat16, True),
    Case(2, 96, 160, 4, 2, 128, torch.float16, False),
    Case(2, 200, 200, 4, 2, 128, torch.bfloat16, True, bhsd=True),
]

COMPILE_CASES = [
    Case(2, 384, 384, 8, 2, 128, torch.bfloat16, True),
    Case(1, 256, 256, 4, 4, 64, torch.float16, False),
]


def random_inputs(case: Case, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v and dout, N(0, 1) rounded to the case's dtype, not requiring grad."""
    generator = torch.Generator(device).manual_seed(seed)

    def draw(*sizes: int) -> torch.Tensor:
        return torch.randn(*sizes, generator=generator, device=device).to(case.dtype)

    q = bshd(case, case.seqlen_q, case.heads_q, draw)
    k, v = (bshd(case, case.seqlen_k, case.heads_kv, draw) for _ in range(2))
    return q, k, v, bshd(case, case.seqlen_q, case.heads_q, draw)


def attention_step(q, k, v, dout, **kwargs) -> tuple[torch.Tensor, ...]:
    """out, lse, dq, dk, dv of flash_attn_func(return_lse=True) and out.backward(dout), on fresh leaves."""
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = flash_attn_func(*leaves, return_lse=True, **kwargs)
    out.backward(dout)
    return (out.detach(), lse, *(t.grad for t in leaves))


def assert_bitwise(got: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...], what: str) -> None:
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, expected, strict=True):
        assert torch.equal(a, b), f"{name} differs: {what}"


def eager_or_skip(schedule: str, inputs: tuple[torch.Tensor, ...], causal: bool) -> tuple[torch.Tensor, ...]:
    """attention_step with `schedule`, skipping the test when the schedule's preconditions reject the shape."""
    try:
        return attention_step(*inputs, causal=causal, schedule=schedule)
    except dash_attn.LibraryError as error:
        if error.status != "schedule-rejected":
            raise
        pytest.skip(f"schedule {schedule} does not apply to this shape: {error.message}")


@pytest.mark.parametrize("case", STREAM_CASES, ids=case_ids(STREAM_CASES))
def test_side_stream_gives_the_default_streams_bits(device, require_kernel, case: Case) -> None:
    require_kernel(case.head_dim, case.dtype)
    inputs = random_inputs(case, device, seed=101)
    expected = attention_step(*inputs, causal=case.causal)

    default = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    targets = tuple(torch.zeros_like(t) for t in inputs)
    side.wait_stream(default)  # inputs and targets are ready
    with torch.cuda.stream(side):
        # The side stream sleeps, then fills the targets: only work queued behind them on this stream sees them.
        torch.cuda._sleep(SIDE_STREAM_SLEEP_CYCLES)
        for target, source in zip(targets, inputs):
            target.copy_(source)
        got = attention_step(*targets, causal=case.causal)
    for t in (*inputs, *targets):
        t.record_stream(side)  # made on the default stream, used on the side one
    default.wait_stream(side)
    for t in got:
        t.record_stream(default)  # made on the side stream, read on the default one
    assert_bitwise(got, expected, "side stream against the default stream")


@pytest.mark.parametrize("schedule, case", GRAPH_CASES, ids=[f"{s}-{c.id}" for s, c in GRAPH_CASES])
def test_cuda_graph_replays_give_eager_bits(device, require_kernel, schedule: str, case: Case) -> None:
    require_kernel(case.head_dim, case.dtype)
    input_sets = [random_inputs(case, device, seed=200 + replay) for replay in range(GRAPH_REPLAYS)]
    expected = [eager_or_skip(schedule, inputs, case.causal) for inputs in input_sets]

    static_leaves = tuple(t.detach().clone().requires_grad_() for t in input_sets[0][:3])
    static_dout = input_sets[0][3].clone()

    def forward_backward() -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = flash_attn_func(*static_leaves, causal=case.causal, schedule=schedule, return_lse=True)
        out.backward(static_dout)
        return out, lse

    # Warm-up on a side stream, as torch.cuda.graph's documentation does, so lazy work stays out of the capture.
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP_STEPS):
            for t in static_leaves:
                t.grad = None
            forward_backward()
    torch.cuda.current_stream(device).wait_stream(side)

    for t in static_leaves:
        t.grad = None  # the captured backward allocates the gradients from the graph's pool
    graph = torch.cuda.CUDAGraph()
    # "global" refuses syncs, blocking copies and raw cudaMalloc/cudaFree from any thread during the capture.
    with torch.cuda.graph(graph, capture_error_mode="global"):
        static_out, static_lse = forward_backward()
    static_grads = tuple(t.grad for t in static_leaves)

    for replay, (inputs, wanted) in enumerate(zip(input_sets, expected)):
        with torch.no_grad():
            for static, values in zip((*static_leaves, static_dout), inputs):
                static.copy_(values)
        graph.replay()
        got = (static_out, static_lse, *static_grads)
        assert_bitwise(got, wanted, f"replay {replay} against eager on the same inputs")


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=case_ids(OPCHECK_CASES))
def test_opcheck_on_the_real_kernels(device, require_kernel, case: Case) -> None:
    """torch.library.opcheck's default utilities (test_schema, test_autograd_registration, test_faketensor,
    test_aot_dispatch_dynamic) against the CUDA kernels. The forward's inputs require grad, so autograd
    registration and AOTAutograd's backward are checked too. The backward op is called as the autograd formula
    calls it, on tensors that no graph records (it has no double backward)."""
    require_kernel(case.head_dim, case.dtype)
    q, k, v, dout = random_inputs(case, device, seed=301)
    leaves = tuple(t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.dash_attn.forward.default, (*leaves, case.scale, case.causal, "auto", 0))
    with torch.no_grad():
        out, lse = torch.ops.dash_attn.forward(*leaves, case.scale, case.causal, "auto", 0)
    q, k, v = (t.detach() for t in leaves)
    torch.library.opcheck(
        torch.ops.dash_attn.backward.default, (dout, q, k, v, out, lse, case.scale, case.causal, "auto", 0)
    )


def compiled_step(block: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """out, dq, dk, dv of block(q, k, v).backward(dout) on fresh leaves, cloned: CUDA graph trees overwrite their
    outputs on the next replay."""
    q, k, v, dout = inputs
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    out = block(*leaves)
    out.backward(dout.float())
    return tuple(t.clone() for t in (out.detach(), *(leaf.grad for leaf in leaves)))


@pytest.mark.parametrize("case", COMPILE_CASES, ids=case_ids(COMPILE_CASES))
def test_reduce_overhead_compile_gives_eager_bits(device, require_kernel, case: Case) -> None:
    require_kernel(case.head_dim, case.dtype)
    block = scaled_block(case.causal)
    torch._dynamo.reset()
    counters.clear()
    # fullgraph=True: a graph break is an error, since the front intends none.
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for step in range(COMPILED_STEPS):
        inputs = random_inputs(case, device, seed=400 + step)
        expected = compiled_step(block, inputs)
        torch.compiler.cudagraph_mark_step_begin()
        got = compiled_step(compiled, inputs)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
            assert torch.equal(a, b), f"{name} differs between eager and the compiled step {step}"
    skips = counters["inductor"]["cudagraph_skips"]
    assert skips == 0, f"Inductor ran {skips} graph(s) without CUDA graphs (TORCH_LOGS=perf_hints says why)"
