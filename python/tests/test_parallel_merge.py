"""The merge of partial attention results that context parallelism runs per block (parallel/_merge.py), and the fp32
partials DASH's local kernel hands it.

On the CPU (no GPU needed): merge_args builds dash_merge_args from tensors the way LseMerge does (a slice of rows as
an offset, an index as int32 rows, the block's strides), and the library's host-side validation accepts what it
builds for dense, zigzag-indexed and packed (batch of one) blocks; a build without kernels then answers that it has
no merge kernel, one with kernels goes on to its device checks. LseMerge off CUDA uses the torch formula.

On a Hopper GPU (skipping, saying why, elsewhere): the fused kernel against the formula in float64 on the same fp32
inputs, dense rows given as a slice, zigzag's two halves as an index, packed sequences as a batch of one, strided
blocks, and empty rows on either side (-inf LSE: no NaN; both empty: out 0, LSE -inf); its result repeats bit for bit;
a row_index outside the accumulators or naming a row twice poisons both accumulators with NaN and is reported once,
at the next call (with a valid unordered index as the negative control);
a whole LseMerge of several blocks through the kernel against the same merge through torch's ops; and
DashLocalAttention's fp32 partial, rounded to bf16, bitwise equal to flash_attn_func's out. Tolerance of the kernel
against float64: each merged element is a few fp32 operations (exp, log1p, one multiply and one fused multiply-add)
on values of magnitude <= 4, so 2^-18 absolute on out and LSE (a few fp32 ulps at that magnitude) with 2^-18 relative.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

from dash_attn import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from dash_attn.parallel import DashLocalAttention  # noqa: E402
from dash_attn.parallel._merge import LseMerge, merge_args  # noqa: E402

BATCH, SEQLEN, HEADS, HEAD_DIM = 2, 96, 4, 64
TOLERANCE = 2.0**-18


def _block(rows: int, device: torch.device | str, seed: int, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    out = torch.randn(batch, rows, HEADS, HEAD_DIM, generator=generator, device=device)
    lse = 4 * torch.rand(batch, HEADS, rows, generator=generator, device=device)
    return out, lse


def _accumulators(device: torch.device | str, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(batch, SEQLEN, HEADS, HEAD_DIM, device=device), torch.full(
        (batch, HEADS, SEQLEN), float("-inf"), device=device
    )


def _rows_cases(device: torch.device | str) -> dict[str, slice | torch.Tensor]:
    half = SEQLEN // 4
    zigzag = torch.cat([torch.arange(0, half), torch.arange(SEQLEN - half, SEQLEN)]).to(device)
    return {"slice": slice(half, 3 * half), "zigzag_index": zigzag, "all": slice(None)}


# --- host side: the arguments LseMerge builds pass the library's validation ----------------------------------


@pytest.mark.parametrize("rows_name", ["slice", "zigzag_index", "all"])
def test_merge_args_pass_the_librarys_validation(library, rows_name) -> None:
    rows = _rows_cases("cpu")[rows_name]
    count = len(range(SEQLEN)[rows]) if isinstance(rows, slice) else rows.numel()
    acc_out, acc_lse = _accumulators("cpu")
    out, lse = _block(count, "cpu", seed=1)
    args, index = merge_args(acc_out, acc_lse, out, lse, rows)
    assert (args.row_index is None) == isinstance(rows, slice)
    assert args.rows == count and args.seqlen == SEQLEN
    if index is not None:
        assert index.dtype == torch.int32 and torch.equal(index.long(), rows)
    _expect_validated(library, args)


def test_merge_args_of_a_packed_strided_block_pass_the_librarys_validation(library) -> None:
    # A packed batch is a batch of one; its LSE arrives as (heads, total)[None], here a strided view.
    acc_out, acc_lse = _accumulators("cpu", batch=1)
    out, lse = _block(SEQLEN // 2, "cpu", seed=2, batch=1)
    wide_lse = torch.zeros(1, HEADS, SEQLEN)
    wide_lse[:, :, : SEQLEN // 2] = lse
    args, _ = merge_args(acc_out, acc_lse, out, wide_lse[:, :, : SEQLEN // 2], slice(SEQLEN // 2, SEQLEN))
    assert args.row_offset == SEQLEN // 2 and tuple(args.part_lse_strides) == (HEADS * SEQLEN, SEQLEN, 1)
    _expect_validated(library, args)


def _expect_validated(library, args) -> None:
    """The library's validation passes `args`: a build without kernels then says it has none; one with kernels goes
    on to the device, which refuses these host addresses as memory unknown to CUDA (or is missing)."""
    with pytest.raises(library.LibraryError) as caught:
        library.merge_partial(args, None)
    if not library.merge_kernel_available():
        assert caught.value.status == "not-available", caught.value.message
    elif caught.value.status == "invalid-argument":
        assert "is host memory unknown to CUDA" in caught.value.message, caught.value.message
    else:
        assert caught.value.status in ("no-device", "unsupported-device"), caught.value.message


def test_lse_merge_off_cuda_uses_the_torch_formula() -> None:
    assert not LseMerge(torch.zeros(1, 4, 1, 8), torch.float32).fused


# --- on a Hopper GPU: the fused kernel -----------------------------------------------------------------------


@pytest.fixture
def merge_device(device, library) -> torch.device:
    if not library.merge_kernel_available():
        pytest.skip("this build has no merge kernel (built without DASH_BUILD_KERNELS)")
    return device


def _reference(acc_out, acc_lse, out, lse, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge formula in float64, a -inf LSE's weight 0 (the kernel's rule for empty rows)."""
    ref_out, ref_lse = acc_out.double().clone(), acc_lse.double().clone()
    old_lse, new_lse = ref_lse[:, :, rows], lse.double()
    merged = torch.logaddexp(old_lse, new_lse)

    def weight(x: torch.Tensor) -> torch.Tensor:
        w = torch.exp(x - merged)
        return torch.where(x == float("-inf"), torch.zeros_like(w), w).transpose(1, 2).unsqueeze(-1)

    ref_out[:, rows] = ref_out[:, rows] * weight(old_lse) + out.double() * weight(new_lse)
    ref_lse[:, :, rows] = merged
    return ref_out, ref_lse


def _fused(acc_out, acc_lse, out, lse, rows) -> tuple[torch.Tensor, torch.Tensor]:
    from dash_attn import _library

    acc_out, acc_lse = acc_out.clone(), acc_lse.clone()
    args, index = merge_args(acc_out, acc_lse, out, lse, rows)
    _library.merge_partial(args, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    del index
    return acc_out, acc_lse


def _close(x: torch.Tensor, reference: torch.Tensor) -> None:
    assert not torch.isnan(x).any()
    finite = torch.isfinite(reference)
    assert torch.equal(x[~finite].double(), reference[~finite])  # -inf LSEs exactly
    error = float((x[finite].double() - reference[finite]).abs().max())
    assert error <= TOLERANCE * (1 + float(reference[finite].abs().max())), error


@pytest.mark.parametrize("rows_name", ["slice", "zigzag_index", "all"])
def test_fused_merge_matches_the_formula_in_float64(merge_device, rows_name) -> None:
    rows = _rows_cases(merge_device)[rows_name]
    count = len(range(SEQLEN)[rows]) if isinstance(rows, slice) else rows.numel()
    # Accumulators that already hold a block (finite rows), with a few rows still empty (-inf, out 0).
    acc_out, acc_lse = _block(SEQLEN, merge_device, seed=3)
    acc_lse[:, 1, :7] = float("-inf")
    acc_out[:, :7, 1] = 0
    out, lse = _block(count, merge_device, seed=4)
    # Block rows that see no key (-inf, out 0): merged into filled and into empty rows alike.
    lse[:, 1, :3] = float("-inf")
    out[:, :3, 1] = 0
    got_out, got_lse = _fused(acc_out, acc_lse, out, lse, rows)
    ref_out, ref_lse = _reference(acc_out, acc_lse, out, lse, rows)
    _close(got_out, ref_out)
    _close(got_lse, ref_lse)
    # Rows outside the block are untouched.
    touched = torch.zeros(SEQLEN, dtype=torch.bool, device=merge_device)
    touched[rows] = True
    assert torch.equal(got_out[:, ~touched], acc_out[:, ~touched])
    again_out, again_lse = _fused(acc_out, acc_lse, out, lse, rows)
    assert torch.equal(again_out.view(torch.int32), got_out.view(torch.int32))
    assert torch.equal(again_lse.view(torch.int32), got_lse.view(torch.int32))


def test_rows_empty_on_both_sides_stay_empty_without_nan(merge_device) -> None:
    acc_out, acc_lse = _accumulators(merge_device)
    out, lse = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, device=merge_device), acc_lse.clone()
    got_out, got_lse = _fused(acc_out, acc_lse, out, lse, slice(None))
    assert torch.equal(got_out, acc_out) and torch.equal(got_lse, acc_lse)


def test_fused_merge_of_a_strided_packed_block(merge_device) -> None:
    acc_out, acc_lse = _block(SEQLEN, merge_device, seed=5, batch=1)
    out_wide, _ = _block(SEQLEN, merge_device, seed=6, batch=1)
    lse_wide = 4 * torch.rand(1, HEADS, 2 * SEQLEN, device=merge_device)
    out, lse = out_wide[:, ::2], lse_wide[:, :, : SEQLEN // 2]  # strided rows, an LSE row stride of 2 * SEQLEN
    rows = slice(SEQLEN // 2, SEQLEN)
    got_out, got_lse = _fused(acc_out, acc_lse, out, lse, rows)
    ref_out, ref_lse = _reference(acc_out, acc_lse, out, lse, rows)
    _close(got_out, ref_out)
    _close(got_lse, ref_lse)


def _bad_index_cases(device: torch.device) -> dict[str, tuple[torch.Tensor, int, int]]:
    """Indexes that break the contract: (index, the block row the report names, its index)."""
    rows = torch.arange(SEQLEN // 2, device=device, dtype=torch.int32) * 2
    outside, negative, repeated = rows.clone(), rows.clone(), rows.clone()
    outside[5] = SEQLEN
    negative[9] = -1
    repeated[7] = repeated[3]  # rows 3 and 7 name one accumulator row; the bitmap flags whichever comes second
    return {"outside": (outside, 5, SEQLEN), "negative": (negative, 9, -1), "repeated": (repeated, -1, 6)}


@pytest.mark.parametrize("case", ["outside", "negative", "repeated"])
def test_a_broken_row_index_poisons_the_accumulators_and_is_reported_once(merge_device, case) -> None:
    import dash_attn

    index, row, value = _bad_index_cases(merge_device)[case]
    acc_out, acc_lse = _block(SEQLEN, merge_device, seed=7)
    out, lse = _block(index.numel(), merge_device, seed=8)
    got_out, got_lse = _fused(acc_out, acc_lse, out, lse, index)
    assert torch.isnan(got_out).all() and torch.isnan(got_lse).all(), "every accumulator element is poisoned"
    # The next call on the device, a valid merge, reports it; the one after runs.
    good = torch.arange(index.numel(), device=merge_device, dtype=torch.int32)
    with pytest.raises(dash_attn.ResultPoisonedError) as raised:
        _fused(acc_out, acc_lse, out, lse, good)
    assert raised.value.status == "row-index-invalid"
    named = f"row_index[{row}] = {value}" if row >= 0 else f"] = {value} names an accumulator row that another"
    assert named in raised.value.message, raised.value.message
    assert "acc_out and acc_lse were filled with NaN" in raised.value.message
    after_out, _ = _fused(acc_out, acc_lse, out, lse, good)
    _close(after_out, _reference(acc_out, acc_lse, out, lse, good)[0])


def test_a_valid_unordered_row_index_is_not_reported(merge_device) -> None:
    """The negative control of the check above: a permutation of distinct rows, out of order, merges as the formula
    says, with no NaN and no report at the next call."""
    generator = torch.Generator().manual_seed(9)
    index = torch.randperm(SEQLEN, generator=generator)[: SEQLEN - 5].to(merge_device, torch.int32)
    acc_out, acc_lse = _block(SEQLEN, merge_device, seed=11)
    out, lse = _block(index.numel(), merge_device, seed=12)
    got_out, got_lse = _fused(acc_out, acc_lse, out, lse, index)
    ref_out, ref_lse = _reference(acc_out, acc_lse, out, lse, index)
    _close(got_out, ref_out)
    _close(got_lse, ref_lse)
    _fused(acc_out, acc_lse, out, lse, index)  # raises if the first merge had been reported


def test_lse_merge_through_the_kernel_matches_the_torch_formula(merge_device) -> None:
    like = torch.empty(BATCH, SEQLEN, HEADS, HEAD_DIM, device=merge_device)
    fused, torch_formula = LseMerge(like, torch.float32), LseMerge(like, torch.float32)
    assert fused.fused
    torch_formula.fused = False
    for seed, rows in enumerate(_rows_cases(merge_device).values()):
        count = len(range(SEQLEN)[rows]) if isinstance(rows, slice) else rows.numel()
        out, lse = _block(count, merge_device, seed=10 + seed)
        fused.add(out, lse, rows)
        torch_formula.add(out, lse, rows)
    for got, expected in zip(fused.result(), torch_formula.result()):
        _close(got, expected.double())


def test_dash_local_attention_returns_fp32_partials_that_round_to_the_kernels_out(
    device, library, require_kernel
) -> None:
    require_kernel(128, torch.bfloat16)
    if not library.kernel_available(128, library.DTYPE_BF16, varlen=True):
        pytest.skip("this build has no varlen kernels for head_dim 128 / bf16 (DASH_VARLEN_KERNELS)")
    generator = torch.Generator(device=device).manual_seed(7)
    q, k, v = (torch.randn(2, 200, 4, 128, generator=generator, device=device, dtype=torch.bfloat16) for _ in range(3))
    local = DashLocalAttention()
    out, lse = local.forward(q, k, v, True, 128**-0.5)
    single, single_lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.dtype == torch.float32
    assert torch.equal(out.to(torch.bfloat16).view(torch.int16), single.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), single_lse.view(torch.int32))
    offsets = (0, 100, 100, 400)
    packed = [torch.randn(400, 4, 128, generator=generator, device=device, dtype=torch.bfloat16) for _ in range(3)]
    out, lse = local.forward_varlen(*packed, offsets, offsets, True, 128**-0.5)
    cu_seqlens = torch.tensor(offsets, dtype=torch.int32, device=device)
    single, single_lse = flash_attn_varlen_func(*packed, cu_seqlens, cu_seqlens, 300, 300, causal=True, return_lse=True)
    assert out.dtype == torch.float32
    assert torch.equal(out.to(torch.bfloat16).view(torch.int16), single.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), single_lse.view(torch.int32))
