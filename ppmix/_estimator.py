"""scikit-learn's estimator contract, shared by every ppmix estimator.

:class:`Estimator` is scikit-learn's ``BaseEstimator`` with one change: a constructor that
forwards ``**kwargs`` to its parent's (``SupervisedGMM(**kwargs)``) still lists the parent's
named arguments as its parameters. ``get_params(deep=...)``, ``set_params``,
``sklearn.base.clone``, ``__sklearn_tags__`` and the HTML/text ``repr`` then come from
scikit-learn itself, so ppmix estimators work in ``Pipeline``, ``GridSearchCV`` and
``cross_val_score``.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from sklearn.base import BaseEstimator

__all__ = ["Estimator", "constructor_parameters"]


def constructor_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """Named constructor parameters of ``cls``, following ``**kwargs`` forwarded to the parents' ``__init__``
    (the first class in the MRO that names a parameter defines it).

    Examples
    --------
    >>> class A:
    ...     def __init__(self, a=1, *, b=2): ...
    >>> class B(A):
    ...     def __init__(self, c=3, **kwargs): ...
    >>> list(constructor_parameters(B))
    ['c', 'a', 'b']
    """
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        signature = inspect.signature(vars(klass)["__init__"])
        for name, p in signature.parameters.items():
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                params.setdefault(name, p)
        if not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
            break
    return params


def _forwarded_signature(cls: type) -> inspect.Signature:
    """The signature of ``cls.__init__`` with the ``**kwargs`` it forwards spelled out as the parents' named
    (keyword-only) arguments, less ``cls.fixed_params``: what ``inspect.signature``, IDEs and scikit-learn's
    checks then show."""
    own = inspect.signature(vars(cls)["__init__"]).parameters.values()
    named = [p for p in own if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    present = {p.name for p in named}
    fixed = getattr(cls, "fixed_params", ())
    forwarded = [
        p.replace(kind=p.KEYWORD_ONLY)
        for name, p in constructor_parameters(cls).items()
        if name not in present and name not in fixed
    ]
    return inspect.Signature([*named, *forwarded])


class Estimator(BaseEstimator):
    """Base of ppmix's estimators: scikit-learn's ``BaseEstimator`` for constructors that forward ``**kwargs``.

    The parameters are the constructor's named arguments and those of the parents it
    forwards ``**kwargs`` to, less :attr:`fixed_params` (arguments of a parent that a
    subclass sets itself). Subclasses write ``_check_fitted()``; scikit-learn's
    ``check_is_fitted`` reads it through ``__sklearn_is_fitted__``.

    Examples
    --------
    >>> from sklearn.base import clone
    >>> from ppmix import GMM
    >>> gmm = clone(GMM(2, seed=0)).set_params(n_components=3)
    >>> gmm.get_params()["n_components"], gmm
    (3, GMM(n_components=3, seed=0))
    """

    #: constructor arguments of a parent class that a subclass fixes (not its own parameters)
    fixed_params: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = vars(cls).get("__init__")
        if init is not None and any(p.kind == p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            init.__signature__ = _forwarded_signature(cls)

    @classmethod
    def _get_param_names(cls) -> list[str]:
        return sorted(name for name in constructor_parameters(cls) if name not in cls.fixed_params)

    def _check_fitted(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _check_fitted")

    def __sklearn_is_fitted__(self) -> bool:
        try:
            self._check_fitted()
        except (ValueError, AttributeError):  # NotFittedError is both
            return False
        return True
