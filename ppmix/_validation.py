"""Input checking shared by every estimator: clear errors that name the argument."""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from typing import Any, Callable

import numpy as np
import torch
from sklearn.exceptions import DataConversionWarning
from sklearn.exceptions import NotFittedError as SklearnNotFittedError

__all__ = [
    "InvalidDataError",
    "NotFittedError",
    "as_numpy",
    "check_float",
    "check_matrix",
    "check_n_components",
    "check_options",
    "check_positive_int",
    "check_seed",
    "resolve_device",
    "to_output",
    "torch_ready",
]


class NotFittedError(SklearnNotFittedError):
    """Raised when a model is used for prediction before ``fit`` (scikit-learn's ``NotFittedError``,
    itself a ``ValueError`` and an ``AttributeError``)."""


class InvalidDataError(ValueError):
    """Data that cannot be fitted or scored as given (shape, NaN, too few rows, columns, scale).

    A :class:`ValueError` whose message names the argument; the command line reports it as
    a mistake in the input file (exit code 2), any other error of a fit as an internal one.
    """


def check_options(function: Any, options: dict[str, Any], call: str, skip: int = 2) -> None:
    """A ``TypeError`` naming the first of ``options`` that ``function`` does not take as a keyword (after its first
    ``skip`` parameters, which the caller passes itself) and those it does, as ``call`` was given them; nothing for a
    function that takes any keyword.

    Examples
    --------
    >>> def run(model, data, *, num_samples=10, relabel=True): ...
    >>> check_options(run, {"num_samples": 5}, "fit(engine='gibbs')")
    >>> check_options(run, {"thin": 2}, "fit(engine='gibbs')")
    Traceback (most recent call last):
    ...
    TypeError: fit(engine='gibbs') got an unknown option 'thin'; accepted: num_samples, relabel
    """
    parameters = list(inspect.signature(function).parameters.values())[skip:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [name for name in options if name not in accepted]
    if unknown:
        raise TypeError(f"{call} got an unknown option {unknown[0]!r}; accepted: {', '.join(accepted)}")


def resolve_device(device: Any, name: str = "device") -> torch.device:
    """The :class:`torch.device` of ``device``; ``None`` means CPU.

    Strings, integers and devices are passed to :class:`torch.device`. A CUDA device is
    checked here, so that asking for one without a usable GPU fails at once with a
    clear message naming the argument, instead of deep inside the first CUDA operation.

    Raises
    ------
    TypeError
        If ``device`` is not ``None``, a string, an integer or a ``torch.device``.
    ValueError
        If ``device`` names no device type, asks for CUDA while
        ``torch.cuda.is_available()`` is false, or asks for a CUDA index that does not exist.

    Examples
    --------
    >>> resolve_device(None), resolve_device("cpu")
    (device(type='cpu'), device(type='cpu'))
    >>> resolve_device("gpu")
    Traceback (most recent call last):
    ...
    ValueError: device must be a torch.device or a device string such as 'cpu' or 'cuda:0'; got 'gpu'
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"{name} must be None, a string, an integer or a torch.device; got {type(device).__name__}")
    if not isinstance(device, int) and str(device).split(":")[0] == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"{name}={str(device)!r} asks for CUDA, but torch.cuda.is_available() is False: "
            f"no usable GPU, or a CPU-only build of PyTorch {torch.__version__}; use {name}='cpu'"
        )
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0'; got {device!r}"
        ) from None
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ValueError(
            f"{name}={str(resolved)!r} asks for CUDA device {resolved.index}, "
            f"but only {torch.cuda.device_count()} are visible"
        )
    return resolved


def as_numpy(x: Any) -> np.ndarray:
    """``x`` as a numpy array; tensors on any device are detached and copied to the CPU first.

    The array may share memory with a CPU tensor ``x``: copy it before writing to it.

    Examples
    --------
    >>> as_numpy(torch.tensor([1, 2])), as_numpy([0.5])
    (array([1, 2]), array([0.5]))
    """
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def check_matrix(
    x: Any,
    name: str = "X",
    *,
    dtype: torch.dtype = torch.float64,
    device: Any = None,
    n_features: int | None = None,
    feature_names: list[str] | None = None,
    allow_missing: bool = False,
    allow_empty_rows: bool = False,
    code_frame: Callable[[Any, str], Any] | None = None,
) -> tuple[torch.Tensor, list[str] | None]:
    """Validate a 2-D numeric data matrix and return it as a tensor plus column names.

    ``allow_missing``: NaN entries are kept (missing values; infinities are still refused), but a row
    with every entry missing is refused, naming it, unless ``allow_empty_rows`` (an HMM's time step with every
    value missing: its emission density is 1, the chain carries the step).

    Accepts numpy arrays, torch tensors, pandas DataFrames and nested lists.

    ``feature_names`` are the column names seen in ``fit``: a DataFrame whose columns are
    the same names in another order is reordered to match (the names returned are then
    ``feature_names``); a DataFrame with other names is refused, naming the columns that
    differ. Inputs without names are taken in the fitted order.

    ``code_frame``: what a DataFrame becomes before it is read as numbers, ``code_frame(frame, name)`` (after the
    reordering): a family that codes its columns (:class:`~ppmix.components.Independent`'s categories) passes it.

    Raises
    ------
    TypeError
        If ``x`` is not numeric (strings, objects, booleans, dates, times or durations).
    ValueError
        If ``x`` is not 2-D, is empty, holds NaN/inf, has the wrong number of columns, or
        column names other than ``feature_names``.

    Examples
    --------
    >>> t, names = check_matrix([[1.0, 2.0], [3.0, 4.0]])
    >>> tuple(t.shape), names
    ((2, 2), None)
    >>> import pandas as pd
    >>> t, names = check_matrix(pd.DataFrame({"b": [2.0], "a": [1.0]}), feature_names=["a", "b"])
    >>> t.tolist(), names
    ([[1.0, 2.0]], ['a', 'b'])
    """
    names = None
    if hasattr(x, "columns") and hasattr(x, "to_numpy"):  # pandas DataFrame
        names = [str(c) for c in x.columns]
        if feature_names is not None and names != list(feature_names):
            x, names = _reorder_columns(x, names, list(feature_names), name)
        if code_frame is not None:
            x = code_frame(x, name)
            names = [str(c) for c in x.columns]
        _check_no_time_columns(x, name)
        try:
            x = x.to_numpy(dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must hold numbers only; a DataFrame column is not numeric ({err})") from None
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex() or not (x.is_floating_point() or x.dtype in _INT_DTYPES):
            raise TypeError(f"{name} must be a real numeric tensor; got dtype {x.dtype}")
        device = resolve_device(device) if device is not None else x.device
        source = x
        tensor = x.detach().to(device=device, dtype=dtype).contiguous()
    elif hasattr(x, "tocsr"):  # scipy.sparse matrix or array
        raise TypeError(f"{name} is a sparse {type(x).__name__}; sparse input is not supported: pass {name}.toarray()")
    else:
        array = source = torch_ready(_numeric_array(x, name), name)
        tensor = torch.as_tensor(array, dtype=dtype, device=resolve_device(device))
    if tensor.dim() != 2:
        hint = f". Reshape your data with {name}.reshape(-1, 1) if it has a single feature" if tensor.dim() == 1 else ""
        raise InvalidDataError(f"{name} must be 2-D (n_samples, n_features); got {tensor.dim()}-D{hint}")
    if tensor.shape[0] == 0 or tensor.shape[1] == 0:
        what = "sample" if tensor.shape[0] == 0 else "feature"
        raise InvalidDataError(
            f"{name} is empty: 0 {what}(s) (shape={tuple(tensor.shape)}) while a minimum of 1 is required."
        )
    if allow_missing and not allow_empty_rows:
        _check_missing_rows(tensor, name)
    if bool(torch.isinf(tensor).any()) if allow_missing else not all_finite(tensor):
        raise InvalidDataError(_non_finite_message(tensor, source, name, names, allow_missing))
    if n_features is not None and tensor.shape[1] != n_features:
        raise InvalidDataError(
            f"{name} has {tensor.shape[1]} features, but it is expecting {n_features} features as input: "
            f"the model was fitted with {n_features}"
        )
    return tensor, names


def _check_missing_rows(tensor: torch.Tensor, name: str) -> None:
    """A row of ``tensor`` whose every entry is missing (NaN) is an error naming the row."""
    empty = torch.isnan(tensor).all(dim=1)
    if bool(empty.any()):
        row = int(torch.nonzero(empty)[0])
        raise InvalidDataError(f"{name} row {row} has every entry missing (NaN): a row needs one observed entry")


def _non_finite_message(
    tensor: torch.Tensor, source: Any, name: str, names: list[str] | None, allow_missing: bool = False
) -> str:
    """Why ``tensor`` (``source`` converted) is not finite, naming its first such entry: NaN or infinite in
    ``source``, or finite there but beyond the range of ``tensor``'s dtype (NaN passes where
    ``allow_missing``)."""
    bad = torch.isinf(tensor) if allow_missing else ~torch.isfinite(tensor)
    row, col = (int(i) for i in torch.nonzero(bad)[0])
    where = f"row {row}, column {names[col]!r}" if names else f"row {row}, column {col}"
    value = float(source[row, col])
    if math.isfinite(value):
        return (
            f"{name} holds values that overflow {tensor.dtype} (first at {where}: {value:.3g}; the largest "
            f"{tensor.dtype} number is {torch.finfo(tensor.dtype).max:.3g}): rescale {name} or use a wider dtype"
        )
    return f"{name} contains NaN or infinite values (first at {where}: {value})"


def _check_no_time_columns(frame: Any, name: str) -> None:
    """A date, time or duration column is refused (pandas would turn it into nanoseconds since 1970)."""
    timed = [str(c) for c, dtype in frame.dtypes.items() if getattr(dtype, "kind", "") in "mM"]
    if timed:
        raise TypeError(
            f"{name} has date/time or duration columns {timed}: ppmix fits numbers only, and will not read them as "
            "nanoseconds since 1970; drop them, or derive numeric features from them first"
        )


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every entry of ``tensor`` is finite.

    A NaN or an infinity anywhere makes the sum non-finite, so a finite sum (one fast
    reduction) settles it; only a sum that overflows, or non-finite data, need the
    entry-by-entry check.

    Examples
    --------
    >>> all_finite(torch.tensor([1.0, 2.0])), all_finite(torch.tensor([1.0, float("nan")]))
    (True, False)
    >>> all_finite(torch.tensor([3e38, 3e38]))  # the sum overflows float32, the entries are finite
    True
    """
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor.sum())):
        return True
    return bool(torch.isfinite(tensor).all())


def torch_ready(array: np.ndarray, name: str = "X") -> np.ndarray:
    """``array`` in a form :func:`torch.as_tensor` takes: C-contiguous, writeable, of a dtype torch knows.

    Any memory layout is accepted (negative strides such as ``X[::-1]`` or ``np.flip(X)``,
    Fortran order, strided slices, read-only arrays such as pandas copy-on-write views): such
    an array is copied once, a C-contiguous writeable one is returned as is. Floats wider
    than float64 (``np.longdouble``) become float64, which must hold their values.

    Raises
    ------
    InvalidDataError
        If a ``np.longdouble`` value is finite but beyond float64's range.

    Examples
    --------
    >>> reversed_rows = np.arange(6.0).reshape(3, 2)[::-1]
    >>> torch.as_tensor(torch_ready(reversed_rows)).tolist()
    [[4.0, 5.0], [2.0, 3.0], [0.0, 1.0]]
    """
    if array.dtype.kind == "f" and array.dtype.itemsize > 8:
        wide = array
        with np.errstate(over="ignore"):
            array = wide.astype(np.float64)
        overflow = np.isinf(array) & np.isfinite(wide)
        if overflow.any():
            raise InvalidDataError(
                f"{name} holds long double ({wide.dtype}) values beyond float64's range "
                f"(e.g. {str(wide[overflow][0])}); ppmix computes in float64 at most: rescale it"
            )
    return np.require(array, requirements=["C_CONTIGUOUS", "WRITEABLE"])


def _numeric_array(x: Any, name: str) -> np.ndarray:
    """``x`` as a real numeric numpy array; an object array of numbers is converted (as scikit-learn does)."""
    array = np.asarray(x)
    if array.dtype.kind == "c":
        raise InvalidDataError(f"{name} must be real: Complex data not supported")
    if array.dtype == object:
        try:
            return array.astype(np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must hold numbers only ({err})") from None
    if array.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be a real numeric array; got dtype {array.dtype}")
    return array


def _reorder_columns(frame: Any, names: list[str], expected: list[str], name: str) -> tuple[Any, list[str]]:
    """``frame`` with its columns in the order of ``expected``, or an :class:`InvalidDataError` naming the
    differences."""
    if len(set(names)) == len(names) and sorted(names) == sorted(expected):
        frame = frame.copy()
        frame.columns = names
        return frame[expected], expected
    missing = [c for c in expected if c not in names]
    unexpected = [c for c in names if c not in expected]
    detail = "; ".join(
        part
        for part in (f"missing {missing}" if missing else "", f"not seen in fit {unexpected}" if unexpected else "")
        if part
    )
    raise InvalidDataError(
        f"{name} has different column names from those seen in fit ({detail or 'duplicated names'}); "
        f"expected {expected}"
    )


_INT_DTYPES = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}


def check_positive_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` >= 1, else a ``TypeError``/``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1; got {value}")
    return int(value)


#: seeds are integers in [0, MAX_SEED]: torch's generators take up to 2**64 - 1, and restart r adds r
MAX_SEED = 2**63 - 1


def check_seed(seed: Any, name: str = "seed") -> int | None:
    """Validate a seed: ``None`` or an integer in ``[0, 2**63 - 1]`` (``bool`` and non-integral numbers refused).

    Raises
    ------
    TypeError
        If ``seed`` is neither None nor an integer.
    ValueError
        If ``seed`` is negative or above ``2**63 - 1`` (restart ``r`` draws from ``seed + r``).

    Examples
    --------
    >>> check_seed(3), check_seed(None)
    (3, None)
    >>> check_seed(2**64)
    Traceback (most recent call last):
    ...
    ValueError: seed must be in [0, 2**63 - 1]; got 18446744073709551616
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be an integer or None; got {seed!r} ({type(seed).__name__})")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{name} must be in [0, 2**63 - 1]; got {int(seed)}")
    return int(seed)


def check_float(value: Any, name: str, *, positive: bool) -> float:
    """``value`` as a finite ``float`` (``> 0`` if ``positive``, else ``>= 0``); else an error naming it.

    Examples
    --------
    >>> check_float(2, "tol", positive=False)
    2.0
    >>> check_float(0.0, "lr", positive=True)
    Traceback (most recent call last):
    ...
    ValueError: lr must be positive and finite; got 0.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number; got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'positive' if positive else 'non-negative'} and finite; got {value}")
    return value


def check_n_components(n_components: Any, n_samples: int) -> int:
    """``n_components`` must be an integer in ``[1, n_samples]``."""
    k = check_positive_int(n_components, "n_components")
    if k > n_samples:
        raise InvalidDataError(
            f"n_components={k} is larger than the number of samples ({n_samples}): n_samples={n_samples}"
        )
    return k


def ravel_column_vector(values: np.ndarray, name: str = "y") -> np.ndarray:
    """A ``(n, 1)`` column as ``(n,)``, with scikit-learn's ``DataConversionWarning``; anything else unchanged.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     ravel_column_vector(np.zeros((3, 1))).shape
    (3,)
    """
    if values.ndim == 2 and values.shape[1] == 1:
        warnings.warn(
            DataConversionWarning(f"A column-vector {name} was passed when a 1d array was expected; it is raveled"),
            stacklevel=3,
        )
        return values[:, 0]
    return values


def to_output(result: torch.Tensor, like: Any) -> Any:
    """Return ``result`` as a tensor if the user's input was a tensor, else as numpy."""
    if isinstance(like, torch.Tensor):
        return result
    return as_numpy(result)
