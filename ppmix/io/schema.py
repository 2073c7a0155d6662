"""The saved config: JSON values, the checksum over both files, and the schema checked on load."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import torch

from ppmix._estimator import constructor_parameters
from ppmix.io.registry import lookup_class

FORMAT_NAME = "ppmix-model"
#: version 2: ``config_sha256`` over the whole config (and so over the tensor file); version 1 had only
#: ``tensors_sha256``. Both are read; version 2 is written.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
CONFIG_FILE, TENSOR_FILE = "config.json", "tensors.pt"
_FITTED = (
    "engine_",
    "history_",
    "n_iter_",
    "converged_",
    "lower_bound_",
    "n_features_in_",
    "feature_names_in_",
    "classes_",
)
_CHECKSUM_KEY = "config_sha256"
_CONTENT_KEYS = ("format", "format_version", "ppmix_version", "class", "params", "fitted", "extra", "tensors_sha256")


# ----------------------------------------------------------------------------------- JSON values
def _to_json(value: Any, where: str) -> Any:
    """``value`` as plain JSON types: numpy scalars and arrays, tensors, tuples, dtypes and devices converted.

    Raises ``TypeError`` naming ``where`` for anything JSON cannot hold.
    """
    if value is None or isinstance(value, (bool, np.bool_)):
        return None if value is None else bool(value)
    if isinstance(value, str):
        return str(value)  # np.str_ -> str
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise TypeError(f"cannot save {where}: complex tensors cannot be written to JSON")
        return _to_json(value.detach().cpu().tolist(), where)
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf" and value.dtype != object and value.dtype.kind != "U":
            raise TypeError(f"cannot save {where}: a numpy array of dtype {value.dtype} cannot be written to JSON")
        return _to_json(value.tolist(), where)
    if isinstance(value, (list, tuple)):
        return [_to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, v in value.items():
            if isinstance(key, str):
                name = str(key)
            elif isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
                name = str(int(key))
            else:
                raise TypeError(f"cannot save {where}: its key {key!r} is not a string")
            if name in out:
                raise TypeError(f"cannot save {where}: key {name!r} appears twice")
            out[name] = _to_json(v, f"{where}.{name}")
        return out
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(
        f"cannot save {where}: a {type(value).__module__}.{type(value).__qualname__} cannot be written to JSON "
        "(only None, bool, int, float, str, lists, dicts, numpy scalars/arrays, tensors and dtypes can)"
    )


def _decode_dtype(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"__dtype__"}:
        dtype = getattr(torch, str(value["__dtype__"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {value['__dtype__']!r}")
        return dtype
    return value


def _canonical(content: dict[str, Any]) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()


def config_checksum(config: dict[str, Any]) -> str:
    """The SHA-256 that ``config.json`` records as ``config_sha256``: over the canonical JSON (sorted keys,
    no spaces) of every field but ``config_sha256`` itself. ``tensors_sha256`` is one of those fields, so
    the checksum covers both files.

    Examples
    --------
    >>> a = config_checksum({"format": "ppmix-model", "params": {"b": 1, "a": 2.0}})
    >>> b = config_checksum({"params": {"a": 2.0, "b": 1}, "format": "ppmix-model", "config_sha256": "x"})
    >>> a == b and len(a) == 64
    True
    """
    return hashlib.sha256(_canonical({k: v for k, v in config.items() if k != _CHECKSUM_KEY})).hexdigest()


def _sha256(source: Path | BinaryIO) -> str:
    """SHA-256 of a file, given by path or as a file open for reading (read from its start, left at its end)."""
    if not isinstance(source, (str, os.PathLike)):
        source.seek(0)
        digest = hashlib.sha256()
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
        return digest.hexdigest()
    with open(source, "rb") as fh:
        return _sha256(fh)


# ----------------------------------------------------------------------------------------- schema
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_sha256(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


#: what each fitted attribute may hold: (description, check)
_FITTED_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "engine_": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "history_": (
        "a list of numbers or null",
        lambda v: v is None or (isinstance(v, list) and all(x is None or _is_number(x) for x in v)),
    ),
    "n_iter_": ("a non-negative integer or null", lambda v: v is None or (_is_int(v) and v >= 0)),
    "converged_": ("true, false or null", lambda v: v is None or isinstance(v, bool)),
    "lower_bound_": ("a number or null", lambda v: v is None or _is_number(v)),
    "n_features_in_": ("a non-negative integer or null", lambda v: v is None or (_is_int(v) and v >= 0)),
    "feature_names_in_": (
        "a list of strings or null",
        lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
    ),
    "classes_": (
        "a list of two or more labels (strings, numbers or booleans) or null",
        lambda v: (
            v is None
            or (isinstance(v, list) and len(v) >= 2 and all(isinstance(x, (str, bool)) or _is_number(x) for x in v))
        ),
    ),
}

#: annotation names the schema checks; parameters annotated otherwise (``Any``, a class) take any JSON value
_ANNOTATED_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("int", _is_int),
    "float": ("float", _is_number),
    "bool": ("bool", lambda v: isinstance(v, bool)),
    "str": ("str", lambda v: isinstance(v, str)),
    "None": ("null", lambda v: v is None),
    "torch.dtype": ("a torch dtype", lambda v: isinstance(v, torch.dtype)),
    "torch.device": ("a device string", lambda v: isinstance(v, str)),
}


def _annotation_check(annotation: Any) -> tuple[str, Callable[[Any], bool]] | None:
    """(description, check) for an annotation made only of the simple types above, else ``None``."""
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, type):
        text = "torch.dtype" if annotation is torch.dtype else annotation.__name__
    else:
        text = str(annotation)
    tokens = [t.strip() for t in text.split("|")]
    known = [_ANNOTATED_TYPES.get(t) for t in tokens]
    if not tokens or any(k is None for k in known):
        return None
    checks = [k[1] for k in known if k is not None]
    return " or ".join(k[0] for k in known if k is not None), lambda v: any(c(v) for c in checks)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_params(cls: type, params: Any) -> dict[str, Any]:
    """The constructor arguments ``params`` decoded (dtypes) and checked against ``cls``'s constructor.

    Raises ``ValueError`` naming the field.
    """
    if not isinstance(params, dict):
        raise ValueError(f"field 'params' must be an object, got {type(params).__name__}")
    signature = constructor_parameters(cls)
    fixed = tuple(getattr(cls, "fixed_params", ()) or ())
    allowed = {name: p for name, p in signature.items() if name not in fixed}
    decoded: dict[str, Any] = {}
    for name, value in params.items():
        if name not in allowed:
            raise ValueError(
                f"params.{name} is not a constructor argument of {cls.__name__} "
                f"(its arguments: {', '.join(allowed) or 'none'})"
            )
        try:
            value = _decode_dtype(value)
        except ValueError as err:
            raise ValueError(f"params.{name}: {err}") from None
        check = _annotation_check(allowed[name].annotation)
        if check is not None and not check[1](value):
            raise ValueError(f"params.{name} must be {check[0]}, got {type(value).__name__} {_short(value)}")
        decoded[name] = value
    missing = [n for n, p in allowed.items() if p.default is p.empty and n not in decoded]
    if missing:
        raise ValueError(f"params lacks {', '.join(missing)}, required by {cls.__name__}")
    return decoded


def _check_fitted(fitted: Any) -> dict[str, Any]:
    if not isinstance(fitted, dict):
        raise ValueError(f"field 'fitted' must be an object, got {type(fitted).__name__}")
    for name, value in fitted.items():
        if name not in _FITTED_TYPES:
            raise ValueError(f"fitted.{name} is not a fitted attribute ppmix saves (those are: {', '.join(_FITTED)})")
        what, check = _FITTED_TYPES[name]
        if not check(value):
            raise ValueError(f"fitted.{name} must be {what}, got {type(value).__name__} {_short(value)}")
    return fitted


def _check_content(config: dict[str, Any], version: int) -> tuple[type, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The class, decoded params, fitted and extra of a parsed config (format and version already checked).

    Raises ``ValueError`` naming the field.
    """
    allowed = set(_CONTENT_KEYS) | ({_CHECKSUM_KEY} if version >= 2 or _CHECKSUM_KEY in config else set())
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ValueError(f"field {unknown[0]!r} is not part of a ppmix model config")
    required = [k for k in (*_CONTENT_KEYS, _CHECKSUM_KEY) if k in allowed and not (version == 1 and k == "extra")]
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError(f"field {missing[0]!r} is missing")
    for key in ("ppmix_version", "class"):
        if not isinstance(config[key], str):
            raise ValueError(f"field {key!r} must be a string, got {type(config[key]).__name__}")
    if not _is_sha256(config["tensors_sha256"]):
        raise ValueError("field 'tensors_sha256' must be a SHA-256 hex digest")
    cls = lookup_class(config["class"])
    if cls is None:
        raise ValueError(f"unknown model class {config['class']!r} (field 'class'); import its module first")
    params = _check_params(cls, config["params"])
    fitted = _check_fitted(config["fitted"])
    extra = config.get("extra", {})
    if not isinstance(extra, dict):
        raise ValueError(f"field 'extra' must be an object, got {type(extra).__name__}")
    return cls, params, fitted, extra
