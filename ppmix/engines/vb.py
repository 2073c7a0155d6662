"""The variational-Bayes EM engine (``engine="vb"``): mean-field coordinate ascent on the evidence lower bound of a
mixture whose components have a conjugate prior, with a Dirichlet or a stick-breaking (Dirichlet-process) prior on
the weights, so that components the data do not support end with negligible weight.

Every iteration is one E-step (responsibilities ``r_nk ∝ exp(E[log w_k] + E[log p(x_n | theta_k)])`` under the
current factors, in one pass over the rows) and one M-step (the weights' factor and the components' conjugate
posterior given the responsibilities); the lower bound is then recorded. The weights' factor is here; the
components' is the family's (:class:`ConjugateComponents`: for Gaussian components,
:class:`~ppmix.components.gaussian_vb.NormalWishartMixture`). The updates, priors and bound follow scikit-learn's
``BayesianGaussianMixture`` (Blei and Jordan, 2006, for the stick-breaking weights; Bishop, 2006, section 10.2,
for the Gaussian mixture), so from the same responsibilities every iteration matches it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import warnings
from typing import Any, Mapping, Protocol, runtime_checkable

import torch

from ppmix._validation import check_positive_int
from ppmix.algorithms.forward_backward import forward_backward
from ppmix.engines.result import ConvergenceWarning, FitResult
from ppmix.ops.threads import threads_for, torch_threads

__all__ = [
    "WEIGHT_PRIOR_TYPES",
    "ConjugateComponents",
    "LatentFactor",
    "MarkovChainFactor",
    "MixtureWeights",
    "VB_TOL",
    "VariationalModel",
    "check_weight_prior",
    "expected_log_weights",
    "mean_weights",
    "run_vb",
    "weight_bound",
    "weight_posterior",
]

logger = logging.getLogger(__name__)

WEIGHT_PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")
#: the largest default tolerance (change of the lower bound per data point): an unsupported component's weight drains
#: over many iterations in which the bound changes little, so the EM default of a GMM (1e-3) would stop VB early
VB_TOL = 1e-6


@runtime_checkable
class ConjugateComponents(Protocol):
    """The components' variational factor on the training data (e.g.
    :class:`~ppmix.components.gaussian_vb.NormalWishartMixture`)."""

    def statistics(self, resp: torch.Tensor) -> Any:
        """The weighted statistics of the rows under responsibilities ``(N, K)`` (with ``counts`` ``(K,)``)."""

    def update(self, stats: Any) -> None:
        """The conjugate posterior given the statistics (the M-step)."""

    def e_step(self, log_weights: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Statistics of the responsibilities, ``sum_n log sum_k exp(a_nk)`` and ``sum_nk r_nk a_nk`` where ``a_nk =
        log_weights_k + E[log p(x_n | theta_k)]``."""

    def expected_log_prob(self) -> torch.Tensor:
        """``E_q[log p(x_n | theta_k)]`` ``(N, K)`` of every training row under the current factor."""

    def bound_terms(self) -> torch.Tensor:
        """The components' share of the lower bound after an update: ``sum_nk r_nk E_q[log p(x_n | theta_k)] -
        sum_k KL(q(theta_k) || p(theta_k))`` up to a constant, ``r`` the last responsibilities."""


class LatentFactor(Protocol):
    """The factor of the latent structure (the mixture's weights, the HMM's chain) and its E-step."""

    def start(self, components: ConjugateComponents, resp: torch.Tensor) -> Any:
        """The first M-step from responsibilities ``(N, K)``: both factors; returns the components' statistics."""

    def e_step(self, components: ConjugateComponents) -> tuple[Any, torch.Tensor]:
        """The latents' posterior under the current factors: the components' statistics and its entropy
        ``-E_r[log r(z)]``; the latent factor is updated too."""

    def bound(self) -> torch.Tensor:
        """The latent factor's share of the lower bound (minus its log normaliser)."""

    def state(self) -> dict[str, torch.Tensor]:
        """The latent factor's parameters."""


@runtime_checkable
class VariationalModel(Protocol):
    """What :func:`run_vb` needs of a model: its settings and three hooks."""

    n_components: int
    n_init: int
    max_iter: int
    tol: float
    weight_concentration_prior_type: str
    weight_concentration_prior: float | None

    def _vb_components(self, data: Any, component_prior: Mapping[str, Any] | None) -> ConjugateComponents:
        """The components' factor on the prepared training data, under the prior ``component_prior``."""

    def _vb_latent(self, data: Any) -> LatentFactor:
        """The latent structure's factor (:class:`MixtureWeights`, :class:`MarkovChainFactor`) for ``data``."""

    def _vb_initial_responsibilities(self, data: Any, generator: torch.Generator) -> torch.Tensor:
        """The starting responsibilities ``(N, K)`` of one restart (per row, per step of the sequences)."""

    def _vb_record(self, latent: LatentFactor, components: ConjugateComponents) -> None:
        """Keep the fitted factors."""

    def _generator(self, offset: int = 0) -> torch.Generator: ...


def check_weight_prior(prior_type: Any, concentration: Any, n_components: int) -> float:
    """The weights' prior concentration ``alpha`` (``concentration``, or ``1 / K`` where None, as scikit-learn's),
    checked with ``prior_type``; a ``ValueError`` naming the argument otherwise.

    Examples
    --------
    >>> check_weight_prior("dirichlet_process", None, 4)
    0.25
    >>> check_weight_prior("dirichlet", 1.0, 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: weight_concentration_prior_type must be one of (...); got 'dirichlet'
    """
    if prior_type not in WEIGHT_PRIOR_TYPES:
        raise ValueError(f"weight_concentration_prior_type must be one of {WEIGHT_PRIOR_TYPES}; got {prior_type!r}")
    if concentration is None:
        return 1.0 / n_components
    if isinstance(concentration, bool) or not isinstance(concentration, numbers.Real):
        raise TypeError(f"weight_concentration_prior must be a positive number or None; got {concentration!r}")
    if not (math.isfinite(float(concentration)) and concentration > 0):
        raise ValueError(f"weight_concentration_prior must be a positive number or None; got {concentration!r}")
    return float(concentration)


def weight_posterior(counts: torch.Tensor, prior_type: str, alpha: float) -> torch.Tensor:
    """The weights' factor given the expected counts ``N_k`` ``(K,)``: ``Dirichlet(alpha + N_k)`` ``(K,)``, or the
    stick-breaking ``Beta(1 + N_k, alpha + sum_{j>k} N_j)`` of every stick, ``(2, K)``.

    Examples
    --------
    >>> weight_posterior(torch.tensor([3.0, 1.0, 0.0]), "dirichlet_process", 0.5).tolist()
    [[4.0, 2.0, 1.0], [1.5, 0.5, 0.5]]
    """
    if prior_type == "dirichlet_distribution":
        return alpha + counts
    later = counts.flip(0).cumsum(0).flip(0) - counts  # sum_{j>k} N_j
    return torch.stack([1.0 + counts, alpha + later])


def expected_log_weights(concentration: torch.Tensor) -> torch.Tensor:
    """``E[log w_k]`` ``(K,)`` under a Dirichlet ``(K,)`` or stick-breaking ``(2, K)`` factor
    (:func:`weight_posterior`): ``digamma(a_k) - digamma(sum a)``, or ``E[log v_k] + sum_{j<k} E[log(1 - v_j)]``.

    Examples
    --------
    >>> [round(v, 4) for v in expected_log_weights(torch.tensor([1.0, 1.0], dtype=torch.float64)).tolist()]
    [-1.0, -1.0]
    """
    if concentration.dim() == 1:
        return torch.digamma(concentration) - torch.digamma(concentration.sum())
    a, b = concentration
    log_total = torch.digamma(a + b)
    stay = torch.digamma(b) - log_total  # E[log(1 - v_k)]
    before = torch.cat([stay.new_zeros(1), stay[:-1].cumsum(0)])
    return torch.digamma(a) - log_total + before


def mean_weights(concentration: torch.Tensor) -> torch.Tensor:
    """The weights' posterior means ``(K,)``, renormalised (the last stick's remainder spread as scikit-learn's).

    Examples
    --------
    >>> [round(w, 6) for w in mean_weights(torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)).tolist()]
    [0.666667, 0.333333]
    """
    if concentration.dim() == 1:
        return concentration / concentration.sum()
    a, b = concentration
    stick = a / (a + b)
    left = torch.cat([stick.new_ones(1), (b / (a + b))[:-1].cumprod(0)])
    weights = stick * left
    return weights / weights.sum()


def weight_bound(concentration: torch.Tensor) -> torch.Tensor:
    """The weights' factor's share of the lower bound: minus its log normaliser, ``sum_k lgamma(a_k) - lgamma(sum
    a)`` (Dirichlet) or ``sum_k log B(a_k, b_k)`` (stick-breaking), the prior's constant dropped."""
    if concentration.dim() == 1:
        return torch.lgamma(concentration).sum() - torch.lgamma(concentration.sum())
    a, b = concentration
    return (torch.lgamma(a) + torch.lgamma(b) - torch.lgamma(a + b)).sum()


def run_vb(
    model: VariationalModel,
    data: Any,
    *,
    n_init: int | None = None,
    max_iter: int | None = None,
    tol: float | None = None,
    component_prior: Mapping[str, Any] | None = None,
) -> FitResult:
    """Fit ``model`` by variational-Bayes EM, keeping the restart of the highest final lower bound.

    Each restart starts from the model's responsibilities (its ``init_params``: k-means by default), takes one
    M-step from them, then alternates E- and M-steps; the lower bound is recorded after every iteration, per data
    point (scikit-learn's ``lower_bounds_`` divided by ``N``: the same constants dropped), and a restart stops when
    it changes by at most ``tol`` per data point. A VB fit always starts afresh (``warm_start`` is EM's); sample
    weights and known latents are EM's too (refused by name).

    Parameters
    ----------
    model : VariationalModel
        A model with the hooks (:class:`~ppmix.models.gmm.GMM`); usually called by ``model.fit(X, engine="vb")``.
    data : prepared data, as returned by ``model.prepare_data``.
    n_init, max_iter :
        Default to the model's attributes of the same names.
    tol : float, optional
        The change of the lower bound per data point at which a restart stops; default the model's ``tol``, at
        most :data:`~ppmix.engines.vb.VB_TOL` (1e-6).
    component_prior : dict, optional
        The components' conjugate prior (Gaussian: ``"mean_precision_prior"``, ``"mean_prior"``,
        ``"degrees_of_freedom_prior"``, ``"covariance_prior"``, scikit-learn's names and defaults:
        :func:`~ppmix.components.gaussian_vb.normal_wishart_prior`).

    Returns
    -------
    FitResult
        The lower bound per data point after every iteration of the best restart.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(-5, 1, (300, 2)), rng.normal(5, 1, (300, 2))])
    >>> gmm = GMM(6, covariance_type="full", seed=0, progress=False).fit(X, engine="vb", max_iter=500)
    >>> gmm.n_effective_components_
    2
    """
    if not isinstance(model, VariationalModel):
        raise ValueError(
            f"{type(model).__name__} has no variational-Bayes updates (engine='vb' is for Mixture, GMM and HMM)"
        )
    n_init = check_positive_int(model.n_init if n_init is None else n_init, "n_init")
    max_iter = check_positive_int(model.max_iter if max_iter is None else max_iter, "max_iter")
    tol = _check_tol(min(model.tol, VB_TOL) if tol is None else tol)
    best: tuple[float, LatentFactor, ConjugateComponents, FitResult] | None = None
    with torch.no_grad():
        for restart in range(n_init):
            latent = model._vb_latent(data)
            components = model._vb_components(data, component_prior)
            resp = model._vb_initial_responsibilities(data, model._generator(restart))
            result = _single_run(latent, components, resp, max_iter, tol)
            final = result.history[-1]
            logger.info("VB restart %d: lower bound/point %.6f after %d iterations", restart, final, result.n_iter)
            if best is None or final > best[0]:
                best = (final, latent, components, result)
    assert best is not None
    model._vb_record(best[1], best[2])
    if not best[3].converged:
        warnings.warn(
            f"VB did not converge in max_iter={max_iter} iterations (tol={tol}); increase max_iter or tol",
            ConvergenceWarning,
            stacklevel=3,
        )
    return best[3]


def _check_tol(tol: Any) -> float:
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol >= 0:
        raise ValueError(f"tol must be a non-negative number; got {tol!r}")
    return float(tol)


def _single_run(
    latent: LatentFactor, components: ConjugateComponents, resp: torch.Tensor, max_iter: int, tol: float
) -> FitResult:
    """One restart from responsibilities ``resp`` ``(N, K)``: the factors updated in place, and the history of the
    bound per data point (row or step)."""
    n = resp.shape[0]
    stats = latent.start(components, resp)
    history: list[float] = []
    previous, converged, iteration = -math.inf, False, 0
    # the thread policy by the work of a pass (rows x values of the statistics), as EM's
    work = float(n) * sum(getattr(stats, field.name).numel() for field in dataclasses.fields(stats))
    with torch_threads(threads_for(work)):
        for iteration in range(1, max_iter + 1):
            stats, entropy = latent.e_step(components)
            components.update(stats)
            bound = float(entropy + components.bound_terms() + latent.bound())
            if not math.isfinite(bound):
                raise FloatingPointError(f"the VB lower bound became {bound} at iteration {iteration}")
            history.append(bound / n)
            if abs(bound - previous) <= tol * n:
                converged = True
                break
            previous = bound
    return FitResult(history=history, n_iter=iteration, converged=converged)


class MixtureWeights:
    """The mixture weights' factor: Dirichlet or stick-breaking (:func:`weight_posterior`), with the mixture's
    E-step (one fused pass of the components, :meth:`ConjugateComponents.e_step`).

    Parameters
    ----------
    prior_type : {"dirichlet_process", "dirichlet_distribution"}
    alpha : float
        The prior's concentration (:func:`check_weight_prior`).
    """

    def __init__(self, prior_type: str, alpha: float) -> None:
        self.prior_type, self.alpha = prior_type, alpha

    def start(self, components: ConjugateComponents, resp: torch.Tensor) -> Any:
        stats = components.statistics(resp)
        components.update(stats)
        self.concentration = weight_posterior(stats.counts, self.prior_type, self.alpha)
        return stats

    def e_step(self, components: ConjugateComponents) -> tuple[Any, torch.Tensor]:
        stats, log_norm, expected_log_joint = components.e_step(expected_log_weights(self.concentration))
        self.concentration = weight_posterior(stats.counts, self.prior_type, self.alpha)
        return stats, log_norm - expected_log_joint  # -sum_nk r_nk log r_nk

    def bound(self) -> torch.Tensor:
        return weight_bound(self.concentration)

    def state(self) -> dict[str, torch.Tensor]:
        return {"weight_concentration": self.concentration}


class MarkovChainFactor:
    """The hidden chain's factor of an HMM: ``Dirichlet`` on the initial distribution and on every transition row,
    with the forward-backward E-step under ``exp(E[log pi])`` and ``exp(E[log A])`` (MacKay, 1997; Beal, 2003).

    Parameters
    ----------
    mask : BoolTensor (B, T)
        The valid steps of the padded sequences (the rows of the components' data are the valid steps in order).
    lengths : LongTensor (B,)
    initial_prior, transition_prior : float
        The concentrations of the initial distribution's and of every transition row's Dirichlet prior.
    """

    def __init__(
        self, mask: torch.Tensor, lengths: torch.Tensor, initial_prior: float, transition_prior: float
    ) -> None:
        self.mask, self.lengths = mask, lengths
        self.initial_prior, self.transition_prior = initial_prior, transition_prior

    def _update(self, initial: torch.Tensor, pairs: torch.Tensor) -> None:
        self.initial = self.initial_prior + initial
        self.transition = self.transition_prior + pairs

    def _padded(self, frames: torch.Tensor) -> torch.Tensor:
        out = frames.new_zeros(*self.mask.shape, frames.shape[-1])
        out[self.mask] = frames
        return out

    def start(self, components: ConjugateComponents, resp: torch.Tensor) -> Any:
        padded = self._padded(resp)
        both = (self.mask[:, 1:] & self.mask[:, :-1]).to(resp.dtype)
        pairs = torch.einsum("bti,btj,bt->ij", padded[:, :-1], padded[:, 1:], both)
        stats = components.statistics(resp)
        components.update(stats)
        self._update(padded[:, 0].sum(0), pairs)
        self.occupancy = resp.sum(0)
        return stats

    def e_step(self, components: ConjugateComponents) -> tuple[Any, torch.Tensor]:
        log_initial = expected_log_weights(self.initial)
        log_transition = torch.digamma(self.transition) - torch.digamma(self.transition.sum(-1, keepdim=True))
        log_emit = components.expected_log_prob()
        result = forward_backward(log_initial, log_transition, self._padded(log_emit), self.lengths)
        frames = result.posterior[self.mask]
        initial, pairs = result.initial.sum(0), result.pair_counts.sum(0)
        expected_log_joint = (frames * log_emit).sum() + (initial * log_initial).sum() + (pairs * log_transition).sum()
        stats = components.statistics(frames)
        self._update(initial, pairs)
        self.occupancy = frames.sum(0)
        return stats, result.log_likelihood.sum() - expected_log_joint

    def bound(self) -> torch.Tensor:
        rows = torch.lgamma(self.transition).sum(-1) - torch.lgamma(self.transition.sum(-1))
        return weight_bound(self.initial) + rows.sum()

    def state(self) -> dict[str, torch.Tensor]:
        return {"initial_concentration": self.initial, "transition_concentration": self.transition}
