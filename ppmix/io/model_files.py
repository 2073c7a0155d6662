"""save_model / load_model and the Savable base class built on them."""

from __future__ import annotations

import errno
import json
import logging
import os
from abc import ABCMeta
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import torch

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel
from ppmix._estimator import Estimator, constructor_parameters
from ppmix.io.atomic import _clean_up, _fsync_dir, _install, _temp_name, check_save_target
from ppmix.io.registry import qualified_name, register_savable
from ppmix.io.schema import (
    _CHECKSUM_KEY,
    _FITTED,
    CONFIG_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    READABLE_VERSIONS,
    TENSOR_FILE,
    _check_content,
    _check_fitted,
    _check_params,
    _is_int,
    _is_sha256,
    _sha256,
    _to_json,
    config_checksum,
)
from ppmix.io.snapshot import SavedFiles, open_saved
from ppmix.io.state_check import check_draws, check_state

logger = logging.getLogger(__name__)

#: the tensor file's prefixes and entry for a sampler's output (besides the fitted state, ``state.``): the draws,
#: NUTS's statistics of every draw, the Gibbs engine's log joint of every draw
_DRAWS, _STATS, _GIBBS_LOG_JOINT = "mcmc.", "stats.", "gibbs.log_joint"


def save_model(model: "MixtureModel", path: str | Path) -> Path:
    """Write a fitted ``model`` to the directory ``path``, atomically.

    Both files are written into a temporary sibling directory which then replaces ``path``
    (see the module documentation): a save that fails at any step leaves what was at ``path``
    (a previous model) intact and no temporary directory behind. Numpy scalars and arrays
    in the constructor arguments and fitted state are written as plain JSON numbers and lists.

    Parameters
    ----------
    model : Savable
        A fitted model or estimator.
    path : str or Path
        A new directory, an empty one, or one holding a previous ppmix save (replaced).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    FileExistsError
        If ``path`` is a file or a directory holding other files (see :func:`check_save_target`).
    TypeError
        If a constructor argument or fitted value cannot be written to JSON (the field is named).
    ValueError
        If the model is not fitted, or its constructor arguments would not load back.

    Examples
    --------
    >>> import tempfile, torch
    >>> from ppmix import GMM
    >>> gmm = GMM(2, seed=0, progress=False).fit(torch.randn(50, 2, generator=torch.Generator().manual_seed(0)))
    >>> d = save_model(gmm, tempfile.mkdtemp())
    >>> sorted(p.name for p in d.iterdir())
    ['config.json', 'tensors.pt']
    >>> save_model(gmm, d) == d  # replaces the previous save
    True
    """
    from ppmix._version import __version__

    model._check_fitted()
    given = Path(path)
    target = check_save_target(given)
    cls = type(model)
    config: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "ppmix_version": __version__,
        "class": qualified_name(cls),
        "params": _to_json(model._saved_params(), "params"),
        "fitted": {k: _to_json(getattr(model, k, None), f"fitted.{k}") for k in _FITTED},
        "extra": _to_json(model._extra_state(), "extra"),
    }
    tensors = {f"state.{k}": v.detach().cpu().contiguous() for k, v in model._state_tensors().items()}
    tensors.update(_sampler_tensors(model))
    # what is written must load back: refuse now rather than leave an unloadable file
    try:
        _check_params(cls, config["params"])
        _check_fitted(config["fitted"])
        check_draws(_entries(tensors, _DRAWS), _per_draw(tensors), target / TENSOR_FILE)
    except ValueError as err:
        raise ValueError(f"cannot save this {cls.__name__}: {err}") from None

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp, new = None, None
    try:
        for _ in range(100):  # the name is assigned before the directory exists: a Ctrl-C at any point is cleaned up
            tmp = _temp_name(target)
            try:
                os.mkdir(tmp, 0o700)
                break
            except FileExistsError:  # not ours: never discarded
                tmp = None
        if tmp is None:
            raise FileExistsError(errno.EEXIST, "no free temporary name beside the target", os.fspath(target))
        new = os.stat(tmp)
        with open(tmp / TENSOR_FILE, "wb") as fh:
            torch.save(tensors, fh)
            fh.flush()
            os.fsync(fh.fileno())
        config["tensors_sha256"] = _sha256(tmp / TENSOR_FILE)
        config[_CHECKSUM_KEY] = config_checksum(config)
        text = json.dumps(config, indent=2, allow_nan=True)
        with open(tmp / CONFIG_FILE, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        _install(tmp, target)
        try:  # the new save is in place: a failure to make the rename durable is reported, not raised
            _fsync_dir(target.parent)
        except OSError as err:
            logger.warning("saved %s, but syncing its parent directory failed: %s", target, err)
    finally:  # the new files after a failure (or Ctrl-C); the previous save after a swap
        if tmp is not None:
            _clean_up(tmp, target, new)
    return given


def _sampler_tensors(model: "MixtureModel") -> dict[str, torch.Tensor]:
    """The tensor file's entries of a sampler's output: the draws of MCMC or Gibbs (``mcmc_samples_``, as
    ``mcmc.<site>``) and the statistics of every draw that the sampler of the last fit recorded: NUTS's
    (``mcmc_sample_stats_``, numpy arrays, as ``stats.<name>``) after ``engine="mcmc"``, the Gibbs engine's log
    joint (``gibbs_log_joint_``, as ``gibbs.log_joint``) after ``engine="gibbs"`` (an earlier sampler's are
    stale: they describe other draws)."""
    out = {
        f"{_DRAWS}{k}": v.detach().cpu().contiguous() for k, v in (getattr(model, "mcmc_samples_", None) or {}).items()
    }
    engine = getattr(model, "engine_", None)
    if engine == "mcmc":
        for name, value in (getattr(model, "mcmc_sample_stats_", None) or {}).items():
            out[f"{_STATS}{name}"] = torch.from_numpy(np.ascontiguousarray(value))
    log_joint = getattr(model, "gibbs_log_joint_", None)
    if engine == "gibbs" and log_joint is not None:
        out[_GIBBS_LOG_JOINT] = log_joint.detach().cpu().contiguous()
    return out


def _entries(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}


def _per_draw(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-draw statistics of the tensor file, named as a refusal names them (the Gibbs log joint as
    ``gibbs log joint``)."""
    stats = _entries(tensors, _STATS)
    if _GIBBS_LOG_JOINT in tensors:
        stats["gibbs log joint"] = tensors[_GIBBS_LOG_JOINT]
    return stats


# ----------------------------------------------------------------------------------------- loading
def _parse_config(config_path: Path, data: bytes) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"key {key!r} appears twice")
            out[key] = value
        return out

    try:
        config = json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{config_path} is not valid JSON (corrupt or truncated): {err}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT_NAME:
        raise ValueError(f"{config_path} is not a ppmix model file")
    version = config.get("format_version")
    if not _is_int(version) or version not in READABLE_VERSIONS:
        raise ValueError(
            f"{config_path} was written in ppmix model format version {version!r} "
            f"(ppmix {config.get('ppmix_version')}); this ppmix reads format versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    return config


def _read_tensors(tensor_path: Path, source: BinaryIO, map_location: Any) -> dict[str, torch.Tensor]:
    try:
        source.seek(0)
        tensors = torch.load(source, map_location=map_location or "cpu", weights_only=True)
    except Exception as err:  # torch raises several types for damaged archives
        raise ValueError(f"{tensor_path} could not be read safely: {err}") from None
    if not isinstance(tensors, dict):
        raise ValueError(f"{tensor_path} must hold a dict of tensors, not a {type(tensors).__name__}")
    for key, value in tensors.items():
        if not isinstance(key, str) or not (key.startswith(("state.", _DRAWS, _STATS)) or key == _GIBBS_LOG_JOINT):
            raise ValueError(f"{tensor_path} holds an unexpected entry {key!r}")
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{tensor_path}: entry {key!r} is a {type(value).__name__}, not a tensor")
    return tensors


def _check_device(device: Any, name: str, hint: str) -> None:
    """Refuse a device that cannot hold the loaded tensors here, naming ``name`` (``map_location`` or the saved
    ``device``) and what to do (``hint``)."""
    if device is None:
        return
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"{name} must be None, a string, an integer or a torch.device; got {type(device).__name__}")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0'; got {device!r}{hint}"
        ) from None
    shown = f"{name}={str(device)!r}"
    if resolved.type == "meta":
        raise ValueError(f"{shown} is a meta device, which holds no values: no model can be loaded onto it{hint}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{shown} asks for CUDA, but torch.cuda.is_available() is False{hint}")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ValueError(f"{shown} asks for a GPU this machine lacks (it has {torch.cuda.device_count()}){hint}")
    try:
        torch.empty(1, device=resolved)
    except (RuntimeError, AssertionError) as err:  # a device this build of PyTorch or this machine lacks
        raise ValueError(f"{shown} cannot be used here: {err}{hint}") from None


def _verified_config(files: SavedFiles) -> tuple[dict[str, Any], type, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The parsed config and its class, params, fitted and extra, the checksums of both files verified."""
    config_path, tensor_path = files.config_path, files.tensor_path
    config = _parse_config(config_path, files.config)
    version = config["format_version"]
    try:
        cls, params, fitted, extra = _check_content(config, version)
        problem = None
    except ValueError as err:
        problem = err
    if version >= 2 or _CHECKSUM_KEY in config:
        recorded = config.get(_CHECKSUM_KEY)
        if not _is_sha256(recorded) or recorded != config_checksum(config):
            raise ValueError(
                f"{config_path} was modified after it was saved: its content does not match the checksum it "
                f"records ({_CHECKSUM_KEY})" + (f"; {problem}" if problem is not None else "")
            )
    if problem is not None:
        raise ValueError(f"{config_path}: {problem}")
    if _CHECKSUM_KEY not in config:
        logger.warning(
            "%s is in ppmix model format version %s, whose config.json has no checksum: edits of it cannot be "
            "detected; save the model again to write format version %s",
            config_path,
            version,
            FORMAT_VERSION,
        )
    if _sha256(files.tensors) != config["tensors_sha256"]:
        raise ValueError(
            f"{tensor_path} does not match the checksum recorded in {config_path}: the tensor file is corrupt, "
            "was modified, or comes from another save"
        )
    return config, cls, params, fitted, extra


def load_model(
    path: str | Path,
    expected: type | None = None,
    map_location: str | torch.device | None = None,
    objects: dict[str, Any] | None = None,
) -> "MixtureModel":
    """Load a model written by :func:`save_model`, verified first.

    Checked in order: ``map_location``; both files exist; ``config.json`` is JSON of a readable
    format version; its checksum (over the config and, through ``tensors_sha256``, the tensor
    file); its schema (constructor arguments of the saved class with values of their annotated
    types, only known fitted attributes); the tensor file's checksum and safe loading; the
    state against the config (:func:`~ppmix.io.state_check.check_state`: every entry the
    settings imply, of the shape they imply, all values finite; a sampler's statistics one per
    draw); the restored state. After ``engine="mcmc"`` or ``"gibbs"`` the draws come back
    (``mcmc_samples_``) with the sampler's statistics of every draw (NUTS's ``mcmc_sample_stats_``,
    the Gibbs engine's ``gibbs_log_joint_``), so ``to_arviz()`` has the same ``sample_stats``;
    saves written before ppmix kept those load without them.

    Both files are read from one version of the save even while another process saves over
    ``path`` (:func:`~ppmix.io.snapshot.open_saved`), so a server may reload a model that is
    being replaced.

    Parameters
    ----------
    path : str or Path
        Directory written by :func:`save_model`.
    expected : type, optional
        The loaded class must be this class or a subclass of it.
    map_location : str or torch.device, optional
        Device to load onto; it becomes the loaded object's ``device`` argument.
    objects : dict, optional
        Objects for constructor arguments that a file cannot hold and the save recorded as
        ``null`` (a PRESTO ``component`` module, a RegularizedWeighting ``learner`` object):
        required to load such a save; ignored for arguments the save recorded.

    Raises
    ------
    FileNotFoundError
        If ``path`` lacks the config or tensor file (the file is named).
    ValueError
        If either file is corrupt or was modified after saving, the config is from another
        format version, fails the schema, names an unknown or unexpected class, the state
        contradicts the config or does not fit the class (the file, and where known the field
        or entry, are named), or ``map_location`` (or the saved device) cannot be used here.

    Examples
    --------
    >>> import tempfile, torch
    >>> from ppmix import GMM
    >>> x = torch.randn(50, 2, generator=torch.Generator().manual_seed(0))
    >>> gmm = GMM(2, seed=0, progress=False).fit(x)
    >>> loaded = load_model(gmm.save(tempfile.mkdtemp()), expected=GMM)
    >>> bool((loaded.predict(x) == gmm.predict(x)).all())
    True
    """
    path = Path(path)
    if map_location is not None:
        _check_device(map_location, "map_location", "; load onto 'cpu' or a device this machine has")
    with open_saved(path) as files:
        config, cls, params, fitted, extra = _verified_config(files)
        if expected is not None and not issubclass(cls, expected):
            raise ValueError(f"{path} holds a {cls.__name__}, not a {expected.__name__}")
        tensors = _read_tensors(files.tensor_path, files.tensors, map_location)
    config_path, tensor_path = files.config_path, files.tensor_path
    state = {k.removeprefix("state."): v for k, v in tensors.items() if k.startswith("state.")}
    mcmc = _entries(tensors, _DRAWS)
    try:
        cls._upgrade_saved(params, fitted, extra, state)
    except ValueError as err:
        raise ValueError(
            f"{path} was saved by ppmix {config['ppmix_version']} (format version {config['format_version']}) "
            f"in a layout this ppmix cannot read: {err}"
        ) from None
    signature = constructor_parameters(cls)
    if "device" in signature:
        if map_location is not None:
            params["device"] = str(map_location)
        else:
            hint = f" ({path} was saved for it); to load it here, pass map_location='cpu'"
            _check_device(params.get("device"), "device", hint)
    given = tuple(n for n, v in (objects or {}).items() if n in signature and params.get(n) is None and v is not None)
    params.update({name: objects[name] for name in given} if objects else {})
    try:
        model = cls(**params)
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as err:
        raise ValueError(f"{config_path}: {cls.__name__} refuses the saved constructor arguments: {err}") from None
    _validate_settings(model, config_path)
    for name, value in fitted.items():
        if name == "classes_":  # a classifier's labels, as the array scikit-learn expects (absent otherwise)
            if value is not None:
                model.classes_ = np.asarray(value)
            continue
        setattr(model, name, value)
    try:
        model._load_extra_state(extra)
    except ObjectRequired as err:
        raise ValueError(f"{path}: {err}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as err:
        raise ValueError(f"{config_path}: field 'extra' does not hold a valid {cls.__name__} state: {err}") from None
    check_state(model, state, mcmc, tensor_path, given, per_draw=_per_draw(tensors))
    try:
        model._load_state_tensors(state)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RuntimeError) as err:
        raise ValueError(f"{tensor_path} does not hold a valid {cls.__name__} state: {err}") from None
    if mcmc:
        model.mcmc_samples_ = mcmc
    stats = _entries(tensors, _STATS)
    if stats:
        model.mcmc_sample_stats_ = {name: value.cpu().numpy() for name, value in stats.items()}
    if _GIBBS_LOG_JOINT in tensors:
        model.gibbs_log_joint_ = tensors[_GIBBS_LOG_JOINT]
    return model


def _validate_settings(model: Any, config_path: Path) -> None:
    """The checks ``fit`` runs on the constructor arguments (``_validate_hyperparameters``: each value, and how
    they combine, e.g. a ``transition_pattern`` of ``n_components`` states, ``priors`` of valid hyperparameters),
    run on the saved ones: a ``ValueError`` naming ``config_path`` and the argument."""
    validate = getattr(model, "_validate_hyperparameters", None)
    if validate is None:
        return
    try:
        validate()
    except (TypeError, ValueError) as err:
        refused = f"field 'params' holds settings {type(model).__name__} refuses"
        raise ValueError(f"{config_path}: {refused}: {err}") from None


class Savable(Estimator, metaclass=ABCMeta):
    """What every savable ppmix object shares: its subclasses are registered for :func:`load_model`,
    named by :func:`ppmix.io.qualified_name`, and written by :meth:`save` (``config.json`` + ``tensors.pt``).

    The optimizers (PRESTO, RegularizedWeighting) derive from it; :class:`~ppmix.models.MixtureModel` is a
    virtual subclass (``Savable.register``) that takes its default hooks by assignment and registers its
    subclasses itself, so ``isinstance(model, Savable)`` holds for every model without the class in its MRO.
    A subclass provides ``_saved_params()`` (JSON-able constructor arguments), ``_check_fitted()`` and
    ``_state_tensors()``/``_load_state_tensors()``; ``_extra_state()``
    /``_load_extra_state()`` carry JSON-able fitted state beyond the tensors. ``_state_shapes()``
    declares the state its settings imply (checked on every load), ``_upgrade_saved()`` brings
    saves of older ppmix versions to the current layout.

    Examples
    --------
    >>> from ppmix import GMM
    >>> from ppmix.io import lookup_class, qualified_name
    >>> issubclass(GMM, Savable) and lookup_class(qualified_name(GMM)) is GMM
    True
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_savable(cls)

    def _saved_params(self) -> dict[str, Any]:
        """The constructor arguments a saved file records; default: all of them (``get_params(deep=False)``)."""
        return self.get_params(deep=False)

    def save(self, path: str | Path) -> Path:
        """Write the fitted object to the directory ``path`` atomically; see :func:`save_model`."""
        return save_model(self, path)

    def _extra_state(self) -> dict[str, Any]:
        """JSON-able fitted state beyond the tensors (default: none)."""
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`_extra_state`."""

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]] | None:
        """The shape of every state tensor that this object's settings imply (``None`` in a shape: any size).

        Called by :func:`load_model` once the constructor arguments, fitted attributes and extra state of
        a save are set, before the tensors are: a saved entry missing, not implied, or of another shape
        is refused (:func:`~ppmix.io.state_check.check_state`). Default ``None``: not declared, and only
        the values are checked (finite).
        """
        return None

    @classmethod
    def _upgrade_saved(
        cls, params: dict[str, Any], fitted: dict[str, Any], extra: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> None:
        """Bring a save written by an older ppmix to the current layout, in place (default: nothing to do).

        Raise ``ValueError`` saying what is missing and what to do where it cannot be brought.
        """


class ObjectRequired(ValueError):
    """A save needs an object that a file cannot hold (a component module, a learner), passed at load."""
