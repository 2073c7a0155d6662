"""The shared task runner: order, retries, named failures, process pool and Dask."""

from __future__ import annotations

import os
import signal
import time

import distributed
import pytest

from ppmix import parallel
from ppmix.parallel import TaskError, run_tasks, shutdown_pools


def _square(x: int) -> int:
    return x * x


def _fail_on_negative(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative input {x}")
    return x


def _fail_first_time(path: str) -> str:
    """Fails on the first call for a path (marker file absent), succeeds on the retry."""
    if not os.path.exists(path):
        open(path, "w").close()
        raise OSError("transient")
    return "ok"


def test_inline_results_keep_input_order():
    results = run_tasks(_square, [3, 1, 2], names=["a", "b", "c"], executor="inline")
    assert [r.value for r in results] == [9, 1, 4]
    assert [r.name for r in results] == ["a", "b", "c"]
    assert all(r.seconds >= 0 and r.attempts == 1 for r in results)


def test_failures_are_named_after_retries():
    with pytest.raises(TaskError, match="shard-b: ValueError: negative input -2") as info:
        run_tasks(_fail_on_negative, [1, -2, 3], names=["shard-a", "shard-b", "shard-c"], executor="inline")
    assert set(info.value.failures) == {"shard-b"}


def test_transient_failure_is_retried(tmp_path):
    results = run_tasks(_fail_first_time, [str(tmp_path / "marker")], executor="inline", retries=1)
    assert results[0].value == "ok" and results[0].attempts == 2
    with pytest.raises(TaskError):
        run_tasks(_fail_first_time, [str(tmp_path / "other")], executor="inline", retries=0)


def test_process_pool_matches_inline():
    pooled = run_tasks(_square, range(5), max_workers=2)
    assert [r.value for r in pooled] == [0, 1, 4, 9, 16]


def test_dask_client_is_accepted():
    cluster_options = {"n_workers": 1, "threads_per_worker": 1, "processes": False, "dashboard_address": None}
    with distributed.LocalCluster(**cluster_options) as cluster:
        with distributed.Client(cluster) as client:
            results = run_tasks(_square, [2, 3], executor=client)
    assert [r.value for r in results] == [4, 9]


def test_bad_arguments():
    with pytest.raises(TypeError, match="executor must be"):
        run_tasks(_square, [1], executor=42)
    with pytest.raises(ValueError, match="names has 1 entries"):
        run_tasks(_square, [1, 2], names=["x"], executor="inline")
    with pytest.raises(ValueError, match="retries"):
        run_tasks(_square, [1], executor="inline", retries=-1)


def _worker_pid(_: object) -> int:
    return os.getpid()


def test_the_local_pool_is_kept_for_later_calls_and_replaced_when_a_worker_died():
    """executor=None starts the pool once (its start-up costs seconds); a dead worker means a fresh pool, no error."""
    shutdown_pools()
    first = {r.value for r in run_tasks(_worker_pid, range(6), max_workers=2)}
    pool = parallel._SHARED_POOLS[2]
    assert {r.value for r in run_tasks(_worker_pid, range(6), max_workers=2)} <= first
    assert parallel._SHARED_POOLS[2] is pool  # the same pool, the same workers
    os.kill(next(iter(first)), signal.SIGKILL)  # a worker dies between calls
    time.sleep(1.0)
    assert len(run_tasks(_worker_pid, range(6), max_workers=2)) == 6
    assert parallel._SHARED_POOLS[2] is not pool
    shutdown_pools()
    assert not parallel._SHARED_POOLS


def _raises_timeout(x: int) -> int:
    raise TimeoutError(f"the task's own timeout {x}")


def test_a_task_that_raises_timeout_error_is_a_task_failure_not_a_timeout_of_the_wait():
    with pytest.raises(TaskError, match="t0: TimeoutError: the task's own timeout 7"):
        run_tasks(_raises_timeout, [7], names=["t0"], executor="inline", retries=0, timeout=5.0)


def _write_pid_then_hang(path: str) -> None:
    with open(path, "w") as file:
        file.write(str(os.getpid()))
    time.sleep(3600)


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_task_that_never_ends_times_out_naming_it_and_its_worker_is_stopped(tmp_path):
    """Issue 39: nothing in the executor path had a timeout. The worker of a task that timed out is killed:
    it would run on after the call, and the interpreter's exit would wait for it."""
    from ppmix.parallel import ExecutorTimeoutError

    run_tasks(_square, [1], max_workers=1)  # the pool started: the timeout below is the task's, not the start's
    path = tmp_path / "pid"
    with pytest.raises(ExecutorTimeoutError, match=r"run_tasks: 1 task\(s\) did not finish within timeout=1 s \(stuck"):
        run_tasks(_write_pid_then_hang, [str(path)], names=["stuck"], max_workers=1, timeout=1.0)
    pid = int(path.read_text())
    for _ in range(100):
        if _gone(pid):
            break
        time.sleep(0.1)
    assert _gone(pid)
    assert 1 not in parallel._SHARED_POOLS  # the next call starts a fresh pool
