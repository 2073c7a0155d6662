"""Sample weights scaled by a constant (issue 49, item 5): without a prior, a fit depends on the weights' ratios
only, so weights ``c * w`` give the fit of ``w`` (the same start, parameters, objective history and weighted score)
for every ``c`` from 1e-300 to 1e300, in every family and model that takes ``sample_weight``. Before, an absolute
guard (``10 eps`` added to every component's count) outweighed counts of 1e-14 and the fit at 1e-300 collapsed to
the overall mean."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix.engines.result import ConvergenceWarning
from tests.common import assert_close
from tests.models.test_contract import CASES, cases, fit

#: cases whose fit weighs the data against a prior or a penalty: there the weights are frequencies (an integer
#: weight is the row repeated, as in scikit-learn), so their total is the amount of data and scaling it changes the
#: fit by design (tests/models/test_contract.py checks them as repeated rows)
WEIGHED_AGAINST_A_PRIOR = {
    "HMM-left-right-MAP": "MAP-EM under transition_prior=2",
    "MoE-gaussian": "the gate's ridge penalty",
    "MoE-logistic": "the gate's ridge penalty",
    "MoE-poisson": "the gate's ridge penalty",
}

#: cases whose default start measures the data's spread as that of the rows repeated (Bessel-corrected by
#: ``sum w - 1``: ``column_moments``), so it moves by about 1e-3 between scales, and whose ``df`` converges too slowly
#: for a quick test to see both fits reach the same optimum; from the same start they are scale-free
START_SPREAD_COUNTS_FREQUENCIES = {"Mixture-student_t", "HMM-student_t"}

SCALE_FREE = [p for p in cases(("sample_weight",)) if p.values[0] not in WEIGHED_AGAINST_A_PRIOR]


def _weights(n: int, seed: int) -> np.ndarray:
    weight = np.random.default_rng(seed).uniform(0.2, 3.0, n)
    weight[np.random.default_rng(seed + 1).random(n) < 0.2] = 0.0  # some rows dropped
    weight[:2] = (1.0, 2.0)  # rows (sequences) of both planted clusters keep a positive weight
    return weight


def _fitted(case_id: str, x, y, weight: np.ndarray, start: dict | None = None, converge: bool = True):
    """The case's model fitted with ``weight``: from its default start to convergence (``tol=1e-10``; or for three
    EM iterations, without ``converge``), or for three EM iterations from ``start`` (a warm start after a
    one-iteration fit that records the weighted data's scale, the variance floor)."""
    case = CASES[case_id]
    model = case.make().set_params(tol=0.0, max_iter=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if start is None:
            model = model.set_params(tol=1e-10, max_iter=150) if converge else model
            return fit(case, model, x, y, sample_weight=weight)
        fit(case, model, x, y, sample_weight=weight, max_iter=1)
        model._set_globals(start)
        return fit(case, model, x, y, sample_weight=weight, warm_start=True)


def _score(case_id: str, model, x, y, weight: np.ndarray) -> float:
    if CASES[case_id].score_needs_y:
        return model.score(x, y, sample_weight=weight)
    return model.score(x, sample_weight=weight)


def _assert_same_fit(case_id: str, scaled, plain, x, y, weight: np.ndarray, scale: float, rtol: float) -> None:
    for site, value in plain._get_globals().items():
        assert_close(scaled._get_globals()[site], value, rtol=rtol, atol=rtol / 100, msg=f"{site} at scale {scale:g}")
    assert_close(scaled.lower_bound_, plain.lower_bound_, rtol=rtol, msg="objective per row")
    assert_close(_score(case_id, scaled, x, y, weight * scale), _score(case_id, plain, x, y, weight), rtol=rtol)


@pytest.mark.parametrize("case_id, item, variant", SCALE_FREE)
@settings(max_examples=2, deadline=None)
@given(exponent=st.integers(-300, 300), seed=st.integers(0, 2**16))
def test_weights_scaled_by_any_constant_give_the_same_fit(case_id, item, variant, exponent, seed):
    """From the default start at convergence, and from the same start to rounding (EM's three iterations from it
    amplify the weights' rounding to about 1e-9)."""
    x, y = CASES[case_id].data()
    weight = _weights(len(x), seed)
    scale = 10.0**exponent * (1.0 + seed / 2**17)  # not a power of two
    if case_id in START_SPREAD_COUNTS_FREQUENCIES:
        start = _fitted(case_id, x, y, weight, converge=False)._get_globals()
    else:
        plain = _fitted(case_id, x, y, weight)
        _assert_same_fit(case_id, _fitted(case_id, x, y, weight * scale), plain, x, y, weight, scale, rtol=1e-5)
        start = plain._get_globals()
    plain, scaled = _fitted(case_id, x, y, weight, start), _fitted(case_id, x, y, weight * scale, start)
    _assert_same_fit(case_id, scaled, plain, x, y, weight, scale, rtol=1e-7)


@pytest.mark.parametrize("case_id", ["GMM-diag", "Mixture-poisson"])
@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_float32_fits_take_weights_of_any_scale(case_id, scale):
    """Weights beyond float32's range (1e-300, 1e300) are rescaled in float64 before the model's dtype holds them."""
    import torch

    case = CASES[case_id]
    x, y = case.data()
    weight = _weights(len(x), 0)
    make = case.make
    plain = _fitted_in(make, case, x, y, weight)
    scaled = _fitted_in(make, case, x, y, weight * scale)
    for site, value in plain._get_globals().items():
        assert torch.isfinite(scaled._get_globals()[site]).all(), site
        assert_close(scaled._get_globals()[site], value, rtol=1e-4, atol=1e-5, msg=site)


def _fitted_in(make, case, x, y, weight):
    import torch

    model = make().set_params(tol=0.0, max_iter=3, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fit(case, model, x, y, sample_weight=weight)
