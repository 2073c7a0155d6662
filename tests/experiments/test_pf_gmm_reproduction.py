"""The "pf-gmm" reproduction (Sharma et al., 2023, Table 1 / Figure 11 / Figure 4D), quick mode."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ppmix.experiments import registry
from ppmix.experiments.pf_gmm import PAPER_FIGURE11, run


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("pf_gmm")
    return out, run(out, quick=True)


def test_registered():
    item = registry.get("pf-gmm")
    assert item.run is run


def test_pf_gmm_finds_the_relevant_features_and_beats_the_baselines(quick_result):
    _, result = quick_result
    rows = result["settings"]["D_R=20,K=4"]["models"]
    assert rows["pf-GMM"]["relevant_recovered"]
    assert rows["pf-GMM"]["auroc"] >= 0.97
    assert rows["pf-GMM"]["log_p_y_given_x"] >= -0.10
    for baseline in ("sup-GMM", "2-Step", "pc-GMM"):
        assert rows[baseline]["auroc"] < rows["pf-GMM"]["auroc"] - 0.1
    study = result["seed_study"]
    assert study["relevance"]["aligned"] == study["relevance"]["seeds"] and study["kmeans"]["aligned"] == 0
    # the relevant features are modelled far better by pf-GMM than by the mixtures that follow the irrelevant ones
    assert rows["pf-GMM"]["log_p_x_relevant"] > rows["sup-GMM"]["log_p_x_relevant"] + 10


def test_outputs_and_paper_numbers(quick_result):
    out, result = quick_result
    saved = json.loads((out / "pf_gmm.json").read_text())
    assert saved["settings"]["D_R=20,K=4"]["paper"]["pf-GMM"] == list(PAPER_FIGURE11["D_R=20,K=4"]["pf-GMM"])
    assert (out / "pf_gmm.png").stat().st_size > 10_000
    assert any("Bayes limit" in line for line in result["report"])


def test_real_data_comparison_small():
    """Defaults only on breast cancer + distractors (3 folds, K = 2): close to logistic regression, no distractor
    selected, and the summary rows of every model."""
    from ppmix.experiments.pf_gmm_real import compare, load_binary, report_lines, with_distractors

    x, y = load_binary("breast_cancer")
    data = with_distractors(x, 20, seed=1)
    real = np.arange(data.shape[1]) < x.shape[1]
    result = {"bc": compare(data, y, real, (2,), n_folds=3, quick=True, hindsight=False)}
    rows = result["bc"]["K=2"]["models"]
    assert set(rows) == {"pf-GMM", "sup-GMM", "Logistic regression", "Random forest"}
    assert rows["pf-GMM"]["auroc"] > rows["Logistic regression"]["auroc"] - 0.03
    assert rows["pf-GMM"]["auroc_worst_fold"] > rows["pf-GMM"]["auroc"] - 0.05
    assert rows["pf-GMM"]["selection_precision"] == 1.0 and rows["pf-GMM"]["selection_recall"] > 0.5
    assert rows["Logistic regression"]["log_p_x_relevant"] is None and rows["sup-GMM"]["log_p_x_relevant"] < 0
    assert any("relevant_features_ precision 1.000" in line for line in report_lines(result))


def test_bar_check_and_command_line(capsys):
    """The bars (within 0.01 of the best p with hindsight; no fold more than 0.05 below the mean) as computed."""
    from ppmix.experiments.pf_gmm_real import bar_check, main

    pf = {"auroc": 0.98, "auroc_worst_fold": 0.95}
    block = {"models": {"pf-GMM": pf}, "hindsight": {0.01: 0.985, 0.1: 0.99, 0.5: 0.9}}
    bars = bar_check(block)
    assert bars["hindsight_best_p"] == 0.1 and bars["hindsight_best_auroc"] == 0.99
    assert bars["shortfall"] == pytest.approx(0.01) and bars["worst_fold_below_mean"] == pytest.approx(0.03)
    assert bar_check({**block, "hindsight": {}}) is None
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0 and "--jobs" in capsys.readouterr().out
