"""The data of a :class:`~ppmix.models.MixtureOfExperts`: the check of the response ``y`` and, in ``fit``, the
check of the training covariates and the scales fitted on them (the covariates' standardisation, the response's
mean and spread, which set the MCMC priors and the Gaussian experts' noise floor)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ppmix._validation import check_matrix, check_positive_int, ravel_column_vector
from ppmix.models.moe_moves import SEARCHES
from ppmix.ops.scaling import feature_scales

if TYPE_CHECKING:
    from ppmix.models.moe import MixtureOfExperts

__all__ = ["check_response", "check_settings", "prepare_training_data", "referenced_gate"]


def check_settings(model: "MixtureOfExperts", experts: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the first constructor argument of ``model`` out of its range."""
    if model.n_experts < 2:
        raise ValueError(f"n_experts must be >= 2; got {model.n_experts}")
    if model.expert not in experts:
        raise ValueError(f"expert must be one of {experts}; got {model.expert!r}")
    split_merge = model.split_merge
    if isinstance(split_merge, bool) or not isinstance(split_merge, int) or split_merge < 0:
        raise ValueError(f"split_merge must be a non-negative integer; got {split_merge!r}")
    if model.split_merge_search not in SEARCHES:
        raise ValueError(f"split_merge_search must be one of {SEARCHES}; got {model.split_merge_search!r}")
    if not isinstance(model.polish, bool):
        raise ValueError(f"polish must be True or False; got {model.polish!r}")
    if model.init_iter is not None:
        check_positive_int(model.init_iter, "init_iter")
    for name in ("ridge", "min_variance", "tol"):
        if name == "ridge" and model.ridge is None:  # the expert kind's default
            continue
        if not getattr(model, name) >= 0:
            raise ValueError(f"{name} must be non-negative; got {getattr(model, name)}")


def check_response(y: Any, n: int, expert: str, name: str = "y") -> torch.Tensor:
    """``y`` as a float64 vector of length ``n``; binary (0/1) for logistic experts.

    Examples
    --------
    >>> check_response([0, 1, 1], 3, "logistic")
    tensor([0., 1., 1.], dtype=torch.float64)
    """
    if y is None:
        raise ValueError(
            f"{name} is required: a mixture of experts models y given X (it requires y to be passed, but the target "
            "y is None)"
        )
    if hasattr(y, "to_numpy"):
        y = y.to_numpy()
    array = ravel_column_vector(y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y), name)
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be numeric (Unknown label type: dtype {array.dtype})")
    array = array.astype(np.float64)
    if array.ndim != 1 or array.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) to match X; got {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    if expert == "logistic" and not np.isin(array, (0.0, 1.0)).all():
        bad = np.unique(array[~np.isin(array, (0.0, 1.0))])[:5].tolist()
        raise ValueError(f"{name} must be binary (0/1) for logistic experts; got values such as {bad}")
    if expert == "softmax" and ((array < 0).any() or (array != np.round(array)).any()):
        raise ValueError(f"{name} must hold class codes 0, 1, ..., C-1 for softmax experts")
    return torch.as_tensor(array)


def prepare_training_data(model: MixtureOfExperts, X: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the training data, fit ``model``'s scales on it; the standardised covariates and the response.

    Sets ``n_features_in_``, ``feature_names_in_``, the covariates' mean and scale
    (zero and one when ``model.standardize`` is false), the response's mean and standard
    deviation and the Gaussian experts' noise floor (``min_variance`` times the variance of ``y``).
    """
    x, names = check_matrix(X, "X", dtype=model.dtype, device=model._device)
    model.n_features_in_ = int(x.shape[1])
    model.feature_names_in_ = names
    response = check_response(y, x.shape[0], model.expert).to(dtype=model.dtype, device=model._device)
    if x.shape[0] <= model.n_parameters:
        raise ValueError(
            f"X has {x.shape[0]} rows (n_samples={x.shape[0]}), not more than the {model.n_parameters} free "
            f"parameters of a {model.n_experts}-expert {model.expert} MoE with {x.shape[1]} features"
        )
    held = _user_scale_globals(model) if model.is_fitted else None
    if model.standardize:
        model._x_mean, model._x_scale = feature_scales(x)
    else:
        model._x_mean, model._x_scale = torch.zeros_like(x[0]), torch.ones_like(x[0])
    if held is not None:  # a warm start continues from the same model, re-expressed on the new scales
        model.set_globals(_restandardised(held, model._x_mean, model._x_scale))
    model._y_mean, model._y_std = response.mean(), response.std().clamp_min(1e-12)
    model._noise_floor = model.min_variance * float(model._y_std.square())
    return model._standardise(x), response


#: the (coefficients, intercepts) pairs of the linear parameters in ``MixtureOfExperts.get_globals()``
_LINEAR_PAIRS = (("gate_coef", "gate_intercept"), ("coef", "intercept"))


def _user_scale_globals(model: MixtureOfExperts) -> dict[str, torch.Tensor]:
    """``model.get_globals()`` with the linear parameters on the user's (unstandardised) scale."""
    values = dict(model.get_globals())
    for coef, intercept in _LINEAR_PAIRS:
        values[coef], values[intercept] = model._unstandardise(values[coef], values[intercept])
    return values


def _restandardised(values: dict[str, torch.Tensor], mean: torch.Tensor, scale: torch.Tensor) -> dict[str, Any]:
    """User-scale parameters re-expressed on covariates standardised by ``mean`` and ``scale``."""
    values = dict(values)
    for coef, intercept in _LINEAR_PAIRS:
        values[coef], values[intercept] = values[coef] * scale, values[intercept] + values[coef] @ mean
    return values


def referenced_gate(
    gate_coef: Any, gate_intercept: Any, k: int, p: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A gate's ``(K, P)`` coefficients and ``(K,)`` intercepts shifted so the last gate is zero, from shapes
    ``(K, P)``/``(K,)`` or ``(K-1, P)``/``(K-1,)`` (the last gate then zero already).

    Examples
    --------
    >>> coef, intercept = referenced_gate([[2.0]], [1.0], 2, 1, torch.float64)
    >>> coef.tolist(), intercept.tolist()
    ([[2.0], [0.0]], [1.0, 0.0])
    """
    coef = torch.as_tensor(np.asarray(gate_coef, dtype=np.float64), dtype=dtype)
    intercept = torch.as_tensor(np.asarray(gate_intercept, dtype=np.float64), dtype=dtype)
    if coef.shape == (k - 1, p):
        coef, intercept = torch.cat([coef, coef.new_zeros(1, p)]), torch.cat([intercept, intercept.new_zeros(1)])
    if coef.shape != (k, p) or intercept.shape != (k,):
        raise ValueError(f"gate_coef/gate_intercept must have shapes ({k}, {p})/({k},) or ({k - 1}, {p})/({k - 1},)")
    return coef - coef[-1], intercept - intercept[-1]
