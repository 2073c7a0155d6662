"""The structures' shape (issue 50): made of parts, not mixin towers, with a small public face.

``Mixture``, ``GMM``, ``HMM`` and ``MixtureOfExperts`` have at most 5 of ppmix's own classes in their MRO and at
most 30 public methods beyond ``torch.nn.Module``'s; no class defined in ``ppmix/models`` is named ``*Mixin``; no
module of ``ppmix/models`` tells prepared data apart with ``isinstance`` (one batch type carries them).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import torch

import ppmix.models
from ppmix import GMM, HMM, Mixture, MixtureOfExperts
from ppmix.io import Savable, lookup_class, qualified_name

STRUCTURES = (Mixture, GMM, HMM, MixtureOfExperts)
MAX_OWN_CLASSES = 5
MAX_PUBLIC_METHODS = 30


def _model_modules() -> list[str]:
    found = pkgutil.walk_packages(ppmix.models.__path__, prefix="ppmix.models.")
    return sorted(info.name for info in found)


def public_methods(cls: type) -> list[str]:
    """The public callables of ``cls`` that ``torch.nn.Module`` has not (properties and classes left out)."""
    inherited = set(dir(torch.nn.Module))
    names = []
    for name in dir(cls):
        if name.startswith("_") or name in inherited or isinstance(inspect.getattr_static(cls, name), property):
            continue
        value = getattr(cls, name, None)
        if callable(value) and not inspect.isclass(value):
            names.append(name)
    return names


def own_classes(cls: type) -> list[str]:
    """The classes of ppmix in ``cls``'s MRO."""
    return [c.__qualname__ for c in cls.__mro__ if c.__module__.startswith("ppmix")]


@pytest.mark.parametrize("cls", STRUCTURES, ids=lambda c: c.__name__)
def test_structure_has_few_own_classes_in_its_mro(cls):
    assert len(own_classes(cls)) <= MAX_OWN_CLASSES, own_classes(cls)


@pytest.mark.parametrize("cls", STRUCTURES, ids=lambda c: c.__name__)
def test_structure_has_a_small_public_face(cls):
    assert len(public_methods(cls)) <= MAX_PUBLIC_METHODS, public_methods(cls)


@pytest.mark.parametrize("module", _model_modules())
def test_no_class_of_the_models_is_a_mixin(module):
    classes = inspect.getmembers(importlib.import_module(module), inspect.isclass)
    mixins = [name for name, c in classes if c.__module__ == module and name.endswith("Mixin")]
    assert not mixins, f"{module} defines {mixins}: make it a part the structure holds, or a base class"


def test_counts_see_a_mixin_and_a_tower():
    """The measures above can fail: a class built as a tower of mixins breaks both."""

    class OneMixin:
        def extra_one(self):
            pass

    class TwoMixin:
        def extra_two(self):
            pass

    tower = type("Tower", (OneMixin, TwoMixin, GMM), {"__module__": "ppmix.models.tower"})
    OneMixin.__module__ = TwoMixin.__module__ = "ppmix.models.tower"
    assert len(own_classes(tower)) == len(own_classes(GMM)) + 3
    assert set(public_methods(tower)) - set(public_methods(GMM)) == {"extra_one", "extra_two"}


@pytest.mark.parametrize("cls", STRUCTURES, ids=lambda c: c.__name__)
def test_every_model_is_savable_and_registered(cls):
    """``Savable`` left the models' MRO; every model still is one, and loads by its saved name."""
    assert issubclass(cls, Savable) and isinstance(cls(2), Savable)
    assert Savable not in cls.__mro__
    assert lookup_class(qualified_name(cls)) is cls


#: the types of prepared data that an EM hook could be tempted to tell apart: the batch, the families' prepared rows,
#: the partly observed rows, the padded sequences, the pf models' data
DATA_TYPES = frozenset(
    {"Batch", "CentredData", "LogData", "PartlyObserved", "SequenceBatch", "PFData", "Frames", "FrameLabels"}
)


def data_unwraps(source: str) -> list[str]:
    """The ``isinstance`` calls of ``source`` whose class (or one of a tuple of classes) is a data type of
    :data:`DATA_TYPES` (by name, with or without a module prefix), as ``line: call``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"):
            continue
        if len(node.args) != 2:
            continue
        classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
        names = {c.attr if isinstance(c, ast.Attribute) else getattr(c, "id", "") for c in classes}
        if names & DATA_TYPES or any(name.startswith("_") and name.endswith("Data") for name in names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_data_unwraps_are_found():
    source = "isinstance(rows, PartlyObserved)\nisinstance(x, (torch.Tensor, _EMData))\nisinstance(n, int)\n"
    assert data_unwraps(source) == ["1: isinstance(rows, PartlyObserved)", "2: isinstance(x, (torch.Tensor, _EMData))"]


@pytest.mark.parametrize("module", [m for m in _model_modules() if m != "ppmix.models.batch"])
def test_no_structure_unwraps_data_by_type(module):
    """Every EM hook reads the one :class:`~ppmix.models.batch.Batch` (``batch.rows``, ``batch.weight``,
    ``batch.observed``, ...); only :func:`~ppmix.models.batch.as_batch` tells prepared data apart by type."""
    source = Path(importlib.import_module(module).__file__).read_text()
    assert data_unwraps(source) == []
