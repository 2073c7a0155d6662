"""Constructor plumbing shared by every estimator in :mod:`ppmix.models`: keep the arguments, check the seed."""

from __future__ import annotations

from typing import Any

from ppmix._validation import check_seed

__all__ = ["check_seed", "store_params"]


def store_params(obj: Any, arguments: dict[str, Any]) -> None:
    """Keep every constructor argument as an attribute of the same name (scikit-learn style).

    Call it as ``store_params(self, locals())`` first thing in ``__init__`` (after
    ``super().__init__(...)``): the signature stays explicit, so ``get_params`` and
    ``sklearn.base.clone`` can read it, and the assignments live here once.

    Parameters
    ----------
    obj : the estimator being constructed.
    arguments : the constructor's ``locals()``; ``self`` and ``__class__`` are skipped.

    Examples
    --------
    >>> class Model:
    ...     def __init__(self, n_components=2, *, tol=1e-6):
    ...         store_params(self, locals())
    >>> vars(Model(3))
    {'n_components': 3, 'tol': 1e-06}
    """
    for name, value in arguments.items():
        if name not in ("self", "__class__"):
            setattr(obj, name, value)
