"""Saved files whose config contradicts its tensors in meaning (issue 49, item 7): with both checksums re-sealed, an
edit that keeps every shape but changes what the numbers mean, or that the constructor's own checks refuse, is
refused on load with a message naming the field (the load runs the checks ``fit`` runs:
``_validate_hyperparameters``; the tensors record the class whose parameters they are; an HMM's chain must be
distributions its pattern allows)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from ppmix import HMM, Mixture
from ppmix.io import CONFIG_FILE, TENSOR_FILE, load_model
from tests.reliability._saved_models import forge

RNG = np.random.default_rng(0)
COUNTS = RNG.poisson(3.0, (40, 2)).astype(float)
SEQUENCES = [RNG.normal(size=(20, 2)), RNG.normal(size=(20, 2)) + 3.0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("meaning")
    poisson = Mixture(2, family="poisson", seed=0, progress=False).fit(COUNTS)
    left_right = HMM(3, transition_pattern="left-right", max_iter=3, tol=1.0, seed=0, progress=False)
    return {"poisson": poisson.save(root / "poisson"), "left-right": left_right.fit(SEQUENCES).save(root / "lr")}


def _forbidden_move(tensors: dict) -> dict:
    transition = tensors["state.transition"].clone()
    transition[1] = torch.tensor([0.5, 0.5, 0.0], dtype=transition.dtype)  # 1 -> 0: backwards in a left-right chain
    return {**tensors, "state.transition": transition}


#: edit -> (the save it edits, the config edit, the tensor edit, what the refusal names)
EDITS = {
    "poisson saved as exponential": (
        "poisson",
        lambda c: c["params"].update(family="exponential"),
        None,
        r"tensors.pt does not hold a valid Mixture state: the tensors are the parameters of PoissonComponents, "
        r"but field .family. of config.json names the family .exponential.",
    ),
    "a forbidden transition of 0.5": (
        "left-right",
        None,
        _forbidden_move,
        r"tensors.pt does not hold a valid HMM state: entry 'transition' gives the move 1 -> 0 the probability 0.5, "
        r"which transition_pattern='left-right' forbids",
    ),
    "a transition_pattern of the wrong size": (
        "left-right",
        lambda c: c["params"].update(transition_pattern=[[1, 1], [0, 1]]),
        None,
        r"config.json: field 'params' .*transition_pattern must be .* a finite \(3, 3\) array",
    ),
    "priors.rate_rate = -5": (
        "poisson",
        lambda c: c["params"].update(priors={"rate_rate": -5.0}),
        None,
        r"config.json: field 'params' .*priors\['rate_rate'\] must be positive",
    ),
    "missing = 'drop'": (
        "poisson",
        lambda c: c["params"].update(missing="drop"),
        None,
        r"config.json: field 'params' .*missing must be one of \('error', 'marginalize'\); got 'drop'",
    ),
    "a transition row that sums to 2": (
        "left-right",
        None,
        lambda t: {**t, "state.transition": t["state.transition"] * 2.0},
        r"entry 'transition' holds no probabilities",
    ),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_resealed_save_whose_config_contradicts_its_meaning_is_refused_naming_the_field(tmp_path, saved, edit):
    name, config_edit, tensor_edit, message = EDITS[edit]
    path = shutil.copytree(saved[name], tmp_path / "m")
    assert load_model(path) is not None  # the save itself loads
    tensors = None if tensor_edit is None else tensor_edit(torch.load(path / TENSOR_FILE, weights_only=True))
    forge(path, tensors, config_edit)
    with pytest.raises(ValueError, match=message):
        load_model(path)


def test_saves_without_the_components_record_still_load(tmp_path, saved):
    """Saves written before the tensors recorded their components' class load as before."""
    path = shutil.copytree(saved["poisson"], tmp_path / "m")
    forge(path, config_edit=lambda c: c["extra"].pop("components"))
    assert (path / CONFIG_FILE).exists()
    loaded = load_model(path)
    np.testing.assert_array_equal(loaded.predict_proba(COUNTS), load_model(saved["poisson"]).predict_proba(COUNTS))
