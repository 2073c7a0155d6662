"""Regression emissions for the HMM: ``x_t | z_t = k, u_t`` an expert of a mixture of experts on the step's inputs.

An HMM with ``emission="linear_regression"`` (``"logistic_regression"``, ``"poisson_regression"``) emits each step's
one response ``x_t`` by the regression of state ``z_t`` on the step's inputs ``u_t`` (dynamax's
``LinearRegressionHMM``, ``LogisticRegressionHMM`` and ``PoissonRegressionHMM``): ``N(u_t^T coef[k] + intercept[k],
scale[k]^2)``, ``Bernoulli(sigmoid(u_t^T coef[k] + intercept[k]))`` or ``Poisson(exp(u_t^T coef[k] +
intercept[k]))``. The experts are those of :class:`~ppmix.models.MixtureOfExperts`
(:data:`~ppmix.components.registry.EXPERT_FAMILIES`): :class:`RegressionFamily` adapts an
:class:`~ppmix.components.expert_family.ExpertFamily` to the density-family protocol the HMM talks to, and
:class:`RegressionComponents` fits the experts (their own weighted regression, with the state posteriors as the
weights) in Baum-Welch's M-step.

The HMM hands the family every step's row ``[u_t, x_t]`` (:meth:`RegressionFamily.input_rows`, from the ``inputs=``
given beside the sequences); the family scores the response given the inputs, never the inputs themselves. The
number of inputs ``P`` is measured on the training rows (:meth:`RegressionFamily.sequence_scale`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar

import numpy as np
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix.components.base import ComponentFamily
from ppmix.components.expert_family import ExpertFamily, TargetScale
from ppmix.components.family import DataScale, DensityFamily, FamilyPriors, PreparedRows, SiteSpec, Statistics
from ppmix.components.registry import expert_family_from

__all__ = [
    "LinearRegressionComponents",
    "LinearRegressionFamily",
    "LogisticRegressionFamily",
    "PoissonRegressionFamily",
    "RegressionComponents",
    "RegressionFamily",
    "RegressionPriors",
    "RegressionRows",
    "WeightedPairs",
]

#: Newton steps of a GLM expert's fit per M-step: enough to converge (the damped Newton stops at its tolerance), so
#: Baum-Welch's M-step is exact and EM monotone
NEWTON_STEPS = 100

#: the floor of a Gaussian expert's noise variance, relative to the training responses' variance
NOISE_FLOOR = 1e-6


@dataclasses.dataclass(frozen=True)
class RegressionRows(PreparedRows):
    """Every step's inputs ``(N, P)`` and response ``(N,)``.

    Examples
    --------
    >>> rows = RegressionRows.split(torch.tensor([[1.0, 2.0, 5.0]]))
    >>> rows.inputs.tolist(), rows.targets.tolist(), rows.rows.tolist()
    ([[1.0, 2.0]], [5.0], [[1.0, 2.0, 5.0]])
    """

    inputs: torch.Tensor
    targets: torch.Tensor

    @classmethod
    def split(cls, rows: torch.Tensor) -> RegressionRows:
        """Rows ``[u_t, x_t]`` ``(N, P + 1)`` as inputs and response."""
        return cls(rows[:, :-1], rows[:, -1])

    @property
    def rows(self) -> torch.Tensor:
        """The rows ``[u_t, x_t]`` (k-means starts on them: states that differ in inputs or response)."""
        return torch.cat([self.inputs, self.targets[:, None]], dim=1)


@dataclasses.dataclass(frozen=True)
class WeightedPairs(Statistics):
    """The rows and their weights ``(N, K)``: what a regression's weighted fit needs (no finite summary serves the
    GLMs' Newton fits); shards merge by stacking their rows, online EM's scaling scales the weights.

    Examples
    --------
    >>> pairs = WeightedPairs(torch.ones(2, 1), torch.zeros(2), torch.full((2, 3), 0.5), torch.ones(3))
    >>> merged = pairs.merge(pairs.scaled(2.0))
    >>> merged.inputs.shape, merged.counts.tolist()
    (torch.Size([4, 1]), [3.0, 3.0, 3.0])
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    weights: torch.Tensor
    counts: torch.Tensor

    def merge(self, other: WeightedPairs) -> WeightedPairs:
        return WeightedPairs(
            torch.cat([self.inputs, other.inputs]),
            torch.cat([self.targets, other.targets]),
            torch.cat([self.weights, other.weights]),
            self.counts + other.counts,
        )

    def scaled(self, factor: float) -> WeightedPairs:
        return WeightedPairs(self.inputs, self.targets, self.weights * factor, self.counts * factor)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> WeightedPairs:
        fields = (self.inputs, self.targets, self.weights, self.counts)
        return WeightedPairs(*(value.to(dtype=dtype, device=device) for value in fields))


class ConditionalRows(dist.TorchDistribution):
    """The density of a row ``[u_t, x_t]`` that the Pyro program scores: the experts' ``p(x_t | u_t)`` (the inputs
    are conditioned on, not modelled).

    Examples
    --------
    >>> from ppmix.components import GaussianExpert
    >>> experts = GaussianExpert(torch.ones(2, 1, dtype=torch.float64))
    >>> d = ConditionalRows(experts, torch.tensor([0, 1]), 2)
    >>> [round(v, 6) for v in d.log_prob(torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)).tolist()]
    [-0.918939, -1.418939]
    """

    arg_constraints: ClassVar[dict] = {}
    support = constraints.real_vector

    def __init__(self, experts: Any, index: torch.Tensor, width: int) -> None:
        self.experts, self.index = experts, index
        super().__init__(index.shape, torch.Size([width]), validate_args=False)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.experts.pyro_dist(self.index, value[..., :-1]).log_prob(value[..., -1])


class RegressionComponents(ComponentFamily):
    """``K`` regressions of a response on the inputs, each an expert of ``expert``'s family (a GLM: ``coef`` ``(K,
    P)``, ``intercept`` ``(K,)``); :class:`LinearRegressionComponents` adds the Gaussian noise ``scale``.

    Parameters
    ----------
    coef, intercept : Tensor
    expert : ExpertFamily or str
        The family of the experts (:data:`~ppmix.components.registry.EXPERT_FAMILIES`).
    ridge : float
        The ridge on the slopes of the experts' weighted fits.
    noise_floor : float, default 1e-8
        The floor of a Gaussian expert's noise variance.

    Examples
    --------
    >>> comp = RegressionComponents(torch.zeros(2, 1, dtype=torch.float64), torch.zeros(2, dtype=torch.float64),
    ...                             expert="poisson", ridge=1e-6)
    >>> rows = RegressionRows.split(torch.tensor([[0.0, 1.0], [1.0, 3.0]], dtype=torch.float64))
    >>> comp.log_prob(rows).shape
    torch.Size([2, 2])
    """

    param_names: ClassVar[tuple[str, ...]] = ("coef", "intercept")

    def __init__(
        self,
        coef: torch.Tensor,
        intercept: torch.Tensor,
        *,
        expert: ExpertFamily | str,
        ridge: float,
        noise_floor: float = 1e-8,
    ) -> None:
        self.coef, self.intercept = torch.as_tensor(coef), torch.as_tensor(intercept)
        self.expert, self.ridge, self.noise_floor = expert_family_from(expert, "expert"), float(ridge), noise_floor

    def experts(self) -> Any:
        """The experts (a :class:`~ppmix.components.GaussianExpert`, ``LogisticExpert``, ...) with these
        parameters, which share their tensors."""
        params = {name: getattr(self, name) for name in self.param_names}
        return self.expert.experts(params, self.ridge, NEWTON_STEPS, self.noise_floor)

    def _pairs(self, data: RegressionRows | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = data if isinstance(data, RegressionRows) else RegressionRows.split(data)
        return rows.inputs.to(self.dtype), rows.targets.to(self.dtype)

    def log_prob(self, data: RegressionRows | torch.Tensor) -> torch.Tensor:
        """``log p(x_t | u_t, z_t = k)`` of every row and state, ``(N, K)``."""
        return self.experts().log_prob(self._pairs(data))

    def statistics(self, data: RegressionRows | torch.Tensor, weights: torch.Tensor) -> WeightedPairs:
        inputs, targets = self._pairs(data)
        weights = self._check_weights(weights, targets.shape[0])
        return WeightedPairs(inputs, targets, weights, weights.sum(0))

    def fit_statistics(self, stats: WeightedPairs) -> RegressionComponents:
        """Every state's expert fitted to the rows weighted by its column of ``stats.weights`` (the expert family's
        own weighted regression: least squares for the Gaussian, damped Newton for the GLMs), in place."""
        stats = stats.to(dtype=self.dtype, device=self.device)
        experts = self.experts().fit((stats.inputs, stats.targets), stats.weights)
        for name in self.param_names:
            setattr(self, name, getattr(experts, name))
        return self

    def penalty(self) -> torch.Tensor:
        """Every state's ridge term ``(K,)`` that :meth:`fit_statistics` subtracts from the weighted log-likelihood
        (the experts' ``penalty()``)."""
        return self.experts().penalty()

    def pyro_dist(self, index: torch.Tensor | None = None) -> ConditionalRows:
        """The states ``index``'s density of rows ``[u_t, x_t]`` (:class:`ConditionalRows`)."""
        index = torch.arange(self.n_components, device=self.device) if index is None else index
        return ConditionalRows(self.experts(), index, self.coef.shape[-1] + 1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Refused: a response is drawn given its inputs (:meth:`sample_given`, which ``HMM.sample(inputs=...)``
        calls)."""
        raise ValueError("regression emissions draw x_t given the step's inputs u_t: call HMM.sample(inputs=...)")

    def sample_given(
        self, index: torch.Tensor, inputs: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """One response ``(N, 1)`` from state ``index[n]``'s expert at the inputs ``inputs[n]``."""
        return self.experts().sample(index, inputs.to(self.dtype), generator=generator)[:, None]


class LinearRegressionComponents(RegressionComponents):
    """Linear-Gaussian regressions: :class:`RegressionComponents` with the noise standard deviations ``scale``
    ``(K,)``.

    Examples
    --------
    >>> comp = LinearRegressionComponents(torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
    ...                                   torch.ones(1, dtype=torch.float64), expert="gaussian", ridge=0.0)
    >>> x = torch.linspace(0, 1, 20, dtype=torch.float64)
    >>> rows = RegressionRows(x[:, None], 2 * x + 1)
    >>> comp.fit_statistics(comp.statistics(rows, torch.ones(20, 1, dtype=torch.float64))).coef.round(decimals=8)
    tensor([[2.]], dtype=torch.float64)
    """

    param_names: ClassVar[tuple[str, ...]] = ("coef", "intercept", "scale")

    def __init__(
        self,
        coef: torch.Tensor,
        intercept: torch.Tensor,
        scale: torch.Tensor,
        *,
        expert: ExpertFamily | str,
        ridge: float,
        noise_floor: float = 1e-8,
    ) -> None:
        super().__init__(coef, intercept, expert=expert, ridge=ridge, noise_floor=noise_floor)
        self.scale = torch.as_tensor(scale)


class RegressionFamily(DensityFamily):
    """Emissions that regress each step's response on its inputs, by the experts of ``expert``'s family:
    ``HMM(K, emission={"name": "regression", "expert": "poisson"})``; the names ``"linear_regression"``,
    ``"logistic_regression"`` and ``"poisson_regression"`` are its Gaussian, logistic and Poisson experts
    (:class:`LinearRegressionFamily`, ...).

    Sites: the experts' (``coef`` ``(P,)``, ``intercept``, and a Gaussian expert's noise ``scale``), with the expert
    family's MCMC priors on the response's scale.

    Parameters
    ----------
    expert : {"gaussian", "logistic", "poisson"} or ExpertFamily, default "gaussian"
    ridge : float, optional
        The ridge on the slopes of every state's weighted fit (default: the expert family's ``default_ridge``).

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import HMM
    >>> rng = np.random.default_rng(0)
    >>> inputs = [rng.normal(size=(60, 1)) for _ in range(5)]
    >>> seqs = [2.0 * u + 0.1 * rng.normal(size=(60, 1)) for u in inputs]
    >>> hmm = HMM(1, emission="linear_regression", seed=0, progress=False).fit(seqs, inputs=inputs)
    >>> round(float(hmm.components_.coef[0, 0]), 1)
    2.0
    """

    name = "regression"
    #: the expert family of a registered name fixed to one (``"linear_regression"``, ...); None: ``expert`` chooses
    fixed_expert: ClassVar[str | None] = None

    def __init__(self, expert: str | ExpertFamily = "gaussian", ridge: float | None = None) -> None:
        self.expert, self.ridge = expert, ridge
        self._n_inputs: int | None = None
        self._check_settings()

    def _check_settings(self) -> None:
        family = self._expert()
        if family.target_kind not in ("real", "binary", "count"):
            raise ValueError(
                f"expert must model one response per step (gaussian, logistic or poisson experts); got {family.name!r}"
            )
        if self.ridge is not None and not (isinstance(self.ridge, (int, float)) and self.ridge >= 0):
            raise ValueError(f"ridge must be a non-negative number or None; got {self.ridge!r}")

    def _expert(self) -> ExpertFamily:
        return expert_family_from(self.expert, "expert")

    @property
    def components_class(self) -> type[RegressionComponents]:  # type: ignore[override]
        """:class:`LinearRegressionComponents` for experts with a noise scale, else :class:`RegressionComponents`."""
        has_scale = "scale" in self._expert().sites(1, 1, None)
        return LinearRegressionComponents if has_scale else RegressionComponents

    def measured(self, scale: DataScale) -> RegressionFamily:
        """The family knowing the number of inputs ``P`` (measured on the training rows: ``scale["n_inputs"]``)."""
        family = copy.copy(self)
        family._n_inputs = int(scale["n_inputs"]) if "n_inputs" in scale else None
        return family

    @property
    def n_inputs(self) -> int:
        if self._n_inputs is None:
            raise ValueError("a regression emission's number of inputs is known once fit(X, inputs=...) has run")
        return self._n_inputs

    # ---------------------------------------------------------------------- data
    def input_rows(self, x: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """What the HMM asks of a family that reads the steps' inputs: every step's row ``[u_t, x_t]`` ``(B, T, P +
        1)`` from the padded sequences ``x`` ``(B, T, 1)`` and inputs ``(B, T, P)``."""
        return torch.cat([inputs.to(x), x], dim=-1)

    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        """One response per step, of values the expert family models (0/1, counts, reals), finite."""
        if x.dim() != 2 or x.shape[1] != 1:
            raise ValueError(
                f"{name} must hold one response per step, (length, 1) arrays, for regression emissions; got "
                f"{x.shape[-1]} features"
            )
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} must be finite for regression emissions")
        self._expert().check_target(x[:, 0].detach().cpu().numpy().astype(np.float64), name)

    def data_scale(self, x: torch.Tensor, name: str = "X", weight: torch.Tensor | None = None) -> DataScale:
        """The responses' (weighted) mean and standard deviation (the experts' priors and noise floor)."""
        y = x[:, 0]
        w = torch.ones_like(y) if weight is None else weight.to(y)
        mean = (w * y).sum() / w.sum()
        std = ((w * (y - mean).square()).sum() / w.sum()).sqrt()
        return {"target_mean": mean, "target_std": std.clamp_min(torch.finfo(y.dtype).eps)}

    def sequence_scale(self, rows: torch.Tensor, weight: torch.Tensor | None = None) -> DataScale:
        """What the HMM measures on the step rows ``[u_t, x_t]``: the number of inputs ``P``."""
        return {"n_inputs": torch.tensor(rows.shape[1] - 1)}

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> RegressionRows:
        """Rows ``[u_t, x_t]`` as :class:`RegressionRows`."""
        return RegressionRows.split(x)

    def _target_scale(self, scale: DataScale) -> TargetScale:
        return {key: scale[f"target_{key}"] for key in ("mean", "std") if f"target_{key}" in scale}

    # ----------------------------------------------------------- the components
    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        """The experts' sites on the ``P`` inputs (``d``, the one response, is not theirs)."""
        return {
            name: SiteSpec(spec.support, spec.event_shape, dims=("input",) if spec.event_shape else None)
            for name, spec in self._expert().sites(k, self.n_inputs, None).items()
        }

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> RegressionComponents:
        """The experts' parameters of the site values (by name), with the expert family, its ridge and the noise
        floor of the responses' spread."""
        expert, std, cls = self._expert(), scale.get("target_std"), self.components_class
        return cls(
            **{name: values[name] for name in cls.param_names},
            expert=expert,
            ridge=expert.default_ridge if self.ridge is None else float(self.ridge),
            noise_floor=1e-8 if std is None else NOISE_FLOOR * float(std) ** 2,
        )

    def priors(self) -> "RegressionPriors":
        return RegressionPriors(self)


class RegressionPriors(FamilyPriors):
    """The priors of :class:`RegressionFamily` (its :meth:`~RegressionFamily.priors`)."""

    family: RegressionFamily

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        """The expert family's MCMC prior of ``site`` (``priors=`` keys: its ``prior_keys``, :meth:`keys`)."""
        spec = self.family.sites(k, d)[site]
        expert, target = self.family._expert(), self.family._target_scale(scale)
        if self.family._prior_settings:
            return expert.configured_prior(site, k, spec.event_shape, self.family._prior_settings, target, opts)
        return expert.prior(site, k, spec.event_shape, target, opts)

    def keys(self) -> dict[str, Any]:
        return self.family._expert().prior_keys()


class LinearRegressionFamily(RegressionFamily):
    """``emission="linear_regression"``: :class:`RegressionFamily` of Gaussian experts, ``x_t | z_t = k, u_t ~
    N(u_t^T coef[k] + intercept[k], scale[k]^2)`` (dynamax's ``LinearRegressionHMM``, one response)."""

    name = "linear_regression"

    def __init__(self, ridge: float | None = None) -> None:
        super().__init__("gaussian", ridge)


class LogisticRegressionFamily(RegressionFamily):
    """``emission="logistic_regression"``: :class:`RegressionFamily` of logistic experts, ``x_t | z_t = k, u_t ~
    Bernoulli(sigmoid(u_t^T coef[k] + intercept[k]))`` for a 0/1 response (dynamax's ``LogisticRegressionHMM``)."""

    name = "logistic_regression"

    def __init__(self, ridge: float | None = None) -> None:
        super().__init__("logistic", ridge)


class PoissonRegressionFamily(RegressionFamily):
    """``emission="poisson_regression"``: :class:`RegressionFamily` of Poisson experts, ``x_t | z_t = k, u_t ~
    Poisson(exp(u_t^T coef[k] + intercept[k]))`` for counts (dynamax's ``PoissonRegressionHMM``)."""

    name = "poisson_regression"

    def __init__(self, ridge: float | None = None) -> None:
        super().__init__("poisson", ridge)
