"""The ``ppmix`` command, run end to end in a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from ppmix import GMM
from ppmix.cli import main
from ppmix.experiments import registry
from tests.common import make_sequences


def run(*args, check=True):
    return subprocess.run(
        [sys.executable, "-m", "ppmix.cli", *args], capture_output=True, text=True, check=check, timeout=300
    )


def test_fit_gmm_writes_model_summary_and_plot(tmp_path):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-4, 1, (100, 2)), rng.normal(4, 1, (100, 2))])
    pd.DataFrame(x, columns=["a", "b"]).to_csv(tmp_path / "data.csv", index=False)
    out = tmp_path / "out"
    result = run(
        "fit", "gmm", str(tmp_path / "data.csv"), "--k", "2", "--covariance", "full", "--out", str(out), "--quiet"
    )
    assert "fitted GMM(k=2, full)" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["feature_names"] == ["a", "b"] and summary["n_samples"] == 200
    assert sorted(round(m[0]) for m in summary["means"]) == [-4, 4]
    assert (out / "plot.png").stat().st_size > 1000
    loaded = GMM.load(out / "model")
    assert loaded.score(x) == pytest.approx(summary["mean_log_likelihood"], rel=1e-12)  # summed in another order


PROGRESS_LINE = re.compile(r"\[ *\d+\.\ds\] ")


def error_line(argv, capsys):
    """The one error line of ``main(argv)`` on stderr, which must exit with code 2; only progress lines
    (``[  1.2s] ...``, for work that had started when the error was found) may come before it."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert all(PROGRESS_LINE.match(line) for line in lines[:-1]), lines
    return lines[-1]


def test_fit_reports_bad_csv_clearly(tmp_path, capsys):
    pd.DataFrame({"a": [1.0, 2.0], "name": ["x", "y"]}).to_csv(tmp_path / "bad.csv", index=False)
    line = error_line(["fit", "gmm", str(tmp_path / "bad.csv"), "--k", "1", "--out", str(tmp_path / "o")], capsys)
    assert "non-numeric columns ['name']" in line
    line = error_line(["fit", "gmm", str(tmp_path / "missing.csv"), "--k", "1", "--out", str(tmp_path / "o")], capsys)
    assert "not found" in line
    pd.DataFrame({"a": [1.0, 2.0]}).to_csv(tmp_path / "tiny.csv", index=False)
    argv = ["fit", "gmm", str(tmp_path / "tiny.csv"), "--k", "3", "--out", str(tmp_path / "o"), "--quiet"]
    assert "n_components=3 is larger than the number of samples" in error_line(argv, capsys)


@pytest.mark.parametrize(
    "args",
    [[], ["fit"], ["fit", "gmm"], ["fit", "hmm"], ["fit", "pfgmm"], ["fit", "moe"], ["reproduce"], ["demo"], ["dmoe"]],
    ids=" ".join,
)
def test_help_everywhere(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--help"])
    assert exit_info.value.code == 0
    assert "usage: ppmix" in capsys.readouterr().out


def test_reproduce_list_and_unknown_name(capsys):
    assert main(["reproduce", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(item.name in listed for item in registry.registered()) and listed.strip()
    assert "unknown reproduction 'nope'" in error_line(["reproduce", "nope"], capsys)


def test_demo_runs(tmp_path):
    result = run("demo", "--n", "300", "--svi-steps", "50", "--out", str(tmp_path))
    assert "planted" in result.stdout and (tmp_path / "em" / "plot.png").exists()


def _refuse_non_standard(constant: str):
    raise AssertionError(f"the JSON holds {constant}, which is not standard JSON")


def test_dmoe_fits_parquet_shards_on_the_local_pool(tmp_path):
    from ppmix.datasets.moe import make_moe
    from ppmix.models.moe import MixtureOfExperts

    data = make_moe(900, n_experts=2, n_features=2, param_range=2, seed=1)
    for i in range(3):
        frame = pd.DataFrame(data.X[i::3], columns=["u", "v"]).assign(target=data.y[i::3])
        frame.to_parquet(tmp_path / f"part-{i}.parquet")
    out = tmp_path / "out"
    result = run(
        "dmoe", "--shards", str(tmp_path / "part-*.parquet"), "--target", "target", "--experts", "2",
        "--workers", "2", "--n-init", "2", "--rounds", "2", "--round-objective", "likelihood", "--out", str(out),
    )  # fmt: skip
    assert "reduced 3 local gaussian MoE fits" in result.stdout
    progress = [line.split("] ", 1)[1] for line in result.stderr.splitlines() if line.startswith("[")]
    assert progress[0] == "dmoe: fitting 3 local gaussian MoEs (K=2) on a local process pool"
    assert [p for p in progress if p.startswith("dmoe: local fit")] == [
        f"dmoe: local fit {i}/3 done" for i in (1, 2, 3)
    ]
    assert "dmoe: second round, pass 1: shard 3/3 done" in progress
    assert [p for p in progress if p.startswith("dmoe: reduced")][0].startswith("dmoe: reduced 3 local fits in ")
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_refuse_non_standard)  # strict JSON
    assert [s["n_rows"] for s in summary["shards"]] == [300, 300, 300]
    assert summary["critical_path_seconds"] >= max(s["seconds"] for s in summary["shards"])
    assert summary["model"]["feature_names"] == ["u", "v"]
    history = summary["second_round"]["history"]  # the gate refitted on all shards: its objective never falls
    assert summary["rounds"] == 2 and len(history) >= 2 and all(b >= a for a, b in zip(history, history[1:]))
    assert summary["second_round"]["objective"] == "likelihood"
    model = MixtureOfExperts.load(out / "model")
    n = len(data.y)  # mean log-likelihood (``score`` is scikit-learn's R² for a regressor)
    # the objective of the round on the observed responses is the saved model's own log-likelihood (ridge ~1e-6)
    assert history[-1] == pytest.approx(model.log_likelihood(data.X, data.y) / n, abs=1e-5)
    assert model.log_likelihood(data.X, data.y) / n > data.true_model().log_likelihood(data.X, data.y) / n - 0.1


def test_dmoe_reports_missing_and_bad_shards(tmp_path, capsys):
    argv = ["dmoe", "--shards", str(tmp_path / "none-*.csv"), "--experts", "2", "--out", str(tmp_path / "o")]
    assert "no shard files match" in error_line(argv, capsys)
    (tmp_path / "part-0.csv").write_text("a,b\n1,2\n")
    argv = ["dmoe", "--shards", str(tmp_path / "part-*.csv"), "--experts", "2", "--workers", "1",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert re.search(r"part-0.csv.*no target column 'y'", error_line(argv, capsys))


def test_fit_gmm_on_parquet_shards_equals_the_in_memory_fit(tmp_path):
    """``ppmix fit gmm 'part-*.parquet'``: exact EM where the shards are read (local processes)."""
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(size=(150, 2)), rng.normal(size=(150, 2)) + 5.0]
    rng.shuffle(x)
    for i in range(3):
        pd.DataFrame(x[i::3], columns=["u", "v"]).to_parquet(tmp_path / f"part-{i}.parquet")
    out = tmp_path / "out"
    result = run("fit", "gmm", str(tmp_path / "part-*.parquet"), "--k", "2", "--workers", "2", "--quiet",
                 "--out", str(out))  # fmt: skip
    assert "by EM on 3 shards (300 rows) on local processes" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [s["n_units"] for s in summary["fit_report"]["shards"]] == [100, 100, 100]
    model = GMM.load(out / "model")
    assert model.feature_names_in_ == ["u", "v"]
    reference = GMM(2, seed=0, progress=False).fit(pd.DataFrame(x, columns=["u", "v"]))
    assert model.score(x) == pytest.approx(reference.score(x), abs=1e-6)


def test_fit_gmm_on_shards_names_a_bad_shard(tmp_path, capsys):
    argv = ["fit", "gmm", str(tmp_path / "none-*.npy"), "--k", "2", "--out", str(tmp_path / "o")]
    assert "no shard files match" in error_line(argv, capsys)
    np.save(tmp_path / "part-0.npy", np.ones((20, 2)))
    np.save(tmp_path / "part-1.npy", np.full((20, 2), np.nan))
    argv = ["fit", "gmm", str(tmp_path / "part-*.npy"), "--k", "2", "--workers", "1", "--quiet",
            "--out", str(tmp_path / "o")]  # fmt: skip
    assert re.search(r"part-1.npy.*NaN", error_line(argv, capsys))


def test_reproduce_prints_the_table_and_writes_name_json_and_png_into_out(tmp_path):
    """As the README says: ``ppmix reproduce NAME --out DIR`` writes ``DIR/NAME.json`` and ``DIR/NAME.png``
    (the module's name: ``pf-hmm`` -> ``pf_hmm``), prints the readable "ours (paper)" report and shows
    its progress on stderr."""
    result = run("reproduce", "pf-hmm", "--quick", "--out", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pf_hmm.json", "pf_hmm.png"]
    assert "D_R = 2 relevant features" in result.stdout and "paper: pf-HMM has the highest" in result.stdout
    assert re.search(r"pf-HMM +0\.\d{3} +0\.\d{3}", result.stdout)  # a row of the table: AUROC at K = 2, 4
    assert f"written: {tmp_path / 'pf_hmm.json'}, {tmp_path / 'pf_hmm.png'}" in result.stdout
    saved = json.loads((tmp_path / "pf_hmm.json").read_text(), parse_constant=_refuse_non_standard)
    assert [s["n_relevant"] for s in saved["settings"]] == [2, 5, 20]
    progress = result.stderr.splitlines()
    assert re.match(r"\[ +\d+\.\ds\] reproduce pf-hmm: running \(quick\)", progress[0])
    assert any("D_R=2 K=4" in line for line in progress) and progress[-1].endswith("reproduce pf-hmm: done")


@pytest.fixture
def fake_reproduction(monkeypatch):
    """``ppmix reproduce fake``: logs two steps, writes ``fake.json`` and two figures, returns a NaN."""
    import logging

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ppmix.io.reports import write_json

    def fake(out_dir, quick):
        log = logging.getLogger("ppmix.experiments.fake")
        out_dir.mkdir(parents=True, exist_ok=True)
        result = {"quick": quick, "score": float("nan"), "table": [{"method": "ours", "paper": 0.5, "value": 0.25}]}
        for i, part in enumerate(("a", "b")):
            log.info("step %d of 2", i + 1)
            fig, ax = plt.subplots(figsize=(2 + i, 2))
            ax.plot([0, 1])
            fig.savefig(out_dir / f"fake_{part}.png")
            plt.close(fig)
        write_json(out_dir / "fake.json", result)
        return {**result, "files": [str(out_dir / "fake.json")]}

    fake.__module__ = "ppmix.experiments.fake"  # its files are named after its module
    item = registry.Reproduction("fake", "a test reproduction", fake)
    monkeypatch.setattr(registry, "get", lambda name: item)
    return item


def test_reproduce_json_quiet_and_a_figure_made_of_parts(tmp_path, capsys, fake_reproduction):
    assert main(["reproduce", "fake", "--json", "--quiet", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # --quiet: no progress
    printed = json.loads(captured.out, parse_constant=_refuse_non_standard)  # strict JSON: NaN -> null
    assert printed["score"] is None
    assert printed["files"] == [str(tmp_path / "fake.json"), str(tmp_path / "fake.png")]
    import matplotlib.image as mpimg

    stacked, parts = mpimg.imread(tmp_path / "fake.png"), [mpimg.imread(tmp_path / f"fake_{p}.png") for p in "ab"]
    assert stacked.shape[0] == sum(p.shape[0] for p in parts) and stacked.shape[1] == max(p.shape[1] for p in parts)


def test_reproduce_shows_progress_and_a_table_by_default(tmp_path, capsys, fake_reproduction):
    assert main(["reproduce", "fake", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "score: -" in captured.out and re.search(r"ours +0\.500 +0\.250", captured.out)
    lines = captured.err.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == [
        f"reproduce fake: running into {tmp_path}",
        "reproduce fake: step 1 of 2",
        "reproduce fake: step 2 of 2",
        "reproduce fake: done",
    ]


# ------------------------------------------------------------------------------ fit hmm / pfgmm / moe
def _sequences_csv(path, with_id=True):
    """Six sequences of two sticky states (levels 100 and 106 in 'temp'), in time order."""
    rng = np.random.default_rng(0)
    frames = []
    for s in range(6):
        z = np.repeat(rng.integers(0, 2, 8), 5)
        x = z[:, None] * 6.0 + rng.normal(size=(40, 2)) + [100.0, 50.0]
        frames.append(pd.DataFrame({"run": f"r{s}", "temp": x[:, 0], "pressure": x[:, 1]}))
    frame = pd.concat(frames, ignore_index=True)
    (frame if with_id else frame.drop(columns="run")).to_csv(path, index=False)
    return frame


def test_fit_hmm_by_sequence_column(tmp_path, capsys):
    from ppmix import HMM

    frame = _sequences_csv(tmp_path / "runs.csv")
    out = tmp_path / "out"
    argv = ["fit", "hmm", str(tmp_path / "runs.csv"), "--k", "2", "--sequence-column", "run", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "fitted HMM(k=2, diag) by em on 6 sequence(s) of 240 rows" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_refuse_non_standard)
    assert summary["feature_names"] == ["temp", "pressure"] and summary["n_sequences"] == 6
    assert sorted(round(m[0]) for m in summary["means"]) == [100, 106]  # the user's scale
    assert min(np.diag(summary["transition"])) > 0.8 and sum(summary["state_counts"]) == 240
    assert (out / "plot.png").stat().st_size > 1000
    model = HMM.load(out / "model")
    assert model.score(frame) == pytest.approx(summary["mean_log_likelihood"], rel=1e-6)


def test_fit_hmm_whole_file_is_one_sequence_and_bad_input_names_the_option(tmp_path, capsys):
    _sequences_csv(tmp_path / "one.csv", with_id=False)
    assert main(["fit", "hmm", str(tmp_path / "one.csv"), "--k", "2", "--quiet", "--out", str(tmp_path / "o")]) == 0
    assert "on 1 sequence(s) of 240 rows" in capsys.readouterr().out
    _sequences_csv(tmp_path / "runs.csv")
    argv = ["fit", "hmm", str(tmp_path / "runs.csv"), "--k", "2", "--quiet", "--out", str(tmp_path / "o2")]
    assert "non-numeric columns ['run']" in error_line(argv, capsys)  # the id column needs --sequence-column
    line = error_line([*argv, "--sequence-column", "id"], capsys)
    assert line.startswith("ppmix: error: --sequence-column: no column 'id'") and "temp, pressure" in line
    line = error_line([*argv, "--sequence-column", "run", "--k", "500"], capsys)
    assert "runs.csv" in line and "n_components=500 is larger than" in line
    assert not (tmp_path / "o2").exists()


def test_fit_hmm_with_poisson_emissions_and_an_unknown_emission_named(tmp_path, capsys):
    from ppmix import HMM

    rng = np.random.default_rng(0)
    state = np.repeat(rng.integers(0, 2, size=24), 10)
    counts = rng.poisson(np.where(state[:, None] == 1, 15.0, 2.0), size=(240, 2))
    pd.DataFrame(counts, columns=["calls", "visits"]).assign(run=np.repeat(np.arange(6), 40)).to_csv(
        tmp_path / "counts.csv", index=False
    )
    argv = ["fit", "hmm", str(tmp_path / "counts.csv"), "--k", "2", "--sequence-column", "run", "--quiet"]
    assert main([*argv, "--emission", "poisson", "--out", str(tmp_path / "out")]) == 0
    assert "fitted HMM(k=2, poisson) by em on 6 sequence(s)" in capsys.readouterr().out
    model = HMM.load(tmp_path / "out" / "model")
    assert model.emission == "poisson" and sorted(np.round(model.means_[:, 0].numpy())) == [2.0, 15.0]
    line = error_line([*argv, "--emission", "negbin", "--out", str(tmp_path / "o2")], capsys)
    assert line.startswith("ppmix: error: --emission: unknown component family 'negbin'") and "poisson" in line


def test_fit_hmm_sets_emission_options_and_names_a_wrong_one(tmp_path, capsys):
    """``--emission gmm --emission-option n_mix=3``: a GMM-HMM of three Gaussians per state, saved with its
    setting; --covariance applies; an option the family does not take, or not KEY=VALUE, is one error line."""
    from ppmix import HMM

    x, _, _ = make_sequences(4, (30, 40), n_features=2)
    pd.DataFrame(np.concatenate(x), columns=["a", "b"]).to_csv(tmp_path / "steps.csv", index=False)
    argv = ["fit", "hmm", str(tmp_path / "steps.csv"), "--k", "2", "--quiet", "--max-iter", "5", "--emission", "gmm"]
    options = ["--emission-option", "n_mix=3", "--covariance", "full"]
    assert main([*argv, *options, "--out", str(tmp_path / "out")]) == 0
    model = HMM.load(tmp_path / "out" / "model")
    family = model._component_family()
    assert (family.n_mix, family.covariance_type) == (3, "full") and model.means_.shape[0] == 2
    line = error_line([*argv, "--emission-option", "n_mixes=3", "--out", str(tmp_path / "o2")], capsys)
    assert line.startswith("ppmix: error: --emission-option: unknown option 'n_mixes' for family 'gmm'")
    assert "accepted: n_mix, covariance_type, reg_covar" in line
    with pytest.raises(SystemExit):
        main([*argv, "--emission-option", "n_mix", "--out", str(tmp_path / "o3")])
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()
    with pytest.raises(SystemExit):
        main(["fit", "hmm", "--help"])
    assert "--emission-option KEY=VALUE" in capsys.readouterr().out


def _pf_csv(path):
    from ppmix.datasets import make_pf_synthetic

    data = make_pf_synthetic(300, n_relevant=2, n_features=5, seed=0)
    frame = pd.DataFrame(data.X, columns=["age", "dose", "noise1", "noise2", "noise3"])
    frame["outcome"] = np.where(data.y == 1, "sick", "well")
    frame.to_csv(path, index=False)
    return frame


def test_fit_pfgmm_reports_auroc_and_the_relevant_features_by_name(tmp_path, capsys):
    from ppmix import PFGMM

    frame = _pf_csv(tmp_path / "patients.csv")
    out = tmp_path / "out"
    argv = ["fit", "pfgmm", str(tmp_path / "patients.csv"), "--target", "outcome", "--k", "4", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "positive class 'well'" in printed and "relevant features (2 of 5): age, dose" in printed
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_refuse_non_standard)
    assert summary["classes"] == ["sick", "well"] and summary["train_auroc"] > 0.9
    assert summary["relevant_features"] == ["age", "dose"] and summary["n_relevant"] == 2
    assert list(summary["relevance_by_feature"]) == ["age", "dose", "noise1", "noise2", "noise3"]
    assert (out / "plot.png").stat().st_size > 1000
    model = PFGMM.load(out / "model")
    proba = np.asarray(model.predict_proba(frame.drop(columns="outcome")))[:, 1]
    from ppmix.metrics import auroc

    assert auroc((frame["outcome"] == "well").to_numpy(), proba) == pytest.approx(summary["train_auroc"])
    assert model.n_restarts == 3 and len(model.restart_scores_) == 3  # the default, saved with the model
    assert main([*argv[:-2], "--n-restarts", "1", "--out", str(tmp_path / "one")]) == 0
    assert PFGMM.load(tmp_path / "one" / "model").n_restarts == 1


def test_fit_pfgmm_bad_target_is_one_line_naming_it(tmp_path, capsys):
    frame = _pf_csv(tmp_path / "p.csv")
    base = ["fit", "pfgmm", str(tmp_path / "p.csv"), "--k", "2", "--quiet", "--out", str(tmp_path / "o")]
    assert "--target: no column 'label'" in error_line([*base, "--target", "label"], capsys)
    frame.assign(outcome=np.arange(len(frame)) % 3).to_csv(tmp_path / "p.csv", index=False)
    assert "--target: column 'outcome' must hold two classes; it holds 3" in error_line(
        [*base, "--target", "outcome"], capsys
    )
    assert "--switch-prior: must be a probability" in error_line([*base, "--target", "outcome",
                                                                  "--switch-prior", "0"], capsys)  # fmt: skip
    assert "--n-restarts" in error_line([*base, "--target", "outcome", "--n-restarts", "0"], capsys)


def test_fit_moe_gaussian_and_logistic(tmp_path, capsys):
    from ppmix.datasets.moe import make_moe
    from ppmix.models.moe import MixtureOfExperts

    data = make_moe(300, n_experts=2, n_features=1, param_range=2, seed=1)
    pd.DataFrame({"dose": data.X[:, 0], "response": data.y}).to_csv(tmp_path / "reg.csv", index=False)
    out = tmp_path / "reg"
    argv = ["fit", "moe", str(tmp_path / "reg.csv"), "--target", "response", "--k", "2", "--n-init", "2",
            "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "fitted MixtureOfExperts(k=2, gaussian) to 'response'" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_refuse_non_standard)
    assert summary["feature_names"] == ["dose"] and len(summary["coef"]) == 2 and summary["train_r2"] > 0
    model = MixtureOfExperts.load(out / "model")
    n = len(data.y)  # mean log-likelihood (``score`` is scikit-learn's R² for a regressor)
    assert model.log_likelihood(data.X, data.y) / n > data.true_model().log_likelihood(data.X, data.y) / n - 0.1
    assert (out / "plot.png").stat().st_size > 1000

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2))
    y = np.where(x[:, 0] > 0, x[:, 1] > 0, x[:, 1] < 0)  # XOR-like: two logistic experts split on x0
    pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "label": np.where(y, "yes", "no")}).to_csv(tmp_path / "cls.csv",
                                                                                          index=False)  # fmt: skip
    argv = ["fit", "moe", str(tmp_path / "cls.csv"), "--target", "label", "--expert", "logistic", "--experts", "2",
            "--n-init", "2", "--split-merge-search", "screened", "--quiet", "--out", str(tmp_path / "cls")]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((tmp_path / "cls" / "summary.json").read_text(), parse_constant=_refuse_non_standard)
    assert summary["classes"] == ["no", "yes"] and summary["train_accuracy"] > 0.8
    assert MixtureOfExperts.load(tmp_path / "cls" / "model").split_merge_search == "screened"
    assert "expert" in summary and summary["expert"] == "logistic"


def test_fit_moe_bad_input_is_one_line_naming_it(tmp_path, capsys):
    pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": ["a", "b", "c"]}).to_csv(tmp_path / "d.csv", index=False)
    base = ["fit", "moe", str(tmp_path / "d.csv"), "--k", "2", "--quiet", "--out", str(tmp_path / "o")]
    assert "--target: no column 'z'" in error_line([*base, "--target", "z"], capsys)
    assert "non-numeric columns ['y']" in error_line([*base, "--target", "y"], capsys)  # Gaussian: numeric y
    assert "--target: column 'y' must hold two classes" in error_line(
        [*base, "--target", "y", "--expert", "logistic"], capsys
    )
    assert "--k/--experts: must be an integer >= 2" in error_line([*base[:3], "--k", "1", "--target", "y",
                                                         "--out", str(tmp_path / "o")], capsys)  # fmt: skip
    pd.DataFrame({"y": [1.0, 2.0, 3.0]}).to_csv(tmp_path / "only.csv", index=False)
    line = error_line(["fit", "moe", str(tmp_path / "only.csv"), "--k", "2", "--target", "y",
                       "--out", str(tmp_path / "o")], capsys)  # fmt: skip
    assert "no feature columns besides the target 'y'" in line


def test_fit_gmm_plot_is_on_the_users_scale_with_the_column_names(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ppmix.viz import plot_clusters

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(100, 2)) + [170.0, 65.0], columns=["height", "weight"])
    frame.iloc[:50] += 5.0  # two clusters
    ax = plot_clusters(GMM(2, seed=0, progress=False).fit(frame), frame)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("height", "weight")
    assert 160 < ax.get_xlim()[0] < 170 < ax.get_xlim()[1] and 55 < ax.get_ylim()[0] < 65 < ax.get_ylim()[1]
    wide = pd.DataFrame(rng.normal(size=(100, 3)), columns=["u", "v", "w"])
    wide.iloc[:50] += 5.0
    ax = plot_clusters(GMM(2, seed=0, progress=False).fit(wide), wide)
    assert ax.get_xlabel().startswith("PC1 = ") and "·" in ax.get_xlabel()
    plt.close("all")
