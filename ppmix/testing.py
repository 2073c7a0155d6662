"""Checks for component families written outside ppmix: :func:`check_family`.

A new family (a :class:`~ppmix.components.family.DensityFamily` and its
:class:`~ppmix.components.base.ComponentFamily`) works in every structure and engine when it keeps the
contract those declare; :func:`check_family` runs the checks ppmix's own suite runs on every built-in family,
on the data a user gives, and names the first one that fails. A family of rows is checked in a ``Mixture`` and an
``HMM``; a sequence family (one whose frames depend on the frames before them, which declares ``sequence_rows``, as
the autoregressive family does) in an ``HMM``, on sequences.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from pyro.distributions.transforms import biject_to

from ppmix.components import registry
from ppmix.components.base import ComponentFamily
from ppmix.components.family import DensityFamily
from ppmix.components.family_tools import loaded, placeholder, rescaled
from ppmix.distributed import fit_em
from ppmix.models.hmm import HMM
from ppmix.models.mixture import Mixture

__all__ = ["check_family"]

logger = logging.getLogger(__name__)

#: the structures :func:`check_family` fits the family in
STRUCTURES = ("Mixture", "HMM")
#: the structures a sequence family fits in (a mixture has no sequences)
SEQUENCE_STRUCTURES = ("HMM",)
#: the most M-steps the weighted-MLE check repeats to reach a fixed point (statistics that depend on the current
#: components, e.g. the Student-t's expected precisions, need several)
M_STEPS = 2000
#: how many sequences the rows are cut into for the HMM
N_SEQUENCES = 6
#: the fewest sequences given as sequences: one per shard of the shards check
MIN_SEQUENCES = 3


@dataclasses.dataclass(frozen=True)
class _CheckData:
    """The data in the forms the checks read: ``sequences``, a list of ``(T_i, D)`` arrays (the rows cut into
    ``N_SEQUENCES`` when rows are given), ``frames`` ``(N, D)`` all of them, and ``steps`` ``(N, D')`` every frame as
    the family scores it (a sequence family's ``sequence_rows``; the frames themselves otherwise)."""

    sequences: list[np.ndarray]
    frames: torch.Tensor
    steps: torch.Tensor

    def of(self, structure: str) -> Any:
        """What ``structure`` fits: the frames as rows (``Mixture``) or the sequences (``HMM``)."""
        return self.frames.numpy() if structure == "Mixture" else self.sequences


def check_family(
    family: DensityFamily,
    data: Any,
    *,
    n_components: int = 2,
    structures: tuple[str, ...] | None = None,
    seed: int = 0,
) -> None:
    """Check that ``family`` keeps the contract of ppmix's families, on ``data``; an ``AssertionError`` naming the
    family, the check and what differs at the first failure.

    The checks, in order:

    1. the contract: the family subclasses ``DensityFamily``, its components class writes the five abstract
       members, its statistics carry ``counts`` (each component's total weight), merge and scale;
    2. the M-step: ``fit_statistics`` of weighted statistics beats every nearby point of the parameter space (each
       site perturbed in its unconstrained coordinates) on the weighted log-likelihood, and the components rebuilt
       from their site values (parameters passed by name) are the same components;
    3. in each structure of ``structures``: EM's objective equals Pyro's ``TraceEnum_ELBO`` at the fitted
       parameters, and EM on three shards (``fit_em`` on ``.npy`` rows, or ``.npz`` frames and ``lengths`` for an
       ``HMM``; warm-started) equals EM in memory;
    4. in each structure: integer ``sample_weight`` equals the weighted units repeated, from one start (rows in a
       ``Mixture``; sequences in an ``HMM``, whose weights are per sequence);
    5. in each structure: a fitted model saves and loads back (the family registered under its name for the check
       if it is not registered) with the same predictions.

    The optional members (the priors of MCMC, MAP-EM and Gibbs, ``moments``, missing entries) and a registered
    divergence are not required. A sequence family, one that declares ``sequence_rows`` (each step's row made from
    the frames before it, e.g. :class:`~ppmix.components.AutoRegressiveFamily`), takes sequences and is checked in
    an ``HMM`` only: its M-step on the rows ``sequence_rows`` makes of each sequence, its weights per sequence.

    Parameters
    ----------
    family : DensityFamily
        The family, with its settings.
    data : array-like of shape (n_samples, n_features), or list of array-like of shape (T_i, n_features)
        Rows the family models (cut into six sequences for the ``HMM``), or sequences (at least three; their
        frames are the ``Mixture``'s rows), ideally from ``n_components`` distinct components (a few hundred rows
        or frames). A sequence family takes sequences only.
    n_components : int, default 2
        The number of components fitted.
    structures : tuple of str, optional
        The structures of checks 3 to 5, among ``("Mixture", "HMM")``; default: every structure the family fits in
        (``("HMM",)`` for a sequence family).
    seed : int, default 0
        The seed of every fit.

    Raises
    ------
    AssertionError
        At the first check that fails, naming it.
    ValueError
        If ``data`` is neither rows nor a list of at least three sequences, if a sequence family is given rows, or
        if ``structures`` names an unknown structure (or ``"Mixture"`` for a sequence family).

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix.components import AutoRegressiveFamily
    >>> from ppmix.components.poisson import PoissonFamily
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.poisson(2.0, (60, 2)), rng.poisson(9.0, (60, 2))]).astype(float)
    >>> check_family(PoissonFamily(), X, structures=("Mixture",))
    >>> walks = [np.cumsum(rng.normal(size=(40, 1)), axis=0) for _ in range(4)]  # sequences for a sequence family
    >>> check_family(AutoRegressiveFamily(lags=1), walks, n_components=1)
    """
    structures = _structures_for(family, structures)
    checked = _as_check_data(family, data)
    with _checking(family, "the contract"):
        _check_contract(family, checked, n_components)
    with _checking(family, "the M-step"):
        _check_m_step(family, checked, n_components)
    for structure in structures:
        with _checking(family, f"EM's objective = TraceEnum_ELBO in {structure}"):
            _check_em_objective(family, structure, checked, n_components, seed)
        with _checking(family, f"EM on shards = EM in memory in {structure}"):
            _check_shards(family, structure, checked, n_components, seed)
    for structure in structures:
        unit = "rows" if structure == "Mixture" else "sequences"
        with _checking(family, f"sample_weight = {unit} repeated in {structure}"):
            _check_weights(family, structure, checked, n_components, seed)
    for structure in structures:
        with _checking(family, f"save/load in {structure}"):
            _check_save_load(family, structure, checked, n_components, seed)
    logger.info("%r passed check_family on %d frames in %s", family, checked.frames.shape[0], structures)


def _is_sequence_family(family: Any) -> bool:
    """Whether ``family``'s frames depend on those before them: it makes each step's row with ``sequence_rows``."""
    return callable(getattr(family, "sequence_rows", None))


def _structures_for(family: Any, structures: tuple[str, ...] | None) -> tuple[str, ...]:
    """``structures``, checked; None: every structure ``family`` fits in."""
    sequential = _is_sequence_family(family)
    if structures is None:
        return SEQUENCE_STRUCTURES if sequential else STRUCTURES
    structures = tuple(structures)
    unknown = sorted(set(structures) - set(STRUCTURES))
    if unknown:
        raise ValueError(f"structures must be among {STRUCTURES}; got {unknown}")
    if sequential and "Mixture" in structures:
        raise ValueError(
            f"structures must not name 'Mixture' for the sequence family {family!r} (a mixture has no sequences): "
            f"use structures={SEQUENCE_STRUCTURES} or leave it out"
        )
    return structures


def _as_check_data(family: Any, data: Any) -> _CheckData:
    """``data`` as rows and sequences: rows cut into ``N_SEQUENCES`` sequences, or sequences (a sequence family
    takes sequences only) whose frames are the rows."""
    sequential = _is_sequence_family(family)
    if isinstance(data, (list, tuple)) and len(data) > 0 and all(np.ndim(part) == 2 for part in data):
        sequences = [np.asarray(part, dtype=np.float64) for part in data]
        if len(sequences) < MIN_SEQUENCES or len({part.shape[1] for part in sequences}) != 1:
            raise ValueError(
                f"data given as sequences must be at least {MIN_SEQUENCES} arrays (T_i, n_features) with the same "
                f"n_features (one sequence per shard of the shards check); got shapes "
                f"{[part.shape for part in sequences]}"
            )
        frames = torch.as_tensor(np.concatenate(sequences))
    else:
        frames = torch.as_tensor(np.asarray(data, dtype=np.float64))
        if frames.dim() != 2:
            raise ValueError(
                "data must be a 2-D array of rows (n_samples, n_features) or a list of sequences (T_i, n_features); "
                f"got shape {tuple(frames.shape)}"
            )
        if sequential:
            raise ValueError(
                f"data must be a list of sequences (T_i, n_features) for the sequence family {family!r}, which "
                "scores each frame with the frames before it (its sequence_rows); got rows"
            )
        sequences = list(np.array_split(frames.numpy(), N_SEQUENCES))
    if not sequential:
        return _CheckData(sequences, frames, frames)
    steps = torch.cat([_step_rows(family, torch.as_tensor(part)[None])[0] for part in sequences])
    return _CheckData(sequences, frames, steps)


def _step_rows(family: Any, padded: torch.Tensor) -> torch.Tensor:
    """Every step's row of padded sequences ``(B, T, D)`` as ``family`` scores it, ``(B, T, D')``."""
    return family.sequence_rows(padded) if _is_sequence_family(family) else padded


@contextlib.contextmanager
def _checking(family: Any, what: str) -> Iterator[None]:
    """Re-raise a failure inside as an ``AssertionError`` naming the family and the check."""
    try:
        yield
    except Exception as error:  # the family's own code may fail in any way: each is a failed check
        detail = str(error) if isinstance(error, AssertionError) else f"{type(error).__name__}: {error}"
        raise AssertionError(f"check_family({family!r}) failed {what}: {detail}") from error


def _quiet(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _close(got: Any, want: Any, what: str, rtol: float, atol: float = 0.0) -> None:
    got_np, want_np = np.asarray(torch.as_tensor(got).detach().cpu()), np.asarray(torch.as_tensor(want).detach().cpu())
    if got_np.shape != want_np.shape or not np.allclose(got_np, want_np, rtol=rtol, atol=atol, equal_nan=True):
        raise AssertionError(f"{what}: {got_np.ravel()[:6]} differs from {want_np.ravel()[:6]} (rtol {rtol})")


def _weights(n: int, k: int) -> torch.Tensor:
    """Fixed positive responsibilities ``(n, k)``, a Dirichlet(1) draw per row."""
    generator = torch.Generator().manual_seed(0)
    draws = -torch.rand(n, k, generator=generator, dtype=torch.float64).clamp_min(1e-12).log()
    return draws / draws.sum(1, keepdim=True)


# ----------------------------------------------------------------------------------------------- the contract
def _check_contract(family: Any, data: _CheckData, k: int) -> None:
    if not isinstance(family, DensityFamily):
        raise AssertionError(f"a family subclasses ppmix.components.family.DensityFamily; got {type(family).__name__}")
    if not isinstance(getattr(family, "name", None), str):
        raise AssertionError(f"{type(family).__name__}.name must be the family's name, a string")
    cls = family.components_class
    if not (isinstance(cls, type) and issubclass(cls, ComponentFamily)):
        raise AssertionError(f"components_class must subclass ppmix.components.base.ComponentFamily; got {cls!r}")
    if inspect.isabstract(cls):
        raise AssertionError(f"{cls.__name__} does not write {sorted(cls.__abstractmethods__)}")
    if not cls.param_names:
        raise AssertionError(f"{cls.__name__}.param_names must name its parameter tensors")
    scale = family.data_scale(data.frames)
    measured = family.measured(scale)
    components = placeholder(measured, k, data.frames.shape[1], scale, {"dtype": torch.float64})
    weights = _weights(data.steps.shape[0], k)
    stats = components.statistics(measured.prepare(data.steps), weights)
    if not hasattr(type(stats), "merge") or not hasattr(type(stats), "scaled"):
        raise AssertionError(f"statistics must be a ppmix.components.family.Statistics; got {type(stats).__name__}")
    _close(stats.counts, weights.sum(0), f"{type(stats).__name__}.counts (each component's total weight)", 1e-10)
    _close(stats.merge(stats).counts, 2 * weights.sum(0), "the counts of statistics merged with themselves", 1e-10)
    _close(stats.scaled(0.5).counts, 0.5 * weights.sum(0), "the counts of statistics scaled by 1/2", 1e-10)
    _close(stats.to(dtype=torch.float64).counts, weights.sum(0), "the counts of statistics moved by to()", 1e-10)


# ------------------------------------------------------------------------------------------------- the M-step
def _check_m_step(family: Any, data: _CheckData, k: int) -> None:
    """The weighted MLE beats every nearby point, and the components rebuilt from their site values (by name), loaded
    from their state and rebuilt on their data scale are the same (the last two bit for bit; on every step's row as
    the family scores it)."""
    scale = family.data_scale(data.frames)
    family = family.measured(scale)
    d = data.frames.shape[1]
    rows, weights = family.prepare(data.steps), _weights(data.steps.shape[0], k)
    components = placeholder(family, k, d, scale, {"dtype": torch.float64})
    for _ in range(M_STEPS):
        before = family.site_values(components)
        components.fit_statistics(components.statistics(rows, weights))
        fitted = family.site_values(components)
        if all(torch.allclose(fitted[site], value, rtol=1e-12, atol=0.0) for site, value in before.items()):
            break
    log_prob = components.log_prob(rows)
    _close(family.components(fitted, scale).log_prob(rows), log_prob, "components rebuilt from their sites", 1e-12)
    state = components.state_dict()
    for rebuilt, how in (
        (loaded(family, state, k, d, scale, {"dtype": torch.float64}), "loaded from their state_dict"),
        (rescaled(family, components, scale), "rebuilt on their data scale (a warm start)"),
    ):
        for name, value in rebuilt.state_dict().items():
            _close(value, state[name], f"{name} of the components {how}", 0.0)
        _close(rebuilt.log_prob(rows), log_prob, f"the components {how}", 1e-12)

    def objective(values: dict[str, torch.Tensor]) -> float:
        return float((weights * family.components(values, scale).log_prob(rows)).sum())

    best = objective(fitted)
    specs = family.sites(k, d)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        moved = {}
        for site, value in fitted.items():
            transform = biject_to(specs[site].support)
            free = transform.inv(value)
            moved[site] = transform(free + 1e-3 * torch.randn(free.shape, generator=generator, dtype=free.dtype))
        if objective(moved) > best + 1e-9 * abs(best):
            raise AssertionError(
                f"parameters near the M-step's have a higher weighted log-likelihood ({objective(moved)} > {best}): "
                "fit_statistics is not the weighted MLE of statistics"
            )


# ------------------------------------------------------------------------------------------------ structures
def _model(family: Any, structure: str, k: int, seed: int, **options: Any) -> Any:
    if structure == "Mixture":
        return Mixture(k, family=family, seed=seed, progress=False, **options)
    return HMM(k, emission=family, seed=seed, progress=False, **options)


def _check_em_objective(family: Any, structure: str, data: _CheckData, k: int, seed: int) -> None:
    units = data.of(structure)
    model = _quiet(_model(family, structure, k, seed, max_iter=3).fit, units)
    prepared = model.prepare_data(units)
    em_objective = float(model._e_step(model._em_data(prepared))[1])
    _close(em_objective, model._elbo_tensor(prepared), "EM's objective against Pyro's TraceEnum_ELBO", 1e-10)
    if structure == "HMM":  # the program scores every step of the padded batch, masked ones too: all finite
        fitted_family = model._component_family()
        steps = _step_rows(fitted_family, prepared.x)
        log_prob = model.components_.log_prob(fitted_family.prepare(steps.reshape(-1, steps.shape[-1])))
        if not bool(torch.isfinite(log_prob).all()):
            raise AssertionError("log_prob is not finite on the zero padding of sequences (the masked steps)")


def _write_shards(structure: str, data: Any, directory: Path) -> list[Path]:
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(data)), 3)):
        if structure == "Mixture":
            paths.append(directory / f"part{i}.npy")
            np.save(paths[-1], data[part])
        else:
            sequences = [data[j] for j in part]
            paths.append(directory / f"part{i}.npz")
            np.savez(paths[-1], X=np.concatenate(sequences), lengths=np.array([len(s) for s in sequences]))
    return paths


def _check_shards(family: Any, structure: str, data: _CheckData, k: int, seed: int) -> None:
    """Five EM iterations from one warm start, in memory and on three shards by ``fit_em``: the same history and
    parameters (the warm start and ``fit_em`` hand the family its recorded data scale)."""
    units = data.of(structure)
    start = _quiet(_model(family, structure, k, seed).fit, units, max_iter=2)
    start.warm_start = True
    in_memory = _quiet(copy.deepcopy(start).fit, units, max_iter=5, tol=0.0)
    with tempfile.TemporaryDirectory() as directory:
        shards = _write_shards(structure, units, Path(directory))
        sharded = _quiet(fit_em, copy.deepcopy(start), shards, executor="inline", max_iter=5, tol=0.0)
    common = min(len(sharded.history_), len(in_memory.history_))  # at a fixed point one may stop an iteration early
    _close(sharded.history_[:common], in_memory.history_[:common], "the history of EM on shards", 1e-10)
    for key, value in in_memory._state_tensors().items():
        _close(sharded._state_tensors()[key], value, f"{key} fitted by EM on shards", 1e-9, 1e-12)


def _repeated(units: Any, weight: np.ndarray) -> Any:
    """Rows ``(n, D)`` or a list of sequences, unit ``i`` repeated ``weight[i]`` times in place."""
    index = np.repeat(np.arange(len(units)), weight)
    return units[index] if isinstance(units, np.ndarray) else [units[i] for i in index]


def _check_weights(family: Any, structure: str, data: _CheckData, k: int, seed: int) -> None:
    """Integer weights (0 to 3) of the rows (``Mixture``) or the sequences (``HMM``) against those units repeated,
    three EM iterations from one start."""
    units = data.of(structure)
    weight = np.random.default_rng(seed).integers(0, 4, len(units))
    weight[:2] = 1
    repeated = _repeated(units, weight)
    start = _quiet(_model(family, structure, k, seed, max_iter=1, init_params="random").fit, repeated)._get_globals()
    fits = []
    for fitted_units, options in ((units, {"sample_weight": weight}), (repeated, {})):
        model = _model(family, structure, k, seed, tol=0.0, max_iter=3)
        _quiet(model.fit, fitted_units, max_iter=1, **options)
        model._set_globals(start)
        fits.append(_quiet(model.fit, fitted_units, warm_start=True, **options))
    weighted, plain = fits
    for site, value in plain._get_globals().items():
        _close(weighted._get_globals()[site], value, f"{site} fitted with sample_weight", 1e-10, 1e-12)
    # with tol=0 EM stops where the objective stops rising; at an optimum rounding may decide that one pass apart
    n = min(len(weighted.history_), len(plain.history_))
    _close(weighted.history_[:n], plain.history_[:n], "the history with sample_weight", 1e-10)


@contextlib.contextmanager
def _registered(family: Any) -> Iterator[None]:
    """``family``'s class registered under its name while inside (if it is not registered already)."""
    try:
        registered = registry.family_class(family.name)
    except ValueError:  # not registered
        registered = None
    if registered is not None:
        if registered is not type(family):
            raise AssertionError(f"the name {family.name!r} is registered to another family, {registered.__name__}")
        yield
        return
    registry.register_family(family.name, type(family))
    try:
        yield
    finally:
        registry.FAMILIES.pop(family.name, None)


def _check_save_load(family: Any, structure: str, data: _CheckData, k: int, seed: int) -> None:
    units = data.of(structure)
    model = _quiet(_model(family, structure, k, seed, max_iter=5).fit, units)
    with _registered(family), tempfile.TemporaryDirectory() as directory:  # a loaded model finds it by name
        loaded = type(model).load(model.save(Path(directory) / "model"))
        for key, value in model._state_tensors().items():
            _close(loaded._state_tensors()[key], value, f"{key} of the loaded model", 0.0)
        _close(loaded.score(units), model.score(units), "the loaded model's score", 0.0)
