"""Faults in the task runner are survived or named: a killed worker on a process pool and on a Dask
cluster, and a task that always kills its worker."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import distributed
import pytest

from ppmix.parallel import TaskError, run_tasks


def _kill_worker_first_time(task: tuple[str, int]) -> int:
    """Kills its own worker process on the first call for ``path`` (no marker yet), then succeeds."""
    path, value = task
    if path and not os.path.exists(path):
        open(path, "w").close()
        os._exit(1)
    return value * value


def _always_kill_worker(value: int) -> int:
    if value < 0:
        os._exit(1)
    return value


def test_a_killed_worker_is_replaced_and_its_task_retried(tmp_path):
    tasks = [("", 1), (str(tmp_path / "marker"), 2), ("", 3)]
    results = run_tasks(_kill_worker_first_time, tasks, names=["a", "killer", "c"], max_workers=2)
    assert [r.value for r in results] == [1, 4, 9]
    assert results[1].attempts == 2


def test_a_task_that_always_kills_its_worker_is_named():
    with pytest.raises(TaskError, match="killer") as info:
        run_tasks(_always_kill_worker, [1, -1], names=["fine", "killer"], max_workers=1)
    assert "killer" in info.value.failures
    assert "BrokenProcessPool" in str(info.value)


def test_a_broken_pool_the_caller_owns_is_named_not_retried():
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(TaskError, match="process pool broke") as info:
            run_tasks(_always_kill_worker, [-1], names=["killer"], executor=pool)
    assert set(info.value.failures) == {"killer"}


def test_a_killed_dask_worker_is_restarted_and_the_task_completes(tmp_path):
    options = {"n_workers": 1, "threads_per_worker": 1, "processes": True, "dashboard_address": None}
    with distributed.LocalCluster(**options) as cluster, distributed.Client(cluster) as client:
        results = run_tasks(_kill_worker_first_time, [(str(tmp_path / "m"), 3), ("", 4)], executor=client)
    assert [r.value for r in results] == [9, 16]


def test_a_bad_shard_is_named_at_once_not_retried(tmp_path):
    import numpy as np
    import pandas as pd

    from ppmix.distributed import fit_distributed

    rng = np.random.default_rng(0)
    good = tmp_path / "good.csv"
    pd.DataFrame({"a": rng.normal(size=80), "b": rng.normal(size=80), "y": rng.normal(size=80)}).to_csv(good)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"a": rng.normal(size=80), "b": rng.normal(size=80)}).to_csv(bad)  # no target column
    with pytest.raises(TaskError, match="bad.csv") as info:
        fit_distributed([good, bad], 2, executor="inline", n_init=1, retries=3)
    (error,) = info.value.failures.values()
    assert "y" in str(error)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"n_init": 0}, "n_init"), ({"expert": "bogus"}, "expert"), ({"max_iter": 0}, "max_iter")],
    ids=["n_init", "expert", "max_iter"],
)
def test_settings_that_fail_everywhere_are_refused_before_any_task(kwargs, match):
    from ppmix.distributed import fit_distributed

    # the shard is not even a valid (X, y) pair: a task sent would fail on it, not on the setting
    with pytest.raises(ValueError, match=match):
        fit_distributed([("not", "read")], 2, executor="inline", **kwargs)


def test_a_shard_listed_twice_is_refused(tmp_path):
    from ppmix.distributed import fit_distributed

    with pytest.raises(ValueError, match="more than once"):
        fit_distributed([tmp_path / "a.csv", tmp_path / "b.csv", str(tmp_path / "a.csv")], 2)
