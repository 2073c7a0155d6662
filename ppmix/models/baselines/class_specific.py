"""The class-specific GMM baseline (Supplement F): one GMM per class, ``p(y | x)`` by Bayes' rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ppmix._validation import check_positive_int
from ppmix.models._params import store_params
from ppmix.models.baselines._base import _GaussianMixtureDensity, _LabelBaseline
from ppmix.models.gmm import GMM

__all__ = ["ClassSpecificGMM"]


class ClassSpecificGMM(_GaussianMixtureDensity, _LabelBaseline):
    """One GMM per class (Supplement F): ``p(x | y = c)`` is a ``K``-component GMM fitted
    on the rows with label ``c``; ``p(y | x)`` follows by Bayes' rule with the class
    frequencies as priors, and ``p(x) = sum_c pi_c p_c(x)``. Rows without a label are
    not used (the per-class fits have no unsupervised part).

    Parameters
    ----------
    n_components : int, default 4
        Components per class.
    covariance_type : {"diag", "full"}, default "diag"
    n_init, max_iter : int
        Passed to each :class:`~ppmix.GMM`.
    seed : int, optional
        Class ``c`` uses ``seed + c``.

    Attributes
    ----------
    gmms_ : list of two fitted :class:`~ppmix.GMM`
    class_prior_ : ndarray (2,)

    Examples
    --------
    >>> from ppmix.datasets import make_two_mixture
    >>> X, y = make_two_mixture(200, n_relevant=2, n_irrelevant=2, seed=0)
    >>> model = ClassSpecificGMM(1, seed=0).fit(X, y)
    >>> model.class_prior_.round(2), model.score_samples(X).shape
    (array([0.44, 0.56]), (200,))
    """

    def __init__(
        self,
        n_components: int = 4,
        *,
        covariance_type: str = "diag",
        n_init: int = 1,
        max_iter: int = 100,
        seed: int | None = None,
    ) -> None:
        store_params(self, locals())

    def fit(self, X: Any, y: Any) -> "ClassSpecificGMM":
        """Fit one GMM on the rows of each class."""
        k = check_positive_int(self.n_components, "n_components")
        x, labels = self._prepare_fit(X, y)
        counts = np.array([(labels == c).sum() for c in (0, 1)], dtype=np.float64)
        for c in (0, 1):
            if k > counts[c]:
                raise ValueError(f"n_components={k} is larger than the number of samples with y={c} ({counts[c]:.0f})")
        self.gmms_ = [
            GMM(
                k,
                covariance_type=self.covariance_type,
                n_init=self.n_init,
                max_iter=self.max_iter,
                seed=None if self.seed is None else self.seed + c,
                progress=False,
            ).fit(x[torch.as_tensor(labels == c)])
            for c in (0, 1)
        ]
        self.class_prior_ = counts / counts.sum()
        self.classes_ = self._fit_classes
        return self

    def _class_log_joint(self, X: Any) -> torch.Tensor:
        """``log pi_c + log p_c(x)``, shape ``(N, 2)``."""
        x = self._prepare(X)
        log_px = torch.stack([gmm.score_samples(x) for gmm in self.gmms_], dim=1)
        return log_px + torch.as_tensor(np.log(self.class_prior_))

    def predict_proba(self, X: Any) -> np.ndarray:
        """``p(y = c | x) = pi_c p_c(x) / sum_c' pi_c' p_c'(x)``, shape ``(N, 2)``."""
        return torch.softmax(self._class_log_joint(X), dim=1).numpy()

    def score_samples(self, X: Any) -> np.ndarray:
        """``log p(x) = log sum_c pi_c p_c(x)`` per row."""
        return torch.logsumexp(self._class_log_joint(X), dim=1).numpy()

    def _mixture_parameters(self) -> tuple[Any, Any, Any]:
        # a mixture of mixtures is one mixture with the weights pi_c w_ck
        weights = torch.cat([float(p) * g.weights_ for p, g in zip(self.class_prior_, self.gmms_)])
        return (
            weights,
            torch.cat([g.means_ for g in self.gmms_]),
            torch.cat([g.covariances_ for g in self.gmms_]),
        )
