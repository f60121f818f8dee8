"""dash_attn: PyTorch front of DASH, bitwise-reproducible attention forward and backward on Hopper GPUs.

The kernels live in libdash_attn_c.so (the C ABI of the C++ library), loaded with ctypes on first use;
the ops are registered with torch.library so they work under torch.compile. See README.md.
"""

from ._library import SCHEDULES, LibraryError, library_path
from .interface import flash_attn_func, scaled_dot_product_attention

__all__ = ["SCHEDULES", "LibraryError", "flash_attn_func", "library_path", "scaled_dot_product_attention"]
__version__ = "0.1.0"
