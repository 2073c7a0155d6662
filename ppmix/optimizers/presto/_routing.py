"""PRESTO's router, which predicts the part of new points: fitting it on a partition (a softmax gate or
a user classifier), its routing probabilities, and the tensors that save and restore a softmax router.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch

from ppmix._validation import as_numpy
from ppmix.components import SoftmaxGate
from ppmix.optimizers.persist import load_object_tensors, object_tensors

__all__ = ["fit_router", "load_router", "router_cost", "router_costs", "router_tensors", "routing_proba"]


def _softmax_router(k: int, p: int, ridge: float, device: torch.device) -> SoftmaxGate:
    return SoftmaxGate(torch.zeros(k, p, dtype=torch.float64, device=device), ridge=ridge)


def fit_router(
    router: Any,
    ridge: float,
    x: torch.Tensor,
    onehot: torch.Tensor,
    partition: np.ndarray,
    weight: torch.Tensor | None = None,
) -> Any:
    """Fit PRESTO's ``router`` (``"softmax"`` with ``ridge``, or a classifier, which is cloned) on a partition.

    With row ``weight`` (``sample_weight``) ``onehot`` holds the rows' weights (:func:`~.assignment.partition_onehot`),
    the softmax router's targets, and a classifier is fitted with ``sample_weight=weight``."""
    if isinstance(router, str):
        if router != "softmax":
            raise ValueError(f"router must be 'softmax' or a classifier object; got {router!r}")
        return _softmax_router(onehot.shape[1], x.shape[1], ridge, x.device).fit(x, onehot)
    if not (callable(getattr(router, "fit", None)) and callable(getattr(router, "predict_proba", None))):
        raise TypeError("router must be 'softmax' or an object with fit(X, labels) and predict_proba(X)")
    try:
        from sklearn.base import clone

        fitted = clone(router)
    except (ImportError, TypeError):
        fitted = copy.deepcopy(router)
    if weight is None:
        fitted.fit(as_numpy(x), partition)  # scikit-learn routers run on the CPU
    else:
        fitted.fit(as_numpy(x), partition, sample_weight=as_numpy(weight))
    return fitted


def routing_proba(router: Any, x: torch.Tensor, k: int) -> torch.Tensor:
    """Probability of each of the ``k`` parts for every row of ``x`` under a fitted router, shape (N, k)."""
    if isinstance(router, SoftmaxGate):
        return router.log_prob(x).exp()
    proba = torch.as_tensor(np.asarray(router.predict_proba(as_numpy(x))), dtype=torch.float64, device=x.device)
    classes = np.asarray(getattr(router, "classes_", np.arange(proba.shape[1]))).astype(np.int64)
    full = torch.zeros(x.shape[0], k, dtype=torch.float64, device=x.device)
    full[:, torch.as_tensor(classes, device=x.device)] = proba
    return full


def router_costs(
    router: Any, ridge: float, x: torch.Tensor, onehot: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """``-log pi_phi(k | x_i)`` of the ``router`` fitted on the partition ``onehot`` (rows weighted by ``weight``),
    shape (N, K).

    The router term of ``PRESTO(router_weight=mu)``: fitting the router minimises
    ``sum_i -log pi_phi(part_i | x_i)`` over ``phi`` (plus its ridge), and with ``phi`` fixed
    the term is modular in the partition, so it adds to every pair's score.

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([[-2.0], [-1.0], [1.0], [2.0]], dtype=torch.float64)
    >>> onehot = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    >>> costs = router_costs("softmax", 1e-2, x, onehot)
    >>> costs.shape, bool((costs.argmin(1) == onehot.argmax(1)).all())
    (torch.Size([4, 2]), True)
    """
    fitted = fit_router(router, ridge, x, onehot, as_numpy(onehot.argmax(1)), weight)
    return -routing_proba(fitted, x, onehot.shape[1]).clamp_min(torch.finfo(torch.float64).tiny).log()


def router_cost(
    router: Any, ridge: float, weight: float, x: torch.Tensor, sample_weight: torch.Tensor | None = None
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The router term of ``PRESTO(router_weight=weight)`` for :func:`~._mm.mm_sweep`: a function of a partition
    giving ``weight * router_costs(...)`` (per row: the sweep weighs rows by their ``sample_weight``); ``None``
    for ``weight = 0`` (the paper's algorithm)."""
    if not weight:
        return None
    return lambda onehot: weight * router_costs(router, ridge, x, onehot, sample_weight)


def router_tensors(router: Any) -> dict[str, torch.Tensor]:
    """The tensors that save a softmax router; a custom router cannot be saved safely (``TypeError``)."""
    if not isinstance(router, SoftmaxGate):
        raise TypeError(
            f"a PRESTO with a custom router ({type(router).__name__}) cannot be saved safely; "
            "use router='softmax' or save the router yourself"
        )
    return object_tensors(router, "router")


def router_state_shapes(k: int, p: int) -> dict[str, tuple[int, ...]]:
    """The shapes of the tensors :func:`router_tensors` writes for a softmax router of ``k`` parts on ``p`` features."""
    return {name: tuple(v.shape) for name, v in router_tensors(_softmax_router(k, p, 0.0, torch.device("cpu"))).items()}


def load_router(tensors: dict[str, torch.Tensor], k: int, p: int, ridge: float, device: torch.device) -> SoftmaxGate:
    """The softmax router saved by :func:`router_tensors`, on ``device``."""
    gate = _softmax_router(k, p, ridge, device)
    load_object_tensors(gate, tensors, "router")
    return gate
