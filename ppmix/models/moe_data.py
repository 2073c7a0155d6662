"""The data of a :class:`~ppmix.models.MixtureOfExperts`: the check of the response ``y`` and, in ``fit``, the
check of the training covariates and the scales fitted on them (the covariates' standardisation, the response's
mean and spread, which set the MCMC priors and the Gaussian experts' noise floor)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ppmix._validation import InvalidDataError, check_matrix, check_positive_int, ravel_column_vector
from ppmix.components.expert_family import ExpertFamily
from ppmix.models._weights import check_sample_weight
from ppmix.models.moe_moves import SEARCHES, response_scales
from ppmix.ops.scaling import feature_scales

__all__ = [
    "TrainingData",
    "check_response",
    "check_settings",
    "check_training_data",
    "referenced_gate",
    "restandardised",
    "unstandardised",
]


def check_settings(model: Any) -> None:
    """Raise ``ValueError`` naming the first constructor argument of ``model`` out of its range."""
    if model.n_experts < 2:
        raise ValueError(f"n_experts must be >= 2; got {model.n_experts}")
    model._expert_family()  # a registered name or a family object, else an error naming expert
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


def check_response(y: Any, n: int, family: ExpertFamily, name: str = "y") -> torch.Tensor:
    """``y`` as a float64 vector of length ``n`` with values the experts' ``family`` accepts (e.g. binary 0/1 for
    logistic experts).

    Examples
    --------
    >>> from ppmix.components.registry import expert_family_from
    >>> check_response([0, 1, 1], 3, expert_family_from("logistic"))
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
        raise InvalidDataError(f"{name} must have shape ({n},) to match X; got {array.shape}")
    if not np.isfinite(array).all():
        raise InvalidDataError(f"{name} contains NaN or infinite values")
    family.check_target(array, name)
    return torch.as_tensor(array)


@dataclass(frozen=True)
class TrainingData:
    """The checked training data of a mixture of experts and the scales fitted on them."""

    x: torch.Tensor  # (N, P) covariates on the user's scale
    response: torch.Tensor  # (N,)
    feature_names: list[str] | None
    x_mean: torch.Tensor  # (P,) zeros when not standardising
    x_scale: torch.Tensor  # (P,) ones when not standardising
    y_mean: torch.Tensor
    y_std: torch.Tensor
    noise_floor: float  # min_variance times the variance of y: the Gaussian experts' noise floor


def check_training_data(
    X: Any, y: Any, family: ExpertFamily, n_experts: int, settings: dict[str, Any], sample_weight: Any = None
) -> TrainingData:
    """Check the training data of ``n_experts`` experts of ``family`` and fit the scales on them.

    ``settings``: the model's ``dtype``, ``device``, ``standardize`` and ``min_variance``. Refuses data with
    no more rows than free parameters (naming ``X``; with ``sample_weight``, rows of positive weight). With
    ``sample_weight`` (checked: one finite, non-negative weight per row, ``n_experts`` of them positive) the
    scales are weighted as frequencies: an integer weight counts as that many copies of the row (weights all one
    give the unweighted scales, bit for bit).

    Examples
    --------
    >>> from ppmix.components.registry import expert_family_from
    >>> settings = {"dtype": torch.float64, "device": torch.device("cpu"), "standardize": True, "min_variance": 0.0}
    >>> x, y = [[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0]], [0, 1, 0, 1, 0, 1, 0, 1]
    >>> data = check_training_data(x, y, expert_family_from("logistic"), 2, settings, [0, 1, 1, 1, 1, 1, 1, 3])
    >>> round(data.x_mean.item(), 6), round(data.y_mean.item(), 6)  # the mean of rows 1..6 and row 7 thrice
    (4.666667, 0.666667)
    """
    x, names = check_matrix(X, "X", dtype=settings["dtype"], device=settings["device"])
    response = check_response(y, x.shape[0], family).to(dtype=settings["dtype"], device=settings["device"])
    weight = None
    if sample_weight is not None:
        units = {"dtype": settings["dtype"], "device": settings["device"], "min_positive": n_experts}
        weight = check_sample_weight(sample_weight, x.shape[0], "row", **units)
    k, p = n_experts, int(x.shape[1])
    n_classes = int(response.max()) + 1 if family.target_kind == "categorical" and response.numel() else None
    n_parameters = (k - 1) * (p + 1) + family.n_parameters(k, p, n_classes)
    n_rows = x.shape[0] if weight is None else int(torch.count_nonzero(weight))
    if n_rows <= n_parameters:
        rows = f"{n_rows} rows" if weight is None else f"{n_rows} rows of positive sample_weight"
        raise InvalidDataError(
            f"X has {rows} (n_samples={n_rows}), not more than the {n_parameters} free "
            f"parameters of a {k}-expert {family.name} MoE with {p} features"
        )
    if weight is not None and bool((weight == 1).all()):  # no weights: the unweighted scales, bit for bit
        weight = None
    if settings["standardize"]:
        x_mean, x_scale = feature_scales(x, weight)
    else:
        x_mean, x_scale = torch.zeros_like(x[0]), torch.ones_like(x[0])
    y_mean, y_std = response_scales(response, weight)
    return TrainingData(x, response, names, x_mean, x_scale, y_mean, y_std, settings["min_variance"] * float(y_std**2))


#: the (coefficients, intercepts) pairs of the linear parameters in ``MixtureOfExperts._get_globals()``
_LINEAR_PAIRS = (("gate_coef", "gate_intercept"), ("coef", "intercept"))


def unstandardised(values: dict[str, torch.Tensor], mean: torch.Tensor, scale: torch.Tensor) -> dict[str, Any]:
    """Parameters on covariates standardised by ``mean`` and ``scale`` re-expressed on the user's scale."""
    values = dict(values)
    for coef, intercept in _LINEAR_PAIRS:
        user = values[coef] / scale
        values[coef], values[intercept] = user, values[intercept] - user @ mean
    return values


def restandardised(values: dict[str, torch.Tensor], mean: torch.Tensor, scale: torch.Tensor) -> dict[str, Any]:
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
