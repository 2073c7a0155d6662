"""Fits are scale-equivariant (issue 16, item 7): ``reg_covar`` is relative to each feature's variance and
k-means seeds in power-of-two rescaled coordinates, so ``X * c`` gives the labels of ``X`` and
log-likelihoods shifted by ``-D log c`` per row."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from ppmix.algorithms.kmeans import kmeans_plusplus
from ppmix.components.gaussian_family import relative_floor
from ppmix.datasets import make_pf_synthetic
from ppmix.models import GMM, HMM
from ppmix.models.pf.pf_gmm import PFGMM

SCALES = [pytest.param(c, id=f"c{c:g}") for c in (1e-6, 1e6, 1e20, 1e-150)]


def _blobs() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(size=(80, 2)), rng.normal(size=(80, 2)) + 5.0])


def _fit(model, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(*args)


@pytest.mark.parametrize("c", SCALES)
@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_gmm_float64_is_scale_equivariant(c: float, covariance_type: str) -> None:
    x = _blobs()
    ref = _fit(GMM(2, covariance_type=covariance_type, seed=0, progress=False), x)
    scaled = _fit(GMM(2, covariance_type=covariance_type, seed=0, progress=False), x * c)
    np.testing.assert_array_equal(scaled.predict(x * c), ref.predict(x))
    shift = -x.shape[1] * math.log(c)
    np.testing.assert_allclose(scaled.score_samples(x * c), ref.score_samples(x) + shift, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("c", [1e-6, 1e6])
def test_gmm_float32_is_scale_equivariant(c: float) -> None:
    x = _blobs()
    ref = _fit(GMM(2, seed=0, progress=False, dtype=torch.float32), x)
    scaled = _fit(GMM(2, seed=0, progress=False, dtype=torch.float32), x * c)
    np.testing.assert_array_equal(scaled.predict(x * c), ref.predict(x))


@pytest.mark.parametrize("c", SCALES)
def test_hmm_is_scale_equivariant(c: float) -> None:
    x = _blobs()
    seqs = [x[:100], x[100:]]
    ref = _fit(HMM(2, seed=0, progress=False), seqs)
    scaled = _fit(HMM(2, seed=0, progress=False), [s * c for s in seqs])
    for a, b in zip(scaled.predict([s * c for s in seqs]), ref.predict(seqs)):
        np.testing.assert_array_equal(a, b)
    shift = -x.shape[1] * math.log(c)
    np.testing.assert_allclose(scaled.score([s * c for s in seqs]), ref.score(seqs) + shift, rtol=1e-9)


@pytest.mark.parametrize("c", SCALES)
def test_pfgmm_is_scale_equivariant(c: float) -> None:
    """Labels, relevance and log-likelihoods (shifted by ``-D log c``); at 1e-150 the label test of the
    relevance start used an absolute variance floor (1e-12), so the start and the fit changed."""
    data = make_pf_synthetic(200, n_relevant=2, n_features=4, seed=0)
    ref = _fit(PFGMM(3, seed=0, progress=False), data.X, data.y)
    scaled = _fit(PFGMM(3, seed=0, progress=False), data.X * c, data.y)
    np.testing.assert_array_equal(scaled.predict(data.X * c), ref.predict(data.X))
    assert scaled.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(scaled.relevance_, ref.relevance_, rtol=1e-6)
    shift = -data.X.shape[1] * math.log(c)
    np.testing.assert_allclose(scaled.score_samples(data.X * c), ref.score_samples(data.X) + shift, rtol=1e-6)


def test_kmeans_plusplus_float32_huge_scale_does_not_overflow() -> None:
    """The crash reproducer: squared distances at 1e20 overflow float32 inside k-means++."""
    x = torch.as_tensor(_blobs(), dtype=torch.float32)
    centres = kmeans_plusplus(x * 1e20, 2, torch.Generator().manual_seed(0))
    expected = kmeans_plusplus(x, 2, torch.Generator().manual_seed(0)) * 1e20
    torch.testing.assert_close(centres, expected, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("c", [1e20, 1e-20])
def test_gmm_float32_out_of_range_names_x(c: float) -> None:
    """Variances of data at 1e20 (or 1e-20) are not float32 numbers: a clear error naming X, not a crash."""
    with pytest.raises(ValueError, match=r"X is too (large|small) for torch.float32.*float64"):
        _fit(GMM(2, seed=0, progress=False, dtype=torch.float32), _blobs() * c)


def test_the_range_check_refuses_nothing_that_fits() -> None:
    """float32 fits up to the edge of the check: just inside it the fit is the unscaled one."""
    x = _blobs()
    ref = _fit(GMM(2, seed=0, progress=False, dtype=torch.float32), x)
    scaled = _fit(GMM(2, seed=0, progress=False, dtype=torch.float32), x * 1e17)
    np.testing.assert_array_equal(scaled.predict(x * 1e17), ref.predict(x))


def test_a_warm_start_after_load_uses_the_relative_floor(tmp_path) -> None:
    """The floor is not saved; a loaded model refitted with ``warm_start`` floors relative to the new data."""
    x = np.random.default_rng(0).normal(size=(200, 2)) * 1e-4
    GMM(2, seed=0, progress=False).fit(x).save(tmp_path / "m")
    loaded = GMM.load(tmp_path / "m")
    loaded.warm_start = True
    loaded.fit(x)
    expected = relative_floor(torch.as_tensor(x), loaded.reg_covar)
    torch.testing.assert_close(torch.as_tensor(loaded.components_.reg_covar), expected)
    assert float(expected.max()) < 1e-12 < loaded.reg_covar  # the absolute floor would be far larger


def _two_rules(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two regions of the plane, each with its own linear rule for y."""
    x = np.random.default_rng(seed).normal(size=(n, 2))
    return x, np.where(x[:, 0] > 0, x[:, 1] > 0, x[:, 1] < 0).astype(float)


@pytest.mark.parametrize("c", [pytest.param(c, id=f"c{c:g}") for c in (1e-6, 1e6, 1e-150)])
@pytest.mark.parametrize("component", ["logistic", "linear"])
def test_presto_is_scale_equivariant(c: float, component: str) -> None:
    """PRESTO standardises internally: ``ridge``, ``epsilon`` and the router's ridge act the same at any
    scale (with the absolute ridge, data at 1e-6 gave chance-level test accuracy)."""
    from ppmix.optimizers.presto import PRESTO

    x, y = _two_rules(300, 0)
    x_test, _ = _two_rules(300, 1)
    y_scale = 1.0 if component == "logistic" else c
    ref = PRESTO(2, component, seed=0, progress=False).fit(x, y)
    scaled = PRESTO(2, component, seed=0, progress=False).fit(x * c, y * y_scale)
    np.testing.assert_array_equal(scaled.partition_, ref.partition_)
    expected = ref.predict(x_test) * y_scale
    np.testing.assert_allclose(scaled.predict(x_test * c), expected, rtol=1e-6, atol=1e-9 * y_scale)


def test_presto_standardize_false_is_the_raw_algorithm() -> None:
    """On data that are already standardised the two settings run the same algorithm."""
    from ppmix.optimizers.presto import PRESTO

    x, y = _two_rules(300, 0)
    x = (x - x.mean(0)) / x.std(0, ddof=1)
    on = PRESTO(2, seed=0, progress=False).fit(x, y)
    off = PRESTO(2, seed=0, progress=False, standardize=False).fit(x, y)
    np.testing.assert_array_equal(on.partition_, off.partition_)
    np.testing.assert_allclose(on.history_, off.history_, rtol=1e-9)


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_one_far_row_in_training_gives_scikit_learns_fit(covariance_type: str) -> None:
    """A row at 1e10 takes a component of its own (the maximum-likelihood answer); the other component's
    variance must still be exact. Its moments about the data mean (about 5e7) cancel about 15 digits: the
    variances came out as 11.0 and 11.5 instead of 10.07 and 9.95, and the far component's as 2.5e5
    instead of its floor. Such components are summed directly now."""
    from sklearn.mixture import GaussianMixture

    rng = np.random.default_rng(7)
    x = np.r_[rng.normal(size=(100, 2)), rng.normal(size=(100, 2)) + 6]
    with_outlier = np.r_[x, [[1e10, 1e10]]]
    ours = _fit(GMM(2, covariance_type=covariance_type, seed=0, progress=False), with_outlier)
    peer = GaussianMixture(2, covariance_type=covariance_type, random_state=0).fit(with_outlier)
    np.testing.assert_allclose(np.mean(ours.score_samples(x)), peer.score_samples(x).mean(), rtol=1e-7)
    far = int(np.argmin(ours.weights_.numpy()))
    variances = ours.covariances_.numpy()[far].reshape(-1)[:: 1 if covariance_type == "diag" else 3]
    np.testing.assert_allclose(variances, np.asarray(ours.components_.reg_covar), rtol=1e-9)
