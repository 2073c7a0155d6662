"""A near-constant feature gets the variance floor in every family that has one (issue 49, item 1).

A column that is constant up to rounding (sixty copies of 0.1, whose centred variance is ~1e-34, or
``c * (1 + a few eps)``) has no spread: its floor is the absolute ``reg_covar``, never the relative
``reg_covar * spread**2`` of rounding noise (1e-40, which added ~39 nats per row to every score). Where the
family's density factorises over the features within a component (diagonal, full and tied Gaussians, whose
fitted covariance is block-diagonal on such a column; log-normal; Gaussian-mixture components; HMM emissions),
each of its components puts that column at ``N(c, reg_covar)``, so the fit of the other columns is the fit
without it and the score rises by exactly ``-log(2 pi reg_covar) / 2`` per row (log-normal: less ``log c``, the
Jacobian of ``log x``). A column that is mostly constant (a pixel blank in most images) takes its spread from the
rows that move: 1.4826 times their lower-median deviation from the median.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix import GMM, HMM, Mixture
from ppmix._validation import InvalidDataError
from ppmix.components.gaussian_family import check_squared_range, relative_floor, weighted_data_scale
from ppmix.models.pf.pf_gmm import PFGMM, SupervisedGMM
from ppmix.models.pf.pf_hmm import PFHMM

REG_COVAR = 1e-6
#: the score of a column put at N(c, reg_covar) in every component, per row
COLUMN_SCORE = -0.5 * math.log(2 * math.pi * REG_COVAR)
SCALES = st.sampled_from([1e-3, 0.1, 1.0, 7.0, 3e3, 1e6])
#: None: exactly constant; else the column is c * (1 + k eps) with k drawn from -ulps..ulps
ROUNDING = st.sampled_from([None, 1, 4])
N_ROWS = 60
#: EM iterations of each fit: the floor, monotonicity and the score's gain hold after any number
MAX_ITER = 20


def _rest(seed: int) -> np.ndarray:
    """Two well separated 2-feature clusters of 30 rows each."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(0.0, 1.0, (30, 2)), rng.normal(6.0, 1.0, (30, 2))])


def _near_constant(c: float, ulps: int | None, seed: int) -> np.ndarray:
    if ulps is None:
        return np.full(N_ROWS, c)
    k = np.random.default_rng(seed + 1).integers(-ulps, ulps + 1, N_ROWS)
    return c * (1.0 + k * np.finfo(np.float64).eps)


def _fit(model, x, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: the property is about the floor
        return model.fit(x, *args)


def _column_variances(components, d: int) -> torch.Tensor:
    """The fitted variance of feature ``d`` in every component (and inner component), flattened."""
    if hasattr(components, "scale_tril"):
        tril = components.scale_tril
        return (tril @ tril.mT)[..., d, d].flatten()
    return components.scale[..., d].square().flatten()


def _sequences(x: np.ndarray) -> list[np.ndarray]:
    return [x[:30], x[30:]]


#: (model, whether the data are sequences, whether the density factorises over features within a component)
FAMILIES = {
    "gaussian-diag": (lambda: GMM(2, covariance_type="diag", seed=0, max_iter=MAX_ITER, progress=False), False, True),
    "gaussian-full": (lambda: GMM(2, covariance_type="full", seed=0, max_iter=MAX_ITER, progress=False), False, True),
    "gaussian-tied": (lambda: GMM(2, covariance_type="tied", seed=0, max_iter=MAX_ITER, progress=False), False, True),
    "gaussian-spherical": (
        lambda: GMM(2, covariance_type="spherical", seed=0, max_iter=MAX_ITER, progress=False),
        False,
        False,
    ),
    "student_t-diag": (lambda: Mixture(2, family="student_t", seed=0, max_iter=MAX_ITER, progress=False), False, False),
    "student_t-full": (
        lambda: Mixture(
            2, family={"name": "student_t", "covariance_type": "full"}, seed=0, max_iter=MAX_ITER, progress=False
        ),
        False,
        False,
    ),
    "lognormal": (lambda: Mixture(2, family="lognormal", seed=0, max_iter=MAX_ITER, progress=False), False, True),
    "gmm": (
        lambda: Mixture(2, family={"name": "gmm", "n_mix": 2}, seed=0, max_iter=MAX_ITER, progress=False),
        False,
        True,
    ),
    "hmm-gaussian-full": (
        lambda: HMM(2, covariance_type="full", seed=0, max_iter=MAX_ITER, progress=False),
        True,
        True,
    ),
    "hmm-gmm": (
        lambda: HMM(2, emission={"name": "gmm", "n_mix": 2}, seed=0, max_iter=MAX_ITER, progress=False),
        True,
        True,
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
@settings(max_examples=6, deadline=None)
@given(c=SCALES, ulps=ROUNDING, seed=st.integers(0, 3))
def test_a_near_constant_column_gets_the_absolute_floor(family: str, c: float, ulps: int | None, seed: int) -> None:
    make, sequences, factorises = FAMILIES[family]
    rest = _rest(seed)
    column = _near_constant(c, ulps, seed)
    if family == "lognormal":
        rest = np.exp(rest / 3.0)
    with_column = np.c_[rest, column]
    data_with, data_without = (_sequences(v) if sequences else v for v in (with_column, rest))
    model = _fit(make(), data_with)  # full and tied: no "not positive definite" on valid data
    assert float(model._scale["floor"][-1]) == pytest.approx(REG_COVAR, rel=1e-12)
    assert bool((_column_variances(model.components_, 2) >= REG_COVAR * (1 - 1e-9)).all())
    steps = np.diff(np.asarray(model.history_))
    assert steps.min(initial=0.0) >= -1e-9 * max(1.0, float(np.abs(model.history_).max()))  # EM stays monotone
    if factorises:
        expected = COLUMN_SCORE - (math.log(c) if family == "lognormal" else 0.0)
        gain = model.score(data_with) - _fit(make(), data_without).score(data_without)
        assert gain == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("model", [PFGMM, SupervisedGMM, PFHMM])
@settings(max_examples=5, deadline=None)
@given(c=SCALES, ulps=ROUNDING)
def test_the_pf_models_refuse_a_column_constant_to_rounding(model, c: float, ulps: int | None) -> None:
    """The pf models refuse a constant feature by name; a column constant up to rounding is one."""
    x = np.c_[_rest(0), _near_constant(c, ulps, 0)]
    y = np.repeat([0, 1], 30)
    data, labels = (_sequences(x), _sequences(y)) if model is PFHMM else (x, y)
    with pytest.raises(InvalidDataError, match=r"constant feature\(s\) \[2\]"):
        model(2, seed=0, progress=False).fit(data, labels)


def _moving_floor(column: np.ndarray) -> float:
    """The floor of a mostly constant column, written out: ``reg_covar`` times the square of 1.4826 times the
    lower median of the deviations from the (lower) median of the rows that deviate."""
    median = np.sort(column)[(len(column) - 1) // 2]
    moving = np.sort(np.abs(column - median)[column != median])
    return REG_COVAR * (1.4826 * moving[(len(moving) - 1) // 2]) ** 2


@pytest.mark.parametrize("model", ["gmm", "pfgmm"])
@settings(max_examples=8, deadline=None)
@given(c=SCALES, moving=st.integers(1, 20), seed=st.integers(0, 3))
def test_a_mostly_constant_column_is_floored_by_its_moving_rows(model: str, c: float, moving: int, seed: int) -> None:
    """A column at ``c`` in all rows but ``moving`` (fewer than half): its floor is the deviating rows' spread,
    at any scale, and every fitted variance of it is at least that floor."""
    rng = np.random.default_rng(seed)
    column = np.full(N_ROWS, c)
    column[rng.choice(N_ROWS, moving, replace=False)] += c * rng.integers(1, 5, moving)
    x = np.c_[_rest(seed), column]
    floor = _moving_floor(column)
    assert float(relative_floor(torch.as_tensor(x), REG_COVAR)[-1]) == pytest.approx(floor, rel=1e-9)
    if model == "gmm":
        fitted = _fit(GMM(2, seed=0, max_iter=MAX_ITER, progress=False), x)
    else:
        fitted = _fit(PFGMM(2, switch_prior=1.0, seed=0, max_iter=MAX_ITER, progress=False), x, np.repeat([0, 1], 30))
    assert float(fitted._scale["floor"][-1]) == pytest.approx(floor, rel=1e-9)
    assert bool((_column_variances(fitted.components_, 2) >= floor * (1 - 1e-9)).all())


def test_the_issue_example_scores_the_constant_column_at_the_floor() -> None:
    """``GMM(2).fit(np.c_[x, np.full(60, 0.1)])``: the column's variance is ``reg_covar`` (was 1.9e-40) and the
    score is that of ``x`` alone plus ``-log(2 pi reg_covar) / 2`` (4.68, was 43.4)."""
    x = np.random.default_rng(0).normal(size=60)
    model = GMM(2, seed=0, progress=False).fit(np.c_[x, np.full(60, 0.1)])
    alone = GMM(2, seed=0, progress=False).fit(x[:, None]).score(x[:, None])
    assert model.covariances_[:, 1].tolist() == pytest.approx([REG_COVAR, REG_COVAR], rel=1e-12)
    assert model.score(np.c_[x, np.full(60, 0.1)]) == pytest.approx(alone + COLUMN_SCORE, abs=1e-9)
    assert 4.0 < alone + COLUMN_SCORE < 5.0


def test_the_floor_function_known_answers() -> None:
    """relative_floor and weighted_data_scale, column by column: a normal spread (1.4826 times the median absolute
    deviation), a constant column and one constant to rounding (the absolute floor), a mostly blank column (the
    moving rows' spread); the weighted scale equals that of the rows repeated."""
    x = torch.tensor(
        [[0.0, 5.0, 0.1, 0.0], [2.0, 5.0, 0.1 * (1 + 2e-16), 0.0], [4.0, 5.0, 0.1, 3.0], [9.0, 5.0, 0.1, 0.0]],
        dtype=torch.float64,
    )
    expected = [1e-2 * (1.4826 * 2.0) ** 2, 1e-2, 1e-2, 1e-2 * (1.4826 * 3.0) ** 2]
    assert relative_floor(x, 1e-2).tolist() == pytest.approx(expected, rel=1e-12)
    weight = torch.tensor([2.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    repeated = relative_floor(x[[0, 0, 2, 3]], 1e-2)
    assert torch.allclose(weighted_data_scale(x, weight, 1e-2)["floor"], repeated, rtol=1e-12, atol=0.0)


def test_a_float32_column_constant_to_rounding_is_not_refused_as_too_small() -> None:
    """float32 data whose third column is 1e-15 up to rounding: its rounding noise squared (~1e-44) is below the
    smallest normal float32, but a feature without spread is not refused, and it gets the absolute floor."""
    eps = float(np.finfo(np.float32).eps)
    column = 1e-15 * (1.0 + np.random.default_rng(0).integers(-2, 3, N_ROWS) * eps)
    x = torch.as_tensor(np.c_[_rest(0), column], dtype=torch.float32)
    assert float(x[:, 2].max() - x[:, 2].min()) > 0  # rounding noise, not an exact constant
    check_squared_range(x)
    assert float(relative_floor(x, REG_COVAR)[-1]) == pytest.approx(REG_COVAR, rel=1e-6)
