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

from typing import Any, Mapping

import pyro.distributions as dist
import torch

from ppmix.components._linear import LinearPrior
from ppmix.components.expert_family import DEFAULT_PRIOR_SCALE, ExpertFamily, TargetScale
from ppmix.components.family import PriorKey, check_priors
from ppmix.components.softmax_gate import ReferencedNormal

__all__ = ["GATE_PRIOR_KEYS", "PriorsMixin"]

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


class PriorsMixin:
    """``priors=`` of :class:`~ppmix.models.MixtureOfExperts`: its keys, their check and the prior they set."""

    priors: Mapping[str, Any] | None
    ridge: float | None
    _expert_family: Any  # the host's method: the ExpertFamily its ``expert`` argument names
    _gate: Any  # the host's fitted gate and experts (standardised covariates)
    _experts: Any

    def prior_keys(self) -> dict[str, PriorKey]:
        """Every hyperparameter ``priors=`` may set (the gate's, then the experts' family's), each with its default.

        Examples
        --------
        >>> from ppmix import MixtureOfExperts
        >>> sorted(MixtureOfExperts(2, expert="logistic").prior_keys())
        ['gate_intercept_scale', 'gate_slope_scale', 'intercept_scale', 'slope_scale']
        >>> MixtureOfExperts(2).prior_keys()["variance_rate"].doc
        'the inverse-gamma rate of every noise variance, in units of var(y) (default 0.01)'
        """
        family: ExpertFamily = self._expert_family()
        return {**GATE_PRIOR_KEYS, **family.prior_keys()}

    def _validate_priors(self) -> None:
        """``priors`` None or a mapping of :meth:`prior_keys` to positive numbers, and then no ``ridge``; else an
        error naming ``priors``."""
        owner = f"MixtureOfExperts with {self._expert_family().name} experts"
        check_priors(self.priors, self.prior_keys(), owner, arrays=())
        if self.priors is not None and self.ridge is not None:
            raise ValueError(
                "ridge and priors cannot both be set: with priors, priors['gate_slope_scale'] and "
                "priors['slope_scale'] are the slopes' prior sds (ridge = 1 / sd^2 on the standardised slopes)"
            )

    def _prior_settings(self) -> dict[str, float]:
        """The hyperparameters ``priors`` sets, as floats (the missing ones take their defaults where used)."""
        return {key: float(value) for key, value in (self.priors or {}).items() if value is not None}

    def _target_scale(self) -> TargetScale:
        """The response's mean and sd on the training data (0 and 1 before a fit): what the experts' priors scale by."""
        return {"mean": getattr(self, "_y_mean", torch.tensor(0.0)), "std": getattr(self, "_y_std", torch.tensor(1.0))}

    def _gate_prior(self) -> LinearPrior | None:
        """The gate's normal priors under ``priors`` (None without)."""
        if self.priors is None:
            return None
        settings = self._prior_settings()
        return LinearPrior(
            settings.get("gate_slope_scale", DEFAULT_PRIOR_SCALE),
            settings.get("gate_intercept_scale", DEFAULT_PRIOR_SCALE),
        )

    def _configured_prior(self, site: str, batch: int, event: tuple[int, ...], opts: dict) -> dist.Distribution:
        """The prior of ``site`` under ``priors``: for the gate's ``(K - 1, ...)`` free rows (``batch`` of them)
        a :class:`~ppmix.components.softmax_gate.ReferencedNormal`, for the experts' sites the family's."""
        if site.startswith("gate_"):
            prior = self._gate_prior()
            assert prior is not None
            scale = prior.slope_scale if site == "gate_coef" else prior.intercept_scale
            return ReferencedNormal(scale, (batch, *event), **opts)
        family: ExpertFamily = self._expert_family()
        return family.configured_prior(site, batch, event, self._prior_settings(), self._target_scale(), opts)

    def _log_prior(self) -> torch.Tensor:
        """The log density of ``priors``' prior at the current parameters (differentiable in them): what MAP-EM adds
        to the log-likelihood, and what the program's prior sites sum to under MCMC.

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import MixtureOfExperts
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(100, 1))
        >>> y = (X[:, 0] + 0.5 * rng.normal(size=100) > 0).astype(int)
        >>> moe = MixtureOfExperts(2, expert="logistic", priors={}, seed=0, progress=False).fit(X, y)
        >>> round(float(moe.log_likelihood(X, y) + moe._log_prior()) / 100 - moe.lower_bound_, 10)
        0.0
        """
        gate, experts = self._gate, self._experts
        values = {"gate_coef": gate.coef[:-1], "gate_intercept": gate.intercept[:-1]}
        values.update({name: getattr(experts, name) for name in experts.param_names})
        opts = {"dtype": values["gate_coef"].dtype, "device": values["gate_coef"].device}
        total = values["gate_coef"].new_zeros(())
        for site, value in values.items():
            batch, event = int(value.shape[0]), tuple(value.shape[1:])
            total = total + self._configured_prior(site, batch, event, opts).log_prob(value).sum()
        return total
