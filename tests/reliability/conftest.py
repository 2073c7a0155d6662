"""Fixtures of the persistence audits: two different fitted GMMs on the same data, and the two ways a save is
installed."""

from __future__ import annotations

import pytest

from ppmix import GMM
from ppmix.io import atomic
from tests.reliability._saved_models import SWAP_WORKS, X


@pytest.fixture(scope="module")
def gmm_a():
    return GMM(2, seed=0, progress=False).fit(X)


@pytest.fixture(scope="module")
def gmm_b():
    return GMM(3, covariance_type="full", seed=1, progress=False).fit(X)


@pytest.fixture(params=["swap", "renames"])
def mode(request, monkeypatch):
    """Install the new save by the atomic swap (Linux) or by two renames (elsewhere)."""
    if request.param == "swap" and not SWAP_WORKS:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    if request.param == "renames":
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    return request.param
