"""Variational-Bayes EM for the families whose one site has a conjugate prior (``fit(X, engine="vb")`` of a
:class:`~ppmix.models.mixture.Mixture`): Poisson and exponential rates under a Gamma prior, Bernoulli probabilities
under a Beta prior, categorical level and multinomial category probabilities under a Dirichlet prior.

The factor ``q(theta_k)`` is the family's own conjugate posterior given the responsibilities' statistics
(:meth:`~ppmix.components.family.FamilyPriors.conjugate_posterior`, under its ``prior``, read only). Each
family's log-density is linear in the functions of ``theta`` whose expectations the factor has in closed form (``log
rate`` and ``rate``; ``log p`` and ``log(1 - p)``; ``log p_c``), so ``E_q[log p(x | theta_k)]`` is the log-density
of plug-in components ``theta*_k`` plus a constant per component (:data:`PLUG_INS`; the multinomial's, times the
row's total count: :data:`ROW_TOTAL_SCALED`): the E-step is one ``log_prob`` pass of ordinary fitted components. The
lower bound is the evidence lower bound ``sum_nk r_nk (E[log w_k] + E[log p(x_n | theta_k)]) - sum_nk r_nk log r_nk -
KL(q(w) || p(w)) - sum_k KL(q(theta_k) || p(theta_k))`` but for one constant, the log normaliser of the weights'
prior (the engine's :func:`~ppmix.engines.vb.weight_bound` drops it, as scikit-learn's Gaussian bound does).
"""

from __future__ import annotations

from typing import Any, Callable

import pyro.distributions as dist
import torch
from torch.distributions import kl_divergence

from ppmix.components.base import ComponentFamily
from ppmix.components.family import DataScale, DensityFamily, Statistics
from ppmix.components.family_tools import has_conjugate_prior, placeholder

__all__ = ["PLUG_INS", "ROW_TOTAL_SCALED", "ConjugateMixture", "supports_conjugate_vb"]


def _expected_logs(posterior: dist.Distribution) -> tuple[torch.Tensor, ...]:
    """The closed-form expectations of a Gamma (``E[log rate]``, ``E[rate]``), Beta (``E[log p]``, ``E[log(1 -
    p)]``) or Dirichlet (``E[log p_c]``) factor."""
    if isinstance(posterior, dist.Gamma):
        a, b = posterior.concentration, posterior.rate
        return torch.digamma(a) - b.log(), a / b
    if isinstance(posterior, dist.Beta):
        a, b = posterior.concentration1, posterior.concentration0
        total = torch.digamma(a + b)
        return torch.digamma(a) - total, torch.digamma(b) - total
    alpha = posterior.concentration
    return (torch.digamma(alpha) - torch.digamma(alpha.sum(-1, keepdim=True)),)


def _poisson(posterior: dist.Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    """``x log rate - rate``: ``rate* = exp(E[log rate])``, constant ``sum_d (rate*_d - E[rate_d])``."""
    log_rate, rate = _expected_logs(posterior)
    plug_in = log_rate.exp()
    return plug_in, (plug_in - rate).sum(-1)


def _exponential(posterior: dist.Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    """``log rate - rate x``: ``rate* = E[rate]``, constant ``sum_d (E[log rate_d] - log rate*_d)``."""
    log_rate, rate = _expected_logs(posterior)
    return rate, (log_rate - rate.log()).sum(-1)


def _bernoulli(posterior: dist.Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    """``x log p + (1 - x) log(1 - p)``: ``logit p* = E[log p] - E[log(1 - p)]``, constant ``sum_d log(exp E[log p_d]
    + exp E[log(1 - p_d)])``."""
    log_p, log_q = _expected_logs(posterior)
    return torch.sigmoid(log_p - log_q), torch.logaddexp(log_p, log_q).sum(-1)


def _categorical(posterior: dist.Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    """``log p_{x_d}``: ``p*_d = softmax(E[log p_d])``, constant ``sum_d logsumexp_c E[log p_dc]``."""
    (log_p,) = _expected_logs(posterior)
    return torch.softmax(log_p, -1), torch.logsumexp(log_p, -1).sum(-1)


def _multinomial(posterior: dist.Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_c x_c log p_c``: ``p* = softmax(E[log p])``, constant ``logsumexp_c E[log p_c]`` per count (times the
    row's total, :data:`ROW_TOTAL_SCALED`)."""
    (log_p,) = _expected_logs(posterior)
    return torch.softmax(log_p, -1), torch.logsumexp(log_p, -1)


#: the families whose plug-in constant is per count: ``E_q[log p(x_n | theta_k)] = log p(x_n | theta*_k) + n_n
#: constant_k``, ``n_n`` the row's total count
ROW_TOTAL_SCALED = frozenset({"multinomial"})

#: by family name: the plug-in site value ``theta*`` ``(K, ...)`` and the constants ``(K,)`` with ``E_q[log p(x |
#: theta_k)] = log p(x | theta*_k) + constant_k``, from the factor ``q``
PLUG_INS: dict[str, Callable[[dist.Distribution], tuple[torch.Tensor, torch.Tensor]]] = {
    "poisson": _poisson,
    "exponential": _exponential,
    "bernoulli": _bernoulli,
    "categorical": _categorical,
    "multinomial": _multinomial,
}


def supports_conjugate_vb(family: DensityFamily) -> bool:
    """Whether :class:`ConjugateMixture` serves ``family``: one site, a conjugate prior and a plug-in rule.

    Examples
    --------
    >>> from ppmix.components.registry import family_from
    >>> supports_conjugate_vb(family_from("poisson")), supports_conjugate_vb(family_from("gamma"))
    (True, False)
    """
    return family.name in PLUG_INS and has_conjugate_prior(family) and len(family.sites(1, 1)) == 1


class ConjugateMixture:
    """The conjugate factors of ``K`` components of a family with one site (:func:`supports_conjugate_vb`) on the
    prepared training data, for variational-Bayes EM (:func:`ppmix.engines.vb.run_vb`).

    Parameters
    ----------
    family : DensityFamily
        The family, with its prior's hyperparameters (a model's ``priors``:
        :func:`~ppmix.components.family.with_priors`).
    rows : Tensor (N, D)
        The training rows (prepared here by ``family.prepare``).
    n_components : int
    scale : DataScale
        The family's data scale (its priors' defaults).

    Examples
    --------
    >>> from ppmix.components.registry import family_from
    >>> x = torch.tensor([[0.0], [1.0], [9.0], [11.0]], dtype=torch.float64)
    >>> family = family_from("poisson")
    >>> mix = ConjugateMixture(family, x, 2, family.data_scale(x))
    >>> mix.update(mix.statistics(torch.tensor([[1.0, 0], [1, 0], [0, 1], [0, 1]], dtype=torch.float64)))
    >>> mix.posterior.concentration[:, 0].tolist(), [round(v, 3) for v in mix.posterior.rate[:, 0].tolist()]
    ([2.0, 21.0], [2.19, 2.19])
    """

    def __init__(self, family: DensityFamily, rows: torch.Tensor, n_components: int, scale: DataScale) -> None:
        self.family, self.n_components, self.scale = family, n_components, scale
        self.data = family.prepare(rows)
        self.n_features = int(rows.shape[1])
        self.opts = {"dtype": rows.dtype, "device": rows.device}
        (self.site,) = family.sites(n_components, self.n_features)
        self._row_scale = rows.sum(1, keepdim=True) if family.name in ROW_TOTAL_SCALED else None
        self._plug_in: ComponentFamily = placeholder(family, n_components, self.n_features, scale, self.opts)

    def statistics(self, resp: torch.Tensor) -> Statistics:
        """The family's weighted statistics of the rows under responsibilities ``resp`` ``(N, K)`` (kept for
        :meth:`bound_terms`)."""
        self._resp = resp
        return self._plug_in.statistics(self.data, resp)

    def update(self, stats: Statistics) -> None:
        """The conjugate posterior given the statistics (the variational M-step), and its plug-in components."""
        self.posterior = self.family.priors().conjugate_posterior(self.site, stats, {}, self.scale, self.opts)
        value, self.constants = PLUG_INS[self.family.name](self.posterior)
        self._plug_in = self.family.components({self.site: value}, self.scale)

    def expected_log_prob(self) -> torch.Tensor:
        """``E_q[log p(x_n | theta_k)]`` ``(N, K)``."""
        constants = self.constants if self._row_scale is None else self._row_scale * self.constants
        return self._plug_in.log_prob(self.data) + constants

    def e_step(self, log_weights: torch.Tensor) -> tuple[Statistics, torch.Tensor, torch.Tensor]:
        """The statistics of ``r_nk ∝ exp(log_weights_k + E[log p(x_n | theta_k)])``, ``sum_n log sum_k exp(...)``
        and ``sum_nk r_nk (...)``; the responsibilities are kept for :meth:`bound_terms`."""
        log_joint = self.expected_log_prob() + log_weights
        log_norm = torch.logsumexp(log_joint, 1)
        resp = (log_joint - log_norm[:, None]).exp()
        return self.statistics(resp), log_norm.sum(), (resp * log_joint).sum()

    def bound_terms(self) -> torch.Tensor:
        """The components' and the weights' prior's share of the lower bound after an update: ``sum_nk r_nk
        E[log p(x_n | theta_k)] - sum_k KL(q(theta_k) || p(theta_k))`` (the current factor, the last E-step's
        responsibilities given to :meth:`statistics`)."""
        prior = self.family.priors().prior(self.site, self.n_components, self.n_features, self.scale, self.opts)
        prior = prior.base_dist if isinstance(prior, dist.Independent) else prior
        divergence = kl_divergence(self.posterior, prior.expand(self.posterior.batch_shape)).sum()
        return (self._resp * self.expected_log_prob()).sum() - divergence

    def components(self, floor: Any = None) -> ComponentFamily:
        """The fitted components: the factor's mean of the site."""
        return self.family.components({self.site: self.posterior.mean}, self.scale)

    def state(self) -> dict[str, torch.Tensor]:
        """The factor's parameters, by their torch names (e.g. ``concentration`` and ``rate`` of a Gamma)."""
        return {name: getattr(self.posterior, name) for name in self.posterior.arg_constraints}
