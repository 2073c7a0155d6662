"""Choosing pf-GMM's switch prior ``p`` from the data, and a calibrated test of which features are relevant.

``switch_prior="auto"`` (:class:`~ppmix.models.PFGMM`'s default) runs
:func:`select_switch_prior`: stratified, seeded ``n_folds``-fold cross-validation of the
held-out mean ``log P(y | x)`` (a proper scoring rule: unlike AUROC it also rewards
calibration, and ``p`` acts on the sharpness of ``q(z | x)``) over a log-spaced grid of ``p``, extended downwards
while the best value sits on the lower edge, then refined at the geometric midpoints
around the best. Of the values scored it keeps the smallest ``p`` whose score is within
one standard error (of the paired per-row difference) of the best: the one-standard-error
rule towards the sparser model, since too large a ``p`` lets label-independent structure
take the components over (AUROC collapses), while too small a ``p`` only costs some calibration.
Each validation fit runs the model's ``n_restarts`` starts (:mod:`~ppmix.models.pf.restarts`)
and the held-out score of ``p`` averages over them: where the fit depends on the start (some
starts end on label-independent structure, which grows with ``p`` and ``K``) the score drops,
so the choice leans to values of ``p`` at which every start agrees.
Where that takeover happens moves with the amount of data, so ``PFGMM.fit`` checks the fit
on all the data against its validation score (:meth:`SwitchPriorSelection.agrees`) and
falls back to the next best smaller ``p`` when it lands far below it.

The switch posterior of B.2.1 is ``phi_d = sigmoid(logit p + gain_d)``, where ``gain_d`` is
the per-point log-likelihood gain of feature ``d`` under the components over the
background: it is free of ``p``, while ``phi_d`` follows ``p``. :func:`relevant_feature_mask`
selects features by two Bonferroni-corrected likelihood-ratio tests: the gain, and the
feature's association with the label.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ppmix.engines.result import convergence_warnings_ignored
from ppmix.models.pf.restarts import PROBA_FLOOR, StartFitting, fit_restarts, weighted_mean_and_error
from ppmix.models.pf.switches import FrameLabels, label_ratio

__all__ = [
    "SWITCH_PRIOR_GRID",
    "SwitchPriorSelection",
    "relevant_feature_mask",
    "relevant_mask_from_ratio",
    "select_switch_prior",
]

logger = logging.getLogger(__name__)

#: the coarse grid of ``p`` that ``switch_prior="auto"`` scores (log-spaced, 1e-3 to 0.5)
SWITCH_PRIOR_GRID = tuple(float(p) for p in np.geomspace(1e-3, 0.5, 7))
#: the smallest ``p`` the downward extension of the grid reaches
SMALLEST_SWITCH_PRIOR = 1e-6
#: the prior used when there are too few labels to validate (the former default)
FALLBACK_SWITCH_PRIOR = 0.5
#: the family-wise level of :attr:`PFGMM.relevant_features_` (over features independent of the label)
RELEVANCE_LEVEL = 0.05
#: the EM settings of the validation fits (unless ``fit_options`` say otherwise)
SELECTION_TOL, SELECTION_MAX_ITER = 1e-5, 100


@dataclass
class SwitchPriorSelection:
    """The chosen ``p``, and the cross-validated mean held-out ``log P(y | x)`` of every ``p`` scored with its
    standard error."""

    p: float
    scores: dict[float, float] = field(default_factory=dict)
    standard_errors: dict[float, float] = field(default_factory=dict)

    def candidates(self) -> list[float]:
        """``p``, then the smaller values scored, best score first: the order in which the final fit tries them."""
        smaller = [q for q in self.scores if q < self.p]
        return [self.p, *sorted(smaller, key=self.scores.__getitem__, reverse=True)]

    def agrees(self, p: float, in_sample: float) -> bool:
        """Whether a fit on all the data at ``p`` reached the regime the validation saw: its in-sample mean
        ``log P(y | x)`` is not below the held-out score by more than one standard error (it is usually above).
        A fit on more data can land where label-independent structure takes the components over."""
        if p not in self.scores:
            return True
        return in_sample >= self.scores[p] - self.standard_errors[p]


def _stratified_folds(y: np.ndarray, labelled: np.ndarray, n_folds: int, seed: int | None) -> np.ndarray:
    """Fold index of every ``labelled`` row (each class spread evenly over the folds); -1 for the other rows."""
    rng = np.random.default_rng(seed)
    folds = np.full(y.shape[0], -1)
    for c in (0.0, 1.0):
        members = np.flatnonzero(labelled & (y == c))
        folds[rng.permutation(members)] = (np.arange(members.size) + rng.integers(n_folds)) % n_folds
    return folds


def select_switch_prior(
    model: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    observed: torch.Tensor,
    *,
    n_folds: int = 3,
    grid: tuple[float, ...] = SWITCH_PRIOR_GRID,
    fit_options: dict[str, Any] | None = None,
    sample_weight: torch.Tensor | None = None,
) -> SwitchPriorSelection:
    """Choose ``p`` by stratified cross-validation of the held-out mean ``log P(y | x)``.

    Parameters
    ----------
    model : PFGMM
        Its parameters (``n_components``, ``n_init``, ``n_restarts``, ``seed``, ...) are copied
        for every fit, with ``switch_prior`` set to the value scored; EM fits them. A row's
        held-out score is the mean over the ``n_restarts`` starts. Any classifier with
        ``set_params``, ``fit(x, y, **fit_options)`` and ``predict_proba`` can stand in.
    x : Tensor (N, D)
    y : Tensor (N,)
        Labels in {0, 1} (any value where not ``observed``).
    observed : Tensor (N,) bool
        Which labels are observed; unlabelled rows join every training fold.
    n_folds : int, default 3
        Reduced to the smaller class size; with fewer than two labelled rows of either
        class, ``p = FALLBACK_SWITCH_PRIOR`` (0.5) is returned unscored.
    grid : tuple of float
        The increasing coarse grid. While its smallest value scores best, it extends
        downwards by the grid's ratio (to ``1e-6`` at most); then the geometric midpoints
        between the best value and its neighbours are scored too.
    fit_options : dict, optional
        Passed to every ``fit`` (e.g. ``max_iter``); by default the fits stop at
        ``tol = max(model.tol, 1e-5)`` or ``max_iter = min(model.max_iter, 100)``
        (scoring needs the optimum less exactly than the final fit), without warnings.
    sample_weight : Tensor (N,), optional
        Checked row weights (``PFGMM.fit``'s ``sample_weight``). Rows of weight zero are left out, and the
        folds are drawn over the other rows as if unweighted, so a row stays whole in one fold; every
        training fit takes its rows' weights and every held-out row counts its weight times in the means
        and standard errors. For integer weights the scores are those of the cross-validation of the
        repeated rows in which all copies of a row share one fold (grouped folds: repetition cannot
        split a row between training and test), not of folds drawn over the copies.

    Returns
    -------
    SwitchPriorSelection
        The smallest ``p`` whose score is within one standard error of the paired
        per-row difference from the best score, and every score.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models import PFGMM
    >>> data = make_pf_synthetic(300, n_relevant=3, n_features=8, seed=0)
    >>> x, y = torch.as_tensor(data.X), torch.as_tensor(data.y, dtype=torch.float64)
    >>> model = PFGMM(4, seed=0, progress=False)
    >>> selection = select_switch_prior(model, x, y, torch.ones(300, dtype=torch.bool), grid=(0.01, 0.1, 0.5))
    >>> selection.p in selection.scores
    True
    """
    from sklearn.base import clone

    x_np = x.detach().cpu().numpy()
    y_np = y.detach().cpu().numpy().astype(np.float64)
    labelled = observed.detach().cpu().numpy().astype(bool)
    weight = None if sample_weight is None else sample_weight.detach().cpu().numpy()
    if weight is not None:  # rows of weight zero take no part: not in a fold, not in a training fit
        kept = weight > 0
        x_np, y_np, labelled, weight = x_np[kept], y_np[kept], labelled[kept], weight[kept]
    smallest_class = min(int((labelled & (y_np == c)).sum()) for c in (0.0, 1.0))
    n_folds = min(n_folds, smallest_class)
    if n_folds < 2:
        logger.info("too few labels to validate the switch prior; using p = %s", FALLBACK_SWITCH_PRIOR)
        return SwitchPriorSelection(FALLBACK_SWITCH_PRIOR)
    folds = _stratified_folds(y_np, labelled, n_folds, model.seed)
    y_fit = np.where(labelled, y_np, np.nan)
    options = {"tol": max(model.tol, SELECTION_TOL), "max_iter": min(model.max_iter, SELECTION_MAX_ITER)}
    options.update(fit_options or {})
    scores: dict[float, float] = {}
    per_row: dict[float, np.ndarray] = {}  # held-out log P(y_n | x_n), rows in the same order for every p
    held_out_weight = None if weight is None else np.concatenate([weight[folds == fold] for fold in range(n_folds)])

    def score(p: float) -> float:
        if p not in scores:
            parts = []
            for fold in range(n_folds):
                train, test = folds != fold, folds == fold
                fitted = clone(model).set_params(switch_prior=p, progress=False)
                fold_options = options if weight is None else {**options, "sample_weight": weight[train]}
                parts.append(_held_out_log_p_y(fitted, x_np[train], y_fit[train], x_np[test], y_np[test], fold_options))
            per_row[p] = np.concatenate(parts)
            scores[p] = weighted_mean_and_error(per_row[p], held_out_weight)[0]
            logger.debug("switch prior %.3g: held-out log P(y|x) %.4f", p, scores[p])
        return scores[p]

    values = sorted(float(p) for p in grid)
    for p in values:
        score(p)
    ratio = values[1] / values[0] if len(values) > 1 else 10.0
    while max(scores, key=scores.__getitem__) == min(scores) and min(scores) / ratio >= SMALLEST_SWITCH_PRIOR:
        score(min(scores) / ratio)
    ordered = sorted(scores)
    best = max(ordered, key=scores.__getitem__)
    i = ordered.index(best)
    for j in (i - 1, i + 1):
        if 0 <= j < len(ordered):
            score(math.sqrt(best * ordered[j]))
    best = max(sorted(scores), key=scores.__getitem__)
    chosen = min(p for p in scores if _within_one_standard_error(per_row[p], per_row[best], held_out_weight))
    logger.info(
        "switch_prior='auto' chose p = %.3g (held-out log P(y|x) %.4f; best %.4f at p = %.3g)",
        chosen,
        scores[chosen],
        scores[best],
        best,
    )
    errors = {p: weighted_mean_and_error(v, held_out_weight)[1] for p, v in per_row.items()}
    return SwitchPriorSelection(chosen, dict(sorted(scores.items())), errors)


def _held_out_log_p_y(
    model: Any, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, options: dict
) -> np.ndarray:
    """Per test row, ``log P(y_n | x_n)`` averaged over ``model``'s restarts fitted on the training rows.

    The average over the starts (rather than the start kept in-sample) scores how much the
    fit at this ``p`` depends on where EM starts: where some starts end with components
    that follow label-independent structure, the held-out score drops.
    """
    starts: list[np.ndarray] = []

    def held_out(_: int) -> None:
        p1 = np.clip(np.asarray(model.predict_proba(x_test))[:, 1], PROBA_FLOOR, 1 - PROBA_FLOOR)
        starts.append(np.where(y_test == 1, np.log(p1), np.log1p(-p1)))

    with convergence_warnings_ignored():
        if isinstance(model, StartFitting):
            model._validate_hyperparameters()
            fit_one = lambda restart: model._fit_start(x_train, y_train, restart, **options)  # noqa: E731
            fit_restarts(model, fit_one, model.n_restarts, held_out)
        else:  # any classifier with fit and predict_proba
            model.fit(x_train, y_train, **options)
            held_out(0)
    return np.mean(starts, axis=0)


def _within_one_standard_error(candidate: np.ndarray, best: np.ndarray, weight: np.ndarray | None = None) -> bool:
    """Whether ``candidate``'s mean is below ``best``'s by at most one standard error of the paired difference
    (every row counted ``weight`` times where given)."""
    mean, error = weighted_mean_and_error(candidate - best, weight)
    return bool(mean >= -error)


def relevant_feature_mask(
    gain: np.ndarray,
    n_components: int,
    x: torch.Tensor,
    labels: FrameLabels,
    level: float = RELEVANCE_LEVEL,
    weight: torch.Tensor | None = None,
) -> np.ndarray:
    """Features that the fitted mixture uses *and* that go with the label, each at level ``level / D``.

    Two likelihood-ratio tests per feature, both Bonferroni-corrected over the ``D``
    features: the mixture's gain, ``2 N gain_d`` against ``chi^2_{2(K-1)}`` (``gain_d`` as
    :attr:`PFGMM.relevance_gain_`; the asymptotic law of the statistic for a feature
    independent of the component assignment), and the label's, class-conditional
    Gaussians against one pooled Gaussian on the labelled rows against ``chi^2_2``
    (:func:`~ppmix.models.pf.switches.label_relevant_features`). The gain test alone
    cannot tell a label-relevant feature from one whose own cluster structure some
    components follow (at larger ``K`` they do); the label test can. What is guaranteed:
    the probability that any feature independent of the label is selected is at most
    ``level`` (asymptotically, for features Gaussian or lighter-tailed within each class).

    Parameters
    ----------
    gain : ndarray (D,)
        Per-point gains (NaN counts as none).
    n_components : int
    x : Tensor (N, D)
        The training features (``N`` enters the gain statistic).
    labels : FrameLabels
        The training labels; without any, the label test is skipped.
    level : float, default 0.05
    weight : Tensor (N,), optional
        Row weights (``sample_weight``): ``N`` is their total and the label test counts every row that many
        times (for integer weights, the mask of the rows repeated).

    Returns
    -------
    ndarray of bool (D,)

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> y = (torch.arange(400) % 2).double()
    >>> x = torch.randn(400, 3, generator=g, dtype=torch.float64)
    >>> x[:, 0] += 3 * y
    >>> labels = FrameLabels(y, torch.ones(400, dtype=torch.bool))
    >>> relevant_feature_mask(np.array([1.0, 1.0, 0.001]), 2, x, labels).tolist()
    [True, False, False]
    """
    observed = labels.observed
    labelled_weight = None if weight is None else weight[observed]
    ratio = label_ratio(x[observed], labels.y[observed], labelled_weight) if labels.any else None
    n_rows = x.shape[0] if weight is None else float(weight.sum())
    return relevant_mask_from_ratio(gain, n_components, n_rows, ratio, level)


def relevant_mask_from_ratio(
    gain: np.ndarray, n_components: int, n_rows: float, ratio: torch.Tensor | None, level: float = RELEVANCE_LEVEL
) -> np.ndarray:
    """:func:`relevant_feature_mask` from the label test's statistic (:func:`~ppmix.models.pf.switches.label_ratio`,
    or :func:`~ppmix.models.pf.switches.label_ratio_from_statistics` on shards; None: no label test) and ``N``.

    Examples
    --------
    >>> relevant_mask_from_ratio(np.array([0.5, 0.5, 1e-4]), 2, 400, torch.tensor([90.0, 1.0, 90.0])).tolist()
    [True, False, False]
    """
    from scipy.stats import chi2

    d = np.asarray(gain).shape[0]
    statistic = 2.0 * n_rows * np.nan_to_num(np.asarray(gain, dtype=np.float64), nan=0.0)
    mask = chi2.sf(statistic, df=2 * max(n_components - 1, 1)) <= level / d
    if ratio is not None:
        mask &= (ratio > chi2.ppf(1.0 - level / d, df=2)).cpu().numpy()
    return mask
