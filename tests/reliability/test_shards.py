"""Shards that change, executors that hang and shards cut short (issue 39): a shard rewritten during a fit and
read again is named, never mixed into the fit; every wait on an executor ends, by a timeout naming the tasks;
a CSV cut short is named with its line; an empty shard is skipped."""

from __future__ import annotations

import warnings
from concurrent.futures import Executor, Future
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppmix.distributed import fit_distributed, fit_em, read_features
from ppmix.distributed import holders as holders_module
from ppmix.models import GMM
from ppmix.parallel import ExecutorTimeoutError, TaskError, run_tasks
from tests.common import InlineExecutor

MAX_ITER = 5


def _rows(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.r_[rng.normal(size=(n // 2, 2)), rng.normal(size=(n - n // 2, 2)) + 5.0]


class _EveryStepAFreshProcess(InlineExecutor):
    """Runs each task here, as a process that never held the shard would (a replaced worker, or another process
    of a pool): the shard is read again at every step. Before step call ``rewrite_at`` it runs ``rewrite``."""

    def __init__(self, rewrite_at: int, rewrite, watched: str) -> None:
        self.rewrite_at, self.rewrite, self.watched = rewrite_at, rewrite, watched
        self.calls = 0
        self.reread_after_rewrite = False

    def before(self, fn, args) -> None:
        if fn is holders_module._run_here:
            key, task = args[0], args[1]
            if self.calls == self.rewrite_at:
                self.rewrite()
            self.reread_after_rewrite |= self.calls >= self.rewrite_at and task.name == self.watched
            self.calls += 1
            holders_module._HELD.pop(key, None)


def _fit(paths, executor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_em(GMM(2, seed=0, progress=False), paths, executor=executor, max_iter=MAX_ITER, tol=0.0)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shards")
    for i in range(3):
        np.save(folder / f"part{i}.npy", _rows(60, i))
    return folder


@pytest.fixture(scope="module")
def clean_fit(shard_dir):
    paths = [shard_dir / f"part{i}.npy" for i in range(3)]
    return _fit(paths, _EveryStepAFreshProcess(-1, None, ""))


@settings(max_examples=12, deadline=None)
@given(
    rewrite_at=st.integers(0, 3 * (MAX_ITER + 1)),
    change=st.sampled_from(["more rows", "other values", "the same rows"]),
)
def test_a_shard_rewritten_during_a_fit_is_named_never_mixed_in(shard_dir, clean_fit, rewrite_at, change):
    """Whichever step the shard changes before, the fit either stops naming it and what changed, or (when it is not
    read again after the change, or the change keeps its content) equals the fit on the unchanged shards."""
    paths = [shard_dir / f"part{i}.npy" for i in range(3)]
    original = np.load(paths[1])
    new = {"more rows": np.r_[original, original], "other values": original + 1.0, "the same rows": original}[change]
    executor = _EveryStepAFreshProcess(rewrite_at, lambda: np.save(paths[1], new), str(paths[1]))
    try:
        fitted = _fit(paths, executor)
    except TaskError as err:
        assert executor.reread_after_rewrite and change != "the same rows", err
        message = str(err)
        assert str(paths[1]) in message and "changed during the fit" in message
        assert ("now has 120 rows, 60 when first read" if change == "more rows" else "content differs") in message
    else:
        assert not executor.reread_after_rewrite or change == "the same rows"
        np.testing.assert_allclose(fitted.history_, clean_fit.history_, rtol=1e-12)
        assert [s["n_units"] for s in fitted.fit_report_["shards"]] == [60, 60, 60]
    finally:
        np.save(paths[1], original)


class _NeverDone(Executor):
    """An executor whose tasks never finish (a cluster that lost its workers, or keeps restarting them)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        return Future()


def test_every_wait_on_an_executor_ends_by_a_timeout_naming_the_tasks(shard_dir):
    paths = [shard_dir / f"part{i}.npy" for i in range(2)]
    with pytest.raises(ExecutorTimeoutError, match=r"reading the shards: 2 task\(s\) did not finish within") as info:
        fit_em(GMM(2, seed=0, progress=False), paths, executor=_NeverDone(), timeout=0.2)
    assert info.value.pending == [str(p) for p in paths]
    with pytest.raises(ExecutorTimeoutError, match=r"run_tasks: 1 task\(s\) .*timeout=0.1 s \(stuck\)"):
        run_tasks(abs, [1], names=["stuck"], executor=_NeverDone(), timeout=0.1)
    pairs = [(np.load(p), np.zeros(60)) for p in paths]
    with pytest.raises(ExecutorTimeoutError, match=r"2 task\(s\) did not finish .* \(shard-0, shard-1\)"):
        fit_distributed(pairs, 2, executor=_NeverDone(), timeout=0.1)
    for bad in (0, -1.0, "60", True):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            fit_em(GMM(2), paths, executor=_NeverDone(), timeout=bad)
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            fit_distributed(pairs, 2, executor=_NeverDone(), timeout=bad)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_a_csv_cut_short_is_named_with_its_line(tmp_path_factory, data):
    """A CSV cut anywhere but at a line break (in a number, or between fields) is refused naming the file and its
    last line; cut at a line break, it is whole rows and is read."""
    frame = pd.DataFrame(np.round(_rows(8, 0), 6), columns=["a", "b"])
    text = frame.to_csv(index=False)
    header = len(text.splitlines()[0]) + 1
    cut = data.draw(st.integers(header + 1, len(text)), label="cut")
    path = tmp_path_factory.mktemp("cut") / "part.csv"
    path.write_text(text[:cut])
    if text[cut - 1] == "\n":
        x, _ = read_features(path)
        np.testing.assert_array_equal(x.to_numpy(), frame.to_numpy()[: text[:cut].count("\n") - 1])
        return
    line = text[:cut].count("\n") + 1
    with pytest.raises(ValueError, match=rf"shard .*part.csv ends without a line break: its last line \({line}\)"):
        read_features(path)
    with pytest.raises(TaskError, match=rf"part.csv: .*last line \({line}\) may be cut"):
        fit_em(GMM(2, seed=0, progress=False), [path], executor="inline")


def test_empty_shards_are_skipped_but_all_empty_is_refused(shard_dir):
    """An empty shard (an empty partition after a filter) adds nothing to the fit; no data at all is refused."""
    import dask.dataframe as dd

    parts = [np.load(shard_dir / f"part{i}.npy") + [0.0, 100.0 * i] for i in range(3)]
    frame = dd.from_pandas(pd.DataFrame(np.concatenate(parts), columns=["a", "b"]), npartitions=3)
    assert frame.npartitions == 3
    filtered = frame[frame.b < 50.0]  # the second and third partitions are empty after the filter
    fitted = _fit(filtered, "inline")
    reference = _fit([parts[0]], "inline")
    np.testing.assert_allclose(fitted.history_, reference.history_, rtol=1e-10)
    assert [s["n_units"] for s in fitted.fit_report_["shards"]] == [60, 0, 0]
    with pytest.raises(ValueError, match="every shard is empty"):
        fit_em(GMM(2), frame[frame.a > 1e9], executor="inline")
