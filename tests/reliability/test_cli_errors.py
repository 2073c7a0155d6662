"""A user error on the command line is one ``ppmix: error:`` line and exit code 2, found before any work."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ppmix.cli import main

# name of a file in the ``inputs`` fixture -> (its contents, a fragment the error line must hold)
BAD_CSV = {
    "ragged.csv": (b"a,b\n1,2\n3\n4,5,6\n", "not a readable CSV file"),
    "empty.csv": (b"", "is empty"),
    "header_only.csv": (b"a,b\n", "no data rows"),
    "binary.csv": (bytes(np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8)), "not a readable CSV"),
    "quote.csv": (b'a,b\n1,"2\n3,4\n', "not a readable CSV file"),
    "text_column.csv": (b"a,name\n1,x\n2,y\n", "non-numeric columns ['name']"),
}


def _error_of(argv: list[str], capsys: pytest.CaptureFixture, code: int = 2) -> str:
    """Run ``main(argv)``; check the exit code and that stderr is one ``ppmix: error:`` line; return it."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("ppmix: error:")
    return line


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """A folder holding the bad CSV files, a directory named like a CSV file and two good dmoe shards."""
    for name, (content, _) in BAD_CSV.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "folder.csv").mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        pd.DataFrame(rng.normal(size=(30, 3)), columns=["a", "b", "y"]).to_csv(tmp_path / f"part-{i}.csv", index=False)
    return tmp_path


@pytest.mark.parametrize(
    ("name", "fragment"),
    [*((name, fragment) for name, (_, fragment) in BAD_CSV.items()),
     ("missing.csv", "not found"), ("folder.csv", "is a directory")],
)  # fmt: skip
def test_a_bad_data_file_is_one_line_naming_it(inputs, capsys, name, fragment):
    line = _error_of(["fit", "gmm", str(inputs / name), "--k", "2", "--out", str(inputs / "o"), "--quiet"], capsys)
    assert name in line and fragment in line
    assert not (inputs / "o").exists()


FIT = ["fit", "gmm", "DATA", "--k", "2", "--out", "OUT"]
DMOE = ["dmoe", "--shards", "SHARDS", "--experts", "2", "--out", "OUT"]
DEMO = ["demo", "--out", "OUT"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([*FIT, "--k", "0"], "--k: must be an integer >= 1; got 0"),
        ([*FIT, "--k", "-1"], "--k: must be an integer >= 1; got -1"),
        ([*FIT, "--k", "two"], "--k: invalid int value: 'two'"),
        ([*FIT, "--n-init", "0"], "--n-init: must be an integer >= 1"),
        ([*FIT, "--max-iter", "-3"], "--max-iter: must be an integer >= 1"),
        ([*FIT, "--engine", "svi", "--num-steps", "0"], "--num-steps: must be an integer >= 1"),
        ([*FIT, "--seed", "-1"], "--seed: must be an integer >= 0"),
        ([*DEMO, "--n", "0"], "--n: must be an integer >= 4 (the demo fits 4 components); got 0"),
        ([*DEMO, "--n", "-5"], "--n: must be an integer >= 4"),
        ([*DEMO, "--n", "3"], "--n: must be an integer >= 4"),
        ([*DEMO, "--svi-steps", "0"], "--svi-steps: must be an integer >= 1"),
        ([*DEMO, "--svi-steps", "-2"], "--svi-steps: must be an integer >= 1"),
        ([*DEMO, "--seed", "-1"], "--seed: must be an integer >= 0"),
        ([*DMOE, "--experts", "1"], "--experts: must be an integer >= 2"),
        ([*DMOE, "--experts", "0"], "--experts: must be an integer >= 2"),
        ([*DMOE, "--workers", "0"], "--workers: must be an integer >= 1"),
        ([*DMOE, "--support-size", "-1"], "--support-size: must be an integer >= 1"),
        ([*DMOE, "--n-init", "0"], "--n-init: must be an integer >= 1"),
        ([*DMOE, "--max-iter", "0"], "--max-iter: must be an integer >= 1"),
        ([*DMOE, "--seed", "-7"], "--seed: must be an integer >= 0"),
        ([*DMOE, "--scheduler", "notaurl"], "--scheduler: 'notaurl' is not a scheduler address"),
        ([*DMOE, "--scheduler", "tcp://"], "--scheduler: 'tcp://' is not a scheduler address"),
        ([*DMOE, "--scheduler", "tcp://host:notaport"], "--scheduler: 'tcp://host:notaport' is not a scheduler"),
        ([*DMOE, "--scheduler", "tcp://host"], "--scheduler: 'tcp://host' is not a scheduler address"),
        ([*DMOE, "--shards", "NONE"], "--shards: no shard files match"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_bad_option_is_one_line_naming_it(inputs, capsys, argv, fragment):
    where = {"DATA": str(inputs / "text_column.csv"), "SHARDS": str(inputs / "part-*.csv"),
             "NONE": str(inputs / "none-*.csv"), "OUT": str(inputs / "o")}  # fmt: skip
    start = time.perf_counter()
    line = _error_of([where.get(a, a) for a in argv], capsys)
    assert fragment in line
    assert time.perf_counter() - start < 5 and not (inputs / "o").exists()  # found before any work


def test_an_unreachable_scheduler_fails_within_seconds(inputs, capsys):
    start = time.perf_counter()
    argv = [*DMOE, "--scheduler", "tcp://127.0.0.1:9"]
    where = {"SHARDS": str(inputs / "part-*.csv"), "OUT": str(inputs / "o")}
    line = _error_of([where.get(a, a) for a in argv], capsys)
    assert "--scheduler: cannot connect to the Dask scheduler at tcp://127.0.0.1:9" in line
    assert time.perf_counter() - start < 20


def test_an_internal_error_is_one_line_unless_debug(monkeypatch, capsys):
    from ppmix.experiments import registry

    def broken():
        raise RuntimeError("registry is broken")

    monkeypatch.setattr(registry, "registered", broken)
    line = _error_of(["reproduce", "--list"], capsys, code=1)
    assert line == (
        "ppmix: error: internal error: RuntimeError: registry is broken (run with --debug for the traceback)"
    )
    with pytest.raises(RuntimeError, match="registry is broken"):
        main(["--debug", "reproduce", "--list"])


def test_end_to_end_a_ragged_csv_is_one_line_on_stderr(inputs):
    result = subprocess.run(
        [sys.executable, "-m", "ppmix.cli", "fit", "gmm", str(inputs / "ragged.csv"), "--k", "2",
         "--out", str(inputs / "o")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("ppmix: error: data file ") and "ragged.csv" in line


def test_end_to_end_debug_shows_the_traceback_of_an_internal_error(inputs):
    code = "import sys; from ppmix.cli import main; import ppmix.cli as c; c._read_csv = None; sys.exit(main())"
    argv = ["--debug", "fit", "gmm", str(inputs / "ragged.csv"), "--k", "2", "--out", str(inputs / "o")]
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" in result.stderr and "TypeError" in result.stderr


def test_out_pointing_at_a_file_is_refused_before_fitting(tmp_path, capsys):
    target = tmp_path / "a_file"
    target.write_text("keep me")
    data = tmp_path / "never_read.csv"  # does not exist: the --out check must come first
    for argv in (
        ["fit", "gmm", str(data), "--k", "2", "--out", str(target)],
        ["demo", "--out", str(target)],
        ["dmoe", "--shards", str(data), "--target", "y", "--experts", "2", "--out", str(target)],
    ):
        assert "is a file" in _error_of(argv, capsys)
    assert target.read_text() == "keep me"


def test_a_model_directory_holding_user_files_is_refused_before_fitting(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    line = _error_of(["fit", "gmm", str(tmp_path / "missing.csv"), "--k", "2", "--out", str(tmp_path)], capsys)
    assert "notes.txt" in line
    assert (tmp_path / "model" / "notes.txt").read_text() == "mine"


def test_data_the_model_cannot_fit_is_a_user_error(tmp_path, capsys):
    """K > N is a mistake in the input (exit 2, naming the file), found by the model's own data check."""
    path = tmp_path / "few.csv"
    pd.DataFrame({"a": [0.0, 1.0], "b": [1.0, 0.0]}).to_csv(path, index=False)
    line = _error_of(["fit", "gmm", str(path), "--k", "3", "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert "few.csv" in line and "n_components=3 is larger than the number of samples (2)" in line


def test_a_value_error_inside_fit_is_an_internal_error(inputs, monkeypatch, capsys):
    """Only the data checks' InvalidDataError is the user's mistake; another ValueError of a fit is ours (exit 1)."""
    from ppmix.models.gmm import GMM

    def broken(self, *args, **kwargs):
        raise ValueError("an M-step went wrong")

    monkeypatch.setattr(GMM, "fit", broken)
    path = inputs / "part-0.csv"
    line = _error_of(["fit", "gmm", str(path), "--k", "2", "--out", str(inputs / "o"), "--quiet"], capsys, code=1)
    assert line.startswith("ppmix: error: internal error: ValueError: an M-step went wrong")


def test_out_that_cannot_be_written_is_refused_before_fitting(tmp_path, capsys, monkeypatch):
    """Issue 39: an unwritable --out was found only after the whole fit; the data file here is never read."""
    data = tmp_path / "never_read.csv"
    (tmp_path / "a_file").write_text("keep me")
    line = _error_of(["fit", "gmm", str(data), "--k", "2", "--out", str(tmp_path / "a_file" / "sub" / "o")], capsys)
    assert "--out:" in line and "a_file is a file, not a directory" in line

    import tempfile

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)  # as in a read-only directory, which root may not see
    for argv in (
        ["fit", "gmm", str(data), "--k", "2", "--out", str(tmp_path / "ro" / "o")],
        ["fit", "moe", str(data), "--target", "y", "--k", "2", "--out", str(tmp_path / "ro")],
        ["demo", "--out", str(tmp_path)],
    ):
        line = _error_of(argv, capsys)
        assert f"--out: cannot write to {tmp_path} (Permission denied)" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


_ROWS = np.random.default_rng(0).normal(size=(40, 2))
# name -> (the CSV, the command's arguments after the file, fragments the error line must hold)
BAD_FIT_DATA = {
    "moe_nan_target": (pd.DataFrame(_ROWS, columns=["a", "b"]).assign(y=np.r_[np.nan, _ROWS[1:, 0]]),
                       ["moe", "--target", "y"], ["--target: column 'y'", "missing or infinite", "data row 1"]),
    "moe_inf_target": (pd.DataFrame(_ROWS, columns=["a", "b"]).assign(y=np.r_[_ROWS[:5, 0], np.inf, _ROWS[6:, 0]]),
                       ["moe", "--target", "y"], ["--target: column 'y'", "data row 6 (inf)"]),
    "moe_few_rows": (pd.DataFrame(_ROWS[:3], columns=["a", "b"]).assign(y=[0.0, 1.0, 2.0]),
                     ["moe", "--target", "y"], ["X has 3 rows"]),
    "pfgmm_constant": (pd.DataFrame(_ROWS, columns=["a", "b"]).assign(a=1.0, y=_ROWS[:, 0] > 0),
                       ["pfgmm", "--target", "y"], ["X has constant feature(s) ['a']"]),
    "pfgmm_single": (pd.DataFrame(_ROWS[:, :1], columns=["a"]).assign(y=_ROWS[:, 0] > 0),
                     ["pfgmm", "--target", "y"], ["X has 1 feature(s)"]),
    "hmm_nan_sequence": (pd.DataFrame(_ROWS, columns=["a", "b"]).assign(s=np.r_[np.ones(5), np.nan, np.ones(34)]),
                         ["hmm", "--sequence-column", "s"], ["sequence_column 's'", "row 5"]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD_FIT_DATA))
def test_data_a_model_cannot_fit_is_a_user_error_naming_the_file(tmp_path, capsys, name):
    """Issue 39: these exited as 'internal error' (exit 1) without naming the file, or fitted fewer rows."""
    frame, args, fragments = BAD_FIT_DATA[name]
    path = tmp_path / f"{name}.csv"
    frame.to_csv(path, index=False)
    line = _error_of(["fit", args[0], str(path), *args[1:], "--k", "2", "--out", str(tmp_path / "o"), "--quiet"],
                     capsys)  # fmt: skip
    assert f"{name}.csv" in line
    for fragment in fragments:
        assert fragment in line
    assert not (tmp_path / "o").exists()


def test_a_seed_out_of_range_is_refused_by_the_parser(inputs, capsys):
    line = _error_of([*FIT[:2], str(inputs / "part-0.csv"), "--k", "2", "--out", "o", "--seed", str(2**64)], capsys)
    assert "--seed: must be in [0, 2**63 - 1]" in line
