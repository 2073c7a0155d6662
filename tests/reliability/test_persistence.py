"""Audit of saving and loading (issue 16, items 2 and 3): saves are atomic, loads are verified.

* A save that fails at any step (a value JSON cannot hold, a full disk at ``torch.save``, ``json.dumps``,
  ``os.fsync``, a rename or the swap) leaves the previous model loadable and no temporary directory.
* Numpy scalars and arrays in the constructor arguments and fitted state are saved as JSON numbers.
* ``save`` never clobbers files that are not a ppmix save, nor writes over a file.
* The tampering table: every field of ``config.json`` edited (value changed, key removed, key added, wrong
  type), and either file truncated, replaced by garbage or deleted, gives a ``ValueError`` or
  ``FileNotFoundError`` naming the file; random byte-level corruption (hypothesis) likewise.
* The schema holds even when the checksum is forged (or absent, in format version 1): only known fitted
  attributes, only constructor arguments of their annotated types.
* A valid round trip still gives identical predictions (GMM, PRESTO, RegularizedWeighting).
"""

from __future__ import annotations

import copy
import errno
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppmix import GMM
from ppmix.datasets.presto import make_presto_synthetic
from ppmix.inference import PRESTO, RegularizedWeighting
from ppmix.io import (
    CONFIG_FILE,
    FORMAT_VERSION,
    TENSOR_FILE,
    atomic,
    check_save_target,
    config_checksum,
    load_model,
    schema,
)
from tests.reliability._saved_models import SWAP_WORKS, X, same_gmm

pytestmark = pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")


# ----------------------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def presto_data():
    return make_presto_synthetic(60, seed=1)


@pytest.fixture(scope="module")
def presto(presto_data):
    return PRESTO(4, "logistic", ridge=1.0, epsilon=3.0, seed=0, progress=False).fit(presto_data.X, presto_data.y)


@pytest.fixture(scope="module")
def rw():
    return RegularizedWeighting(2, n_init=1, seed=0, progress=False).fit(X)


def leftovers(path: Path) -> list[str]:
    """Temporary siblings a save of ``path`` may create (``.{name}.tmp-*``)."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


def read_config(path: Path) -> dict[str, Any]:
    return json.loads((path / CONFIG_FILE).read_text())


def write_config(path: Path, config: dict[str, Any], reseal: bool = False) -> None:
    """Write ``config``; with ``reseal`` forge a matching checksum (as a deliberate editor could)."""
    if reseal:
        config = {**config, "config_sha256": config_checksum(config)}
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2))


def fail_on_call(monkeypatch: pytest.MonkeyPatch, owner: Any, attr: str, n: int) -> None:
    """Make ``owner.attr`` raise ``OSError(ENOSPC)`` on its ``n``-th call (a full disk)."""
    real = getattr(owner, attr)
    count = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if count[0] == n:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, wrapper)


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, attr: str) -> list[int]:
    real, count = getattr(owner, attr), [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, wrapper)
    return count


#: (name, owner, attribute) of every step of a save where the disk can fail
STEPS = [
    ("torch.save", torch, "save"),
    ("json.dumps", json, "dumps"),
    ("os.fsync", os, "fsync"),
    ("os.replace", os, "replace"),
    ("swap", atomic, "_exchange"),
]


# ------------------------------------------------------------------------------------- atomic save
@pytest.mark.parametrize("previous", [True, False], ids=["over-a-previous-save", "new-path"])
def test_a_save_failing_at_any_step_leaves_the_previous_model(tmp_path, gmm_a, gmm_b, mode, previous):
    path = tmp_path / "m"

    def reset() -> None:
        if previous:
            gmm_a.save(path)
        elif path.exists():
            for f in path.iterdir():
                f.unlink()
            path.rmdir()

    raised = []
    for step, owner, attr in STEPS:
        reset()
        with pytest.MonkeyPatch.context() as mp:  # how often a clean save takes this step
            calls = count_calls(mp, owner, attr)
            gmm_b.save(path)
        for n in range(1, calls[0] + 1):
            reset()
            with pytest.MonkeyPatch.context() as mp:
                fail_on_call(mp, owner, attr, n)
                try:
                    gmm_b.save(path)
                    failed = False
                except OSError as err:
                    assert err.errno == errno.ENOSPC, err
                    failed = True
            assert leftovers(path) == [], (step, n, leftovers(path))
            if failed:
                raised.append(step)
                if previous:
                    assert sorted(os.listdir(path)) == [CONFIG_FILE, TENSOR_FILE]
                    assert same_gmm(GMM.load(path), gmm_a), (step, n)
                else:
                    assert not path.exists(), (step, n)
            else:  # only a failure once the new save is in place may be absorbed (syncing the parent)
                assert step == "os.fsync" and n == calls[0], (step, n)
                assert same_gmm(GMM.load(path), gmm_b), (step, n)
    assert {"torch.save", "json.dumps", "os.fsync"} <= set(raised)
    assert ("swap" if mode == "swap" and previous else "os.replace") in raised


@pytest.mark.skipif(not SWAP_WORKS, reason="renameat2(RENAME_EXCHANGE) is not available here")
def test_the_path_holds_a_complete_model_at_every_step_of_a_save(tmp_path, gmm_a, gmm_b, monkeypatch):
    path = gmm_a.save(tmp_path / "m")
    seen, busy = [], [False]

    def check() -> None:
        if busy[0]:  # loading uses json.dumps too
            return
        busy[0] = True
        try:
            loaded = GMM.load(path)
            seen.append("a" if same_gmm(loaded, gmm_a) else "b" if same_gmm(loaded, gmm_b) else "?")
        finally:
            busy[0] = False

    for _, owner, attr in STEPS:
        real = getattr(owner, attr)

        def hooked(*args: Any, _real: Callable = real, **kwargs: Any) -> Any:
            check()
            out = _real(*args, **kwargs)
            check()
            return out

        monkeypatch.setattr(owner, attr, hooked)
    gmm_b.save(path)
    monkeypatch.undo()
    assert "?" not in seen and seen[0] == "a" and seen[-1] == "b", seen
    assert seen == sorted(seen), seen  # a, then b: never anything else in between
    assert same_gmm(GMM.load(path), gmm_b) and leftovers(path) == []


def test_resaving_replaces_the_previous_model(tmp_path, gmm_a, gmm_b, mode):
    path = gmm_a.save(tmp_path / "m")
    assert gmm_b.save(path) == path
    assert same_gmm(GMM.load(path), gmm_b)
    assert sorted(os.listdir(path)) == [CONFIG_FILE, TENSOR_FILE] and leftovers(path) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert same_gmm(GMM.load(gmm_a.save(empty)), gmm_a) and leftovers(empty) == []


def test_a_value_json_cannot_hold_fails_before_touching_the_disk(tmp_path, gmm_a, gmm_b):
    path = gmm_a.save(tmp_path / "m")
    broken = copy.deepcopy(gmm_b)
    broken.history_ = [1.0, object()]
    with pytest.raises(TypeError, match=r"fitted\.history_\[1\].*cannot be written to JSON"):
        broken.save(path)
    with pytest.raises(TypeError, match=r"fitted\.history_\[1\]"):
        broken.save(tmp_path / "new")
    assert same_gmm(GMM.load(path), gmm_a) and leftovers(path) == [] and not (tmp_path / "new").exists()


def test_files_that_appear_during_a_save_are_not_clobbered(tmp_path, gmm_a, gmm_b, mode, monkeypatch):
    path = gmm_a.save(tmp_path / "m")
    real_save = torch.save

    def save_and_intrude(*args: Any, **kwargs: Any) -> None:  # a user writes into the directory meanwhile
        (path / "notes.txt").write_text("mine")
        real_save(*args, **kwargs)

    monkeypatch.setattr(torch, "save", save_and_intrude)
    with pytest.raises(FileExistsError, match="notes.txt"):
        gmm_b.save(path)
    monkeypatch.undo()
    assert (path / "notes.txt").read_text() == "mine" and leftovers(path) == []
    assert same_gmm(GMM.load(path), gmm_a)


# ------------------------------------------------------------------------------- JSON-able values
def test_numpy_scalars_and_arrays_are_saved(tmp_path):
    model = GMM(
        np.int64(3),
        max_iter=np.int32(60),
        tol=np.float32(1e-4),
        reg_covar=np.float64(1e-6),
        warm_start=np.bool_(False),
        seed=np.int64(0),
        progress=np.bool_(False),
    ).fit(X)
    model.history_ = np.asarray(model.history_)
    model.converged_, model.n_iter_ = np.bool_(model.converged_), np.int64(model.n_iter_)
    path = model.save(tmp_path / "m")  # the reproducer of issue 16: GMM(np.int64(3)).fit(X).save(...)
    config = read_config(path)
    assert type(config["params"]["n_components"]) is int and config["params"]["n_components"] == 3
    assert type(config["params"]["tol"]) is float and type(config["params"]["warm_start"]) is bool
    assert type(config["fitted"]["history_"]) is list and type(config["fitted"]["converged_"]) is bool
    loaded = GMM.load(path)
    assert loaded.n_components == 3 and loaded.max_iter == 60 and loaded.tol == float(np.float32(1e-4))
    assert np.array_equal(loaded.predict_proba(X), model.predict_proba(X))
    assert loaded.history_ == model.history_.tolist()


def test_to_json_converts_numpy_and_torch_values():
    value = {
        "a": np.float32(0.5),
        "b": np.arange(3),
        "c": (np.bool_(True), np.str_("x"), None),
        "d": torch.tensor([1.5, 2.0]),
        np.int64(4): [np.array([[1.0, np.nan]])],
        "e": torch.float32,
        "f": Path("p"),
    }
    out = schema._to_json(value, "extra")
    assert json.loads(json.dumps(out, allow_nan=True)) is not None
    assert out["a"] == 0.5 and out["b"] == [0, 1, 2] and out["c"] == [True, "x", None] and out["d"] == [1.5, 2.0]
    assert out["4"][0][0][0] == 1.0 and np.isnan(out["4"][0][0][1]) and out["e"] == {"__dtype__": "float32"}
    assert out["f"] == "p" and all(type(k) is str for k in out)
    with pytest.raises(TypeError, match=r"extra\.g.*set"):
        schema._to_json({"g": {1, 2}}, "extra")
    with pytest.raises(TypeError, match="complex"):
        schema._to_json(np.array([1j]), "params.z")


# ------------------------------------------------------------------------------- refused targets
def test_a_directory_with_other_files_is_refused_and_left_alone(tmp_path, gmm_a):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"mine.*not a ppmix save \(notes.txt\)"):
        gmm_a.save(mine)
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"
    # a previous save plus a user's file
    path = gmm_a.save(tmp_path / "m")
    (path / "README").write_text("about this model")
    with pytest.raises(FileExistsError, match="README"):
        gmm_a.save(path)
    assert (path / "README").exists() and leftovers(path) == [] and leftovers(mine) == []
    # a config.json that is not a ppmix config, a lone tensors.pt
    for files in ({CONFIG_FILE: '{"model_type": "bert"}', TENSOR_FILE: "x"}, {TENSOR_FILE: "x"}):
        other = Path(tempfile.mkdtemp(dir=tmp_path))
        for name, text in files.items():
            (other / name).write_text(text)
        with pytest.raises(FileExistsError, match="not a ppmix save"):
            gmm_a.save(other)
        assert {n: (other / n).read_text() for n in files} == files


def test_a_file_path_is_refused(tmp_path, gmm_a):
    target = tmp_path / "model.pt"
    target.write_text("a file")
    with pytest.raises(FileExistsError, match=r"model\.pt: it is a file"):
        gmm_a.save(target)
    with pytest.raises(FileExistsError, match="it is a file"):
        check_save_target(target)
    assert target.read_text() == "a file" and leftovers(target) == []


def test_the_working_directory_is_not_replaced(tmp_path, gmm_a, monkeypatch):
    path = gmm_a.save(tmp_path / "m")
    monkeypatch.chdir(path)
    with pytest.raises(ValueError, match="current working directory"):
        gmm_a.save(".")
    monkeypatch.chdir(tmp_path)
    assert same_gmm(GMM.load(path), gmm_a)


# ------------------------------------------------------------------------------ tampering table
def _fields(node: Any, where: tuple = ()) -> list[tuple]:
    """Every key path in a config: each dict key and the first item of each non-empty list, recursively."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((*where, key))
            out.extend(_fields(value, (*where, key)))
    elif isinstance(node, list) and node:
        out.append((*where, 0))
        out.extend(_fields(node[0], (*where, 0)))
    return out


def _changed(value: Any) -> Any:
    """A different value of the same type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return 0.0 if value != value else value * 1.5 + 1.0
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1:] != "0" else "1")
    if isinstance(value, list):
        return [*value, value[0]] if value else [0]
    if isinstance(value, dict):
        return {**value, "zz": 1}
    return 1  # None


def _wrong_type(value: Any) -> Any:
    if isinstance(value, str):
        return 7
    if isinstance(value, (dict, list)):
        return "x"
    if value is None:
        return "none"
    return str(value)


def _edit(config: dict, field: tuple, kind: str) -> dict:
    config = copy.deepcopy(config)
    *parents, last = field
    node = config
    for key in parents:
        node = node[key]
    if kind == "changed":
        node[last] = _changed(node[last])
    elif kind == "removed":
        del node[last]
    elif kind == "wrong type":
        node[last] = _wrong_type(node[last])
    elif kind == "added":  # a new key beside this one (or in the list)
        if isinstance(node, dict):
            node["zz_added"] = 1
        else:
            node.append(node[0])
    return config


def _estimators(gmm_a, presto, rw, presto_data):
    return {
        "GMM": (gmm_a, lambda m: m.predict_proba(X)),
        "PRESTO": (presto, lambda m: m.predict(presto_data.X)),
        "RW": (rw, lambda m: m.predict(X)),
    }


@pytest.mark.parametrize("name", ["GMM", "PRESTO", "RW"])
@pytest.mark.parametrize("kind", ["changed", "removed", "added", "wrong type"])
def test_every_config_edit_is_refused_naming_the_file(tmp_path, name, kind, gmm_a, presto, rw, presto_data):
    model, _ = _estimators(gmm_a, presto, rw, presto_data)[name]
    path = model.save(tmp_path / "m")
    original = read_config(path)
    fields = _fields(original)
    assert len(fields) > 25 and ("params", "n_components" if name != "RW" else "n_models") in fields
    missed = []
    for field in fields:
        write_config(path, _edit(original, field, kind))
        try:
            load_model(path)
        except ValueError as err:
            if str(path / CONFIG_FILE) not in str(err):
                missed.append((field, f"message does not name the file: {err}"))
            continue
        missed.append((field, "loaded"))
    assert missed == [], missed


@pytest.mark.parametrize("which", [CONFIG_FILE, TENSOR_FILE])
@pytest.mark.parametrize("damage", ["truncated", "emptied", "garbage", "other model's", "deleted", "a directory"])
def test_every_damaged_file_is_refused_naming_the_file(tmp_path, which, damage, gmm_a, gmm_b):
    path, other = gmm_a.save(tmp_path / "m"), gmm_b.save(tmp_path / "other")
    target = path / which
    data = target.read_bytes()
    if damage == "truncated":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "emptied":
        target.write_bytes(b"")
    elif damage == "garbage":
        target.write_bytes(np.random.default_rng(1).bytes(len(data)))
    elif damage == "other model's":
        target.write_bytes((other / which).read_bytes())
    else:
        target.unlink()
        if damage == "a directory":
            target.mkdir()
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        GMM.load(path)
    assert str(target) in str(info.value)
    if damage in ("deleted", "a directory"):
        assert info.type is FileNotFoundError


@pytest.fixture(scope="module")
def saved_bytes(gmm_a, tmp_path_factory):
    path = gmm_a.save(tmp_path_factory.mktemp("corrupt") / "m")
    return {name: (path / name).read_bytes() for name in (CONFIG_FILE, TENSOR_FILE)}


def _corrupt(data: bytes, draw: Any) -> bytes:
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
    i = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    if kind == "truncate":
        return data[:i]
    if kind == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
    return data[:i] + data[i + draw(st.integers(1, 16)) :]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from([CONFIG_FILE, TENSOR_FILE]), data=st.data())
def test_random_corruption_is_refused_naming_the_file_or_is_harmless(saved_bytes, gmm_a, which, data):
    corrupted = _corrupt(saved_bytes[which], data.draw)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        for name, content in saved_bytes.items():
            (path / name).write_bytes(corrupted if name == which else content)
        try:
            loaded = GMM.load(path)
        except (ValueError, FileNotFoundError) as err:
            assert str(path / which) in str(err), err
        else:  # only an edit that keeps the content (JSON whitespace, "1e-06" -> "1E-06") may load
            assert which == CONFIG_FILE and same_gmm(loaded, gmm_a)
            assert config_checksum(json.loads(corrupted)) == config_checksum(json.loads(saved_bytes[which]))


# ------------------------------------------------------------------- schema (checksum forged)
SCHEMA_CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "fitted key injection": (lambda c: c["fitted"].update(predict="boom"), r"fitted\.predict is not a fitted"),
    "fitted dunder injection": (lambda c: c["fitted"].update(__class__="x"), r"fitted\.__class__"),
    "fitted wrong type": (lambda c: c["fitted"].update(n_iter_="many"), r"fitted\.n_iter_ must be"),
    "fitted negative count": (lambda c: c["fitted"].update(n_features_in_=-2), r"fitted\.n_features_in_"),
    "fitted names not strings": (lambda c: c["fitted"].update(feature_names_in_=[1, 2]), "feature_names_in_"),
    "history not numbers": (lambda c: c["fitted"].update(history_=["a"]), r"fitted\.history_"),
    "unknown param": (lambda c: c["params"].update(bogus=1), r"params\.bogus is not a constructor argument"),
    "param wrong type": (lambda c: c["params"].update(n_components="3"), r"params\.n_components must be int"),
    "param float for int": (lambda c: c["params"].update(max_iter=100.5), r"params\.max_iter must be int"),
    "param bool": (lambda c: c["params"].update(progress="no"), r"params\.progress must be bool"),
    "unknown dtype": (lambda c: c["params"].update(dtype={"__dtype__": "float512"}), r"params\.dtype"),
    "dtype as text": (lambda c: c["params"].update(dtype="float64"), r"params\.dtype must be a torch dtype"),
    "params not an object": (lambda c: c.update(params=[1]), "'params' must be an object"),
    "extra not an object": (lambda c: c.update(extra=[]), "'extra' must be an object"),
    "unknown top-level field": (lambda c: c.update(evil=1), "'evil' is not part of a ppmix model config"),
    "missing field": (lambda c: c.pop("fitted"), "'fitted' is missing"),
    "unknown class": (lambda c: c.update({"class": "NoSuchModel"}), "unknown model class"),
    "bad tensor checksum": (lambda c: c.update(tensors_sha256="0"), "tensors_sha256"),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_the_schema_holds_even_with_a_forged_checksum(tmp_path, gmm_a, case):
    edit, match = SCHEMA_CASES[case]
    path = gmm_a.save(tmp_path / "m")
    config = read_config(path)
    edit(config)
    write_config(path, config, reseal=True)
    with pytest.raises(ValueError, match=match) as info:
        load_model(path)
    assert str(path / CONFIG_FILE) in str(info.value)
    write_config(path, config)  # without the forged checksum: refused as modified, the field still named
    with pytest.raises(ValueError, match=f"was modified after it was saved.*{match}"):
        load_model(path)


def test_missing_required_param_is_refused(tmp_path, presto):
    path = presto.save(tmp_path / "m")
    config = read_config(path)
    del config["params"]["n_components"]
    write_config(path, config, reseal=True)
    with pytest.raises(ValueError, match="params lacks n_components"):
        PRESTO.load(path)


def _forge_tensors(path: Path, edit: Callable[[dict], None]) -> None:
    tensors = torch.load(path / TENSOR_FILE, weights_only=True)
    edit(tensors)
    torch.save(tensors, path / TENSOR_FILE)
    config = read_config(path)
    config["tensors_sha256"] = schema._sha256(path / TENSOR_FILE)
    write_config(path, config, reseal=True)


@pytest.mark.parametrize(
    "case, edit, match",
    [
        ("missing entry", lambda t: t.pop("state.loc"), "lacks the entry 'loc', which the settings in config.json"),
        ("NaN weights", lambda t: t["state.weights"].fill_(float("nan")), "'weights' holds NaN"),
        ("foreign entry", lambda t: t.update({"evil": torch.zeros(1)}), "unexpected entry 'evil'"),
        ("not a tensor", lambda t: t.update({"state.loc": [1.0]}), "is a list, not a tensor"),
    ],
)
def test_forged_tensor_files_are_refused_naming_the_file(tmp_path, gmm_a, case, edit, match):
    path = gmm_a.save(tmp_path / "m")
    _forge_tensors(path, edit)
    with pytest.raises(ValueError, match=match) as info:
        GMM.load(path)
    assert str(path / TENSOR_FILE) in str(info.value)


def test_another_class_whose_state_does_not_fit_is_a_value_error(tmp_path, gmm_a):
    path = gmm_a.save(tmp_path / "m")
    config = read_config(path)
    config["class"] = "ppmix.models.hmm.HMM"  # GMM's arguments are HMM arguments (but the weights' prior type, a
    config["params"].pop("weight_concentration_prior_type")  # Dirichlet for an HMM): only the state differs
    write_config(path, config, reseal=True)
    with pytest.raises(ValueError, match=r"tensors\.pt lacks the entry 'initial'.*a HMM with them holds"):
        load_model(path)
    with pytest.raises(ValueError, match="holds a HMM, not a GMM"):
        GMM.load(path)


# ---------------------------------------------------------------------------- format versions
def test_format_version_1_is_still_read_and_checked(tmp_path, gmm_a, caplog):
    assert FORMAT_VERSION == 2
    path = gmm_a.save(tmp_path / "m")
    config = read_config(path)
    del config["config_sha256"]
    config["format_version"] = 1
    write_config(path, config)
    with caplog.at_level(logging.WARNING, logger="ppmix.io"):
        assert same_gmm(GMM.load(path), gmm_a)
    assert "format version 1" in caplog.text and "save the model again" in caplog.text
    injected = copy.deepcopy(config)
    injected["fitted"]["predict"] = None
    write_config(path, injected)
    with pytest.raises(ValueError, match=r"config\.json: fitted\.predict is not a fitted attribute"):
        GMM.load(path)
    config["format_version"] = 2  # a version-2 file must carry its checksum
    write_config(path, config)
    with pytest.raises(ValueError, match=r"config\.json was modified"):
        GMM.load(path)


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, "2", None])
def test_other_format_versions_are_refused_naming_the_version(tmp_path, gmm_a, version):
    path = gmm_a.save(tmp_path / "m")
    config = read_config(path)
    config["format_version"] = version
    write_config(path, config, reseal=True)
    with pytest.raises(ValueError, match=rf"config\.json was written in ppmix model format version {version!r}"):
        GMM.load(path)


# ------------------------------------------------------------------------------ round trips
def test_round_trips_give_identical_predictions(tmp_path, gmm_a, presto, rw, presto_data):
    for name, (model, predict) in _estimators(gmm_a, presto, rw, presto_data).items():
        path = model.save(tmp_path / name)
        config = read_config(path)
        assert config["format_version"] == FORMAT_VERSION and config["config_sha256"] == config_checksum(config)
        loaded = type(model).load(path)
        np.testing.assert_array_equal(predict(loaded), predict(model))
        assert loaded.history_ == model.history_ and loaded.get_params() == model.get_params()
        # the checksum covers the content, not the layout: reformatting config.json is harmless
        (path / CONFIG_FILE).write_text(json.dumps(config, indent=None, sort_keys=True))
        np.testing.assert_array_equal(predict(type(model).load(path)), predict(model))
        # saving again over the same directory
        model.save(path)
        np.testing.assert_array_equal(predict(type(model).load(path)), predict(model))
        assert leftovers(path) == []
