"""ctypes binding of libdash_attn_c.so, the C ABI of DASH (src/capi/dash_c.h).

The package never compiles against torch: this module is the only place that knows the C structs, and it
does not import torch either (nor does the package's __init__ require it), so it can be used (and tested)
on any machine that has the library file. The library is loaded on first use rather than at import, so
argument checking and torch.compile tracing work where it has not been built. $DASH_ATTN_LIBRARY, when
set, names the library to load and wins over the copy installed with the package; if it names no file,
loading fails rather than silently using another library.

sm_margin, wherever it appears, is FlashAttention-3's: SMs the launch leaves to other work (communication
kernels); the kernels' persistent grids use at most the device's SM count - sm_margin SMs, and the library
refuses a margin outside [0, SM count).

The launch functions, which run at every attention call, pass their structs as themselves: where argtypes say
POINTER(T), ctypes passes a T instance by reference and checks its type, as it does a byref() of one, in about
half the time, and they call their C functions directly rather than through _call. Every call gets its thread's
one message buffer instead of a new one.

A dash_backward_plan handle is owned by exactly one BackwardPlan object, which frees it once: when the
object is collected, at interpreter exit, or at close(), whichever comes first; a closed plan refuses to
run rather than pass a freed handle to the library.
"""

from __future__ import annotations

import ctypes
import functools
import math
import numbers
import os
import threading
import weakref
from pathlib import Path

LIBRARY_FILE = "libdash_attn_c.so"
LIBRARY_ENV = "DASH_ATTN_LIBRARY"

# DASH_C_ABI_VERSION of the dash_c.h these structs mirror; a library of another version is refused.
ABI_VERSION = 14

# The canonical schedule names, in dash::kAllSchedules order. Kept here so names can be checked before the
# library is loaded; load() verifies that the library agrees.
SCHEDULES = (
    "auto",
    "ascending",
    "descending",
    "shortest-first",
    "shift",
    "symmetric-shift",
    "nondeterministic",
)

DTYPE_BF16 = 0
DTYPE_FP16 = 1
DTYPE_NAMES = {DTYPE_BF16: "bf16", DTYPE_FP16: "fp16"}
# DASH_DTYPE_FP32: an out dtype only (forward's out_dtype), never an input's.
DTYPE_FP32 = 2

# The head dims the kernels are written for: Python's view of cmake/Supported.cmake, which CTest's repository_check
# compares with it; a build compiles kernels for a subset of these and the dtypes (kernel_available() tells which).
HEAD_DIMS = (64, 96, 128, 192, 256)
# The head dims with a backward as well (kBackwardHeadDims): every supported one (192 and 256 since their
# split-warpgroup backward kernels); a backward at any other raises the library's not-supported error.
BACKWARD_HEAD_DIMS = (64, 96, 128, 192, 256)

STATUS_OK = 0

# enum dash_kernel_feature: the bits of dash_kernel_available's features.
KERNEL_SOFTCAP = 1
KERNEL_VARLEN = 2

# DASH_DEVICE_NAME_BYTES: room for the device name in struct dash_device.
DEVICE_NAME_BYTES = 256

# Room for the longest Status message (they name an argument, a rule and a few numbers).
_MESSAGE_BYTES = 4096


def _float32_image(value: float) -> float:
    """`value` as the C float a ctypes c_float field or argument holds (round to nearest)."""
    return ctypes.c_float(value).value


class _CheckedStructure(ctypes.Structure):
    """A ctypes struct whose constructor refuses, naming the field, an integer its C type cannot hold and a nonzero
    finite number whose C float image is 0 or infinite, where ctypes would store the low bits or the rounded value
    silently. Fields assigned after construction are the caller's to check (check_c_integer)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        checks = type(self)._checks()
        for (name, _c_type), value in zip(self._fields_, args, strict=False):  # ctypes takes a prefix
            self._check_field(checks, name, value)
        for name, value in kwargs.items():
            self._check_field(checks, name, value)

    @classmethod
    @functools.cache
    def _checks(cls) -> dict[str, tuple[str, str | None]]:
        """Each field's label in messages ("shape.batch") and its C integer type's name (None for other types)."""
        prefix = cls.__name__.lower()
        return {name: (f"{prefix}.{name}", _C_INTEGER_NAMES.get(c_type)) for name, c_type in cls._fields_}

    def _check_field(self, checks: dict[str, tuple[str, str | None]], name: str, value: object) -> None:
        label, integer = checks[name]
        if integer is not None:
            check_c_integer(value, label, integer)
        elif isinstance(value, numbers.Real) and value != 0 and math.isfinite(value):
            image = getattr(self, name)
            if image == 0 or not math.isfinite(image):
                raise ValueError(f"{label} = {value!r} is {image} as the C float the library takes it as")


_C_INTEGER_NAMES = {ctypes.c_int: "int", ctypes.c_int64: "int64_t", ctypes.c_size_t: "size_t"}


class Shape(_CheckedStructure):
    """struct dash_shape. windowed = 0 (ctypes' zero, so also a shape made from the fields before the window's)
    means no window; _ops sets windowed = 1 with the window's bounds."""

    _fields_ = [
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("dtype", ctypes.c_int),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("windowed", ctypes.c_int),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),
    ]


class Tensor(ctypes.Structure):
    """struct dash_tensor: a data pointer and the element strides of (B, S, H, D)."""

    _fields_ = [("data", ctypes.c_void_p), ("strides", ctypes.c_int64 * 4)]


class Varlen(_CheckedStructure):
    """struct dash_varlen: a packed varlen batch, its cu_seqlens device addresses, the packed row counts and the
    promise that every sequence has seqlen_k <= seqlen_q (keys_within_queries != 0)."""

    _fields_ = [
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("keys_within_queries", ctypes.c_int),
    ]


class MergeArgs(ctypes.Structure):
    """struct dash_merge_args: one block's fp32 partial (out (batch, rows, heads, head_dim), lse (batch, heads, rows))
    merged into fp32 accumulators (batch, seqlen, heads, head_dim) and (batch, heads, seqlen) at rows row_index (a
    device address of `rows` int32 rows, or 0) or row_offset + r; every stride in elements, the LSEs' (batch, head,
    row)."""

    _fields_ = [
        ("batch", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("seqlen", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("part_out", Tensor),
        ("part_lse", ctypes.c_void_p),
        ("part_lse_strides", ctypes.c_int64 * 3),
        ("acc_out", Tensor),
        ("acc_lse", ctypes.c_void_p),
        ("acc_lse_strides", ctypes.c_int64 * 3),
        ("row_index", ctypes.c_void_p),
        ("row_offset", ctypes.c_int64),
    ]


class Device(_CheckedStructure):
    """struct dash_device: the current CUDA device as the planner sees it (multiprocessor_count SMs)."""

    _fields_ = [
        ("index", ctypes.c_int),
        ("compute_major", ctypes.c_int),
        ("compute_minor", ctypes.c_int),
        ("multiprocessor_count", ctypes.c_int),
        ("name", ctypes.c_char * DEVICE_NAME_BYTES),
    ]


class LibraryError(RuntimeError):
    """A DASH entry point returned a non-zero status; `status` is its stable name, e.g. "invalid-argument".
    _check_status raises one of the subclasses below where the status has one, LibraryError itself otherwise."""

    def __init__(self, what: str, status: str, message: str) -> None:
        super().__init__(f"dash_attn {what} failed with status {status}: {message}")
        self.status = status
        self.message = message


class ArgumentRefusedError(LibraryError, ValueError):
    """The library refused the call's arguments: a bad shape, stride or pointer, a schedule whose preconditions
    fail, a size past the kernels' limits, a workspace too small. A ValueError as well, as Python's convention for a
    bad argument is, so `except ValueError` catches it and `except LibraryError` still does."""


class ResultPoisonedError(LibraryError):
    """An earlier call on the device could not vouch for its result: its rows were filled with NaN on the device
    (a bounded wait that gave up, a sequence longer than the max_seqlen it was planned for, varlen offsets out of
    order, a merge's row index outside its accumulators), and the library says which at the next call. A
    RuntimeError, not a ValueError: the arguments of the call that raises it are not at fault."""


# The statuses whose refusals are argument errors (dash_c.h's codes), and those that report a poisoned result.
# DASH_STATUS_NOT_SUPPORTED is an argument problem too: a head dim, dtype or size the kernels do not take.
STATUS_INVALID_ARGUMENT = 1
STATUS_NOT_SUPPORTED = 2
STATUS_WORKSPACE_TOO_SMALL = 6
STATUS_SCHEDULE_REJECTED = 7
STATUS_WAIT_TIMEOUT = 9
STATUS_SEQLEN_EXCEEDS_MAX = 10
STATUS_ROW_INDEX_INVALID = 11
STATUS_CU_SEQLENS_INVALID = 12
_ERROR_CLASSES: dict[int, type[LibraryError]] = {
    STATUS_INVALID_ARGUMENT: ArgumentRefusedError,
    STATUS_NOT_SUPPORTED: ArgumentRefusedError,
    STATUS_WORKSPACE_TOO_SMALL: ArgumentRefusedError,
    STATUS_SCHEDULE_REJECTED: ArgumentRefusedError,
    STATUS_WAIT_TIMEOUT: ResultPoisonedError,
    # A library that never returns this code loses nothing by the entry.
    STATUS_SEQLEN_EXCEEDS_MAX: ResultPoisonedError,
    STATUS_ROW_INDEX_INVALID: ResultPoisonedError,
    STATUS_CU_SEQLENS_INVALID: ResultPoisonedError,
}


def error_for_status(what: str, code: int, status: str, message: str) -> LibraryError:
    """The exception of a non-zero status `code` (named `status` by the library): the class _ERROR_CLASSES gives
    it, LibraryError for any other code, one this package does not know included."""
    return _ERROR_CLASSES.get(code, LibraryError)(what, status, message)


# The ranges of the C integer types the arguments below cross ctypes as: ctypes keeps the low bits of a Python int
# that does not fit, silently (2**32 + 5 becomes 5), so every integer is checked against its type first.
C_INT_MIN, C_INT_MAX = -(1 << 31), (1 << 31) - 1
C_INT64_MIN, C_INT64_MAX = -(1 << 63), (1 << 63) - 1
C_SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1
_C_RANGES = {"int": (C_INT_MIN, C_INT_MAX), "int64_t": (C_INT64_MIN, C_INT64_MAX), "size_t": (0, C_SIZE_MAX)}


def check_c_integer(value: object, name: str, c_type: str) -> int:
    """`value` as a Python int after checking that it is an integer (TypeError otherwise; a bool is refused) that the
    C type `c_type` ("int", "int64_t" or "size_t") holds (ValueError naming `name` and the range otherwise)."""
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        value = int(value)
    low, high = _C_RANGES[c_type]
    if not low <= value <= high:
        raise ValueError(
            f"{name} = {value} does not fit the C {c_type} the library takes it as: it must be in [{low}, {high}]"
        )
    return value


def _find_library() -> Path:
    """The library file load() uses: $DASH_ATTN_LIBRARY when set (the file, or a directory that holds it),
    else the copy installed next to the package. Raises ImportError saying which is missing."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        path = Path(env)
        if path.is_dir():
            path = path / LIBRARY_FILE
        if not path.is_file():
            raise ImportError(
                f"${LIBRARY_ENV} is set to {env!r}, but there is no file {path}. Point it at {LIBRARY_FILE} "
                f"(or the directory that holds it), or unset it to use the library installed with the package."
            )
        return path
    path = Path(__file__).resolve().parent / LIBRARY_FILE
    if not path.is_file():
        raise ImportError(
            f"dash_attn cannot find {LIBRARY_FILE}: it is not next to the package ({path}) and ${LIBRARY_ENV} is "
            f"not set. Install the package with `pip install .` from the repository root, or build the CMake "
            f"target dash_attn_c and set {LIBRARY_ENV} to the library file."
        )
    return path


def _declare(lib: ctypes.CDLL) -> None:
    """Gives every function its C signature, so ctypes converts (and checks) arguments instead of guessing."""
    c_int64, c_int, c_size_t = ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    c_char_p, c_void_p = ctypes.c_char_p, ctypes.c_void_p
    shape_p, tensor_p, varlen_p = ctypes.POINTER(Shape), ctypes.POINTER(Tensor), ctypes.POINTER(Varlen)
    size_p = ctypes.POINTER(c_size_t)
    message = [c_char_p, c_size_t]
    signatures = {
        "dash_status_name": (c_char_p, [c_int]),
        "dash_schedule_names": (c_char_p, []),
        "dash_kernel_available": (c_int, [c_int64, c_int, c_int]),
        "dash_library_version": (c_char_p, []),
        "dash_cuda_runtime_version": (c_int, []),
        "dash_cuda_driver_version": (c_int, []),
        "dash_describe_current_device": (c_int, [ctypes.POINTER(Device), *message]),
        "dash_check_device": (c_int, message),
        "dash_forward_workspace_size": (c_int, [shape_p, size_p, *message]),
        "dash_backward_workspace_size": (c_int, [shape_p, c_char_p, size_p, *message]),
        "dash_forward": (
            c_int,
            [shape_p, varlen_p, *[tensor_p] * 4, c_int, c_void_p, c_int, c_void_p, c_size_t, c_void_p, *message],
        ),
        "dash_merge_kernel_available": (c_int, []),
        "dash_merge_partial": (c_int, [ctypes.POINTER(MergeArgs), c_void_p, *message]),
        "dash_backward": (
            c_int,
            [
                shape_p,
                varlen_p,
                *[tensor_p] * 5,
                c_void_p,
                *[tensor_p] * 3,
                c_char_p,
                c_int,
                c_void_p,
                c_size_t,
                c_void_p,
                *message,
            ],
        ),
        "dash_backward_plan_create": (
            c_int,
            [shape_p, varlen_p, c_char_p, c_int, ctypes.POINTER(Device), ctypes.POINTER(c_void_p), *message],
        ),
        "dash_backward_plan_destroy": (None, [c_void_p]),
        "dash_backward_plan_workspace_size": (c_int, [c_void_p, size_p, *message]),
        "dash_backward_plan_sm_count": (c_int, [c_void_p, ctypes.POINTER(c_int), *message]),
        "dash_backward_plan_schedule": (c_int, [c_void_p, ctypes.POINTER(c_char_p), *message]),
        "dash_backward_plan_run": (
            c_int,
            [
                c_void_p,
                shape_p,
                varlen_p,
                *[tensor_p] * 5,
                c_void_p,
                *[tensor_p] * 3,
                c_void_p,
                c_size_t,
                c_void_p,
                *message,
            ],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


@functools.cache
def load() -> ctypes.CDLL:
    """Loads and checks libdash_attn_c.so (the file _find_library() names) once; raises ImportError saying
    what is missing or wrong."""
    path = _find_library()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        raise ImportError(f"dash_attn cannot load {path}: {error}") from error
    # The version first: a library of another version may lack functions _declare() looks up.
    try:
        abi_version = lib.dash_abi_version
    except AttributeError as error:
        raise ImportError(
            f"{path} is not DASH's library: it exports no dash_abi_version(). ${LIBRARY_ENV} must name "
            f"libdash_attn_c.so built from DASH (or the directory that holds it); unset it to use the library "
            f"installed with the package"
        ) from error
    abi_version.restype = ctypes.c_int
    abi_version.argtypes = []
    version = abi_version()
    if version != ABI_VERSION:
        raise ImportError(f"{path} has C ABI version {version}, this package needs {ABI_VERSION}; rebuild it")
    _declare(lib)
    names = tuple(lib.dash_schedule_names().decode().split(","))
    if names != SCHEDULES:
        raise ImportError(f"{path} knows the schedules {names}, this package {SCHEDULES}; rebuild it")
    return lib


def library_path() -> Path:
    """The file load() uses (loading it if needed)."""
    return Path(load()._name)


# Each thread's buffer for the library's status messages, made once rather than at every launch: the library
# writes a call's message into it and _call reads it before that thread can call again.
_messages = threading.local()


def _message_buffer() -> ctypes.Array:
    try:
        return _messages.buffer
    except AttributeError:
        _messages.buffer = ctypes.create_string_buffer(_MESSAGE_BYTES)
        return _messages.buffer


def _call(what: str, function_name: str, *args: object) -> None:
    """Calls a status-returning function; a non-zero status becomes error_for_status's LibraryError with the
    library's message."""
    buffer = _message_buffer()
    _check_status(what, getattr(load(), function_name)(*args, buffer, _MESSAGE_BYTES), buffer)


def _check_status(what: str, code: int, buffer: ctypes.Array) -> None:
    """Raises error_for_status's LibraryError with the message the library wrote into `buffer` unless `code` is
    STATUS_OK. The
    launches, which run at every attention call, call their functions themselves and then this, a frame and an
    argument tuple fewer than _call."""
    if code != STATUS_OK:
        status = load().dash_status_name(code).decode()
        raise error_for_status(what, code, status, buffer.value.decode(errors="replace"))


def kernel_available(head_dim: int, dtype: int, softcap: bool = False, varlen: bool = False) -> bool:
    """Whether the library has kernels for (head_dim, dtype): with softcap=True, its softcap instance's; with
    varlen=True, the varlen kernels (packed batches with cu_seqlens)."""
    head_dim, dtype = check_c_integer(head_dim, "head_dim", "int64_t"), check_c_integer(dtype, "dtype", "int")
    features = (KERNEL_SOFTCAP if softcap else 0) | (KERNEL_VARLEN if varlen else 0)
    return bool(load().dash_kernel_available(head_dim, dtype, features))


def compiled_kernels() -> list[tuple[int, str]]:
    """The (head_dim, dtype name) pairs this build has kernels for, e.g. [(64, "bf16"), (128, "bf16")]."""
    return [(d, name) for d in HEAD_DIMS for code, name in DTYPE_NAMES.items() if kernel_available(d, code)]


def library_version() -> str:
    """The version of the DASH sources the library was built from (CMake's project version)."""
    return load().dash_library_version().decode()


def cuda_runtime_version() -> int:
    """The CUDA runtime linked into the library, encoded as CUDA does (12080 is 12.8)."""
    return load().dash_cuda_runtime_version()


def cuda_driver_version() -> int:
    """The newest CUDA the installed driver supports, encoded as CUDA does; 0 when no driver is installed."""
    return load().dash_cuda_driver_version()


def describe_current_device() -> Device:
    """The current CUDA device, even one the kernels cannot run on; raises LibraryError when there is none."""
    device = Device()
    _call("device query", "dash_describe_current_device", ctypes.byref(device))
    return device


def check_device() -> None:
    """Raises LibraryError unless the current CUDA device is a Hopper GPU."""
    _call("device check", "dash_check_device")


def forward_workspace_size(shape: Shape) -> int:
    size = ctypes.c_size_t(0)
    _call("forward workspace query", "dash_forward_workspace_size", ctypes.byref(shape), ctypes.byref(size))
    return size.value


def backward_workspace_size(shape: Shape, schedule: str) -> int:
    size = ctypes.c_size_t(0)
    _call(
        "backward workspace query",
        "dash_backward_workspace_size",
        ctypes.byref(shape),
        schedule.encode(),
        ctypes.byref(size),
    )
    return size.value


def _check_launch_integers(sm_margin: object, workspace_bytes: object) -> None:
    """The integers a launch passes besides its structs and device addresses, checked against their C types (the
    comparisons alone where both are plain ints in range, the common case: this runs at every call)."""
    if (
        type(sm_margin) is int
        and type(workspace_bytes) is int
        and C_INT_MIN <= sm_margin <= C_INT_MAX
        and 0 <= workspace_bytes <= C_SIZE_MAX
    ):
        return
    check_c_integer(sm_margin, "sm_margin", "int")
    check_c_integer(workspace_bytes, "workspace_bytes", "size_t")


def forward(
    shape: Shape,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: int,
    workspace: int,
    workspace_bytes: int,
    stream: int | None,
    sm_margin: int = 0,
    varlen: Varlen | None = None,
    out_fp32: bool = False,
) -> None:
    """Enqueues the forward on `stream`, leaving `sm_margin` SMs to other work; `lse` and `workspace` are device
    addresses. With `varlen`, a packed varlen batch: `shape` is its maximum problem, `lse` the (heads_q, total_q) fp32
    LSE. With `out_fp32`, out is fp32: the values before their rounding to the shape's dtype."""
    _check_launch_integers(sm_margin, workspace_bytes)
    buffer = _message_buffer()
    out_dtype = DTYPE_FP32 if out_fp32 else shape.dtype
    code = load().dash_forward(
        shape,
        varlen,
        q,
        k,
        v,
        out,
        out_dtype,
        lse,
        sm_margin,
        workspace,
        workspace_bytes,
        stream,
        buffer,
        _MESSAGE_BYTES,
    )
    _check_status("forward", code, buffer)


def merge_kernel_available() -> bool:
    """Whether the library has dash_merge_partial's kernel (a build with kernels has it)."""
    return bool(load().dash_merge_kernel_available())


def merge_partial(args: MergeArgs, stream: int | None) -> None:
    """Enqueues the merge of one block's partial result into the accumulators `args` names, on `stream`."""
    buffer = _message_buffer()
    _check_status("merge", load().dash_merge_partial(args, stream, buffer, _MESSAGE_BYTES), buffer)


def backward(
    shape: Shape,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    dout: Tensor,
    lse: int,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    schedule: str,
    workspace: int,
    workspace_bytes: int,
    stream: int | None,
    sm_margin: int = 0,
    varlen: Varlen | None = None,
) -> None:
    """Enqueues the backward on `stream`, summing dQ in the order `schedule` fixes as planned (at every call) for
    the device's SMs less `sm_margin`; with `varlen`, of a packed varlen batch, as forward()."""
    _check_launch_integers(sm_margin, workspace_bytes)
    _call(
        "backward",
        "dash_backward",
        shape,
        varlen,
        q,
        k,
        v,
        out,
        dout,
        lse,
        dq,
        dk,
        dv,
        schedule.encode(),
        sm_margin,
        workspace,
        workspace_bytes,
        stream,
    )


class BackwardPlan:
    """A dash_backward_plan: the backward planned once for one shape and schedule on one device (the current
    one, or `device` as described by hand, which needs no GPU) leaving `sm_margin` of its SMs to other work,
    proven, with its workspace size, the schedule it runs (`schedule`: auto resolved) and the SM count it was planned
    for (`sm_count`: the device's less the margin). Running it plans nothing; the library refuses a call whose shape
    is not the plan's, naming the field."""

    def __init__(
        self,
        shape: Shape,
        schedule: str,
        device: Device | None = None,
        sm_margin: int = 0,
        varlen: Varlen | None = None,
    ) -> None:
        """With `varlen`, plans packed varlen batches whose maximum problem is `shape`: the library reads only its
        promise keys_within_queries (every sequence has seqlen_k <= seqlen_q) and its totals, which give auto's hint
        (_plans.lengths_fill_maxima; rows showing some sequence shorter than the maxima pick shortest-first under the
        full mask, and restrict no batch the plan runs); its cu_seqlens may be 0. Its runs pass a varlen with the
        same promise, and only they: `varlen` is set to whether it is a varlen plan."""
        sm_margin = check_c_integer(sm_margin, "sm_margin", "int")
        if varlen is not None and not isinstance(varlen, Varlen):
            raise TypeError(f"varlen must be a Varlen (a packed batch's) or None (dense), got {type(varlen).__name__}")
        lib = load()
        handle = ctypes.c_void_p()
        device_p = None if device is None else ctypes.byref(device)
        _call(
            "backward plan",
            "dash_backward_plan_create",
            ctypes.byref(shape),
            varlen,
            schedule.encode(),
            sm_margin,
            device_p,
            ctypes.byref(handle),
        )
        self.varlen = varlen is not None
        self._handle = handle.value
        # weakref.finalize frees the handle once: at collection, at exit or at close(), whichever comes first.
        self._free = weakref.finalize(self, lib.dash_backward_plan_destroy, self._handle)
        size = ctypes.c_size_t(0)
        _call("backward workspace query", "dash_backward_plan_workspace_size", self._handle, ctypes.byref(size))
        self.workspace_bytes = size.value
        sm_count = ctypes.c_int(0)
        _call("backward plan query", "dash_backward_plan_sm_count", self._handle, ctypes.byref(sm_count))
        self.sm_margin = sm_margin
        self.sm_count = sm_count.value
        name = ctypes.c_char_p()
        _call("backward plan query", "dash_backward_plan_schedule", self._handle, ctypes.byref(name))
        self.schedule = name.value.decode()

    @property
    def closed(self) -> bool:
        return not self._free.alive

    def close(self) -> None:
        """Frees the handle now; later calls of close() do nothing."""
        self._free()

    def backward(
        self,
        shape: Shape,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        dout: Tensor,
        lse: int,
        dq: Tensor,
        dk: Tensor,
        dv: Tensor,
        workspace: int,
        workspace_bytes: int,
        stream: int | None,
        varlen: Varlen | None = None,
    ) -> None:
        """Enqueues the planned backward on `stream`; `shape` must be the plan's, and `varlen` given for a varlen plan
        alone, with its keys_within_queries."""
        if self.closed:
            raise ValueError("this BackwardPlan is closed; make a new one")
        _check_launch_integers(self.sm_margin, workspace_bytes)
        buffer = _message_buffer()
        code = load().dash_backward_plan_run(
            self._handle,
            shape,
            varlen,
            q,
            k,
            v,
            out,
            dout,
            lse,
            dq,
            dk,
            dv,
            workspace,
            workspace_bytes,
            stream,
            buffer,
            _MESSAGE_BYTES,
        )
        _check_status("backward", code, buffer)
