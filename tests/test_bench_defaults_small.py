"""The small-data benchmark of issue 49 (``benchmarks/_defaults_small.py``) in its quick form, checked through the
JSON it writes: the 36 configurations, both libraries' times and log-likelihoods from one evaluator, the summary
computed from the rows. Timings are only checked to be positive (their size depends on the machine)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_small_quick_reports_every_configuration_and_a_summary_of_them(tmp_path):
    out = tmp_path / "defaults_small.json"
    command = [sys.executable, "benchmarks/_defaults_small.py", "--quick", "--threads", "1", "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "defaults_small" and report["quick"] and report["large"] is None
    assert report["torch_threads"] == 1
    rows = report["configurations"]
    keys = {(r["dataset"], r["k"], r["covariance_type"]) for r in rows}
    assert len(rows) == len(keys) == 36
    for row in rows:
        for library in ("ppmix", "sklearn"):
            assert 0 < row[library]["wall_s"] < math.inf and 0 < row[library]["cpu_s"] < math.inf
            assert math.isfinite(row[library]["mean_loglik"]) and row[library]["n_iter"] >= 1
        assert row["ratio"] == pytest.approx(row["ppmix"]["wall_s"] / row["sklearn"]["wall_s"])
        assert row["loglik_diff"] == pytest.approx(row["ppmix"]["mean_loglik"] - row["sklearn"]["mean_loglik"])
    summary = report["summary"]
    ratios = [r["ratio"] for r in rows]
    assert summary["geomean_ratio"] == pytest.approx(math.exp(statistics.fmean(map(math.log, ratios))))
    assert summary["max_ratio"] == max(ratios)
    assert summary["median_loglik_diff"] == pytest.approx(statistics.median(r["loglik_diff"] for r in rows))
    # both libraries fit the same well-separated case to the same optimum (the evaluator is one)
    iris = next(r for r in rows if (r["dataset"], r["k"], r["covariance_type"]) == ("iris", 2, "diag"))
    assert abs(iris["loglik_diff"]) < 1e-3
