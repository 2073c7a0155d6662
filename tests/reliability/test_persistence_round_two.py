"""Audit of saving and loading, round two (issue 39, item 4 and "Also found", persistence).

* A load while another process saves over the same path reads one consistent version: never a
  good model reported as corrupt (the two files are read through one directory handle).
* A save interrupted at any step (``KeyboardInterrupt``, as by Ctrl-C) leaves no temporary
  directory and the previous (or the new) model loadable; names of any legal length save.
* A forged state that contradicts the config (``n_components``, ``n_features_in_``, the covariance
  type, any entry's shape) or holds ``inf`` is refused naming the file and the entry.
* ``map_location`` that cannot hold tensors here is refused naming ``map_location``.
* ``ppmix.io.load_model`` restores PRESTO and RegularizedWeighting fitted; saves of older ppmix
  versions load (or are refused saying which version and what to do).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppmix import GMM, HMM, Mixture, MixtureOfExperts, SupervisedGMM
from ppmix.datasets.presto import make_presto_synthetic
from ppmix.inference import PRESTO, RegularizedWeighting
from ppmix.io import CONFIG_FILE, TENSOR_FILE, atomic, config_checksum, load_model, schema
from tests.reliability._saved_models import X, forge, same_gmm


def siblings(path: Path) -> list[str]:
    """What is beside ``path`` in its directory, but ``path`` itself."""
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


# ------------------------------------------------------------------- loading while another saves
def _save_repeatedly(path: str, stop: Any, models: list[Any]) -> None:
    i = 0
    while not stop.is_set():
        models[i % 2].save(path)
        i += 1


@pytest.mark.parametrize("saver", ["process", "thread"])
def test_loading_while_another_process_saves_always_reads_one_version(tmp_path, gmm_a, gmm_b, saver):
    path = gmm_a.save(tmp_path / "m")
    if saver == "process":
        ctx = multiprocessing.get_context("fork")
        stop: Any = ctx.Event()
        worker: Any = ctx.Process(target=_save_repeatedly, args=(str(path), stop, [gmm_a, gmm_b]), daemon=True)
    else:
        stop = threading.Event()
        worker = threading.Thread(target=_save_repeatedly, args=(str(path), stop, [gmm_a, gmm_b]), daemon=True)
    worker.start()
    seen = []
    try:
        for _ in range(100 if saver == "thread" else 150):
            loaded = GMM.load(path)  # a good model is never reported as corrupt
            seen.append(loaded.n_components)
            assert same_gmm(loaded, gmm_a if loaded.n_components == 2 else gmm_b)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    assert set(seen) == {2, 3}, "the saver did not overlap the loads"
    assert siblings(path) == []


def test_a_load_between_the_two_renames_of_a_save_waits_for_the_new_model(tmp_path, gmm_a, gmm_b, monkeypatch):
    """Where the atomic swap is unavailable, nothing is at the path between a save's two renames."""
    path = gmm_a.save(tmp_path / "m")
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    real_replace, loads = os.replace, []

    def replace(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        if Path(dst).name.endswith(".old") and not loads:  # the previous save is aside: load now, from a thread
            loader = threading.Thread(target=lambda: loads.append(GMM.load(path)))
            loader.start()
            loader.join(timeout=0.2)  # it waits for the new model ...
            assert loader.is_alive() and not loads
            loads.append(loader)  # ... which the second rename puts in place

    monkeypatch.setattr(os, "replace", replace)
    gmm_b.save(path)
    loads[0].join(timeout=30)
    assert len(loads) == 2 and same_gmm(loads[1], gmm_b)


# ------------------------------------------------------------------------ interrupted saves
#: (owner, attribute) of every call a save makes where a Ctrl-C may land, the clean-up's included
INTERRUPT_POINTS = [
    (torch, "save"),
    (json, "dumps"),
    (os, "mkdir"),
    (os, "stat"),
    (os, "fsync"),
    (os, "replace"),
    (os, "unlink"),
    (os, "rmdir"),
    (os, "listdir"),
    (atomic, "_exchange"),
]


def interrupt_on_call(monkeypatch: pytest.MonkeyPatch, owner: Any, attr: str, n: int) -> list[int]:
    """Raise ``KeyboardInterrupt`` at the ``n``-th call of ``owner.attr`` (after it ran, for odd ``n``)."""
    real, count = getattr(owner, attr), [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if count[0] == n // 2 + 1 and n % 2 == 0:
            raise KeyboardInterrupt
        out = real(*args, **kwargs)
        if count[0] == n // 2 + 1:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(owner, attr, wrapper)
    return count


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(point=st.sampled_from(INTERRUPT_POINTS), n=st.integers(0, 11), previous=st.booleans())
def test_a_save_interrupted_anywhere_leaves_no_temporary_directory(tmp_path, gmm_a, gmm_b, mode, point, n, previous):
    owner, attr = point
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "m"
    if previous:
        gmm_a.save(path)
    with pytest.MonkeyPatch.context() as mp:
        interrupt_on_call(mp, owner, attr, n)
        try:
            gmm_b.save(path)
        except KeyboardInterrupt:
            pass
    assert siblings(path) == [], (attr, n)
    if path.exists():  # the previous model or the new one, complete
        loaded = GMM.load(path)
        assert same_gmm(loaded, gmm_b) or (previous and same_gmm(loaded, gmm_a))
    else:
        assert not previous


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(length=st.integers(1, 255), char=st.sampled_from(["m", "é", "_"]))
def test_names_of_any_legal_length_save_and_load(tmp_path, gmm_a, length, char):
    name = (char * length).encode()[:255].decode(errors="ignore")  # a legal name: at most 255 bytes
    path = gmm_a.save(Path(tempfile.mkdtemp(dir=tmp_path)) / name)
    gmm_a.save(path)  # and over a previous save
    assert same_gmm(GMM.load(path), gmm_a) and siblings(path) == []


# ------------------------------------------------------------- the state against the config
@pytest.fixture(scope="module")
def presto_data():
    return make_presto_synthetic(60, seed=1)


@pytest.fixture(scope="module")
def fitted(gmm_a, gmm_b, presto_data):
    """One fitted object of each kind of state layout, and its predictions."""
    seqs = [X[:40], X[40:]]
    y = (np.arange(80) >= 40).astype(int)
    px, py = presto_data.X, presto_data.y
    models = {
        "GMM diag": (gmm_a, lambda m: m.predict_proba(X)),
        "GMM full": (gmm_b, lambda m: m.predict_proba(X)),
        "Poisson": (Mixture(2, family="poisson", seed=0, progress=False).fit(np.abs(X).round()), None),
        "HMM": (HMM(2, seed=0, max_iter=5, progress=False).fit(seqs), None),
        "SupervisedGMM": (SupervisedGMM(2, seed=0, progress=False).fit(X, y), None),
        "MoE": (
            MixtureOfExperts.from_parameters(
                gate_coef=[[1.0, 0.5], [0.0, 0.0]],
                gate_intercept=[0.0, 0.0],
                coef=[[1.0, 2.0], [-1.0, 0.0]],
                intercept=[0.0, 1.0],
                scale=[1.0, 2.0],
            ),
            None,
        ),
        "PRESTO": (PRESTO(3, "logistic", seed=0, max_iter=3, progress=False).fit(px, py), lambda m: m.predict(px)),
        "RW": (RegularizedWeighting(2, n_init=1, seed=0, progress=False).fit(X), lambda m: m.predict(X)),
    }
    return models


@pytest.fixture(scope="module")
def saved(fitted, tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    return {name: model.save(root / name.replace(" ", "_")) for name, (model, _) in fitted.items()}


FORGERIES = ["grow", "shrink", "add a dimension", "drop a dimension", "inf", "-inf", "nan"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_forged_state_that_contradicts_the_config_is_refused_naming_the_entry(tmp_path, fitted, saved, data):
    name = data.draw(st.sampled_from(sorted(saved)), label="model")
    original = torch.load(saved[name] / TENSOR_FILE, weights_only=True)
    model = type(fitted[name][0])
    loaded = load_model(saved[name])
    shapes = {f"state.{k}": v for k, v in loaded._state_shapes().items()}
    entry = data.draw(st.sampled_from(sorted(shapes)), label="entry")
    value = original[entry]
    fixed = [i for i, d in enumerate(shapes[entry]) if d is not None]
    kinds = [k for k in FORGERIES if value.is_floating_point() or k not in ("inf", "-inf", "nan")]
    kinds = [k for k in kinds if k not in ("grow", "shrink") or fixed]
    kinds = [k for k in kinds if k != "shrink" or any(value.shape[i] > 1 for i in fixed)]
    kinds = [k for k in kinds if k != "drop a dimension" or value.dim() > 0]
    kind = data.draw(st.sampled_from(kinds), label="forgery")
    if kind == "grow":
        dim = data.draw(st.sampled_from(fixed), label="dim")
        forged = torch.cat([value, value.narrow(dim, 0, 1)], dim)
    elif kind == "shrink":
        dim = data.draw(st.sampled_from([i for i in fixed if value.shape[i] > 1]), label="dim")
        forged = value.narrow(dim, 0, value.shape[dim] - 1)
    elif kind == "add a dimension":
        forged = value[None]
    elif kind == "drop a dimension":
        forged = value.reshape(-1)[0] if value.dim() <= 1 else value.flatten(0, 1)
    else:
        forged = value.clone()
        forged.view(-1)[data.draw(st.integers(0, max(forged.numel() - 1, 0)), label="at")] = float(kind)
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "m"
    path.mkdir()
    (path / CONFIG_FILE).write_bytes((saved[name] / CONFIG_FILE).read_bytes())
    forge(path, {**original, entry: forged})
    with pytest.raises(ValueError) as info:
        load_model(path, expected=model)
    message = str(info.value)
    assert str(path / TENSOR_FILE) in message and repr(entry.removeprefix("state.")) in message, message


CONFIG_FORGERIES = {
    "n_components + 1": (lambda c: c["params"].update(n_components=c["params"]["n_components"] + 1), "GMM diag"),
    "n_components - 1": (lambda c: c["params"].update(n_components=c["params"]["n_components"] - 1), "GMM full"),
    "n_features_in_ + 1": (lambda c: c["fitted"].update(n_features_in_=c["fitted"]["n_features_in_"] + 1), "HMM"),
    "n_features_in_ - 1": (lambda c: c["fitted"].update(n_features_in_=1), "SupervisedGMM"),
    "covariance type": (lambda c: c["params"].update(covariance_type="full"), "GMM diag"),
    "covariance type back": (lambda c: c["params"].update(covariance_type="diag"), "GMM full"),
    "n_experts": (lambda c: c["params"].update(n_experts=3), "MoE"),
    "PRESTO parts": (lambda c: c["params"].update(n_components=4), "PRESTO"),
    "PRESTO features": (lambda c: c["fitted"].update(n_features_in_=3), "PRESTO"),
    "RW models": (lambda c: c["params"].update(n_models=3), "RW"),
    "RW features": (lambda c: c["fitted"].update(n_features_in_=3), "RW"),
}


@pytest.mark.parametrize("case", list(CONFIG_FORGERIES))
def test_a_forged_config_that_contradicts_the_state_is_refused(tmp_path, saved, case):
    edit, name = CONFIG_FORGERIES[case]
    path = tmp_path / "m"
    path.mkdir()
    for f in (CONFIG_FILE, TENSOR_FILE):
        (path / f).write_bytes((saved[name] / f).read_bytes())
    forge(path, config_edit=edit)
    with pytest.raises(ValueError, match="settings in config.json") as info:
        load_model(path)
    assert str(path / TENSOR_FILE) in str(info.value)


# ------------------------------------------------------------------------------ map_location
@pytest.mark.parametrize("where", ["meta", "cuda:99", "mps", "xla"])
def test_map_location_that_cannot_hold_tensors_here_is_refused_naming_it(saved, where):
    with pytest.raises(ValueError, match=f"map_location='{where}'"):
        load_model(saved["GMM diag"], map_location=where)
    with pytest.raises(ValueError, match=f"map_location='{where}'"):
        PRESTO.load(saved["PRESTO"], map_location=where)


# ------------------------------------------------------------------- PRESTO / RW through load_model
@pytest.mark.parametrize("name", ["PRESTO", "RW"])
def test_load_model_restores_presto_and_rw_fitted(fitted, saved, name):
    model, predict = fitted[name]
    loaded = load_model(saved[name])
    assert type(loaded) is type(model)
    np.testing.assert_array_equal(predict(loaded), predict(model))


# --------------------------------------------------------------------------- older PRESTO saves
def _as_older_presto_save(path: Path, layout: str) -> None:
    """Rewrite a PRESTO save (fitted with ``standardize=False``) as an older ppmix wrote it.

    ``0.1.0``: format version 1, the class at its old module ``ppmix.inference.presto``, no config checksum;
    ``before standardize``: format version 2 of the layered package. Neither has ``standardize``,
    ``router_weight``, the ``scales.*`` tensors nor ``routability``.
    """
    tensors = torch.load(path / TENSOR_FILE, weights_only=True)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("state.scales.")}
    torch.save(tensors, path / TENSOR_FILE)
    config = json.loads((path / CONFIG_FILE).read_text())
    for key in ("standardize", "router_weight"):
        del config["params"][key]
    del config["extra"]["routability"]
    config["tensors_sha256"] = schema._sha256(path / TENSOR_FILE)
    config["ppmix_version"] = "0.1.0"
    if layout == "0.1.0":
        config.update({"format_version": 1, "class": "ppmix.inference.presto.PRESTO"})
        del config["config_sha256"]
        del config["params"]["device"]
    else:
        config["config_sha256"] = config_checksum(config)
    (path / CONFIG_FILE).write_text(json.dumps(config))


@pytest.mark.parametrize("layout", ["0.1.0", "before standardize"])
def test_older_presto_saves_load_with_the_same_predictions(tmp_path, presto_data, layout):
    x, y = presto_data.X, presto_data.y
    model = PRESTO(3, "logistic", standardize=False, seed=0, max_iter=3, progress=False).fit(x, y)
    path = model.save(tmp_path / "old")
    _as_older_presto_save(path, layout)
    for loaded in (PRESTO.load(path), load_model(path)):
        assert loaded.standardize is False
        np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
        np.testing.assert_array_equal(loaded.predict_proba(x), model.predict_proba(x))


def test_a_presto_save_missing_its_scales_is_refused_saying_what_to_do(tmp_path, presto_data):
    model = PRESTO(3, "logistic", seed=0, max_iter=3, progress=False).fit(presto_data.X, presto_data.y)
    path = model.save(tmp_path / "m")
    tensors = torch.load(path / TENSOR_FILE, weights_only=True)
    forge(path, {k: v for k, v in tensors.items() if not k.startswith("state.scales.")})
    with pytest.raises(
        ValueError, match=r"saved by ppmix .* \(format version 2\).*standardize=True.*fit the model again"
    ):
        load_model(path)
