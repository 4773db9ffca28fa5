"""Public names imported on first use (PEP 562): a package's ``__getattr__`` that takes each name
from the submodule a table gives, so that importing the package loads none of them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str],
                 cache: dict[str, Any] | None = None) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``name`` from ``package.<exports[name]>``, an
    AttributeError for any other name. With ``cache`` (the package's ``globals()``) a name is kept
    there once imported; without, every access reads the submodule's current value."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        if cache is not None:
            cache[name] = value
        return value

    return __getattr__
