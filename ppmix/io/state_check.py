"""The one check of a saved state against the config it was saved with, run by every load.

A checksum only says that the files are the ones a save wrote, or that whoever edited them also
re-computed the checksums. The state must also be one that the saved settings can hold: every
entry those settings imply (:meth:`~ppmix.io.Savable._state_shapes`), no other, each of the shape
they imply (``n_components``, ``n_features_in_``, a covariance type's parameters), and every value
finite. A contradiction is refused naming the tensor file and the entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["check_draws", "check_state"]


def _settings(model: Any, given: tuple[str, ...]) -> str:
    """The settings that fix the shapes, as the refusal shows them."""
    names = ("n_components", "n_models", "n_experts", "covariance_type", "n_features_in_")
    shown = [f"{n}={getattr(model, n)!r}" for n in names if getattr(model, n, None) is not None]
    text = f"the settings in config.json ({', '.join(shown) or 'all of them'})"
    return text + "".join(f" and the {name} object passed to load" for name in given)


def _fits(shape: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    return len(shape) == len(expected) and all(e is None or s == e for s, e in zip(shape, expected))


def _shown(expected: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("any" if e is None else str(e) for e in expected) + ("," if len(expected) == 1 else "") + ")"


def check_draws(mcmc: dict[str, torch.Tensor], per_draw: dict[str, torch.Tensor], tensor_path: Path) -> None:
    """Refuse per-draw statistics (NUTS's ``mcmc_sample_stats_``, the Gibbs engine's log joint) that are not one
    value per draw of the saved draws ``mcmc`` (each ``(chains, draws, ...)``): none without draws, each of shape
    ``(chains, draws)``.

    Examples
    --------
    >>> import torch
    >>> from pathlib import Path
    >>> draws = {"locs": torch.zeros(2, 50, 3)}
    >>> check_draws(draws, {"lp": torch.zeros(2, 50)}, Path("m/tensors.pt"))
    >>> check_draws(draws, {"lp": torch.zeros(2, 49)}, Path("m/tensors.pt"))
    Traceback (most recent call last):
    ...
    ValueError: m/tensors.pt: the per-draw statistic 'lp' has shape (2, 49), but the draws are (2, 50) (chains, draws)
    """
    if not per_draw:
        return
    if not mcmc:
        raise ValueError(f"{tensor_path} holds per-draw statistics ({', '.join(map(repr, per_draw))}) but no draws")
    chains_draws = {tuple(value.shape[:2]) for value in mcmc.values()}
    if len(chains_draws) != 1:
        raise ValueError(f"{tensor_path}: the MCMC draws disagree on their (chains, draws): {sorted(chains_draws)}")
    (expected,) = chains_draws
    for name, value in per_draw.items():
        if tuple(value.shape) != expected:
            raise ValueError(
                f"{tensor_path}: the per-draw statistic {name!r} has shape {tuple(value.shape)}, but the draws are "
                f"{expected} (chains, draws)"
            )


def check_state(
    model: Any,
    state: dict[str, torch.Tensor],
    mcmc: dict[str, torch.Tensor],
    tensor_path: Path,
    given: tuple[str, ...] = (),
    per_draw: dict[str, torch.Tensor] | None = None,
) -> None:
    """Refuse a saved state that ``model``'s settings (already restored from the config) cannot hold.

    Every tensor, fitted state (``state``), MCMC draws (``mcmc``) and the sampler's statistics of every draw
    (``per_draw``, :func:`check_draws`) alike, must hold only finite values; where the class declares
    :meth:`~ppmix.io.Savable._state_shapes`, ``state`` must have exactly the entries it names, each of the shape it
    gives. ``given`` names the constructor arguments that were objects passed to load (they fix shapes too).

    Raises
    ------
    ValueError
        Naming ``tensor_path``, the entry, and what the settings imply.

    Examples
    --------
    >>> import torch
    >>> from pathlib import Path
    >>> class Model:
    ...     n_components = 2
    ...     def _state_shapes(self):
    ...         return {"weights": (2,)}
    >>> check_state(Model(), {"weights": torch.ones(3)}, {}, Path("m/tensors.pt"))
    Traceback (most recent call last):
    ...
    ValueError: m/tensors.pt: entry 'weights' has shape (3,), but the settings in config.json (n_components=2) ...
    """
    per_draw = per_draw or {}
    for where, tensors in (("fitted parameter", state), ("MCMC draws of", mcmc), ("per-draw statistic", per_draw)):
        for name, value in tensors.items():
            if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
                what = "NaN" if bool(torch.isnan(value).any()) else "infinite values"
                raise ValueError(f"{tensor_path}: {where} {name!r} holds {what}")
    check_draws(mcmc, per_draw, tensor_path)
    expected = model._state_shapes()
    if expected is None:
        return
    settings = _settings(model, given)
    missing = [name for name in expected if name not in state]
    if missing:
        raise ValueError(
            f"{tensor_path} lacks the entry {missing[0]!r}, which {settings} imply "
            f"(a {type(model).__name__} with them holds {', '.join(map(repr, expected))})"
        )
    foreign = [name for name in state if name not in expected]
    if foreign:
        raise ValueError(
            f"{tensor_path}: entry {foreign[0]!r} is not part of a {type(model).__name__} with {settings}, "
            f"which holds {', '.join(map(repr, expected))}"
        )
    for name, shape in expected.items():
        if not _fits(tuple(state[name].shape), shape):
            raise ValueError(
                f"{tensor_path}: entry {name!r} has shape {tuple(state[name].shape)}, but {settings} "
                f"imply {_shown(shape)}"
            )
