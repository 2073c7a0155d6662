"""pf-GMM's fitted outputs beyond the switch posteriors: the p-free gain, the selected features, the chosen prior."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["RelevanceOutputsMixin"]


class RelevanceOutputsMixin:
    """``relevance_gain_``, ``relevant_features_`` and the saved state of ``switch_prior="auto"`` (``p_``,
    ``switch_prior_scores_``) for :class:`~ppmix.models.PFGMM`, whose ``fit`` sets them.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models import PFGMM
    >>> data = make_pf_synthetic(300, n_relevant=2, n_features=5, seed=0)
    >>> model = PFGMM(2, switch_prior=0.1, seed=0, progress=False).fit(data.X, data.y)
    >>> model.relevant_features_.tolist(), bool(model.relevance_gain_[2:].max() < 0.05)
    ([True, True, False, False, False], True)
    """

    p_: float
    switch_prior_scores_: dict[float, float] | None
    _relevant_mask: np.ndarray | None

    @property
    def relevance_gain_(self) -> Any:
        """``gain_d = logit phi_d - logit p``, the p-free evidence of B.2.1 (NaN when ``p = 1``)."""
        self._check_fitted()
        if self._all_relevant:
            gain = torch.full_like(self.switch_probs_, float("nan"))
        else:
            gain = torch.logit(self.switch_probs_) - math.log(self._switch_p / (1.0 - self._switch_p))
        return self._feature_output(gain.detach().cpu().numpy(), "relevance_gain")

    @property
    def relevant_features_(self) -> Any:
        """Features the mixture uses and that go with the label (see the class docstring); all when ``p = 1``."""
        self._check_fitted()
        mask = getattr(self, "_relevant_mask", None)
        if mask is None:
            raise AttributeError("relevant_features_ is computed by PFGMM.fit (not by fit_em, nor in older files)")
        return self._feature_output(mask, "relevant")

    def _feature_output(self, values: np.ndarray, name: str) -> Any:
        """``values`` as numpy, or a pandas Series indexed by the feature names."""
        if self.feature_names_in_ is None:
            return values
        import pandas as pd

        return pd.Series(values, index=self.feature_names_in_, name=name)

    def extra_state(self) -> dict[str, Any]:
        """The chosen ``p_``, its scores and :attr:`relevant_features_` (a fit by ``fit_em`` has only ``p``)."""
        scores = getattr(self, "switch_prior_scores_", None)
        return {
            "p": self._switch_p,
            "switch_prior_scores": None if scores is None else [[p, s] for p, s in scores.items()],
            "relevant": None if getattr(self, "_relevant_mask", None) is None else self._relevant_mask.tolist(),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""
        scores = state.get("switch_prior_scores")  # files written before "auto" hold none of these
        self.p_ = float(state.get("p", self.switch_prior))
        self.switch_prior_scores_ = None if scores is None else {float(p): float(s) for p, s in scores}
        relevant = state.get("relevant")
        self._relevant_mask = None if relevant is None else np.asarray(relevant, dtype=bool)
