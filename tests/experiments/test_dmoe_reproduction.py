"""The distributed-MoE reproduction (Chamroukhi & Pham, 2026, Figures 1-4) runs quickly and writes its outputs."""

import json

import pytest

from ppmix.experiments import registry
from ppmix.experiments.dmoe import DISTRIBUTED, PAPER_CLAIMS, ROUND_COST, main, run
from ppmix.experiments.dmoe_checks import format_checks, quality_bar, seed_bar, truth_bar


@pytest.mark.filterwarnings("ignore:EM did not converge")
def test_dmoe_reproduction_quick(tmp_path):
    result = run(tmp_path, quick=True)
    saved = json.loads((tmp_path / "dmoe.json").read_text())
    assert saved["table"] == result["table"] and saved["paper_claims"] == PAPER_CLAIMS
    for expert in ("gaussian", "logistic"):
        assert (tmp_path / f"dmoe_{expert}.png").stat().st_size > 0
    rows = {(t["expert"], t["M"], t["estimator"]): t for t in result["table"]}
    kinds = ("gaussian", "logistic")
    expected = {(e, 0, "Truth") for e in kinds} | {(e, 1, name) for e in kinds for name in ("Truth-EM", "Global")}
    expected |= {(e, m, name) for e in kinds for m in (4, 8) for name in DISTRIBUTED}
    assert set(rows) == expected
    for (expert, m, name), row in rows.items():
        if name == "Truth":  # the data-generating model: zero distance to itself, no learning time
            assert row["transport"] == pytest.approx(0.0, abs=1e-9) and row["mse"] == 0.0 and "seconds" not in row
            continue
        assert -1.0 <= row["ari"] <= 1.0 and row["transport"] >= 0.0 and row["mse"] >= 0.0 and row["seconds"] > 0
        if expert == "gaussian":
            assert 0.0 < row["rpe"] < 1.0
        else:
            assert 0.5 < row["accuracy"] <= 1.0 and row["log_loss"] == pytest.approx(-row["log_lik"])
        if name in ("Reduction", "Reduction-2", "Reduction-2L"):
            # the reduction keeps the MoE structure: a better test likelihood than picking or averaging local fits
            assert row["log_lik"] > max(
                rows[(expert, m, "Middle")]["log_lik"], rows[(expert, m, "Weighted")]["log_lik"]
            )
        # the second round's cost is reported, as a share of the local fitting time, on its rows only
        assert all(key in row for key in ROUND_COST) == (name in ("Reduction-2", "Reduction-2L"))
        if name in ("Reduction-2", "Reduction-2L"):
            assert (
                row["round2_passes"] >= 1
                and 0 < row["round2_share"]
                and row["seconds"] > rows[(expert, m, "Reduction")]["seconds"]
            )
    # EM started at the planted model stays in the truth's basin: its clustering matches the truth's (within 0.2:
    # at this size, 4 000 training rows for 147 logistic parameters, the converged fit over-fits, ARI 0.84 vs 0.97)
    for expert in kinds:
        assert rows[(expert, 1, "Truth-EM")]["ari"] > rows[(expert, 0, "Truth")]["ari"] - 0.2
        # the training objective per row, to tell a poor basin (Global below Truth-EM) from over-fitting
        assert all(rows[(expert, 1, name)]["train_log_lik"] < 0 for name in ("Truth-EM", "Global"))
    assert {(c["expert"], c["estimator"]) for c in result["truth_bar"]} == {
        (e, name) for e in kinds for name in ("Truth-EM", "Global")
    }
    assert {c["M"] for c in result["quality_bar"]} == {4, 8}
    assert {(c["expert"], c["estimator"]) for c in result["quality_bar"]} == {
        (e, name) for e in kinds for name in ("Reduction", "Reduction-2", "Reduction-2L")
    }
    assert {(c["expert"], c["M"], c["estimator"]) for c in result["seed_bar"]} == {
        (e, m, name) for e in kinds for m in (4, 8) for name in ("Reduction", "Reduction-2", "Reduction-2L")
    }


def test_dmoe_reproduction_registered():
    item = registry.get("dmoe")
    assert item.run is run and "Figures 1-4" in item.description


def test_quality_bar_within_two_percent_is_one_sided():
    """3% worse than Global fails, 3% better passes, 1% worse passes (RPE and log-likelihood)."""

    def check(rpe: float, log_lik: float) -> list[bool]:
        table = [
            {"expert": "gaussian", "M": 1, "estimator": "Global", "rpe": 0.1, "log_lik": -2.0},
            {"expert": "gaussian", "M": 4, "estimator": "Reduction", "rpe": rpe, "log_lik": log_lik},
        ]
        return [c["pass"] for c in quality_bar(table)]

    assert check(0.103, -2.06) == [False, False]
    assert check(0.097, -1.94) == [True, True]
    assert check(0.101, -2.02) == [True, True]


def test_quality_bar_checks_logistic_experts_on_accuracy_and_log_loss():
    """The classification variant: accuracy (higher is better) and log-loss (lower is better)."""
    table = [
        {"expert": "logistic", "M": 1, "estimator": "Global", "accuracy": 0.90, "log_loss": 0.20, "log_lik": -0.20},
        {"expert": "logistic", "M": 16, "estimator": "Reduction", "accuracy": 0.87, "log_loss": 0.19, "log_lik": -0.19},
    ]
    checks = {c["check"].split()[0]: c for c in quality_bar(table)}
    assert set(checks) == {"accuracy", "log_loss"}
    assert checks["accuracy"]["gap"] == pytest.approx(0.0333, abs=1e-4) and not checks["accuracy"]["pass"]
    assert checks["log_loss"]["gap"] == pytest.approx(-0.05) and checks["log_loss"]["pass"]


@pytest.mark.filterwarnings("ignore:EM did not converge")
def test_dmoe_command_prints_the_checks_with_one_and_two_rounds(tmp_path, capsys):
    argv = ["--n-samples", "2000", "--machines", "4", "--seeds", "0", "1", "--experts", "gaussian", "--n-init", "1"]
    assert main([*argv, "--max-iter", "20", "--rounds", "1", "2", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    marked = [line for line in lines if line[:1] in "✔✘"]
    assert any("Global: rpe at most 10% worse than Truth on the mean over seeds" in line for line in marked)
    assert any("Truth-EM: ari at least 0.9 on the mean over seeds" in line for line in marked)
    for name in ("Reduction:", "Reduction-2:", "Reduction-2L:"):
        assert any(name in line and "on every seed" in line for line in marked)
        assert any(name in line and "on every seed" not in line for line in marked)
    assert any(line.startswith("gaussian  1     4 Reduction-2") and "[" in line for line in lines)


def test_seed_bar_fails_when_one_seed_misses():
    """The bar holds on every seed: one seed 3% behind Global fails it, whatever the mean."""
    rows = [
        {"expert": "gaussian", "seed": s, "M": 1, "estimator": "Global", "rpe": 0.1, "log_lik": -2.0} for s in (0, 1)
    ]
    rows += [
        {"expert": "gaussian", "seed": 0, "M": 16, "estimator": "Reduction-2", "rpe": 0.097, "log_lik": -1.98},
        {"expert": "gaussian", "seed": 1, "M": 16, "estimator": "Reduction-2", "rpe": 0.103, "log_lik": -1.99},
    ]
    checks = {c["check"].split()[0]: c for c in seed_bar(rows)}
    assert checks["rpe"]["gaps"] == [-0.03, 0.03] and not checks["rpe"]["pass"]
    assert checks["log_lik"]["pass"] and checks["log_lik"]["estimator"] == "Reduction-2"


def test_truth_bar_checks_the_mean_over_seeds_against_the_data_generating_model():
    """The issue's decision: the mean over seeds is checked and every seed's value is reported beside it. One seed
    15% above the truth's loss passes on a mean of 8.5%; one seed 25% above fails on 15%. ARI likewise."""

    def checks(excesses: list[float], aris: list[float]) -> dict:
        rows = []
        for seed, (excess, ari) in enumerate(zip(excesses, aris)):
            rows.append({"expert": "logistic", "seed": seed, "M": 0, "estimator": "Truth", "log_loss": 0.02,
                         "ari": 0.96})  # fmt: skip
            rows.append({"expert": "logistic", "seed": seed, "M": 1, "estimator": "Global",
                         "log_loss": 0.02 * (1 + excess), "ari": ari})  # fmt: skip
            rows.append({"expert": "logistic", "seed": seed, "M": 1, "estimator": "Truth-EM",
                         "log_loss": 0.0209, "ari": 0.95})  # fmt: skip
        return {(c["estimator"], c["check"].split()[0]): c for c in truth_bar(rows)}

    passing = checks([0.02, 0.15], [0.95, 0.89])
    loss, ari = passing[("Global", "log_loss")], passing[("Global", "ari")]
    assert loss["gaps"] == [0.02, 0.15] and loss["mean"] == pytest.approx(0.085) and loss["pass"]
    assert ari["values"] == [0.95, 0.89] and ari["mean"] == pytest.approx(0.92) and ari["pass"]
    failing = checks([0.05, 0.25], [0.95, 0.80])
    loss, ari = failing[("Global", "log_loss")], failing[("Global", "ari")]
    assert loss["mean"] == pytest.approx(0.15) and not loss["pass"]
    assert ari["mean"] == pytest.approx(0.875) and not ari["pass"]
    assert failing[("Truth-EM", "log_loss")]["pass"] and failing[("Truth-EM", "ari")]["pass"]
    assert list(failing)[:2] == [("Global", "log_loss"), ("Global", "ari")]  # Global first
    line = format_checks([ari])[0]
    assert line.startswith("✘ logistic M=1 Global: ari at least 0.9 on the mean over seeds (mean 0.875; values")


def test_dmoe_command_without_machines_checks_global_with_the_screened_search(tmp_path, capsys):
    """``--machines`` with no value: the Truth, Truth-EM and Global rows only; the search reaches the fits."""
    argv = ["--n-samples", "1000", "--machines", "--seeds", "0", "--experts", "gaussian", "--n-init", "1",
            "--max-iter", "20", "--split-merge-search", "screened", "--split-merge", "1",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("Global: rpe at most 10% worse than Truth on the mean over seeds" in line for line in lines)
    result = json.loads((tmp_path / "dmoe.json").read_text())
    assert [row["estimator"] for row in result["rows"]] == ["Truth", "Truth-EM", "Global"]
    assert result["settings"]["split_merge_search"] == "screened" and result["settings"]["split_merge"] == 1
