"""The declared protocol of a *conditional* family, ``y | x``: the experts of a mixture of experts.

As for the density families (:mod:`ppmix.components.family`), two levels: the fitted experts are a
:class:`~ppmix.components.base.ComponentFamily` taking ``(x, y)`` (``log_prob((x, y)) -> (N, K)``, weighted
``fit``, ``pyro_dist(index, x)``, ``sample(index, x)``, ``penalty()``), and an :class:`ExpertFamily` is what
``MixtureOfExperts(expert=...)`` takes: the kind of target it models (``target_kind``), the target values it
accepts, the Pyro sites of its parameters and their MCMC priors, and how to build its fitted experts.
The experts of ppmix are generalised linear models on the (standardised) covariates, so the defaults below
are those of linear experts: sites ``coef`` and ``intercept`` (one row per class for a categorical target).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix.components.base import ComponentFamily
from ppmix.components.family import SiteSpec

__all__ = ["TARGET_KINDS", "ExpertFamily", "TargetScale"]

#: what an expert family can model: real responses, binary labels, class codes, counts
TARGET_KINDS = ("real", "binary", "categorical", "count")

#: the response's mean and standard deviation on the training data (``mean``, ``std``), for priors and floors
TargetScale = dict[str, torch.Tensor]


@runtime_checkable
class ExpertFamily(Protocol):
    """A kind of expert for :class:`~ppmix.models.MixtureOfExperts`: what it asks of one, declared once.

    Attributes
    ----------
    name : str
        The family's name in the registry (:data:`ppmix.components.registry.EXPERT_FAMILIES`).
    target_kind : {"real", "binary", "categorical", "count"}
        What ``y`` is: the mixture of experts is a regressor for ``"real"`` and ``"count"`` targets and a
        classifier (``predict_proba``, ``classes_``) for the others.
    default_ridge : float
        The ridge on the slopes when the model's ``ridge`` is None.

    Examples
    --------
    >>> from ppmix.components.registry import expert_family_from
    >>> family = expert_family_from("gaussian")
    >>> isinstance(family, ExpertFamily), family.target_kind, sorted(family.sites(2, 3, None))
    (True, 'real', ['coef', 'intercept', 'scale'])
    """

    name: ClassVar[str]
    target_kind: ClassVar[str]
    default_ridge: ClassVar[float]

    def config(self) -> dict[str, Any]:
        """The family's settings as JSON-able keyword arguments of its constructor (saved with a model)."""
        return {}

    def check_target(self, y: np.ndarray, name: str = "y") -> None:
        """Refuse target values the family cannot model (``y`` a float64 vector), naming ``name``; default: any."""

    def sites(self, k: int, p: int, n_classes: int | None) -> dict[str, SiteSpec]:
        """The Pyro sites of ``k`` experts on ``p`` covariates (``n_classes`` for a categorical target), in
        sampling order, each in the ``experts`` plate; default: a linear predictor's ``coef``/``intercept``."""
        classes = (n_classes,) if self.target_kind == "categorical" else ()
        return {"coef": SiteSpec(constraints.real, (*classes, p)), "intercept": SiteSpec(constraints.real, classes)}

    def site_dims(self) -> dict[str, list[str]]:
        """ArviZ dimension names of each site (beyond the draws)."""
        if self.target_kind == "categorical":
            return {"coef": ["expert", "class", "feature"], "intercept": ["expert", "class"]}
        return {"coef": ["expert", "feature"], "intercept": ["expert"]}

    def prior(self, site: str, k: int, event: tuple[int, ...], scale: TargetScale, opts: dict) -> dist.Distribution:
        """The weakly informative MCMC prior of ``site`` (batch ``(k,)``), on the standardised covariates;
        default: ``N(0, 10^2)`` on every coefficient and intercept."""
        return dist.Normal(torch.zeros(k, *event, **opts), 10.0).to_event(len(event))

    def experts(self, params: dict[str, torch.Tensor], ridge: float, newton_steps: int, noise_floor: float) -> Any:
        """The fitted experts from the values of :meth:`sites`."""
        raise NotImplementedError(f"{type(self).__name__} must define experts(params, ...)")

    def n_parameters(self, k: int, p: int, n_classes: int | None) -> int:
        """Free parameters of ``k`` experts on ``p`` covariates; default: one linear predictor each (``C - 1``
        for a categorical target over ``C`` classes, whose last class is the reference)."""
        rows = (n_classes or 2) - 1 if self.target_kind == "categorical" else 1
        return k * rows * (p + 1)

    def expected_target(self, experts: ComponentFamily, x: torch.Tensor) -> torch.Tensor:
        """``E[y | x, z = k]`` of every expert, ``(N, K)`` (for a binary target: ``P(y = 1 | x, z = k)``)."""
        raise NotImplementedError(f"{type(self).__name__} has no expected target")
