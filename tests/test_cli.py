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


def error_line(argv, capsys):
    """The one stderr line of ``main(argv)``, which must exit with code 2."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_fit_reports_bad_csv_clearly(tmp_path, capsys):
    pd.DataFrame({"a": [1.0, 2.0], "name": ["x", "y"]}).to_csv(tmp_path / "bad.csv", index=False)
    line = error_line(["fit", "gmm", str(tmp_path / "bad.csv"), "--k", "1", "--out", str(tmp_path / "o")], capsys)
    assert "non-numeric columns ['name']" in line
    line = error_line(["fit", "gmm", str(tmp_path / "missing.csv"), "--k", "1", "--out", str(tmp_path / "o")], capsys)
    assert "not found" in line
    pd.DataFrame({"a": [1.0, 2.0]}).to_csv(tmp_path / "tiny.csv", index=False)
    argv = ["fit", "gmm", str(tmp_path / "tiny.csv"), "--k", "3", "--out", str(tmp_path / "o"), "--quiet"]
    assert "n_components=3 is larger than the number of samples" in error_line(argv, capsys)


@pytest.mark.parametrize("args", [[], ["fit"], ["fit", "gmm"], ["reproduce"], ["demo"], ["dmoe"]], ids=" ".join)
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
        "--workers", "2", "--n-init", "2", "--out", str(out),
    )  # fmt: skip
    assert "reduced 3 local gaussian MoE fits" in result.stdout
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_refuse_non_standard)  # strict JSON
    assert [s["n_rows"] for s in summary["shards"]] == [300, 300, 300]
    assert summary["critical_path_seconds"] >= max(s["seconds"] for s in summary["shards"])
    assert summary["model"]["feature_names"] == ["u", "v"]
    model = MixtureOfExperts.load(out / "model")
    assert model.score(data.X, data.y) > data.true_model().score(data.X, data.y) - 0.1


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


def test_reproduce_writes_name_json_and_png_into_out(tmp_path):
    """As the README says: ``ppmix reproduce NAME --out DIR`` writes ``DIR/NAME.json`` and ``DIR/NAME.png``
    (the module's name: ``pf-hmm`` -> ``pf_hmm``), and prints the result as standard JSON."""
    result = run("reproduce", "pf-hmm", "--quick", "--out", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pf_hmm.json", "pf_hmm.png"]
    printed = json.loads(result.stdout, parse_constant=_refuse_non_standard)
    assert printed == json.loads((tmp_path / "pf_hmm.json").read_text()) | {"files": printed["files"]}
