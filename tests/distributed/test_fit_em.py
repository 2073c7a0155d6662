"""Exact EM on shards (issue 17): the sharded fit equals in-memory EM from the same start, for any number
and order of shards, on every executor; bad shards are named; a killed worker is survived."""

from __future__ import annotations

import copy
import os
import warnings

import numpy as np
import pandas as pd
import pytest

from ppmix.datasets import make_pf_synthetic
from ppmix.datasets.pf_hmm import make_pf_hmm_synthetic
from ppmix.distributed import fit_em
from ppmix.models import GMM, HMM
from ppmix.models.pf.pf_gmm import PFGMM, SupervisedGMM
from ppmix.models.pf.pf_hmm import PFHMM, SupervisedHMM
from ppmix.parallel import TaskError


def _rows(n: int = 701, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0, 0.0], [4.0, 0.0, 1.0], [0.0, 4.0, -1.0]])
    return centres[rng.integers(0, 3, n)] + rng.normal(size=(n, 3)) * [1.0, 0.7, 1.3]


def _sequences(n: int = 13, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        states = np.cumsum(rng.random(int(rng.integers(20, 60))) < 0.1) % 2
        out.append(np.c_[states * 3.0, -states * 2.0] + rng.normal(size=(len(states), 2)))
    return out


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _started(model, data):
    """``model`` after two EM iterations in memory: the common start of both fits."""
    _quiet(model.fit, data, max_iter=2)
    model.warm_start = True
    return model


def _split(data, n_shards: int, reverse: bool) -> list:
    parts = [list(p) if isinstance(data, list) else p for p in np.array_split(np.arange(len(data)), n_shards)]
    shards = [[data[i] for i in part] if isinstance(data, list) else data[part] for part in parts]
    return shards[::-1] if reverse else shards


def _assert_same_fit(sharded, in_memory) -> None:
    """Parameters and objective histories equal to rounding; with ``tol=0`` a fit at its exact fixed point may stop
    an iteration earlier or later (the last change is rounding), so the histories are compared where both ran."""
    common = min(len(sharded.history_), len(in_memory.history_))
    assert common >= 3
    np.testing.assert_allclose(sharded.history_[:common], in_memory.history_[:common], rtol=1e-10, atol=0)
    for name, value in in_memory._state_tensors().items():
        np.testing.assert_allclose(sharded._state_tensors()[name].numpy(), value.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True], ids=["in-order", "reversed"])
@pytest.mark.parametrize("n_shards", [1, 3, 7])
@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_gmm_on_shards_equals_in_memory_em(covariance_type, n_shards, reverse):
    x = _rows()
    start = _started(GMM(3, covariance_type=covariance_type, seed=0, progress=False), x)
    in_memory = _quiet(copy.deepcopy(start).fit, x, max_iter=25, tol=0.0)
    shards = _split(x, n_shards, reverse)
    sharded = _quiet(fit_em, copy.deepcopy(start), shards, executor="inline", max_iter=25, tol=0.0)
    _assert_same_fit(sharded, in_memory)
    assert sharded.n_iter_ == in_memory.n_iter_


@pytest.mark.parametrize("n_shards", [1, 3, 7])
def test_hmm_on_shards_equals_in_memory_em(n_shards):
    seqs = _sequences()
    start = _started(HMM(2, seed=0, progress=False), seqs)
    in_memory = _quiet(copy.deepcopy(start).fit, seqs, max_iter=6, tol=0.0)  # before the exact fixed point
    sharded = _quiet(fit_em, copy.deepcopy(start), _split(seqs, n_shards, True), executor="inline", max_iter=6, tol=0.0)
    _assert_same_fit(sharded, in_memory)


def _labelled_pairs(x, y, n_shards: int) -> list[tuple]:
    parts = np.array_split(np.arange(len(x)), n_shards)[::-1]
    return [([x[i] for i in p], [y[i] for i in p]) if isinstance(x, list) else (x[p], y[p]) for p in parts]


#: MAP-EM of the pf models (``priors``): the log prior is a global term, added once on the driver
_PF_PRIORS = {"locs_scale": 0.5, "variance_rate": 0.25}


@pytest.mark.parametrize("n_shards", [1, 3, 7])
@pytest.mark.parametrize(
    "cls, options",
    [(PFGMM, {"switch_prior": 0.3}), (SupervisedGMM, {}), (PFGMM, {"switch_prior": 0.3, "priors": _PF_PRIORS})],
    ids=["pf", "sup", "pf-map"],
)
def test_pf_gmm_on_shards_equals_in_memory_em(cls, options, n_shards):
    """The switches, labels (some missing) and the background fitted once from all shards; the ELBO's
    global terms added once on the driver."""
    data = make_pf_synthetic(600, n_relevant=2, n_features=5, seed=0)
    y = data.y.astype(float)
    y[::5] = np.nan
    start = _started(cls(3, seed=0, progress=False, **options), data.X)
    _quiet(start.fit, data.X, y, max_iter=2)
    in_memory = _quiet(copy.deepcopy(start).fit, data.X, y, max_iter=12, tol=0.0)
    shards = _labelled_pairs(data.X, y, n_shards)
    sharded = _quiet(fit_em, copy.deepcopy(start), shards, executor="inline", target="y", max_iter=12, tol=0.0)
    _assert_same_fit(sharded, in_memory)


@pytest.mark.parametrize("n_shards", [1, 3, 7])
@pytest.mark.parametrize(
    "cls, options",
    [(PFHMM, {"switch_prior": 0.3}), (SupervisedHMM, {}), (PFHMM, {"switch_prior": 0.3, "priors": _PF_PRIORS})],
    ids=["pf", "sup", "pf-map"],
)
def test_pf_hmm_on_shards_equals_in_memory_em(cls, options, n_shards):
    data = make_pf_hmm_synthetic(30, length=15, n_relevant=2, n_features=5, seed=1)
    x, y = [s / 4.0 for s in data.X], [v.astype(float) for v in data.y]  # overlapping states: many iterations
    y[0][:4] = np.nan
    start = cls(3, init_params="kmeans", seed=0, progress=False, **options)  # relevance starts converge in 5 steps
    _quiet(start.fit, x, y, max_iter=1)
    start.warm_start = True
    in_memory = _quiet(copy.deepcopy(start).fit, x, y, max_iter=10, tol=0.0)
    shards = _labelled_pairs(x, y, n_shards)
    sharded = _quiet(fit_em, copy.deepcopy(start), shards, executor="inline", target="y", max_iter=10, tol=0.0)
    assert sharded.n_iter_ == in_memory.n_iter_ == 10
    _assert_same_fit(sharded, in_memory)


def test_pf_gmm_from_labelled_parquet_shards(tmp_path):
    """A cold start from the shards' sample reaches the in-memory optimum; the label column is named by ``target``."""
    data = make_pf_synthetic(900, n_relevant=2, n_features=5, seed=2)
    names = [f"f{j}" for j in range(5)]
    paths = []
    for i, part in enumerate(np.array_split(np.arange(900), 3)):
        paths.append(tmp_path / f"part-{i}.parquet")
        pd.DataFrame(data.X[part], columns=names).assign(label=data.y[part]).to_parquet(paths[-1])
    # fit_em needs a numeric switch prior and makes one start: the in-memory reference too
    model = PFGMM(2, switch_prior=0.5, n_restarts=1, seed=0, progress=False)
    sharded = _quiet(fit_em, copy.deepcopy(model), paths, executor="inline", target="label")
    reference = _quiet(model.fit, pd.DataFrame(data.X, columns=names), data.y)
    assert sharded.feature_names_in_ == names
    assert sharded.lower_bound_ == pytest.approx(reference.lower_bound_, abs=1e-4)
    np.testing.assert_allclose(np.sort(sharded.relevance_), np.sort(reference.relevance_), atol=1e-4)


def test_pf_gmm_without_target_is_fitted_without_labels_as_in_memory():
    """No ``target=``: the shards carry no label, and the fit is the unlabelled one ``fit(X)`` makes."""
    data = make_pf_synthetic(600, n_relevant=2, n_features=4, seed=1)
    reference = _quiet(PFGMM(2, switch_prior=0.5, seed=0, progress=False, tol=1e-10, max_iter=500).fit, data.X)
    # continued on the shards from the in-memory optimum, sharded EM stays there: the same unlabelled objective
    warm = copy.deepcopy(reference).set_params(warm_start=True)
    sharded = _quiet(fit_em, warm, [data.X[:300], data.X[300:]], executor="inline")
    assert sharded.lower_bound_ == pytest.approx(reference.lower_bound_, abs=1e-6)
    cold = _quiet(
        fit_em, PFGMM(2, switch_prior=0.5, seed=0, progress=False), [data.X[:300], data.X[300:]], executor="inline"
    )
    assert np.isfinite(cold.lower_bound_) and cold.predict_proba(data.X).shape == (600, 2)


def test_the_start_from_a_sample_does_not_depend_on_the_shard_order():
    x = _rows(3000)
    shards = _split(x, 5, False)
    first = _quiet(fit_em, GMM(3, seed=1, tol=1e-6, progress=False), shards, executor="inline", sample_size=500)
    again = _quiet(fit_em, GMM(3, seed=1, tol=1e-6, progress=False), shards[::-1], executor="inline", sample_size=500)
    np.testing.assert_allclose(first.history_, again.history_, rtol=1e-10)
    assert first.fit_report_["start_sample_units"] == pytest.approx(500, abs=5)
    reference = _quiet(GMM(3, seed=1, tol=1e-6, progress=False).fit, x)
    assert first.lower_bound_ == pytest.approx(reference.lower_bound_, abs=1e-6)  # the same optimum


def test_shards_in_files_on_local_processes(tmp_path):
    x = _rows()
    names = ["a", "b", "c"]
    paths = []
    for i, part in enumerate(_split(x, 3, False)):
        if i == 0:
            paths.append(tmp_path / "part0.npy")
            np.save(paths[-1], part)
        else:  # named columns in another order: reordered to the first shard's... which has none
            paths.append(tmp_path / f"part{i}.csv")
            pd.DataFrame(part, columns=names).to_csv(paths[-1], index=False)
    start = _started(GMM(3, seed=0, progress=False), x)
    inline = _quiet(fit_em, copy.deepcopy(start), paths, executor="inline", max_iter=10, tol=0.0)
    pooled = _quiet(fit_em, copy.deepcopy(start), paths, executor=None, max_workers=2, max_iter=10, tol=0.0)
    _assert_same_fit(pooled, inline)
    assert [s["n_units"] for s in pooled.fit_report_["shards"]] == [234, 234, 233]


def test_columns_are_reordered_by_name_across_shards(tmp_path):
    x = _rows()
    parts = _split(x, 2, False)
    frames = [pd.DataFrame(parts[0], columns=["a", "b", "c"]), pd.DataFrame(parts[1], columns=["a", "b", "c"])]
    start = _started(GMM(3, seed=0, progress=False), x)
    straight = _quiet(fit_em, copy.deepcopy(start), frames, executor="inline", max_iter=5, tol=0.0)
    frames[1] = frames[1][["c", "a", "b"]]
    shuffled = _quiet(fit_em, copy.deepcopy(start), frames, executor="inline", max_iter=5, tol=0.0)
    _assert_same_fit(shuffled, straight)
    assert shuffled.feature_names_in_ == ["a", "b", "c"]
    frames[1] = frames[1].rename(columns={"c": "z"})
    with pytest.raises(TaskError, match="shard-1"):
        fit_em(copy.deepcopy(start), frames, executor="inline")


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.full((10, 3), np.nan), "NaN"),
        (np.ones((10, 2)), "features"),
        ("missing.npy", "does not exist"),
    ],
    ids=["nan", "width", "missing"],
)
def test_a_bad_shard_is_named(tmp_path, bad, match):
    shards = [_rows(50), str(tmp_path / bad) if isinstance(bad, str) else bad]
    with pytest.raises((TaskError, ValueError), match=match) as info:
        fit_em(GMM(2, seed=0, progress=False), shards, executor="inline")
    assert "shard-1" in str(info.value) or "missing.npy" in str(info.value)


def test_sequence_shards_given_to_a_mixture_are_named(tmp_path):
    np.savez(tmp_path / "seqs.npz", X=np.ones((6, 2)), lengths=np.array([2, 4]))
    with pytest.raises(TaskError, match=r"seqs.npz holds sequences .* GMM takes rows"):
        fit_em(GMM(2, seed=0, progress=False), [tmp_path / "seqs.npz"], executor="inline")


def test_settings_are_checked_before_any_shard_is_read():
    with pytest.raises(ValueError, match="n_init"):
        fit_em(GMM(2, n_init=0), [("not", "a", "shard")], executor="inline")
    with pytest.raises(TypeError, match="sharded EM"):
        fit_em(object(), [np.ones((3, 2))])
    with pytest.raises(ValueError, match="empty"):
        fit_em(GMM(2), [])


class _KillsItsWorker(GMM):
    """A GMM whose first E-step in a worker process kills that process (once: a marker file remembers)."""

    marker = ""
    driver = 0

    def _e_step(self, data):
        if os.getpid() != self.driver and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return super()._e_step(data)


def _killer(start: GMM, marker) -> _KillsItsWorker:
    killer = copy.deepcopy(start)
    killer.__class__ = _KillsItsWorker
    killer.marker, killer.driver = str(marker), os.getpid()
    return killer


def test_a_killed_worker_process_is_replaced_and_the_iteration_redone(tmp_path):
    x = _rows()
    start = _started(GMM(3, seed=0, progress=False), x)
    expected = _quiet(fit_em, copy.deepcopy(start), _split(x, 3, False), executor="inline", max_iter=6, tol=0.0)
    killer = _killer(start, tmp_path / "killed")
    got = _quiet(fit_em, killer, _split(x, 3, False), executor=None, max_workers=2, max_iter=6, tol=0.0)
    assert os.path.exists(tmp_path / "killed")
    _assert_same_fit(got, expected)


def test_on_a_dask_cluster_a_killed_worker_is_survived(tmp_path):
    """The shards live in the Dask workers' memory; a worker killed mid-fit loses its shards, which are read
    again on a live worker, and the fit equals the fit without the fault."""
    import distributed

    x = _rows()
    paths = []
    for i, part in enumerate(_split(x, 4, False)):
        paths.append(tmp_path / f"part{i}.npy")
        np.save(paths[-1], part)
    start = _started(GMM(3, seed=0, progress=False), x)
    expected = _quiet(fit_em, copy.deepcopy(start), paths, executor="inline", max_iter=6, tol=0.0)
    killer = _killer(start, tmp_path / "killed")
    options = {"n_workers": 2, "threads_per_worker": 1, "processes": True, "dashboard_address": None}
    with distributed.LocalCluster(**options) as cluster, distributed.Client(cluster) as client:
        got = _quiet(fit_em, killer, paths, executor=client, max_iter=6, tol=0.0)
    assert os.path.exists(tmp_path / "killed")
    _assert_same_fit(got, expected)


def test_dask_collections_are_sharded_by_block():
    """A Dask array's row blocks (and a Dask DataFrame's partitions) are the shards, computed where they are held."""
    import dask.array as da
    import dask.dataframe as dd
    import distributed

    x = _rows()
    start = _started(GMM(3, seed=0, progress=False), x)
    expected = _quiet(fit_em, copy.deepcopy(start), _split(x, 3, False), executor="inline", max_iter=5, tol=0.0)
    array = da.from_array(x, chunks=(234, 2))  # three row blocks, two column blocks (rechunked)
    inline = _quiet(fit_em, copy.deepcopy(start), array, executor="inline", max_iter=5, tol=0.0)
    _assert_same_fit(inline, expected)
    assert inline.fit_report_["n_shards"] == 3
    frame = dd.from_pandas(pd.DataFrame(x, columns=["a", "b", "c"]), npartitions=3)
    options = {"n_workers": 1, "threads_per_worker": 2, "processes": False, "dashboard_address": None}
    with distributed.LocalCluster(**options) as cluster, distributed.Client(cluster) as client:
        on_cluster = _quiet(fit_em, copy.deepcopy(start), frame, executor=client, max_iter=5, tol=0.0)
    _assert_same_fit(on_cluster, expected)
    assert on_cluster.feature_names_in_ == ["a", "b", "c"]


class _KillsItsWorkerAndRewrites(_KillsItsWorker):
    """Rewrites every shard file (twice the rows), then kills its worker (the first E-step of one worker process
    only: the marker file is created exclusively); the replacement reads the shards again."""

    shards: tuple = ()

    def _e_step(self, data):
        if os.getpid() != self.driver:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                for path in self.shards:
                    np.save(path, np.tile(np.load(path), (2, 1)))
                os._exit(1)
        return GMM._e_step(self, data)


@pytest.mark.parametrize("executor", ["processes", "dask"])
def test_a_shard_rewritten_before_a_replaced_worker_reads_it_is_named(tmp_path, executor):
    """Issue 39: a killed worker's replacement (a new local process, or another Dask worker) read the rewritten
    shard and the fit went on, on two versions of it."""
    import distributed

    x = _rows()
    paths = []
    for i, part in enumerate(_split(x, 3, False)):
        paths.append(str(tmp_path / f"part{i}.npy"))
        np.save(paths[-1], part)
    killer = _killer(_started(GMM(3, seed=0, progress=False), x), tmp_path / "killed")
    killer.__class__ = _KillsItsWorkerAndRewrites
    killer.shards = tuple(paths)
    changed = r"part\d.npy changed during the fit and was read again: it now has 46\d rows, 23\d when first read"
    with pytest.raises(TaskError, match=changed):
        if executor == "processes":
            _quiet(fit_em, killer, paths, executor=None, max_workers=2, max_iter=6, tol=0.0)
        else:
            options = {"n_workers": 2, "threads_per_worker": 1, "processes": True, "dashboard_address": None}
            with distributed.LocalCluster(**options) as cluster, distributed.Client(cluster) as client:
                _quiet(fit_em, killer, paths, executor=client, max_iter=6, tol=0.0)
    assert os.path.exists(tmp_path / "killed")


def test_dask_workers_restarted_for_memory_are_named_not_the_shards():
    """Issue 39: workers whose memory_limit is below what torch needs were restarted in a loop, with no error."""
    import distributed

    from ppmix.parallel import WorkerMemoryError

    options = {"n_workers": 1, "threads_per_worker": 1, "processes": True, "dashboard_address": None}
    with distributed.LocalCluster(memory_limit="150MB", **options) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(WorkerMemoryError, match=r"restart\(s\) for exceeding the memory limit \(memory_limit 14"):
            fit_em(GMM(2, seed=0, progress=False), [_rows(50)], executor=client, timeout=120)


# ------------------------------------------------------------------------------------------ sample weights
def _weighted_frames(x, weights, n_shards):
    frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(x.shape[1])]).assign(w=weights)
    return [frame.iloc[part] for part in np.array_split(np.arange(len(frame)), n_shards)]


@pytest.mark.parametrize("n_shards", [1, 3])
def test_a_weight_column_fits_as_sample_weight_in_memory(n_shards, tmp_path):
    """``weight="w"`` on Parquet shards: the fit equals ``fit(X, sample_weight=w)`` in memory from the same
    start, and integer weights equal the rows repeated in the shards."""
    x = _rows()
    w = np.random.default_rng(3).integers(0, 4, size=len(x)).astype(float)
    start = _started(GMM(3, covariance_type="full", seed=0, progress=False), x)
    in_memory = copy.deepcopy(start)
    _quiet(in_memory.fit, x, sample_weight=w, max_iter=15, tol=0.0)
    paths = []
    for i, frame in enumerate(_weighted_frames(x, w, n_shards)):
        paths.append(tmp_path / f"part-{i}.parquet")
        frame.to_parquet(paths[-1])
    sharded = _quiet(fit_em, copy.deepcopy(start), paths, executor="inline", weight="w", max_iter=15, tol=0.0)
    _assert_same_fit(sharded, in_memory)
    assert sharded.feature_names_in_ == ["f0", "f1", "f2"]  # the weight column is not a feature
    repeated = _quiet(fit_em, copy.deepcopy(start), _split(np.repeat(x, w.astype(int), axis=0), n_shards, False),
                      executor="inline", max_iter=15, tol=0.0)  # fmt: skip
    _assert_same_fit(sharded, repeated)
    assert sum(s["n_observations"] for s in sharded.fit_report_["shards"]) == pytest.approx(w.sum(), rel=1e-12)


def test_the_weighted_start_sample_follows_the_weights():
    """A row of weight zero never enters the start's sample (a shard whose rows all weigh zero is skipped); a fit
    from it finds the clusters of the weighted rows."""
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(size=(300, 2)), rng.normal(size=(300, 2)) + 8, rng.normal(size=(300, 2)) - 8]
    w = np.r_[np.ones(600), np.zeros(300)]  # the third cluster weighs nothing
    order = rng.permutation(len(x))  # every shard holds rows of every cluster
    frames = _weighted_frames(x[order], w[order], 3)
    model = _quiet(fit_em, GMM(2, seed=0, progress=False), frames, executor="inline", weight="w")
    np.testing.assert_allclose(np.sort(model.means_[:, 0].numpy()), [0.0, 8.0], atol=0.3)
    skipped = _weighted_frames(x, w, 3)  # the third shard: the zero-weight cluster alone, skipped
    model = _quiet(fit_em, GMM(2, seed=0, progress=False), skipped, executor="inline", weight="w")
    np.testing.assert_allclose(np.sort(model.means_[:, 0].numpy()), [0.0, 8.0], atol=0.3)


@pytest.mark.parametrize(
    "shards, options, error, match",
    [
        ([np.zeros((5, 2))], {"weight": "w"}, ValueError, "names a column"),
        ([pd.DataFrame({"a": [1.0, 2.0]})], {"weight": "w"}, ValueError, "no weight column 'w'"),
        ([pd.DataFrame({"a": [1.0, 2.0, 3.0], "w": [1.0, -1.0, 1.0]})], {"weight": "w"}, ValueError, "sample_weight"),
    ],
)
def test_bad_weights_in_shards_are_named(shards, options, error, match):
    with pytest.raises((error, TaskError), match=match):
        fit_em(GMM(1, seed=0, progress=False), shards, executor="inline", **options)


def _sequence_frame(seqs, weights, first_id):
    """Sequences as rows of a DataFrame with a sequence-id column ``seq`` and each row's sequence weight ``w``."""
    return pd.concat(
        pd.DataFrame(s, columns=["a", "b"]).assign(seq=f"s{first_id + i}", w=w)
        for i, (s, w) in enumerate(zip(seqs, weights))
    )


def test_hmm_sequence_weights_in_shards_fit_as_sample_weight_in_memory(tmp_path):
    """``weight="w"`` on an HMM's shards (DataFrames with a sequence column: the weight on each row, equal within
    its sequence; NPZ files: one per sequence) equals ``fit(X, sample_weight=w)`` in memory and the sequences
    repeated, from the same start."""
    seqs = _sequences()
    w = np.random.default_rng(3).integers(0, 4, size=len(seqs)).astype(float)
    w[:2] = (1.0, 2.0)
    start = _started(HMM(2, seed=0, progress=False, sequence_column="seq"), seqs)
    in_memory = _quiet(copy.deepcopy(start).fit, seqs, sample_weight=w, max_iter=6, tol=0.0)
    frames = [_sequence_frame(seqs[:6], w[:6], 0), _sequence_frame(seqs[6:], w[6:], 6)]
    sharded = _quiet(fit_em, copy.deepcopy(start), frames, executor="inline", weight="w", max_iter=6, tol=0.0)
    _assert_same_fit(sharded, in_memory)
    assert sharded.feature_names_in_ == ["a", "b"]
    np.savez(tmp_path / "seqs.npz", X=np.concatenate(seqs), lengths=[len(s) for s in seqs], w=w)
    from_npz = _quiet(fit_em, copy.deepcopy(start), [tmp_path / "seqs.npz"], executor="inline", weight="w",
                      max_iter=6, tol=0.0)  # fmt: skip
    _assert_same_fit(from_npz, in_memory)
    repeated = [s for s, count in zip(seqs, w) for _ in range(int(count))]
    _assert_same_fit(from_npz, _quiet(copy.deepcopy(start).fit, repeated, max_iter=6, tol=0.0))


def test_sequence_weights_must_be_equal_within_a_sequence():
    seqs = _sequences(4)
    frame = _sequence_frame(seqs, np.ones(4), 0)
    frame.iloc[len(seqs[0]) + 1, frame.columns.get_loc("w")] = 2.0  # one row of sequence s1 weighs otherwise
    with pytest.raises((ValueError, TaskError), match="rows of sequence 's1' have different weights"):
        fit_em(HMM(2, progress=False, sequence_column="seq"), [frame], executor="inline", weight="w")


@pytest.mark.parametrize("cls, options", [(PFGMM, {"switch_prior": 0.3}), (SupervisedGMM, {})], ids=["pf", "sup"])
def test_pf_gmm_weight_column_fits_as_sample_weight_in_memory(cls, options):
    """A pf-GMM's sharded weights (a weight column beside the label column) equal ``fit(X, y, sample_weight=w)`` in
    memory from the same start: the background and the label statistics counted with the weights too."""
    data = make_pf_synthetic(600, n_relevant=2, n_features=5, seed=0)
    y = data.y.astype(float)
    y[::5] = np.nan
    w = np.random.default_rng(3).integers(0, 4, 600).astype(float)
    start = _started(cls(3, seed=0, progress=False, **options), data.X)
    _quiet(start.fit, data.X, y, max_iter=2)
    in_memory = _quiet(copy.deepcopy(start).fit, data.X, y, sample_weight=w, max_iter=12, tol=0.0)
    frame = pd.DataFrame(data.X, columns=[f"f{j}" for j in range(5)]).assign(y=y, w=w)
    shards = [frame.iloc[part] for part in np.array_split(np.arange(600), 3)]
    sharded = _quiet(fit_em, copy.deepcopy(start), shards, executor="inline", target="y", weight="w", max_iter=12,
                     tol=0.0)  # fmt: skip
    _assert_same_fit(sharded, in_memory)
    assert sharded.feature_names_in_ == [f"f{j}" for j in range(5)]


def test_pf_hmm_sequence_weights_in_npz_shards_fit_as_sample_weight_in_memory(tmp_path):
    data = make_pf_hmm_synthetic(30, length=15, n_relevant=2, n_features=5, seed=1)
    x, y = [s / 4.0 for s in data.X], [v.astype(float) for v in data.y]
    w = np.random.default_rng(2).integers(0, 4, len(x)).astype(float)
    w[:2] = (1.0, 2.0)
    start = PFHMM(3, switch_prior=0.3, init_params="kmeans", seed=0, progress=False)
    _quiet(start.fit, x, y, max_iter=1)
    start.warm_start = True
    in_memory = _quiet(copy.deepcopy(start).fit, x, y, sample_weight=w, max_iter=8, tol=0.0)
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(x)), 2)):
        paths.append(tmp_path / f"part-{i}.npz")
        np.savez(paths[-1], X=np.concatenate([x[j] for j in part]), y=np.concatenate([y[j] for j in part]),
                 lengths=[len(x[j]) for j in part], w=w[part])  # fmt: skip
    sharded = _quiet(fit_em, copy.deepcopy(start), paths, executor="inline", target="y", weight="w", max_iter=8,
                     tol=0.0)  # fmt: skip
    _assert_same_fit(sharded, in_memory)
