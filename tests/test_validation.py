"""Bad input gets a clear error naming the argument."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ppmix import GMM, HMM, Mixture, MixtureOfExperts
from ppmix._validation import NotFittedError, check_matrix, resolve_device
from tests.common import requires_cuda

X = np.random.default_rng(0).normal(size=(30, 2))


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (np.where(np.eye(30, 2) > 0, np.nan, X), ValueError, "X contains NaN"),
        (np.where(np.eye(30, 2) > 0, np.inf, X), ValueError, "X contains NaN or infinite"),
        (X[:, 0], ValueError, "X must be 2-D.*reshape"),
        (X[None], ValueError, "X must be 2-D"),
        (np.array([["a", "b"], ["c", "d"]]), TypeError, "X must be a real numeric"),
        (np.array([[1, None], [2, 3]], dtype=object), ValueError, "X contains NaN"),  # None is NaN, as in sklearn
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
        ({"n_components": 2, "covariance_type": "circular"}, ValueError, "covariance_type"),
        ({"n_components": 2, "init_params": "magic"}, ValueError, "init_params"),
        ({"n_components": 2, "reg_covar": -1.0}, ValueError, "reg_covar"),
        ({"n_components": 2, "max_iter": 0}, ValueError, "max_iter"),
    ],
    ids=["k>n", "k<1", "k-float", "cov-type", "init", "reg", "max_iter"],
)
def test_bad_parameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        GMM(progress=False, **kwargs).fit(X)


@pytest.mark.parametrize("structure", ["GMM", "Mixture", "HMM", "MixtureOfExperts"])
def test_a_numpy_integer_count_fits_as_the_python_integer(structure):
    """``n_components=np.int8(2)`` (numpy's smallest integer, as a grid search over ``np.arange`` can pass): the
    same fit, BIC included, as ``2``, with no overflow in the start's sample size or the parameter count."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 130))  # K * D beyond int8
    y = x[:, 0] + rng.normal(size=60)

    def fit(k):
        options = {"seed": 0, "progress": False, "max_iter": 3}
        if structure == "HMM":
            return HMM(k, **options).fit([x[:30], x[30:]])
        if structure == "MixtureOfExperts":
            return MixtureOfExperts(k, **options, n_init=1, split_merge=0, polish=False).fit(x[:, :3], y)
        model = GMM(k, **options) if structure == "GMM" else Mixture(k, family="poisson", **options)
        return model.fit(x if structure == "GMM" else np.abs(np.round(3 * x)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small, plain = fit(np.int8(2)), fit(2)
    assert small.n_parameters == plain.n_parameters
    assert small.history_ == plain.history_


def test_y_is_ignored_by_an_unsupervised_model():
    """scikit-learn's convention (pipelines and cross-validation pass y to every step)."""
    with_y = GMM(2, seed=0, progress=False).fit(X, np.zeros(30))
    assert with_y.lower_bound_ == GMM(2, seed=0, progress=False).fit(X).lower_bound_
    assert with_y.score(X, np.ones(30)) == with_y.score(X)


@pytest.mark.parametrize("method", ["predict", "predict_proba", "score_samples", "score", "bic"])
def test_predicting_before_fit(method):
    with pytest.raises(NotFittedError, match="not fitted"):
        getattr(GMM(2), method)(X)


def test_wrong_feature_count_at_predict_time():
    gmm = GMM(2, seed=0, progress=False).fit(X)
    with pytest.raises(ValueError, match="X has 3 features, but it is expecting 2 features as input"):
        gmm.predict(np.zeros((4, 3)))


def test_bad_engine_options():
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        GMM(2, progress=False).fit(X, engine="svi", num_steps=0)
    with pytest.raises(ValueError, match="guide must be"):
        GMM(2, progress=False).fit(X, engine="svi", guide="flow", num_steps=2)
    with pytest.raises(ValueError, match="tol must be non-negative"):
        GMM(2, progress=False).fit(X, tol=-1.0)


# ------------------------------------------------------------------ devices
def test_resolve_device_cpu_forms():
    assert resolve_device(None) == resolve_device("cpu") == resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ("gpu", ValueError, "map_location must be a torch.device or a device string such as .*; got 'gpu'"),
        (1.5, TypeError, "map_location must be None, a string, an integer or a torch.device; got float"),
        (True, TypeError, "map_location must be None, a string, an integer or a torch.device; got bool"),
    ],
    ids=["unknown-type", "float", "bool"],
)
def test_resolve_device_bad_values_name_the_argument(bad, error, match):
    with pytest.raises(error, match=f"^{match}$"):
        resolve_device(bad, "map_location")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
@pytest.mark.parametrize("cuda", ["cuda", "cuda:1", torch.device("cuda", 0)], ids=["cuda", "cuda:1", "device"])
def test_cuda_without_gpu_is_a_clear_value_error_for_every_caller(cuda):
    name = str(cuda)
    message = rf"device='{name}' asks for CUDA, but torch.cuda.is_available\(\) is False: .*; use device='cpu'"
    with pytest.raises(ValueError, match=f"^{message}$"):
        resolve_device(cuda)
    with pytest.raises(ValueError, match=r"^router_device='cuda"):
        resolve_device(cuda, "router_device")
    # the callers: check_matrix, the mixture models (GMM) and the sequence models (HMM)
    with pytest.raises(ValueError, match=message):
        check_matrix(X, device=cuda)
    with pytest.raises(ValueError, match=message):
        GMM(2, progress=False, device=cuda).fit(X)
    with pytest.raises(ValueError, match=message):
        HMM(2, progress=False, device=cuda).fit([X])


@requires_cuda
def test_resolve_device_cuda_index_must_exist():
    count = torch.cuda.device_count()
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device(f"cuda:{count - 1}") == torch.device("cuda", count - 1)
    with pytest.raises(ValueError, match=rf"^device='cuda:{count}' asks for CUDA device {count}, but only {count} are"):
        resolve_device(f"cuda:{count}")
    tensor, _ = check_matrix(X, device="cuda")
    assert tensor.device.type == "cuda"
