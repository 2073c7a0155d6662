"""The thread policy: one thread for small passes or a busy CPU, torch's count otherwise, restored after."""

from __future__ import annotations

import pytest
import torch

from ppmix.inference import run_em
from ppmix.ops import threads
from ppmix.ops.threads import PARALLEL_WORK, cpu_busy, set_thread_policy, threads_for, torch_threads


@pytest.fixture
def two_threads():
    """Torch at 2 threads, the policy at its default, both restored after the test."""
    previous_policy = set_thread_policy("auto")
    with torch_threads(2):
        yield
    set_thread_policy(previous_policy)


def test_small_passes_run_on_one_thread_and_large_ones_keep_torchs_count(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "cpu_busy", lambda: False)
    assert threads_for(PARALLEL_WORK / 2) == 1
    assert threads_for(PARALLEL_WORK * 2) == 2
    monkeypatch.setattr(threads, "cpu_busy", lambda: True)  # a busy CPU: one thread whatever the size
    assert threads_for(PARALLEL_WORK * 1e3) == 1


def test_policy_torch_leaves_the_count_alone_and_the_policy_never_raises_it(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "cpu_busy", lambda: True)
    assert set_thread_policy("torch") == "auto"
    assert threads_for(1.0) == 2
    set_thread_policy("auto")
    with torch_threads(1):  # a user who chose one thread keeps it for large passes too
        monkeypatch.setattr(threads, "cpu_busy", lambda: False)
        assert threads_for(PARALLEL_WORK * 1e3) == 1


def test_bad_policy_is_refused_naming_it():
    with pytest.raises(ValueError, match="policy must be one of"):
        set_thread_policy("fast")


@pytest.mark.parametrize(("avg10", "busy"), [("55.20", True), ("10.00", True), ("2.50", False)])
def test_cpu_busy_reads_the_some_line_of_the_pressure_file(tmp_path, avg10, busy):
    pressure = tmp_path / "cpu"
    pressure.write_text(
        f"some avg10={avg10} avg60=1.00 avg300=1.00 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert cpu_busy(pressure) is busy


@pytest.mark.parametrize(("load", "busy"), [(64.0, True), (0.0, False)])
def test_without_pressure_information_the_load_average_decides(tmp_path, monkeypatch, load, busy):
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    assert cpu_busy(tmp_path / "missing") is busy


class CountingThreads:
    """An EM stand-in that records torch's thread count in every E-step."""

    n_init, init_iter, max_iter, tol, warm_start, progress, is_fitted = 2, None, 3, 0.0, False, False, False

    def __init__(self, n_obs):
        self.n_obs, self.seen, self.initialised_on, self.value = n_obs, [], [], 0.0

    def _em_data(self, data):
        return data

    def _n_observations(self, data):
        return self.n_obs

    def _em_initialize(self, data, generator):
        self.initialised_on.append(torch.get_num_threads())
        self.value = 0.0

    def _e_step(self, data):
        self.seen.append(torch.get_num_threads())
        self.value += 1.0
        return None, torch.tensor(self.value, dtype=torch.float64)

    def _m_step(self, data, stats):
        pass

    def _get_globals(self):
        return {"theta": torch.zeros(10)}

    def _set_globals(self, values):
        pass

    def _generator(self, offset=0):
        return torch.Generator().manual_seed(offset)


@pytest.mark.filterwarnings("ignore::ppmix.inference.ConvergenceWarning")
def test_run_em_runs_its_passes_under_the_policys_count_and_restores_torchs(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "cpu_busy", lambda: False)
    small = CountingThreads(n_obs=100)  # 100 rows x 10 values: far below PARALLEL_WORK
    run_em(small, None)
    assert small.seen and set(small.seen) == {1}
    large = CountingThreads(n_obs=int(PARALLEL_WORK))  # x 10 values: above it
    run_em(large, None)
    assert set(large.seen) == {2}
    assert torch.get_num_threads() == 2
    set_thread_policy("torch")
    small = CountingThreads(n_obs=100)
    run_em(small, None)
    assert set(small.seen) == {2}


def test_presto_fit_leaves_torchs_count_as_it_found_it(two_threads):
    import numpy as np

    from ppmix.optimizers.presto import PRESTO

    x = np.random.default_rng(0).normal(size=(60, 2))
    PRESTO(2, "linear", seed=0, progress=False, max_iter=3).fit(x, x[:, 0] * (x[:, 1] > 0))
    assert torch.get_num_threads() == 2


@pytest.mark.filterwarnings("ignore::ppmix.inference.ConvergenceWarning")
def test_on_a_busy_cpu_run_em_initialises_on_one_thread_too(two_threads, monkeypatch):
    """The first start's initialisation (k-means, before the size of a pass is known) follows the CPU's load."""
    monkeypatch.setattr(threads, "cpu_busy", lambda: True)
    busy = CountingThreads(n_obs=int(PARALLEL_WORK))
    run_em(busy, None)
    assert busy.initialised_on == [1, 1] and set(busy.seen) == {1}
    monkeypatch.setattr(threads, "cpu_busy", lambda: False)
    idle = CountingThreads(n_obs=100)  # idle: the first initialisation keeps torch's count, the small passes one
    run_em(idle, None)
    assert idle.initialised_on == [2, 1] and set(idle.seen) == {1}
