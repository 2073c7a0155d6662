"""ppmix: mixture models as probabilistic programs in Pyro, with fast exact engines.

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

__version__ = "0.1.0"

from ppmix.models.base import MixtureModel
from ppmix.models.gmm import GMM
from ppmix.models.hmm import HMM
from ppmix.models.moe import MixtureOfExperts
from ppmix.models.pf_gmm import PFGMM, SupervisedGMM
from ppmix.models.pf_hmm import PFHMM, SupervisedHMM

__all__ = [
    "GMM",
    "HMM",
    "PFGMM",
    "PFHMM",
    "MixtureModel",
    "MixtureOfExperts",
    "SupervisedGMM",
    "SupervisedHMM",
    "__version__",
]
