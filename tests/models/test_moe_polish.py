"""The L-BFGS polish after EM in MixtureOfExperts: the optimum that EM crawls to, in far fewer iterations; a monotone
history; the variance floor kept; EM's convergence warning replaced by the polish's verdict."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ppmix.datasets.moe import make_moe
from ppmix.engines.result import ConvergenceWarning
from ppmix.models.moe import MixtureOfExperts
from ppmix.models.moe_polish import polish

QUIET = {"progress": False, "split_merge": 0}


@pytest.fixture(scope="module")
def logistic_data():
    data = make_moe(600, expert="logistic", n_experts=2, n_features=2, seed=2)
    return data.X, data.y


def _gradient(model: MixtureOfExperts) -> float:
    """The largest partial derivative of the objective per point at the model's parameters (autograd)."""
    x, y = model._em_data(model._train_data)
    values = {name: value.clone().requires_grad_(True) for name, value in model._get_globals().items()}
    model._assign_globals(values)
    objective = model._penalised_log_likelihood(x, y) / len(y)
    grads = torch.autograd.grad(objective, list(values.values()))
    model._set_globals(values)
    return max(float(g.abs().max()) for g in grads)


def _fit(X, y, **options) -> MixtureOfExperts:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MixtureOfExperts(2, expert="logistic", seed=0, **QUIET, **options).fit(X, y)


def test_polish_reaches_the_optimum_that_em_crawls_to(logistic_data):
    """Known answer: plain EM from the same start needs about 3 000 iterations to converge (tol 0); 100 EM
    iterations then L-BFGS reach the same objective, a stationary point, in under 50 more."""
    X, y = logistic_data
    crawled = _fit(X, y, polish=False, max_iter=5000, tol=0.0)
    assert crawled.converged_ and crawled.n_iter_ > 2000
    short = _fit(X, y, polish=False, max_iter=100, tol=1e-12)
    polished = _fit(X, y, max_iter=100, tol=1e-12)
    assert short.lower_bound_ < crawled.lower_bound_ - 1e-6  # 100 EM iterations alone are far from it
    assert polished.lower_bound_ == pytest.approx(crawled.lower_bound_, abs=1e-10)
    assert polished.converged_ and polished.n_iter_ < 200
    assert _gradient(polished) < 1e-7 < _gradient(short)
    np.testing.assert_allclose(polished.predict_proba(X), crawled.predict_proba(X), atol=1e-5)


def test_polish_history_continues_em_and_never_falls(logistic_data):
    """``history_`` is EM's followed by one value per L-BFGS iteration, counted in ``n_iter_``; it never falls and
    ``lower_bound_`` is the penalised log-likelihood of the parameters returned (after the canonical reorder)."""
    X, y = logistic_data
    em = _fit(X, y, polish=False, max_iter=40, tol=0.0)
    polished = _fit(X, y, max_iter=40, tol=0.0)
    assert polished.history_[: len(em.history_)] == em.history_
    assert len(polished.history_) - polished.n_iter_ == len(em.history_) - em.n_iter_
    assert polished.n_iter_ > em.n_iter_
    assert (np.diff(polished.history_) >= 0).all()
    x, t = polished._em_data(polished._train_data)
    assert polished.lower_bound_ == pytest.approx(float(polished._penalised_log_likelihood(x, t)) / len(t), rel=1e-12)


def test_polish_converged_replaces_ems_warning(logistic_data):
    """EM stopped by ``max_iter`` warns; the polish that follows it and converges does not."""
    X, y = logistic_data
    settings = {"expert": "logistic", "seed": 0, "max_iter": 50, **QUIET}
    with pytest.warns(ConvergenceWarning, match="EM did not converge"):
        MixtureOfExperts(2, polish=False, **settings).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        assert MixtureOfExperts(2, **settings).fit(X, y).converged_
    with pytest.warns(ConvergenceWarning, match="L-BFGS polish did not converge"):
        MixtureOfExperts(2, expert="logistic", seed=0, max_iter=3, **QUIET).fit(X, y)


def test_polish_keeps_gaussian_experts_above_their_variance_floor():
    """An expert that fits its points exactly sits at the variance floor after EM; the polish, which optimises
    ``log(scale^2 - floor)``, keeps it there (or above) and still raises the objective."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(400, 1))
    y = np.where(X[:, 0] < 0, 2 * X[:, 0], -X[:, 0] + 1 + 0.5 * rng.normal(size=400))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        em = MixtureOfExperts(2, seed=0, polish=False, max_iter=30, **QUIET).fit(X, y)
        moe = MixtureOfExperts(2, seed=0, max_iter=30, **QUIET).fit(X, y)
    floor = moe._experts.min_variance
    assert float(em._experts.scale.square().min()) == pytest.approx(floor, rel=1e-9)  # the floor binds
    assert float(moe._experts.scale.square().min()) >= floor * (1 - 1e-12)
    assert moe.lower_bound_ > em.lower_bound_


def test_polish_alone_from_a_short_em_fit_raises_the_objective_monotonically(logistic_data):
    X, y = logistic_data
    moe = _fit(X, y, polish=False, max_iter=5)
    start = moe.lower_bound_
    history, converged = polish(moe, moe._em_data(moe._train_data), max_iter=500, tol=1e-12)
    assert converged and history[0] > start and (np.diff(history) >= 0).all()
    x, t = moe._em_data(moe._train_data)
    assert history[-1] == pytest.approx(float(moe._penalised_log_likelihood(x, t)) / len(t), rel=1e-12)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_polish_must_be_a_bool(value):
    with pytest.raises(ValueError, match="polish must be True or False"):
        MixtureOfExperts(2, polish=value, progress=False).fit(np.zeros((10, 1)), np.arange(10.0))


def test_split_and_merge_runs_warn_only_by_the_polishs_verdict(logistic_data):
    """The EM run after each split-and-merge move is polished too, so its ``max_iter`` stop is not reported: a fit
    with moves warns once at most, by the verdict of its last polish. Without the polish the moves' EM runs warn."""
    X, y = logistic_data
    settings = {"expert": "logistic", "seed": 0, "max_iter": 50, "progress": False, "split_merge": 2}

    def messages(**options) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            MixtureOfExperts(3, **{**settings, **options}).fit(X, y)
        return [str(w.message).split(" in ")[0] for w in caught]

    assert messages(polish=False) == ["EM did not converge"] * 3  # the first fit's and two moves' EM runs
    assert messages() == ["EM and its L-BFGS polish did not converge"]
    assert messages(max_iter=100) == []
