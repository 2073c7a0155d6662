"""Building a fitted :class:`~ppmix.models.MixtureOfExperts` from given parameters (``from_parameters``,
``from_families``): how distributed fits, the OT reduction and users hand ppmix a model they did not fit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ppmix.components import GaussianExpert, LogisticExpert, SoftmaxGate
from ppmix.models.moe_data import referenced_gate

if TYPE_CHECKING:
    from ppmix.models.moe import MixtureOfExperts

__all__ = ["ParametersMixin"]


class ParametersMixin:
    """The alternative constructors of :class:`~ppmix.models.MixtureOfExperts`."""

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
    ) -> "MixtureOfExperts":
        """A fitted model with the given parameters on the user's scale.

        ``scale=None`` means logistic experts. ``gate_coef`` has shape ``(K, P)`` or
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
        expert = "gaussian" if scale is not None else "logistic"
        dtype = kwargs.get("dtype", torch.float64)
        coef = torch.as_tensor(np.asarray(coef, dtype=np.float64), dtype=dtype)
        k, p = coef.shape
        gate_c, gate_i = referenced_gate(gate_coef, gate_intercept, k, p, dtype)
        model = cls(k, expert=expert, **{"progress": False, **kwargs})
        model.validate_params()
        model.n_features_in_, model.feature_names_in_ = p, feature_names
        model._x_mean, model._x_scale = coef.new_zeros(p), coef.new_ones(p)
        values = dict(gate_coef=gate_c[:-1], gate_intercept=gate_i[:-1], coef=coef, intercept=intercept, scale=scale)
        values = {name: value for name, value in values.items() if value is not None}
        model.set_globals({name: torch.as_tensor(np.asarray(v, np.float64), dtype=dtype) for name, v in values.items()})
        model.engine_, model.history_, model.n_iter_, model.converged_ = engine, [], 0, True
        model.lower_bound_ = float("nan")
        return model

    @classmethod
    def from_families(
        cls, gate: SoftmaxGate, experts: GaussianExpert | LogisticExpert, **kwargs: Any
    ) -> "MixtureOfExperts":
        """A fitted model from a gate and an expert family on the user's scale (see :meth:`from_parameters`)."""
        scale = experts.scale if isinstance(experts, GaussianExpert) else None
        return cls.from_parameters(
            gate_coef=gate.coef.detach().cpu(),
            gate_intercept=gate.intercept.detach().cpu(),
            coef=experts.coef.detach().cpu(),
            intercept=experts.intercept.detach().cpu(),
            scale=None if scale is None else scale.detach().cpu(),
            **kwargs,
        )
