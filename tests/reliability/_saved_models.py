"""What the persistence audits share: the data their models are fitted on and how two fits are compared."""

from __future__ import annotations

from typing import Any

import numpy as np

from ppmix.io import atomic

_rng = np.random.default_rng(0)
X = np.concatenate([_rng.normal(size=(40, 2)), _rng.normal(size=(40, 2)) + 5.0])
#: whether this platform swaps two directories atomically (renameat2); otherwise a save renames twice
SWAP_WORKS = atomic._renameat2() is not None


def same_gmm(loaded: Any, model: Any) -> bool:
    return type(loaded) is type(model) and np.array_equal(loaded.predict_proba(X), model.predict_proba(X))
