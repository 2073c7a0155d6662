"""Helpers shared by the test suite."""

from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import Any, Callable

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from ppmix import MixtureModel

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#: devices every device-parametrized test runs on (CUDA only where present)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def assert_close(actual, expected, rtol: float = 1e-7, atol: float = 1e-9, msg: str = "") -> None:
    """``numpy.testing.assert_allclose`` for tensors and arrays alike."""

    def to_numpy(x):
        if isinstance(x, torch.Tensor):
            return x.detach().cpu().numpy()
        return np.asarray(x)

    np.testing.assert_allclose(to_numpy(actual), to_numpy(expected), rtol=rtol, atol=atol, err_msg=msg)


# ------------------------------------------------------------------ small data factories
# Tiny planted data sets that every model test can share (the model-contract test uses all of them).


def assert_em_objective_is_trace_enum_elbo(moe, x, y, *, perturbation: float = 0.3, rtol: float = 1e-10) -> None:
    """A mixture of experts' EM objective plus its ridge penalty (0 for Gaussian experts) equals Pyro's
    ``TraceEnum_ELBO`` (the log-likelihood) at its fitted and at perturbed globals."""
    from pyro.infer import TraceEnum_ELBO

    from ppmix.engines.params import local_params

    gen = torch.Generator().manual_seed(1)
    fitted = moe._get_globals()
    perturbed = {k: v + perturbation * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in fitted.items()}
    if "scale" in perturbed:
        perturbed["scale"] = perturbed["scale"].abs() + 0.1
    for values in (fitted, perturbed):
        moe._set_globals(values)
        data = moe.prepare_data(x, y)
        _, em_objective = moe._e_step(data)
        with local_params():
            pyro_elbo = -TraceEnum_ELBO(max_plate_nesting=1).loss(moe.model, moe.guide, data)
        assert_close(em_objective + moe._ridge_penalty(), pyro_elbo, rtol=rtol)
        assert_close(moe.log_likelihood(x, y), pyro_elbo, rtol=rtol)


def make_blobs(n: int = 60, n_features: int = 2, n_components: int = 2, *, seed: int = 0):
    """``n`` points from ``n_components`` unit-variance Gaussian clusters 6 apart on every feature.

    Returns ``(X (n, D), z (n,))``; the clusters take turns, so each has ``n // K`` points or one more.
    """
    rng = np.random.default_rng(seed)
    z = np.arange(n) % n_components
    return 6.0 * z[:, None] + rng.normal(size=(n, n_features)), z


def make_labelled_blobs(n: int = 60, n_features: int = 3, n_relevant: int = 1, *, seed: int = 0):
    """Two clusters on the first ``n_relevant`` features (6 apart), noise on the others; ``y`` = cluster.

    Returns ``(X (n, D), y (n,) floats 0/1)``; 5% of the labels are flipped, so ``y`` is not a function of ``X``.
    """
    rng = np.random.default_rng(seed)
    z = np.arange(n) % 2
    x = rng.normal(size=(n, n_features))
    x[:, :n_relevant] += 6.0 * z[:, None]
    y = np.where(rng.random(n) < 0.05, 1 - z, z).astype(float)
    return x, y


def make_sequences(
    n_sequences: int = 6,
    lengths: tuple[int, int] = (4, 12),
    n_features: int = 2,
    n_relevant: int | None = None,
    *,
    stay: float = 0.9,
    seed: int = 0,
):
    """Sticky two-state chains of unequal lengths (so padding is exercised) with per-step labels.

    State ``z_t`` keeps itself with probability ``stay``; it shifts the first ``n_relevant`` features
    (all by default) by ``6 z_t`` over unit-variance noise. Returns ``(X, y, z)``: lists of ``(T_i, D)``
    arrays, of ``(T_i,)`` float labels (``z_t`` with 5% flipped) and of ``(T_i,)`` states.
    """
    rng = np.random.default_rng(seed)
    relevant = n_features if n_relevant is None else n_relevant
    xs, ys, zs = [], [], []
    for _ in range(n_sequences):
        length = int(rng.integers(lengths[0], lengths[1] + 1))
        z = np.empty(length, dtype=np.int64)
        z[0] = rng.integers(2)
        for t in range(1, length):
            z[t] = z[t - 1] if rng.random() < stay else 1 - z[t - 1]
        x = rng.normal(size=(length, n_features))
        x[:, :relevant] += 6.0 * z[:, None]
        xs.append(x)
        ys.append(np.where(rng.random(length) < 0.05, 1 - z, z).astype(float))
        zs.append(z)
    return xs, ys, zs


def _profile(k: int, d: int) -> np.ndarray:
    """The category probabilities of planted multinomial component ``k``: 4 to 1 for the features of parity ``k``."""
    weights = np.where(np.arange(d) % 2 == k, 4.0, 1.0)
    return weights / weights.sum()


#: every registered density family (ppmix.components.registry.FAMILIES) and how to draw its data from planted
#: components: ``emit(z, n_features, rng)`` gives one row per state in ``z`` (0 or 1), the two components well
#: apart. The one list a new family is added to: the contract suite (Mixture and HMM cases) and
#: tests/components/test_families.py (EM, shards, partial_fit, SVI, MCMC, M-step) run over it.
FAMILY_DATA = {
    "gaussian": lambda z, d, rng: 6.0 * z[:, None] + rng.normal(size=(len(z), d)),
    "independent": lambda z, d, rng: 6.0 * z[:, None] + rng.normal(size=(len(z), d)),  # its default: Gaussian columns
    "poisson": lambda z, d, rng: rng.poisson(np.where(z[:, None] == 1, 20.0, 2.0), size=(len(z), d)),
    "bernoulli": lambda z, d, rng: rng.random((len(z), d)) < np.where(z[:, None] == 1, 0.9, 0.1),
    "exponential": lambda z, d, rng: rng.exponential(np.where(z[:, None] == 1, 50.0, 1.0), size=(len(z), d)),
    # each planted component is itself two Gaussians, at -1.5 and +1.5 about its centre
    "gmm": lambda z, d, rng: (
        8.0 * z[:, None] + rng.choice([-1.5, 1.5], size=(len(z), 1)) + 0.4 * rng.normal(size=(len(z), d))
    ),
    "student_t": lambda z, d, rng: 8.0 * z[:, None] + rng.standard_t(2.0, size=(len(z), d)),
    "multinomial": lambda z, d, rng: np.array([rng.multinomial(rng.integers(20, 40), _profile(k, d)) for k in z]),
    "categorical": lambda z, d, rng: np.where(
        rng.random((len(z), d)) < 0.8, 2 * z[:, None], rng.integers(0, 3, (len(z), d))
    ),
    "gamma": lambda z, d, rng: rng.gamma(
        np.where(z[:, None] == 1, 2.0, 1.0), np.where(z[:, None] == 1, 40.0, 1.0), (len(z), d)
    ),
    "lognormal": lambda z, d, rng: np.exp(rng.normal(np.where(z[:, None] == 1, 3.0, 0.0), 0.5, (len(z), d))),
}


def _autoregressive(z: np.ndarray, d: int, rng: np.random.Generator) -> np.ndarray:
    """One sequence of the planted AR(1) states along the path ``z``: ``x_t = 0.5 x_{t-1} + e_t`` in state 0,
    ``x_t = -0.5 x_{t-1} + 6 + e_t`` in state 1 (settling at 0 and at 4), unit-variance noise ``e_t``, ``x_{-1}``
    zero."""
    frames, previous = np.zeros((len(z), d)), np.zeros(d)
    for t, state in enumerate(z):
        frames[t] = previous = np.where(state == 1, -0.5, 0.5) * previous + 6.0 * state + rng.normal(size=d)
    return frames


#: the registered families whose frames depend on the frames before them in their sequence (``sequence_rows``): an
#: HMM's emissions only, not a mixture's components. ``emit(z, n_features, rng)`` gives one sequence along the state
#: path ``z`` (:func:`make_family_sequences` draws them); tests/components/test_families.py runs ``check_family`` on
#: them, and tests/components/test_autoregressive.py has the autoregressive family's known answers
SEQUENCE_FAMILY_DATA = {"autoregressive": _autoregressive}
SEQUENCE_FAMILIES = frozenset(SEQUENCE_FAMILY_DATA)


def make_family_rows(family: str, n: int = 60, n_features: int = 2, *, seed: int = 0):
    """``(X (n, D), z (n,))``: rows from two planted components of ``family`` (``FAMILY_DATA``), taking turns."""
    rng = np.random.default_rng(seed)
    z = np.arange(n) % 2
    return np.asarray(FAMILY_DATA[family](z, n_features, rng), dtype=float), z


def make_family_sequences(family: str, n_sequences: int = 6, lengths=(4, 12), n_features: int = 2, *, seed: int = 0):
    """``(X, z)``: the sticky two-state chains of :func:`make_sequences` emitting rows of ``family`` (``FAMILY_DATA``),
    or each a sequence of a sequence family (``SEQUENCE_FAMILY_DATA``)."""
    rng = np.random.default_rng(seed)
    _, _, zs = make_sequences(n_sequences, lengths, n_features, seed=seed)
    emit = SEQUENCE_FAMILY_DATA[family] if family in SEQUENCE_FAMILY_DATA else FAMILY_DATA[family]
    return [np.asarray(emit(z, n_features, rng), dtype=float) for z in zs], zs


def make_expert_data(n: int = 80, n_features: int = 2, expert: str = "gaussian", *, seed: int = 0):
    """Two regimes split at ``x_0 = 0``: ``(X (n, D), y (n,))`` for a mixture of experts.

    Gaussian experts: ``y = 2 x_0`` left of 0, ``-3 x_0 + 1`` right of it, plus ``N(0, 0.1^2)`` noise;
    logistic experts: ``y ~ Bernoulli(sigmoid(3 x_0))`` left of 0 and ``Bernoulli(sigmoid(-3 x_0 + 1))`` right;
    Poisson experts: counts ``y ~ Poisson(exp(0.5 x_0 + 1))`` left of 0 and ``Poisson(exp(-0.8 x_0 + 2))`` right.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, size=(n, n_features))
    left = x[:, 0] < 0
    if expert == "gaussian":
        return x, np.where(left, 2 * x[:, 0], -3 * x[:, 0] + 1) + 0.1 * rng.normal(size=n)
    if expert == "poisson":
        return x, rng.poisson(np.exp(np.where(left, 0.5 * x[:, 0] + 1, -0.8 * x[:, 0] + 2))).astype(float)
    logit = np.where(left, 3 * x[:, 0], -3 * x[:, 0] + 1)
    return x, (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(float)


class StudentTMixture(MixtureModel):
    """A mixture a user writes: only the Pyro program, with proper priors and a fixed ``df``."""

    def __init__(self, n_components: int = 2, *, df: float = 3.0, seed: int | None = None, progress: bool = False):
        super().__init__(n_components, seed=seed, progress=progress)
        self.df = df

    def model(self, x: torch.Tensor) -> None:
        k, d = self.n_components, x.shape[1]
        w = pyro.sample("weights", dist.Dirichlet(torch.ones(k, dtype=x.dtype)))
        with pyro.plate("components", k):
            loc = pyro.sample("loc", dist.Normal(torch.zeros(d, dtype=x.dtype), 10.0).to_event(1))
            scale = pyro.sample("scale", dist.LogNormal(torch.zeros(d, dtype=x.dtype), 1.0).to_event(1))
        with self._data_plate(x.shape[0]) as idx:
            z = pyro.sample("z", dist.Categorical(w), infer={"enumerate": "parallel"})
            pyro.sample("x", dist.StudentT(self.df, loc[z], scale[z]).to_event(1), obs=x[idx])


class InlineExecutor(Executor):
    """An executor that runs every task here, at once, after :meth:`before` (a hook for faults: rewrite a shard,
    drop what a worker held); a task's exception is delivered through its future, as a real executor does."""

    def before(self, fn: Callable, args: tuple) -> None:
        """Called before every task (default: nothing)."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        self.before(fn, args)
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - delivered through the future
            future.set_exception(err)
        return future
