"""A user error on the command line is one ``ppmix: error:`` line and exit code 2, found before any work."""

from __future__ import annotations

import pytest

from ppmix.cli import main


def _error_of(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [row for row in err.splitlines() if row.startswith("ppmix: error:")]
    return line


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
