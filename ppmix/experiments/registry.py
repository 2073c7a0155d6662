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

    @property
    def stem(self) -> str:
        """The name of its output files, ``NAME.json`` and ``NAME.png``: its module's (``pf-hmm`` -> ``pf_hmm``)."""
        return self.run.__module__.rsplit(".", 1)[-1]

    def execute(self, out_dir: Path, quick: bool) -> dict:
        """Run it into ``out_dir``; make sure its figure is ``out_dir/NAME.png``.

        A reproduction that draws several figures (``NAME_a.png``, ``NAME_b.png``) gets them
        stacked into ``NAME.png`` as well, so every reproduction has the documented pair
        ``NAME.json`` and ``NAME.png``. The result's ``files`` lists what was written.
        """
        out_dir = Path(out_dir)
        result = self.run(out_dir, quick)
        files = [str(f) for f in result.get("files", [])]
        figure = out_dir / f"{self.stem}.png"
        parts = sorted(out_dir.glob(f"{self.stem}_*.png"))
        if not figure.exists() and parts:
            _stack_images(parts, figure)
        for path in (out_dir / f"{self.stem}.json", figure):
            if path.exists() and str(path) not in files:
                files.append(str(path))
        result["files"] = files
        return result


def _stack_images(parts: list[Path], target: Path) -> None:
    """Write the PNG images ``parts`` one above the other into ``target`` (white padding on the right)."""
    import matplotlib.image as mpimg
    import numpy as np

    images = [mpimg.imread(p) for p in parts]
    images = [np.dstack([im, np.ones(im.shape[:2])]) if im.shape[2] == 3 else im for im in images]
    width = max(im.shape[1] for im in images)
    padded = [np.pad(im, ((0, 0), (0, width - im.shape[1]), (0, 0)), constant_values=1.0) for im in images]
    mpimg.imsave(target, np.concatenate(padded, axis=0))


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
