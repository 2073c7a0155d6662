"""Fits are scale-equivariant (issue 16, item 7): ``reg_covar`` is relative to each feature's variance and
k-means seeds in power-of-two rescaled coordinates, so ``X * c`` gives the labels of ``X`` and
log-likelihoods shifted by ``-D log c`` per row."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from ppmix.datasets import make_pf_synthetic
from ppmix.models import GMM, HMM
from ppmix.models._gaussian_components import relative_floor
from ppmix.models.pf.pf_gmm import PFGMM
from ppmix.ops.kmeans import kmeans_plusplus

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


PF_SCALES = [
    *SCALES[:3],
    pytest.param(
        1e-150, id="c1e-150", marks=pytest.mark.xfail(strict=True, reason="issue 16 item 7 open: PFGMM at 1e-150")
    ),
]


@pytest.mark.parametrize("c", PF_SCALES)
def test_pfgmm_is_scale_equivariant(c: float) -> None:
    data = make_pf_synthetic(200, n_relevant=2, n_features=4, seed=0)
    ref = _fit(PFGMM(3, seed=0, progress=False), data.X, data.y)
    scaled = _fit(PFGMM(3, seed=0, progress=False), data.X * c, data.y)
    np.testing.assert_array_equal(scaled.predict(data.X * c), ref.predict(data.X))


def test_kmeans_plusplus_float32_huge_scale_does_not_overflow() -> None:
    """The crash reproducer: squared distances at 1e20 overflow float32 inside k-means++."""
    x = torch.as_tensor(_blobs(), dtype=torch.float32)
    centres = kmeans_plusplus(x * 1e20, 2, torch.Generator().manual_seed(0))
    expected = kmeans_plusplus(x, 2, torch.Generator().manual_seed(0)) * 1e20
    torch.testing.assert_close(centres, expected, rtol=1e-6, atol=0.0)


@pytest.mark.xfail(
    strict=True, reason="issue 16 item 7 open: float32 x^2 moments overflow at 1e20 (FloatingPointError)"
)
def test_gmm_float32_at_1e20_fits_or_names_x() -> None:
    x = _blobs()
    try:
        _fit(GMM(2, seed=0, progress=False, dtype=torch.float32), x * 1e20)
    except ValueError as err:
        assert "X" in str(err)


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
