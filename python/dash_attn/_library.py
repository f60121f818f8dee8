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
import os
import threading
import weakref
from pathlib import Path

LIBRARY_FILE = "libdash_attn_c.so"
LIBRARY_ENV = "DASH_ATTN_LIBRARY"

# DASH_C_ABI_VERSION of the dash_c.h these structs mirror; a library of another version is refused.
ABI_VERSION = 10

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

# The head dims the kernels are written for: Python's view of cmake/Supported.cmake, which CTest's repository_check
# compares with it; a build compiles kernels for a subset of these and the dtypes (kernel_available() tells which).
HEAD_DIMS = (64, 96, 128, 192, 256)
# The head dims with a backward as well (kBackwardHeadDims): every supported one (192 and 256 since their
# split-warpgroup backward kernels); a backward at any other raises the library's not-supported error.
BACKWARD_HEAD_DIMS = (64, 96, 128, 192, 256)

STATUS_OK = 0

# DASH_DEVICE_NAME_BYTES: room for the device name in struct dash_device.
DEVICE_NAME_BYTES = 256

# Room for the longest Status message (they name an argument, a rule and a few numbers).
_MESSAGE_BYTES = 4096


class Shape(ctypes.Structure):
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


class Varlen(ctypes.Structure):
    """struct dash_varlen: a packed varlen batch, its cu_seqlens device addresses, the packed row counts and the
    promise that every sequence has seqlen_k <= seqlen_q (keys_within_queries != 0)."""

    _fields_ = [
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("keys_within_queries", ctypes.c_int),
    ]


class Device(ctypes.Structure):
    """struct dash_device: the current CUDA device as the planner sees it (multiprocessor_count SMs)."""

    _fields_ = [
        ("index", ctypes.c_int),
        ("compute_major", ctypes.c_int),
        ("compute_minor", ctypes.c_int),
        ("multiprocessor_count", ctypes.c_int),
        ("name", ctypes.c_char * DEVICE_NAME_BYTES),
    ]


class LibraryError(RuntimeError):
    """A DASH entry point returned a non-zero status; `status` is its stable name, e.g. "invalid-argument"."""

    def __init__(self, what: str, status: str, message: str) -> None:
        super().__init__(f"dash_attn {what} failed with status {status}: {message}")
        self.status = status
        self.message = message


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
        "dash_kernel_available": (c_int, [c_int64, c_int]),
        "dash_softcap_kernel_available": (c_int, [c_int64, c_int]),
        "dash_varlen_kernel_available": (c_int, [c_int64, c_int]),
        "dash_varlen_softcap_kernel_available": (c_int, [c_int64, c_int]),
        "dash_library_version": (c_char_p, []),
        "dash_cuda_runtime_version": (c_int, []),
        "dash_cuda_driver_version": (c_int, []),
        "dash_describe_current_device": (c_int, [ctypes.POINTER(Device), *message]),
        "dash_check_device": (c_int, message),
        "dash_forward_workspace_size": (c_int, [shape_p, size_p, *message]),
        "dash_backward_workspace_size": (c_int, [shape_p, c_char_p, size_p, *message]),
        "dash_forward": (
            c_int,
            [shape_p, tensor_p, tensor_p, tensor_p, tensor_p, c_void_p, c_int, c_void_p, c_size_t, c_void_p, *message],
        ),
        "dash_backward": (
            c_int,
            [
                shape_p,
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
            [shape_p, c_char_p, c_int, ctypes.POINTER(Device), ctypes.POINTER(c_void_p), *message],
        ),
        "dash_forward_varlen": (
            c_int,
            [shape_p, varlen_p, *[tensor_p] * 4, c_void_p, c_int, c_void_p, c_size_t, c_void_p, *message],
        ),
        "dash_backward_plan_create_varlen": (
            c_int,
            [shape_p, c_int, c_int, c_char_p, c_int, ctypes.POINTER(Device), ctypes.POINTER(c_void_p), *message],
        ),
        "dash_backward_plan_run_varlen": (
            c_int,
            [c_void_p, shape_p, varlen_p, *[tensor_p] * 5, c_void_p, *[tensor_p] * 3, c_void_p, c_size_t, c_void_p,
             *message],
        ),
        "dash_backward_plan_destroy": (None, [c_void_p]),
        "dash_backward_plan_workspace_size": (c_int, [c_void_p, size_p, *message]),
        "dash_backward_plan_sm_count": (c_int, [c_void_p, ctypes.POINTER(c_int), *message]),
        "dash_backward_plan_schedule": (c_int, [c_void_p, ctypes.POINTER(c_char_p), *message]),
        "dash_backward_plan_run": (
            c_int,
            [c_void_p, shape_p, *[tensor_p] * 5, c_void_p, *[tensor_p] * 3, c_void_p, c_size_t, c_void_p, *message],
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
    lib.dash_abi_version.restype = ctypes.c_int
    lib.dash_abi_version.argtypes = []
    version = lib.dash_abi_version()
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
    """Calls a status-returning function; a non-zero status becomes LibraryError with the library's message."""
    buffer = _message_buffer()
    _check_status(what, getattr(load(), function_name)(*args, buffer, _MESSAGE_BYTES), buffer)


def _check_status(what: str, code: int, buffer: ctypes.Array) -> None:
    """Raises LibraryError with the message the library wrote into `buffer` unless `code` is STATUS_OK. The
    launches, which run at every attention call, call their functions themselves and then this, a frame and an
    argument tuple fewer than _call."""
    if code != STATUS_OK:
        raise LibraryError(what, load().dash_status_name(code).decode(), buffer.value.decode(errors="replace"))


def kernel_available(head_dim: int, dtype: int, softcap: bool = False) -> bool:
    """Whether the library has kernels for (head_dim, dtype); with softcap=True, its softcap kernels."""
    if softcap:
        return bool(load().dash_softcap_kernel_available(head_dim, dtype))
    return bool(load().dash_kernel_available(head_dim, dtype))


def varlen_kernel_available(head_dim: int, dtype: int, softcap: bool = False) -> bool:
    """Whether the library has the varlen kernels (packed batches with cu_seqlens) for (head_dim, dtype); with
    softcap=True, those of its softcap kernels."""
    if softcap:
        return bool(load().dash_varlen_softcap_kernel_available(head_dim, dtype))
    return bool(load().dash_varlen_kernel_available(head_dim, dtype))


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
) -> None:
    """Enqueues the forward on `stream`, leaving `sm_margin` SMs to other work; `lse` and `workspace` are device
    addresses."""
    buffer = _message_buffer()
    code = load().dash_forward(
        shape, q, k, v, out, lse, sm_margin, workspace, workspace_bytes, stream, buffer, _MESSAGE_BYTES
    )
    _check_status("forward", code, buffer)


def forward_varlen(
    shape: Shape,
    varlen: Varlen,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: int,
    workspace: int,
    workspace_bytes: int,
    stream: int | None,
    sm_margin: int = 0,
) -> None:
    """forward() of a packed varlen batch: `shape` is its maximum problem, `lse` the (heads_q, total_q) fp32 LSE."""
    buffer = _message_buffer()
    code = load().dash_forward_varlen(
        shape, varlen, q, k, v, out, lse, sm_margin, workspace, workspace_bytes, stream, buffer, _MESSAGE_BYTES
    )
    _check_status("varlen forward", code, buffer)


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
) -> None:
    """Enqueues the backward on `stream`, summing dQ in the order `schedule` fixes as planned (at every call) for
    the device's SMs less `sm_margin`."""
    _call(
        "backward",
        "dash_backward",
        shape,
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
        varlen: bool = False,
        keys_within_queries: bool = False,
        lengths_fill_maxima: bool = True,
    ) -> None:
        """varlen=True plans packed varlen batches whose maximum problem is `shape` (dash_backward_plan_create_varlen),
        with the promise `keys_within_queries` (every sequence has seqlen_k <= seqlen_q) and auto's hint
        `lengths_fill_maxima` (_plans.lengths_fill_maxima of the batches' packed rows; False picks shortest-first under
        the full mask, and restricts no batch the plan runs); run it with backward_varlen."""
        lib = load()
        handle = ctypes.c_void_p()
        device_p = None if device is None else ctypes.byref(device)
        if varlen:
            _call(
                "varlen backward plan",
                "dash_backward_plan_create_varlen",
                ctypes.byref(shape),
                int(keys_within_queries),
                int(lengths_fill_maxima),
                schedule.encode(),
                sm_margin,
                device_p,
                ctypes.byref(handle),
            )
        else:
            _call(
                "backward plan",
                "dash_backward_plan_create",
                ctypes.byref(shape),
                schedule.encode(),
                sm_margin,
                device_p,
                ctypes.byref(handle),
            )
        self.varlen = varlen
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
    ) -> None:
        """Enqueues the planned backward on `stream`; `shape` must be the plan's."""
        if self.closed:
            raise ValueError("this BackwardPlan is closed; make a new one")
        buffer = _message_buffer()
        code = load().dash_backward_plan_run(
            self._handle, shape, q, k, v, out, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream, buffer,
            _MESSAGE_BYTES,
        )
        _check_status("backward", code, buffer)

    def backward_varlen(
        self,
        shape: Shape,
        varlen: Varlen,
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
    ) -> None:
        """backward() of a varlen plan on a packed batch; `varlen` must carry the plan's keys_within_queries."""
        if self.closed:
            raise ValueError("this BackwardPlan is closed; make a new one")
        buffer = _message_buffer()
        code = load().dash_backward_plan_run_varlen(
            self._handle, shape, varlen, q, k, v, out, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream,
            buffer, _MESSAGE_BYTES,
        )
        _check_status("varlen backward", code, buffer)
