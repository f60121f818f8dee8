"""Bad-input tests that need neither a GPU nor the library: every check in _arguments.py runs before any CUDA
call, so CPU (and meta) tensors reach it. Each test asserts the exception type and that the message names
the argument the caller got wrong, spelled as that entry point spells it (q or query). Then how the package
finds the library ($DASH_ATTN_LIBRARY first, a missing file is an error) and that its ctypes binding imports
without torch. The last tests load the C library (still without a GPU) to show its own messages reach the
caller."""

from __future__ import annotations

import ctypes
import math
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import dash_attn  # noqa: E402
from dash_attn import flash_attn_func, scaled_dot_product_attention  # noqa: E402

BATCH, SEQLEN, HEADS, HEAD_DIM = 2, 16, 4, 64


def bshd(
    batch: int = BATCH,
    seqlen: int = SEQLEN,
    heads: int = HEADS,
    head_dim: int = HEAD_DIM,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
) -> torch.Tensor:
    return torch.zeros(batch, seqlen, heads, head_dim, dtype=dtype, device=device)


def bhsd(heads: int = HEADS, seqlen: int = SEQLEN, **kwargs: object) -> torch.Tensor:
    return bshd(heads=heads, seqlen=seqlen, **kwargs).transpose(1, 2)


def raises(error: type[Exception], *fragments: str):
    """pytest.raises that also demands every fragment in the message (the argument's name, the rule)."""
    return pytest.raises(error, match=".*".join(map(re.escape, fragments)))


# --- flash_attn_func: (B, S, H, D) -----------------------------------------------------------------------


def test_non_tensor_argument_is_named() -> None:
    with raises(TypeError, "k must be a torch.Tensor", "list"):
        flash_attn_func(bshd(), [1.0], bshd())


def test_wrong_rank_is_named() -> None:
    with raises(ValueError, "v must be 4-D", "(batch, seqlen, heads, head_dim)"):
        flash_attn_func(bshd(), bshd(), bshd()[0])


def test_empty_tensor_is_named() -> None:
    with raises(ValueError, "q must not be empty"):
        flash_attn_func(bshd(seqlen=0), bshd(), bshd())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_unsupported_dtype_is_named(dtype: torch.dtype) -> None:
    with raises(TypeError, "q.dtype", "bfloat16 or torch.float16", str(dtype)):
        flash_attn_func(bshd(dtype=dtype), bshd(dtype=dtype), bshd(dtype=dtype))


def test_mixed_dtypes_are_named() -> None:
    with raises(TypeError, "v.dtype (torch.float16) must equal q.dtype (torch.bfloat16)"):
        flash_attn_func(bshd(), bshd(), bshd(dtype=torch.float16))


@pytest.mark.parametrize("head_dim", [32, 80, 160, 512])
def test_unsupported_head_dim_is_named(head_dim: int) -> None:
    t = bshd(head_dim=head_dim)
    with raises(ValueError, "head_dim (q.shape[3])", "(64, 96, 128, 192, 256)", str(head_dim)):
        flash_attn_func(t, t, t)


def test_head_dim_mismatch_is_named() -> None:
    with raises(ValueError, "k.shape[3] (head_dim) = 128 must equal q.shape[3] = 64"):
        flash_attn_func(bshd(), bshd(head_dim=128), bshd())


def test_batch_mismatch_is_named() -> None:
    with raises(ValueError, "v.shape[0] (batch) = 3 must equal q.shape[0] = 2"):
        flash_attn_func(bshd(), bshd(), bshd(batch=3))


def test_key_value_seqlen_mismatch_is_named() -> None:
    with raises(ValueError, "v.shape[1] (seqlen) = 9 must equal k.shape[1] = 16"):
        flash_attn_func(bshd(), bshd(), bshd(seqlen=9))


def test_key_value_heads_mismatch_is_named() -> None:
    with raises(ValueError, "v.shape[2] (heads) = 1 must equal k.shape[2] = 2"):
        flash_attn_func(bshd(), bshd(heads=2), bshd(heads=1))


def test_query_heads_not_a_multiple_of_kv_heads_is_named() -> None:
    with raises(ValueError, "q.shape[2] (query heads) = 4 must be a multiple of k.shape[2]", "= 3"):
        flash_attn_func(bshd(), bshd(heads=3), bshd(heads=3))


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan])
def test_bad_softmax_scale_is_named(scale: float) -> None:
    with raises(ValueError, "softmax_scale must be finite and > 0"):
        flash_attn_func(bshd(), bshd(), bshd(), softmax_scale=scale)


def test_unknown_schedule_lists_the_valid_names() -> None:
    with raises(ValueError, "schedule must be one of", *(repr(name) for name in dash_attn.SCHEDULES), "'fastest'"):
        flash_attn_func(bshd(), bshd(), bshd(), schedule="fastest")


def test_schedule_contradicting_deterministic_is_refused() -> None:
    with raises(ValueError, "deterministic=False", "schedule='shift'"):
        flash_attn_func(bshd(), bshd(), bshd(), deterministic=False, schedule="shift")
    with raises(ValueError, "contradicts deterministic=True"):
        flash_attn_func(bshd(), bshd(), bshd(), schedule="nondeterministic")


@pytest.mark.parametrize("flag", ["causal", "deterministic", "return_lse"])
@pytest.mark.parametrize("value", ["no", 1, None, torch.tensor(True)])
def test_flag_that_is_not_a_bool_is_named(flag: str, value: object) -> None:
    with raises(TypeError, f"{flag} must be a bool (True or False), got {type(value).__name__}"):
        flash_attn_func(bshd(), bshd(), bshd(), **{flag: value})


def test_causal_string_does_not_switch_the_mask_on() -> None:
    # "no" is truthy: before the check it ran a causal attention.
    with raises(TypeError, "causal must be a bool (True or False), got str 'no'"):
        flash_attn_func(bshd(), bshd(), bshd(), causal="no")


def test_cpu_tensors_are_refused() -> None:
    with raises(ValueError, "q, k and v must be CUDA tensors", "cpu"):
        flash_attn_func(bshd(), bshd(), bshd())


def test_mismatched_devices_are_named() -> None:
    with raises(ValueError, "k is on meta but q is on cpu"):
        flash_attn_func(bshd(), bshd(device="meta"), bshd())


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="fake cuda:1 tensors need no CUDA at all (the CPU run) or two GPUs: with CUDA present, "
    "FakeTensorMode creates a context on each device it sees",
)
def test_cuda_tensors_pass_the_device_check_only_on_one_device() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dash_attn._arguments import BSHD, check_devices

    # Fake CUDA tensors need no GPU; the check reads only their devices.
    with FakeTensorMode():
        first, second = bshd(device="cuda:0"), bshd(device="cuda:1")
        check_devices((first, first, first), BSHD)
        check_devices((second, second, second), BSHD)
        with raises(ValueError, "v is on cuda:1 but q is on cuda:0"):
            check_devices((first, first, second), BSHD)
        with raises(ValueError, "k is on cuda:0 but q is on cuda:1"):
            check_devices((second, first, second), BSHD)
    with raises(ValueError, "k is on cpu but q is on cuda:0"):
        check_devices((first, bshd(), first), BSHD)


def test_a_tensor_subclass_passes_the_tensor_checks() -> None:
    with raises(ValueError, "q, k and v must be CUDA tensors"):
        flash_attn_func(torch.nn.Parameter(bshd()), bshd(), bshd())
    with raises(TypeError, "v.dtype (torch.float16) must equal q.dtype (torch.bfloat16)"):
        flash_attn_func(torch.nn.Parameter(bshd()), bshd(), bshd(dtype=torch.float16))


# --- scaled_dot_product_attention: (B, H, S, D), SDPA's names ------------------------------------------


def test_sdpa_messages_use_sdpa_names_and_dimensions() -> None:
    with raises(TypeError, "query.dtype"):
        scaled_dot_product_attention(bhsd(dtype=torch.float32), bhsd(), bhsd())
    with raises(ValueError, "value.shape[2] (seqlen) = 9 must equal key.shape[2] = 16"):
        scaled_dot_product_attention(bhsd(), bhsd(), bhsd(seqlen=9))
    with raises(ValueError, "value.shape[1] (heads) = 1 must equal key.shape[1] = 2"):
        scaled_dot_product_attention(bhsd(), bhsd(heads=2), bhsd(heads=1), enable_gqa=True)
    with raises(ValueError, "key must be 4-D", "(batch, heads, seqlen, head_dim)"):
        scaled_dot_product_attention(bhsd(), bhsd()[0], bhsd())


def test_sdpa_gqa_needs_enable_gqa() -> None:
    with raises(ValueError, "query has 4 heads but key and value 2", "enable_gqa=True"):
        scaled_dot_product_attention(bhsd(), bhsd(heads=2), bhsd(heads=2))


def test_sdpa_causal_with_unequal_lengths_is_refused() -> None:
    with raises(ValueError, "is_causal=True", "top-left", "bottom-right"):
        scaled_dot_product_attention(bhsd(), bhsd(seqlen=32), bhsd(seqlen=32), is_causal=True)


def test_sdpa_bad_scale_is_named() -> None:
    with raises(ValueError, "scale must be finite and > 0"):
        scaled_dot_product_attention(bhsd(), bhsd(), bhsd(), scale=-0.5)


@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa", "deterministic"])
def test_sdpa_flag_that_is_not_a_bool_is_named(flag: str) -> None:
    with raises(TypeError, f"{flag} must be a bool (True or False), got str 'yes'"):
        scaled_dot_product_attention(bhsd(), bhsd(), bhsd(), **{flag: "yes"})


def test_sdpa_cpu_tensors_are_refused() -> None:
    with raises(ValueError, "query, key and value must be CUDA tensors"):
        scaled_dot_product_attention(bhsd(), bhsd(), bhsd())


# --- metadata under fake tensors (what torch.compile sees), no GPU needed -------------------------------


def test_fake_tensors_trace_with_the_output_metadata_of_the_real_ops() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        try:
            q = bshd(heads=8, dtype=torch.float16, device="cuda", head_dim=128)
        except (RuntimeError, AssertionError) as error:
            pytest.skip(f"this torch build cannot make fake CUDA tensors: {error}")
        kv = bshd(heads=2, seqlen=40, dtype=torch.float16, device="cuda", head_dim=128)
        out, lse = flash_attn_func(q, kv, kv, causal=True, return_lse=True)
        sdpa_out = scaled_dot_product_attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2))
    assert (out.shape, out.dtype, out.stride()) == (q.shape, q.dtype, q.contiguous().stride())
    assert (lse.shape, lse.dtype) == ((BATCH, 8, SEQLEN), torch.float32)
    assert sdpa_out.shape == (BATCH, 8, SEQLEN, 128)


# --- finding the library: $DASH_ATTN_LIBRARY first, never silently ignored; no torch needed --------------


@pytest.fixture
def fresh_load():
    """dash_attn._library with load()'s cache cleared before and after, so a test's environment decides."""
    from dash_attn import _library

    _library.load.cache_clear()
    yield _library
    _library.load.cache_clear()


def test_library_env_naming_a_missing_file_is_an_error(fresh_load, monkeypatch, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libdash_attn_c.so"
    monkeypatch.setenv("DASH_ATTN_LIBRARY", str(missing))
    with raises(ImportError, "$DASH_ATTN_LIBRARY is set to", str(missing), "there is no file"):
        fresh_load.load()


def test_library_env_naming_a_directory_without_the_library_is_an_error(
    fresh_load, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DASH_ATTN_LIBRARY", str(tmp_path))
    with raises(ImportError, "there is no file", str(tmp_path / "libdash_attn_c.so")):
        fresh_load.load()


def test_library_env_wins_over_the_installed_copy(fresh_load, monkeypatch, tmp_path: Path) -> None:
    # A file that is not a library: loading it fails, which shows it was the one chosen.
    impostor = tmp_path / "libdash_attn_c.so"
    impostor.write_bytes(b"not a library")
    installed = Path(fresh_load.__file__).resolve().parent / "libdash_attn_c.so"
    monkeypatch.setattr(Path, "is_file", lambda self: self in (impostor, installed))
    monkeypatch.setenv("DASH_ATTN_LIBRARY", str(tmp_path))
    assert fresh_load._find_library() == impostor
    with raises(ImportError, f"dash_attn cannot load {impostor}"):
        fresh_load.load()


def test_without_the_env_the_installed_copy_is_used(fresh_load, monkeypatch) -> None:
    monkeypatch.delenv("DASH_ATTN_LIBRARY", raising=False)
    installed = Path(fresh_load.__file__).resolve().parent / "libdash_attn_c.so"
    monkeypatch.setattr(Path, "is_file", lambda self: self == installed)
    assert fresh_load._find_library() == installed
    monkeypatch.setattr(Path, "is_file", lambda self: False)
    with raises(ImportError, "cannot find libdash_attn_c.so", "$DASH_ATTN_LIBRARY is not set"):
        fresh_load._find_library()


def test_the_binding_imports_without_torch(fresh_interpreter) -> None:
    # A fresh interpreter in which `import torch` fails, as on a machine without it.
    program = (
        "import sys; sys.modules['torch'] = None\n"
        "import dash_attn, dash_attn._library as library\n"
        "assert library.SCHEDULES[0] == 'auto' and library.Shape(batch=1).batch == 1\n"
        "try:\n"
        "    dash_attn.flash_attn_func\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    result = fresh_interpreter(program)
    assert result.returncode == 0, result.stderr
    assert "dash_attn.flash_attn_func needs PyTorch (torch>=2.4), which is not installed" in result.stdout


# --- the C library's own messages, without a GPU ----------------------------------------------------------


def _c_args(library, head_dim: int) -> tuple:
    shape = library.Shape(BATCH, SEQLEN, SEQLEN, HEADS, HEADS, head_dim, library.DTYPE_BF16, head_dim**-0.5, 0)
    tensor = bshd(head_dim=head_dim)
    c_tensor = library.Tensor(tensor.data_ptr(), (ctypes.c_int64 * 4)(*tensor.stride()))
    return shape, c_tensor, tensor


def test_library_schedule_names_match_the_package(library) -> None:
    assert tuple(library.load().dash_schedule_names().decode().split(",")) == dash_attn.SCHEDULES


def test_library_message_reaches_the_caller(library) -> None:
    # Head dim 80 passes no Python check here: the message must be the library's own.
    shape, c_tensor, tensor = _c_args(library, head_dim=80)
    with pytest.raises(dash_attn.LibraryError) as caught:
        library.forward(shape, c_tensor, c_tensor, c_tensor, c_tensor, tensor.data_ptr(), 0, 0, None)
    assert isinstance(caught.value, RuntimeError)
    assert caught.value.status == "not-supported"
    assert "shape.head_dim must be one of {64, 96, 128, 192, 256}, got 80" in str(caught.value)
    assert "not-supported" in str(caught.value)


def test_library_refuses_a_negative_sm_margin_before_the_device(library) -> None:
    # Valid, distinct tensors (on the CPU: the margin is checked with the arguments, before the device).
    shape, _, _ = _c_args(library, head_dim=HEAD_DIM)
    tensors = [bshd() for _ in range(4)]
    lse = torch.zeros(BATCH, HEADS, SEQLEN)
    c_tensors = [library.Tensor(t.data_ptr(), (ctypes.c_int64 * 4)(*t.stride())) for t in tensors]
    with pytest.raises(dash_attn.LibraryError) as caught:
        library.forward(shape, *c_tensors, lse.data_ptr(), 0, 0, None, sm_margin=-2)
    assert caught.value.status == "invalid-argument"
    assert caught.value.message.startswith("sm_margin must satisfy 0 <= sm_margin < the device's SM count")
    assert caught.value.message.endswith("got -2")


def test_library_refuses_an_out_dtype_that_is_neither_the_inputs_nor_fp32(library) -> None:
    shape, _, _ = _c_args(library, head_dim=HEAD_DIM)
    tensors = [bshd() for _ in range(4)]
    lse = torch.zeros(BATCH, HEADS, SEQLEN)
    c_tensors = [library.Tensor(t.data_ptr(), (ctypes.c_int64 * 4)(*t.stride())) for t in tensors]
    buffer = ctypes.create_string_buffer(4096)
    code = library.load().dash_forward(
        shape, None, *c_tensors, library.DTYPE_FP16, lse.data_ptr(), 0, None, 0, None, buffer, 4096
    )
    assert library.load().dash_status_name(code) == b"invalid-argument"
    assert buffer.value.decode() == (
        "out_dtype must be shape->dtype (0) or DASH_DTYPE_FP32 (2, the output before its rounding to "
        "shape->dtype), got 1"
    )


def test_library_checks_an_fp32_out_in_its_own_elements(library) -> None:
    # out_fp32 reaches the library as DASH_DTYPE_FP32: a bf16-sized out with fp32 strides whose head stride is 6
    # floats (24 bytes) is refused in fp32 elements; the same strides are 12 bytes as bf16 and refused there too,
    # with another count, so the message tells which element size was used.
    shape, _, _ = _c_args(library, head_dim=HEAD_DIM)
    tensors = [bshd() for _ in range(3)]
    out = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM, dtype=torch.float32)
    lse = torch.zeros(BATCH, HEADS, SEQLEN)
    c_tensors = [library.Tensor(t.data_ptr(), (ctypes.c_int64 * 4)(*t.stride())) for t in tensors]
    strides = (SEQLEN * HEADS * HEAD_DIM, HEADS * HEAD_DIM, 6, 1)
    c_out = library.Tensor(out.data_ptr(), (ctypes.c_int64 * 4)(*strides))
    with pytest.raises(dash_attn.ArgumentRefusedError) as caught:
        library.forward(shape, *c_tensors, c_out, lse.data_ptr(), 0, 0, None, out_fp32=True)
    assert (
        caught.value.message == "out.strides.head must be a multiple of 4 elements (16 bytes, a TMA requirement), got 6"
    )
    with pytest.raises(dash_attn.ArgumentRefusedError) as caught:
        library.forward(shape, *c_tensors, c_out, lse.data_ptr(), 0, 0, None)
    assert (
        caught.value.message == "out.strides.head must be a multiple of 8 elements (16 bytes, a TMA requirement), got 6"
    )


def _merge_args(library, acc_out: torch.Tensor, acc_lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor):
    """The MergeArgs of CPU tensors (the library validates them before any device question)."""
    batch, rows, heads, head_dim = part_out.shape
    return library.MergeArgs(
        batch=batch,
        rows=rows,
        seqlen=acc_out.shape[1],
        heads=heads,
        head_dim=head_dim,
        part_out=library.Tensor(part_out.data_ptr(), (ctypes.c_int64 * 4)(*part_out.stride())),
        part_lse=part_lse.data_ptr(),
        part_lse_strides=(ctypes.c_int64 * 3)(*part_lse.stride()),
        acc_out=library.Tensor(acc_out.data_ptr(), (ctypes.c_int64 * 4)(*acc_out.stride())),
        acc_lse=acc_lse.data_ptr(),
        acc_lse_strides=(ctypes.c_int64 * 3)(*acc_lse.stride()),
        row_index=None,
        row_offset=0,
    )


def test_library_merge_refuses_broken_arguments_naming_them(library) -> None:
    acc_out, acc_lse = torch.zeros(BATCH, SEQLEN, HEADS, HEAD_DIM), torch.zeros(BATCH, HEADS, SEQLEN)
    part_out, part_lse = torch.zeros(BATCH, 4, HEADS, HEAD_DIM), torch.zeros(BATCH, HEADS, 4)
    args = _merge_args(library, acc_out, acc_lse, part_out, part_lse)
    args.row_offset = SEQLEN - 3
    with pytest.raises(dash_attn.ArgumentRefusedError) as caught:
        library.merge_partial(args, None)
    assert caught.value.message.startswith("row_offset must satisfy 0 <= row_offset <= seqlen - rows")
    assert caught.value.message.endswith(f"got {SEQLEN - 3} with rows = 4, seqlen = {SEQLEN}")
    args = _merge_args(library, acc_out, acc_lse, part_out, acc_lse[:, :, :4])  # the block's LSE in the accumulator's
    with pytest.raises(dash_attn.ArgumentRefusedError, match="acc_lse overlaps part_lse"):
        library.merge_partial(args, None)
    # Negative control: valid arguments pass validation, and a build without kernels says it has no merge kernel.
    args = _merge_args(library, acc_out, acc_lse, part_out, part_lse)
    if not library.merge_kernel_available():
        with pytest.raises(dash_attn.LibraryError, match="this build has no merge kernel"):
            library.merge_partial(args, None)


def test_library_lists_schedules_when_the_name_is_unknown(library) -> None:
    shape, _, _ = _c_args(library, head_dim=HEAD_DIM)
    with pytest.raises(dash_attn.LibraryError, match="unknown schedule 'fastest' \\(valid: auto, ascending"):
        library.backward_workspace_size(shape, "fastest")


def test_library_truncates_messages_to_the_buffer(library) -> None:
    shape, c_tensor, tensor = _c_args(library, head_dim=80)
    size = 8
    buffer = ctypes.create_string_buffer(b"\xff" * size, size)
    code = library.load().dash_forward(
        ctypes.byref(shape),
        None,
        *[ctypes.byref(c_tensor)] * 4,
        shape.dtype,
        tensor.data_ptr(),
        0,
        None,
        0,
        None,
        buffer,
        size,
    )
    assert library.load().dash_status_name(code) == b"not-supported"
    assert buffer.raw == b"shape.h\0"


def test_library_names_every_status(library) -> None:
    lib = library.load()
    names = [lib.dash_status_name(code).decode() for code in range(10)]
    assert names[0] == "ok" and "unknown-status" not in names and names[9] == "wait-timeout"
    assert lib.dash_status_name(-1) == b"host-error"
    assert lib.dash_status_name(99) == b"unknown-status"


# --- layouts the kernels cannot read in place are copied, not refused -------------------------------------


def test_layouts_the_kernels_take_are_used_in_place() -> None:
    from dash_attn._ops import _kernel_ready

    packed = bshd()
    fused_qkv_slice = torch.zeros(BATCH, SEQLEN, 3 * HEADS, HEAD_DIM, dtype=torch.bfloat16)[:, :, HEADS : 2 * HEADS]
    sdpa_view = bhsd().transpose(1, 2)
    for t in (packed, fused_qkv_slice, sdpa_view):
        assert _kernel_ready(t) is t


def _layout_ok_by_sorting(t: torch.Tensor) -> bool:
    """The kernels' layout rule as src/api/validate.cpp states it, strides sorted: the reference for _layout_ok."""
    strides = t.stride()
    if t.data_ptr() % 16 or strides[-1] != 1:
        return False
    if any(s < 0 or s % 8 or s >= (1 << 39) for s in strides[:-1]):
        return False
    reach = 1
    for stride, size in sorted((s, n) for s, n in zip(strides, t.shape) if n > 1):
        if stride < reach:
            return False
        reach = stride * size
    return True


def test_layout_check_agrees_with_the_sorted_rule_on_any_strides() -> None:
    from dash_attn._ops import _layout_ok

    # Row-major, permuted, overlapping, gapped and broadcast layouts, with sizes of 1 among them.
    generator = torch.Generator().manual_seed(0)
    storage = torch.zeros(1 << 16, dtype=torch.bfloat16)
    stride_choices = torch.tensor([0, 8, 16, 24, 64, 128, 192, 512, 1024, 2048, 4096])
    verdicts = set()
    for _ in range(2000):
        shape = tuple(int(n) for n in torch.randint(1, 4, (3,), generator=generator)) + (HEAD_DIM,)
        picks = torch.randint(len(stride_choices), (3,), generator=generator)
        strides = tuple(int(stride_choices[i]) for i in picks) + (1,)
        t = storage.as_strided(shape, strides)
        assert _layout_ok(t) == _layout_ok_by_sorting(t), (shape, strides)
        verdicts.add(_layout_ok(t))
    assert verdicts == {True, False}


def test_layouts_the_kernels_cannot_take_are_copied() -> None:
    from dash_attn._ops import _kernel_ready

    storage = torch.zeros(BATCH * SEQLEN * HEADS * HEAD_DIM + 1, dtype=torch.bfloat16)
    misaligned = storage[1:].view(BATCH, SEQLEN, HEADS, HEAD_DIM)  # 2 bytes past a 16-byte boundary
    odd_head_stride = bshd(head_dim=HEAD_DIM + 4)[..., :HEAD_DIM]  # head stride 68 elements
    broadcast = torch.zeros(1, 1, 1, HEAD_DIM, dtype=torch.bfloat16).expand(BATCH, SEQLEN, HEADS, HEAD_DIM)
    packed = bshd(batch=1)
    beyond_tma_stride = packed.as_strided(packed.shape, (1 << 39, *packed.stride()[1:]))  # one batch, stride 2^40 B
    for t in (misaligned, odd_head_stride, broadcast, beyond_tma_stride):
        ready = _kernel_ready(t)
        assert ready is not t and torch.equal(ready, t)
        assert ready.stride() == bshd().stride() and ready.data_ptr() % 16 == 0
