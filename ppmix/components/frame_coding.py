"""A DataFrame of mixed types as numbers for :class:`~ppmix.components.columns.Independent`.

The models read a DataFrame through :func:`~ppmix._validation.check_matrix`, which asks the family to code it when
the family can (its ``code_frame``): :func:`code_frame` takes the columns in the family's order (by name, or by
position) and turns each column of ``category``, string or object dtype under the categorical or Bernoulli family
into level codes ``0..C-1`` (missing values, ``NaN``/``None``, stay missing). In ``fit`` it learns the categories
(``learn``): a ``category`` column's in the order of its categories, another's sorted, those that no row holds left
out; a later frame is coded with them, whatever the order of its own categories, and a category not seen in fit
is a ``ValueError`` naming the column and the value. :func:`decode_frame` maps codes back (a model's samples).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ppmix._validation import InvalidDataError

__all__ = ["CODED_FAMILIES", "code_frame", "decode_frame"]

#: the column families whose columns may hold categories (coded to their levels 0..C-1)
CODED_FAMILIES = ("categorical", "bernoulli")

Categories = dict[str, list[Any]]


def code_frame(
    frame: pd.DataFrame, family: Any, categories: Categories | None, *, learn: bool, name: str = "X"
) -> tuple[pd.DataFrame, Categories | None]:
    """``frame`` with its columns in the order of ``family`` (an :class:`~ppmix.components.columns.Independent`)
    and its categorical columns coded by ``categories`` (column label -> categories; extended by those of ``frame``
    when ``learn``); returns the frame and the categories (None where no column holds categories).

    Examples
    --------
    >>> from ppmix.components.columns import Independent
    >>> family = Independent({"n": "poisson", "colour": "categorical"})
    >>> frame = pd.DataFrame({"colour": pd.Categorical(["red", "blue", None]), "n": [1, 2, 3]})
    >>> coded, categories = code_frame(frame, family, None, learn=True)
    >>> coded.to_numpy().tolist(), categories
    ([[1.0, 1.0], [2.0, 0.0], [3.0, nan]], {'colour': ['blue', 'red']})
    >>> code_frame(pd.DataFrame({"n": [0], "colour": ["green"]}), family, categories, learn=False)
    Traceback (most recent call last):
    ...
    ppmix._validation.InvalidDataError: column 'colour' of X holds the category 'green', which it did not hold in \
fit (its categories: ['blue', 'red']): a model has no probability for a new category; map it to a known one or \
refit with it
    """
    frame = _in_family_order(frame, family, name)
    categories = {label: list(values) for label, values in (categories or {}).items()}
    coded = frame.copy()
    for j, column_family in enumerate(family.families):
        series, label = frame.iloc[:, j], str(frame.columns[j])
        if pd.api.types.is_numeric_dtype(series.dtype):
            continue
        if column_family.name not in CODED_FAMILIES:
            coded.isetitem(j, _numbers(series, label, column_family.name, name))
            continue
        if learn:
            categories[label] = _extended(categories.get(label, []), series)
        elif label not in categories:
            raise InvalidDataError(
                f"column {label!r} of {name} holds categories ({series.dtype}), but the model was fitted on level "
                "codes for it: give it the codes it was fitted on, or refit on categories"
            )
        coded.isetitem(j, _codes(series, categories[label], label, name))
    return coded, categories or None


def _in_family_order(frame: pd.DataFrame, family: Any, name: str) -> pd.DataFrame:
    """``frame``'s columns in ``family``'s order (by name), or checked against its number of columns (by
    position)."""
    if family.names is None:
        if frame.shape[1] != len(family.families):
            raise InvalidDataError(
                f"{name} has {frame.shape[1]} columns, but the independent family names {len(family.families)}"
            )
        return frame
    labels = [str(column) for column in frame.columns]
    missing = [column for column in family.names if column not in labels]
    unnamed = [column for column in labels if column not in family.names]
    if missing or unnamed or len(set(labels)) != len(labels):
        detail = "; ".join(
            part
            for part in (
                f"missing {missing}" if missing else "",
                f"not named by the family {unnamed} (select the columns: {name}[{list(family.names)}])"
                if unnamed
                else "",
            )
            if part
        )
        raise InvalidDataError(
            f"{name} must have the columns the independent family names, {list(family.names)}: "
            f"{detail or 'duplicated names'}"
        )
    return frame.iloc[:, [labels.index(column) for column in family.names]]


def _numbers(series: pd.Series, label: str, family: str, name: str) -> pd.Series:
    """A non-numeric column under a family of numbers as numbers (a ``category`` column of numbers), else a
    ``TypeError`` naming the column and the remedy."""
    try:
        return series.astype(np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            f"column {label!r} of {name} holds {series.dtype} values, but its family is {family!r}, which takes "
            f"numbers: give it the family 'categorical' (or 'bernoulli' for two categories), or numbers"
        ) from None


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python one (categories are saved as JSON)."""
    return value.item() if isinstance(value, np.generic) else value


def _extended(known: list[Any], series: pd.Series) -> list[Any]:
    """``known`` categories followed by the new ones ``series`` holds: a ``category`` column's in its categories'
    order, another's sorted (in order of appearance where they do not sort)."""
    present = pd.unique(series.dropna().astype(object))
    if isinstance(series.dtype, pd.CategoricalDtype):
        held = set(present)
        ordered = [value for value in series.cat.categories if value in held]
    else:
        try:
            ordered = sorted(present)
        except TypeError:
            ordered = list(present)
    seen = set(known)
    return known + [_plain(value) for value in ordered if value not in seen]


def _codes(series: pd.Series, categories: list[Any], label: str, name: str) -> np.ndarray:
    """Each entry's position among ``categories`` (NaN where missing); a category not among them is an
    :class:`~ppmix._validation.InvalidDataError` naming the column and the value."""
    missing = series.isna().to_numpy()
    values = series.astype(object).to_numpy()
    positions = pd.Index(categories, dtype=object).get_indexer(values)
    unseen = (positions < 0) & ~missing
    if unseen.any():
        raise InvalidDataError(
            f"column {label!r} of {name} holds the category {values[unseen][0]!r}, which it did not hold in fit (its "
            f"categories: {categories}): a model has no probability for a new category; map it to a known one or "
            "refit with it"
        )
    codes = positions.astype(np.float64)
    codes[missing] = np.nan
    return codes


def decode_frame(model: Any, X: Any) -> pd.DataFrame:
    """Rows of codes ``X`` ``(N, D)`` as a DataFrame with the fitted model's column names and each coded column's
    categories in place of its codes. ``X`` may be a model's ``sample(...)`` (its ``"x"``; an HMM's sequences
    ``(n, T, D)`` become their ``n T`` rows, sequence by sequence).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> model = SimpleNamespace(feature_names_in_=["n", "colour"], categories_={"colour": ["blue", "red"]})
    >>> decode_frame(model, np.array([[3.0, 1.0], [0.0, 0.0]])).to_dict("list")
    {'n': [3.0, 0.0], 'colour': ['red', 'blue']}
    """
    X = X["x"] if isinstance(X, dict) else X
    values = np.asarray(X.detach().cpu() if hasattr(X, "detach") else X, dtype=np.float64)
    values = values.reshape(-1, values.shape[-1])
    names = getattr(model, "feature_names_in_", None) or [str(j) for j in range(values.shape[1])]
    frame = pd.DataFrame(values, columns=list(names))
    for label, categories in (getattr(model, "categories_", None) or {}).items():
        codes = frame[label].to_numpy()
        levels = np.asarray(categories, dtype=object)
        frame[label] = np.where(np.isnan(codes), None, levels[np.nan_to_num(codes).astype(int)])
    return frame
