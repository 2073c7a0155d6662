"""MixtureOfExperts with softmax (multinomial logistic) experts: any number of classes, the same program and EM."""

from __future__ import annotations

import numpy as np
import pytest

from ppmix.distributed import fit_distributed
from ppmix.models.moe import MixtureOfExperts
from tests.common import assert_close, assert_em_objective_is_trace_enum_elbo

QUIET = {"seed": 0, "progress": False}


def regions(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three classes by ``x_1`` bands, in reverse order right of ``x_0 = 0``: one softmax model per half fits it."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, size=(n, 2))
    band = np.digitize(x[:, 1], [-1.0, 1.0])
    return x, np.array(["low", "mid", "top"])[np.where(x[:, 0] < 0, band, 2 - band)]


def test_recovers_two_multiclass_regimes_with_any_labels():
    x, y = regions(600)
    xt, yt = regions(2000, seed=1)
    moe = MixtureOfExperts(2, expert="softmax", **QUIET).fit(x, y)
    assert moe.classes_.tolist() == ["low", "mid", "top"]
    assert moe.score(xt, yt) > 0.97
    proba = np.asarray(moe.predict_proba(xt))
    assert proba.shape == (2000, 3)
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    assert set(moe.predict(xt).tolist()) <= {"low", "mid", "top"}
    assert moe.n_parameters == 1 * 3 + 2 * 2 * 3  # gate (K-1)(P+1); experts K(C-1)(P+1)


def test_two_classes_match_logistic_experts():
    """A softmax expert over two classes is a logistic expert: the same EM reaches the same fit."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 3, size=(400, 2))
    y = (rng.random(400) < 1 / (1 + np.exp(-np.where(x[:, 0] < 0, 3 * x[:, 1], -3 * x[:, 1] + 1)))).astype(int)
    options = {"n_init": 1, "split_merge": 0, "tol": 1e-10, "max_iter": 300, **QUIET}
    logistic = MixtureOfExperts(2, expert="logistic", **options).fit(x, y)
    softmax = MixtureOfExperts(2, expert="softmax", **options).fit(x, y)
    assert softmax.log_likelihood(x, y) == pytest.approx(logistic.log_likelihood(x, y), rel=1e-6)
    assert_close(np.asarray(softmax.predict_proba(x)), np.asarray(logistic.predict_proba(x)), atol=1e-4, rtol=0)


@pytest.mark.filterwarnings("ignore:EM did not converge")
def test_em_objective_equals_pyro_trace_enum_elbo():
    x, y = regions(200)
    moe = MixtureOfExperts(2, expert="softmax", max_iter=5, **QUIET).fit(x, y)
    assert_em_objective_is_trace_enum_elbo(moe, x, y)


def test_save_load_and_the_distributed_fit_refuses(tmp_path):
    x, y = regions(300)
    moe = MixtureOfExperts(2, expert="softmax", **QUIET).fit(x, y)
    loaded = MixtureOfExperts.load(moe.save(tmp_path / "moe"))
    assert loaded.classes_.tolist() == moe.classes_.tolist()
    np.testing.assert_array_equal(loaded.predict(x), moe.predict(x))
    assert_close(np.asarray(loaded.predict_proba(x)), np.asarray(moe.predict_proba(x)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="OT reduction has no softmax experts"):
        fit_distributed([(x, y)], 2, expert="softmax", executor="inline")
    with pytest.raises(ValueError, match=r"1 class\(es\).*two or more"):
        MixtureOfExperts(2, expert="softmax", **QUIET).fit(x, np.zeros(300))
