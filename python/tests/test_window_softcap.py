"""GPU tests of window_size and softcap in dash_attn against a pure-torch float32 reference (explicit scores, the
bottom-right aligned window mask of FlashAttention, softcap * tanh(score / softcap), softmax, autograd for the
gradients): forward output, LSE and gradients for the window alone, with causal, seqlen_q != seqlen_k both ways,
GQA, rows that see no key (out = 0, lse = -inf, zero gradients, no NaN), softcap alone, with causal and with a
window; every deterministic schedule the planner accepts repeats its bits; flash_attn_qkvpacked_func takes the same
arguments. Without a Hopper GPU every test skips and says why. Tolerances: test_attention.py's, widened by two bf16
roundoffs with softcap for the kernels' tanh approximation (relative error about 2^-11).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from dash_attn import flash_attn_func, flash_attn_qkvpacked_func  # noqa: E402

TOLERANCES = {torch.bfloat16: (1.5e-2, 5e-2), torch.float16: (4e-3, 1.5e-2)}  # as test_attention.py
SOFTCAP_WIDENING = 2 / 512  # two bf16 roundoffs (src/harness: tolerance_for(shape))
MAGNITUDE_FLOOR = 1e-2
LSE_TOLERANCE = 1e-3
SOFTCAP_LSE_TOLERANCE = 5e-3

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, causal, window_size, softcap, scale factor)
CASES = [
    (2, 512, 512, 4, 4, False, (100, 50), 0.0, 1.0),
    (2, 640, 640, 4, 2, True, (255, -1), 0.0, 1.0),
    (1, 300, 777, 4, 2, False, (200, 30), 0.0, 1.0),
    (2, 777, 300, 4, 1, True, (100, -1), 0.0, 1.0),
    (1, 400, 100, 2, 2, False, (20, 5), 0.0, 1.0),  # rows 0..294 see no key
    (1, 128, 1000, 2, 2, False, (50, 10), 0.0, 1.0),  # keys no row sees
    (2, 300, 300, 4, 2, False, (-1, -1), 5.0, 4.0),
    (2, 513, 513, 4, 4, True, (-1, -1), 10.0, 3.0),
    (1, 600, 450, 4, 2, False, (150, 40), 3.0, 4.0),
]


def case_id(case: tuple) -> str:
    b, sq, sk, hq, hkv, causal, window, softcap, _ = case
    return f"B{b}-Sq{sq}-Sk{sk}-Hq{hq}-Hkv{hkv}-{'causal' if causal else 'full'}-w{window[0]}_{window[1]}-cap{softcap}"


def window_mask(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor:
    """FlashAttention's mask: row i sees key j iff i + d - left <= j <= i + d + right, d = seqlen_k - seqlen_q,
    -1 leaving a side open and causal setting right to 0."""
    left, right = window
    if causal:
        right = 0
    rows = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device)[None, :]
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= cols >= rows - left
    if right >= 0:
        mask &= cols <= rows + right
    return mask


def reference(q, k, v, dout, scale: float, causal: bool, window, softcap: float):
    """out, lse, dq, dk, dv in float32: explicit scores, cap, mask, softmax (0 for rows without keys), autograd."""
    q32, k32, v32 = (t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    kr, vr = k32.repeat_interleave(groups, dim=1), v32.repeat_interleave(groups, dim=1)
    scores = q32 @ kr.transpose(-1, -2) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    mask = window_mask(q.shape[1], k.shape[1], causal, window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.detach(), dim=-1)
    seen = torch.isfinite(lse)[..., None]
    # Rows without keys: a softmax of zeros times 0, so that neither the output nor the gradients see a NaN.
    probabilities = torch.softmax(scores.masked_fill(~seen, 0.0), dim=-1) * seen
    out = probabilities @ vr
    out.backward(dout.float().transpose(1, 2))
    return (out.detach().transpose(1, 2), lse.detach(), *(t.grad.transpose(1, 2) for t in (q32, k32, v32)))


def assert_close(actual, expected, dtype, softcap: float, what: str) -> None:
    rel_l2_tol, max_tol = TOLERANCES[dtype]
    if softcap > 0:
        rel_l2_tol, max_tol = rel_l2_tol + SOFTCAP_WIDENING, max_tol + SOFTCAP_WIDENING
    actual, expected = actual.double(), expected.double()
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    error = (actual - expected).abs()
    reference_norm = expected.norm().item()
    rel_l2 = error.norm().item() / (reference_norm if reference_norm > 0 else 1.0)
    bound = max_tol * max(expected.abs().max().item(), MAGNITUDE_FLOOR)
    assert rel_l2 <= rel_l2_tol and error.max().item() <= bound, (
        f"{what}: relative L2 error {rel_l2:.3g} (tolerance {rel_l2_tol}), max error {error.max().item():.3g} "
        f"(tolerance {bound:.3g})"
    )


def inputs(case: tuple, head_dim: int, dtype, device, seed: int):
    b, sq, sk, hq, hkv, *_ = case
    generator = torch.Generator(device).manual_seed(seed)

    def draw(seqlen: int, heads: int, grad: bool) -> torch.Tensor:
        t = torch.randn(b, seqlen, heads, head_dim, generator=generator, device=device).to(dtype)
        return t.requires_grad_(grad)

    return draw(sq, hq, True), draw(sk, hkv, True), draw(sk, hkv, True), draw(sq, hq, False)


def run(q, k, v, dout, **kwargs):
    for t in (q, k, v):
        t.grad = None
    out, lse = flash_attn_func(q, k, v, return_lse=True, **kwargs)
    out.backward(dout)
    return out.detach(), lse, q.grad.clone(), k.grad.clone(), v.grad.clone()


def require_softcap_kernel(library, head_dim: int, dtype, softcap: float) -> None:
    codes = {torch.bfloat16: library.DTYPE_BF16, torch.float16: library.DTYPE_FP16}
    if softcap > 0 and not library.kernel_available(head_dim, codes[dtype], softcap=True):
        pytest.skip("this build has no softcap kernels (DASH_SOFTCAP_KERNELS)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_window_and_softcap_match_the_torch_reference(device, library, require_kernel, case, head_dim, dtype):
    require_kernel(head_dim, dtype)
    _, sq, sk, _, _, causal, window, softcap, factor = case
    require_softcap_kernel(library, head_dim, dtype, softcap)
    q, k, v, dout = inputs(case, head_dim, dtype, device, seed=sq * 1000 + sk + head_dim)
    scale = factor * head_dim**-0.5
    got = run(q, k, v, dout, softmax_scale=scale, causal=causal, window_size=window, softcap=softcap)
    expected = reference(q, k, v, dout, scale, causal, window, softcap)
    assert_close(got[0], expected[0], dtype, softcap, "out")
    keyless = torch.isinf(expected[1])
    assert torch.equal(torch.isinf(got[1]), keyless), "lse is -inf exactly on the rows that see no key"
    assert (got[0].transpose(1, 2)[keyless] == 0).all(), "out is 0 on the rows that see no key"
    tolerance = SOFTCAP_LSE_TOLERANCE if softcap > 0 else LSE_TOLERANCE
    torch.testing.assert_close(got[1][~keyless], expected[1][~keyless], atol=tolerance, rtol=tolerance, msg="lse")
    for name, actual, wanted in zip(("dq", "dk", "dv"), got[2:], expected[2:]):
        assert_close(actual, wanted, dtype, softcap, name)


@pytest.mark.parametrize("case", [CASES[1], CASES[8]], ids=case_id)
def test_every_deterministic_schedule_repeats_its_bits(device, library, require_kernel, case):
    head_dim, dtype = 64, torch.bfloat16
    require_kernel(head_dim, dtype)
    _, sq, sk, _, _, causal, window, softcap, factor = case
    require_softcap_kernel(library, head_dim, dtype, softcap)
    q, k, v, dout = inputs(case, head_dim, dtype, device, seed=7)
    options = dict(softmax_scale=factor * head_dim**-0.5, causal=causal, window_size=window, softcap=softcap)
    ran = 0
    for schedule in ("auto", "ascending", "descending", "shortest-first", "symmetric-shift"):
        try:
            first = run(q, k, v, dout, schedule=schedule, **options)
        except RuntimeError as error:
            if "schedule-rejected" in str(error):
                continue
            raise
        ran += 1
        for _ in range(5):
            again = run(q, k, v, dout, schedule=schedule, **options)
            for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), first, again):
                assert torch.equal(a, b), f"{schedule}: {name} changed between runs"
    assert ran >= 4


def test_qkvpacked_takes_window_and_softcap(device, library, require_kernel):
    head_dim, dtype = 128, torch.float16
    require_kernel(head_dim, dtype)
    require_softcap_kernel(library, head_dim, dtype, 4.0)
    generator = torch.Generator(device).manual_seed(3)
    qkv = torch.randn(2, 333, 3, 4, head_dim, generator=generator, device=device).to(dtype)
    options = dict(causal=True, window_size=(64, 9), softcap=4.0)
    packed = flash_attn_qkvpacked_func(qkv, **options)
    q, k, v = qkv.unbind(2)
    separate = flash_attn_func(q, k, v, **options)
    assert torch.equal(packed, separate)
