"""The SVI engine's checks of its learning rate (issue 16 item 9)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ppmix import GMM, MixtureOfExperts


@pytest.mark.parametrize("lr", [0, -1.0, float("inf"), float("nan"), "0.1"])
def test_an_invalid_lr_is_refused_naming_it(lr):
    X = np.random.default_rng(0).normal(size=(40, 2))
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        GMM(2, seed=0, progress=False).fit(X, engine="svi", lr=lr, num_steps=5)


def test_a_diverging_lr_raises_one_clear_error_naming_the_step():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 2))
    y = X[:, 0] + rng.normal(size=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FloatingPointError, match=r"at step \d+.*smaller lr") as info:
            MixtureOfExperts(2, seed=0, progress=False).fit(X, y, engine="svi", lr=1e6, num_steps=30)
    assert "Trace Shapes" not in str(info.value)
