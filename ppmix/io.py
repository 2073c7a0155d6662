"""Saving and loading fitted models: tensors plus a JSON config, loaded safely.

A saved model is a directory with ``config.json`` (format version, class,
constructor arguments, fitted attributes and the SHA-256 of the tensor file) and
``tensors.pt`` (read with ``torch.load(weights_only=True)``, which never unpickles
arbitrary objects).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["FORMAT_VERSION", "load_model", "lookup_class", "qualified_name", "register_savable", "save_model"]

FORMAT_NAME = "ppmix-model"
FORMAT_VERSION = 1
CONFIG_FILE, TENSOR_FILE = "config.json", "tensors.pt"
_FITTED = ("engine_", "history_", "n_iter_", "converged_", "lower_bound_", "n_features_in_", "feature_names_in_")


#: every class that saved files may name: the mixture models (registered by ``MixtureModel``'s
#: subclass hook) and the optimizers (PRESTO, RegularizedWeighting), one registry for all
_REGISTRY: dict[str, type] = {}


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

    Subclasses of ``MixtureModel`` are registered automatically; other estimators must
    offer what :func:`save_model` and :func:`load_model` call on a model:
    ``qualified_name()``, ``get_params()`` (JSON-able), ``_check_fitted()``,
    ``state_tensors()``/``load_state_tensors()`` and ``extra_state()``/``load_extra_state()``.

    Examples
    --------
    >>> from ppmix.inference import PRESTO
    >>> lookup_class(PRESTO.qualified_name()) is PRESTO
    True
    """
    _REGISTRY[qualified_name(cls)] = cls
    return cls


def lookup_class(name: str) -> type | None:
    """The registered class called ``name``: its qualified name, or a bare class name if unambiguous
    (so files saved before a class moved to another module still load).

    Examples
    --------
    >>> from ppmix import GMM
    >>> lookup_class("ppmix.models.gmm.GMM") is GMM and lookup_class("GMM") is GMM
    True
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    matches = {c for c in _REGISTRY.values() if c.__name__ == name.rsplit(".", 1)[-1]}
    return matches.pop() if len(matches) == 1 else None


def _encode(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return str(value)
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"__dtype__"}:
        dtype = getattr(torch, value["__dtype__"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {value['__dtype__']!r} in saved config")
        return dtype
    return value


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_model(model: "MixtureModel", path: str | Path) -> Path:
    """Write a fitted ``model`` to the directory ``path`` (created if needed).

    Examples
    --------
    >>> import tempfile, torch
    >>> from ppmix import GMM
    >>> gmm = GMM(2, seed=0, progress=False).fit(torch.randn(50, 2))
    >>> d = save_model(gmm, tempfile.mkdtemp())
    >>> sorted(p.name for p in d.iterdir())
    ['config.json', 'tensors.pt']
    """
    from ppmix._version import __version__

    model._check_fitted()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {f"state.{k}": v.detach().cpu().contiguous() for k, v in model.state_tensors().items()}
    for name, value in (getattr(model, "mcmc_samples_", None) or {}).items():
        tensors[f"mcmc.{name}"] = value.detach().cpu().contiguous()
    torch.save(tensors, path / TENSOR_FILE)
    config = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "ppmix_version": __version__,
        "class": type(model).qualified_name(),
        "params": {k: _encode(v) for k, v in model.get_params().items()},
        "fitted": {k: getattr(model, k, None) for k in _FITTED},
        "extra": model.extra_state(),
        "tensors_sha256": _sha256(path / TENSOR_FILE),
    }
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return path


def load_model(
    path: str | Path, expected: type | None = None, map_location: str | torch.device | None = None
) -> "MixtureModel":
    """Load a model written by :func:`save_model`.

    Raises
    ------
    FileNotFoundError
        If ``path`` lacks the config or tensor file.
    ValueError
        If the config is corrupt, from another format version, of an unknown or
        unexpected class, or the tensor file does not match its recorded checksum.
    """
    path = Path(path)
    config_path, tensor_path = path / CONFIG_FILE, path / TENSOR_FILE
    for p in (config_path, tensor_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found: path must be a directory written by save()")
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{config_path} is not valid JSON (corrupt or truncated): {err}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT_NAME:
        raise ValueError(f"{config_path} is not a ppmix model file")
    if config.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path} was written in ppmix model format version {config.get('format_version')!r} "
            f"(ppmix {config.get('ppmix_version')}); this ppmix reads version {FORMAT_VERSION} only"
        )
    if _sha256(tensor_path) != config.get("tensors_sha256"):
        raise ValueError(
            f"{tensor_path} does not match the checksum in {CONFIG_FILE}: the file is corrupt or was modified"
        )
    cls = lookup_class(str(config.get("class", "")))
    if cls is None:
        raise ValueError(f"unknown model class {config.get('class')!r} in {config_path}; import its module first")
    if expected is not None and not issubclass(cls, expected):
        raise ValueError(f"{path} holds a {cls.__name__}, not a {expected.__name__}")
    try:
        tensors = torch.load(tensor_path, map_location=map_location or "cpu", weights_only=True)
    except Exception as err:  # torch raises several types for damaged archives
        raise ValueError(f"{tensor_path} could not be read safely: {err}") from None
    params = {k: _decode(v) for k, v in config["params"].items()}
    if map_location is not None:
        params["device"] = str(map_location)
    model = cls(**params)
    for name, value in config["fitted"].items():
        setattr(model, name, value)
    model.load_extra_state(config.get("extra", {}))
    try:
        model.load_state_tensors({k.removeprefix("state."): v for k, v in tensors.items() if k.startswith("state.")})
    except (KeyError, ValueError, RuntimeError) as err:
        raise ValueError(f"{tensor_path} does not hold a valid {cls.__name__} state: {err}") from None
    mcmc = {k.removeprefix("mcmc."): v for k, v in tensors.items() if k.startswith("mcmc.")}
    if mcmc:
        model.mcmc_samples_ = mcmc
    return model
