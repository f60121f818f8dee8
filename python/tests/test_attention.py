"""GPU tests of dash_attn against PyTorch's math SDPA on float32 upcasts of the same inputs: forward output,
LSE and gradients over ragged lengths, seqlen_q != seqlen_k both ways under an explicit bottom-right causal
mask, GQA and MQA; the SDPA-layout entry; the copy path for tensors the kernels cannot read in place;
bitwise-identical gradients over repeated runs (and the negative control that shows the comparison can
fail); torch.compile(fullgraph=True); and library errors as RuntimeError. Without a Hopper GPU every test
skips and says why.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import dash_attn  # noqa: E402
from dash_attn import flash_attn_func, scaled_dot_product_attention  # noqa: E402
from dash_attn._library import BACKWARD_HEAD_DIMS  # noqa: E402
from dash_attn._library import HEAD_DIMS as SUPPORTED_HEAD_DIMS  # noqa: E402

# Tolerances against the float32 reference, the same as the C++ kernel tests (src/harness): bf16 keeps 8
# significant bits (unit roundoff 2^-9, about 2e-3) and fp16 11 (2^-12, about 2.4e-4). The inputs are
# exact in both, but P, dS and the outputs are each rounded once to the 16-bit type, so a correct kernel
# lands a few roundoffs from the reference: a relative L2 error of a few units and a largest error a
# little larger, relative to the largest reference value. An indexing or masking bug misses by O(1).
TOLERANCES = {torch.bfloat16: (1.5e-2, 5e-2), torch.float16: (4e-3, 1.5e-2)}  # (relative L2, max error)
# A gradient that is exactly zero in exact arithmetic (one visible key: dS = 0) comes out at rounding level,
# so the max-error bound is taken relative to at least this magnitude (inputs are N(0, 1)).
MAGNITUDE_FLOOR = 1e-2
# The LSE is computed in fp32 from the exact 16-bit inputs on both sides; only summation order differs.
LSE_TOLERANCE = 1e-3

DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = list(BACKWARD_HEAD_DIMS)  # forward and backward
assert HEAD_DIMS == list(SUPPORTED_HEAD_DIMS), "every supported head dim has a backward (kBackwardHeadDims)"
DETERMINISM_RUNS = 20
NEGATIVE_CONTROL_RUNS = 100

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, causal): ragged lengths, seqlen_q != seqlen_k both ways
# (with causal rows that see no key when seqlen_q > seqlen_k), GQA and MQA; the C++ tests' shapes.
SHAPES = [
    (2, 256, 256, 4, 4, False),
    (2, 256, 256, 4, 4, True),
    (1, 130, 130, 2, 2, True),
    (1, 77, 300, 4, 2, True),
    (1, 77, 300, 4, 2, False),
    (2, 300, 77, 4, 1, True),
    (1, 1, 1, 1, 1, False),
    (1, 513, 1031, 8, 2, False),
    (2, 640, 640, 6, 3, True),
]


def shape_id(shape: tuple) -> str:
    b, sq, sk, hq, hkv, causal = shape
    return f"B{b}-Sq{sq}-Sk{sk}-Hq{hq}-Hkv{hkv}-{'causal' if causal else 'full'}"


def random_inputs(
    shape: tuple, head_dim: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and dout, N(0, 1) rounded to `dtype`, in (B, S, H, D)."""
    b, sq, sk, hq, hkv, _ = shape
    generator = torch.Generator(device).manual_seed(seed)

    def draw(seqlen: int, heads: int, grad: bool) -> torch.Tensor:
        t = torch.randn(b, seqlen, heads, head_dim, generator=generator, device=device).to(dtype)
        return t.requires_grad_(grad)

    return draw(sq, hq, True), draw(sk, hkv, True), draw(sk, hkv, True), draw(sq, hq, False)


def bottom_right_mask(seqlen_q: int, seqlen_k: int, device: torch.device) -> torch.Tensor:
    """DASH's (and FlashAttention's) causal mask: row i sees key j iff j <= i + seqlen_k - seqlen_q."""
    rows = torch.arange(seqlen_q, device=device)[:, None]
    cols = torch.arange(seqlen_k, device=device)[None, :]
    return cols <= rows + (seqlen_k - seqlen_q)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, ...]:
    """out, lse, dq, dk, dv from PyTorch's math SDPA on float32 upcasts. The math backend's safe softmax
    gives rows that see no key a zero output and zero gradients, which is DASH's contract too."""
    q32, k32, v32 = (t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    mask = bottom_right_mask(q.shape[1], k.shape[1], q.device) if causal else None
    gqa = q.shape[2] != k.shape[2]
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=mask, scale=scale, enable_gqa=gqa)
    out.backward(dout.float().transpose(1, 2))
    groups = q.shape[2] // k.shape[2]
    scores = q32.detach() @ k32.detach().repeat_interleave(groups, dim=1).transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return (out.transpose(1, 2), lse, *(t.grad.transpose(1, 2) for t in (q32, k32, v32)))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    rel_l2_tol, max_tol = TOLERANCES[dtype]
    actual, expected = actual.double(), expected.double()
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    error = (actual - expected).abs()
    # An all-zero reference (one visible key gives dQ = 0) has no relative error: take the absolute one.
    reference_norm = expected.norm().item()
    rel_l2 = error.norm().item() / (reference_norm if reference_norm > 0 else 1.0)
    max_error = error.max().item()
    bound = max_tol * max(expected.abs().max().item(), MAGNITUDE_FLOOR)
    assert rel_l2 <= rel_l2_tol and max_error <= bound, (
        f"{what}: relative L2 error {rel_l2:.3g} (tolerance {rel_l2_tol}), max error {max_error:.3g} "
        f"(tolerance {bound:.3g})"
    )


def run(q, k, v, dout, **kwargs) -> tuple[torch.Tensor, ...]:
    """out, lse, dq, dk, dv of one flash_attn_func call (leaves' gradients reset first)."""
    for t in (q, k, v):
        t.grad = None
    out, lse = flash_attn_func(q, k, v, return_lse=True, **kwargs)
    out.backward(dout)
    return out.detach(), lse, q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_math_sdpa(device, require_kernel, shape, head_dim, dtype) -> None:
    require_kernel(head_dim, dtype)
    q, k, v, dout = random_inputs(shape, head_dim, dtype, device, seed=sum(shape[:5]) * 1000 + head_dim)
    causal = shape[-1]
    scale = head_dim**-0.5
    got = run(q, k, v, dout, causal=causal)
    expected = reference(q, k, v, dout, scale, causal)
    assert got[0].shape == q.shape and got[0].dtype == dtype
    assert_close(got[0], expected[0], dtype, "out")
    torch.testing.assert_close(got[1], expected[1], atol=LSE_TOLERANCE, rtol=LSE_TOLERANCE, msg="lse")
    for name, actual, wanted in zip(("dq", "dk", "dv"), got[2:], expected[2:]):
        assert actual.shape == wanted.shape and actual.dtype == dtype
        assert_close(actual, wanted, dtype, name)


def test_sdpa_layout_matches_flash_attn_func_bitwise(device, require_kernel) -> None:
    require_kernel(128, torch.bfloat16)
    shape = (2, 256, 256, 8, 2, True)
    q, k, v, dout = random_inputs(shape, 128, torch.bfloat16, device, seed=7)
    expected = run(q, k, v, dout, causal=True)
    # SDPA-layout leaves, so the (B, S, H, D) tensors the op sees are transposed views.
    query, key, value = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    out = scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
    out.backward(dout.transpose(1, 2))
    assert out.shape == query.shape
    for actual, wanted in zip((out, query.grad, key.grad, value.grad), (expected[0], *expected[2:])):
        assert torch.equal(actual.transpose(1, 2), wanted)


def test_tensors_the_kernels_cannot_read_in_place_are_copied(device, require_kernel) -> None:
    require_kernel(128, torch.bfloat16)
    shape = (1, 200, 200, 4, 2, False)
    q, k, v, dout = random_inputs(shape, 128, torch.bfloat16, device, seed=11)
    expected = run(q, k, v, dout)

    # q misaligned by one element (2 bytes); k with a head stride of 132 elements (not a multiple of 8).
    storage = torch.empty(q.numel() + 1, dtype=q.dtype, device=device)
    q_odd = storage[1:].view(q.shape).copy_(q.detach()).requires_grad_()
    padded = torch.zeros(*k.shape[:-1], k.shape[-1] + 4, dtype=k.dtype, device=device)
    padded[..., : k.shape[-1]] = k.detach()
    k_odd = padded.requires_grad_()
    v_odd = v.detach().clone().requires_grad_()
    out = flash_attn_func(q_odd, k_odd[..., : k.shape[-1]], v_odd)
    out.backward(dout)
    assert torch.equal(out, expected[0])
    assert torch.equal(q_odd.grad, expected[2])
    assert torch.equal(k_odd.grad[..., : k.shape[-1]], expected[3])
    assert torch.equal(v_odd.grad, expected[4])

    # The upstream gradient of a sum is a broadcast of ones (stride 0), which the backward copies.
    for t in (q, k, v):
        t.grad = None
    flash_attn_func(q, k, v).sum().backward()
    from_sum = (q.grad, k.grad, v.grad)
    from_ones = run(q, k, v, torch.ones_like(dout))[2:]
    for got, wanted in zip(from_sum, from_ones):
        assert torch.equal(got, wanted)


DETERMINISTIC_SCHEDULES = [s for s in dash_attn.SCHEDULES if s != "nondeterministic"]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("schedule", DETERMINISTIC_SCHEDULES)
@pytest.mark.parametrize("head_dim", [96, 128])
def test_gradients_are_bitwise_identical_over_runs(device, require_kernel, head_dim, schedule, causal) -> None:
    require_kernel(head_dim, torch.bfloat16)
    # Many key tiles per query tile, GQA: the shape where an unordered dQ sum would race.
    shape = (2, 1024, 1024, 8, 2, causal)
    q, k, v, dout = random_inputs(shape, head_dim, torch.bfloat16, device, seed=3)
    try:
        first = run(q, k, v, dout, causal=causal, schedule=schedule)
    except dash_attn.LibraryError as error:
        if error.status != "schedule-rejected":
            raise
        pytest.skip(f"schedule {schedule} does not apply to this shape: {error.message}")
    for attempt in range(DETERMINISM_RUNS):
        again = run(q, k, v, dout, causal=causal, schedule=schedule)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs between run 0 and run {attempt + 1}"


def test_negative_control_nondeterministic_schedule_is_caught(device, require_kernel) -> None:
    """The comparison above must be able to fail: under the full mask every key tile of a head reaches the
    same query tile at once, so the unordered atomic dQ sum races and its bits change between runs."""
    require_kernel(128, torch.bfloat16)
    shape = (2, 1024, 1024, 4, 4, False)
    q, k, v, dout = random_inputs(shape, 128, torch.bfloat16, device, seed=5)
    first = run(q, k, v, dout, deterministic=False)[2].clone()
    differing = sum(
        not torch.equal(first, run(q, k, v, dout, deterministic=False)[2]) for _ in range(NEGATIVE_CONTROL_RUNS)
    )
    assert differing > 0, f"deterministic=False gave identical dq in all {NEGATIVE_CONTROL_RUNS} runs"


def test_torch_compile_fullgraph_forward_and_backward(device, require_kernel) -> None:
    require_kernel(128, torch.bfloat16)
    shape = (2, 384, 384, 8, 2, True)
    q, k, v, dout = random_inputs(shape, 128, torch.bfloat16, device, seed=13)

    def attention_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Surrounding ops, so the compiled graph holds more than the custom op.
        return flash_attn_func(q * 0.5, k, v, causal=True).float().square()

    def forward_backward(block) -> tuple[torch.Tensor, ...]:
        for t in (q, k, v):
            t.grad = None
        out = block(q, k, v)
        out.backward(dout.float())
        return out.detach(), q.grad, k.grad, v.grad

    eager = forward_backward(attention_block)
    compiled = forward_backward(torch.compile(attention_block, fullgraph=True))
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, compiled):
        assert torch.equal(a, b), f"{name} differs between eager and torch.compile"


def test_library_errors_are_runtime_errors_with_status_and_message(device, require_kernel) -> None:
    require_kernel(128, torch.bfloat16)
    # The op itself, bypassing flash_attn_func's checks: the library's own message comes through.
    t = torch.zeros(1, 64, 2, 80, dtype=torch.bfloat16, device=device)
    with pytest.raises(
        RuntimeError, match=r"not-supported.*shape\.head_dim must be one of \{64, 96, 128, 192, 256\}, got 80"
    ):
        torch.ops.dash_attn.forward(t, t, t, 80**-0.5, False, "auto")
    # A schedule whose preconditions fail (shift scheduling is for the full mask) is refused by the backward.
    q, k, v, dout = random_inputs((1, 256, 256, 2, 2, True), 128, torch.bfloat16, device, seed=17)
    out = flash_attn_func(q, k, v, causal=True, schedule="shift")
    with pytest.raises(dash_attn.LibraryError, match="schedule-rejected") as caught:
        out.backward(dout)
    assert caught.value.status == "schedule-rejected"


@pytest.mark.parametrize("head_dim", [192, 256])
def test_symmetric_shift_at_head_dims_192_and_256_is_refused_naming_the_rule(device, require_kernel, head_dim) -> None:
    # The backward's 64x96 and 64x80 tiles at d = 192 and 256: symmetric shift needs block_kv to be a multiple of
    # block_q.
    require_kernel(head_dim, torch.bfloat16)
    q, k, v, dout = random_inputs((1, 256, 256, 2, 2, True), head_dim, torch.bfloat16, device, seed=19)
    out = flash_attn_func(q, k, v, causal=True, schedule="symmetric-shift")
    with pytest.raises(dash_attn.LibraryError, match="symmetric-shift needs block_kv to be a multiple of block_q"):
        out.backward(dout)
