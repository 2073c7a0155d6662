"""Lazy re-exports for package ``__init__`` modules (PEP 562), so ``import ppmix`` stays fast."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``(__getattr__, __dir__)`` for a package whose public names load on first use.

    Parameters
    ----------
    package : str
        The package's ``__name__`` (used in the error message).
    exports : dict of str to str
        Public name -> module that defines it.

    Returns
    -------
    tuple of callables
        The package's module-level ``__getattr__`` and ``__dir__``.

    Examples
    --------
    >>> getattr_, dir_ = lazy_exports("pkg", {"sqrt": "math"})
    >>> getattr_("sqrt")(4.0)
    2.0
    >>> "sqrt" in dir_()
    True
    """

    def __getattr__(name: str) -> Any:
        try:
            module = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
