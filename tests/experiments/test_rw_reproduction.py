"""The "rw" reproduction (Vainsencher et al., 2013): Theorem 2 breakdown bound and Fig. 2.1's regression clustering."""

from __future__ import annotations

import json

import pytest

from ppmix.experiments import registry
from ppmix.experiments.rw import THEOREM_BOUND, run


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("rw")
    return out, run(out, quick=True)


def test_registered():
    item = registry.get("rw")
    assert item.run is run
    assert "Regularized Weighting" in item.description


def test_rw_stays_within_theorem_2_bound_while_kmeans_and_gmm_break_down(quick_result):
    _, result = quick_result
    rows = result["max_dist_over_R"]
    assert len(rows["rw"]) == len(result["outlier_distance"]) >= 2
    assert all(value < THEOREM_BOUND for value in rows["rw"])
    assert result["rw_within_bound"]
    assert rows["kmeans"][-1] > THEOREM_BOUND and rows["gmm"][-1] > THEOREM_BOUND
    assert rows["kmeans"][-1] > rows["kmeans"][0] and rows["gmm"][-1] > rows["gmm"][0]
    # alpha/n lies in Theorem 2's range [r^2, 13 R^2]
    assert result["r"] ** 2 <= result["alpha_per_point"] <= 13 * result["R"] ** 2


def test_rw_regression_assigns_at_least_as_well_as_minimum_loss(quick_result):
    _, result = quick_result
    acc = result["regression_accuracy"]
    assert acc["rw"] >= acc["min_loss"]
    assert result["regression_curve_rms_error"]["rw"] <= result["regression_curve_rms_error"]["min_loss"]
    assert result["regression_correct_per_curve"]["paper_rw"] == [29, 37]


def test_files_written(quick_result):
    out, result = quick_result
    data = json.loads((out / "rw.json").read_text())
    assert set(data) >= {"breakdown", "regression", "paper"}
    assert data["breakdown"]["params"]["eta"] < data["breakdown"]["params"]["eta_bound"]
    assert (out / "rw.png").stat().st_size > 0
    assert result["wall_time_s"] < 20
