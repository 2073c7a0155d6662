"""Every registered density family, through every structure and engine that takes one.

Every family in ``ppmix.components.registry.FAMILIES`` passes ``ppmix.testing.check_family`` (the weighted M-step
maximises the weighted log-likelihood, EM's objective is Pyro's ``TraceEnum_ELBO`` at the same parameters, EM on
three ``.npy``/``.npz`` shards equals EM in memory, integer weights are repeated rows or sequences, save/load): the
families of rows on rows (``tests.common.FAMILY_DATA``) in ``Mixture`` and ``HMM``, the sequence families on
sequences (``tests.common.SEQUENCE_FAMILY_DATA``) in ``HMM``. Over the families of rows, planted components are
found by ``Mixture`` and ``HMM``, ``partial_fit`` approaches the batch fit, SVI reaches EM's optimum and MCMC gives
ArviZ its draws. The contract suite (``tests/models/test_contract.py``) adds predictions, save/load, ``to_arviz``
and bad input.
"""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch
from pyro.distributions.transforms import biject_to
from sklearn.metrics import adjusted_rand_score

from ppmix import HMM, Mixture
from ppmix.components.family import FamilyPriors
from ppmix.components.family_tools import has_map_update
from ppmix.components.poisson import PoissonFamily, PoissonPriors
from ppmix.components.registry import FAMILIES, family_from
from ppmix.distributed import fit_em
from ppmix.models.selection import select_components
from ppmix.testing import _write_shards as write_shards  # the shards check_family writes
from ppmix.testing import check_family
from tests.common import (
    FAMILY_DATA,
    SEQUENCE_FAMILIES,
    SEQUENCE_FAMILY_DATA,
    assert_close,
    make_family_rows,
    make_family_sequences,
)

NAMES = sorted(FAMILY_DATA)
QUIET = {"seed": 0, "progress": False}


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _structure(structure: str, name: str, **options):
    if structure == "Mixture":
        return Mixture(2, family=name, **QUIET, **options)
    return HMM(2, emission=name, **QUIET, **options)


def _data(structure: str, name: str, n_features: int = 2, size: int = 300):
    """``size`` rows, or sequences of ``size`` steps in all (12 to 40 of them, of 10 to 30 steps)."""
    if structure == "Mixture":
        return make_family_rows(name, size, n_features)
    return make_family_sequences(name, max(2, size // 25), (10, 30), n_features)


STRUCTURES = pytest.mark.parametrize("structure", ["Mixture", "HMM"])
FAMILY = pytest.mark.parametrize("name", NAMES)
#: SVI and NUTS run every family in a Mixture, and in an HMM the Gaussian and one discrete family: the HMM's
#: program hands every family's sites and distribution to the same code (its TraceEnum_ELBO equals Baum-Welch
#: for every family, above), and its chain over time is what makes these engines slow, not the family
PYRO_ENGINE_CASES = pytest.mark.parametrize(
    "structure, name", [("Mixture", name) for name in NAMES] + [("HMM", "gaussian"), ("HMM", "categorical")]
)


def test_every_registered_family_has_test_data():
    """Rows for a family of rows, sequences for a sequence family (one that declares ``sequence_rows``): every
    registered family has one or the other, so ``check_family`` runs on each."""
    assert set(FAMILY_DATA) | set(SEQUENCE_FAMILY_DATA) == set(FAMILIES), "add the new family's data to tests.common"
    assert not set(FAMILY_DATA) & set(SEQUENCE_FAMILY_DATA)
    assert all(hasattr(family_from(name), "sequence_rows") for name in SEQUENCE_FAMILY_DATA)
    assert not any(hasattr(family_from(name), "sequence_rows") for name in FAMILY_DATA)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_registered_family_passes_check_family(name):
    """``ppmix.testing.check_family``, which a user's family runs too: the contract, the M-step against perturbed
    parameters, EM's objective = Pyro's ``TraceEnum_ELBO``, EM on shards = EM in memory, integer weights = rows
    (``Mixture``) or sequences (``HMM``) repeated, save/load; in ``Mixture`` and ``HMM`` on 300 rows, or for a
    sequence family (no MAP-EM update either) in ``HMM`` on 12 sequences of 10 to 40 frames."""
    if name in SEQUENCE_FAMILIES:
        data, _ = make_family_sequences(name, 12, (10, 40), 2)
    else:
        data, _ = make_family_rows(name, 300, 2)
    check_family(family_from(name), data)


@STRUCTURES
@FAMILY
def test_planted_components_are_recovered(structure, name):
    x, z = _data(structure, name, n_features=8)  # enough features to tell the components apart in every family
    model = _quiet(_structure(structure, name).fit, x)
    predicted = model.predict(x)
    if structure == "HMM":
        predicted, z = np.concatenate(predicted), np.concatenate(z)
    assert adjusted_rand_score(z, predicted) >= 0.95  # the planted components overlap a little in some families


@STRUCTURES
@FAMILY
def test_partial_fit_on_chunks_approaches_the_batch_fit(structure, name):
    x, _ = _data(structure, name)
    batch = _quiet(_structure(structure, name).fit, x)
    online = _structure(structure, name)
    chunks = np.array_split(np.arange(len(x)), 6)
    for _ in range(10):
        for chunk in chunks:
            part = x[chunk] if structure == "Mixture" else [x[i] for i in chunk]
            _quiet(online.partial_fit, part)
    assert online.score(x) >= batch.score(x) - 0.02  # online EM may also end higher, at a better optimum


@PYRO_ENGINE_CASES
def test_svi_reaches_the_em_optimum(structure, name):
    x, _ = _data(structure, name)
    em = _quiet(_structure(structure, name).fit, x)
    svi = _quiet(_structure(structure, name).fit, x, engine="svi", num_steps=150, lr=0.1)
    assert svi.score(x) == pytest.approx(em.score(x), abs=1e-2)


@PYRO_ENGINE_CASES
def test_mcmc_draws_reach_arviz(structure, name):
    x = make_family_rows(name, 40)[0] if structure == "Mixture" else make_family_sequences(name, 4, (4, 8))[0]
    # shallow trees: the test is that draws of every site reach ArviZ, not that the chain mixes
    model = _quiet(_structure(structure, name).fit, x, engine="mcmc", num_samples=10, warmup_steps=10, max_tree_depth=4)
    posterior = model.to_arviz().posterior
    for site in model._component_family().sites(2, 2):
        assert posterior[site].sizes["draw"] == 10
        assert np.isfinite(posterior[site].values).all()


@FAMILY
def test_bic_selects_the_planted_number_of_components(name):
    """``select_components`` (by BIC, through the family's ``n_parameters``) finds the two planted components of
    every family: the criteria work for every family."""
    x, _ = _data("Mixture", name)
    selection = _quiet(select_components, _structure("Mixture", name), x, ks=[1, 2, 3])
    assert selection.best_k == 2, selection.scores


# ------------------------------------------------------------------ priors= and MAP-EM
def _map_answer(name: str, x: np.ndarray) -> np.ndarray:
    """The one-component MAP of ``x`` under ``MAP_PRIORS[name]``, in closed form (the parameter ``means_``
    reports, or the level probabilities)."""
    n = x.shape[0]
    if name == "poisson":  # Gamma(3, 2)
        return (x.sum(0) + 3 - 1) / (n + 2)
    if name == "exponential":  # Gamma(3, 2) on the rate: the mean 1 / rate
        return (x.sum(0) + 2) / (n + 3 - 1)
    if name == "bernoulli":  # Beta(3, 2)
        return (x.sum(0) + 3 - 1) / (n + 3 + 2 - 2)
    if name == "lognormal":  # on log x: the fixed point of the diagonal Gaussian's two conditional modes
        logs = np.log(x)
        xbar, scatter, (m0, s0, a, b) = logs.mean(0), logs.var(0) * n, MAP_PRIORS[name].values()
        loc, var = xbar, logs.var(0)
        for _ in range(200):
            loc = (m0 / s0**2 + n * xbar / var) / (1 / s0**2 + n / var)
            var = (2 * b + scatter + n * (xbar - loc) ** 2) / (2 * a + 2 + n)
        return np.exp(loc + var / 2)
    if name == "multinomial":  # Dirichlet(3)
        pseudo = x.sum(0) + 3 - 1
        return pseudo / pseudo.sum()
    levels = int(x.max()) + 1  # categorical, Dirichlet(3) on every feature's levels
    counts = np.stack([(x == c).sum(0) for c in range(levels)], axis=-1)
    return (counts + 3 - 1) / (n + levels * (3 - 1))


MAP_PRIORS = {
    "poisson": {"rate_concentration": 3.0, "rate_rate": 2.0},
    "exponential": {"rate_concentration": 3.0, "rate_rate": 2.0},
    "bernoulli": {"probs_concentration1": 3.0, "probs_concentration0": 2.0},
    "multinomial": {"probs_concentration": 3.0},
    "categorical": {"probs_concentration": 3.0},
    "lognormal": {"locs_loc": 0.5, "locs_scale": 0.7, "variance_concentration": 4.0, "variance_rate": 3.0},
}


@pytest.mark.parametrize("name", sorted(MAP_PRIORS))
def test_map_em_of_one_component_is_the_conjugate_posterior_mode(name):
    x, _ = make_family_rows(name, 40, 3)
    mix = Mixture(1, family=name, priors=MAP_PRIORS[name], tol=1e-14, max_iter=500, **QUIET).fit(x)
    got = mix.components_.probs if name == "categorical" else mix.means_
    want = _map_answer(name, x)
    # lognormal: two conditional modes, so EM (ECM) stops short of the fixed point by about sqrt(tol) in the means
    assert_close(got[0], torch.as_tensor(want, dtype=torch.float64), rtol=1e-8 if name == "lognormal" else 1e-10)
    # the objective is the log posterior: log-likelihood plus the log prior (the weight's Dirichlet(1) is 0)
    family = mix._prior_family()
    log_prior = family.priors().map_log_prior(mix.components_, mix.n_features_in_, mix._scale)
    assert mix.history_[-1] * len(x) == pytest.approx(mix.log_likelihood(x) + float(log_prior), rel=1e-10)


@pytest.mark.parametrize("name", ["bernoulli", "categorical", "multinomial"])
def test_flat_default_priors_make_map_em_maximum_likelihood(name):
    """Beta(1, 1), Dirichlet(1): the default priors of these families are uniform, so MAP-EM with every default
    (``priors={}``) is the maximum-likelihood fit, while ``priors=None`` is today's fit, untouched."""
    x, _ = make_family_rows(name, 120, 3)
    ml = Mixture(2, family=name, **QUIET).fit(x)
    map_fit = Mixture(2, family=name, priors={}, **QUIET).fit(x)
    assert_close(map_fit.weights_, ml.weights_, rtol=1e-9)
    assert_close(map_fit.means_, ml.means_, rtol=1e-9, atol=1e-12)


#: priors worth a million rows, and the means they pin: Poisson rates at 5; log-normal ``log x`` at mean 1 and
#: variance 0.25 (``E x = exp(1 + 0.25 / 2)``); Student-t locations and the Gaussians of a ``gmm`` at 3; gamma shapes
#: at 4 and rates at 2 (means 2)
STRONG_PRIORS = {
    "gamma": (
        {
            "concentration_loc": math.log(4.0),
            "concentration_scale": 1e-4,
            "rate_loc": math.log(2.0),
            "rate_scale": 1e-4,
        },
        2.0,
    ),
    "gmm": ({"locs_loc": 3.0, "locs_scale": 1e-3}, 3.0),
    "student_t": ({"locs_loc": 3.0, "locs_scale": 1e-3}, 3.0),
    "poisson": ({"rate_concentration": 1e6 * 5.0 + 1, "rate_rate": 1e6}, 5.0),
    "lognormal": (
        {"locs_loc": 1.0, "locs_scale": 1e-3, "variance_concentration": 1e6, "variance_rate": (1e6 + 1) * 0.25},
        float(np.exp(1.125)),
    ),
}


@pytest.mark.parametrize("name", sorted(STRONG_PRIORS))
@pytest.mark.parametrize("structure", ["Mixture", "HMM"])
def test_map_em_never_decreases_the_log_posterior_and_a_strong_prior_pins_the_means(structure, name):
    x, _ = _data(structure, name, 2, 300)
    prior, mean = STRONG_PRIORS[name]
    model = _structure(structure, name, priors={**prior, "weights" if structure == "Mixture" else "initial": 4.0})
    _quiet(model.fit, x, max_iter=50, tol=0.0)
    assert np.all(np.diff(model.history_) >= -1e-9 * abs(model.history_[-1]))
    assert_close(model.means_, torch.full((2, 2), mean, dtype=torch.float64), rtol=1e-3)


#: families whose MAP-EM is not one closed-form mode: log-normal and the mixtures of diagonal Gaussians (two
#: conditional modes), Student-t (ECM, df by a root find), full scale matrices and gamma (Newton steps)
NUMERICAL_MAP = pytest.mark.parametrize(
    "family",
    [
        family_from("lognormal"),
        family_from("student_t"),
        family_from("student_t", covariance_type="full"),
        family_from("gmm"),
        family_from("gmm", covariance_type="full"),
        family_from("gamma"),
    ],
    ids=["lognormal", "student_t", "student_t-full", "gmm", "gmm-full", "gamma"],
)
#: priors that matter (Gaussian keys; the t's df; gamma's log-normal shapes)
GAUSSIAN_PRIORS = {"locs_scale": 5.0, "variance_rate": 0.3}
SOME_PRIORS = {"student_t": {**GAUSSIAN_PRIORS, "df_concentration": 3.0}, "gamma": {"concentration_scale": 1.0}}
#: priors worth almost nothing
GAUSSIAN_WEAK = {"locs_scale": 1e3, "variance_concentration": 1e-3, "variance_rate": 1e-8}
WEAK_PRIORS = {
    "student_t": {**GAUSSIAN_WEAK, "df_concentration": 1.0, "df_rate": 1e-8},
    "gamma": {"concentration_scale": 1e3, "rate_scale": 1e3},
}


def _log_posterior_gradient(mix: Mixture, x: np.ndarray) -> float:
    """The largest gradient entry of log-likelihood plus the components' ``map_log_prior`` by autograd, over the
    unconstrained coordinates (``biject_to`` of each site's support) of the program's sites (the weights held)."""
    family = mix._prior_family()
    specs = family.sites(mix.n_components, mix.n_features_in_)
    values = family.site_values(mix.components_)
    free = {
        site: biject_to(specs[site].support).inv(value).detach().requires_grad_(True) for site, value in values.items()
    }
    components = family.components({site: biject_to(specs[site].support)(v) for site, v in free.items()}, mix._scale)
    log_prob = components.log_prob(family.prepare(torch.as_tensor(x)))
    log_posterior = torch.logsumexp(log_prob + mix.weights_.log(), 1).sum()
    log_posterior = log_posterior + family.priors().map_log_prior(components, mix.n_features_in_, mix._scale)
    return max(float(g.abs().max()) for g in torch.autograd.grad(log_posterior, list(free.values())))


@NUMERICAL_MAP
def test_map_em_converges_to_a_stationary_point_of_the_log_posterior(family):
    x, _ = make_family_rows(family.name, 300, 2)
    priors = SOME_PRIORS.get(family.name, GAUSSIAN_PRIORS)
    mix = _quiet(Mixture(2, family=family, priors=priors, tol=1e-13, max_iter=1000, **QUIET).fit, x)
    assert np.all(np.diff(mix.history_) >= -1e-12 * abs(mix.history_[-1]))
    assert _log_posterior_gradient(mix, x) < 1e-3
    ml = _quiet(Mixture(2, family=family, **QUIET).fit, x)
    ml.priors = priors
    assert _log_posterior_gradient(ml, x) > 0.1  # the maximum-likelihood fit is not one


@NUMERICAL_MAP
def test_a_weak_prior_gives_the_maximum_likelihood_fit(family):
    """Up to the inverse-gamma's ``v^-1`` (two rows' worth in the variances; the log-normal's ``a^-1`` in gamma
    shapes), which moves the t's ``df`` (its tails' estimate) by about 1 %."""
    x, _ = make_family_rows(family.name, 1000, 2)
    ml = _quiet(Mixture(2, family=family, tol=1e-9, **QUIET).fit, x)
    weak = WEAK_PRIORS.get(family.name, GAUSSIAN_WEAK)
    fit = _quiet(Mixture(2, family=family, priors=weak, tol=1e-9, **QUIET).fit, x)
    assert_close(fit.means_, ml.means_, rtol=5e-3, atol=1e-3)
    for name, value in ml.components_.state_dict().items():
        assert_close(
            fit.components_.state_dict()[name], value, rtol=2e-2 if name == "df" else 1e-2, atol=1e-3, msg=name
        )


@pytest.mark.parametrize(
    "priors, match",
    [
        ({"rate_shape": 1.0}, r"priors has an unknown key 'rate_shape'.*'rate_concentration'"),
        ({"rate_rate": -1.0}, r"priors\['rate_rate'\] must be positive"),
        ({"weights": 0.5}, r"priors\['weights'\] must be at least 1 for engine='em'"),
        ({"weights": -1.0}, r"priors\['weights'\] must be positive"),
        ({"weights": "two"}, r"priors\['weights'\] must be a finite number"),
        ({"rate_rate": [1.0, 2.0, 3.0]}, r"priors\['rate_rate'\] must be a number or broadcast to shape \(2,\)"),
        ([1.0], "priors must be None or a dict"),
    ],
)
def test_bad_priors_are_errors_naming_priors(priors, match):
    x, _ = make_family_rows("poisson", 40, 2)
    with pytest.raises((ValueError, TypeError), match=match):
        Mixture(2, family="poisson", priors=priors, **QUIET).fit(x)


class _NoMapPriors(PoissonPriors):
    """A user's priors without a MAP update (every built-in family has one)."""

    map_update = FamilyPriors.map_update


class _NoMapPoisson(PoissonFamily):
    """A user's family whose priors write no MAP update."""

    name = "no_map_poisson"

    def priors(self) -> _NoMapPriors:
        return _NoMapPriors(self)


def test_map_em_is_refused_where_a_family_has_no_map_update_online_em_too():
    assert all(has_map_update(family_from(name)) for name in set(FAMILIES) - SEQUENCE_FAMILIES)
    x, _ = make_family_rows("poisson", 40, 2)
    for fit in (
        Mixture(2, family=_NoMapPoisson(), priors={"weights": 2.0}, **QUIET).fit,
        Mixture(2, family=_NoMapPoisson(), priors={"weights": 2.0}, **QUIET).partial_fit,
    ):
        with pytest.raises(ValueError, match="MAP-EM, which has no M-step for the 'no_map_poisson' family"):
            fit(x)
    holed = np.array(x, dtype=float)
    holed[3, 0] = np.nan  # MAP-EM's M-step takes complete rows only; the samplers take none with holes either
    with pytest.raises(ValueError, match="no M-step for rows with missing entries .* impute or drop those entries"):
        Mixture(2, family="poisson", missing="marginalize", priors={}, **QUIET).fit(holed)


@STRUCTURES
def test_map_em_on_three_shards_equals_map_em_in_memory(structure, tmp_path):
    """The log prior is no sum over the rows: every shard leaves it out and the driver adds it once."""
    x, _ = _data(structure, "poisson")
    prior = {"rate_concentration": 3.0, "rate_rate": 0.5, "weights" if structure == "Mixture" else "transition": 2.0}
    start = _quiet(_structure(structure, "poisson", priors=prior).fit, x, max_iter=2)
    start.warm_start = True
    in_memory = _quiet(copy.deepcopy(start).fit, x, max_iter=5, tol=0.0)
    sharded = _quiet(
        fit_em, copy.deepcopy(start), write_shards(structure, x, tmp_path), executor="inline", max_iter=5, tol=0.0
    )
    np.testing.assert_allclose(sharded.history_, in_memory.history_, rtol=1e-10)
    for key, value in in_memory._state_tensors().items():
        np.testing.assert_allclose(sharded._state_tensors()[key].numpy(), value.numpy(), rtol=1e-9, atol=1e-12)
