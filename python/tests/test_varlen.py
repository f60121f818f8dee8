"""Tests of dash_attn.flash_attn_varlen_func (packed variable-length batches with cu_seqlens).

CPU (no GPU, no library needed): every argument check names the argument and the rule (3-D packed tensors, dtypes,
head dims, cu_seqlens dtype, rank, length and agreement, max_seqlen bounds, window, softcap, flags, the schedule
against deterministic), and the promise seqlen_k <= seqlen_q is taken from one tensor passed twice, never from a
copy of the offsets.
GPU (skip without a Hopper GPU, or, naming the build option, without the varlen kernels of a head dim, dtype and
softcap variant): the forward, LSE and gradients against a per-sequence loop of flash_attn_func on adversarial
lengths (0, 1, 127, 129, one long and the rest empty, seqlen_q != seqlen_k), causal and a window, GQA, at every head
dim, and with softcap (the loop's flash_attn_func with the same softcap); every deterministic schedule the plan
admits repeats its bits; rows after the last sequence come out 0 with zero gradients; a CUDA graph of the call
replays it without reading the offsets on the host; the varlen call is the dense ops with their optional varlen
arguments (on the CPU: their schema, the eager path and the traced call), which opcheck finds consistent with the
kernels, and a compiled call gives eager's bits.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import dash_attn
from dash_attn import _library, _ops, flash_attn_func, flash_attn_varlen_func
from dash_attn import varlen as varlen_module

TOLERANCES = {torch.bfloat16: (1.5e-2, 5e-2), torch.float16: (4e-3, 1.5e-2)}  # as test_attention.py
MAGNITUDE_FLOOR = 1e-2


def cpu_call(**overrides):
    """A valid call on CPU tensors (which fails only at the device check), with `overrides` applied."""
    arguments = {
        "q": torch.zeros(10, 4, 64, dtype=torch.bfloat16),
        "k": torch.zeros(12, 2, 64, dtype=torch.bfloat16),
        "v": torch.zeros(12, 2, 64, dtype=torch.bfloat16),
        "cu_seqlens_q": torch.tensor([0, 4, 10], dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0, 6, 12], dtype=torch.int32),
        "max_seqlen_q": 6,
        "max_seqlen_k": 6,
    }
    arguments.update(overrides)
    positional = [
        arguments.pop(name) for name in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
    ]
    return flash_attn_varlen_func(*positional, **arguments)


def test_is_exported_at_top_level():
    assert dash_attn.flash_attn_varlen_func is flash_attn_varlen_func
    assert "flash_attn_varlen_func" in dash_attn.__all__


def test_a_valid_call_reaches_the_device_check():
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        cpu_call()


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"q": torch.zeros(2, 10, 4, 64, dtype=torch.bfloat16)}, ValueError, r"q must be 3-D \(total_tokens"),
        ({"k": "k"}, TypeError, "k must be a torch.Tensor"),
        ({"q": torch.zeros(10, 4, 64)}, TypeError, "q.dtype must be torch.bfloat16 or torch.float16"),
        ({"v": torch.zeros(12, 2, 64, dtype=torch.float16)}, TypeError, r"v.dtype \(torch.float16\) must equal"),
        ({"q": torch.zeros(10, 4, 80, dtype=torch.bfloat16)}, ValueError, r"head_dim \(q.shape\[2\]\) must be one of"),
        ({"k": torch.zeros(12, 2, 128, dtype=torch.bfloat16)}, ValueError, r"k.shape\[2\] \(head_dim\)"),
        ({"v": torch.zeros(11, 2, 64, dtype=torch.bfloat16)}, ValueError, r"v.shape\[:2\]"),
        ({"q": torch.zeros(10, 3, 64, dtype=torch.bfloat16)}, ValueError, "must be a multiple of k.shape"),
        ({"cu_seqlens_q": torch.tensor([0, 4, 10])}, TypeError, "cu_seqlens_q.dtype must be torch.int32"),
        ({"cu_seqlens_k": [0, 6, 12]}, TypeError, "cu_seqlens_k must be a torch.Tensor"),
        ({"cu_seqlens_q": torch.tensor([[0, 4, 10]], dtype=torch.int32)}, ValueError, "cu_seqlens_q must be 1-D"),
        ({"cu_seqlens_k": torch.tensor([0], dtype=torch.int32)}, ValueError, r"batch \+ 1 >= 2 offsets"),
        ({"cu_seqlens_k": torch.tensor([0, 6], dtype=torch.int32)}, ValueError, "cu_seqlens_k has 2 offsets but"),
        ({"max_seqlen_q": 0}, ValueError, r"1 <= max_seqlen_q <= 1048576"),
        ({"max_seqlen_k": -3}, ValueError, "max_seqlen_k must satisfy"),
        ({"max_seqlen_q": (1 << 20) + 1}, ValueError, "max_seqlen_q must satisfy"),
        ({"max_seqlen_k": 6.0}, TypeError, "max_seqlen_k must be an int"),
        ({"max_seqlen_q": True}, TypeError, "max_seqlen_q must be an int"),
        ({"causal": 1}, TypeError, "causal must be a bool"),
        ({"window_size": (-2, 0)}, ValueError, r"window_size\[0\] must be >= -1"),
        ({"softcap": -1.0}, ValueError, "softcap must be finite and >= 0"),
        ({"softmax_scale": 0.0}, ValueError, "softmax_scale must be finite and > 0"),
        ({"schedule": "fastest"}, ValueError, "schedule must be one of"),
        ({"deterministic": True, "schedule": "nondeterministic"}, ValueError, "contradicts deterministic=True"),
        ({"sm_margin": -1}, ValueError, "sm_margin must satisfy"),
        ({"return_lse": None}, TypeError, "return_lse must be a bool"),
    ],
)
def test_each_bad_argument_is_refused_by_name_before_any_device_work(overrides, error, match):
    with pytest.raises(error, match=match):
        cpu_call(**overrides)


def test_the_promise_comes_from_one_tensor_passed_twice_never_from_the_values():
    offsets = torch.tensor([0, 4, 10], dtype=torch.int32)
    assert varlen_module._same_offsets(offsets, offsets)
    assert varlen_module._same_offsets(offsets, offsets.view(-1))  # a view of the same memory
    assert not varlen_module._same_offsets(offsets, offsets.clone())  # equal values, but reading them would copy


def test_a_signature_asks_the_library_its_workspace_once_per_library(monkeypatch):
    """The forward's call descriptor: the first call of a signature asks the loaded library (which validates the
    shape), later calls of it reuse the answer; another signature or a library loaded anew asks again."""
    from dash_attn import _plans

    asked = []

    def forward_workspace_size(shape):
        asked.append(_plans.shape_fields(shape))
        return 256

    monkeypatch.setattr(_library, "forward_workspace_size", forward_workspace_size)
    _ops._cached_forward_call.cache_clear()
    q, k = torch.zeros(10, 4, 64, dtype=torch.bfloat16), torch.zeros(12, 2, 64, dtype=torch.bfloat16)

    def descriptor(library, sequences):
        monkeypatch.setattr(_library, "load", lambda: library)
        return _ops._forward_call(q, k, k, 0.125, True, -1, -1, 0.0, (sequences, 6, 6, False))

    first = descriptor("one", 2)
    assert descriptor("one", 2) is first
    assert first.workspace_bytes == 256 and (first.shape.batch, first.shape.seqlen_q) == (2, 6)
    descriptor("one", 3)
    descriptor("loaded anew", 2)
    assert [fields[0] for fields in asked] == [2, 3, 2]  # batch, the first field
    _ops._cached_forward_call.cache_clear()


def test_varlen_calls_are_the_dense_ops_with_their_optional_arguments():
    """One op pair: the varlen arguments come last and default to a dense call."""
    varlen_arguments = "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, SymInt max_seqlen_q=0, "
    for op in (torch.ops.dash_attn.forward, torch.ops.dash_attn.backward):
        schema = str(op.default._schema)
        assert varlen_arguments in schema and schema.index("softcap") < schema.index("cu_seqlens_q"), schema
    assert not hasattr(torch.ops.dash_attn, "varlen_forward")
    assert not hasattr(torch.ops.dash_attn, "varlen_backward")


class _Recorder:
    """The op bodies and ops replaced by recorders of their calls (outputs of the real metadata)."""

    def __init__(self, monkeypatch):
        self.seen = []
        recorder = self

        def forward_body(q, k, v, *arguments):
            recorder.seen.append(("forward body", (q, k, v, *arguments)))
            lse = torch.zeros(q.shape[1], q.shape[0])
            return q.detach().clone(), lse

        def backward_body(*args):
            recorder.seen.append(("backward body", args))
            return tuple(torch.full_like(t, value) for t, value in zip(args[1:4], (1.0, 2.0, 3.0)))

        def op(name):
            def call(*args):
                recorder.seen.append((name, args))
                raise AssertionError(f"an eager call dispatched {name}")

            return call

        monkeypatch.setattr(varlen_module, "_check_devices", lambda tensors, names: None)
        monkeypatch.setattr(_ops, "_forward_body", forward_body)
        monkeypatch.setattr(_ops, "_backward_body", backward_body)
        monkeypatch.setattr(torch.ops.dash_attn, "forward", op("dash_attn::forward"))
        monkeypatch.setattr(torch.ops.dash_attn, "backward", op("dash_attn::backward"))

    def paths(self):
        return [path for path, _ in self.seen]


def _leaf_inputs():
    q = torch.randn(10, 4, 64).to(torch.bfloat16).requires_grad_()
    k = torch.randn(10, 2, 64).to(torch.bfloat16).requires_grad_()
    v = torch.randn(10, 2, 64).to(torch.bfloat16).requires_grad_()
    return q, k, v, torch.tensor([0, 4, 10], dtype=torch.int32)


def test_an_eager_call_runs_the_bodies_under_the_autograd_function_without_the_ops(monkeypatch):
    """The eager path (_ops.py's reason: the custom-op dispatch costs more host time than short kernels): the
    forward body under _ops._EagerAttention, the backward body with the saved tensors and the forward's
    arguments, and the gradients handed back to q, k and v."""
    calls = _Recorder(monkeypatch)
    q, k, v, offsets = _leaf_inputs()
    out, lse = flash_attn_varlen_func(
        q, k, v, offsets, offsets, 6, 6, softmax_scale=0.3, causal=True, schedule="shift", sm_margin=3, return_lse=True
    )
    assert calls.paths() == ["forward body"]
    forward_args = calls.seen[0][1]
    assert forward_args[3:10] == (0.3, True, "shift", 3, -1, -1, 0.0)
    assert forward_args[10] is offsets and forward_args[11] is offsets and forward_args[12:] == (6, 6, True)
    assert type(out.grad_fn).__name__ == "_EagerAttentionBackward"
    assert not lse.requires_grad
    dout = torch.randn_like(out)
    out.backward(dout)
    assert calls.paths() == ["forward body", "backward body"]
    args = calls.seen[1][1]
    assert args[0] is dout
    for saved, given in zip(args[1:6] + args[13:15], (q, k, v, out, lse, offsets, offsets)):
        assert saved.data_ptr() == given.data_ptr() and saved.shape == given.shape
    assert args[6:13] == (0.3, True, "shift", 3, -1, -1, 0.0) and args[15:] == (6, 6, True)
    for grad, value in zip((q.grad, k.grad, v.grad), (1.0, 2.0, 3.0)):
        assert torch.all(grad == value)


def test_a_call_autograd_does_not_record_runs_the_forward_body_alone(monkeypatch):
    calls = _Recorder(monkeypatch)
    q, k, v, offsets = _leaf_inputs()
    with torch.no_grad():
        out = flash_attn_varlen_func(q, k, v, offsets, offsets, 6, 6, causal=True)
    assert calls.paths() == ["forward body"] and out.grad_fn is None


def test_a_traced_call_dispatches_the_custom_op(monkeypatch):
    """Under a dispatch mode (as under FakeTensorMode, make_fx or torch.compile) the call is the op itself."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = _Recorder(monkeypatch)
    monkeypatch.undo()  # the real ops, the recorder's device check only
    monkeypatch.setattr(varlen_module, "_check_devices", lambda tensors, names: None)
    monkeypatch.setattr(_ops, "_forward_body", lambda *args: calls.seen.append(("forward body", args)))
    seen_ops = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen_ops.append((str(func), args))
            if "dash_attn.forward" in str(func):
                q = args[0]
                return torch.empty_like(q), torch.empty(q.shape[1], q.shape[0])
            return func(*args, **(kwargs or {}))

    q, k, v, offsets = _leaf_inputs()
    with Recording():
        flash_attn_varlen_func(q, k, v, offsets, offsets, 6, 6, causal=True)
    [op_args] = [args for name, args in seen_ops if "dash_attn.forward" in name]
    assert op_args[10] is offsets and op_args[11] is offsets and op_args[12:] == (6, 6, True)
    assert calls.paths() == []


# --- GPU ---------------------------------------------------------------------------------------------------

# (name, [(seqlen_q, seqlen_k) per sequence], heads_q, heads_kv, causal, window_size, max lengths added)
CASES = [
    ("mixed-self", [(0, 0), (1, 1), (127, 127), (129, 129), (300, 300), (64, 64)], 4, 4, False, (-1, -1)),
    ("mixed-self-causal-gqa", [(0, 0), (1, 1), (127, 127), (129, 129), (300, 300), (64, 64)], 4, 2, True, (-1, -1)),
    ("q-ne-k-causal-mqa", [(100, 300), (300, 100), (0, 50), (50, 0), (257, 129)], 4, 1, True, (-1, -1)),
    ("one-long-rest-empty", [(1000, 1000), (0, 0), (0, 0)], 2, 2, True, (-1, -1)),
    ("window", [(300, 300), (5, 5), (600, 600)], 4, 2, False, (64, 16)),
]
# Every head dim the package takes: the varlen kernels are each instance's (src/kernels/CMakeLists.txt).
HEAD_DIMS = sorted(_library.HEAD_DIMS)
# The mixed lengths under the causal mask (GQA) and the window, with softcap.
SOFTCAP_CASES = [case for case in CASES if case[0] in ("mixed-self-causal-gqa", "window")]
SOFTCAP = 5.0
SOFTCAP_SCALE_FACTOR = 4.0  # softmax_scale = SOFTCAP_SCALE_FACTOR / sqrt(head_dim)


def packed_batch(lengths, heads_q, heads_kv, head_dim, dtype, device, padding=0, seed=0):
    generator = torch.Generator(device).manual_seed(seed)
    cu_q = [0]
    cu_k = [0]
    for seqlen_q, seqlen_k in lengths:
        cu_q.append(cu_q[-1] + seqlen_q)
        cu_k.append(cu_k[-1] + seqlen_k)
    total_q, total_k = cu_q[-1] + padding, cu_k[-1] + padding

    def draw(rows, heads):
        return torch.randn(rows, heads, head_dim, generator=generator, device=device).to(dtype)

    q, k, v = draw(total_q, heads_q), draw(total_k, heads_kv), draw(total_k, heads_kv)
    cu_q_tensor = torch.tensor(cu_q, dtype=torch.int32, device=device)
    cu_k_tensor = torch.tensor(cu_k, dtype=torch.int32, device=device)
    return q, k, v, cu_q_tensor, cu_k_tensor, cu_q, cu_k


def per_sequence(q, k, v, dout, cu_q, cu_k, **options):
    """out, lse, dq, dk, dv of a loop of flash_attn_func over the sequences (a sequence without keys: out 0, lse
    -inf, no gradient), in the packed layouts; rows after the last sequence 0 (lse -inf)."""
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if qs.stop == qs.start or ks.stop == ks.start:
            continue
        q_b, k_b, v_b = (t[s].unsqueeze(0).detach().requires_grad_() for t, s in ((q, qs), (k, ks), (v, ks)))
        out_b, lse_b = flash_attn_func(q_b, k_b, v_b, return_lse=True, **options)
        out_b.backward(dout[qs].unsqueeze(0))
        out[qs], lse[:, qs] = out_b[0].detach(), lse_b[0]
        dq[qs], dk[ks], dv[ks] = q_b.grad[0], k_b.grad[0], v_b.grad[0]
    return out, lse, dq, dk, dv


def skip_without_varlen_kernels(library, require_kernel, head_dim, dtype, softcap=False):
    """Skips, naming the build options, unless this build has the varlen kernels of (head_dim, dtype, softcap)."""
    require_kernel(head_dim, dtype)
    code = {torch.bfloat16: library.DTYPE_BF16, torch.float16: library.DTYPE_FP16}[dtype]
    if not library.kernel_available(head_dim, code, softcap, varlen=True):
        options = "DASH_VARLEN_KERNELS, DASH_SOFTCAP_KERNELS" if softcap else "DASH_VARLEN_KERNELS"
        pytest.skip(
            f"this build has no varlen kernels for head_dim {head_dim} / {dtype}"
            f"{' with softcap' if softcap else ''} ({options})"
        )


def assert_close(actual, expected, dtype, what):
    rel, frac = TOLERANCES[dtype]
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(actual), finite), f"{what}: non-finite elements differ"
    a, e = actual[finite].double(), expected[finite].double()
    error = (a - e).norm() / max(e.norm().item(), 1e-30)
    assert error <= rel, f"{what}: relative L2 error {error:.3g} > {rel}"
    assert (a - e).abs().max() <= frac * max(e.abs().max().item(), MAGNITUDE_FLOOR), f"{what}: max error"


def check_against_the_loop(case, head_dim, dtype, device, **options):
    """flash_attn_varlen_func on `case` with `options` (and the case's mask) against per_sequence's loop of
    flash_attn_func with the same options: out, lse, gradients, and the padding rows cleared."""
    _name, lengths, heads_q, heads_kv, causal, window = case
    q, k, v, cu_q_t, cu_k_t, cu_q, cu_k = packed_batch(lengths, heads_q, heads_kv, head_dim, dtype, device, padding=7)
    dout = torch.randn_like(q)
    options = {"causal": causal, "window_size": window, **options}
    expected = per_sequence(q, k, v, dout, cu_q, cu_k, **options)
    q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
    max_q = max(max(s for s, _ in lengths), 1)
    max_k = max(max(s for _, s in lengths), 1)
    out, lse = flash_attn_varlen_func(q_, k_, v_, cu_q_t, cu_k_t, max_q, max_k, return_lse=True, **options)
    out.backward(dout)
    assert lse.shape == (heads_q, q.shape[0])
    for actual, reference, what in zip(
        (out, lse, q_.grad, k_.grad, v_.grad), expected, ("out", "lse", "dq", "dk", "dv")
    ):
        assert_close(actual.float() if what != "lse" else actual, reference.float(), dtype, what)
    # The padding rows after the last sequence: out 0, lse -inf, zero gradients.
    assert torch.all(out[cu_q[-1] :] == 0) and torch.all(lse[:, cu_q[-1] :] == float("-inf"))
    assert torch.all(q_.grad[cu_q[-1] :] == 0) and torch.all(k_.grad[cu_k[-1] :] == 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_a_per_sequence_loop_of_flash_attn_func(device, library, require_kernel, case, head_dim, dtype):
    skip_without_varlen_kernels(library, require_kernel, head_dim, dtype)
    check_against_the_loop(case, head_dim, dtype, device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=[c[0] for c in SOFTCAP_CASES])
def test_softcap_matches_a_per_sequence_loop_of_flash_attn_func_with_softcap(
    device, library, require_kernel, case, head_dim, dtype
):
    skip_without_varlen_kernels(library, require_kernel, head_dim, dtype, softcap=True)
    # Scores scaled up so that the cap bites (|s| past softcap), as the kernel tests do.
    check_against_the_loop(
        case, head_dim, dtype, device, softcap=SOFTCAP, softmax_scale=SOFTCAP_SCALE_FACTOR / head_dim**0.5
    )


@pytest.mark.parametrize("schedule", ["ascending", "descending", "shortest-first", "shift", "symmetric-shift"])
def test_every_admitted_schedule_repeats_its_bits(device, library, require_kernel, schedule):
    require_kernel(128, torch.bfloat16)
    if not library.kernel_available(128, 0, varlen=True):
        pytest.skip("this build has no varlen kernels (DASH_VARLEN_KERNELS)")
    lengths = [(700, 700), (1, 1), (0, 0), (1024, 1024), (129, 129)]
    q, k, v, cu, _, _, _ = packed_batch(lengths, 4, 4, 128, torch.bfloat16, device, seed=5)
    causal = schedule != "shift"
    dout = torch.randn_like(q)
    grads = []
    for _ in range(5):
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        # One offsets tensor for both sides: the promise under which the shift schedules are planned.
        out = flash_attn_varlen_func(q_, k_, v_, cu, cu, 1024, 1024, causal=causal, schedule=schedule)
        out.backward(dout)
        grads.append(torch.cat([q_.grad.flatten(), k_.grad.flatten(), v_.grad.flatten()]).view(torch.int16))
    for g in grads[1:]:
        assert torch.equal(g, grads[0])


def test_the_shift_schedules_need_one_offsets_tensor(device, library, require_kernel):
    require_kernel(128, torch.bfloat16)
    if not library.kernel_available(128, 0, varlen=True):
        pytest.skip("this build has no varlen kernels (DASH_VARLEN_KERNELS)")
    q, k, v, cu_q, cu_k, _, _ = packed_batch([(200, 200), (300, 300)], 2, 2, 128, torch.bfloat16, device)
    q.requires_grad_()
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 300, causal=True, schedule="symmetric-shift")
    with pytest.raises(dash_attn.LibraryError, match="keys_within_queries"):
        out.sum().backward()


def test_a_cuda_graph_replays_the_call_with_new_offsets(device, library, require_kernel):
    require_kernel(128, torch.bfloat16)
    if not library.kernel_available(128, 0, varlen=True):
        pytest.skip("this build has no varlen kernels (DASH_VARLEN_KERNELS)")
    q, k, v, cu, _, _, _ = packed_batch([(100, 100), (156, 156)], 2, 2, 128, torch.bfloat16, device)
    flash_attn_varlen_func(q, k, v, cu, cu, 256, 256, causal=True)  # plans and warms up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_varlen_func(q, k, v, cu, cu, 256, 256, causal=True)
    cu.copy_(torch.tensor([0, 200, 256], dtype=torch.int32, device=device))
    graph.replay()
    expected = per_sequence(q, k, v, torch.zeros_like(q), [0, 200, 256], [0, 200, 256], causal=True)[0]
    assert_close(out.float(), expected.float(), torch.bfloat16, "out after replay with new offsets")


def test_the_eager_path_and_the_custom_ops_give_the_same_bits(device, library, require_kernel):
    """flash_attn_varlen_func in eager mode runs the ops' bodies without their dispatch; the ops themselves (the
    path torch.compile records) must give out, lse and every gradient bit for bit the same."""
    require_kernel(128, torch.bfloat16)
    if not library.kernel_available(128, 0, varlen=True):
        pytest.skip("this build has no varlen kernels (DASH_VARLEN_KERNELS)")
    q, k, v, cu, _, _, _ = packed_batch(
        [(300, 300), (5, 5), (600, 600)], 4, 2, 128, torch.bfloat16, device, padding=3, seed=11
    )
    dout = torch.randn_like(q)
    results = {}
    for path in ("eager", "ops"):
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        if path == "eager":
            out, lse = flash_attn_varlen_func(q_, k_, v_, cu, cu, 600, 600, causal=True, return_lse=True)
            assert type(out.grad_fn).__name__ == "_EagerAttentionBackward"
        else:
            out, lse = torch.ops.dash_attn.forward(
                q_, k_, v_, 128**-0.5, True, "auto", 0, -1, -1, 0.0, cu, cu, 600, 600, True
            )
        out.backward(dout)
        results[path] = (out, lse, q_.grad, k_.grad, v_.grad)
    for name, eager, op in zip(("out", "lse", "dq", "dk", "dv"), results["eager"], results["ops"]):
        assert torch.equal(
            eager.view(torch.int16) if eager.dtype == torch.bfloat16 else eager.view(torch.int32),
            op.view(torch.int16) if op.dtype == torch.bfloat16 else op.view(torch.int32),
        ), name


def test_opcheck_and_a_compiled_call_on_the_real_kernels(device, library, require_kernel):
    """The one op pair with the varlen arguments against the CUDA kernels: opcheck's schema, fake-kernel, autograd
    and AOTAutograd checks, and flash_attn_varlen_func compiled whole (fullgraph) giving eager's bits."""
    require_kernel(128, torch.bfloat16)
    if not library.kernel_available(128, 0, varlen=True):
        pytest.skip("this build has no varlen kernels (DASH_VARLEN_KERNELS)")
    q, k, v, cu, _, _, _ = packed_batch([(300, 300), (5, 5), (129, 129)], 4, 2, 128, torch.bfloat16, device, padding=3)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    arguments = (128**-0.5, True, "auto", 0, -1, -1, 0.0, cu, cu, 300, 300, True)
    torch.library.opcheck(torch.ops.dash_attn.forward.default, (*leaves, *arguments))
    with torch.no_grad():
        out, lse = torch.ops.dash_attn.forward(*leaves, *arguments)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.dash_attn.backward.default, (dout, q, k, v, out, lse, *arguments))

    def step(call):
        q_, k_, v_ = (t.detach().clone().requires_grad_() for t in (q, k, v))
        result = call(q_, k_, v_, cu, cu, 300, 300, causal=True)
        result.backward(dout)
        return result.detach(), q_.grad, k_.grad, v_.grad

    eager = step(flash_attn_varlen_func)
    compiled = step(torch.compile(flash_attn_varlen_func, fullgraph=True))
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, compiled):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name
