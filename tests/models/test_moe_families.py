"""``MixtureOfExperts(expert=...)`` takes an expert family object as well as a registered name."""

from __future__ import annotations

import numpy as np
import pytest

from ppmix import MixtureOfExperts
from ppmix.components.gaussian_expert import GaussianExpertFamily
from ppmix.components.logistic_expert import LogisticExpertFamily
from ppmix.components.registry import EXPERT_FAMILIES, expert_family_from
from tests.common import make_expert_data

QUIET = {"seed": 0, "progress": False, "n_init": 2, "max_iter": 30}


@pytest.mark.parametrize("family", [GaussianExpertFamily(), LogisticExpertFamily()], ids=["gaussian", "logistic"])
def test_a_family_object_fits_exactly_as_its_registered_name(family, tmp_path):
    x, y = make_expert_data(120, expert=family.name)
    by_name = MixtureOfExperts(2, expert=family.name, **QUIET).fit(x, y)
    by_object = MixtureOfExperts(2, expert=family, **QUIET).fit(x, y)
    np.testing.assert_array_equal(by_object.coef_.numpy(), by_name.coef_.numpy())
    assert by_object.target_kind == family.target_kind
    loaded = MixtureOfExperts.load(by_object.save(tmp_path / "moe"))
    np.testing.assert_array_equal(loaded.predict(x), by_object.predict(x))
    assert loaded.get_params()["expert"] == {"name": family.name}


def test_every_registered_expert_family_declares_a_target_kind_the_model_knows():
    for name in EXPERT_FAMILIES:
        assert expert_family_from(name).target_kind in ("real", "binary", "categorical", "count")


def test_an_unregistered_expert_family_fits_but_is_not_saved(tmp_path):
    class Mine(GaussianExpertFamily):
        name = "mine"

    x, y = make_expert_data(120)
    model = MixtureOfExperts(2, expert=Mine(), **QUIET).fit(x, y)
    assert model.score(x, y) == pytest.approx(MixtureOfExperts(2, **QUIET).fit(x, y).score(x, y), rel=1e-10)
    with pytest.raises(ValueError, match="EXPERT_FAMILIES"):
        model.save(tmp_path / "mine")


@pytest.mark.parametrize("expert", ["gamma", 3])
def test_an_unknown_expert_is_an_error_naming_expert(expert):
    x, y = make_expert_data(60)
    with pytest.raises((ValueError, TypeError), match="expert"):
        MixtureOfExperts(2, expert=expert, progress=False).fit(x, y)
