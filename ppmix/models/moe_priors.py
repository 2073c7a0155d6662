"""The settable priors of a :class:`~ppmix.models.MixtureOfExperts` (``priors=``).

One prior, declared once, is used by every engine: the program's sites sample it under MCMC and under SVI (a MAP
fit with a point-mass guide), ``to_arviz``'s ``prior`` group draws from it, and MAP-EM's objective, its M-steps (the
gate's and the experts' penalties, :meth:`~ppmix.components.SoftmaxGate.penalty` and the experts' ``penalty()``),
its polish and ``to_arviz``'s Laplace approximation add its log density to the log-likelihood. On the standardised
covariates:

- the gate (:class:`~ppmix.components.softmax_gate.ReferencedNormal`): every expert's gate slopes and intercept
  ``N(0, gate_slope_scale^2)`` and ``N(0, gate_intercept_scale^2)`` before the reference gate's are subtracted, a
  prior that does not depend on which expert is the reference (EM's centred ridge);
- the experts: the family's (:meth:`~ppmix.components.expert_family.ExpertFamily.configured_prior`), normal on the
  slopes and intercepts (``slope_scale``, ``intercept_scale``) and, for Gaussian experts, inverse-gamma on the noise
  variances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import pyro.distributions as dist
import torch

from ppmix.components._linear import LinearPrior
from ppmix.components.expert_family import DEFAULT_PRIOR_SCALE, ExpertFamily, TargetScale
from ppmix.components.family import PriorKey, check_priors
from ppmix.components.softmax_gate import ReferencedNormal

__all__ = ["GATE_PRIOR_KEYS", "ExpertPriors", "check_expert_priors", "prior_keys"]

#: the gate's hyperparameters that ``priors=`` may set
GATE_PRIOR_KEYS = {
    "gate_slope_scale": PriorKey(
        f"the prior sd of every expert's gate slopes before the reference's are subtracted (default "
        f"{DEFAULT_PRIOR_SCALE:g})"
    ),
    "gate_intercept_scale": PriorKey(
        f"the prior sd of every expert's gate intercept before the reference's is subtracted (default "
        f"{DEFAULT_PRIOR_SCALE:g})"
    ),
}


def prior_keys(family: ExpertFamily) -> dict[str, PriorKey]:
    """Every hyperparameter ``priors=`` may set with experts of ``family`` (the gate's, then the family's), each
    with its default.

    Examples
    --------
    >>> from ppmix.components.registry import expert_family_from
    >>> sorted(prior_keys(expert_family_from("logistic")))
    ['gate_intercept_scale', 'gate_slope_scale', 'intercept_scale', 'slope_scale']
    """
    return {**GATE_PRIOR_KEYS, **family.prior_keys()}


def check_expert_priors(priors: Mapping[str, Any] | None, ridge: float | None, family: ExpertFamily) -> None:
    """``priors`` None or a mapping of :func:`prior_keys` to positive numbers, and then no ``ridge``; else an
    error naming ``priors``."""
    check_priors(priors, prior_keys(family), f"MixtureOfExperts with {family.name} experts", arrays=())
    if priors is not None and ridge is not None:
        raise ValueError(
            "ridge and priors cannot both be set: with priors, priors['gate_slope_scale'] and "
            "priors['slope_scale'] are the slopes' prior sds (ridge = 1 / sd^2 on the standardised slopes)"
        )


@dataclass(frozen=True)
class ExpertPriors:
    """The prior ``priors=`` sets on a mixture of experts (its gate's and its experts' parameters, on the
    standardised covariates): what the gate and the experts are built with, what the program samples under MCMC and
    what MAP-EM adds to the log-likelihood.

    Parameters
    ----------
    settings : dict
        The hyperparameters ``priors`` sets, as floats (the missing ones take their defaults where used).
    family : ExpertFamily
        The experts' family (its prior on the experts' sites).
    target_scale : dict
        The response's mean and sd on the training data (0 and 1 before a fit): what the experts' priors scale by.

    Examples
    --------
    >>> import torch
    >>> from ppmix.components.registry import expert_family_from
    >>> priors = ExpertPriors.of({"gate_slope_scale": 2}, expert_family_from("logistic"), {"mean": 0.0, "std": 1.0})
    >>> priors.gate_prior().slope_scale, priors.gate_prior().intercept_scale
    (2.0, 10.0)
    """

    settings: dict[str, float]
    family: ExpertFamily
    target_scale: TargetScale

    @classmethod
    def of(cls, priors: Mapping[str, Any], family: ExpertFamily, target_scale: TargetScale) -> "ExpertPriors":
        """The prior of the (checked) ``priors=`` mapping."""
        return cls({key: float(value) for key, value in priors.items() if value is not None}, family, target_scale)

    def gate_prior(self) -> LinearPrior:
        """The gate's normal priors."""
        return LinearPrior(
            self.settings.get("gate_slope_scale", DEFAULT_PRIOR_SCALE),
            self.settings.get("gate_intercept_scale", DEFAULT_PRIOR_SCALE),
        )

    def site_prior(self, site: str, batch: int, event: tuple[int, ...], opts: dict) -> dist.Distribution:
        """The prior of ``site``: for the gate's ``(K - 1, ...)`` free rows (``batch`` of them) a
        :class:`~ppmix.components.softmax_gate.ReferencedNormal`, for the experts' sites the family's."""
        if site.startswith("gate_"):
            prior = self.gate_prior()
            scale = prior.slope_scale if site == "gate_coef" else prior.intercept_scale
            return ReferencedNormal(scale, (batch, *event), **opts)
        return self.family.configured_prior(site, batch, event, self.settings, self.target_scale, opts)

    def log_prior(self, gate: Any, experts: Any) -> torch.Tensor:
        """The log density of the prior at the parameters of ``gate`` and ``experts`` (differentiable in them): what
        MAP-EM adds to the log-likelihood, and what the program's prior sites sum to under MCMC."""
        values = {"gate_coef": gate.coef[:-1], "gate_intercept": gate.intercept[:-1]}
        values.update({name: getattr(experts, name) for name in experts.param_names})
        opts = {"dtype": values["gate_coef"].dtype, "device": values["gate_coef"].device}
        total = values["gate_coef"].new_zeros(())
        for site, value in values.items():
            batch, event = int(value.shape[0]), tuple(value.shape[1:])
            total = total + self.site_prior(site, batch, event, opts).log_prob(value).sum()
        return total
