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

from ppmix._validation import resolve_device
from ppmix.io import Savable, load_model

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

    Subclasses provide ``_check_fitted``, ``state_tensors``, ``extra_state``,
    ``_restore(tensors, extra, template)`` (rebuild the fitted state) and
    ``_SAVED_PARAMS`` (constructor arguments that JSON can hold). ``_restore`` rebuilds
    the fitted state on the device of the loaded ``device`` parameter (``map_location``
    when one is given).
    """

    _SAVED_PARAMS: tuple[str, ...] = ()

    def saved_params(self) -> dict[str, Any]:
        """The constructor arguments a saved file records (objects that JSON cannot hold are left out)."""
        return {name: getattr(self, name) for name in self._SAVED_PARAMS}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Keep the JSON state until the tensors arrive (called by :func:`ppmix.io.load_model`)."""
        self._loaded_extra = dict(state)

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Keep the tensors until :meth:`_load` rebuilds the fitted state with ``_restore``."""
        self._loaded_tensors = dict(tensors)

    @classmethod
    def _load(cls, path: str | Path, template: Any = None, map_location: str | torch.device | None = None) -> Any:
        est = load_model(path, expected=cls, map_location=map_location)
        try:
            resolve_device(est.device)
        except ValueError as err:
            raise ValueError(
                f"{path} was saved for device={est.device!r}: {err}. To load it here, pass map_location='cpu'"
            ) from None
        try:
            est._restore(est._loaded_tensors, est._loaded_extra, template)
        except (KeyError, RuntimeError) as err:
            raise ValueError(f"{path} does not hold a valid {cls.__name__} state: {err}") from None
        finally:
            del est._loaded_tensors, est._loaded_extra
        return est
