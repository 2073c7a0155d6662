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

from typing import Any, ClassVar, Mapping, Protocol, runtime_checkable

import numpy as np
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix.components._linear import LinearPrior
from ppmix.components.base import ComponentFamily
from ppmix.components.family import PriorKey, SiteSpec

__all__ = ["DEFAULT_PRIOR_SCALE", "TARGET_KINDS", "ExpertFamily", "TargetScale"]

#: the default standard deviation of the normal priors a model's ``priors=`` sets on slopes and intercepts
DEFAULT_PRIOR_SCALE = 10.0

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

    # ------------------------------------------------------------ settable priors
    def prior_keys(self) -> dict[str, PriorKey]:
        """The hyperparameters of the experts' priors that a model's ``priors=`` may set, with their defaults."""
        return {
            "slope_scale": PriorKey(f"the prior sd of every expert slope (default {DEFAULT_PRIOR_SCALE:g})"),
            "intercept_scale": PriorKey(f"the prior sd of every expert intercept (default {DEFAULT_PRIOR_SCALE:g})"),
        }

    def linear_prior(self, priors: Mapping[str, float], scale: TargetScale) -> LinearPrior:
        """The normal priors on the slopes (standardised covariates) and intercepts that ``priors`` sets (checked
        numbers; a missing key at its default); default: on the linear predictor's scale, centred at 0."""
        return LinearPrior(
            priors.get("slope_scale", DEFAULT_PRIOR_SCALE), priors.get("intercept_scale", DEFAULT_PRIOR_SCALE)
        )

    def configured_prior(
        self, site: str, k: int, event: tuple[int, ...], priors: Mapping[str, float], scale: TargetScale, opts: dict
    ) -> dist.Distribution:
        """The prior of ``site`` (batch ``(k,)``) under a model's ``priors=``, the one prior that MCMC, MAP-EM (the
        experts' penalty, :meth:`experts` with ``priors``), SVI and ``to_arviz`` use: normal on ``coef`` and
        ``intercept``, as :meth:`linear_prior` says.

        Examples
        --------
        >>> from ppmix.components.registry import expert_family_from
        >>> prior = expert_family_from("logistic").configured_prior("coef", 2, (3,), {"slope_scale": 2.0}, {}, {})
        >>> prior.batch_shape, prior.event_shape, float(prior.base_dist.scale[0, 0])
        (torch.Size([2]), torch.Size([3]), 2.0)
        """
        linear = self.linear_prior(priors, scale)
        loc, sd = {"coef": (0.0, linear.slope_scale), "intercept": (linear.intercept_loc, linear.intercept_scale)}[site]
        return dist.Normal(torch.full((k, *event), float(loc), **opts), sd).to_event(len(event))

    def experts(
        self,
        params: dict[str, torch.Tensor],
        ridge: float,
        newton_steps: int,
        noise_floor: float,
        priors: Mapping[str, float] | None = None,
        scale: TargetScale | None = None,
    ) -> Any:
        """The fitted experts from the values of :meth:`sites`; with ``priors`` (a model's, and the data's
        ``scale``), experts whose fit is the MAP update and whose ``penalty()`` is minus the log density of
        :meth:`configured_prior` up to a constant (``ridge`` then unused)."""
        raise NotImplementedError(f"{type(self).__name__} must define experts(params, ...)")

    def n_parameters(self, k: int, p: int, n_classes: int | None) -> int:
        """Free parameters of ``k`` experts on ``p`` covariates; default: one linear predictor each (``C - 1``
        for a categorical target over ``C`` classes, whose last class is the reference)."""
        rows = (n_classes or 2) - 1 if self.target_kind == "categorical" else 1
        return k * rows * (p + 1)

    def expected_target(self, experts: ComponentFamily, x: torch.Tensor) -> torch.Tensor:
        """``E[y | x, z = k]`` of every expert, ``(N, K)`` (for a binary target: ``P(y = 1 | x, z = k)``)."""
        raise NotImplementedError(f"{type(self).__name__} has no expected target")
