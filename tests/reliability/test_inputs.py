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

from ppmix import GMM, HMM, PFGMM, PFHMM, Mixture, MixtureOfExperts, SupervisedGMM
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
    "PFGMM": (lambda: PFGMM(2, n_restarts=1, seed=0, progress=False), X, Y_BINARY, False,
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

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    from ppmix.inference.engines.forward_backward import forward_backward

    log_emit = np.log(rng.uniform(size=(2, 6, 3)))
    log_init, log_trans = np.log(np.full(3, 1 / 3)), np.log(np.full((3, 3), 1 / 3))
    reversed_view = log_emit[:, ::-1].copy()[:, ::-1]
    got = forward_backward(log_init, log_trans, reversed_view, lengths=np.array([6, 4])[::-1][::-1])
    expected = forward_backward(log_init, log_trans, log_emit, lengths=np.array([6, 4]))
    torch.testing.assert_close(got.log_likelihood, expected.log_likelihood)
