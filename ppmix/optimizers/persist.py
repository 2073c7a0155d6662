"""Saving and loading the non-generative estimators (PRESTO, RegularizedWeighting) through :mod:`ppmix.io`.

A fitted estimator is written like every ppmix model: ``config.json`` (constructor
arguments, fitted scalars, extra JSON state, the SHA-256 of the tensors) and
``tensors.pt`` (read back with ``weights_only=True``). Fitted objects that hold
tensors (a component family, a list of ``nn.Module`` components, a base learner) are
stored as flat ``prefix.name`` tensor entries and restored into a freshly built
object of the same kind, never unpickled. Tensors are always written from the CPU;
:func:`move_object_tensors` puts the same tensors on the device an estimator runs on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ppmix.io import Savable, load_model
from ppmix.io.model_files import ObjectRequired

__all__ = ["SavableEstimator", "load_object_tensors", "move_object_tensors", "object_tensors"]


def object_tensors(obj: Any, prefix: str) -> dict[str, torch.Tensor]:
    """Flat ``{prefix.name: tensor}`` of an object's fitted tensors.

    ``nn.Module`` and component families contribute their ``state_dict``; other objects
    (base learners) their tensor attributes ending in ``_`` and, recursively, their
    attributes that have a ``state_dict``.

    Examples
    --------
    >>> import torch
    >>> sorted(object_tensors(torch.nn.Linear(2, 1), "m"))
    ['m.bias', 'm.weight']
    """
    if callable(getattr(obj, "state_dict", None)):
        return {f"{prefix}.{k}": v.detach().cpu().contiguous() for k, v in obj.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor) and name.endswith("_"):
            out[f"{prefix}.{name}"] = value.detach().cpu().contiguous()
        elif callable(getattr(value, "state_dict", None)) and not isinstance(value, type):
            out.update(object_tensors(value, f"{prefix}.{name}"))
    return out


def load_object_tensors(obj: Any, tensors: dict[str, torch.Tensor], prefix: str) -> None:
    """Inverse of :func:`object_tensors`, into an object of the same structure (shapes checked).

    Raises
    ------
    ValueError
        If an entry is missing or has the wrong shape.
    """
    mine = {k.removeprefix(f"{prefix}."): v for k, v in tensors.items() if k.startswith(f"{prefix}.")}
    if isinstance(obj, torch.nn.Module):
        try:
            obj.load_state_dict(mine)
        except RuntimeError as err:
            raise ValueError(f"saved {prefix} tensors do not fit the given module: {err}") from None
        return
    if callable(getattr(obj, "load_state_dict", None)):
        obj.load_state_dict(mine)
        return
    expected = object_tensors(obj, prefix)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"saved tensors lack {missing}")
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor) and name.endswith("_"):
            saved = tensors[f"{prefix}.{name}"]
            if saved.shape != value.shape:
                raise ValueError(f"{prefix}.{name} has shape {tuple(saved.shape)}, expected {tuple(value.shape)}")
            setattr(obj, name, saved.to(device=value.device, dtype=value.dtype).clone())
        elif callable(getattr(value, "load_state_dict", None)) and not isinstance(value, type):
            load_object_tensors(value, tensors, f"{prefix}.{name}")


def move_object_tensors(obj: Any, device: torch.device) -> Any:
    """Move the fitted tensors that :func:`object_tensors` finds to ``device``, in place; returns ``obj``.

    ``nn.Module`` and component families move with their own ``to(device)``; other
    objects (base learners) have their tensor attributes ending in ``_`` replaced by
    copies on ``device`` and, recursively, their attributes that have a ``state_dict`` moved.

    Examples
    --------
    >>> import torch
    >>> class Learner:
    ...     def __init__(self):
    ...         self.centres_ = torch.zeros(2, 1)
    >>> move_object_tensors(Learner(), torch.device("meta")).centres_.device
    device(type='meta')
    """
    if callable(getattr(obj, "state_dict", None)):
        return obj.to(device)
    for name, value in list(vars(obj).items()):
        if isinstance(value, torch.Tensor) and name.endswith("_"):
            setattr(obj, name, value.to(device))
        elif callable(getattr(value, "state_dict", None)) and not isinstance(value, type):
            move_object_tensors(value, device)
    return obj


class SavableEstimator(Savable):
    """:class:`~ppmix.io.Savable` for estimators that are not Pyro models.

    Subclasses provide ``_check_fitted``, ``_state_tensors``, ``_extra_state``,
    ``_restore(tensors, extra)`` (rebuild the fitted state), ``_SAVED_PARAMS`` (constructor
    arguments that JSON can hold) and ``_OBJECT_PARAM`` (the constructor argument that may be an
    object a file cannot hold: saved as ``null``, passed again at load). :func:`ppmix.io.load_model`
    restores the fitted state (``_restore`` runs when the tensors arrive), on the device of the
    loaded ``device`` parameter (``map_location`` when one is given).
    """

    _SAVED_PARAMS: tuple[str, ...] = ()
    _OBJECT_PARAM: str = ""

    def _saved_params(self) -> dict[str, Any]:
        """The constructor arguments a saved file records (objects that JSON cannot hold are left out)."""
        return {name: getattr(self, name) for name in self._SAVED_PARAMS}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Keep the JSON state until the tensors arrive (called by :func:`ppmix.io.load_model`).

        Raises
        ------
        ObjectRequired
            If the save used an object for ``_OBJECT_PARAM`` and none was passed to load.
        """
        name, cls = self._OBJECT_PARAM, type(self).__name__
        if name and getattr(self, name) is None:
            kind = state.get(f"{name}_type")
            raise ObjectRequired(
                f"this {cls} was saved with a {kind} {name} object, which a file cannot hold; pass an unfitted "
                f"one of the same kind to {cls}.load(path, {name}=...) (or load_model(path, objects={{{name!r}: ...}}))"
            )
        self._loaded_extra = dict(state)

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Rebuild the fitted state from the tensors and the JSON state with ``_restore``."""
        try:
            self._restore(dict(tensors), self._loaded_extra)
        finally:
            del self._loaded_extra

    def _restore(self, tensors: dict[str, torch.Tensor], extra: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _restore(tensors, extra)")

    @classmethod
    def _load(cls, path: str | Path, template: Any = None, map_location: str | torch.device | None = None) -> Any:
        return load_model(path, expected=cls, map_location=map_location, objects={cls._OBJECT_PARAM: template})
