"""``device=`` of PRESTO and RegularizedWeighting: explicit CPU equals the default, any input
device is accepted, CUDA without a GPU fails clearly, and (on a GPU machine) CUDA fits match CPU fits."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from ppmix.datasets.presto import make_presto_synthetic
from ppmix.inference import PRESTO, RegularizedWeighting, SubspaceLearner
from ppmix.io import config_checksum
from ppmix.optimizers.presto.components import LinearSVMComponent
from tests.common import assert_close, requires_cuda
from tests.inference.test_presto_rw_io import _rw_problem

#: (device, tolerance against the default CPU fit): explicit CPU must be bit-identical
DEVICE_TOL = [pytest.param("cpu", 0.0, id="cpu"), pytest.param("cuda", 1e-6, marks=requires_cuda, id="cuda")]

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")


@pytest.fixture(scope="module")
def presto_data():
    return make_presto_synthetic(60, seed=1)


def _presto_kwargs(case: str) -> dict:
    """Fresh constructor arguments (a new module every call): one case per code path of the fit."""
    if case == "linear-kmeans":
        return {"component": "linear", "ridge": 1.0, "epsilon": 3.0}
    if case == "logistic-random-sklearn-router":
        return {"component": "logistic", "init": "random", "router": LogisticRegression(), "epsilon": 3.0}
    if case == "svm-ward":
        return {"component": LinearSVMComponent(2, epochs=30), "init": "ward", "max_iter": 3}
    raise ValueError(case)


def _presto_xy(data, case: str) -> tuple[np.ndarray, np.ndarray]:
    if case == "linear-kmeans":
        return data.X, data.X[:, 0] * data.y + data.X[:, 1]
    return data.X, data.y


def _device_of(fitted) -> torch.device:
    """Device of the first parameter of a component family or of a list of modules."""
    if isinstance(fitted, torch.nn.Module):
        return next(fitted.parameters()).device
    return fitted.device


PRESTO_CASES = ["linear-kmeans", "logistic-random-sklearn-router", "svm-ward"]


# ------------------------------------------------------------------ PRESTO
@pytest.mark.parametrize("device, tol", DEVICE_TOL)
@pytest.mark.parametrize("case", PRESTO_CASES)
def test_presto_on_device_matches_default_cpu_fit(presto_data, case, device, tol):
    X, y = _presto_xy(presto_data, case)
    reference = PRESTO(4, **_presto_kwargs(case), seed=0, progress=False).fit(X, y)
    model = PRESTO(4, **_presto_kwargs(case), seed=0, progress=False, device=device).fit(X, y)
    assert model.device == device  # stored as given
    assert _device_of(model.components_).type == device
    assert isinstance(model.partition_, np.ndarray) and isinstance(model.part_sizes_, np.ndarray)
    assert len(np.unique(reference.partition_)) == 4  # a real partition, not a trivial one
    np.testing.assert_array_equal(model.partition_, reference.partition_)
    np.testing.assert_array_equal(model.part_sizes_, reference.part_sizes_)
    assert model.n_iter_ == reference.n_iter_
    assert_close(model.history_, reference.history_, rtol=tol, atol=0)
    assert_close(model.loss_history_, reference.loss_history_, rtol=tol, atol=0)
    # numpy in, numpy out, as with the default device
    predicted = model.predict(X)
    assert isinstance(predicted, np.ndarray)
    assert_close(predicted, reference.predict(X), rtol=tol, atol=tol)
    assert_close(model.predict_partition_proba(X), reference.predict_partition_proba(X), rtol=tol, atol=tol)
    np.testing.assert_array_equal(model.predict_partition(X), reference.predict_partition(X))
    if case.startswith("logistic"):
        assert_close(model.predict_proba(X), reference.predict_proba(X), rtol=tol, atol=tol)
    # the objective of a given partition is computed on the device too
    assert model.objective(X, y, reference.partition_) == pytest.approx(
        reference.objective(X, y, reference.partition_), rel=tol, abs=0
    )


@pytest.mark.parametrize("kind", ["tensor", "dataframe"])
def test_presto_accepts_tensors_and_dataframes(presto_data, kind):
    X, y = presto_data.X, presto_data.y
    reference = PRESTO(4, "logistic", epsilon=3.0, seed=0, progress=False).fit(X, y)
    if kind == "tensor":
        Xc, yc = torch.as_tensor(X), torch.as_tensor(y)
    else:
        Xc, yc = pd.DataFrame(X, columns=["a", "b"]), pd.Series(y)
    model = PRESTO(4, "logistic", epsilon=3.0, seed=0, progress=False, device="cpu").fit(Xc, yc)
    np.testing.assert_array_equal(model.partition_, reference.partition_)
    assert isinstance(model.partition_, np.ndarray)
    # a tensor init (and partition) is read like the numpy array
    start = (np.arange(len(X)) * 7) % 4
    from_numpy = PRESTO(4, "logistic", epsilon=3.0, init=start, seed=0, progress=False).fit(X, y)
    from_tensor = PRESTO(4, "logistic", epsilon=3.0, init=torch.as_tensor(start), seed=0, progress=False).fit(Xc, yc)
    assert from_numpy.history_ == from_tensor.history_
    np.testing.assert_array_equal(from_tensor.partition_, from_numpy.partition_)
    # tensor in, tensor out (on the estimator's device), whatever the input's dtype
    out = model.predict(torch.as_tensor(X, dtype=torch.float32))
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    np.testing.assert_array_equal(out.numpy(), reference.predict(X.astype(np.float32)))
    proba = model.predict_proba(torch.as_tensor(X))
    assert isinstance(proba, torch.Tensor)
    assert_close(proba, reference.predict_proba(X), rtol=0, atol=0)
    assert model.objective(Xc, yc, torch.as_tensor(start)) == reference.objective(X, y, start)


@no_cuda
def test_presto_cuda_without_gpu_raises_at_fit(presto_data):
    model = PRESTO(4, "logistic", progress=False, device="cuda")  # stored as is: no error yet
    assert model.device == "cuda"
    with pytest.raises(ValueError, match=r"device='cuda' asks for CUDA, but torch.cuda.is_available\(\) is False"):
        model.fit(presto_data.X, presto_data.y)
    with pytest.raises(ValueError, match="device='cuda:0' asks for CUDA"):
        PRESTO(4, "logistic", progress=False, device=torch.device("cuda", 0)).objective(
            presto_data.X, presto_data.y, np.arange(len(presto_data.X)) % 4
        )
    with pytest.raises(TypeError, match="device must be None, a string"):
        PRESTO(4, "logistic", progress=False, device=1.5).fit(presto_data.X, presto_data.y)


# ------------------------------------------------------------------ Regularized Weighting
RW_CASES = ["kmeans", "regression", "subspace", "gaussian"]


def _rw_learner(kind: str):
    return SubspaceLearner(1, affine=True) if kind == "subspace" else kind


@pytest.mark.parametrize("device, tol", DEVICE_TOL)
@pytest.mark.parametrize("kind", RW_CASES)
def test_rw_on_device_matches_default_cpu_fit(kind, device, tol):
    X, y, _ = _rw_problem(kind)
    reference = RegularizedWeighting(2, _rw_learner(kind), n_init=2, seed=0, progress=False).fit(X, y)
    rw = RegularizedWeighting(2, _rw_learner(kind), n_init=2, seed=0, progress=False, device=device).fit(X, y)
    assert rw.device == device
    # the weights are reported on the CPU, the fitted models live on the device
    assert rw.weights_.device.type == "cpu" and rw.weights_.dtype == torch.float64
    X_t, y_t = torch.as_tensor(X, device=device), None if y is None else torch.as_tensor(y, device=device)
    assert rw.models_.loss(X_t if y_t is None else (X_t, y_t)).device.type == device
    assert isinstance(rw.labels_, np.ndarray) and isinstance(rw.outliers_, np.ndarray)
    np.testing.assert_array_equal(rw.labels_, reference.labels_)
    np.testing.assert_array_equal(rw.outliers_, reference.outliers_)
    assert len(np.unique(reference.labels_[reference.labels_ >= 0])) == 2
    assert_close(rw.weights_, reference.weights_, rtol=0, atol=100 * tol)
    assert rw.loss_ == pytest.approx(reference.loss_, rel=tol, abs=0)
    assert rw.alpha_ == pytest.approx(reference.alpha_, rel=tol, abs=0)
    assert_close(rw.history_, reference.history_, rtol=tol, atol=0)
    predicted = rw.predict(X, y)
    assert isinstance(predicted, np.ndarray)
    np.testing.assert_array_equal(predicted, reference.predict(X, y))


def test_rw_accepts_tensors_and_dataframes():
    X, y, _ = _rw_problem("regression")
    reference = RegularizedWeighting(2, "regression", n_init=2, seed=0, progress=False).fit(X, y)
    for Xc, yc in [(torch.as_tensor(X), torch.as_tensor(y)), (pd.DataFrame(X, columns=["x"]), pd.Series(y))]:
        rw = RegularizedWeighting(2, "regression", n_init=2, seed=0, progress=False, device="cpu").fit(Xc, yc)
        assert_close(rw.weights_, reference.weights_, rtol=0, atol=0)
        np.testing.assert_array_equal(rw.labels_, reference.labels_)
    out = rw.predict(torch.as_tensor(X), torch.as_tensor(y))
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    np.testing.assert_array_equal(out.numpy(), reference.predict(X, y))


@no_cuda
def test_rw_cuda_without_gpu_raises_at_fit():
    X, _, _ = _rw_problem("kmeans")
    rw = RegularizedWeighting(2, progress=False, device="cuda:0")
    assert rw.device == "cuda:0"
    with pytest.raises(ValueError, match=r"device='cuda:0' asks for CUDA, but torch.cuda.is_available\(\) is False"):
        rw.fit(X)
    with pytest.raises(ValueError, match="device must be a torch.device or a device string"):
        RegularizedWeighting(2, progress=False, device="gpu").fit(X)


# ------------------------------------------------------------------ save / load across devices
def _saved_with_device(tmp_path, estimator, device: str):
    """Save ``estimator`` and record ``device`` as its constructor argument, as if fitted there."""
    path = estimator.save(tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["params"]["device"] == estimator.device
    config["params"]["device"] = device
    config["config_sha256"] = config_checksum(config)
    (path / "config.json").write_text(json.dumps(config))
    return path


@no_cuda
def test_loading_a_cuda_model_without_gpu_needs_map_location(tmp_path, presto_data):
    X, y = presto_data.X, presto_data.y
    model = PRESTO(4, "logistic", epsilon=3.0, seed=0, progress=False).fit(X, y)
    path = _saved_with_device(tmp_path / "presto", model, "cuda")
    with pytest.raises(ValueError, match="asks for CUDA.*map_location='cpu'"):
        PRESTO.load(path)
    loaded = PRESTO.load(path, map_location="cpu")
    assert loaded.device == "cpu"
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))

    Xr, _, _ = _rw_problem("kmeans")
    rw = RegularizedWeighting(2, n_init=1, seed=0, progress=False).fit(Xr)
    path = _saved_with_device(tmp_path / "rw", rw, "cuda")
    with pytest.raises(ValueError, match="asks for CUDA.*map_location='cpu'"):
        RegularizedWeighting.load(path)
    loaded_rw = RegularizedWeighting.load(path, map_location=torch.device("cpu"))
    np.testing.assert_array_equal(loaded_rw.predict(Xr), rw.predict(Xr))


@requires_cuda
def test_presto_cuda_round_trip_and_inputs_on_any_device(tmp_path, presto_data):
    X, y = presto_data.X, presto_data.y
    model = PRESTO(4, "logistic", epsilon=3.0, seed=0, progress=False, device="cuda").fit(X, y)
    # inputs on any device; a tensor comes back on the estimator's device
    out = model.predict_proba(torch.as_tensor(X))
    assert out.device.type == "cuda"
    assert_close(out, model.predict_proba(torch.as_tensor(X, device="cuda")), rtol=0, atol=0)
    # saved from the CPU; loaded onto the CPU or back onto the GPU
    path = model.save(tmp_path / "presto")
    assert torch.load(path / "tensors.pt", weights_only=True)["state.partition"].device.type == "cpu"
    on_cpu = PRESTO.load(path, map_location="cpu")
    assert on_cpu.components_.device.type == "cpu" and on_cpu.router_.device.type == "cpu"
    on_gpu = PRESTO.load(path)  # the saved device
    assert on_gpu.components_.device.type == "cuda" and on_gpu.router_.device.type == "cuda"
    for loaded in (on_cpu, on_gpu):
        np.testing.assert_array_equal(loaded.partition_, model.partition_)
        assert_close(loaded.predict_proba(X), model.predict_proba(X), rtol=1e-9, atol=1e-12)


@requires_cuda
def test_rw_cuda_round_trip_and_inputs_on_any_device(tmp_path):
    X, y, _ = _rw_problem("regression")
    rw = RegularizedWeighting(2, "regression", n_init=1, seed=0, progress=False, device="cuda").fit(X, y)
    out = rw.predict(torch.as_tensor(X), torch.as_tensor(y))
    assert out.device.type == "cuda"
    np.testing.assert_array_equal(out.cpu().numpy(), rw.predict(X, y))
    path = rw.save(tmp_path / "rw")
    on_cpu = RegularizedWeighting.load(path, map_location="cpu")
    assert on_cpu.models_.coef_.device.type == "cpu"
    on_gpu = RegularizedWeighting.load(path)
    assert on_gpu.models_.coef_.device.type == "cuda"
    for loaded in (on_cpu, on_gpu):
        assert_close(loaded.weights_, rw.weights_, rtol=0, atol=0)
        np.testing.assert_array_equal(loaded.predict(X, y), rw.predict(X, y))


@pytest.mark.parametrize("device, tol", DEVICE_TOL)
def test_weighted_fits_on_device_match_default_cpu_fit(presto_data, device, tol):
    # sample weights (zeros among them) through every weighted path: the weighted k-means start, capacities,
    # a scikit-learn router with sample_weight, and RW's resampled start, weighted median and weight step
    weight = np.random.default_rng(0).integers(0, 4, size=len(presto_data.X)).astype(float)
    for kwargs in ({"component": "linear", "ridge": 1.0, "epsilon": 3.0}, {"router": LogisticRegression()}):
        X, y = _presto_xy(presto_data, "linear-kmeans" if "ridge" in kwargs else "logistic")
        reference = PRESTO(4, **kwargs, seed=0, progress=False).fit(X, y, sample_weight=weight)
        model = PRESTO(4, **kwargs, seed=0, progress=False, device=device).fit(X, y, sample_weight=weight)
        np.testing.assert_array_equal(model.partition_, reference.partition_)
        assert_close(model.history_, reference.history_, rtol=tol, atol=0)
    X, y, learner = _rw_problem("gaussian")
    weight = np.random.default_rng(1).integers(0, 4, size=len(X)).astype(float)
    reference = RegularizedWeighting(2, learner, n_init=2, seed=0, progress=False).fit(X, y, sample_weight=weight)
    rw = RegularizedWeighting(2, learner, n_init=2, seed=0, progress=False, device=device)
    rw.fit(X, y, sample_weight=weight)
    np.testing.assert_array_equal(rw.labels_, reference.labels_)
    assert_close(rw.weights_, reference.weights_, rtol=0, atol=100 * tol)
    assert_close(rw.history_, reference.history_, rtol=tol, atol=0)
