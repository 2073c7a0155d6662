"""ppmix: mixture models as probabilistic programs in Pyro, with fast exact engines.

The model classes load on first use, so ``import ppmix`` (and ``ppmix --help``) stays fast.

Examples
--------
>>> import numpy as np
>>> from ppmix import GMM
>>> X = np.random.default_rng(0).normal(size=(200, 2))
>>> gmm = GMM(n_components=2, seed=0, progress=False).fit(X)
>>> gmm.predict(X).shape
(200,)
"""

from __future__ import annotations

from ppmix._lazy import lazy_exports
from ppmix._version import __version__

_EXPORTS = {
    "MixtureModel": "ppmix.models.base",
    "Mixture": "ppmix.models.mixture",
    "GMM": "ppmix.models.gmm",
    "HMM": "ppmix.models.hmm",
    "HSMM": "ppmix.models.hsmm",
    "MixtureOfExperts": "ppmix.models.moe",
    "select_components": "ppmix.models.selection",
    "PFGMM": "ppmix.models.pf",
    "SupervisedGMM": "ppmix.models.pf",
    "PFHMM": "ppmix.models.pf",
    "SupervisedHMM": "ppmix.models.pf",
    "set_thread_policy": "ppmix.ops.threads",
}
__all__ = [*sorted(_EXPORTS), "__version__"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
