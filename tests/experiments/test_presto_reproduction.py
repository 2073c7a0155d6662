"""The PRESTO reproduction (Table 5, Figure 1) runs quickly and writes its outputs."""

import json

from ppmix.experiments import registry
from ppmix.experiments.presto import PAPER_TABLE5, run

METHODS = {
    "PRESTO (logistic)",
    "PRESTO (linear SVM, hinge)",
    "PRESTO (scores='loss')",
    "PRESTO start (k-means)",
    "k-means++",
    "Agglomerative (Ward)",
    "GMM (full)",
    "Learn-MLR (hard AM)",
    "Learn-MLR (hard AM, k-means start)",
}


def test_presto_reproduction_quick(tmp_path):
    result = run(tmp_path, quick=True)
    assert (tmp_path / "presto.json").is_file() and (tmp_path / "presto.png").stat().st_size > 0
    saved = json.loads((tmp_path / "presto.json").read_text())
    assert saved["table"] == result["table"]

    rows = {row["method"]: row for row in result["table"]}
    assert set(rows) == METHODS
    for method, row in rows.items():
        # hard AM collapses to a label split (chance level); its ARI may dip just below 0
        ari_floor = -0.05 if method.startswith("Learn-MLR") else 0.0
        assert 0.0 <= row["NMI"] <= 1.0 and ari_floor <= row["ARI"] <= 1.0, row
        assert row["seconds"] >= 0.0
    # PRESTO improves on its own k-means initialisation
    assert rows["PRESTO (logistic)"]["NMI"] >= rows["PRESTO start (k-means)"]["NMI"]
    assert rows["PRESTO (logistic)"]["paper NMI"] == PAPER_TABLE5["PRESTO"][0] == 0.86
    assert rows["PRESTO (logistic)"]["paper ARI"] == PAPER_TABLE5["PRESTO"][1] == 0.92

    history = result["presto_history"]
    assert len(history) >= 1 and all(isinstance(v, float) for v in history)

    # the objective diagnosis: PRESTO's own value is its final history entry, and a
    # one-label-per-part partition beats the true sets on sum_k G(S_k) at the paper's lambda
    diag = result["objective_of_partitions"]
    minimised = "sum_G + eps * sum ||x - c||^2 (what PRESTO (logistic) minimises)"
    assert abs(diag["PRESTO (logistic)"][minimised] - history[-1]) <= 1e-3 * abs(history[-1])
    paper = "sum_G (ridge=1e-4, paper lambda)"
    assert diag["label-grouped"][paper] < 0.1 * diag["true sets"][paper]


def test_presto_reproduction_registered():
    item = registry.get("presto")
    assert item.run is run
    assert "Table 5" in item.description


def test_presto_accuracy_rows_on_the_region_synthetic():
    from ppmix.experiments.presto_accuracy import compare_predictors, make_region_rules

    X, y, region = make_region_rules(200, seed=0)
    Xt, yt, region_t = make_region_rules(600, seed=1)
    rows = compare_predictors(X, y, Xt, yt, component="logistic", k=4, oracle=(region, region_t))
    assert {
        "PRESTO (mu=0)",
        "PRESTO (mu=1)",
        "one model",
        "k-means + one model per cluster",
        "hard AM (Learn-MLR) + router",
        "MixtureOfExperts (logistic)",
        "oracle router",
    } <= set(rows)
    assert any(name.startswith("MLP (") for name in rows)
    for row in rows.values():
        assert 0.0 <= row["test_accuracy"] <= 1.0 and 0.0 <= row["test_macro_f1"] <= 1.0 and row["seconds"] >= 0
    # no single linear rule fits; the oracle's four do; the router term makes PRESTO's partition routable
    assert rows["oracle router"]["test_accuracy"] > rows["one model"]["test_accuracy"] + 0.3
    assert rows["PRESTO (mu=1)"]["routability"] > rows["PRESTO (mu=0)"]["routability"]


def test_presto_accuracy_registered():
    from ppmix.experiments import presto_accuracy

    item = registry.get("presto-accuracy")
    assert item.run is presto_accuracy.run and item.stem == "presto_accuracy"
