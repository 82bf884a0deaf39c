"""Package exports resolved on first use (PEP 562), so importing a package loads only what is asked of it.

A package holds ``_EXPORTS`` (name -> the module that defines it) and ends with
``__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())``. Imports nothing of tokenswap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` for its lazily imported ``exports``."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this hook
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
