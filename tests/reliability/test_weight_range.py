"""Sample weights of any finite scale fit (issue 49, item 6): float32 fits with weights of 1e39 or all of 1e-50 died
in the k-means start with torch's "invalid multinomial distribution" (the weights passed the float64 check, then
overflowed or underflowed when cast). Weights beyond the square root of the dtype's range are now rescaled by a
power of two before the cast (:func:`ppmix.models.base.weights_in_dtype`), and the start draws from float64
weights divided by the power of two at their largest (:func:`ppmix.ops.kmeans.sampling_mass`)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix.models import GMM
from ppmix.models.base import weights_in_dtype


def _blobs() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(size=(60, 2)), rng.normal(size=(60, 2)) + 5.0])


@settings(max_examples=12, deadline=None)
@given(exponent=st.integers(-300, 300), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_gmm_fits_weights_of_any_scale_in_either_dtype(exponent, dtype):
    """The fit runs and is finite (that it is the same fit at every scale is the weights' own property)."""
    x = _blobs()
    weight = np.random.default_rng(1).uniform(0.5, 2.0, len(x)) * 10.0**exponent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gmm = GMM(2, seed=0, progress=False, dtype=dtype).fit(x, sample_weight=weight)
    assert math.isfinite(gmm.lower_bound_)
    assert torch.isfinite(gmm.means_).all() and torch.isfinite(gmm.covariances_).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weights_within_the_dtypes_range_are_cast_as_they_are_and_others_rescaled_by_a_power_of_two(dtype):
    info = torch.finfo(dtype)
    inside = torch.tensor([math.sqrt(info.max), 3.0, math.sqrt(info.tiny)], dtype=torch.float64)
    assert torch.equal(weights_in_dtype(inside, dtype), inside.to(dtype))
    for largest in (math.sqrt(info.max) * 4, math.sqrt(info.tiny) / 4, 1e300, 1e-300):
        weight = torch.tensor([largest, largest / 3], dtype=torch.float64)
        cast = weights_in_dtype(weight, dtype)
        assert 0.5 <= float(cast[0]) < 1.0 and float(cast[1]) == pytest.approx(float(cast[0]) / 3, rel=1e-6)
