"""dash_attn: PyTorch front of DASH, bitwise-reproducible attention forward and backward on Hopper GPUs.

The kernels live in libdash_attn_c.so (the C ABI of the C++ library), loaded with ctypes on first use;
the ops are registered with torch.library so they work under torch.compile. See README.md.

The top-level flash_attn_func, flash_attn_kvpacked_func and flash_attn_qkvpacked_func take FlashAttention-2's
arguments in FA2's order, as `from flash_attn import ...` gives them (fa2.py); flash_attn_varlen_func takes packed
variable-length batches with cu_seqlens (varlen.py). dash_attn.fa3 has FA3's order,
and scaled_dot_product_attention has torch's (sdpa.py). attention_backward (gradients.py) runs the backward alone
on a forward's out and LSE. Unlike FlashAttention, every entry point defaults to deterministic=True.
`python -m dash_attn.info` says whether the library can run here. The varlen variants of FA2
(flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func) and FA2's unpad_input/pad_input (padding.py) are
exported too. enable_sdpa()/disable_sdpa() route torch's own F.scaled_dot_product_attention to DASH where torch
allows it (sdpa.py).

With torch, importing the package also arranges that Hugging Face Transformers knows attn_implementation="dash_attn"
(integrations/_transformers_hook.py): at once when transformers has loaded its attention registry, else when it
does. It never imports transformers itself.

Importing the package needs no torch: without it, the ctypes binding (dash_attn._library) and dash_attn.info
still work, and only the attention entry points are missing, raising ImportError that says why when they are
asked for. With torch, importing the package registers torch.ops.dash_attn.* as before.
"""

from ._library import SCHEDULES, ArgumentRefusedError, LibraryError, ResultPoisonedError, library_path

_TORCH_ENTRY_POINTS = (
    "attention_backward",
    "fa3",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "disable_sdpa",
    "enable_sdpa",
    "pad_input",
    "scaled_dot_product_attention",
    "sdpa_enabled",
    "unpad_input",
)


def _import_torch() -> BaseException | None:
    """None when torch imports; else why not. A torch that is installed but broken (a CUDA library it cannot load,
    say) is reported as such, so `python -m dash_attn.info` still runs and says so instead of a traceback."""
    try:
        import torch  # noqa: F401
    except (ImportError, OSError) as error:  # ModuleNotFoundError included: torch or one of its own modules
        return error
    return None


_torch_missing = _import_torch()
if _torch_missing is None:
    from . import fa3
    from .fa2 import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
    from .gradients import attention_backward
    from .integrations import _transformers_hook
    from .padding import pad_input, unpad_input
    from .sdpa import disable_sdpa, enable_sdpa, scaled_dot_product_attention, sdpa_enabled
    from .varlen import flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func

    _transformers_hook.install()
else:
    _torch_problem = (
        "which is not installed"
        if isinstance(_torch_missing, ModuleNotFoundError) and _torch_missing.name == "torch"
        else f"which failed to import: {_torch_missing}"
    )

    def __getattr__(name: str) -> object:
        if name in _TORCH_ENTRY_POINTS:
            raise ImportError(f"dash_attn.{name} needs PyTorch (torch>=2.4), {_torch_problem}") from _torch_missing
        raise AttributeError(f"module 'dash_attn' has no attribute {name!r}")


__all__ = [
    "SCHEDULES",
    "__version__",
    "ArgumentRefusedError",
    "LibraryError",
    "ResultPoisonedError",
    "attention_backward",
    "disable_sdpa",
    "enable_sdpa",
    "fa3",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "library_path",
    "pad_input",
    "scaled_dot_product_attention",
    "sdpa_enabled",
    "unpad_input",
]
from ._version import __version__  # noqa: E402  (the one place the version is written)
