"""Reading data shards where they live: files (Parquet, CSV, NPY, NPZ), arrays and DataFrames, with the
check that every shard has the first shard's feature columns (reordered by name, or refused naming the shard).
A CSV file must end with a line break: one that does not may be cut (a partial write or copy) in its last
row, even in the middle of a number, and is refused naming the file and the line. A shard read again during
a fit must be the one read first (:func:`check_unchanged`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ppmix.parallel import TaskInputError

__all__ = [
    "ShardChangedError",
    "align_columns",
    "check_unchanged",
    "read_features",
    "read_shard",
    "shard_columns",
    "sequence_weights",
    "split_weights_column",
]

logger = logging.getLogger(__name__)

SHARD_SUFFIXES = (".parquet", ".pq", ".csv", ".npz")


class ShardChangedError(TaskInputError):
    """A shard read again during a fit is not the one read first (other rows, or other values)."""


def check_unchanged(
    name: str,
    first: tuple[str, int, int | None] | None,
    read: tuple[str, int, int | None],
    unit: str = "rows",
) -> None:
    """Refuse, naming the shard and what changed, a read of it whose ``(digest, units, feature columns)``
    differ from those of its first read ``first`` (None: this is the first read).

    A fit that reads a shard more than once (a replaced worker, a second round) would otherwise fit on
    two versions of it.

    Examples
    --------
    >>> check_unchanged("a.csv", ("d1", 300, 2), ("d1", 300, 2))
    >>> check_unchanged("a.csv", ("d1", 300, 2), ("d2", 600, 2))
    Traceback (most recent call last):
    ...
    ppmix.distributed.shards.ShardChangedError: shard a.csv changed during the fit and was read again: it now has 600 rows, 300 when first read; ...
    """  # noqa: E501
    if first is None or tuple(first) == tuple(read):
        return
    words = (unit, "feature columns")
    pairs = [(word, then, now) for word, then, now in zip(words, first[1:], read[1:]) if None not in (then, now)]
    changes = [f"{now} {word}, {then} when first read" for word, then, now in pairs if then != now]
    change = f"it now has {' and '.join(changes)}" if changes else (
        f"its content differs from the first read (the same {read[1]} {unit})"
    )  # fmt: skip
    raise ShardChangedError(
        f"shard {name} changed during the fit and was read again: {change}; a fit on two versions of a "
        "shard would be wrong, so rewrite shards only between fits"
    )


def read_shard(shard: Any, target: str = "y") -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """Covariates, response and feature names of one shard.

    ``shard`` is a path to a Parquet/CSV file with a ``target`` column (the other columns
    are the covariates) or an NPZ file with arrays ``X`` and ``target``; an ``(X, y)``
    pair; or a DataFrame with a ``target`` column.

    Parameters
    ----------
    shard : str, path, (X, y) pair or DataFrame
        The shard, as above.
    target : str, default "y"
        The response column (or NPZ array) name.

    Returns
    -------
    X : ndarray of shape (n, D)
    y : ndarray of shape (n,)
    feature_names : list of str or None
        The covariates' column names; None for unnamed data.

    Examples
    --------
    >>> import numpy as np
    >>> X, y, names = read_shard((np.ones((3, 2)), np.zeros(3)))
    >>> X.shape, y.shape, names
    ((3, 2), (3,), None)
    """
    import pandas as pd

    if isinstance(shard, (str, Path)):
        path, suffix = _shard_file(shard, SHARD_SUFFIXES)
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                if "X" not in arrays or target not in arrays:
                    raise ValueError(f"shard {path} must hold arrays 'X' and {target!r}; has {sorted(arrays)}")
                return np.asarray(arrays["X"]), np.asarray(arrays[target]), None
        shard = _read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    if isinstance(shard, pd.DataFrame):
        if target not in shard.columns:
            raise ValueError(f"shard has no target column {target!r}; columns are {list(shard.columns)}")
        features = shard.drop(columns=[target])
        return features.to_numpy(), shard[target].to_numpy(), [str(c) for c in features.columns]
    if isinstance(shard, (tuple, list)) and len(shard) == 2:
        return np.asarray(shard[0]), np.asarray(shard[1]), None
    raise TypeError(
        f"a shard must be a path (Parquet/CSV/NPZ), an (X, y) pair or a DataFrame; got {type(shard).__name__}"
    )


def shard_columns(shard: Any, target: str) -> list[str] | None:
    """The feature column names of a shard without reading its rows (``None`` for unnamed data).

    Parameters
    ----------
    shard : str, path, (X, y) pair or DataFrame
        The shard, as for :func:`read_shard`.
    target : str
        The response column, left out of the names.

    Returns
    -------
    list of str or None

    Examples
    --------
    >>> import pandas as pd
    >>> shard_columns(pd.DataFrame({"a": [1.0], "y": [0.0], "b": [2.0]}), "y")
    ['a', 'b']
    """
    import pandas as pd

    if isinstance(shard, (str, Path)):
        path = Path(shard)
        suffix = path.suffix.lower()
        if not path.is_file() or suffix not in (".csv", ".parquet"):
            return None  # unnamed (NPZ), or an error the worker names
        if suffix == ".csv":
            columns = list(pd.read_csv(path, nrows=0).columns)
        else:
            import pyarrow.parquet as pq

            columns = list(pq.read_schema(path).names)
    elif isinstance(shard, pd.DataFrame):
        columns = list(shard.columns)
    else:
        return None
    return [str(c) for c in columns if str(c) != target]


def align_columns(
    X: np.ndarray, names: list[str] | None, columns: list[str] | None, shard: str
) -> tuple[np.ndarray, list[str] | None]:
    """``X`` with its columns in the order of ``columns`` (the first shard's), or an error naming the shard."""
    if columns is None or names is None or names == columns:
        return X, names
    if len(set(names)) != len(names) or sorted(names) != sorted(columns):
        missing = [c for c in columns if c not in names]
        unexpected = [c for c in names if c not in columns]
        raise ValueError(
            f"its feature columns differ from the first shard's (missing {missing}, not in the first shard "
            f"{unexpected}); expected {columns}"
        )
    logger.info("shard %s: columns reordered by name to match the first shard", shard)
    return np.asarray(X)[:, [names.index(c) for c in columns]], list(columns)


#: file types :func:`read_features` reads
FEATURE_SUFFIXES = (".parquet", ".pq", ".csv", ".npy", ".npz")


def read_features(shard: Any, target: str | None = None) -> tuple[Any, Any]:
    """The data of one shard as ``(X, y)`` for a model's ``prepare_data`` (``y`` is None without a ``target``).

    ``shard`` is a path to a Parquet/CSV file (a DataFrame: every column a feature, or a
    sequence model's ``sequence_column``, or the ``target``), an NPY file (a 2-D array of
    rows), an NPZ file with an array ``X`` (and ``target``; for sequence models also
    ``lengths``: ``X`` and ``target`` hold the sequences one after another), or data already
    in memory: an array, a tensor, a DataFrame or a list of sequences, or an ``(X, y)`` pair
    when there is a ``target``.

    Parameters
    ----------
    shard : str, path, array-like, tensor, DataFrame, list of sequences or (X, y) pair
        The shard, as above.
    target : str, optional
        The response column (file) or array (NPZ) name.

    Returns
    -------
    X : the features, as the model's ``prepare_data`` takes them
    y : the responses, or None

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "part.npz")
    >>> np.savez(path, X=np.arange(10.0).reshape(5, 2), lengths=np.array([2, 3]), y=np.arange(5.0))
    >>> X, y = read_features(path, target="y")
    >>> [s.shape for s in X], [s.tolist() for s in y]
    ([(2, 2), (3, 2)], [[0.0, 1.0], [2.0, 3.0, 4.0]])
    """
    if not isinstance(shard, (str, Path)):
        if target is not None and isinstance(shard, tuple) and len(shard) == 2:
            return shard
        if target is not None and hasattr(shard, "columns"):
            return _split_target(shard, target)
        return shard, None
    path, suffix = _shard_file(shard, FEATURE_SUFFIXES)
    if suffix == ".npy":
        return np.load(path, allow_pickle=False), None
    if suffix == ".npz":
        return _read_npz(path, target)
    import pandas as pd

    frame = _read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    return _split_target(frame, target) if target is not None else (frame, None)


def split_weights_column(shard: Any, x: Any, weight: str) -> tuple[Any, np.ndarray]:
    """``(X less the weight column, the weights)`` of a shard read as ``X`` by :func:`read_features`: the column
    ``weight`` of a DataFrame (a Parquet/CSV file, or in memory), or the array ``weight`` of an NPZ file.

    Examples
    --------
    >>> import pandas as pd
    >>> x, w = split_weights_column(None, pd.DataFrame({"a": [1.0, 2.0], "w": [3.0, 0.0]}), "w")
    >>> list(x.columns), w.tolist()
    (['a'], [3.0, 0.0])
    """
    if hasattr(x, "columns"):
        if weight not in x.columns:
            raise ValueError(f"shard has no weight column {weight!r}; columns are {list(x.columns)}")
        return x.drop(columns=[weight]), x[weight].to_numpy(dtype=np.float64)
    if isinstance(shard, (str, Path)) and Path(shard).suffix.lower() == ".npz":
        with np.load(shard, allow_pickle=False) as arrays:
            if weight not in arrays:
                raise ValueError(f"shard {shard} must hold an array {weight!r}; has {sorted(arrays)}")
            return x, np.asarray(arrays[weight], dtype=np.float64)
    raise ValueError(
        f"weight={weight!r} names a column: the shards must be Parquet/CSV files, DataFrames or NPZ files with "
        f"an array {weight!r}; got {type(shard).__name__ if not isinstance(shard, (str, Path)) else shard}"
    )


def sequence_weights(x: Any, weights: np.ndarray, sequence_column: str | None) -> np.ndarray:
    """One weight per sequence of a sequence model's shard ``x`` (a DataFrame with ``sequence_column``, or the
    list of sequences of an NPZ file), in the order the model prepares them (first appearance): ``weights``
    holds one per sequence already, or one per row, equal within each sequence (else a ``ValueError`` naming
    the sequence).

    Examples
    --------
    >>> import pandas as pd
    >>> frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "seq": ["b", "a", "b"]})
    >>> sequence_weights(frame, np.array([2.0, 5.0, 2.0]), "seq").tolist()
    [2.0, 5.0]
    >>> sequence_weights([np.zeros((2, 1)), np.zeros((1, 1))], np.array([4.0, 0.0]), None).tolist()
    [4.0, 0.0]
    """
    if hasattr(x, "columns"):
        import pandas as pd

        codes, ids = pd.factorize(x[sequence_column], sort=False)
    else:
        if weights.shape == (len(x),):
            return weights
        codes, ids = np.repeat(np.arange(len(x)), [len(s) for s in x]), np.arange(len(x))
    if weights.shape != codes.shape:
        raise ValueError(
            f"the weights must be one per sequence ({len(ids)}) or one per row ({codes.shape[0]}); got shape "
            f"{weights.shape}"
        )
    first = np.full(len(ids), np.nan)
    first[codes[::-1]] = weights[::-1]  # each sequence's first row's weight
    unequal = np.flatnonzero(~np.isclose(weights, first[codes], rtol=0.0, atol=0.0, equal_nan=True))
    if unequal.size:
        sequence = ids[codes[unequal[0]]]
        raise ValueError(
            f"sample weights are one per sequence: the rows of sequence {sequence!r} have different weights "
            f"({first[codes[unequal[0]]]} and {weights[unequal[0]]})"
        )
    return first


def _read_csv(path: Path) -> Any:
    """A CSV file as a DataFrame; refused, naming the file and its last line, if that line has no line break
    (the file may be cut there, even in the middle of a number, and would be read without a sign of it).

    Examples
    --------
    >>> import os, tempfile
    >>> path = Path(tempfile.mkdtemp()) / "cut.csv"
    >>> _ = path.write_text("a,b\\n1.5,2.25\\n3.5,4.")
    >>> _read_csv(path)
    Traceback (most recent call last):
    ...
    ValueError: shard .../cut.csv ends without a line break: its last line (3) may be cut ...
    """
    import pandas as pd

    with open(path, "rb") as file:
        if file.seek(0, os.SEEK_END) > 0:
            file.seek(-1, os.SEEK_END)
            if file.read(1) != b"\n":
                file.seek(0)
                lines = 1 + sum(chunk.count(b"\n") for chunk in iter(lambda: file.read(1 << 20), b""))
                raise ValueError(
                    f"shard {path} ends without a line break: its last line ({lines}) may be cut (a partial "
                    "write or copy); if the file is whole, end it with a line break"
                )
    return pd.read_csv(path)


def _shard_file(shard: str | Path, suffixes: tuple[str, ...]) -> tuple[Path, str]:
    """The shard's path and its (lower-case) suffix, or an error naming it: a type not in ``suffixes``, or no file."""
    path = Path(shard)
    suffix = path.suffix.lower()
    if suffix not in suffixes:
        raise ValueError(f"shard {path} has an unsupported type; use one of {suffixes}")
    if not path.is_file():
        raise FileNotFoundError(f"shard {path} does not exist")
    return path, suffix


def _split_target(frame: Any, target: str) -> tuple[Any, Any]:
    if target not in frame.columns:
        raise ValueError(f"shard has no target column {target!r}; columns are {list(frame.columns)}")
    return frame.drop(columns=[target]), frame[target].to_numpy()


def _read_npz(path: Path, target: str | None) -> tuple[Any, Any]:
    with np.load(path, allow_pickle=False) as arrays:
        for name in ("X", target):
            if name is not None and name not in arrays:
                raise ValueError(f"shard {path} must hold an array {name!r}; has {sorted(arrays)}")
        x = np.asarray(arrays["X"])
        y = None if target is None else np.asarray(arrays[target])
        if "lengths" not in arrays:
            return x, y
        lengths = np.asarray(arrays["lengths"]).astype(np.int64)
    if lengths.ndim != 1 or (lengths < 1).any() or int(lengths.sum()) != x.shape[0]:
        raise ValueError(f"shard {path}: 'lengths' must be positive and sum to the {x.shape[0]} rows of 'X'")
    cuts = np.cumsum(lengths)[:-1]
    return np.split(x, cuts), None if y is None else np.split(y, cuts)
