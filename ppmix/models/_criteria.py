"""Information criteria for the generative models whose likelihood ppmix computes exactly (GMM, HMM)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["InformationCriteriaMixin"]


class InformationCriteriaMixin:
    """``bic`` and ``aic`` from the host's ``n_parameters``, ``prepare_data``, ``pointwise_log_likelihood`` and
    ``n_observations`` (the rows of a mixture, the time steps of an HMM: ``N`` in ``p log N``)."""

    def bic(self, X: Any) -> float:
        """Bayesian information criterion ``-2 log L + p log N`` (lower is better).

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import GMM
        >>> X = np.random.default_rng(0).normal(size=(200, 2))
        >>> gmm = GMM(1, progress=False).fit(X)
        >>> bool(abs(gmm.bic(X) - gmm.aic(X) - gmm.n_parameters * (np.log(200) - 2)) < 1e-9)
        True
        """
        log_likelihood, n = self._log_likelihood_and_size(X)
        return -2.0 * log_likelihood + self.n_parameters * math.log(n)

    def aic(self, X: Any) -> float:
        """Akaike information criterion ``-2 log L + 2 p`` (lower is better)."""
        return -2.0 * self._log_likelihood_and_size(X)[0] + 2.0 * self.n_parameters

    def _log_likelihood_and_size(self, X: Any) -> tuple[float, int]:
        self._check_fitted()
        data = self.prepare_data(X)
        return float(self.pointwise_log_likelihood(data).sum()), self.n_observations(data)
