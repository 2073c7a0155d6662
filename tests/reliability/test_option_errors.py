"""Options given in the wrong place (issue 49, item 6): a family's setting given to the structure, a family's dict
form with a setting it does not take, an engine option the engine does not take. Each is a ``TypeError`` that
names the option and says what is accepted or where it belongs, not Python's bare "unexpected keyword argument"."""

from __future__ import annotations

import numpy as np
import pytest

from ppmix import HMM, Mixture
from ppmix.components.registry import FAMILIES, family_options

COUNTS = np.random.default_rng(0).poisson(3.0, (40, 2)).astype(float)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: HMM(3, emission="gmm", n_mix=3),
            r"HMM\(\) got an unexpected keyword argument 'n_mix'; 'n_mix' is an option of the 'gmm' family: "
            r"pass emission=\{'name': 'gmm', 'n_mix': 3\}",
        ),
        (
            lambda: Mixture(2, family="student_t", min_df=3.0),
            r"'min_df' is an option of the 'student_t' family: pass family=\{'name': 'student_t', 'min_df': 3.0\}",
        ),
        (
            lambda: HMM(2, n_mix=2),  # the default emission, gaussian, has no n_mix
            r"'n_mix' is an option of the family 'gmm', not of 'gaussian': pass it as emission=\{'name': 'gmm'",
        ),
        (lambda: Mixture(2, colour="red"), r"Mixture\(\) got an unexpected keyword argument 'colour'$"),
    ],
)
def test_a_family_option_given_to_the_structure_points_at_the_dict_form(make, message):
    with pytest.raises(TypeError, match=message):
        make()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_an_unknown_option_in_a_family_dict_is_named_with_the_accepted_ones(name):
    accepted = family_options(name)
    with pytest.raises(TypeError, match=rf"unknown option 'smoothing' for family '{name}'; ") as info:
        Mixture(2, family={"name": name, "smoothing": 0.5}).fit(COUNTS)
    assert all(option in str(info.value) for option in accepted) and ("no options" in str(info.value)) == (not accepted)


def test_the_dict_form_with_known_options_still_fits():
    model = HMM(2, emission={"name": "gmm", "n_mix": 2}, max_iter=3, tol=1.0, seed=0, progress=False)
    model.fit([np.random.default_rng(1).normal(size=(30, 2))])
    assert model._component_family().n_mix == 2


@pytest.mark.parametrize(
    "engine, option, accepted",
    [
        ("gibbs", "thin", "num_samples, warmup_steps, num_chains, relabel"),
        ("em", "num_steps", "n_init, max_iter, tol"),
        ("svi", "max_iter", "num_steps"),
        ("mcmc", "num_steps", "num_samples"),
    ],
)
def test_an_engine_option_the_engine_does_not_take_is_named(engine, option, accepted):
    with pytest.raises(
        TypeError, match=rf"fit\(engine='{engine}'\) got an unknown option '{option}'; accepted: "
    ) as info:
        Mixture(2, family="poisson", seed=0, progress=False).fit(COUNTS, engine=engine, **{option: 2})
    assert accepted in str(info.value)
