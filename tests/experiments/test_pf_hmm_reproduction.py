"""The pf-HMM reproduction (Figure 6 bottom / Figure 9) runs quickly, writes its outputs and shows the paper's trend."""

import json

import pytest

from ppmix.experiments import registry
from ppmix.experiments.pf_hmm import METHODS, PAPER_CLAIM, run


@pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")
def test_pf_hmm_reproduction_quick(tmp_path):
    result = run(tmp_path, quick=True)
    assert (tmp_path / "pf_hmm.json").is_file() and (tmp_path / "pf_hmm.png").stat().st_size > 0
    saved = json.loads((tmp_path / "pf_hmm.json").read_text())
    assert saved["settings"] == result["settings"] and saved["paper"] == PAPER_CLAIM

    settings = {s["n_relevant"]: s for s in result["settings"]}
    assert sorted(settings) == [2, 5, 20]
    for d_r, setting in settings.items():
        assert setting["K"] == [2, 4] and set(setting["test_auroc"]) == set(METHODS)
        at_4 = {m: setting["test_auroc"][m][1] for m in METHODS}
        assert all(0.0 <= v <= 1.0 for v in at_4.values())
        assert at_4["pf-HMM"] <= setting["bayes_auroc"] + 0.02
        if d_r < 20:  # few relevant features: pf-HMM finds them, the baselines follow the irrelevant chain
            assert setting["pf_relevance"][1] and [r > 0.5 for r in setting["pf_relevance"][1]] == setting["relevant"]
            assert at_4["pf-HMM"] > 0.9 and at_4["pf-HMM"] > max(at_4["sup-HMM"], at_4["2-Step-HMM"]) + 0.2
        else:  # every feature relevant: all three agree
            assert max(at_4.values()) - min(at_4.values()) < 0.03


def test_pf_hmm_reproduction_registered():
    item = registry.get("pf-hmm")
    assert item.run is run
    assert "Figure 9" in item.description
