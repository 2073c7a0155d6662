"""pf-GMM's fitted outputs beyond the switch posteriors, as functions of the fitted model: the p-free gain, the
selected features, the statistics a sharded fit merges for them and the saved state of the chosen prior.
:class:`~ppmix.models.PFGMM`'s ``relevance_gain_``, ``relevant_features_`` and private hooks call them.

Examples
--------
>>> from ppmix.datasets import make_pf_synthetic
>>> from ppmix.models import PFGMM
>>> data = make_pf_synthetic(300, n_relevant=2, n_features=5, seed=0)
>>> model = PFGMM(2, switch_prior=0.1, seed=0, progress=False).fit(data.X, data.y)
>>> model.relevant_features_.tolist(), bool(model.relevance_gain_[2:].max() < 0.05)
([True, True, False, False, False], True)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ppmix.components import DiagGaussian
from ppmix.models.pf._observed import frame_statistics
from ppmix.models.pf._pf_state import all_relevant, background_statistics, feature_output, set_background, switch_p
from ppmix.models.pf.switch_selection import relevant_mask_from_ratio
from ppmix.models.pf.switches import label_ratio_from_statistics

__all__ = ["relevance_gain", "relevant_features"]


def relevance_gain(model: Any) -> Any:
    """``gain_d = logit phi_d - logit p``, the p-free evidence of B.2.1 (NaN when ``p = 1``)."""
    model._check_fitted()
    if all_relevant(model):
        gain = torch.full_like(model.switch_probs_, float("nan"))
    else:
        p = switch_p(model)
        gain = torch.logit(model.switch_probs_) - math.log(p / (1.0 - p))
    return feature_output(model, gain.detach().cpu().numpy(), "relevance_gain")


def relevant_features(model: Any) -> Any:
    """Features the mixture uses and that go with the label; all when ``p = 1``.

    After :func:`ppmix.distributed.fit_em` it comes from the statistics merged across the
    shards (the rows and the per-class Gaussian moments), the same test as after ``fit``.
    """
    model._check_fitted()
    mask = getattr(model, "_relevant_mask", None)
    sharded = getattr(model, "_shard_label_statistics", None)
    if mask is None and sharded is not None:
        mask = model._relevant_mask = _sharded_relevant_mask(model, sharded)
    if mask is None:
        raise AttributeError("relevant_features_ is computed by PFGMM.fit or fit_em (files before it hold none)")
    return feature_output(model, mask, "relevant")


def relevant_mask_or_none(model: Any) -> np.ndarray | None:
    """:func:`relevant_features` as a boolean array, or None where the model has none."""
    try:
        return np.asarray(relevant_features(model), dtype=bool)
    except AttributeError:
        return None


def _sharded_relevant_mask(model: Any, stats: dict[str, Any]) -> np.ndarray:
    if all_relevant(model):
        return np.ones(model.n_features_in_, dtype=bool)
    classes = stats["classes"]
    labelled = bool((classes.counts > 0).all())
    ratio = label_ratio_from_statistics(classes) if labelled else None
    gain = np.asarray(relevance_gain(model), dtype=np.float64)
    return relevant_mask_from_ratio(gain, model.n_components, int(stats["rows"]), ratio)


def data_statistics(model: Any, data: Any) -> dict[str, Any]:
    """Before a sharded fit: the background's statistics, the number of rows and the Gaussian statistics of
    each class's labelled rows (for :func:`relevant_features`); they merge across shards. Every row counts as
    often as its sample weight, where there are some. Also before a warm-started fit (its data's background)."""
    frames, labels, weight = data.rows, data.labels, data.weight
    onehot = torch.stack([labels.observed & (labels.y == c) for c in (0.0, 1.0)], 1).to(frames.x.dtype)
    if weight is not None:
        onehot = onehot * weight.to(onehot)[:, None]
    d = frames.x.shape[1]
    family = DiagGaussian(frames.x.new_zeros(2, d), frames.x.new_ones(2, d))
    rows = float(frames.x.shape[0]) if weight is None else float(weight.sum())
    return {
        "background": background_statistics(model, frames, weight),
        "classes": frame_statistics(family, frames, onehot),  # of the observed entries, where some are missing
        "rows": torch.tensor(rows, dtype=torch.float64),
    }


def set_data_statistics(model: Any, stats: dict[str, Any]) -> None:
    """The background from the (merged) statistics of :func:`data_statistics`; the rest kept for
    :func:`relevant_features`."""
    set_background(model, stats["background"])
    model._shard_label_statistics = stats
    model._relevant_mask = None


def relevance_state(model: Any) -> dict[str, Any]:
    """The chosen ``p_``, its scores, :func:`relevant_features` and the restarts' scores (a fit by ``fit_em``
    has only ``p``): what a saved file holds beyond the tensors."""
    scores = getattr(model, "switch_prior_scores_", None)
    return {
        "p": switch_p(model),
        "switch_prior_scores": None if scores is None else [[p, s] for p, s in scores.items()],
        "relevant": None if (mask := relevant_mask_or_none(model)) is None else mask.tolist(),
        "restart_scores": getattr(model, "restart_scores_", None),
    }


def load_relevance_state(model: Any, state: dict[str, Any]) -> None:
    """Inverse of :func:`relevance_state`."""
    scores = state.get("switch_prior_scores")  # files written before "auto" hold none of these
    model.p_ = float(state.get("p", model.switch_prior))
    model.switch_prior_scores_ = None if scores is None else {float(p): float(s) for p, s in scores}
    relevant = state.get("relevant")
    model._relevant_mask = None if relevant is None else np.asarray(relevant, dtype=bool)
    restarts = state.get("restart_scores")  # files written before n_restarts hold none
    model.restart_scores_ = None if restarts is None else [float(s) for s in restarts]
