"""The one class registry of savable objects, and reading back constructor arguments."""

from __future__ import annotations

import importlib

#: every class that saved files may name: the mixture models (registered by ``MixtureModel``'s
#: subclass hook) and the optimizers (PRESTO, RegularizedWeighting), one registry for all
_REGISTRY: dict[str, type] = {}

_PRESTO = "ppmix.optimizers.presto.estimator.PRESTO"
_RW = "ppmix.optimizers.rw.estimator.RegularizedWeighting"
#: the qualified names older ppmix wrote for classes that have since moved -> their names now (a saved file keeps the
#: name it was written with, so every name ever written stays here)
MOVED_CLASSES: dict[str, str] = {
    # ppmix 0.1.0: one module per optimizer in ppmix.inference
    "ppmix.inference.presto.PRESTO": _PRESTO,
    "ppmix.inference.rw.RegularizedWeighting": _RW,
    # the optimizers under ppmix.inference.optimizers, before they became the top-level ppmix.optimizers
    "ppmix.inference.optimizers.presto.estimator.PRESTO": _PRESTO,
    "ppmix.inference.optimizers.rw.estimator.RegularizedWeighting": _RW,
}


def qualified_name(cls: type) -> str:
    """``module.QualName``: how saved files name a class.

    Examples
    --------
    >>> qualified_name(dict)
    'builtins.dict'
    """
    return f"{cls.__module__}.{cls.__qualname__}"


def register_savable(cls: type) -> type:
    """Class decorator: let :func:`load_model` find ``cls``.

    Subclasses of :class:`Savable` are registered automatically.

    Examples
    --------
    >>> from ppmix.inference import PRESTO
    >>> lookup_class(qualified_name(PRESTO)) is PRESTO
    True
    """
    _REGISTRY[qualified_name(cls)] = cls
    return cls


def lookup_class(name: str) -> type | None:
    """The registered class called ``name``: its qualified name, the name an older ppmix wrote for it
    (:data:`MOVED_CLASSES`), or a bare class name if unambiguous (so files saved before a class moved to another
    module still load).

    Examples
    --------
    >>> from ppmix import GMM
    >>> lookup_class("ppmix.models.gmm.GMM") is GMM and lookup_class("GMM") is GMM
    True
    >>> lookup_class("ppmix.inference.optimizers.rw.estimator.RegularizedWeighting").__module__
    'ppmix.optimizers.rw.estimator'
    """
    name = MOVED_CLASSES.get(name, name)
    if name in _REGISTRY:
        return _REGISTRY[name]
    module = name.rpartition(".")[0]
    if module.startswith("ppmix.") and all(part.isidentifier() for part in module.split(".")):
        try:  # a ppmix class whose module is not imported yet (only ppmix's own modules are ever imported)
            importlib.import_module(module)
        except ImportError:
            pass
        if name in _REGISTRY:
            return _REGISTRY[name]
    matches = {c for c in _REGISTRY.values() if c.__name__ == name.rsplit(".", 1)[-1]}
    return matches.pop() if len(matches) == 1 else None
