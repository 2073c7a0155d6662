"""Checks for component families written outside ppmix: :func:`check_family`.

A new family (a :class:`~ppmix.components.family.DensityFamily` and its
:class:`~ppmix.components.base.ComponentFamily`) works in every structure and engine when it keeps the
contract those declare; :func:`check_family` runs the checks ppmix's own suite runs on every built-in family,
on the data a user gives, and names the first one that fails.
"""

from __future__ import annotations

import contextlib
import copy
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
from ppmix.components.family import DensityFamily, components_from_state
from ppmix.distributed import fit_em
from ppmix.models.hmm import HMM
from ppmix.models.mixture import Mixture

__all__ = ["check_family"]

logger = logging.getLogger(__name__)

#: the structures :func:`check_family` fits the family in
STRUCTURES = ("Mixture", "HMM")
#: the most M-steps the weighted-MLE check repeats to reach a fixed point (statistics that depend on the current
#: components, e.g. the Student-t's expected precisions, need several)
M_STEPS = 2000
#: how many sequences the rows are cut into for the HMM
N_SEQUENCES = 6


def check_family(
    family: DensityFamily,
    data: Any,
    *,
    n_components: int = 2,
    structures: tuple[str, ...] = STRUCTURES,
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
    3. in each structure of ``structures`` (``"Mixture"``; ``"HMM"`` on the rows cut into six sequences): EM's
       objective equals Pyro's ``TraceEnum_ELBO`` at the fitted parameters, and EM on three shards (``fit_em``,
       warm-started) equals EM in memory;
    4. in a ``Mixture``: integer ``sample_weight`` equals the rows repeated, from one start;
    5. in each structure: a fitted model saves and loads back (the family registered under its name for the check
       if it is not registered) with the same predictions.

    Parameters
    ----------
    family : DensityFamily
        The family, with its settings.
    data : array-like of shape (n_samples, n_features)
        Rows the family models, ideally from ``n_components`` distinct components (a few hundred rows).
    n_components : int, default 2
        The number of components fitted.
    structures : tuple of str, default ("Mixture", "HMM")
        The structures of checks 3 and 5.
    seed : int, default 0
        The seed of every fit.

    Raises
    ------
    AssertionError
        At the first check that fails, naming it.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix.components.poisson import PoissonFamily
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.poisson(2.0, (60, 2)), rng.poisson(9.0, (60, 2))]).astype(float)
    >>> check_family(PoissonFamily(), X, structures=("Mixture",))
    """
    x = torch.as_tensor(np.asarray(data, dtype=np.float64))
    if x.dim() != 2:
        raise ValueError(f"data must be a 2-D array of rows (n_samples, n_features); got shape {tuple(x.shape)}")
    unknown = sorted(set(structures) - set(STRUCTURES))
    if unknown:
        raise ValueError(f"structures must be among {STRUCTURES}; got {unknown}")
    with _checking(family, "the contract"):
        _check_contract(family, x, n_components)
    with _checking(family, "the M-step"):
        _check_m_step(family, x, n_components)
    for structure in structures:
        with _checking(family, f"EM's objective = TraceEnum_ELBO in {structure}"):
            _check_em_objective(family, structure, x, n_components, seed)
        with _checking(family, f"EM on shards = EM in memory in {structure}"):
            _check_shards(family, structure, x, n_components, seed)
    with _checking(family, "sample_weight = rows repeated in Mixture"):
        _check_weights(family, x, n_components, seed)
    for structure in structures:
        with _checking(family, f"save/load in {structure}"):
            _check_save_load(family, structure, x, n_components, seed)
    logger.info("%r passed check_family on %d rows", family, x.shape[0])


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
def _check_contract(family: Any, x: torch.Tensor, k: int) -> None:
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
    scale = family.data_scale(x)
    measured = family.measured(scale)
    components = measured.placeholder(k, x.shape[1], scale, {"dtype": torch.float64})
    weights = _weights(x.shape[0], k)
    stats = components.statistics(measured.prepare(x), weights)
    if not hasattr(type(stats), "merge") or not hasattr(type(stats), "scaled"):
        raise AssertionError(f"statistics must be a ppmix.components.family.Statistics; got {type(stats).__name__}")
    _close(stats.counts, weights.sum(0), f"{type(stats).__name__}.counts (each component's total weight)", 1e-10)
    _close(stats.merge(stats).counts, 2 * weights.sum(0), "the counts of statistics merged with themselves", 1e-10)
    _close(stats.scaled(0.5).counts, 0.5 * weights.sum(0), "the counts of statistics scaled by 1/2", 1e-10)
    _close(stats.to(dtype=torch.float64).counts, weights.sum(0), "the counts of statistics moved by to()", 1e-10)


# ------------------------------------------------------------------------------------------------- the M-step
def _check_m_step(family: Any, x: torch.Tensor, k: int) -> None:
    """The weighted MLE beats every nearby point, and the components rebuilt from their site values (by name) and
    from their state are the same."""
    scale = family.data_scale(x)
    family = family.measured(scale)
    data, weights = family.prepare(x), _weights(x.shape[0], k)
    components = family.placeholder(k, x.shape[1], scale, {"dtype": torch.float64})
    for _ in range(M_STEPS):
        before = family.site_values(components)
        components.fit_statistics(components.statistics(data, weights))
        fitted = family.site_values(components)
        if all(torch.allclose(fitted[site], value, rtol=1e-12, atol=0.0) for site, value in before.items()):
            break
    log_prob = components.log_prob(data)
    _close(family.components(fitted, scale).log_prob(data), log_prob, "components rebuilt from their sites", 1e-12)
    rebuilt = components_from_state(family, components.state_dict(), scale)
    _close(rebuilt.log_prob(data), log_prob, "components rebuilt from their state_dict (parameters by name)", 1e-12)

    def objective(values: dict[str, torch.Tensor]) -> float:
        return float((weights * family.components(values, scale).log_prob(data)).sum())

    best = objective(fitted)
    specs = family.sites(k, x.shape[1])
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


def _structure_data(structure: str, x: torch.Tensor) -> Any:
    rows = x.numpy()
    return rows if structure == "Mixture" else list(np.array_split(rows, N_SEQUENCES))


def _check_em_objective(family: Any, structure: str, x: torch.Tensor, k: int, seed: int) -> None:
    data = _structure_data(structure, x)
    model = _quiet(_model(family, structure, k, seed, max_iter=3).fit, data)
    prepared = model.prepare_data(data)
    em_objective = float(model.e_step(model.em_data(prepared))[1])
    _close(em_objective, model.elbo_tensor(prepared), "EM's objective against Pyro's TraceEnum_ELBO", 1e-10)
    if structure == "HMM":  # the program scores every step of the padded batch, masked ones too: all finite
        steps = prepared.x.reshape(-1, prepared.x.shape[-1])
        log_prob = model.components_.log_prob(model.component_family().prepare(steps))
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


def _check_shards(family: Any, structure: str, x: torch.Tensor, k: int, seed: int) -> None:
    """Five EM iterations from one warm start, in memory and on three shards by ``fit_em``: the same history and
    parameters (the warm start and ``fit_em`` hand the family its recorded data scale)."""
    data = _structure_data(structure, x)
    start = _quiet(_model(family, structure, k, seed).fit, data, max_iter=2)
    start.warm_start = True
    in_memory = _quiet(copy.deepcopy(start).fit, data, max_iter=5, tol=0.0)
    with tempfile.TemporaryDirectory() as directory:
        shards = _write_shards(structure, data, Path(directory))
        sharded = _quiet(fit_em, copy.deepcopy(start), shards, executor="inline", max_iter=5, tol=0.0)
    common = min(len(sharded.history_), len(in_memory.history_))  # at a fixed point one may stop an iteration early
    _close(sharded.history_[:common], in_memory.history_[:common], "the history of EM on shards", 1e-10)
    for key, value in in_memory.state_tensors().items():
        _close(sharded.state_tensors()[key], value, f"{key} fitted by EM on shards", 1e-9, 1e-12)


def _check_weights(family: Any, x: torch.Tensor, k: int, seed: int) -> None:
    """Integer weights (0 to 3) against the rows repeated, three EM iterations from one start."""
    rows = x.numpy()
    weight = np.random.default_rng(seed).integers(0, 4, len(rows))
    weight[:2] = 1
    repeated = np.repeat(rows, weight, axis=0)
    start = _quiet(_model(family, "Mixture", k, seed, max_iter=1, init_params="random").fit, repeated).get_globals()
    fits = []
    for data, options in ((rows, {"sample_weight": weight}), (repeated, {})):
        model = _model(family, "Mixture", k, seed, tol=0.0, max_iter=3)
        _quiet(model.fit, data, max_iter=1, **options)
        model.set_globals(start)
        fits.append(_quiet(model.fit, data, warm_start=True, **options))
    weighted, plain = fits
    for site, value in plain.get_globals().items():
        _close(weighted.get_globals()[site], value, f"{site} fitted with sample_weight", 1e-10, 1e-12)
    _close(weighted.history_, plain.history_, "the history with sample_weight", 1e-10)


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


def _check_save_load(family: Any, structure: str, x: torch.Tensor, k: int, seed: int) -> None:
    data = _structure_data(structure, x)
    model = _quiet(_model(family, structure, k, seed, max_iter=5).fit, data)
    with _registered(family), tempfile.TemporaryDirectory() as directory:  # a loaded model finds it by name
        loaded = type(model).load(model.save(Path(directory) / "model"))
        for key, value in model.state_tensors().items():
            _close(loaded.state_tensors()[key], value, f"{key} of the loaded model", 0.0)
        _close(loaded.score(data), model.score(data), "the loaded model's score", 0.0)
