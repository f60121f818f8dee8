"""Registers DASH with Hugging Face Transformers as soon as transformers defines its attention registry, so that
attn_implementation="dash_attn" works after a plain `import dash_attn`, without dash_attn importing transformers.

Invariants:
- install() costs no import: it registers right away only when transformers.modeling_utils (where
  AttentionInterface lives) is already loaded; otherwise it puts one finder on sys.meta_path that waits for that
  module. The finder answers no other name, so every other import is untouched, and it leaves sys.meta_path once
  the module has loaded.
- The module is loaded by its own loader, as without the finder; registration runs after the loader has executed
  it completely, and only if that succeeded. The finder wraps nothing else (the spec, the loader's type and its
  other methods stay as they are).
- A transformers that the integration does not support (older than its minimum, or changed where the integration
  reads it) is not an error for transformers: its import goes on, and a warning says why "dash_attn" is not
  registered. An explicit register() raises instead.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

# The module that defines transformers' AttentionInterface; AttentionMaskInterface's (masking_utils) imports
# nothing that needs DASH and is imported by the integration itself.
TARGET = "transformers.modeling_utils"


def _register() -> None:
    # This runs inside the import of transformers.modeling_utils, which is the user's, not DASH's: whatever goes
    # wrong here (an unsupported transformers, or one whose internals changed) becomes a warning naming it, and
    # transformers' import goes on without "dash_attn".
    try:
        importlib.import_module(f"{__package__}.transformers").register()
    except Exception as error:
        warnings.warn(
            f'dash_attn did not register "dash_attn" with transformers: {type(error).__name__}: {error}', stacklevel=2
        )


class _Finder(importlib.abc.MetaPathFinder):
    """Finds TARGET through the finders after it, and has its loader register DASH once it has executed it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_then_register(module: ModuleType) -> None:
            execute(module)
            uninstall()
            _register()

        # The loader object is this module's own (path finders make one per module), so the wrapper reaches
        # no other module.
        loader.exec_module = exec_then_register
        return spec


_finder = _Finder()


def install() -> None:
    """Registers "dash_attn" with transformers now if transformers has loaded its attention registry, else when it
    does. Calling it again changes nothing."""
    if TARGET in sys.modules:
        _register()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Takes the finder off sys.meta_path (registration already made stays)."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
