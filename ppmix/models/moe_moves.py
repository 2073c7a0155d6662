"""Where EM on a :class:`~ppmix.models.MixtureOfExperts` starts and how it leaves a local optimum: the starting
responsibilities (a random gate, or k-means on the standardised ``(x, y)``) and the split-and-merge moves run
after EM (in the spirit of SMEM, Ueda et al. 2000).

A move ``(freed, keep, split, by)`` frees one expert, whose points go to ``keep`` (or, with ``keep`` None, to
the others in proportion), and gives it the upper half of the ``split`` expert's points, by residual or along
the main direction of their covariates (``by``), or (``by="worst"``, ``split`` None) the 5% of all points that
the mixture fits worst; EM restarts from there and the move is kept only if the
objective rises. This repairs the typical local optima of MoE EM:
one expert split in two, or a starved expert fitting a handful of points while two small experts share one wide
one. Which moves are tried is the ``split_merge_search`` of the model:

- ``"proposal"``: one move per round, chosen by the criteria below (:func:`split_merge_proposal`);
- ``"screened"``: every move, with both splits and the worst-fit one, is screened by a short EM run on a
  subsample and the few best run on to convergence (:func:`screened_moves`). Some optima need moves that a
  single proposal never picks: on the S4.1 logistic simulation (Chamroukhi & Pham 2026, N = 10^5) one true
  expert held by two fitted ones while two others shared one, experts whose regions have constant labels,
  which only a covariate split separates, and a chain of experts each holding parts of two true ones, which
  no split of one expert repairs but the worst-fit move does (it gathers the misclassified points of every
  region at once).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import torch

from ppmix.algorithms.kmeans import kmeans
from ppmix.engines.result import FitResult, convergence_warnings_ignored
from ppmix.models._weights import split_weights
from ppmix.models.moe_polish import polished
from ppmix.ops.logspace import normalize_log_joint_
from ppmix.ops.scaling import column_moments, weighted_lower_median

#: a fitted :class:`~ppmix.models.MixtureOfExperts` (annotation only: this module does not import the model)
MixtureOfExperts = Any

__all__ = [
    "SEARCHES",
    "SPLITS",
    "WORST_FIT",
    "candidate_moves",
    "initial_responsibilities",
    "move_responsibilities",
    "response_scales",
    "screened_moves",
    "split_and_merge",
    "split_merge_proposal",
]

logger = logging.getLogger(__name__)

#: a move: the freed expert, the expert that takes its points (None: the others, in proportion), the split expert
#: (None for a worst-fit move), how the freed expert's new points are chosen
Move = tuple[int, "int | None", "int | None", str]
#: how a move splits the ``split`` expert's points: by residual, or along their covariates' first principal axis
SPLITS = ("residual", "covariates")
#: the ``by`` of a move whose freed expert takes the points the mixture fits worst (no expert is split)
WORST_FIT = "worst"
#: the share of all points a worst-fit move gives the freed expert: those of lowest log-likelihood under the mixture
_WORST_SHARE = 0.05
#: the values of ``MixtureOfExperts(split_merge_search=...)``
SEARCHES = ("proposal", "screened")

#: weight of the uniform distribution mixed into hard k-means starts (keeps the first gate fit finite)
_INIT_SMOOTHING = 0.2
#: spread of the random gate coefficients of ``init_params="random"`` (standardised covariates)
_RANDOM_GATE_SCALE = 2.0
#: two experts whose predictive distributions differ by less than this mean symmetric KL (nats)
#: over the training covariates are duplicates: a split-and-merge move is tried
_DUPLICATE_KL = 10.0
#: the screened search: rows of the subsample every move is screened on, EM iterations of a screening run,
#: moves run on to convergence on all rows, and the most moves screened per round (those whose freed and
#: keeping experts are closest, by the symmetric KL of their predictions, when there are more)
_SCREEN_ROWS = 10_000
_SCREEN_ITER = 60
_SCREEN_KEEP = 3
_SCREEN_MOST = 120
#: the screened search ends after this many rounds in a row keep nothing (each screens a fresh subsample)
_SCREEN_PATIENCE = 2
#: why the screened search refuses ``sample_weight``
SCREENED_WEIGHTS = (
    "sample_weight with split_merge_search='screened' is not supported: its random subsample of rows has no "
    "weighted form equal to the repeated rows; use split_merge_search='proposal' (the default) or split_merge=0"
)
#: round ``r`` of the screened search draws its subsample with ``model._generator(_SCREEN_SEED_OFFSET + r)``
_SCREEN_SEED_OFFSET = 7717


def initial_responsibilities(
    x: torch.Tensor,
    y: torch.Tensor,
    n_experts: int,
    init_params: str,
    generator: torch.Generator,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Starting responsibilities ``(N, K)``: from a random gate, or from k-means on the standardised ``(x, y)``.

    The random gate has coefficients ``N(0, 2^2)`` on the standardised covariates and
    ``N(0, 1)`` offsets: random linear regions of the covariates. Unlike random
    responsibilities, whose experts all fit the same data when ``N`` is large, it starts
    the experts apart, whatever ``N`` (its draws do not depend on the rows, so rows of
    ``sample_weight`` ``weight`` and the rows repeated start alike). Hard k-means labels are
    smoothed towards uniform (weight 0.2), which keeps the first gate fit finite; with row
    ``weight`` k-means runs on a weighted resample and ``y`` is standardised by its weighted scales.

    Examples
    --------
    >>> import torch
    >>> x = torch.randn(6, 2, dtype=torch.float64)
    >>> resp = initial_responsibilities(x, x[:, 0], 3, "kmeans", torch.Generator().manual_seed(0))
    >>> resp.shape, bool(torch.allclose(resp.sum(1), torch.ones(6, dtype=torch.float64)))
    (torch.Size([6, 3]), True)
    """
    k = n_experts
    if init_params == "kmeans":
        y_mean, y_std = response_scales(y, weight)
        joint = torch.cat([x, ((y - y_mean) / y_std)[:, None]], dim=1)
        _, labels = kmeans(joint, k, generator, weight=weight)
        resp = torch.nn.functional.one_hot(labels, k).to(x.dtype)
        return (1 - _INIT_SMOOTHING) * resp + _INIT_SMOOTHING / k
    slopes = _RANDOM_GATE_SCALE * torch.randn(x.shape[1], k, generator=generator, dtype=x.dtype)
    offsets = torch.randn(k, generator=generator, dtype=x.dtype)
    return torch.softmax(x @ slopes.to(x.device) + offsets.to(x.device), dim=1)


def response_scales(y: torch.Tensor, weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and the (unbiased) standard deviation, at least ``1e-12``, of the response ``y`` ``(N,)``; with
    row ``weight`` weighted as frequencies (:func:`~ppmix.ops.scaling.column_moments`).

    Examples
    --------
    >>> [round(float(v), 6) for v in response_scales(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0]))]
    [2.333333, 1.154701]
    """
    if weight is None:
        return y.mean(), y.std().clamp_min(1e-12)
    mean, std = column_moments(y[:, None], weight)
    return mean[0], std[0].clamp_min(1e-12)


def split_and_merge(model: MixtureOfExperts, train_data: Any, options: dict[str, Any], fitted: FitResult) -> FitResult:
    """Up to ``model.split_merge`` rounds of moves on a model just fitted by EM (on ``train_data``, its prepared
    training data, ending as ``fitted`` says); a round keeps its best move only if EM from it ends higher.
    Returns the fit's record after the moves (``fitted`` itself when none was kept); the model keeps the
    parameters of the last kept move.

    A round tries one move (``split_merge_search="proposal"``) or the few best of the
    screened ones (``"screened"``), each followed by EM on all rows to convergence (with
    ``options``' ``max_iter`` and ``tol``) and the model's L-BFGS polish: an early verdict would
    reject good moves on slowly converging fits (on the S4.1 logistic simulation, a move that
    was still far below its starting objective after 10 iterations ended 7% higher after 100).
    The best is kept only if the objective per point rises by more than ``tol`` (relative;
    ``options["tol"]`` or ``model.tol``). A proposal round that keeps nothing ends the search
    (the next would propose the same move), and so does a screened round on data small enough
    to be screened whole (the next would screen the same rows). Otherwise a screened round
    ranks the moves on its own subsample, and that ranking is noisy: so the screened search
    ends only after ``_SCREEN_PATIENCE`` (2) rounds in a row keep nothing. On the S4.1 logistic simulation
    (seed 1) a round that kept nothing was followed by one, on a fresh subsample, whose move
    reached the truth's basin (objective per point -0.0512 -> -0.0390). A move
    that leaves an expert without points is rejected. After a kept move ``history_`` is the
    objective of the EM run (and polish) that followed it and ``n_iter_`` counts the iterations
    of all kept runs.

    ``train_data`` may be :class:`~ppmix.models.batch.Batch` (``sample_weight``): the proposal search then
    weighs every row as that many copies of it (an integer weight gives the moves of the repeated rows); the
    screened search, whose subsample of rows has no such form, refuses it.
    """
    from ppmix.engines import run_em

    data = model._em_data(train_data)
    rows, weight = split_weights(data)
    if weight is not None and model.split_merge_search == "screened":
        raise ValueError(SCREENED_WEIGHTS)
    tol = options.get("tol", model.tol)
    em_options = {key: options[key] for key in ("max_iter", "tol") if key in options}
    subsampled = model.split_merge_search == "screened" and len(rows[1]) > _SCREEN_ROWS
    patience = _SCREEN_PATIENCE if subsampled else 1
    idle = 0  # rounds in a row that kept nothing
    for round_ in range(model.split_merge):
        if model.split_merge_search == "screened":
            starts = screened_moves(model, data, model._generator(offset=_SCREEN_SEED_OFFSET + round_), tol)
        else:
            move = split_merge_proposal(model, *rows, weight)
            starts = [] if move is None else [(move, None)]
        saved, before = model._get_globals(), float(fitted.history[-1])
        best: tuple[float, Any, dict[str, torch.Tensor], Move] | None = None
        for move, screened in starts:
            model._set_globals(saved if screened is None else screened)
            try:
                if screened is None:
                    model._m_step(data, move_responsibilities(model, *rows, move, weight))
                with convergence_warnings_ignored(model.polish):  # the polish's verdict replaces EM's
                    result = run_em(model, train_data, n_init=1, warm_start=True, progress=False, **em_options)
                result = polished(model, data, result, options)
            except ValueError as error:  # an expert left with no points: the move is rejected
                logger.info("split-and-merge move %s rejected: %s", move, error)
                continue
            if best is None or float(result.history[-1]) > best[0]:
                best = (float(result.history[-1]), result, model._get_globals(), move)
        # a gain within EM's own stopping tolerance is the same optimum, not a better one
        if best is None or not best[0] > before + tol * abs(before):
            model._set_globals(saved)
            idle += 1
            if idle == patience:
                return fitted
            continue
        idle = 0
        after, result, values, move = best
        model._set_globals(values)
        logger.info("split-and-merge move %s: objective/point %.6f -> %.6f", move, before, after)
        # the history of the EM run of the last kept move (monotone); the iterations of every run
        fitted = FitResult(list(result.history), fitted.n_iter + int(result.n_iter), bool(result.converged))
    return fitted


def _row_sum(values: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """``values`` ``(N, ...)`` summed over the rows, each counted ``weight[n]`` times (once when None)."""
    return values.sum(0) if weight is None else (weight.reshape(-1, *[1] * (values.dim() - 1)) * values).sum(0)


def _prediction_distance(model: MixtureOfExperts, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean symmetric KL ``(K, K)`` between the experts' predictive distributions over ``x`` (rows weighted by
    ``weight`` where given; inf on the diagonal)."""
    kl = model._experts.kl(model._experts, x)
    kl = kl.mean(0) if weight is None else _row_sum(kl, weight) / weight.sum()
    return (kl + kl.T).fill_diagonal_(float("inf"))


def split_merge_proposal(
    model: MixtureOfExperts, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None
) -> Move | None:
    """The move of ``split_merge_search="proposal"``: free one expert and split the worst-fitting other one.

    ``x`` and ``y`` are the standardised training covariates and the response. The freed
    expert is one of the closest duplicate pair (mean symmetric KL of their predictive
    distributions below 10 nats; merged into the other) or, when no pair is that close,
    the expert with the least responsibility mass (its points go to the others in
    proportion). The split expert fits its points worst (mean log-likelihood of the points
    it holds, at least 2). None when no expert is left to split. With row ``weight`` (``sample_weight``) every
    mean, mass and count weighs row ``n`` as ``weight[n]`` copies of it.
    """
    distance = _prediction_distance(model, x, weight)
    resp, log_lik = normalize_log_joint_(model._log_joint(x, y))
    log_lik, hard = log_lik.reshape(-1), resp.argmax(1)
    keep: int | None
    if float(distance.min()) < _DUPLICATE_KL:
        keep, freed = divmod(int(distance.argmin()), model.n_experts)
        excluded = [keep, freed]
    else:
        keep, freed = None, int(_row_sum(resp, weight).argmin())
        excluded = [freed]
    counts = torch.bincount(hard, weights=weight, minlength=model.n_experts)
    weighted_log_lik = log_lik if weight is None else log_lik * weight
    fit = torch.zeros_like(distance[0]).index_add_(0, hard, weighted_log_lik) / counts.clamp_min(1)
    fit[excluded] = float("inf")
    fit[counts < 2] = float("inf")
    split = int(fit.argmin())
    return (freed, keep, split, "residual") if torch.isfinite(fit[split]) else None


def candidate_moves(model: MixtureOfExperts, x: torch.Tensor) -> list[Move]:
    """The moves the screened search screens: every ``(freed, keep, split)`` of distinct experts (with ``K = 2``,
    the pair's re-split ``keep = split``), each split by residual and by covariates, at most 120, those whose freed
    and keeping experts predict most alike; then the ``K^2`` worst-fit moves (``K(K - 1)`` at ``K = 2``), every
    expert freed into each other one and (``K > 2``) into all in proportion.

    Examples
    --------
    >>> import torch
    >>> from ppmix.models import MixtureOfExperts
    >>> x = torch.randn(50, 1, dtype=torch.float64)
    >>> moe = MixtureOfExperts(3, seed=0, progress=False, split_merge=0).fit(x.numpy(), x[:, 0].numpy())
    >>> moves = candidate_moves(moe, moe._em_data(moe._train_data)[0])
    >>> len(moves), moves[0], moves[11], moves[-1]
    (21, (0, 1, 2, 'residual'), (2, 1, 0, 'covariates'), (2, None, None, 'worst'))
    """
    k = model.n_experts
    triples = [(0, 1, 1), (1, 0, 0)] if k == 2 else list(itertools.permutations(range(k), 3))
    moves: list[Move] = [(freed, keep, split, by) for by in SPLITS for freed, keep, split in triples]
    if len(moves) > _SCREEN_MOST:
        distance = _prediction_distance(model, x)
        moves.sort(key=lambda move: float(distance[move[0], move[1]]))  # stable: ties keep the order
        moves = moves[:_SCREEN_MOST]
    for freed in range(k):
        keeps: list[int | None] = [other for other in range(k) if other != freed]
        moves += [(freed, keep, None, WORST_FIT) for keep in keeps + ([None] if k > 2 else [])]
    return moves


def screened_moves(
    model: MixtureOfExperts, data: tuple[torch.Tensor, torch.Tensor], generator: torch.Generator, tol: float
) -> list[tuple[Move, dict[str, torch.Tensor]]]:
    """The starts of ``split_merge_search="screened"``: the 3 of :func:`candidate_moves` whose EM run of 60
    iterations on a subsample (10 000 rows drawn by ``generator``; all rows when there are fewer) ends highest,
    each with the parameters that run ended at, from which EM on all rows goes on.

    Going on from the screening run, rather than making the move again on all rows, keeps
    what the run climbed: on the S4.1 logistic simulation a move redone on all rows ended
    below the optimum it left, where its screening run had ended well above it. The model's
    parameters are restored afterwards.
    """
    from ppmix.engines import run_em

    x, y = data
    if len(y) > _SCREEN_ROWS:
        rows = torch.randperm(len(y), generator=generator)[:_SCREEN_ROWS].to(x.device)
        x, y = x[rows], y[rows]
    saved = model._get_globals()
    scored: list[tuple[float, Move, dict[str, torch.Tensor]]] = []
    for move in candidate_moves(model, x):
        model._set_globals(saved)
        try:
            model._m_step((x, y), move_responsibilities(model, x, y, move))
            with convergence_warnings_ignored():  # a screening run is short by design
                result = run_em(
                    model, (x, y), n_init=1, warm_start=True, progress=False, max_iter=_SCREEN_ITER, tol=tol
                )
        except ValueError as error:
            logger.debug("split-and-merge move %s not screened: %s", move, error)
            continue
        scored.append((float(result.history[-1]), move, model._get_globals()))
    model._set_globals(saved)
    scored.sort(key=lambda score: -score[0])  # stable: ties keep the candidates' order
    return [(move, values) for _, move, values in scored[:_SCREEN_KEEP]]


def move_responsibilities(
    model: MixtureOfExperts, x: torch.Tensor, y: torch.Tensor, move: Move, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """The responsibilities ``(N, K)`` after ``move = (freed, keep, split, by)``, from the model's current ones.

    ``freed``'s responsibility goes to ``keep`` (to the others in proportion when ``keep`` is
    None; evenly where the others' is 0). Then, with ``by="worst"`` (``split`` None), the 5% of
    the points (at least one) with the lowest log-likelihood under the mixture go wholly to
    ``freed``: where a fitted expert holds parts of two true ones, the points it misfits gather
    there, in every region at once. Otherwise, of the points whose most responsible expert is
    ``split``, those above the median of a score move from ``split`` to ``freed``. The score is the residual with
    ``by="residual"`` (``y`` less the expert's mean; for softmax experts, the expert's
    negative log-likelihood), or with ``by="covariates"`` the projection of ``x`` on the first
    principal axis of those points' covariates: a cut of the expert's region that a linear
    gate can draw, where its labels alone cannot tell two experts apart (regions of constant
    labels). ``ValueError`` when ``split`` holds fewer than 2 points.

    With row ``weight`` (``sample_weight``; residual splits only, else a ``ValueError``) the median and the
    count of ``split``'s points weigh row ``n`` as ``weight[n]`` copies of it.
    """
    freed, keep, split, by = move
    if weight is not None and by != "residual":
        raise ValueError(f"sample_weight is taken by residual splits only; got a move by {by!r}")
    resp, log_lik = normalize_log_joint_(model._log_joint(x, y))
    proposal = resp.clone()
    if keep is None:
        proposal[:, freed] = 0.0
        orphans = proposal.sum(1) == 0  # points the freed expert held alone: to the others evenly
        proposal[orphans] = 1.0
        proposal[orphans, freed] = 0.0
        proposal /= proposal.sum(1, keepdim=True)
    else:
        proposal[:, keep] += proposal[:, freed]
        proposal[:, freed] = 0.0
    if by == WORST_FIT:
        worst = torch.topk(log_lik.reshape(-1), max(1, int(_WORST_SHARE * len(y))), largest=False).indices
        proposal[worst] = 0.0
        proposal[worst, freed] = 1.0
        return proposal
    members = resp.argmax(1) == split
    held = members.sum() if weight is None else weight[members].sum()
    if held < 2:
        raise ValueError(f"expert {split} holds {float(held):g} points; a split needs at least 2")
    if by == "covariates":
        centred = x[members] - x[members].mean(0)
        axis = torch.linalg.svd(centred, full_matrices=False).Vh[0]
        score = (x - x[members].mean(0)) @ axis
    elif model.target_kind == "categorical":  # no mean to subtract: split by how badly the expert fits each point
        score = -model._experts.log_prob((x, y))[:, split]
    else:
        score = y - model._expert_means(x)[:, split]
    upper = members & (score > weighted_lower_median(score[members], None if weight is None else weight[members]))
    proposal[upper, freed] = proposal[upper, split]
    proposal[upper, split] = 0.0
    return proposal
