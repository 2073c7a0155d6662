"""Bad input gets a clear error naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

from ppmix import GMM
from ppmix._validation import NotFittedError

X = np.random.default_rng(0).normal(size=(30, 2))


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (np.where(np.eye(30, 2) > 0, np.nan, X), ValueError, "X contains NaN"),
        (np.where(np.eye(30, 2) > 0, np.inf, X), ValueError, "X contains NaN or infinite"),
        (X[:, 0], ValueError, "X must be 2-D.*reshape"),
        (X[None], ValueError, "X must be 2-D"),
        (np.array([["a", "b"], ["c", "d"]]), TypeError, "X must be a real numeric"),
        (np.array([[1, None], [2, 3]], dtype=object), TypeError, "X must be a real numeric"),
        (np.zeros((0, 2)), ValueError, "X is empty"),
    ],
    ids=["nan", "inf", "1d", "3d", "strings", "object", "empty"],
)
def test_bad_training_data(bad, error, match):
    with pytest.raises(error, match=match):
        GMM(2, progress=False).fit(bad)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"n_components": 31}, ValueError, "n_components=31 is larger than the number of samples"),
        ({"n_components": 0}, ValueError, "n_components must be >= 1"),
        ({"n_components": 2.5}, TypeError, "n_components must be an integer"),
        ({"n_components": 2, "covariance_type": "spherical"}, ValueError, "covariance_type"),
        ({"n_components": 2, "init_params": "magic"}, ValueError, "init_params"),
        ({"n_components": 2, "reg_covar": -1.0}, ValueError, "reg_covar"),
        ({"n_components": 2, "max_iter": 0}, ValueError, "max_iter"),
    ],
    ids=["k>n", "k<1", "k-float", "cov-type", "init", "reg", "max_iter"],
)
def test_bad_parameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        GMM(progress=False, **kwargs).fit(X)


def test_y_is_rejected_for_unsupervised_model():
    with pytest.raises(ValueError, match="y must be None"):
        GMM(2, progress=False).fit(X, np.zeros(30))


@pytest.mark.parametrize("method", ["predict", "predict_proba", "score_samples", "score", "bic"])
def test_predicting_before_fit(method):
    with pytest.raises(NotFittedError, match="not fitted"):
        getattr(GMM(2), method)(X)


def test_wrong_feature_count_at_predict_time():
    gmm = GMM(2, seed=0, progress=False).fit(X)
    with pytest.raises(ValueError, match="X has 3 features, but the model was fitted with 2"):
        gmm.predict(np.zeros((4, 3)))


def test_bad_engine_options():
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        GMM(2, progress=False).fit(X, engine="svi", num_steps=0)
    with pytest.raises(ValueError, match="guide must be"):
        GMM(2, progress=False).fit(X, engine="svi", guide="flow", num_steps=2)
    with pytest.raises(ValueError, match="tol must be non-negative"):
        GMM(2, progress=False).fit(X, tol=-1.0)
