"""pf-GMM's fitted outputs beyond the switch posteriors: the p-free gain, the selected features, the chosen prior."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ppmix.components import DiagGaussian
from ppmix.models._weights import split_weights
from ppmix.models.pf._observed import frame_statistics
from ppmix.models.pf.switch_selection import relevant_mask_from_ratio
from ppmix.models.pf.switches import label_ratio_from_statistics

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
    restart_scores_: list[float] | None
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
        """Features the mixture uses and that go with the label (see the class docstring); all when ``p = 1``.

        After :func:`ppmix.distributed.fit_em` it comes from the statistics merged across the
        shards (the rows and the per-class Gaussian moments), the same test as after ``fit``.
        """
        self._check_fitted()
        mask = getattr(self, "_relevant_mask", None)
        sharded = getattr(self, "_shard_label_statistics", None)
        if mask is None and sharded is not None:
            mask = self._relevant_mask = self._sharded_relevant_mask(sharded)
        if mask is None:
            raise AttributeError("relevant_features_ is computed by PFGMM.fit or fit_em (files before it hold none)")
        return self._feature_output(mask, "relevant")

    def _relevant_mask_or_none(self) -> np.ndarray | None:
        try:
            return np.asarray(self.relevant_features_, dtype=bool)
        except AttributeError:
            return None

    def _sharded_relevant_mask(self, stats: dict[str, Any]) -> np.ndarray:
        if self._all_relevant:
            return np.ones(self.n_features_in_, dtype=bool)
        classes = stats["classes"]
        labelled = bool((classes.counts > 0).all())
        ratio = label_ratio_from_statistics(classes) if labelled else None
        gain = np.asarray(self.relevance_gain_, dtype=np.float64)
        return relevant_mask_from_ratio(gain, self.n_components, int(stats["rows"]), ratio)

    def _em_data_statistics(self, data: Any) -> dict[str, Any]:
        """Before a sharded fit: the background's statistics, the number of rows and the Gaussian statistics of
        each class's labelled rows (for :attr:`relevant_features_`); they merge across shards. Every row counts as
        often as its sample weight, where there are some. Also before a warm-started fit (its data's background)."""
        inner, weight = split_weights(data)
        frames, labels = inner.frames, inner.labels
        onehot = torch.stack([labels.observed & (labels.y == c) for c in (0.0, 1.0)], 1).to(frames.x.dtype)
        if weight is not None:
            onehot = onehot * weight.to(onehot)[:, None]
        d = frames.x.shape[1]
        family = DiagGaussian(frames.x.new_zeros(2, d), frames.x.new_ones(2, d))
        rows = float(frames.x.shape[0]) if weight is None else float(weight.sum())
        return {
            "background": self._background_statistics(frames, weight),
            "classes": frame_statistics(family, frames, onehot),  # of the observed entries, where some are missing
            "rows": torch.tensor(rows, dtype=torch.float64),
        }

    def _em_set_data_statistics(self, stats: dict[str, Any]) -> None:
        """The background from the (merged) statistics of :meth:`_em_data_statistics`; the rest kept for
        :attr:`relevant_features_`."""
        self._set_background(stats["background"])
        self._shard_label_statistics = stats
        self._relevant_mask = None

    def _feature_output(self, values: np.ndarray, name: str) -> Any:
        """``values`` as numpy, or a pandas Series indexed by the feature names."""
        if self.feature_names_in_ is None:
            return values
        import pandas as pd

        return pd.Series(values, index=self.feature_names_in_, name=name)

    def _extra_state(self) -> dict[str, Any]:
        """The chosen ``p_``, its scores, :attr:`relevant_features_` and the restarts' scores (a fit by ``fit_em``
        has only ``p``)."""
        scores = getattr(self, "switch_prior_scores_", None)
        return {
            "p": self._switch_p,
            "switch_prior_scores": None if scores is None else [[p, s] for p, s in scores.items()],
            "relevant": None if (mask := self._relevant_mask_or_none()) is None else mask.tolist(),
            "restart_scores": getattr(self, "restart_scores_", None),
        }

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`_extra_state`."""
        scores = state.get("switch_prior_scores")  # files written before "auto" hold none of these
        self.p_ = float(state.get("p", self.switch_prior))
        self.switch_prior_scores_ = None if scores is None else {float(p): float(s) for p, s in scores}
        relevant = state.get("relevant")
        self._relevant_mask = None if relevant is None else np.asarray(relevant, dtype=bool)
        restarts = state.get("restart_scores")  # files written before n_restarts hold none
        self.restart_scores_ = None if restarts is None else [float(s) for s in restarts]
