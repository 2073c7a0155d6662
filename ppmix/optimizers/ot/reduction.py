"""Aggregating many fitted mixtures of experts into one by optimal transport (Chamroukhi & Pham, 2026, §3–4, S2, S3).

Given ``M`` local ``K``-expert MoEs ``f_m`` with weights ``lambda_m`` (the sample
proportions), their weighted average ``f^W = sum_m lambda_m f_m`` is an ``MK``-expert
MoE with gates ``pi_l(x) = lambda_m pi_k^(m)(x)``. The **reduction estimator** is the
``K``-expert MoE closest to ``f^W`` in the expected transportation divergence (9) with
the KL divergence as cost. By Proposition 1 the transport constraint on the reduced
gates can be dropped, and the problem is solved by the MM algorithm of §4 over a
supporting sample ``X_S`` (expectations are means over ``X_S``):

1. plan (eq. 18): every local expert ``l`` at every ``x_s`` sends its mass
   ``pi_l(x_s)`` to the reduced expert ``k`` with the smallest ``KL(phi_l(.|x_s) || phi_k(.|x_s))``;
2. experts (eq. 19): each reduced expert minimises its plan-weighted KL — in closed
   form for Gaussian experts (S8, with the corrected variance
   ``sigma_k^2 = sum w [sigma_l^2 + (x^T(beta_k - beta_l))^2] / sum w``), and for logistic
   experts either by the paper's closed form S14 (least squares on the clamped
   log-odds of ``V``; an approximation of (19)) or exactly by weighted Newton/IRLS on the
   soft targets ``V`` (which keeps the MM monotone); for Poisson experts, whose cost is
   ``lambda_l log(lambda_l / lambda_k) - lambda_l + lambda_k``, exactly by weighted Newton on the mean
   local rate ``V`` (a Poisson regression on soft targets; S14 has no Poisson counterpart here);
3. stop on the relative change of the objective (15); keep the best of several
   initialisations (each starts from the experts of one local model);
4. gate (S5): softmax regression on ``X_S`` of targets ``a_sk`` — the gate mass of the
   local experts matched to ``k`` (each local expert goes whole to the reduced expert
   that receives most of its plan mass; the default for Gaussian experts), or (S4)
   literally the per-point plan's marginals ``a_sk = sum_l P_lsk`` (the default for
   logistic experts); see :func:`ot_reduce`;
5. by default the gate is then refitted, the experts fixed, to minimise the expected KL
   divergence from ``f^W`` itself (:mod:`ppmix.optimizers.ot.gate_refit`).

The MM visits only the (point, local expert) pairs that carry gate mass, in cache-sized
blocks, on one thread.

The **Middle** and **Weighted-average** baselines of §5 are in
:mod:`ppmix.optimizers.ot.baselines`, the evaluation metric (the transport
divergence) in :mod:`ppmix.optimizers.ot.divergence`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np
import torch

from ppmix._validation import check_matrix, check_positive_int
from ppmix.components import GaussianExpert, LogisticExpert, PoissonExpert, SoftmaxGate
from ppmix.components._linear import design_matrix, weighted_grams
from ppmix.models.moe import MixtureOfExperts
from ppmix.ops.threads import torch_threads
from ppmix.optimizers.ot._local_models import check_models
from ppmix.optimizers.ot.gate_refit import refit_gate

__all__ = ["LocalMixture", "ot_reduce", "reduction_plan", "update_experts"]

logger = logging.getLogger(__name__)

Experts = GaussianExpert | LogisticExpert | PoissonExpert
LOGISTIC_UPDATES = ("s14", "newton")
GATE_TARGETS = ("auto", "matched", "plan")
GATE_REFITS = ("kl", "s5")
#: defaults of :func:`ot_reduce` that the second round of ``fit_distributed`` reuses: the gate's ridge and the
#: gate mass below which a (point, local expert) pair is dropped
GATE_RIDGE, MASS_TOL = 1e-6, 1e-12
#: the ridge of the reduced experts' fits: a numerical safeguard only (the local fits' own ridge is their prior,
#: and identical local experts must reduce to themselves)
EXPERT_RIDGE = 1e-6
#: pairs per block of the cost evaluation (a block of costs fits in a core's cache)
_BLOCK = 1 << 13


@dataclass
class LocalMixture:
    """The weighted-average MoE ``f^W`` of the local models, evaluated on the supporting sample.

    ``gate_probs[s, l] = lambda_m pi_k^(m)(x_s)`` for ``l = m K + k`` (rows sum to one) and
    ``experts`` is the stacked ``MK``-expert family. The MM works on the (point, local
    expert) pairs whose gate mass exceeds ``mass_tol``: with the nearly hard gates of
    fitted MoEs most of the ``S x MK`` pairs carry no mass, and dropping them changes the
    objective (15) by at most ``MK * mass_tol`` times the largest cost.
    """

    x: torch.Tensor
    gate_probs: torch.Tensor
    experts: Experts
    n_experts: int
    mass_tol: float = 0.0

    @cached_property
    def pairs(self) -> "_Pairs":
        """The pairs carrying mass: their point and local expert, gate mass and local predictor."""
        rows, comps = torch.nonzero(self.gate_probs > self.mass_tol, as_tuple=True)
        eta = self.experts.linear_predictor(self.x)[rows, comps]
        return _Pairs(rows, comps, self.gate_probs[rows, comps], eta)

    def closest(self, experts: Experts) -> tuple[torch.Tensor, torch.Tensor]:
        """``min_k KL(phi_l(.|x_s) || phi_k(.|x_s))`` over the reduced experts, and the argmin, for every pair.

        Evaluated in blocks of pairs that stay in cache (the full ``(pairs, K)`` cost is never formed).
        """
        pairs, eta_q = self.pairs, experts.linear_predictor(self.x)
        blocks = [
            self.experts.kl_at_predictors(eta[:, None], comps[:, None], experts, eta_q[rows]).min(dim=1)
            for eta, comps, rows in zip(pairs.eta.split(_BLOCK), pairs.comps.split(_BLOCK), pairs.rows.split(_BLOCK))
        ]
        return torch.cat([b.values for b in blocks]), torch.cat([b.indices for b in blocks])

    @classmethod
    def from_models(
        cls,
        models: Sequence[MixtureOfExperts],
        x: torch.Tensor,
        weights: Sequence[float] | None = None,
        mass_tol: float = 0.0,
    ) -> "LocalMixture":
        """Stack fitted models (all with the same number and kind of experts and features)."""
        lam = check_models(models, weights)
        probs = torch.cat([w * m.gate_probabilities(x) for w, m in zip(lam, models)], dim=1)
        experts = _stack([m.experts_ for m in models])
        experts.ridge = EXPERT_RIDGE
        return cls(x, probs, experts, models[0].n_experts, mass_tol)


@dataclass
class _Pairs:
    """(point, local expert) pairs: ``rows`` and ``comps`` index them, ``weights`` is their gate mass and
    ``eta`` the local expert's linear predictor (mean or log-odds) at the point."""

    rows: torch.Tensor
    comps: torch.Tensor
    weights: torch.Tensor
    eta: torch.Tensor


def _stack(families: Sequence[Experts]) -> Experts:
    """One family holding the components of all ``families`` in order."""
    stacked = families[0].clone()
    for name in stacked.param_names:
        setattr(stacked, name, torch.cat([getattr(f, name) for f in families]))
    return stacked


def _select(family: Experts, index: torch.Tensor | list[int]) -> Experts:
    """The components ``index`` of ``family`` as a new family."""
    out = family.clone()
    for name in out.param_names:
        setattr(out, name, getattr(family, name)[index].clone())
    return out


def _assignment(local: LocalMixture, experts: Experts) -> tuple[torch.Tensor, torch.Tensor]:
    """The KL-closest reduced expert of every pair and the objective (15)."""
    best, assign = local.closest(experts)
    return assign, (local.pairs.weights * best).sum() / local.x.shape[0]


def reduction_plan(local: LocalMixture, experts: Experts) -> tuple[torch.Tensor, torch.Tensor]:
    """The relaxed optimal plan (eq. 18) and the objective (15) at ``experts``.

    Returns ``plan[s, l, k]`` (``pi_l(x_s)`` on the KL-closest reduced expert ``k``, zero
    elsewhere and on the pairs below ``local.mass_tol``) and the mean over ``s`` of
    ``sum_l pi_l(x_s) min_k KL(phi_l || phi_k)``.

    Examples
    --------
    >>> import torch
    >>> from ppmix.components import GaussianExpert
    >>> x = torch.randn(5, 1, dtype=torch.float64)
    >>> local = LocalMixture(x, torch.full((5, 2), 0.5, dtype=torch.float64),
    ...                      GaussianExpert(torch.tensor([[1.0], [-1.0]], dtype=torch.float64)), 2)
    >>> plan, objective = reduction_plan(local, local.experts)
    >>> float(objective), plan.sum((1, 2)).tolist() == [1.0] * 5
    (0.0, True)
    """
    assign, objective = _assignment(local, experts)
    pairs = local.pairs
    plan = local.gate_probs.new_zeros(*local.gate_probs.shape, experts.n_components)
    plan[pairs.rows, pairs.comps, assign] = pairs.weights
    return plan, objective


def update_experts(
    local: LocalMixture,
    plan: torch.Tensor,
    current: Experts,
    *,
    logistic_update: str = "newton",
    epsilon: float = 1e-6,
) -> Experts:
    """Solve (19) for every reduced expert given the plan of :func:`reduction_plan`; returns a new family.

    Gaussian experts (S8): ``beta_k`` is the weighted least-squares fit of the local
    means ``x_s^T beta_l`` with weights ``plan[s, l, k]``, and
    ``sigma_k^2 = sum_sl w [sigma_l^2 + (x_s^T(beta_k - beta_l))^2] / sum_sl w``.
    Logistic experts: ``V_sk = sum_l w p_l(x_s) / sum_l w``, then S14 (least squares of
    ``logit V``, with ``V`` clamped to ``(epsilon, 1 - epsilon)``, on the points that carry
    mass) or the exact minimiser (``logistic_update="newton"``: weighted Newton/IRLS with
    the soft targets ``V`` and weights ``sum_l w``, no clamping needed).
    Poisson experts: ``V_sk = sum_l w lambda_l(x_s) / sum_l w``, then the exact minimiser, weighted Newton on
    the soft targets ``V`` (``logistic_update="s14"`` is refused for them).
    A reduced expert that receives no mass (or whose system is singular) keeps its
    current parameters.
    """
    pairs = local.pairs
    return _update(local, plan.argmax(2)[pairs.rows, pairs.comps], current, logistic_update, epsilon)


def _update(
    local: LocalMixture, assign: torch.Tensor, current: Experts, logistic_update: str, epsilon: float
) -> Experts:
    """:func:`update_experts` from the reduced expert ``assign`` of every pair: each sum over the plan is one pass."""
    x, a, pairs = local.x, design_matrix(local.x), local.pairs
    k_all, weights = current.n_components, pairs.weights
    cell = pairs.rows * k_all + assign

    def per_point(values: torch.Tensor) -> torch.Tensor:
        return _per_point(values, pairs.rows, assign, x.shape[0], k_all)

    mass = per_point(weights)  # D: (S, K)
    alive = mass.sum(0) > 1e-12 * x.shape[0]
    new = current.clone()
    if isinstance(current, GaussianExpert):
        gram = weighted_grams(a, mass)  # (K, P+1, P+1)
        theta, info = torch.linalg.solve_ex(gram, per_point(weights * pairs.eta).T @ a)
        ok = alive & (info == 0)
        stacked = torch.where(ok[:, None], theta, current._stacked())
        new._unstack(stacked)
        resid = (a @ stacked.T).view(-1)[cell] - pairs.eta  # x_s^T(beta_k - beta_l) at k = assign
        spread = weights * (local.experts.scale.square()[pairs.comps] + resid.square())
        total = spread.new_zeros(k_all).index_add_(0, assign, spread)
        var = total / mass.sum(0).clamp_min(torch.finfo(x.dtype).tiny)
        new.scale = torch.where(ok, var.clamp_min(current.min_variance).sqrt(), current.scale)
        return new
    if logistic_update not in LOGISTIC_UPDATES:
        raise ValueError(f"logistic_update must be one of {LOGISTIC_UPDATES}; got {logistic_update!r}")
    counts = isinstance(current, PoissonExpert)
    if counts and logistic_update == "s14":
        raise ValueError("logistic_update='s14' is the closed form of logistic experts; use 'newton' for poisson ones")
    has_mass = mass > 0
    local_means = pairs.eta.exp() if counts else torch.sigmoid(pairs.eta)  # E[y | x_s] of every local expert
    v = per_point(weights * local_means) / mass.where(has_mass, torch.ones_like(mass))
    v = v.where(has_mass, torch.full_like(v, 0.5))
    stacked = current._stacked().clone()
    for k in torch.nonzero(alive).flatten().tolist():
        if logistic_update == "s14":
            rows = has_mass[:, k]
            log_odds = torch.logit(v[rows, k].clamp(epsilon, 1 - epsilon))
            solution = torch.linalg.lstsq(a[rows], log_odds[:, None]).solution[:, 0]
            if torch.isfinite(solution).all():
                stacked[k] = solution
        else:
            one = _select(current, [k])
            one.fit((x, v[:, k]), mass[:, k : k + 1])
            stacked[k] = one._stacked()[0]
    new._unstack(stacked)
    return new


def _per_point(values: torch.Tensor, rows: torch.Tensor, assign: torch.Tensor, n_points: int, k: int) -> torch.Tensor:
    """``out[s, j] = sum`` of ``values`` over the pairs at point ``s`` assigned to reduced expert ``j``: ``(S, K)``."""
    return values.new_zeros(n_points * k).index_add_(0, rows * k + assign, values).view(n_points, k)


def _mm(
    local: LocalMixture, start: Experts, max_iter: int, tol: float, logistic_update: str, epsilon: float
) -> tuple[Experts, torch.Tensor, list[float], bool]:
    """MM iterations from ``start``: the final experts, their plan assignment, the objective history, convergence."""
    experts = start
    assign, objective = _assignment(local, experts)
    history = [float(objective)]
    for _ in range(max_iter):
        experts = _update(local, assign, experts, logistic_update, epsilon)
        assign, objective = _assignment(local, experts)
        history.append(float(objective))
        if abs(history[-2] - history[-1]) <= tol * max(abs(history[-1]), 1e-300):
            return experts, assign, history, True
    return experts, assign, history, False


def ot_reduce(
    models: Sequence[MixtureOfExperts],
    X_support: Any,
    *,
    weights: Sequence[float] | None = None,
    n_init: int = 5,
    max_iter: int = 100,
    tol: float = 1e-5,
    logistic_update: str = "newton",
    epsilon: float = 1e-6,
    gate_ridge: float = GATE_RIDGE,
    gate_targets: str = "auto",
    gate_refit: str = "kl",
    mass_tol: float = MASS_TOL,
    seed: int = 0,
) -> MixtureOfExperts:
    """The reduction estimator: the ``K``-expert MoE closest to the weighted average of ``models``.

    Parameters
    ----------
    models : sequence of MixtureOfExperts
        Fitted local models (same ``K``, expert kind and features).
    X_support : array-like, shape (S, P)
        The supporting sample over which expectations are averaged.
    weights : sequence of float, optional
        ``lambda_m`` (normalised); default equal. Use the local sample sizes.
    n_init : int, default 5
        MM initialisations, each from the experts of a different local model (drawn
        with ``seed``); the lowest final objective wins.
    max_iter, tol : Iterations and tolerance on the relative change of the objective, of
        the MM (objective (15)) and of the gate refit's EM.
    logistic_update : {"newton", "s14"}, default "newton"
        Logistic experts: the exact minimiser of (19) by weighted Newton, or the paper's
        closed form S14 — an unweighted least squares of the clamped log-odds ``V`` over
        every point that carries mass. S14 weighs a point with a trace of plan mass like
        one with all of it, and on saturated local experts the clamped log-odds are far
        from the true ones: on the S4.1 logistic simulation (N = 10^5, M = 4) the reduced
        model's test log-loss was 0.33 with S14 and 0.078 with the exact update.
    epsilon : float
        S14 clamps ``V`` to ``(epsilon, 1 - epsilon)`` before taking log-odds.
    gate_ridge : float
        Ridge of the gate refit (S5).
    gate_targets : {"auto", "matched", "plan"}, default "auto"
        Targets ``a_sk`` of the gate refit (S5). ``"plan"`` is (S4) literally: the mass
        the per-point plan (18) sends to ``k``. ``"matched"`` sends all the gate mass of
        local expert ``l`` to the reduced expert ``k(l)`` that receives most of its plan
        mass over the supporting sample — the correspondence ``k(l)`` of the paper's
        consistency argument (S1.3), to which the plan converges. ``"auto"`` is
        ``"matched"`` for Gaussian (and Poisson) experts and ``"plan"`` for logistic ones:

        * Gaussian: where two experts' conditionals cross, the per-point argmin sends a
          local expert's mass to the wrong reduced expert at a few points; on nearly
          separable gates these flipped targets make the softmax fit far softer than
          every local gate. Matched targets were better in 15 of 16 settings of the S4.1
          reproduction (seeds 0-1, M = 4-128).
        * Logistic: saturated local experts are matched region by region to different
          reduced experts (e.g. one predicting 1 and one predicting 0), so one
          ``k(l)`` per local expert misroutes the rest of its mass. Per-point targets
          gave test log-loss 0.054 against 0.078 (M = 4) and 0.12 against 0.22 (M = 16).
          The saturation comes from separable local data; local fits with a stronger
          ridge (``MixtureOfExperts(ridge=1e-2)``, M = 4) are not saturated, and then
          matched targets are better (0.034 against 0.055; Global 0.029): pass
          ``gate_targets="matched"`` for such local models.
    gate_refit : {"kl", "s5"}, default "kl"
        ``"s5"`` keeps the softmax fit to ``gate_targets`` (S5), the gate as the paper
        prints it. ``"kl"`` then refits the gate, the reduced experts held fixed, to
        minimise the expected KL divergence from ``f^W`` over the supporting sample — the
        criterion (5) that the transport divergence bounds — by EM
        (:func:`~ppmix.optimizers.ot.gate_refit.refit_gate`). On the S4.1 logistic
        simulation (N = 10^5, M = 4) it took the test log-loss from 0.054 to 0.028
        (Global 0.029); with Gaussian experts it changes little.
    mass_tol : float, default 1e-12
        (point, local expert) pairs with gate mass ``pi_l(x_s)`` at or below this are
        left out of the MM (they change the objective by at most ``MK * mass_tol``
        times the largest cost); 0 keeps every pair with positive mass. S14 is an
        unweighted least squares over the points that carry mass for ``k``, so there a
        point whose pairs were all dropped leaves the fit.
    seed : int

    Returns
    -------
    MixtureOfExperts
        Fitted (``engine_ == "ot-reduction"``), with ``history_`` the MM objective (15)
        after every iteration of the best initialisation, ``n_iter_``, ``converged_``,
        ``gate_targets_`` (the targets ``a_sk`` of the gate fit S5) and
        ``gate_history_`` (the objective of the ``"kl"`` refit, empty for ``"s5"``).

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix.datasets.moe import make_moe
    >>> data = make_moe(300, n_experts=2, n_features=2, seed=0)
    >>> truth = data.true_model()
    >>> reduced = ot_reduce([truth, truth], data.X)
    >>> bool(np.allclose(np.sort(reduced.coef_.numpy(), 0), np.sort(data.coef, 0)))
    True
    """
    lam = check_models(models, weights)
    x, _ = check_matrix(X_support, "X_support", n_features=models[0].n_features_in_)
    n_init = min(check_positive_int(n_init, "n_init"), len(models))
    check_positive_int(max_iter, "max_iter")
    if gate_targets not in GATE_TARGETS:
        raise ValueError(f"gate_targets must be one of {GATE_TARGETS}; got {gate_targets!r}")
    if gate_refit not in GATE_REFITS:
        raise ValueError(f"gate_refit must be one of {GATE_REFITS}; got {gate_refit!r}")
    if not 0.0 <= mass_tol < 1.0:
        raise ValueError(f"mass_tol must be in [0, 1); got {mass_tol!r}")
    local = LocalMixture.from_models(models, x, lam, mass_tol)
    k = local.n_experts
    starts = np.random.default_rng(seed).permutation(len(models))[:n_init]
    best: tuple[float, Experts, torch.Tensor, list[float], bool] | None = None
    with torch_threads(1):  # the MM and the gate refit are many small operations (see ppmix.ops.threads)
        for start in starts:
            first = _select(local.experts, list(range(start * k, (start + 1) * k)))
            experts, assign, history, converged = _mm(local, first, max_iter, tol, logistic_update, epsilon)
            logger.info(
                "OT reduction from local model %d: objective %.6g after %d iterations",
                start,
                history[-1],
                len(history) - 1,
            )
            if best is None or history[-1] < best[0]:
                best = (history[-1], experts, assign, history, converged)
        assert best is not None
        _, experts, assign, history, converged = best
        if gate_targets == "auto":
            gate_targets = "plan" if isinstance(experts, LogisticExpert) else "matched"
        targets = _gate_targets(local, assign, k, gate_targets)
        gate = SoftmaxGate(torch.zeros(k, x.shape[1], dtype=x.dtype), ridge=gate_ridge).fit(x, targets)
        gate_history: list[float] = []
        if gate_refit == "kl":
            gate, gate_history = refit_gate(local, gate, experts, max_iter=max_iter, tol=tol)
    model = MixtureOfExperts._from_families(gate, experts, engine="ot-reduction", expert=models[0].expert)
    model.history_, model.n_iter_, model.converged_ = history, len(history) - 1, converged
    model.gate_targets_, model.gate_history_ = targets, gate_history
    return model


def _gate_targets(local: LocalMixture, assign: torch.Tensor, k: int, kind: str) -> torch.Tensor:
    """``a_sk`` of (S4) from the per-point plan ``assign`` (``"plan"``) or from the matched local experts."""
    pairs = local.pairs
    if kind == "plan":
        return _per_point(pairs.weights, pairs.rows, assign, local.x.shape[0], k)
    n_local = local.gate_probs.shape[1]
    mass = pairs.weights.new_zeros(n_local * k).index_add_(0, pairs.comps * k + assign, pairs.weights)
    matched = mass.view(n_local, k).argmax(1)
    return local.gate_probs.new_zeros(local.x.shape[0], k).index_add_(1, matched, local.gate_probs)
