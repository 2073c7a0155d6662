"""Distributed MoE fitting: same model on a process pool and a real Dask cluster, order independence, named failures."""

from __future__ import annotations

import distributed
import numpy as np
import pandas as pd
import pytest

from ppmix.datasets.moe import make_moe
from ppmix.distributed import fit_distributed, read_shard
from ppmix.parallel import TaskError
from tests.common import InlineExecutor

FAST = {"n_init": 2, "max_iter": 30}


def parameters(model) -> np.ndarray:
    return np.concatenate(
        [t.numpy().ravel() for t in (model.gate_coef_, model.gate_intercept_, model.coef_, model.intercept_)]
    )


@pytest.fixture(scope="module")
def data():
    return make_moe(1600, n_experts=2, n_features=3, param_range=2, seed=3)


def write_shards(data, directory, kinds=("parquet", "csv", "npz", "parquet")) -> list[str]:
    """One file per kind: Parquet and CSV with named columns and a ``y`` column, NPZ with ``X`` and ``y``."""
    paths = []
    m = len(kinds)
    for i, kind in enumerate(kinds):
        x, y = data.X[i::m], data.y[i::m]
        path = directory / f"part-{i}.{kind}"
        if kind == "npz":
            np.savez(path, X=x, y=y)
        else:
            frame = pd.DataFrame(x, columns=[f"x{j}" for j in range(x.shape[1])]).assign(y=y)
            frame.to_parquet(path) if kind == "parquet" else frame.to_csv(path, index=False)
        paths.append(str(path))
    return paths


@pytest.mark.filterwarnings("ignore:EM did not converge")
def test_process_pool_and_dask_cluster_give_the_same_model(data, tmp_path):
    """Both rounds (rounds=2: the second round's tasks travel to the workers too) on every executor."""
    paths = write_shards(data, tmp_path)
    pooled = fit_distributed(paths, 2, executor=None, max_workers=2, rounds=2, **FAST)
    options = {"n_workers": 2, "threads_per_worker": 1, "processes": True, "dashboard_address": None}
    with distributed.LocalCluster(**options) as cluster, distributed.Client(cluster) as client:
        on_dask = fit_distributed(paths, 2, executor=client, rounds=2, **FAST)
    inline = fit_distributed(paths, 2, executor="inline", rounds=2, **FAST)
    for fit in (on_dask, inline):
        np.testing.assert_allclose(parameters(fit.model), parameters(pooled.model), rtol=1e-10, atol=1e-10)
        one_round = parameters(fit.one_round_model)
        np.testing.assert_allclose(one_round, parameters(pooled.one_round_model), rtol=1e-10, atol=1e-10)
    assert pooled.shard_names == paths and pooled.n_rows == [400] * 4
    assert pooled.gate_rounds.n_passes >= 2 and len(pooled.gate_rounds.shard_seconds[0]) == 4
    assert pooled.critical_path_seconds == pytest.approx(
        max(pooled.local_seconds) + pooled.aggregation_seconds + pooled.gate_rounds.critical_path_seconds
    )
    assert pooled.X_support.shape == (4 * 100, 3)  # ceil(N_m / M) rows from every shard


@pytest.mark.filterwarnings("ignore:EM did not converge")
@pytest.mark.parametrize("rounds", [1, 2])
def test_result_does_not_depend_on_shard_order(data, rounds):
    shards = [(data.X[i::4], data.y[i::4]) for i in range(4)]
    forward = fit_distributed(shards, 2, executor="inline", rounds=rounds, **FAST)
    backward = fit_distributed(shards[::-1], 2, executor="inline", rounds=rounds, **FAST)
    np.testing.assert_allclose(parameters(forward.model), parameters(backward.model), rtol=1e-12)
    np.testing.assert_allclose(parameters(forward.local_models[0]), parameters(backward.local_models[3]), rtol=1e-12)


@pytest.mark.filterwarnings("ignore:EM did not converge")
def test_reduction_of_shards_is_close_to_the_truth(data):
    shards = [(data.X[i::4], data.y[i::4]) for i in range(4)]
    fit = fit_distributed(shards, 2, executor="inline", n_init=3, max_iter=100)
    truth = data.true_model()
    assert (
        fit.model.log_likelihood(data.X, data.y) / len(data.y)
        > truth.log_likelihood(data.X, data.y) / len(data.y) - 0.05
    )


@pytest.mark.filterwarnings("ignore:EM did not converge")
def test_corrupt_shard_is_named_after_one_retry(data, tmp_path):
    paths = write_shards(data, tmp_path, kinds=("parquet", "parquet", "parquet"))
    (tmp_path / "part-1.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(TaskError) as info:
        fit_distributed(paths, 2, executor="inline", **FAST)
    assert set(info.value.failures) == {paths[1]}
    assert "part-1.parquet" in str(info.value)


@pytest.mark.parametrize(
    "case, match",
    [
        ("too-few-rows", "not more than the"),
        ("non-binary", "binary"),
        ("nan", "contains NaN"),
        ("missing-target", "no target column 'y'"),
        ("bad-suffix", "unsupported type"),
    ],
)
def test_bad_shards_fail_by_name(case, match, tmp_path):
    good = make_moe(400, expert="logistic", n_experts=2, n_features=3, seed=0)
    x, y = good.X[:200], good.y[:200]
    bad = {
        "too-few-rows": (x[:10], y[:10]),
        "non-binary": (x, y + 1),
        "nan": (np.where(np.eye(200, 3) > 0, np.nan, x), y),
        "missing-target": pd.DataFrame(x, columns=["a", "b", "c"]),
        "bad-suffix": str(tmp_path / "part.xlsx"),
    }[case]
    if case == "bad-suffix":
        (tmp_path / "part.xlsx").write_text("x")
    shards = [(good.X[200:], good.y[200:]), bad]
    with pytest.raises(TaskError, match=match) as info:
        fit_distributed(shards, 2, expert="logistic", executor="inline", **FAST)
    assert list(info.value.failures) == [str(bad) if case == "bad-suffix" else "shard-1"]


@pytest.mark.filterwarnings("ignore:EM did not converge")
def test_shards_with_different_feature_counts_are_rejected(data):
    shards = [(data.X[:800], data.y[:800]), (data.X[800:, :2], data.y[800:])]
    with pytest.raises(ValueError, match="different numbers of features"):
        fit_distributed(shards, 2, executor="inline", **FAST)


def test_bad_arguments():
    with pytest.raises(ValueError, match="shards is empty"):
        fit_distributed([], 2)
    with pytest.raises(ValueError, match="n_experts must be an integer >= 2"):
        fit_distributed([(np.zeros((5, 1)), np.zeros(5))], 1)
    with pytest.raises(ValueError, match="support_size"):
        fit_distributed([(np.zeros((5, 1)), np.zeros(5))], 2, support_size=0)
    with pytest.raises(TypeError, match="a shard must be"):
        read_shard(42)
    with pytest.raises(ValueError, match=r"model_options\['priors'\] is not taken by fit_distributed"):
        fit_distributed([(np.zeros((5, 1)), np.zeros(5))], 2, model_options={"priors": {}})


def test_n_experts_may_be_a_numpy_integer():
    data = make_moe(300, n_experts=2, n_features=2, seed=0)
    parts = [(data.X[i::2], data.y[i::2]) for i in range(2)]
    fit = fit_distributed(parts, np.int64(2), executor="inline", n_init=1, max_iter=20)
    assert fit.model.n_experts == 2 and isinstance(fit.model.n_experts, int)


def _named_shards(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(400, 2))
    y = np.where(x[:, 0] > 0, 2 * x[:, 1], -2 * x[:, 1]) + 0.1 * rng.normal(size=400)
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "y": y})
    return frame.iloc[:200], frame.iloc[200:]


def test_a_shard_with_reordered_columns_is_aligned_by_name(tmp_path):
    first, second = _named_shards()
    first.to_csv(tmp_path / "s0.csv", index=False)
    second.to_csv(tmp_path / "s1.csv", index=False)
    reference = fit_distributed([tmp_path / "s0.csv", tmp_path / "s1.csv"], 2, executor="inline", n_init=1)
    second[["b", "y", "a"]].to_csv(tmp_path / "s1.csv", index=False)
    reordered = fit_distributed([tmp_path / "s0.csv", tmp_path / "s1.csv"], 2, executor="inline", n_init=1)
    frame = pd.concat([first, second])[["a", "b"]]
    np.testing.assert_array_equal(reference.model.predict(frame), reordered.model.predict(frame))
    assert reordered.model.feature_names_in_ == ["a", "b"]


def test_a_shard_with_other_column_names_is_refused_naming_it():
    first, second = _named_shards()
    with pytest.raises(TaskError, match=r"shard-1.*missing \['a'\].*\['c'\]"):
        fit_distributed([first, second.rename(columns={"a": "c"})], 2, executor="inline", n_init=1, retries=0)


class _RewritesAfter(InlineExecutor):
    """Runs tasks here; after the first ``n`` it rewrites a shard file (between the first and the second round)."""

    def __init__(self, n: int, rewrite) -> None:
        self.n, self.rewrite, self.calls = n, rewrite, 0

    def before(self, fn, args) -> None:
        if self.calls == self.n:
            self.rewrite()
        self.calls += 1


@pytest.mark.filterwarnings("ignore:EM did not converge")
@pytest.mark.parametrize("change", ["more rows", "other values"])
def test_a_shard_rewritten_between_the_rounds_is_named(data, tmp_path, change):
    """Issue 39: the second round read every shard again, and fitted the gate on whatever the file held then."""
    paths = write_shards(data, tmp_path, ("npz", "npz"))
    with np.load(paths[1]) as arrays:
        x, y = arrays["X"], arrays["y"]
    new = (np.r_[x, x], np.r_[y, y]) if change == "more rows" else (x + 1.0, y)
    executor = _RewritesAfter(2, lambda: np.savez(paths[1], X=new[0], y=new[1]))
    what = "it now has 1600 rows, 800 when first read" if change == "more rows" else "its content differs"
    with pytest.raises(TaskError, match=rf"part-1.npz changed during the fit and was read again: {what}"):
        fit_distributed(paths, 2, executor=executor, rounds=2, refit_poor_fits=False, **FAST)
