"""Inputs at the edges: any memory layout, odd dtypes and values, and sequence ids.

Every estimator takes ``X`` (and ``y``) in any memory layout — negative strides (``X[::-1]``,
``np.flip``), Fortran order, strided slices, read-only arrays, non-contiguous tensors — and gives
the same result as on the C-contiguous copy. Values it cannot use are refused with an error that
names the argument (``X``, ``y``, ``seed``, ``sequence_column``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppmix import GMM, HMM, HSMM, PFGMM, PFHMM, Mixture, MixtureOfExperts, SupervisedGMM
from ppmix.inference import PRESTO, RegularizedWeighting

rng = np.random.default_rng(3)
X = np.r_[rng.normal(size=(30, 3)), rng.normal(size=(30, 3)) + 5]
Y_BINARY = (X[:, 0] + 0.3 * rng.normal(size=len(X)) > 2.5).astype(float)
Y_REAL = np.where(X[:, 0] > 2.5, 2.0 * X[:, 1], -X[:, 1]) + 0.1 * rng.normal(size=len(X))
COUNTS = rng.poisson(np.where(X[:, :1] > 2.5, 8.0, 1.0), size=X.shape).astype(float)


def _quiet(call: Callable[..., Any], *args: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call(*args)


def _seqs(x: np.ndarray) -> list[np.ndarray]:
    return [x[:25], x[25:]]


# name -> (make the estimator, X, y or None, sequence model?, methods to compare; ":y" for those given y too)
ESTIMATORS: dict[str, tuple[Callable[[], Any], np.ndarray, np.ndarray | None, bool, tuple[str, ...]]] = {
    "GMM-full": (lambda: GMM(2, covariance_type="full", seed=0, progress=False), X, None, False,
                 ("predict", "predict_proba", "score_samples", "score")),
    "Mixture-poisson": (lambda: Mixture(2, family="poisson", seed=0, progress=False), COUNTS, None, False,
                        ("predict", "predict_proba", "score")),
    "HMM": (lambda: HMM(2, seed=0, progress=False), X, None, True, ("predict", "predict_proba", "score")),
    "HSMM": (lambda: HSMM(2, max_duration=8, seed=0, progress=False), X, None, True,
             ("predict", "predict_proba", "score_samples")),
    "PFGMM": (lambda: PFGMM(2, switch_prior=0.5, n_restarts=1, seed=0, progress=False), X, Y_BINARY, False,
              ("predict", "predict_proba", "score_samples")),
    "SupervisedGMM": (lambda: SupervisedGMM(2, seed=0, progress=False), X, Y_BINARY, False,
                      ("predict", "predict_proba")),
    "PFHMM": (lambda: PFHMM(2, seed=0, progress=False), X, Y_BINARY, True, ("predict", "predict_proba")),
    "MixtureOfExperts": (lambda: MixtureOfExperts(2, seed=0, progress=False), X, Y_REAL, False,
                         ("predict", "predict_components")),
    "PRESTO": (lambda: PRESTO(2, component="logistic", seed=0, progress=False), X, Y_BINARY, False,
               ("predict", "predict_proba")),
    "RW": (lambda: RegularizedWeighting(2, learner="regression", n_init=1, seed=0, progress=False), X, Y_REAL, False,
           ("predict:y",)),
}  # fmt: skip


def _fit(name: str, x: Any, y: Any) -> Any:
    make, _, _, sequential, _ = ESTIMATORS[name]
    estimator = make()
    if sequential:
        x, y = _seqs(x), (None if y is None else _seqs(y))
    return _quiet(estimator.fit, x) if y is None else _quiet(estimator.fit, x, y)


def _outputs(name: str, estimator: Any, x: Any) -> list[np.ndarray]:
    _, _, y, sequential, methods = ESTIMATORS[name]
    x = _seqs(x) if sequential else x
    out = []
    for method in methods:
        args = (x, y) if method.endswith(":y") else (x,)
        got = _quiet(getattr(estimator, method.removesuffix(":y")), *args)
        parts = got if isinstance(got, list) else [got]
        out.extend(np.asarray(p.cpu() if isinstance(p, torch.Tensor) else p, float) for p in parts)
    return out


FITTED = {name: _fit(name, spec[1], spec[2]) for name, spec in ESTIMATORS.items()}


@st.composite
def layouts(draw: st.DrawFn, base: np.ndarray) -> Any:
    """``base``'s values in a drawn memory layout: reversed axes, steps, Fortran order, read-only, or a tensor."""
    steps = tuple(draw(st.integers(1, 3)) for _ in base.shape)
    as_tensor = draw(st.booleans()) and draw(st.booleans())
    reverse = (False,) * base.ndim if as_tensor else tuple(draw(st.booleans()) for _ in base.shape)
    buffer = np.zeros(tuple(n * s for n, s in zip(base.shape, steps)), order=draw(st.sampled_from("CF")))
    if as_tensor:  # torch has no negative strides: a strided, possibly Fortran-ordered, view
        view = torch.from_numpy(buffer)[tuple(slice(None, None, s) for s in steps)]
        view[...] = torch.as_tensor(base)
        return view
    view = buffer[tuple(slice(None, None, s) for s in steps)][tuple(slice(None, None, -1 if r else 1) for r in reverse)]
    view[...] = base
    if draw(st.booleans()):
        view.setflags(write=False)
    return view


def _assert_same(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_predictions_take_any_memory_layout(name):
    _, x, _, _, _ = ESTIMATORS[name]
    expected = _outputs(name, FITTED[name], x)

    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(laid_out=layouts(x))
    def same_outputs(laid_out):
        _assert_same(_outputs(name, FITTED[name], laid_out), expected)

    same_outputs()


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_fit_takes_reversed_strided_arrays(name):
    _, x, y, _, _ = ESTIMATORS[name]

    def odd(a: np.ndarray) -> np.ndarray:  # reversed, strided, Fortran-ordered where 2-D
        buffer = np.zeros(tuple(2 * n for n in a.shape), order="F")
        view = buffer[(slice(None, None, -2),) * a.ndim]
        view[...] = a
        return view

    fitted = _fit(name, odd(x), None if y is None else odd(y))
    _assert_same(_outputs(name, fitted, x), _outputs(name, FITTED[name], x))


def test_forward_backward_takes_reversed_log_probabilities():
    from ppmix.algorithms.forward_backward import forward_backward

    log_emit = np.log(rng.uniform(size=(2, 6, 3)))
    log_init, log_trans = np.log(np.full(3, 1 / 3)), np.log(np.full((3, 3), 1 / 3))
    reversed_view = log_emit[:, ::-1].copy()[:, ::-1]
    got = forward_backward(log_init, log_trans, reversed_view, lengths=np.array([6, 4])[::-1][::-1])
    expected = forward_backward(log_init, log_trans, log_emit, lengths=np.array([6, 4]))
    torch.testing.assert_close(got.log_likelihood, expected.log_likelihood)


# ----------------------------------------------------------------------------- values and dtypes at the edges


def test_a_missing_sequence_id_is_an_error_naming_the_column_and_row():
    import pandas as pd

    from ppmix._validation import InvalidDataError

    frame = pd.DataFrame(X, columns=["a", "b", "c"]).assign(run=np.repeat([1.0, 2.0, 3.0], 20))
    frame.loc[13, "run"] = np.nan
    frame.loc[40, "run"] = None
    model = HMM(2, sequence_column="run", seed=0, progress=False)
    with pytest.raises(InvalidDataError, match=r"sequence_column 'run' has 2 missing sequence id\(s\).*row 13"):
        model.fit(frame)
    fitted = _quiet(HMM(2, sequence_column="run", seed=0, progress=False).fit, frame.dropna())
    with pytest.raises(InvalidDataError, match="row 13"):
        fitted.predict(frame)


def test_a_date_or_duration_column_is_refused_by_name():
    import pandas as pd

    frame = pd.DataFrame(X[:, :2], columns=["a", "b"]).assign(when=pd.date_range("2020", periods=len(X)))
    with pytest.raises(TypeError, match=r"date/time or duration columns \['when'\]"):
        GMM(2, progress=False).fit(frame)
    with pytest.raises(TypeError, match=r"\['lag'\]"):
        GMM(2, progress=False).fit(frame.drop(columns="when").assign(lag=pd.to_timedelta(np.arange(len(X)), "s")))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exponent=st.integers(155, 307), row=st.integers(0, len(X) - 1), sign=st.sampled_from([-1.0, 1.0]))
def test_finite_values_too_large_for_the_dtype_are_refused_honestly(exponent, row, sign):
    """Finite rows near 1e155-1e307 gave NaN probabilities, raw OverflowErrors or 'contains NaN or infinite'."""
    from ppmix._validation import InvalidDataError

    big = X.copy()
    big[row, 1] = sign * 10.0**exponent
    for make, data in (
        (lambda: GMM(2, seed=0, progress=False), big),
        (lambda: GMM(2, covariance_type="full", seed=0, progress=False), big),
        (lambda: HMM(2, seed=0, progress=False), [big]),
    ):
        with pytest.raises(InvalidDataError, match=r"X is too large for torch\.float64") as info:
            make().fit(data)
        assert "NaN" not in str(info.value)
    with pytest.raises(InvalidDataError, match=r"X is too large for torch\.float64"):
        PFGMM(2, switch_prior=0.5, n_restarts=1, seed=0, progress=False).fit(big, Y_BINARY)
    with pytest.raises(InvalidDataError, match=rf"X holds values that overflow torch\.float32 \(first at row {row}, "):
        GMM(2, dtype=torch.float32, seed=0, progress=False).fit(big)


def test_nan_and_inf_are_named_with_their_first_row_and_column():
    import pandas as pd

    from ppmix._validation import InvalidDataError

    bad = pd.DataFrame(X, columns=["a", "b", "c"])
    bad.loc[7, "b"] = np.inf
    with pytest.raises(
        InvalidDataError, match=r"X contains NaN or infinite values \(first at row 7, column 'b': inf\)"
    ):
        GMM(2, progress=False).fit(bad)


@pytest.mark.parametrize("fit", [
    lambda y: PFGMM(2, switch_prior=0.5, n_restarts=1, seed=0, progress=False).fit(X, y),
    lambda y: SupervisedGMM(2, seed=0, progress=False).fit(X, y),
], ids=["PFGMM", "SupervisedGMM"])  # fmt: skip
@pytest.mark.parametrize("infinite", [np.inf, -np.inf])
def test_an_infinite_label_is_no_class(fit, infinite):
    from ppmix._validation import InvalidDataError

    y = np.where(Y_BINARY == 1, infinite, 0.0)
    with pytest.raises(InvalidDataError, match=r"y contains infinite values \(e\.g\. -?inf\)"):
        fit(y)


@pytest.mark.parametrize("name", ["GMM", "HMM", "PFGMM"])
@pytest.mark.parametrize("change", ["n_components", "n_features"])
def test_a_warm_start_of_another_shape_fits_from_scratch(name, change):
    """``warm_start`` with another K or feature count kept the old K (while the BIC counted the new) or
    raised a raw size mismatch; it now fits from scratch, with a warning, exactly as a cold fit would."""
    make = {
        "GMM": lambda k, **kw: GMM(k, seed=0, progress=False, **kw),
        "HMM": lambda k, **kw: HMM(k, seed=0, progress=False, **kw),
        "PFGMM": lambda k, **kw: PFGMM(k, switch_prior=0.5, n_restarts=1, seed=0, progress=False, **kw),
    }[name]

    def fit(model, x):
        return _quiet(model.fit, *(([x],) if name == "HMM" else (x, Y_BINARY) if name == "PFGMM" else (x,)))

    model = fit(make(2, warm_start=True), X)
    k, x = (3, X) if change == "n_components" else (2, X[:, :2])
    model.set_params(n_components=k)
    with pytest.warns(UserWarning, match="warm_start=True, but the fitted parameters do not have the shapes"):
        model.fit(*(([x],) if name == "HMM" else (x, Y_BINARY) if name == "PFGMM" else (x,)))
    cold = fit(make(k), x)
    assert model.n_features_in_ == x.shape[1]
    for site, value in cold._get_globals().items():
        torch.testing.assert_close(model._get_globals()[site], value)


def test_a_warm_start_of_the_same_shape_still_continues():
    model = _quiet(GMM(2, warm_start=True, max_iter=3, seed=0, progress=False).fit, X)
    before = model.lower_bound_
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _quiet(model.fit, X)
    assert model.history_[0] == pytest.approx(before, rel=1e-12)


ALL_SEEDED = {
    "GMM": lambda seed: GMM(2, seed=seed, progress=False).fit(X),
    "HMM": lambda seed: HMM(2, seed=seed, progress=False).fit([X]),
    "PFGMM": lambda seed: PFGMM(2, switch_prior=0.5, n_restarts=1, seed=seed, progress=False).fit(X, Y_BINARY),
    "MixtureOfExperts": lambda seed: MixtureOfExperts(2, n_init=1, seed=seed, progress=False).fit(X, Y_REAL),
    "PRESTO": lambda seed: PRESTO(2, component="logistic", seed=seed, progress=False).fit(X, Y_BINARY),
    "RW": lambda seed: RegularizedWeighting(2, n_init=1, seed=seed, progress=False).fit(X),
}


@pytest.mark.parametrize("name", sorted(ALL_SEEDED))
def test_a_seed_out_of_range_is_an_error_naming_it(name):
    @settings(max_examples=4, deadline=None)
    @given(seed=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63), st.just(np.uint64(2**64 - 1))))
    def refused(seed):
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*63 - 1\]"):
            ALL_SEEDED[name](seed)

    refused()
    for seed in (True, 1.5):
        with pytest.raises(TypeError, match="seed must be an integer or None"):
            ALL_SEEDED[name](seed)


def test_the_largest_seed_fits_and_is_reproducible():
    first, again = (_quiet(ALL_SEEDED["GMM"], 2**63 - 1) for _ in range(2))
    assert first.is_fitted and np.isfinite(first.lower_bound_)
    np.testing.assert_array_equal(first.means_.numpy(), again.means_.numpy())


def test_longdouble_input_is_taken_as_float64():
    from ppmix._validation import InvalidDataError

    expected = FITTED["GMM-full"].predict_proba(X)
    np.testing.assert_array_equal(FITTED["GMM-full"].predict_proba(X.astype(np.longdouble)), expected)
    if np.finfo(np.longdouble).max > np.finfo(np.float64).max:  # x86: 80-bit long double
        huge = X.astype(np.longdouble)
        huge[2, 0] = np.longdouble(10.0) ** 400
        with pytest.raises(
            InvalidDataError, match=r"X holds long double \(float\d+\) values beyond float64.s range \(e\.g\. 1e\+400\)"
        ):
            GMM(2, progress=False).fit(huge)


@pytest.mark.parametrize("make", [
    lambda **kw: GMM(2, progress=False, **kw),
    lambda **kw: PFGMM(2, switch_prior=0.5, n_restarts=1, progress=False, **kw),
], ids=["GMM", "PFGMM"])  # fmt: skip
@pytest.mark.parametrize(("name", "value", "error"), [
    ("reg_covar", float("inf"), ValueError), ("reg_covar", float("nan"), ValueError), ("reg_covar", -1.0, ValueError),
    ("reg_covar", "1e-6", TypeError), ("tol", "1e-3", TypeError), ("tol", float("nan"), ValueError),
])  # fmt: skip
def test_a_bad_setting_is_an_error_naming_it(make, name, value, error):
    """reg_covar=inf failed as 'EM objective became nan ... larger variance floor'; tol='a' without naming tol."""
    with pytest.raises(error, match=rf"^{name} must"):
        make(**{name: value}).fit(X, Y_BINARY)
