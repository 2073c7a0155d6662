"""Constructor plumbing shared by every estimator in :mod:`ppmix.models`: keep the arguments, check the seed."""

from __future__ import annotations

import numbers
from typing import Any

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


def check_seed(seed: Any, name: str = "seed") -> int | None:
    """Validate a seed: ``None`` or an integer (``bool`` and non-integral numbers are refused).

    Raises
    ------
    TypeError
        If ``seed`` is neither None nor an integer.

    Examples
    --------
    >>> check_seed(3), check_seed(None)
    (3, None)
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be an integer or None; got {seed!r} ({type(seed).__name__})")
    return int(seed)
