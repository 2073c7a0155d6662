"""The parts of a :class:`~ppmix.models.MixtureOfExperts`: its gate and its experts, built from flat tensors
(:class:`ExpertParts`: the globals, the saved state) under the model's settings, and a fitted model from given
parameters (:func:`model_from_parameters`, :func:`model_from_families`), which is how distributed fits, the OT
reduction and users hand ppmix a model they did not fit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ppmix.components import GaussianExpert, LogisticExpert, SoftmaxExpert, SoftmaxGate
from ppmix.components.expert_family import ExpertFamily
from ppmix.models.moe_data import referenced_gate
from ppmix.models.moe_priors import ExpertPriors

__all__ = ["NEWTON_STEPS", "ExpertParts", "model_from_families", "model_from_parameters", "parts_globals"]

#: damped Newton steps of the gate (and of logistic experts) per M-step: a generalised EM
#: step, still monotone because every damped Newton step decreases its objective
NEWTON_STEPS = 3

Experts = GaussianExpert | LogisticExpert | SoftmaxExpert


@dataclass(frozen=True)
class ExpertParts:
    """How a mixture of experts builds its two parts, on the standardised covariate scale: the softmax gate (its
    first ``K - 1`` rows free, the last fixed at zero) and the experts of ``family``, each fitted by ``NEWTON_STEPS``
    damped Newton steps per M-step under the ``ridge`` or, with ``priors``, MAP-EM's update under them.

    Parameters
    ----------
    family : ExpertFamily
    n_experts : int
    ridge : float
    noise_floor : float or Tensor
        The floor of Gaussian experts' noise variance.
    priors : ExpertPriors or None

    Examples
    --------
    >>> import torch
    >>> from ppmix.components.registry import expert_family_from
    >>> parts = ExpertParts(expert_family_from("logistic"), 2, 1e-2, 1e-4, None)
    >>> gate = parts.gate(torch.ones(1, 3), torch.zeros(1))
    >>> gate.coef.tolist()
    [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    """

    family: ExpertFamily
    n_experts: int
    ridge: float
    noise_floor: float | torch.Tensor
    priors: ExpertPriors | None

    def gate(self, free_coef: torch.Tensor, free_intercept: torch.Tensor) -> SoftmaxGate:
        """The gate with the free rows ``free_coef`` ``(K - 1, P)`` and ``free_intercept`` ``(K - 1,)``."""
        coef = torch.cat([free_coef, torch.zeros_like(free_coef[:1])])
        intercept = torch.cat([free_intercept, torch.zeros_like(free_intercept[:1])])
        prior = None if self.priors is None else self.priors.gate_prior()
        return SoftmaxGate(coef, intercept, ridge=self.ridge, max_iter=NEWTON_STEPS, prior=prior)

    def experts(self, params: dict[str, torch.Tensor]) -> Experts:
        """The experts with ``params``; under ``priors``, experts whose fit is MAP-EM's update and whose penalty is
        the prior's (:meth:`~ppmix.components.expert_family.ExpertFamily.experts`)."""
        if self.priors is None:
            return self.family.experts(params, self.ridge, NEWTON_STEPS, self.noise_floor)
        settings, scale = self.priors.settings, self.priors.target_scale
        return self.family.experts(params, self.ridge, NEWTON_STEPS, self.noise_floor, settings, scale)

    def from_globals(self, values: dict[str, torch.Tensor]) -> tuple[SoftmaxGate, Experts]:
        """The gate and the experts of ``values`` (the keys of :func:`parts_globals`), as they are."""
        sites = self.family.sites(self.n_experts, 1, 2)
        return self.gate(values["gate_coef"], values["gate_intercept"]), self.experts({n: values[n] for n in sites})

    def global_shapes(self, d: int, n_classes: int | None) -> dict[str, tuple[int, ...]]:
        """The shapes of :func:`parts_globals` with ``d`` covariates (and ``n_classes`` classes of softmax experts)."""
        k = self.n_experts
        sites = self.family.sites(k, d, n_classes)
        return {
            "gate_coef": (k - 1, d),
            "gate_intercept": (k - 1,),
            **{name: (k, *spec.event_shape) for name, spec in sites.items()},
        }


def parts_globals(gate: SoftmaxGate, experts: Experts) -> dict[str, torch.Tensor]:
    """The free parameters of a gate and its experts, keyed by site: the gate's first ``K - 1`` rows, the
    experts' state."""
    values = {"gate_coef": gate.coef[:-1].clone(), "gate_intercept": gate.intercept[:-1].clone()}
    values.update(experts.state_dict())
    return values


def model_from_parameters(
    cls: type,
    *,
    gate_coef: Any,
    gate_intercept: Any,
    coef: Any,
    intercept: Any,
    scale: Any = None,
    feature_names: list[str] | None = None,
    engine: str = "given",
    **kwargs: Any,
) -> Any:
    """A fitted model of class ``cls`` (a :class:`~ppmix.models.MixtureOfExperts`) with the given parameters on the
    user's scale: :meth:`~ppmix.models.MixtureOfExperts.from_parameters`."""
    expert: str | ExpertFamily = kwargs.pop("expert", None) or ("gaussian" if scale is not None else "logistic")
    dtype = kwargs.get("dtype", torch.float64)
    coef = torch.as_tensor(np.asarray(coef, dtype=np.float64), dtype=dtype)
    k, p = coef.shape
    gate_c, gate_i = referenced_gate(gate_coef, gate_intercept, k, p, dtype)
    model = cls(k, expert=expert, **{"progress": False, **kwargs})
    model._validate_hyperparameters()
    model.n_features_in_, model.feature_names_in_ = p, feature_names
    model._x_mean, model._x_scale = coef.new_zeros(p), coef.new_ones(p)
    values = dict(gate_coef=gate_c[:-1], gate_intercept=gate_i[:-1], coef=coef, intercept=intercept, scale=scale)
    values = {name: value for name, value in values.items() if value is not None}
    model._set_globals({name: torch.as_tensor(np.asarray(v, np.float64), dtype=dtype) for name, v in values.items()})
    model.engine_, model.history_, model.n_iter_, model.converged_ = engine, [], 0, True
    model.lower_bound_ = float("nan")
    return model


def model_from_families(cls: type, gate: SoftmaxGate, experts: Experts, **kwargs: Any) -> Any:
    """A fitted model from a gate and an expert family on the user's scale (see :func:`model_from_parameters`);
    ``expert=`` names the family of experts other than Gaussian and logistic ones."""
    if "expert" not in kwargs and not isinstance(experts, (GaussianExpert, LogisticExpert)):
        raise ValueError(f"expert= is required to build a model from {type(experts).__name__} experts")
    scale = experts.scale if isinstance(experts, GaussianExpert) else None
    return model_from_parameters(
        cls,
        gate_coef=gate.coef.detach().cpu(),
        gate_intercept=gate.intercept.detach().cpu(),
        coef=experts.coef.detach().cpu(),
        intercept=experts.intercept.detach().cpu(),
        scale=None if scale is None else scale.detach().cpu(),
        **kwargs,
    )
