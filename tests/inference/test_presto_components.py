"""PRESTO with user ``torch.nn.Module`` components, and components trained on an executor."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from ppmix.datasets.presto import make_presto_synthetic
from ppmix.optimizers.presto.components import LinearSVMComponent, MLPComponent, check_torch_component
from ppmix.optimizers.presto.estimator import PRESTO
from tests.common import assert_close


def corrupted_start(truth: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The true partition of two parts with ``fraction`` of the points moved to the other part."""
    rng = np.random.default_rng(seed)
    start = truth.copy()
    flip = rng.random(truth.shape[0]) < fraction
    start[flip] = 1 - start[flip]
    return start


def two_classifiers(n: int = 240, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x uniform on the square for both regimes; regime 0: y = [x1 > 0], regime 1: y = [x2 > 0]."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    regime = np.arange(n) % 2
    y = np.where(regime == 0, x[:, 0] > 0, x[:, 1] > 0).astype(np.int64)
    return x, y, regime


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_linear_svm_components_recover_two_classifiers(dtype):
    x, y, regime = two_classifiers()
    svm = LinearSVMComponent(2, ridge=1e-3, lr=0.05, epochs=150, dtype=dtype)
    model = PRESTO(2, svm, epsilon=0.0, leeway=None, init=corrupted_start(regime, 0.25, 1), seed=0, progress=False)
    model.fit(x, y)
    part = model.partition_
    # where the two rules disagree (quadrants II and IV) the regime is identifiable: all must be recovered
    disagree = (x[:, 0] > 0) != (x[:, 1] > 0)
    matches = [(part[disagree] == regime[disagree]).mean(), (part[disagree] != regime[disagree]).mean()]
    assert max(matches) == 1.0
    # every point sits in a part whose SVM classifies it correctly (the SVMs see standardised x)
    scaled = (torch.as_tensor(x) - model.scales_["x_mean"]) / model.scales_["x_scale"]
    own = torch.stack([m.predict(scaled.to(dtype)) for m in model.components_], dim=1)
    assert (own[np.arange(len(y)), part].numpy() == y).all()
    assert isinstance(model.components_, torch.nn.ModuleList) and len(model.components_) == 2
    assert all(m.linear.weight.dtype == dtype for m in model.components_)  # PRESTO casts the data, not the module
    assert np.isfinite(model.history_).all()


def test_mlp_components_recover_two_regressions():
    rng = np.random.default_rng(0)
    n = 160
    x = rng.uniform(-1, 1, size=(n, 1))
    regime = np.arange(n) % 2
    y = np.where(regime == 0, x[:, 0] ** 2, 1.5 - x[:, 0] ** 2) + 0.02 * rng.normal(size=n)
    mlp = MLPComponent(1, hidden=8, task="regression", lr=0.05, epochs=300, seed=0)
    model = PRESTO(2, mlp, epsilon=0.0, leeway=0.2, init=corrupted_start(regime, 0.25, 2), seed=0, progress=False)
    model.fit(x, y)
    assert adjusted_rand_score(regime, model.partition_) > 0.85
    # away from the crossings of the two curves the regime is identifiable: all must be recovered
    clear = np.abs(1.5 - 2 * x[:, 0] ** 2) > 0.3
    assert (model.partition_[clear] == regime[clear]).all() or (model.partition_[clear] != regime[clear]).all()
    assert model.loss_history_[-1] < 0.5 * model.loss_history_[0]


def test_family_components_on_executor_equal_batched_fit():
    data = make_presto_synthetic(80, seed=3)
    kwargs = dict(ridge=1.0, epsilon=3.0, seed=0, progress=False)
    batched = PRESTO(4, "logistic", **kwargs).fit(data.X, data.y)
    inline = PRESTO(4, "logistic", executor="inline", **kwargs).fit(data.X, data.y)
    with ThreadPoolExecutor(2) as pool:
        threads = PRESTO(4, "logistic", executor=pool, **kwargs).fit(data.X, data.y)
    for other in (inline, threads):
        np.testing.assert_array_equal(other.partition_, batched.partition_)
        assert_close(other.components_.coef, batched.components_.coef, rtol=1e-6, atol=1e-8)
        assert_close(other.history_, batched.history_, rtol=1e-9)


def test_torch_components_on_executors_equal_in_process():
    x, y, regime = two_classifiers(n=100, seed=4)
    svm = LinearSVMComponent(2, epochs=40)
    kwargs = dict(epsilon=0.0, leeway=0.2, init=corrupted_start(regime, 0.25, 3), max_iter=3, seed=0, progress=False)
    local = PRESTO(2, svm, **kwargs).fit(x, y)
    with ThreadPoolExecutor(2) as pool:
        threads = PRESTO(2, svm, executor=pool, **kwargs).fit(x, y)
    processes = PRESTO(2, svm, executor="processes", **kwargs).fit(x, y)  # one local pool for the whole fit
    for other in (threads, processes):
        np.testing.assert_array_equal(other.partition_, local.partition_)
        for a, b in zip(other.components_, local.components_):
            assert_close(a.linear.weight, b.linear.weight, rtol=1e-10, atol=1e-12)
    assert processes._adapter.executor is None  # the fitted object keeps no reference to the pool
    assert local.components_[0] is not svm  # the template is copied, never trained


class _NoLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1, dtype=torch.float64)

    def fit(self, x, y):
        return self


class _NoFit(_NoLoss):
    fit = None

    def per_sample_loss(self, x, y):
        return (self.linear(x).squeeze(-1) - y).square()


class _BadShape(_NoLoss):
    def per_sample_loss(self, x, y):
        return (self.linear(x) - y[:, None]).square()  # (N, 1), not (N,)


def test_bad_torch_components_raise_clear_errors():
    x, y, _ = two_classifiers(n=40)
    with pytest.raises(TypeError, match="per_sample_loss"):
        PRESTO(2, _NoLoss(), progress=False).fit(x, y)
    with pytest.raises(TypeError, match=r"no fit\(x, y\)"):
        PRESTO(2, _NoFit(), progress=False).fit(x, y)
    with pytest.raises(ValueError, match=r"per_sample_loss must return shape \(40,\)"):
        PRESTO(2, _BadShape(), progress=False).fit(x, y)
    with pytest.raises(ValueError, match="list of 3 modules"):
        PRESTO(2, [LinearSVMComponent(2)] * 3, progress=False).fit(x, y)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        check_torch_component(object())
    with pytest.raises(TypeError, match="executor"):
        PRESTO(2, "logistic", executor="threads", progress=False).fit(x, y)
    with pytest.raises(ValueError, match="epochs"):
        LinearSVMComponent(2, epochs=0)
    with pytest.raises(ValueError, match="task"):
        MLPComponent(2, task="ranking")
