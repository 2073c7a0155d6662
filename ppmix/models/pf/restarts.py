"""Relevance-guided restarts of pf-GMM, kept by the in-sample counterpart of the criterion that chooses ``p``.

With label-independent structure in the data (distractor features), EM from one start can
settle where some components follow that structure, and how often it does grows with ``p``
and ``K``. :class:`~ppmix.models.PFGMM` (``n_restarts``) therefore fits from several starts
and keeps the fit with the best mean ``log P(y_n | x_n)`` over its labelled training rows:
the quantity whose held-out value chooses ``p`` (:mod:`~ppmix.models.pf.switch_selection`),
so that each candidate ``p`` is scored by the same procedure as the final fit (the
validation fits restart too). Without labels the restarts are kept by the ELBO.

A later start must be better by ``RESTART_MARGIN_SE`` standard errors of the paired per-row
difference: the in-sample score also rewards a fit that gives a component to one mislabelled
row, and such a fit (which may merge two clusters of a class to free that component) predicts
the other rows no better and sits nats per point lower in the ELBO.

The starts (:func:`start_responsibilities`), all on the features whose distribution changes
with the label (:func:`~ppmix.models.pf.switches.label_relevant_features`, all features when
none does):

0. the model's own start (``init_params``; k-means on those features for ``"relevance"``);
1. class-stratified: the ``K`` components shared out over the two classes in proportion to
   their sizes, k-means within each class, so that every component starts label-pure;
2. and on: k-means on those features, each scaled by its label statistic (the per-row
   log-likelihood ratio of class-conditional against pooled Gaussians), from a fresh seed:
   the strongly label-associated features dominate the distances.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import torch

from ppmix.algorithms.kmeans import kmeans_start
from ppmix.components.centred import CentredData
from ppmix.engines.restarts import best_of_starts
from ppmix.models._weights import split_weights
from ppmix.models.pf.switches import PF_KMEANS_RUNS, FrameLabels, label_ratio, label_relevant_features
from ppmix.ops.scaling import column_moments

__all__ = [
    "PROBA_FLOOR",
    "RESTART_MARGIN_SE",
    "RESTART_TIE",
    "StartFitting",
    "fit_restarts",
    "in_sample_log_p_y",
    "in_sample_log_p_y_rows",
    "label_statistic",
    "start_responsibilities",
    "weighted_mean_and_error",
]

logger = logging.getLogger(__name__)

#: seed offset between restarts (clear of the ``n_init`` offsets of one EM run)
RESTART_SEED_STRIDE = 7919
#: a start replaces the best so far only when better by more than this (nats per labelled row): starts that
#: converge to one optimum differ by about the EM tolerance, and then the earlier start is kept
RESTART_TIE = 1e-4
#: a start replaces the one kept only when its mean in-sample ``log P(y | x)`` is higher by more than this many
#: standard errors of the paired per-row difference. A gain that one row carries is exactly one standard error
#: (mean = SE = gain / N), so a one-error rule keeps any start that gives a component to a single mislabelled row;
#: with two the gain must hold on four rows or more
RESTART_MARGIN_SE = 2.0
#: predicted probabilities are clamped to [PROBA_FLOOR, 1 - PROBA_FLOOR] before their logarithm
PROBA_FLOOR = 1e-12


def label_statistic(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per feature, the per-row log-likelihood ratio of class-conditional Gaussians over one pooled Gaussian, ``(D,)``.

    Half of :func:`~ppmix.models.pf.switches.label_ratio` (the statistic of
    :func:`~ppmix.models.pf.switches.label_relevant_features`) divided by the number of rows:
    near 0 for a feature whose mean and variance do not change with the label. With row ``weight``
    (``sample_weight``) every row counts that many times.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> y = (torch.arange(400) % 2).double()
    >>> x = torch.randn(400, 2, generator=g, dtype=torch.float64)
    >>> x[:, 0] += 3 * y
    >>> stat = label_statistic(x, y)
    >>> bool(stat[0] > 0.5 > 0.01 > stat[1])
    True
    """
    n_rows = x.shape[0] if weight is None else float(weight.sum())
    return (0.5 * label_ratio(x, y, weight) / n_rows).clamp_min(0.0)


def _child_generator(generator: torch.Generator, restart: int) -> torch.Generator:
    """A generator for start ``restart`` drawn from the engine's ``generator`` (reproducible for a seed)."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) + RESTART_SEED_STRIDE * restart
    return torch.Generator().manual_seed(seed)


def _one_hot(assignment: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.nn.functional.one_hot(assignment, k).to(dtype)


def _class_sizes(labels: FrameLabels, weight: torch.Tensor | None) -> list[float]:
    """The number (total ``weight``) of labelled rows of class 0 and of class 1."""
    members = [labels.observed & (labels.y == c) for c in (0.0, 1.0)]
    return [float(m.sum() if weight is None else weight[m].sum()) for m in members]


def _class_stratified(
    x: torch.Tensor, labels: FrameLabels, k: int, generator: torch.Generator, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Hard assignment: ``K`` clusters shared out over the classes by size (one at least each; sizes are total
    ``weight`` where given), k-means within each class (on the weighted rows); unlabelled rows join the nearest
    centre."""
    y, observed = labels.y, labels.observed
    sizes = _class_sizes(labels, weight)
    share = min(max(round(k * sizes[1] / sum(sizes)), 1), k - 1)
    centres = []
    for c, k_c in ((0.0, k - share), (1.0, share)):
        member = observed & (y == c)
        members, member_weight = x[member], None if weight is None else weight[member]
        n_members = members.shape[0] if member_weight is None else int((member_weight > 0).sum())
        start = kmeans_start(members, min(k_c, n_members), generator, runs=PF_KMEANS_RUNS, weight=member_weight)
        centres.append(start[0])
    all_centres = torch.cat(centres)
    assignment = torch.cdist(x, all_centres).argmin(1)
    rows = torch.nonzero(observed).flatten()
    offset = 0
    for c, block in zip((0.0, 1.0), centres):
        in_class = rows[y[rows] == c]
        local = torch.cdist(x[in_class], block).argmin(1)
        assignment[in_class] = local + offset
        offset += block.shape[0]
    return assignment


def start_responsibilities(
    model: Any,
    frames: CentredData,
    labels: FrameLabels,
    generator: torch.Generator,
    restart: int,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The hard ``(N, K)`` responsibilities of start ``restart >= 1`` (start 0 is the model's own; see the module).

    Without labels (or with fewer than two labelled rows of a class) every start is
    k-means on all the features from a fresh seed. Row ``weight`` ``(N,)`` (``sample_weight``) counts every row
    that many times: in the class sizes, the label tests and statistics, the features' spread and k-means.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models import PFGMM
    >>> data = make_pf_synthetic(200, n_relevant=2, n_features=6, seed=0)
    >>> x, y = torch.as_tensor(data.X), torch.as_tensor(data.y, dtype=torch.float64)
    >>> labels = FrameLabels(y, torch.ones(200, dtype=torch.bool))
    >>> resp = start_responsibilities(PFGMM(4), CentredData.from_tensor(x), labels, torch.Generator(), 1)
    >>> resp.shape, bool(resp.sum(1).eq(1).all())
    (torch.Size([200, 4]), True)
    """
    k, x = model.n_components, frames.centred
    child = _child_generator(generator, restart)
    observed = labels.observed
    if min(_class_sizes(labels, weight)) < 2:
        return _one_hot(kmeans_start(x, k, child, runs=PF_KMEANS_RUNS, weight=weight)[1], k, x.dtype)
    x_lab, y_lab = frames.x[observed], labels.y[observed]
    w_lab = None if weight is None else weight[observed]
    selected = label_relevant_features(x_lab, y_lab, weight=w_lab)
    if not selected.any():
        selected = torch.ones_like(selected)
    x = x[:, selected]
    if restart == 1 and k >= 2:
        return _one_hot(_class_stratified(x, labels, k, child, weight), k, x.dtype)
    strength = label_statistic(x_lab[:, selected], y_lab, w_lab).sqrt()
    if not bool((strength > 0).any()):  # no feature goes with the label: plain k-means
        strength = torch.ones_like(strength)
    spread = x.std(0) if weight is None else column_moments(x, weight)[1]
    scale = strength / spread.clamp_min(torch.finfo(x.dtype).tiny)
    return _one_hot(kmeans_start(x * scale, k, child, runs=PF_KMEANS_RUNS, weight=weight)[1], k, x.dtype)


def weighted_mean_and_error(values: np.ndarray, weight: np.ndarray | None = None) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (``std(ddof=1) / sqrt(n)``; 0 for fewer than two values),
    every value counted ``weight`` times where given (frequency weights: for integer weights, the mean and error
    of the values repeated; ``n`` is the total weight).

    Examples
    --------
    >>> weighted_mean_and_error(np.array([1.0, 3.0]), np.array([1.0, 2.0]))  # of [1, 3, 3]
    (2.3333333333333335, 0.6666666666666666)
    >>> weighted_mean_and_error(np.array([1.0, 3.0, 3.0]))
    (2.3333333333333335, 0.6666666666666666)
    """
    if weight is None:
        error = values.std(ddof=1) / math.sqrt(values.size) if values.size > 1 else 0.0
        return float(values.mean()), float(error)
    total = float(weight.sum())
    mean = float(weight @ values) / total
    if total <= 1:
        return mean, 0.0
    variance = float(weight @ np.square(values - mean)) / (total - 1)
    return mean, math.sqrt(variance / total)


def _clearly_better(rows: np.ndarray, best: np.ndarray, weight: np.ndarray | None = None) -> bool:
    """Whether per-row scores ``rows`` beat ``best``'s on average by more than ``RESTART_TIE`` and (with several
    rows) by more than ``RESTART_MARGIN_SE`` standard errors of the paired per-row difference (every row counted
    ``weight`` times where given)."""
    mean, error = weighted_mean_and_error(rows - best, weight)
    return bool(mean > max(RESTART_MARGIN_SE * error, RESTART_TIE))


#: the fitted attributes an engine sets, restored with the best restart's parameters
_RESULT_ATTRIBUTES = ("engine_", "history_", "n_iter_", "converged_", "lower_bound_")


@runtime_checkable
class StartFitting(Protocol):
    """A model that fits from a numbered start (``_fit_start``, returning the prepared training data) and says how
    many starts it makes (``n_restarts``): PFGMM and its subclasses."""

    n_restarts: int

    def _fit_start(self, X: Any, y: Any, restart: int, *, engine: str = "em", **options: Any) -> Any: ...


def fit_restarts(
    model: Any, fit_start: Callable[[int], Any], n_restarts: int, each: Callable[[int], Any] | None = None
) -> list[float]:
    """Call ``_fit_start(restart)`` (a fit of ``model`` from start ``restart``, returning its prepared training
    data) for starts
    ``0 .. n_restarts - 1`` and keep the best by mean in-sample ``log P(y | x)`` of the labelled rows (by the
    ELBO per point without labels), through :func:`~ppmix.engines.restarts.best_of_starts`.

    A later start replaces the one kept only when its mean is higher by more than ``RESTART_MARGIN_SE``
    standard errors of the paired per-row difference (and by more than ``RESTART_TIE``): in-sample,
    a start whose components also follow label-independent features can gain a little by chance,
    and one that gives a component to a few mislabelled rows gains on those rows alone (by as much
    as one standard error for one row, while its ELBO can be nats per point lower); the earlier
    (model's own) start is kept then.
    ``each(restart)``, if given, is called after every start's fit. Returns the mean score of every start.
    Where ``_fit_start`` returns :class:`~ppmix.models.batch.Batch` data (``sample_weight``) every row
    counts its weight times in the means and their standard errors.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models import PFGMM
    >>> data = make_pf_synthetic(200, n_relevant=2, n_features=6, seed=0)
    >>> model = PFGMM(3, switch_prior=0.2, seed=0, progress=False)
    >>> scores = fit_restarts(model, lambda r: model._fit_start(data.X, data.y, r), 3)
    >>> [round(s, 3) for s in scores]  # start 1 is higher by 1.3 standard errors: start 0 is kept
    [-0.317, -0.288, -0.317]
    >>> in_sample_log_p_y(model, model.prepare_data(data.X, data.y)) == scores[0]
    True
    """
    latest: dict[str, Any] = {}
    means: list[float] = []

    def fit(restart: int) -> None:
        latest["data"] = fit_start(restart)

    def score_rows() -> np.ndarray:
        data = latest["data"]
        if split_weights(data)[0].labels.any:
            rows, latest["weight"] = _labelled_scores(model, data)
        else:
            rows, latest["weight"] = np.array([model.lower_bound_]), None
        means.append(weighted_mean_and_error(rows, latest["weight"])[0])
        return rows

    def better(rows: np.ndarray, best: np.ndarray) -> bool:
        return _clearly_better(rows, best, latest["weight"])

    def snapshot() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return model._get_globals(), {a: getattr(model, a) for a in _RESULT_ATTRIBUTES}

    def restore(snap: tuple[dict[str, torch.Tensor], dict[str, Any]]) -> None:
        model._set_globals(snap[0])
        for name, value in snap[1].items():
            setattr(model, name, value)

    with model._overriding("_restart_data_scale", {}):  # every start fits the same data: its scale measured once
        best_of_starts(n_restarts, fit, score_rows, snapshot, restore, better, each)
    return means


def in_sample_log_p_y(model: Any, data: Any) -> float:
    """Mean ``log P(y_n | x_n)`` of a fitted pf-GMM over the labelled rows of prepared data (``model.prepare_data``;
    :class:`~ppmix.models.batch.Batch` data: the weighted mean).

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models import PFGMM
    >>> data = make_pf_synthetic(200, n_relevant=2, n_features=4, seed=0)
    >>> model = PFGMM(2, switch_prior=0.2, seed=0, progress=False).fit(data.X, data.y)
    >>> -0.7 < in_sample_log_p_y(model, model.prepare_data(data.X, data.y)) <= 0
    True
    """
    rows, weight = _labelled_scores(model, data)
    return weighted_mean_and_error(rows, weight)[0] if rows.size else float("nan")


def _labelled_scores(model: Any, data: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`in_sample_log_p_y_rows` of prepared (possibly :class:`~ppmix.models.batch.Batch`) data, and the
    sample weights of those rows (None without)."""
    rows, weight = split_weights(data)
    scores = in_sample_log_p_y_rows(model, rows)
    return scores, None if weight is None else weight[rows.labels.observed].detach().cpu().numpy()


def in_sample_log_p_y_rows(model: Any, data: Any) -> np.ndarray:
    """``log P(y_n | x_n)`` of every labelled row of prepared data under a fitted pf-GMM (:func:`in_sample_log_p_y`).

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models import PFGMM
    >>> data = make_pf_synthetic(200, n_relevant=2, n_features=4, seed=0)
    >>> y = data.y[:150].tolist() + [None] * 50
    >>> model = PFGMM(2, switch_prior=0.2, seed=0, progress=False).fit(data.X, y)
    >>> in_sample_log_p_y_rows(model, model.prepare_data(data.X, y)).shape
    (150,)
    """
    observed = data.labels.observed
    p1 = (model._responsibilities(data) @ model.labels_.probs)[observed].clamp(PROBA_FLOOR, 1 - PROBA_FLOOR)
    y = data.labels.y[observed]
    return (y * p1.log() + (1 - y) * (-p1).log1p()).detach().cpu().numpy()
