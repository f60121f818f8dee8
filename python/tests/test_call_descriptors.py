"""Tests of the ops' call descriptors (_ops._ForwardCall, _ops._BackwardCall) on CPU tensors, with the C calls
answered by recorders, so they need neither a GPU nor the library: a repeat call of one signature reuses its
descriptor and hands the library its own data pointers with the strides of its tensors; every field of the key
(each tensor's shape and strides, dtype, device, scale, mask, schedule, margin, the loaded library) makes a
descriptor of its own; a scale that is not positive never meets a cached one; the forward's workspace size is
asked once per library and signature and a refusal caches nothing; the caches are bounded. A call after a cached
one whose strides, pointers, dtype or shape changed is still judged: copied when the kernels cannot read it,
refused by the entry point's checks when it is wrong. The reused structs are never overwritten while in use, by
another thread or a re-entered call. forward_partial (context parallelism's forward) asks the library for an fp32
out, allocated with the packed out's element strides, dense and varlen.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from dash_attn import _arguments, _library, _ops, _plans, flash_attn_func  # noqa: E402

BATCH, SEQLEN, HEADS, KV_HEADS, HEAD_DIM = 2, 16, 4, 2, 64
SCALE = HEAD_DIM**-0.5
PACKED = (SEQLEN * HEADS * HEAD_DIM, HEADS * HEAD_DIM, HEAD_DIM, 1)
FORWARD_WORKSPACE_BYTES = 256


@dataclasses.dataclass
class CStruct:
    """What a dash_tensor held when the library was called."""

    data: int
    strides: tuple[int, ...]


def seen(struct: _library.Tensor) -> CStruct:
    return CStruct(struct.data or 0, tuple(struct.strides))


def seen_varlen(varlen: _library.Varlen | None) -> tuple | None:
    """What a dash_varlen held when the library was called: offsets, totals, promise."""
    if varlen is None:
        return None
    fields = (varlen.cu_seqlens_q, varlen.cu_seqlens_k, varlen.total_q, varlen.total_k, varlen.keys_within_queries)
    return tuple(field or 0 for field in fields)


@dataclasses.dataclass
class Launches:
    """The recorded C calls: ("forward" | "backward", shape fields, {name: CStruct}) in call order, the varlen
    structs they were handed (seen_varlen), the plans made (key, varlen) and how often the forward's workspace size
    was asked."""

    calls: list[tuple[str, tuple, dict[str, CStruct]]] = dataclasses.field(default_factory=list)
    varlens: list[tuple | None] = dataclasses.field(default_factory=list)
    out_fp32: list[bool] = dataclasses.field(default_factory=list)  # each forward's request for an fp32 out
    plans: list[tuple[tuple, tuple | None]] = dataclasses.field(default_factory=list)
    workspace_queries: list[tuple] = dataclasses.field(default_factory=list)

    def last(self) -> dict[str, CStruct]:
        return self.calls[-1][2]


class RecordingPlan:
    """A backward plan that records its runs instead of launching."""

    workspace_bytes = 1024

    def __init__(self, launches: Launches, key: tuple, varlen: _library.Varlen | None = None) -> None:
        self.launches = launches
        self.key = key
        launches.plans.append((key, seen_varlen(varlen)))

    def backward(
        self, shape, q, k, v, out, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream, varlen=None
    ) -> None:
        structs = {"q": q, "k": k, "v": v, "out": out, "dout": dout, "dq": dq, "dk": dk, "dv": dv}
        fields = _plans.shape_fields(shape)
        self.launches.calls.append(("backward", fields, {name: seen(s) for name, s in structs.items()}))
        self.launches.varlens.append(seen_varlen(varlen))


@pytest.fixture
def launches(monkeypatch) -> Launches:
    """The op bodies on CPU tensors with every C call recorded, and empty descriptor caches before and after."""
    recorded = Launches()

    def forward_workspace_size(shape: _library.Shape) -> int:
        fields = _plans.shape_fields(shape)
        recorded.workspace_queries.append(fields)
        if shape.batch > 64:
            raise _library.LibraryError("forward workspace query", "invalid-argument", "batch is too large")
        return FORWARD_WORKSPACE_BYTES

    def forward(
        shape, q, k, v, out, lse, workspace, workspace_bytes, stream, sm_margin=0, varlen=None, out_fp32=False
    ) -> None:
        structs = {"q": q, "k": k, "v": v, "out": out}
        recorded.calls.append(("forward", _plans.shape_fields(shape), {name: seen(s) for name, s in structs.items()}))
        recorded.varlens.append(seen_varlen(varlen))
        recorded.out_fp32.append(out_fp32)

    monkeypatch.setattr(_library, "load", lambda: "the loaded library")
    monkeypatch.setattr(_library, "forward_workspace_size", forward_workspace_size)
    monkeypatch.setattr(_library, "forward", forward)
    monkeypatch.setattr(_plans, "backward_plans", _plans.PlanCache(8, lambda *made: RecordingPlan(recorded, *made)))
    # A CPU tensor's device index is -1: current already, so nothing switches; every stream is the null one.
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: -1)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0)
    monkeypatch.setattr(_arguments, "check_devices", lambda tensors, layout: None)
    _ops._cached_forward_call.cache_clear()
    _ops._cached_backward_call.cache_clear()
    yield recorded
    _ops._cached_forward_call.cache_clear()
    _ops._cached_backward_call.cache_clear()


def bshd(heads: int = HEADS, dtype: torch.dtype = torch.bfloat16, batch: int = BATCH) -> torch.Tensor:
    return torch.randn(batch, SEQLEN, heads, HEAD_DIM).to(dtype)


def qkv(dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return bshd(HEADS, dtype), bshd(KV_HEADS, dtype), bshd(KV_HEADS, dtype)


def misaligned(like: torch.Tensor) -> torch.Tensor:
    """A copy of `like` with packed strides, 2 bytes past a 16-byte boundary."""
    storage = torch.empty(like.numel() + 1, dtype=like.dtype)
    return storage[1:].view(like.shape).copy_(like)


def odd_strides(like: torch.Tensor) -> torch.Tensor:
    """A copy of `like` whose head stride (68 elements) is no multiple of 8."""
    batch, seqlen, heads, head_dim = like.shape
    return torch.empty(batch, seqlen, heads, head_dim + 4, dtype=like.dtype)[..., :head_dim].copy_(like)


def run_backward(dout, q, k, v, out, lse, scale=SCALE, causal=True, schedule="auto", sm_margin=0):
    return _ops._backward_body(dout, q, k, v, out, lse, scale, causal, schedule, sm_margin)


# --- one descriptor per signature, its structs carrying each call's pointers ---------------------------------


def test_a_repeat_call_reuses_its_descriptor_and_hands_the_library_its_own_pointers(launches: Launches) -> None:
    for _ in range(3):
        q, k, v = qkv()
        out, lse = _ops._forward_body(q, k, v, SCALE, True, "auto", 0)
        structs = launches.last()
        for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
            assert structs[name] == CStruct(t.data_ptr(), t.stride()), name
        dout = torch.randn_like(out)
        dq, dk, dv = run_backward(dout, q, k, v, out, lse)
        structs = launches.last()
        for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
            assert structs[name] == CStruct(t.data_ptr(), t.stride()), name
    assert _ops._cached_forward_call.cache_info().misses == 1
    assert _ops._cached_backward_call.cache_info().misses == 1
    assert len(launches.workspace_queries) == 1
    assert [fields for _, fields, _ in launches.calls] == [_plans.shape_fields(_ops._c_shape(q, k, SCALE, True))] * 6


def test_the_eager_autograd_path_hands_the_backward_the_saved_tensors_and_the_forward_arguments(
    launches: Launches,
) -> None:
    q, k, v = (t.requires_grad_() for t in qkv())
    for _ in range(2):
        out = flash_attn_func(q, k, v, causal=True, softmax_scale=0.25, schedule="descending", sm_margin=4)
        dout = torch.randn_like(out)
        out.backward(dout)
        (_, forward_fields, forward), (_, backward_fields, backward) = launches.calls[-2:]
        for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
            assert backward[name] == CStruct(t.data_ptr(), t.stride()), name
        assert forward["out"] == backward["out"]
        assert backward_fields == forward_fields
        plan_key = _plans.plan_key(-1, forward_fields, "descending", 4)
        assert _ops._backward_call(-1, dout, q, k, v, out, 0.25, True, "descending", 4).plan_key == plan_key
    assert forward_fields[7] == 0.25 and forward_fields[8] == 1
    assert _ops._cached_backward_call.cache_info().misses == 1


@pytest.mark.parametrize("layout", ["packed", "heads first in memory"])
def test_the_outputs_are_packed_whatever_the_layout_of_the_inputs(launches: Launches, layout: str) -> None:
    q, k, v = qkv()
    if layout != "packed":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    for _ in range(2):
        out, lse = _ops._forward_body(q, k, v, SCALE, True, "auto", 0)
        assert out.stride() == PACKED and lse.stride() == (HEADS * SEQLEN, SEQLEN, 1)
        dq, dk, dv = run_backward(torch.randn_like(out), q, k, v, out, lse)
        assert dq.stride() == PACKED
        assert dk.stride() == dv.stride() == (SEQLEN * KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, HEAD_DIM, 1)
        assert launches.last()["dq"] == CStruct(dq.data_ptr(), PACKED)
    packed = layout == "packed"
    assert _ops._forward_call(q, k, v, SCALE, True).q_packed is packed
    assert _ops._backward_call(-1, out, q, k, v, out, SCALE, True, "auto", 0).inputs_packed is packed


def test_every_field_of_the_forward_key_makes_a_descriptor_of_its_own(launches: Launches, monkeypatch) -> None:
    q, k, v = qkv()
    base = _ops._forward_call(q, k, v, SCALE, True)
    assert _ops._forward_call(*qkv(), SCALE, True) is base
    half = tuple(t.half() for t in (q, k, v))
    transposed_heads = tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    variants = [
        (*half, SCALE, True),
        (q[:1], k[:1], v[:1], SCALE, True),
        (q, k[:, :8], v[:, :8], SCALE, True),
        (q, k, v[:, :8], SCALE, True),
        (transposed_heads[0], k, v, SCALE, True),
        (q, transposed_heads[1], v, SCALE, True),
        (q, k, transposed_heads[2], SCALE, True),
        (q, k, v, 0.5, True),
        (q, k, v, SCALE, False),
    ]
    for args in variants:
        assert _ops._forward_call(*args) is not base, args
    monkeypatch.setattr(_library, "load", lambda: "a library loaded anew")
    assert _ops._forward_call(q, k, v, SCALE, True) is not base
    assert _ops._cached_forward_call.cache_info().currsize == len(variants) + 2


def test_every_field_of_the_backward_key_makes_a_descriptor_of_its_own(launches: Launches) -> None:
    q, k, v = qkv()
    out, dout = torch.randn_like(q), torch.randn_like(q)
    arguments = {
        "device": -1,
        "dout": dout,
        "q": q,
        "k": k,
        "v": v,
        "out": out,
        "softmax_scale": SCALE,
        "causal": True,
        "schedule": "auto",
        "sm_margin": 0,
    }
    base = _ops._backward_call(**arguments)
    assert _ops._backward_call(**{**arguments, "q": q.clone(), "dout": dout.clone()}) is base
    transposed = {
        name: arguments[name].transpose(1, 2).contiguous().transpose(1, 2) for name in ("dout", "q", "k", "v", "out")
    }
    changes = [
        {"device": 0},
        {"q": q.half(), "k": k.half(), "v": v.half()},
        {"softmax_scale": 0.5},
        {"causal": False},
        {"schedule": "descending"},
        {"sm_margin": 8},
        {"dout": dout[:, :8]},
        {"out": out[:, :8]},
        {"q": q[:, :8]},
        {"k": k[:, :8]},
        {"v": v[:, :8]},
        *({name: t} for name, t in transposed.items()),
    ]
    for change in changes:
        assert _ops._backward_call(**{**arguments, **change}) is not base, change
    assert _ops._cached_backward_call.cache_info().currsize == len(changes) + 1


def test_a_scale_that_is_not_positive_never_meets_a_cached_descriptor(launches: Launches) -> None:
    q, k, v = qkv()
    # 0.0 == -0.0 as keys, but the library must see the sign the caller passed; nan never equals itself.
    for scale in (0.0, -0.0, float("nan"), -1.0):
        forward = _ops._forward_call(q, k, v, scale, True)
        assert repr(forward.shape.softmax_scale) == repr(_ops._c_shape(q, k, scale, True).softmax_scale)
        assert _ops._forward_call(q, k, v, scale, True) is not forward
        backward = _ops._backward_call(-1, q, q, k, v, q, scale, True, "auto", 0)
        assert repr(backward.shape.softmax_scale) == repr(forward.shape.softmax_scale)
    assert _ops._cached_forward_call.cache_info().currsize == 0
    assert _ops._cached_backward_call.cache_info().currsize == 0


def test_the_forward_workspace_size_is_asked_once_per_library_and_signature(launches: Launches, monkeypatch) -> None:
    q, k, v = qkv()
    for _ in range(2):
        assert _ops._forward_call(q, k, v, SCALE, True).workspace_bytes == FORWARD_WORKSPACE_BYTES
    assert len(launches.workspace_queries) == 1
    monkeypatch.setattr(_library, "load", lambda: "a library loaded anew")
    _ops._forward_call(q, k, v, SCALE, True)
    assert len(launches.workspace_queries) == 2
    refused = tuple(t.expand(65, *t.shape[1:]) for t in (q[:1], k[:1], v[:1]))  # batch 65 > the fake's 64
    for _ in range(2):
        with pytest.raises(_library.LibraryError, match="batch is too large"):
            _ops._forward_body(*refused, SCALE, True, "auto", 0)
    assert len(launches.workspace_queries) == 4
    assert _ops._cached_forward_call.cache_info().currsize == 2


def test_the_descriptor_caches_are_bounded() -> None:
    for cache in (_ops._cached_forward_call, _ops._cached_backward_call):
        assert cache.cache_info().maxsize == _ops._CALL_CACHE_CAPACITY == _plans.PLAN_CACHE_CAPACITY


# --- a call after a cached one is still judged ------------------------------------------------------------


@pytest.mark.parametrize("bad", [misaligned, odd_strides])
def test_a_forward_input_the_kernels_cannot_read_is_copied_after_a_cached_call(launches: Launches, bad) -> None:
    q, k, v = qkv()
    _ops._forward_body(q, k, v, SCALE, True, "auto", 0)
    assert launches.last()["q"].data == q.data_ptr()
    bad_q = bad(q)
    assert _ops._layout_ok(bad_q) is False
    _ops._forward_body(bad_q, k, v, SCALE, True, "auto", 0)
    handed = launches.last()["q"]
    assert handed.data != bad_q.data_ptr() and handed.data % 16 == 0 and handed.strides == PACKED
    assert launches.last()["k"] == CStruct(k.data_ptr(), k.stride())


@pytest.mark.parametrize("bad", [misaligned, odd_strides, "broadcast"])
def test_a_backward_input_the_kernels_cannot_read_is_copied_after_a_cached_call(launches: Launches, bad) -> None:
    q, k, v = qkv()
    out, lse = _ops._forward_body(q, k, v, SCALE, True, "auto", 0)
    dout = torch.randn_like(out)
    run_backward(dout, q, k, v, out, lse)
    assert launches.last()["dout"] == CStruct(dout.data_ptr(), dout.stride())
    if bad == "broadcast":  # the gradient of a sum: stride 0 everywhere
        bad_dout = torch.ones((), dtype=dout.dtype).expand(dout.shape)
    else:
        bad_dout = bad(dout)
    assert _ops._layout_ok(bad_dout) is False
    run_backward(bad_dout, q, k, v, out, lse)
    handed = launches.last()["dout"]
    assert handed.data != bad_dout.data_ptr() and handed.data % 16 == 0 and handed.strides == PACKED
    assert launches.last()["q"] == CStruct(q.data_ptr(), q.stride())


def test_a_changed_dtype_shape_or_stride_after_a_cached_call_is_still_checked_by_the_entry_point(
    launches: Launches,
) -> None:
    q, k, v = qkv()
    for _ in range(2):
        flash_attn_func(q, k, v, causal=True)
    calls = len(launches.calls)
    with pytest.raises(TypeError, match=r"q\.dtype must be torch\.bfloat16 or torch\.float16"):
        flash_attn_func(q.float(), k.float(), v.float(), causal=True)
    with pytest.raises(TypeError, match=r"v\.dtype \(torch\.float16\) must equal q\.dtype"):
        flash_attn_func(q, k, v.half(), causal=True)
    with pytest.raises(ValueError, match=r"k\.shape\[0\] \(batch\) = 1 must equal q\.shape\[0\] = 2"):
        flash_attn_func(q, k[:1], v[:1], causal=True)
    with pytest.raises(ValueError, match=r"head_dim \(q\.shape\[3\]\) must be one of"):
        flash_attn_func(q[..., :32], k[..., :32], v[..., :32], causal=True)
    with pytest.raises(ValueError, match=r"q\.shape\[2\] \(query heads\) = 3 must be a multiple of"):
        flash_attn_func(q[:, :, :3], k, v, causal=True)
    assert len(launches.calls) == calls
    # A last dimension that is not contiguous is copied before the op; other odd strides by the op.
    strided_last = torch.empty(*q.shape[:3], 2 * HEAD_DIM, dtype=q.dtype)[..., ::2].copy_(q)
    flash_attn_func(strided_last, k, v, causal=True)
    handed = launches.last()["q"]
    assert handed.strides == PACKED and handed.data != strided_last.data_ptr()
    flash_attn_func(odd_strides(q), k, v, causal=True)
    assert launches.last()["q"].strides == PACKED


# --- the reused structs are never overwritten while in use --------------------------------------------------


def test_structs_in_use_are_never_handed_to_another_call() -> None:
    strides = ((8, 4, 2, 1), (16, 8, 4, 1))
    structs = _ops._TensorStructs(strides)
    assert [seen(s) for s in structs.shared[:2]] == [CStruct(0, strides[0]), CStruct(0, strides[1])]
    assert structs.take() is True
    # Another thread, or a call re-entered before the first gave its structs back, gets fresh ones.
    assert structs.take() is False
    fresh = structs.fresh()
    assert all(a is not b for a, b in zip(fresh[:2], structs.shared[:2]))
    assert [seen(s) for s in fresh[:2]] == [CStruct(0, strides[0]), CStruct(0, strides[1])]
    assert fresh[2] is None and structs.shared[2] is None  # a dense signature has no dash_varlen
    structs.give_back()
    assert structs.take() is True
    structs.give_back()
    # A varlen signature's: no batch stride, and a dash_varlen of its own per set, with the totals and promise.
    template = _library.Varlen(0, 0, 30, 40, 1)
    packed = _ops._TensorStructs(((4, 2, 1), (8, 4, 1)), template)
    fresh = packed.fresh()
    assert [seen(s) for s in packed.shared[:2]] == [CStruct(0, (0, 4, 2, 1)), CStruct(0, (0, 8, 4, 1))]
    assert len({id(template), id(packed.shared[2]), id(fresh[2])}) == 3
    assert seen_varlen(packed.shared[2]) == seen_varlen(fresh[2]) == (0, 0, 30, 40, 1)


def test_threads_of_one_signature_each_hand_the_library_their_own_pointers(launches: Launches, monkeypatch) -> None:
    expected = threading.local()
    wrong: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def forward(shape, q, k, v, out, lse, workspace, workspace_bytes, stream, sm_margin=0, varlen=None) -> None:
        # Other threads run while this one is "in the library", as during a C call, which releases the GIL.
        time.sleep(0)
        handed = (q.data, k.data, v.data)
        if handed != expected.pointers:
            wrong.append((handed, expected.pointers))

    def work() -> None:
        for _ in range(200):
            q, k, v = qkv()
            expected.pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
            _ops._forward_body(q, k, v, SCALE, True, "auto", 0)

    monkeypatch.setattr(_library, "forward", forward)
    workers = [threading.Thread(target=work) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert wrong == []
    assert _ops._cached_forward_call.cache_info().currsize == 1


# --- varlen signatures: the same descriptors, with the packed batch's dash_varlen ----------------------------

TOTAL_Q, TOTAL_K, SEQUENCES, MAX_Q, MAX_K = 20, 24, 3, 9, 10


def packed(rows: int, heads: int) -> torch.Tensor:
    return torch.randn(rows, heads, HEAD_DIM).to(torch.bfloat16)


def varlen_call(offsets_q, offsets_k, promise=False, schedule="auto"):
    """A varlen forward and backward through the op bodies: (out, lse, dq, dk, dv)."""
    q, k, v = packed(TOTAL_Q, HEADS), packed(TOTAL_K, KV_HEADS), packed(TOTAL_K, KV_HEADS)
    sequences = (offsets_q, offsets_k, MAX_Q, MAX_K, promise)
    out, lse = _ops._forward_body(q, k, v, SCALE, True, schedule, 0, -1, -1, 0.0, *sequences)
    dout = torch.randn_like(out)
    gradients = _ops._backward_body(dout, q, k, v, out, lse, SCALE, True, schedule, 0, -1, -1, 0.0, *sequences)
    return (out, lse, *gradients)


def test_a_varlen_signature_hands_each_call_its_offsets_and_plans_from_the_totals(launches: Launches) -> None:
    offsets = [torch.tensor([0, 5, 12, 20], dtype=torch.int32) for _ in range(2)]
    for cu in offsets:
        out, lse, dq, dk, dv = varlen_call(cu, cu, promise=True)
        assert out.shape == (TOTAL_Q, HEADS, HEAD_DIM) and lse.shape == (HEADS, TOTAL_Q)
        assert (dq.shape, dk.shape) == ((TOTAL_Q, HEADS, HEAD_DIM), (TOTAL_K, KV_HEADS, HEAD_DIM))
        handed = (cu.data_ptr(), cu.data_ptr(), TOTAL_Q, TOTAL_K, 1)
        assert launches.varlens[-2:] == [handed, handed]  # the forward's and the backward's
    # The C shape is the maximum problem; the packed tensors' structs have no batch stride.
    maximum = (SEQUENCES, MAX_Q, MAX_K, HEADS, KV_HEADS, HEAD_DIM)
    assert {fields[:6] for _, fields, _ in launches.calls} == {maximum}
    assert launches.last()["q"].strides == (0, HEADS * HEAD_DIM, HEAD_DIM, 1)
    # One descriptor per direction, one plan: made from the descriptor's dash_varlen (no offsets: a plan reads
    # none), keyed by the promise and the hint of the totals (3 * 9 > 20 query rows: some sequence is shorter).
    assert _ops._cached_forward_call.cache_info().currsize == 1
    assert _ops._cached_backward_call.cache_info().currsize == 1
    [(key, made_from)] = launches.plans
    assert key[-1] == (True, False) and made_from == (0, 0, TOTAL_Q, TOTAL_K, 1)


def test_the_promise_and_the_hint_are_their_own_plans_and_dense_is_another(launches: Launches) -> None:
    cu_q = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    cu_k = torch.tensor([0, 8, 16, 24], dtype=torch.int32)
    varlen_call(cu_q, cu_k, promise=False)
    varlen_call(cu_q, cu_q, promise=True)
    assert [key[-1] for key, _ in launches.plans] == [(False, False), (True, False)]
    assert launches.varlens[-1] == (cu_q.data_ptr(), cu_q.data_ptr(), TOTAL_Q, TOTAL_K, 1)
    q, k, v = qkv()
    out, lse = _ops._forward_body(q, k, v, SCALE, True, "auto", 0)
    run_backward(torch.randn_like(out), q, k, v, out, lse)
    assert launches.varlens[-2:] == [None, None] and launches.plans[-1][0][-1] is None
    assert len(launches.plans) == 3


def test_a_varlen_batch_without_rows_runs_nothing_and_clears_its_outputs(launches: Launches) -> None:
    q, k = packed(0, HEADS), packed(TOTAL_K, KV_HEADS)
    cu = torch.tensor([0, 0], dtype=torch.int32)
    out, lse = _ops._forward_body(q, k, k, SCALE, True, "auto", 0, -1, -1, 0.0, cu, cu, 1, 1, False)
    assert out.shape == (0, HEADS, HEAD_DIM) and lse.shape == (HEADS, 0)
    dq, dk, dv = _ops._backward_body(out, q, k, k, out, lse, SCALE, True, "auto", 0, -1, -1, 0.0, cu, cu, 1, 1, False)
    assert torch.all(dk == 0) and torch.all(dv == 0) and dq.shape == q.shape
    assert launches.calls == []


# --- forward_partial: context parallelism's forward with an fp32 out ------------------------------------------


def test_forward_partial_asks_for_an_fp32_out_through_the_same_descriptor(launches: Launches) -> None:
    q, k, v = qkv()
    out, _ = _ops._forward_body(q, k, v, SCALE, True, "auto", 0)
    partial, lse = _ops.forward_partial(q, k, v, SCALE, True, 16, -1)
    assert out.dtype == torch.bfloat16 and partial.dtype == torch.float32
    assert partial.shape == out.shape and partial.stride() == out.stride() and lse.dtype == torch.float32
    assert launches.out_fp32 == [False, True]
    # The out struct carries the fp32 tensor with its element strides (those of the packed bf16 out).
    assert launches.last()["out"] == CStruct(partial.data_ptr(), out.stride())
    # The window reaches the C shape; the unwindowed call and this one are two signatures.
    assert launches.calls[-1][1] != launches.calls[0][1]
    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    q, k, v = packed(TOTAL_Q, HEADS), packed(TOTAL_K, KV_HEADS), packed(TOTAL_K, KV_HEADS)
    partial, lse = _ops.forward_partial(q, k, v, SCALE, True, -1, -1, 0, cu, cu, MAX_Q, MAX_K, True)
    assert partial.dtype == torch.float32 and partial.shape == (TOTAL_Q, HEADS, HEAD_DIM)
    assert lse.shape == (HEADS, TOTAL_Q) and launches.out_fp32[-1] is True
    assert launches.varlens[-1] == (cu.data_ptr(), cu.data_ptr(), TOTAL_Q, TOTAL_K, 1)


def test_forward_partial_of_a_batch_without_rows_clears_an_fp32_out(launches: Launches) -> None:
    q, k = packed(0, HEADS), packed(TOTAL_K, KV_HEADS)
    cu = torch.tensor([0, 0], dtype=torch.int32)
    out, lse = _ops.forward_partial(q, k, k, SCALE, True, -1, -1, 0, cu, cu, 1, 1, False)
    assert out.dtype == torch.float32 and out.shape == (0, HEADS, HEAD_DIM) and lse.shape == (HEADS, 0)
    assert launches.calls == []
