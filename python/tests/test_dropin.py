"""Drop-in tests: FlashAttention-2's varlen entry points in FA2's order (flash_attn_varlen_func,
flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func), FA3's varlen order (dash_attn.fa3), FA2's
unpad_input/pad_input, and enable_sdpa()/disable_sdpa(), which route torch's F.scaled_dot_product_attention to DASH.

CPU (no GPU): the varlen calls run up to the kernel, which a recorder replaces, so each test sees the tensors, the
offsets and every resolved argument a spelling passes; FA2's and FA3's options DASH lacks are refused by name;
unpad_input/pad_input against FA2's documented results (five values), their round trip and their gradients; the
SDPA routing where torch has its registry (the dispatcher's CUDA kernel replaced, then given back) and where it does
not (monkeypatched away: a RuntimeError saying so, nothing changed), and what the routed kernels refuse or pass on.
GPU (skip without a Hopper GPU): every varlen spelling gives the bits of the keyword call, gradients included;
unpad -> varlen -> pad matches flash_attn_func on each sequence; F.scaled_dot_product_attention under enable_sdpa()
gives the bits of dash_attn.scaled_dot_product_attention, gradients included and repeated, and torch's own kernel
again after disable_sdpa().
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import dash_attn  # noqa: E402
from dash_attn import _ops, fa3, padding, sdpa  # noqa: E402
from dash_attn import varlen as varlen_module  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
LENGTHS = (4, 6)
TOTAL = sum(LENGTHS)


def raises(error: type[Exception], *fragments: str):
    return pytest.raises(error, match=".*".join(map(re.escape, fragments)))


@dataclass
class VarlenCall:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    arguments: dict[str, object]


# The forward op's arguments after q, k and v (_ops._Arguments), the offsets among them.
ARGUMENT_NAMES = (
    "softmax_scale",
    "causal",
    "schedule",
    "sm_margin",
    "window_left",
    "window_right",
    "softcap",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "keys_within_queries",
)


@pytest.fixture
def varlen_calls(monkeypatch) -> list[VarlenCall]:
    """Replaces the op call (_ops.attention) by a recorder (and lets CPU tensors past the device check)."""
    calls: list[VarlenCall] = []

    def record(q, k, v, *arguments):
        named = dict(zip(ARGUMENT_NAMES, arguments, strict=True))
        calls.append(VarlenCall(q, k, v, named.pop("cu_seqlens_q"), named.pop("cu_seqlens_k"), named))
        return torch.zeros_like(q), torch.zeros(q.shape[1], q.shape[0])

    monkeypatch.setattr(varlen_module, "_check_devices", lambda tensors, names: None)
    monkeypatch.setattr(_ops, "attention", record)
    return calls


def rows(heads: int = HEADS, total: int = TOTAL) -> torch.Tensor:
    return torch.zeros(total, heads, HEAD_DIM, dtype=torch.bfloat16)


def offsets() -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)


def only(calls: list[VarlenCall]) -> VarlenCall:
    assert len(calls) == 1
    return calls[0]


# --- FA2's varlen order -------------------------------------------------------------------------------------


def test_fa2_varlen_every_argument_positional(varlen_calls):
    cu = offsets()
    dash_attn.flash_attn_varlen_func(
        rows(), rows(KV_HEADS), rows(KV_HEADS), cu, cu, 6, 6, 0.0, 0.5, True, (3, 0), 2.0, None, False, False, None
    )
    call = only(varlen_calls)
    assert call.arguments == {
        "max_seqlen_q": 6,
        "max_seqlen_k": 6,
        "softmax_scale": 0.5,
        "causal": True,
        "schedule": "nondeterministic",
        "sm_margin": 0,
        "window_left": 3,
        "window_right": 0,
        "softcap": 2.0,
        "keys_within_queries": True,
    }


def test_fa2_varlen_common_positional_call_with_dropout_zero(varlen_calls):
    cu_q, cu_k = offsets(), offsets()
    dash_attn.flash_attn_varlen_func(rows(), rows(KV_HEADS), rows(KV_HEADS), cu_q, cu_k, 6, 6, 0.0, causal=True)
    dash_attn.flash_attn_varlen_func(rows(), rows(KV_HEADS), rows(KV_HEADS), cu_q, cu_k, 6, 6, dropout_p=0.0)
    first, second = varlen_calls
    assert first.arguments["causal"] and first.arguments["softmax_scale"] == HEAD_DIM**-0.5
    assert first.arguments["schedule"] != "nondeterministic"  # deterministic defaults to True
    assert not first.arguments["keys_within_queries"]  # two offsets tensors: no promise
    assert not second.arguments["causal"]


@pytest.mark.parametrize(
    ("options", "named", "reason"),
    [
        ({"dropout_p": 0.1}, "dropout_p=0.1", "DASH has no attention dropout"),
        ({"alibi_slopes": torch.zeros(HEADS)}, "alibi_slopes=<torch.float32 tensor of shape (4,)>", "no ALiBi"),
        ({"block_table": torch.zeros(2, 1, dtype=torch.int32)}, "block_table=<torch.int32", "no paged KV cache"),
    ],
    ids=["dropout", "alibi", "block_table"],
)
def test_fa2_varlen_refuses_what_dash_lacks_by_name(varlen_calls, options, named, reason):
    cu = offsets()
    with raises(NotImplementedError, named, "is not supported", reason):
        dash_attn.flash_attn_varlen_func(rows(), rows(KV_HEADS), rows(KV_HEADS), cu, cu, 6, 6, **options)
    assert not varlen_calls


def test_fa2_varlen_returns_fa2s_tuples(varlen_calls):
    cu = offsets()
    tensors = (rows(), rows(KV_HEADS), rows(KV_HEADS), cu, cu, 6, 6)
    out = dash_attn.flash_attn_varlen_func(*tensors)
    out, lse, s_dmask = dash_attn.flash_attn_varlen_func(*tensors, return_attn_probs=True)
    assert lse.shape == (HEADS, TOTAL) and s_dmask.numel() == 0
    out, lse = dash_attn.flash_attn_varlen_func(*tensors, return_lse=True)
    with raises(ValueError, "return_attn_probs=True and return_lse=True ask for different tuples"):
        dash_attn.flash_attn_varlen_func(*tensors, return_attn_probs=True, return_lse=True)


def test_fa2_varlen_kvpacked_reads_views_of_kv(varlen_calls):
    kv = torch.zeros(TOTAL, 2, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    cu = offsets()
    dash_attn.flash_attn_varlen_kvpacked_func(rows(), kv, cu, cu, 6, 6, 0.0, None, True)
    call = only(varlen_calls)
    assert call.k.data_ptr() == kv[:, 0].data_ptr() and call.v.data_ptr() == kv[:, 1].data_ptr()
    assert call.k.shape == (TOTAL, KV_HEADS, HEAD_DIM) and call.arguments["causal"]


def test_fa2_varlen_qkvpacked_reads_views_and_promises_self_attention(varlen_calls):
    qkv = torch.zeros(TOTAL, 3, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    cu = offsets()
    dash_attn.flash_attn_varlen_qkvpacked_func(qkv, cu, 6, 0.0, 0.25, True)
    call = only(varlen_calls)
    assert [t.data_ptr() for t in (call.q, call.k, call.v)] == [qkv[:, i].data_ptr() for i in range(3)]
    assert call.cu_seqlens_q is call.cu_seqlens_k is cu
    assert call.arguments["keys_within_queries"] and call.arguments["softmax_scale"] == 0.25
    assert (call.arguments["max_seqlen_q"], call.arguments["max_seqlen_k"]) == (6, 6)


@pytest.mark.parametrize(
    ("function", "packed", "message"),
    [
        ("kv", torch.zeros(TOTAL, 3, KV_HEADS, HEAD_DIM), "kv must be 4-D (total_tokens, 2, heads, head_dim)"),
        ("qkv", torch.zeros(1, TOTAL, 3, HEADS, HEAD_DIM), "qkv must be 4-D (total_tokens, 3, heads, head_dim)"),
    ],
)
def test_fa2_varlen_packed_shapes_are_refused_by_name(function, packed, message):
    cu = offsets()
    with raises(ValueError, message):
        if function == "kv":
            dash_attn.flash_attn_varlen_kvpacked_func(rows(), packed, cu, cu, 6, 6)
        else:
            dash_attn.flash_attn_varlen_qkvpacked_func(packed, cu, 6)


# --- FA3's varlen order -------------------------------------------------------------------------------------


def test_fa3_varlen_positional_seqused_then_scale_then_causal(varlen_calls):
    cu = offsets()
    fa3.flash_attn_varlen_func(rows(), rows(KV_HEADS), rows(KV_HEADS), cu, cu, 6, 6, None, None, 0.5, True)
    call = only(varlen_calls)
    assert call.arguments["softmax_scale"] == 0.5 and call.arguments["causal"]


def test_fa3_varlen_every_argument_positional(varlen_calls):
    cu = offsets()
    fa3.flash_attn_varlen_func(
        rows(),
        rows(KV_HEADS),
        rows(KV_HEADS),
        cu,
        cu,
        6,
        6,
        None,
        None,
        0.5,
        True,
        None,
        None,
        None,
        None,
        (8, 0),
        0,
        3.0,
        1,
        None,
        False,
        2,
        False,
    )
    assert only(varlen_calls).arguments == {
        "max_seqlen_q": 6,
        "max_seqlen_k": 6,
        "softmax_scale": 0.5,
        "causal": True,
        "schedule": "nondeterministic",
        "sm_margin": 2,
        "window_left": 8,
        "window_right": 0,
        "softcap": 3.0,
        "keys_within_queries": True,
    }


@pytest.mark.parametrize(
    ("options", "named", "reason"),
    [
        ({"seqused_q": torch.tensor(LENGTHS, dtype=torch.int32)}, "seqused_q=", "from the offsets alone"),
        ({"seqused_k": torch.tensor(LENGTHS, dtype=torch.int32)}, "seqused_k=", "from the offsets alone"),
        ({"qv": rows()}, "qv=", "no extra query-value product"),
        ({"q_descale": torch.ones(2, KV_HEADS)}, "q_descale=", "no FP8 inputs"),
        ({"attention_chunk": 64}, "attention_chunk=64", "no chunked attention"),
        ({"num_splits": 4}, "num_splits=4", "never splits the keys"),
    ],
    ids=["seqused_q", "seqused_k", "qv", "q_descale", "attention_chunk", "num_splits"],
)
def test_fa3_varlen_refuses_what_dash_lacks_by_name(varlen_calls, options, named, reason):
    cu = offsets()
    with raises(NotImplementedError, named, "is not supported", reason):
        fa3.flash_attn_varlen_func(rows(), rows(KV_HEADS), rows(KV_HEADS), cu, cu, 6, 6, **options)
    assert not varlen_calls


def test_fa3_varlen_returns_out_or_out_and_lse(varlen_calls):
    cu = offsets()
    tensors = (rows(), rows(KV_HEADS), rows(KV_HEADS), cu, cu, 6, 6)
    assert isinstance(fa3.flash_attn_varlen_func(*tensors), torch.Tensor)
    out, lse = fa3.flash_attn_varlen_func(*tensors, return_attn_probs=True)
    assert lse.shape == (HEADS, TOTAL)


@pytest.mark.parametrize(
    "function",
    [
        dash_attn.flash_attn_varlen_func,
        dash_attn.flash_attn_varlen_kvpacked_func,
        dash_attn.flash_attn_varlen_qkvpacked_func,
        fa3.flash_attn_varlen_func,
    ],
    ids=lambda f: f"{f.__module__}.{f.__name__}",
)
def test_varlen_deterministic_defaults_to_true(function):
    import inspect

    assert inspect.signature(function).parameters["deterministic"].default is True


# --- unpad_input / pad_input --------------------------------------------------------------------------------


def padded_states() -> tuple[torch.Tensor, torch.Tensor]:
    hidden = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.int64)
    return hidden, mask


def test_unpad_input_returns_fa2s_five_values():
    hidden, mask = padded_states()
    rows_, indices, cu_seqlens, max_seqlen, seqused = dash_attn.unpad_input(hidden, mask)
    assert indices.dtype == torch.int64 and indices.tolist() == [0, 1, 2, 6, 7, 8, 9]
    assert torch.equal(rows_, hidden.reshape(10, 3)[indices])
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 7]
    assert type(max_seqlen) is int and max_seqlen == 4
    assert seqused.dtype == torch.int32 and seqused.tolist() == [3, 4]


def test_unused_tokens_are_kept_but_not_counted_as_used():
    hidden, mask = padded_states()
    unused = torch.zeros_like(mask)
    unused[0, 3] = 1
    _, indices, cu_seqlens, max_seqlen, seqused = dash_attn.unpad_input(hidden, mask, unused)
    assert indices.tolist() == [0, 1, 2, 3, 6, 7, 8, 9] and cu_seqlens.tolist() == [0, 4, 8]
    assert seqused.tolist() == [3, 4] and max_seqlen == 4


def test_pad_input_undoes_unpad_input_with_zeros_at_padding():
    hidden, mask = padded_states()
    rows_, indices, *_ = dash_attn.unpad_input(hidden, mask)
    restored = dash_attn.pad_input(rows_, indices, 2, 5)
    assert torch.equal(restored, hidden * mask[..., None])


def test_both_moves_carry_gradients_to_exactly_their_rows():
    hidden, mask = padded_states()
    hidden.requires_grad_()
    rows_, indices, *_ = dash_attn.unpad_input(hidden, mask)
    packed = rows_.detach().requires_grad_()
    dash_attn.pad_input(packed, indices, 2, 5).sum().backward()
    assert torch.equal(packed.grad, torch.ones_like(packed))
    rows_.sum().backward()
    assert torch.equal(hidden.grad, mask[..., None].float().expand_as(hidden))


def test_the_moves_run_under_the_determinism_switch():
    hidden, mask = padded_states()
    enabled = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        hidden.requires_grad_()
        rows_, indices, *_ = dash_attn.unpad_input(hidden, mask)
        dash_attn.pad_input(rows_, indices, 2, 5).sum().backward()
    finally:
        torch.use_deterministic_algorithms(enabled)
    assert torch.equal(hidden.grad, mask[..., None].float().expand_as(hidden))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda h, m: dash_attn.unpad_input(h, m[:, :4]),
            ValueError,
            "attention_mask must be (batch, seqlen) = (2, 5)",
        ),
        (lambda h, m: dash_attn.unpad_input(h, m.float()), TypeError, "attention_mask must be a bool or integer"),
        (lambda h, m: dash_attn.unpad_input(h[0, 0], m), ValueError, "hidden_states must be (batch, seqlen, ...)"),
        (lambda h, m: dash_attn.unpad_input(h, m, m[:1]), ValueError, "unused_mask must be (batch, seqlen)"),
        (lambda h, m: dash_attn.pad_input(h[0], torch.arange(4), 2, 5), ValueError, "indices must be a 1-D integer"),
        (lambda h, m: dash_attn.pad_input(h[0], torch.arange(5), 2.0, 5), TypeError, "batch must be an int >= 0"),
    ],
    ids=["mask_shape", "mask_dtype", "hidden_rank", "unused_shape", "indices_length", "batch_type"],
)
def test_padding_arguments_are_refused_by_name(call, error, message):
    hidden, mask = padded_states()
    with raises(error, message):
        call(hidden, mask)


def test_padding_helpers_are_exported_where_fa2_users_find_them():
    assert dash_attn.unpad_input is padding.unpad_input and dash_attn.pad_input is padding.pad_input


# --- SDPA routing -------------------------------------------------------------------------------------------


def cuda_kernel_line() -> str:
    dump = torch._C._dispatch_dump("aten::_scaled_dot_product_flash_attention")
    return next(line for line in dump.splitlines() if line.startswith("CUDA:"))


@pytest.fixture
def routing():
    """Leaves SDPA's flash backend as it found it."""
    yield
    sdpa.disable_sdpa()


def test_without_torchs_registry_enable_sdpa_says_so_and_changes_nothing(routing, monkeypatch):
    from torch.nn import attention

    before = cuda_kernel_line()
    for name in ("register_flash_attention_impl", "activate_flash_attention_impl"):
        monkeypatch.delattr(attention, name, raising=False)
    with raises(
        RuntimeError,
        "offers no way to register a flash attention implementation",
        "dash_attn.scaled_dot_product_attention",
    ):
        dash_attn.enable_sdpa()
    assert not dash_attn.sdpa_enabled() and cuda_kernel_line() == before


def test_enable_sdpa_replaces_the_flash_kernel_and_disable_sdpa_gives_it_back(routing):
    from torch.nn import attention

    if sdpa._flash_registry() is None:
        pytest.skip(f"torch {torch.__version__} has no flash attention registry")
    torchs_own = cuda_kernel_line()
    dash_attn.enable_sdpa()
    assert dash_attn.sdpa_enabled() and cuda_kernel_line() != torchs_own
    assert "DASH" in attention.list_flash_attention_impls()
    if hasattr(attention, "current_flash_attention_impl"):
        assert attention.current_flash_attention_impl() == "DASH"
    dash_attn.enable_sdpa(deterministic=False)  # again: only the flag changes
    assert sdpa._routing.deterministic is False
    dash_attn.disable_sdpa()
    assert not dash_attn.sdpa_enabled() and cuda_kernel_line() == torchs_own
    if hasattr(attention, "current_flash_attention_impl"):
        assert attention.current_flash_attention_impl() is None
    dash_attn.disable_sdpa()  # again: nothing to do


def bhsd(seqlen: int = 8, heads: int = HEADS) -> torch.Tensor:
    return torch.zeros(2, heads, seqlen, HEAD_DIM, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"dropout_p": 0.1}, NotImplementedError, "dropout_p=0.1 is not supported"),
        ({"return_debug_mask": True}, NotImplementedError, "return_debug_mask=True is not supported"),
        ({"is_causal": True, "key": bhsd(12, KV_HEADS)}, NotImplementedError, "is_causal=True with query.shape[2]"),
    ],
    ids=["dropout", "debug_mask", "causal_unequal"],
)
def test_the_routed_forward_refuses_what_dash_does_not_compute(options, error, message):
    arguments = {"query": bhsd(), "key": bhsd(heads=KV_HEADS), "value": bhsd(heads=KV_HEADS), **options}
    if "key" in options:
        arguments["value"] = options["key"]
    with raises(error, message):
        sdpa._sdpa_flash_forward(**arguments)


def test_the_routed_forward_returns_what_sdpas_flash_op_returns(monkeypatch):
    seen = {}

    def attend(tensors, layout, **options):
        seen.update(options)
        q = tensors[0]
        return torch.zeros_like(q), torch.zeros(q.shape[0], q.shape[1], q.shape[2])

    monkeypatch.setattr(sdpa, "attend", attend)
    query = bhsd()
    result = sdpa._sdpa_flash_forward(query, bhsd(heads=KV_HEADS), bhsd(heads=KV_HEADS), 0.0, True, scale=0.3)
    out, lse, cum_q, cum_k, max_q, max_k, rng_state, offset, debug_mask = result
    assert out.shape == query.shape and lse.shape == (2, HEADS, 8) and cum_q is None and cum_k is None
    assert (max_q, max_k) == (8, 8) and rng_state.shape == (2,) and offset.shape == ()
    assert debug_mask.numel() == 0
    assert seen["softmax_scale"] == 0.3 and seen["causal"] is True and seen["deterministic"] is True


def test_the_routed_backward_runs_dashs_deterministic_backward_on_bshd_views(monkeypatch):
    seen = {}

    def attention_backward(dout, q, k, v, out, lse, **options):
        seen.update(options, shapes=[tuple(t.shape) for t in (dout, q, k, v, out)])
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(sdpa, "attention_backward", attention_backward)
    query, key = bhsd(), bhsd(heads=KV_HEADS)
    dq, dk, dv = sdpa._sdpa_flash_backward(
        query,
        query,
        key,
        key,
        query,
        torch.zeros(2, HEADS, 8),
        None,
        None,
        8,
        8,
        0.0,
        True,
        torch.zeros(2),
        torch.zeros(()),
        scale=0.3,
    )
    assert dq.shape == query.shape and dk.shape == key.shape and dv.shape == key.shape
    assert seen["shapes"] == [
        (2, 8, HEADS, HEAD_DIM),
        (2, 8, HEADS, HEAD_DIM),
        (2, 8, KV_HEADS, HEAD_DIM),
        (2, 8, KV_HEADS, HEAD_DIM),
        (2, 8, HEADS, HEAD_DIM),
    ]
    assert seen["deterministic"] is True and seen["softmax_scale"] == 0.3 and seen["causal"] is True


# --- GPU ----------------------------------------------------------------------------------------------------


def gpu_rows(device, heads, total=TOTAL, seed=0):
    generator = torch.Generator(device).manual_seed(seed)
    return torch.randn(total, heads, HEAD_DIM, generator=generator, device=device).to(torch.bfloat16)


def run_with_grads(function, tensors, *args, **kwargs):
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = function(*leaves, *args, **kwargs)
    out.backward(torch.ones_like(out))
    return out.detach(), [t.grad for t in leaves]


def skip_without_varlen(library, require_kernel):
    require_kernel(HEAD_DIM, torch.bfloat16)
    if not library.kernel_available(HEAD_DIM, library.DTYPE_BF16, varlen=True):
        pytest.skip("this build has no varlen kernels for head_dim 64 / bf16 (DASH_VARLEN_KERNELS)")


def test_gpu_every_varlen_spelling_gives_the_bits_of_the_keyword_call(device, library, require_kernel):
    skip_without_varlen(library, require_kernel)
    q, k, v = gpu_rows(device, HEADS, seed=1), gpu_rows(device, HEADS, seed=2), gpu_rows(device, HEADS, seed=3)
    cu = offsets().to(device)
    keyword_out, keyword_grads = run_with_grads(dash_attn.flash_attn_varlen_func, (q, k, v), cu, cu, 6, 6, causal=True)
    spellings = {
        "fa2_positional": lambda q_, k_, v_: dash_attn.flash_attn_varlen_func(
            q_, k_, v_, cu, cu, 6, 6, 0.0, None, True
        ),
        "fa3_positional": lambda q_, k_, v_: fa3.flash_attn_varlen_func(
            q_, k_, v_, cu, cu, 6, 6, None, None, None, True
        ),
        "kvpacked": lambda q_, k_, v_: dash_attn.flash_attn_varlen_kvpacked_func(
            q_, torch.stack((k_, v_), dim=1), cu, cu, 6, 6, 0.0, None, True
        ),
        "qkvpacked": lambda q_, k_, v_: dash_attn.flash_attn_varlen_qkvpacked_func(
            torch.stack((q_, k_, v_), dim=1), cu, 6, 0.0, None, True
        ),
    }
    for name, spelling in spellings.items():
        out, grads = run_with_grads(spelling, (q, k, v))
        assert torch.equal(out, keyword_out), name
        assert all(torch.equal(a, b) for a, b in zip(grads, keyword_grads)), name


def test_gpu_unpad_varlen_pad_matches_each_sequence_alone(device, library, require_kernel):
    skip_without_varlen(library, require_kernel)
    batch, seqlen = 3, 40
    mask = torch.ones(batch, seqlen, dtype=torch.bool, device=device)
    mask[0, 25:] = False  # right padding
    mask[1, :13] = False  # left padding
    generator = torch.Generator(device).manual_seed(4)
    q, k, v = (
        torch.randn(batch, seqlen, heads, HEAD_DIM, generator=generator, device=device).to(torch.bfloat16)
        for heads in (HEADS, KV_HEADS, KV_HEADS)
    )
    q_rows, indices, cu, max_seqlen, _ = dash_attn.unpad_input(q, mask)
    k_rows, v_rows = (dash_attn.unpad_input(t, mask)[0] for t in (k, v))
    out = dash_attn.pad_input(
        dash_attn.flash_attn_varlen_func(q_rows, k_rows, v_rows, cu, cu, max_seqlen, max_seqlen, causal=True),
        indices,
        batch,
        seqlen,
    )
    for b in range(batch):
        keep = mask[b]
        alone = dash_attn.flash_attn_func(q[b, keep][None], k[b, keep][None], v[b, keep][None], causal=True)[0]
        error = (out[b, keep].float() - alone.float()).norm() / alone.float().norm()
        assert error < 1e-2, f"sequence {b}: relative error {error:.3g}"
        assert not out[b, ~keep].any()


def test_gpu_sdpa_routed_to_dash_gives_dashs_bits_and_torchs_own_after_disable(device, require_kernel, routing):
    require_kernel(HEAD_DIM, torch.bfloat16)
    if sdpa._flash_registry() is None:
        pytest.skip(f"torch {torch.__version__} has no flash attention registry")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator(device).manual_seed(5)
    query, key, value = (
        torch.randn(2, HEADS, 256, HEAD_DIM, generator=generator, device=device).to(torch.bfloat16) for _ in range(3)
    )

    def torch_sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    dash_out, dash_grads = run_with_grads(dash_attn.scaled_dot_product_attention, (query, key, value), is_causal=True)
    dash_attn.enable_sdpa()
    routed = [run_with_grads(torch_sdpa, (query, key, value)) for _ in range(2)]
    for out, grads in routed:
        assert torch.equal(out, dash_out)
        assert all(torch.equal(a, b) for a, b in zip(grads, dash_grads))
    dash_attn.disable_sdpa()
    own_out, _ = run_with_grads(torch_sdpa, (query, key, value))
    error = (own_out.float() - dash_out.float()).norm() / dash_out.float().norm()
    assert error < 1e-2  # torch's own flash kernel again: the same attention, its own bits
