"""The parameters of a :class:`~ppmix.models.MixtureOfExperts`: building its gate and experts from
flat tensors (``_get_globals``/``_set_globals``/``_assign_globals``, saved state) and a fitted model from
given parameters (``from_parameters``, ``_from_families``), which is how distributed fits, the OT
reduction and users hand ppmix a model they did not fit."""

from __future__ import annotations

from typing import Any, Self

import numpy as np
import torch

from ppmix.components import GaussianExpert, LogisticExpert, SoftmaxExpert, SoftmaxGate
from ppmix.components.expert_family import ExpertFamily
from ppmix.models.moe_data import referenced_gate

__all__ = ["NEWTON_STEPS", "ParametersMixin"]

#: damped Newton steps of the gate (and of logistic experts) per M-step: a generalised EM
#: step, still monotone because every damped Newton step decreases its objective
NEWTON_STEPS = 3


class ParametersMixin:
    """The parameter plumbing and the alternative constructors of :class:`~ppmix.models.MixtureOfExperts`.

    The free parameters are the gate's first ``K - 1`` rows (the last is fixed at zero) and the
    experts' parameters, on the standardised covariate scale.
    """

    priors: Any  # the host's ``priors`` and its :class:`~ppmix.models.moe_priors.PriorsMixin` methods
    _gate_prior: Any
    _prior_settings: Any
    _target_scale: Any

    def _make_gate(self, free_coef: torch.Tensor, free_intercept: torch.Tensor) -> SoftmaxGate:
        coef = torch.cat([free_coef, torch.zeros_like(free_coef[:1])])
        intercept = torch.cat([free_intercept, torch.zeros_like(free_intercept[:1])])
        return SoftmaxGate(coef, intercept, ridge=self.ridge_value, max_iter=NEWTON_STEPS, prior=self._gate_prior())

    _expert_family: Any  # the host's method: the ExpertFamily its ``expert`` argument names

    def _make_experts(self, params: dict[str, torch.Tensor]) -> GaussianExpert | LogisticExpert | SoftmaxExpert:
        """The experts with ``params``; under ``priors``, experts whose fit is MAP-EM's update and whose penalty is
        the prior's (:meth:`~ppmix.components.expert_family.ExpertFamily.experts`)."""
        floor = getattr(self, "_noise_floor", self.min_variance)
        if self.priors is None:
            return self._expert_family().experts(params, self.ridge_value, NEWTON_STEPS, floor)
        settings, scale = self._prior_settings(), self._target_scale()
        return self._expert_family().experts(params, self.ridge_value, NEWTON_STEPS, floor, settings, scale)

    def _get_globals(self) -> dict[str, torch.Tensor]:
        values = {"gate_coef": self._gate.coef[:-1].clone(), "gate_intercept": self._gate.intercept[:-1].clone()}
        values.update(self._experts.state_dict())
        return values

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        self._assign_globals({k: torch.as_tensor(v).detach().to(**opts) for k, v in values.items()})

    def _assign_globals(self, values: dict[str, torch.Tensor]) -> None:
        """Build the gate and the experts from ``values`` (``_get_globals``' keys) as they are: unlike
        :meth:`_set_globals`, without detaching or converting them, so that autograd sees through."""
        self._gate = self._make_gate(values["gate_coef"], values["gate_intercept"])
        sites = self._expert_family().sites(self.n_experts, 1, 2)
        self._experts = self._make_experts({n: values[n] for n in sites})
        self._invalidate_guide()

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """The globals and the covariates' scales; under ``priors``, also the response's mean and sd on the
        training data, which scale the experts' priors (``y_mean``, ``y_std``, where a fit set them)."""
        tensors = {**self._get_globals(), "x_mean": self._x_mean.clone(), "x_scale": self._x_scale.clone()}
        if self.priors is not None:
            scale = self._target_scale()
            opts = {"dtype": self.dtype, "device": self._device}
            tensors.update(
                y_mean=torch.as_tensor(scale["mean"]).to(**opts), y_std=torch.as_tensor(scale["std"]).to(**opts)
            )
        return tensors

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        k, d = self.n_experts, self.n_features_in_
        classes = getattr(self, "classes_", None)
        sites = self._expert_family().sites(k, d, None if classes is None else len(classes))
        shapes = {
            "gate_coef": (k - 1, d),
            "gate_intercept": (k - 1,),
            **{name: (k, *spec.event_shape) for name, spec in sites.items()},
            "x_mean": (d,),
            "x_scale": (d,),
        }
        return shapes if self.priors is None else {**shapes, "y_mean": (), "y_std": ()}

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        self._x_mean, self._x_scale = tensors["x_mean"].to(**opts), tensors["x_scale"].to(**opts)
        if "y_mean" in tensors:
            self._y_mean, self._y_std = tensors["y_mean"].to(**opts), tensors["y_std"].to(**opts)
        self._set_globals({k: v for k, v in tensors.items() if k not in ("x_mean", "x_scale", "y_mean", "y_std")})

    @classmethod
    def from_parameters(
        cls,
        *,
        gate_coef: Any,
        gate_intercept: Any,
        coef: Any,
        intercept: Any,
        scale: Any = None,
        feature_names: list[str] | None = None,
        engine: str = "given",
        **kwargs: Any,
    ) -> Self:
        """A fitted model with the given parameters on the user's scale.

        ``scale=None`` means logistic experts (unless ``expert=`` says otherwise). ``gate_coef`` has shape ``(K, P)`` or
        ``(K-1, P)`` (then the last gate is zero); it is shifted so its last row is zero.

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import MixtureOfExperts
        >>> moe = MixtureOfExperts.from_parameters(gate_coef=[[1.0], [0.0]], gate_intercept=[0.0, 0.0],
        ...                                        coef=[[1.0], [-1.0]], intercept=[0.0, 0.0], scale=[1.0, 1.0])
        >>> moe.predict(np.zeros((1, 1))).tolist()
        [0.0]
        """
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
        model._set_globals(
            {name: torch.as_tensor(np.asarray(v, np.float64), dtype=dtype) for name, v in values.items()}
        )
        model.engine_, model.history_, model.n_iter_, model.converged_ = engine, [], 0, True
        model.lower_bound_ = float("nan")
        return model

    @classmethod
    def _from_families(cls, gate: SoftmaxGate, experts: GaussianExpert | LogisticExpert, **kwargs: Any) -> Self:
        """A fitted model from a gate and an expert family on the user's scale (see :meth:`from_parameters`);
        ``expert=`` names the family of experts other than Gaussian and logistic ones."""
        if "expert" not in kwargs and not isinstance(experts, (GaussianExpert, LogisticExpert)):
            raise ValueError(f"expert= is required to build a model from {type(experts).__name__} experts")
        scale = experts.scale if isinstance(experts, GaussianExpert) else None
        return cls.from_parameters(
            gate_coef=gate.coef.detach().cpu(),
            gate_intercept=gate.intercept.detach().cpu(),
            coef=experts.coef.detach().cpu(),
            intercept=experts.intercept.detach().cpu(),
            scale=None if scale is None else scale.detach().cpu(),
            **kwargs,
        )
