"""Sample weights of any finite scale fit (issue 49, item 6): float32 fits with weights of 1e39 or all of 1e-50 died
in the k-means start with torch's "invalid multinomial distribution" (the weights passed the float64 check, then
overflowed or underflowed when cast). Weights far from one are now rescaled by an exact power of two before the
cast (:func:`ppmix.models._weights.in_safe_range`), and the start draws from float64
weights divided by the power of two at their largest (:func:`ppmix.algorithms.kmeans.sampling_mass`)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix.models import GMM


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
