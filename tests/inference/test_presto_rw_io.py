"""save/load of fitted PRESTO and RegularizedWeighting objects (through ppmix.io)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from ppmix._validation import NotFittedError
from ppmix.datasets.presto import make_presto_synthetic
from ppmix.inference import PRESTO, RegularizedWeighting, SubspaceLearner
from ppmix.io import config_checksum, load_model, lookup_class, qualified_name
from ppmix.io.registry import MOVED_CLASSES
from ppmix.optimizers.presto.components import LinearSVMComponent
from tests.common import assert_close


@pytest.fixture(scope="module")
def presto_data():
    return make_presto_synthetic(60, seed=1)


@pytest.mark.parametrize("kind", ["logistic", "linear"])
def test_presto_round_trip(tmp_path, presto_data, kind):
    X = presto_data.X
    y = presto_data.y if kind == "logistic" else presto_data.X[:, 0] * presto_data.y + presto_data.X[:, 1]
    model = PRESTO(4, kind, ridge=1.0, epsilon=3.0, seed=0, progress=False).fit(X, y)
    loaded = PRESTO.load(model.save(tmp_path / "m"))
    np.testing.assert_array_equal(loaded.partition_, model.partition_)
    np.testing.assert_array_equal(loaded.part_sizes_, model.part_sizes_)
    assert loaded.history_ == model.history_ and loaded.loss_history_ == model.loss_history_
    assert (loaded.n_iter_, loaded.converged_, loaded.n_features_in_) == (model.n_iter_, model.converged_, 2)
    for name in model.components_.param_names:
        assert_close(getattr(loaded.components_, name), getattr(model.components_, name), rtol=0, atol=0)
    assert_close(loaded.predict(X), model.predict(X), rtol=0, atol=0)
    assert_close(loaded.predict_partition_proba(X), model.predict_partition_proba(X), rtol=0, atol=0)
    if kind == "logistic":
        assert_close(loaded.predict_proba(X), model.predict_proba(X), rtol=0, atol=0)
    # the loaded object refits like a fresh one
    refit = loaded.fit(X, y)
    np.testing.assert_array_equal(refit.partition_, model.partition_)


def test_presto_torch_component_round_trip_needs_the_module(tmp_path, presto_data):
    X, y = presto_data.X, presto_data.y
    model = PRESTO(4, LinearSVMComponent(2, epochs=30), max_iter=3, seed=0, progress=False).fit(X, y)
    path = model.save(tmp_path / "svm")
    for load in (PRESTO.load, load_model):
        with pytest.raises(
            ValueError, match=r"LinearSVMComponent component object.*PRESTO.load\(path, component=\.\.\.\)"
        ):
            load(path)
    loaded = PRESTO.load(path, component=LinearSVMComponent(2))
    for a, b in zip(loaded.components_, model.components_):
        assert_close(a.linear.weight, b.linear.weight, rtol=0, atol=0)
    assert_close(loaded.predict(X), model.predict(X), rtol=0, atol=0)
    # ppmix.io.load_model gives the same fitted object, the module passed as objects=
    loaded = load_model(path, objects={"component": LinearSVMComponent(2)})
    assert_close(loaded.predict(X), model.predict(X), rtol=0, atol=0)
    with pytest.raises(ValueError, match="component object passed to load imply"):
        PRESTO.load(path, component=LinearSVMComponent(3))


def test_presto_save_refuses_custom_router_and_unfitted(tmp_path, presto_data):
    model = PRESTO(4, "logistic", router=LogisticRegression(), seed=0, progress=False)
    with pytest.raises(NotFittedError):
        model.save(tmp_path / "unfitted")
    model.fit(presto_data.X, presto_data.y)
    with pytest.raises(TypeError, match="custom router"):
        model.save(tmp_path / "router")


def _rw_problem(kind):
    rng = np.random.default_rng(0)
    if kind == "regression":
        X = rng.uniform(-1, 1, size=(60, 1))
        y = np.where(np.arange(60) % 2 == 0, 2 * X[:, 0], -X[:, 0]) + 0.01 * rng.normal(size=60)
        return X, y, "regression"
    X = np.concatenate([rng.normal(0, 0.3, (30, 2)), rng.normal(4, 0.3, (30, 2)), [[80.0, -80.0]]])
    learner = SubspaceLearner(1, affine=True) if kind == "subspace" else kind
    return X, None, learner


@pytest.mark.parametrize("kind", ["kmeans", "regression", "subspace", "gaussian"])
def test_rw_round_trip(tmp_path, kind):
    X, y, learner = _rw_problem(kind)
    rw = RegularizedWeighting(2, learner, n_init=1, seed=0, progress=False).fit(X, y)
    path = rw.save(tmp_path / kind)
    template = SubspaceLearner(1, affine=True) if kind == "subspace" else None
    loaded = RegularizedWeighting.load(path, learner=template)
    assert_close(loaded.weights_, rw.weights_, rtol=0, atol=0)
    assert loaded.weights_.dtype == torch.float64
    np.testing.assert_array_equal(loaded.labels_, rw.labels_)
    np.testing.assert_array_equal(loaded.outliers_, rw.outliers_)
    assert (loaded.loss_, loaded.alpha_, loaded.history_) == (rw.loss_, rw.alpha_, rw.history_)
    assert_close(
        loaded.models_.loss(torch.as_tensor(X) if y is None else (torch.as_tensor(X), torch.as_tensor(y))),
        rw.models_.loss(torch.as_tensor(X) if y is None else (torch.as_tensor(X), torch.as_tensor(y))),
        rtol=0,
        atol=0,
    )
    np.testing.assert_array_equal(loaded.predict(X, y), rw.predict(X, y))


def test_corrupt_or_foreign_files_are_rejected(tmp_path):
    X, _, _ = _rw_problem("kmeans")
    rw = RegularizedWeighting(2, n_init=1, seed=0, progress=False).fit(X)
    path = rw.save(tmp_path / "rw")
    with pytest.raises(ValueError, match="holds a RegularizedWeighting, not a PRESTO"):
        PRESTO.load(path)
    blob = bytearray((path / "tensors.pt").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (path / "tensors.pt").write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="checksum"):
        RegularizedWeighting.load(path)
    path = rw.save(tmp_path / "rw2")
    config = json.loads((path / "config.json").read_text())
    config["format_version"] = 999
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="format version 999"):
        RegularizedWeighting.load(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        RegularizedWeighting.load(path)
    with pytest.raises(FileNotFoundError):
        RegularizedWeighting.load(tmp_path / "missing")


def test_moved_class_names_lead_to_the_classes_there_now():
    assert set(MOVED_CLASSES.values()) == {qualified_name(PRESTO), qualified_name(RegularizedWeighting)}
    for old, new in MOVED_CLASSES.items():
        assert lookup_class(old) is lookup_class(new)


def _renamed_save(model, path: Path, class_name: str) -> Path:
    """Save ``model`` and rewrite its config as an older ppmix wrote it: the class under ``class_name``."""
    model.save(path)
    config = json.loads((path / "config.json").read_text())
    config["class"] = class_name
    config["config_sha256"] = config_checksum(config)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_saves_naming_the_old_module_paths_load_in_a_fresh_interpreter(tmp_path, presto_data):
    """Files written while the optimizers lived under ``ppmix.inference`` (``ppmix.inference.presto``, then
    ``ppmix.inference.optimizers.*``) load with nothing imported beforehand: the class is found by
    ``ppmix.io.registry.MOVED_CLASSES``, not by a bare-name match against classes some earlier import registered."""
    presto = PRESTO(3, "logistic", seed=0, max_iter=3, progress=False).fit(presto_data.X, presto_data.y)
    X, _, _ = _rw_problem("kmeans")
    rw = RegularizedWeighting(2, n_init=1, seed=0, progress=False).fit(X)
    paths = [
        _renamed_save(presto if old.endswith("PRESTO") else rw, tmp_path / str(i), old)
        for i, old in enumerate(MOVED_CLASSES)
    ]
    script = "\n".join(
        [
            "import sys",
            "from ppmix.io import load_model",
            "for p in sys.argv[1:]:",
            "    print(type(load_model(p)).__name__)",
        ]
    )
    run = subprocess.run([sys.executable, "-c", script, *map(str, paths)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [old.rsplit(".", 1)[-1] for old in MOVED_CLASSES]
    loaded = load_model(paths[-2])  # the last PRESTO name: same predictions as the model saved
    np.testing.assert_array_equal(loaded.predict(presto_data.X), presto.predict(presto_data.X))
