"""Registry of paper reproductions run by ``ppmix reproduce NAME``.

Each reproduction lives in a module of :mod:`ppmix.experiments` and registers a
function ``run(out_dir: Path, quick: bool) -> dict`` with :func:`register`; the CLI
lists and runs them. The experiment modules are imported on first use of the registry.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["Reproduction", "get", "register", "registered"]


@dataclass(frozen=True)
class Reproduction:
    """A named reproduction of a paper's table or figure."""

    name: str
    description: str
    run: Callable[[Path, bool], dict]


_REGISTRY: dict[str, Reproduction] = {}


def register(name: str, description: str) -> Callable[[Callable[[Path, bool], dict]], Callable[[Path, bool], dict]]:
    """Decorator adding ``run(out_dir, quick)`` to the registry under ``name``."""

    def decorate(run: Callable[[Path, bool], dict]) -> Callable[[Path, bool], dict]:
        if name in _REGISTRY:
            raise ValueError(f"a reproduction named {name!r} is already registered")
        _REGISTRY[name] = Reproduction(name, description, run)
        return run

    return decorate


def _load_experiments() -> None:
    """Import every module of :mod:`ppmix.experiments` so that their reproductions register."""
    import ppmix.experiments as package

    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_") and module.name != "registry":
            importlib.import_module(f"{package.__name__}.{module.name}")


def registered() -> list[Reproduction]:
    """All registered reproductions, sorted by name."""
    _load_experiments()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def get(name: str) -> Reproduction:
    """The reproduction called ``name`` (``KeyError`` lists the known names)."""
    _load_experiments()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none yet"
        raise KeyError(f"unknown reproduction {name!r}; known: {known}") from None
