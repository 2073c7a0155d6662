"""The batches of ``K`` components that every model and optimizer talks to.

:class:`ParameterBatch` holds ``K`` components' parameter tensors (leading dimension ``K``) and gives
them ``state_dict``/``load_state_dict``, ``to``, ``clone`` and their count, device and dtype: the
base of every batch (label components, experts, gates, views of missing entries).
:class:`ComponentFamily` is the fitted components of a density family
(:class:`~ppmix.components.family.DensityFamily`): it declares, abstract, the five members such a
family must write. The generative models, the EM engine, PRESTO, Regularized Weighting and the OT
aggregation all talk to components only through them, so a family written once works everywhere.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, NamedTuple

import torch

from ppmix.ops.logspace import normalize_log_joint_

__all__ = ["ComponentFamily", "Moments", "ParameterBatch"]


class Moments(NamedTuple):
    """The first two moments of ``K`` components (:meth:`ComponentFamily.moments`).

    Attributes
    ----------
    mean : Tensor (K, D)
        Each component's mean.
    covariance : Tensor or None
        Each component's covariance: ``(K, D)`` variances for independent features, ``(K, D, D)`` otherwise; None
        where the family does not define it.

    Examples
    --------
    >>> import torch
    >>> Moments(torch.zeros(2, 3), torch.ones(2, 3)).covariance.shape
    torch.Size([2, 3])
    """

    mean: torch.Tensor
    covariance: torch.Tensor | None


class ParameterBatch:
    """Base of every batch of ``K`` components of one kind: parameter access and persistence.

    Subclasses list their parameter tensors in ``param_names`` (each with leading dimension ``K``, set as
    attributes of the same names by the constructor, which takes them as keywords of the same names); the base
    supplies ``n_components``, ``device``, ``dtype``, ``state_dict``/``load_state_dict``, ``to(device, dtype)``
    and ``clone``.

    Examples
    --------
    >>> import torch
    >>> from ppmix.components import DiagGaussian
    >>> comp = DiagGaussian(torch.zeros(2, 3), torch.ones(2, 3))
    >>> comp.n_components, sorted(comp.state_dict())
    (2, ['loc', 'scale'])
    """

    param_names: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ access
    @property
    def n_components(self) -> int:
        """Number of components ``K`` (leading dimension of every parameter)."""
        return int(getattr(self, self.param_names[0]).shape[0])

    @property
    def device(self) -> torch.device:
        return getattr(self, self.param_names[0]).device

    @property
    def dtype(self) -> torch.dtype:
        return getattr(self, self.param_names[0]).dtype

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters as a dict of detached tensors (a copy)."""
        return {name: getattr(self, name).detach().clone() for name in self.param_names}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> "ParameterBatch":
        """Set parameters from ``state`` (as returned by :meth:`state_dict`)."""
        missing = set(self.param_names) - set(state)
        if missing:
            raise ValueError(f"state is missing parameters {sorted(missing)} for {type(self).__name__}")
        for name in self.param_names:
            current = getattr(self, name)
            value = torch.as_tensor(state[name])
            if value.shape != current.shape:
                raise ValueError(f"state[{name!r}] has shape {tuple(value.shape)}, expected {tuple(current.shape)}")
            setattr(self, name, value.to(device=current.device, dtype=current.dtype).clone())
        return self

    def to(self, device: Any = None, dtype: torch.dtype | None = None) -> "ParameterBatch":
        """Move every parameter to ``device`` and/or ``dtype`` (in place); returns self."""
        for name in self.param_names:
            value = getattr(self, name)
            target_dtype = dtype if (dtype is not None and value.is_floating_point()) else value.dtype
            setattr(self, name, value.to(device=device, dtype=target_dtype))
        return self

    def clone(self) -> "ParameterBatch":
        """An independent copy with the same parameters."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for name in self.param_names:
            setattr(new, name, getattr(self, name).detach().clone())
        return new

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}={tuple(getattr(self, n).shape)}" for n in self.param_names)
        return f"{type(self).__name__}({shapes})"

    def _check_weights(self, weights: torch.Tensor, n: int) -> torch.Tensor:
        """Validate a responsibility/weight matrix against ``n`` points."""
        if not isinstance(weights, torch.Tensor):
            weights = torch.as_tensor(weights)
        weights = weights.to(device=self.device, dtype=self.dtype)
        if weights.shape != (n, self.n_components):
            raise ValueError(
                f"weights must have shape (n_samples, n_components) = ({n}, {self.n_components}); "
                f"got {tuple(weights.shape)}"
            )
        # two reductions, no (N, K) temporaries: NaN fails the minimum's test, +inf the sum's
        total = weights.sum(dtype=torch.float64)
        if weights.numel() and not (bool(torch.isfinite(total)) and float(weights.amin()) >= 0):
            raise ValueError("weights must be finite and non-negative")
        return weights


class ComponentFamily(ParameterBatch, abc.ABC):
    """The ``K`` fitted components of a :class:`~ppmix.components.family.DensityFamily`: what the structures
    (mixture, HMM), EM, the Pyro programs and sampling ask of them.

    With :class:`~ppmix.components.family.DensityFamily` this declares the family contract: the members listed in
    ``__contract__`` (here) and ``DensityFamily.__contract__`` (the family's), nothing else. A family writes the
    five abstract members here; the others have documented defaults. :class:`ParameterBatch`'s members (parameter
    access and persistence, by ``param_names``) are machinery: a family declares ``param_names`` and never
    overrides them.

    Required (abstract):

    - :meth:`log_prob` ``(data) -> (N, K)``: every row's log-density under every component;
    - :meth:`statistics` ``(data, weights)``: the weighted sufficient statistics (a
      :class:`~ppmix.components.family.Statistics` with ``counts``, the total weight per component);
    - :meth:`fit_statistics` ``(stats)``: the weighted MLE from them, in place;
    - :meth:`pyro_dist` ``(index)``: the ``pyro.distributions`` object of the components at ``index``;
    - :meth:`sample` ``(index, generator)``: one draw per entry of ``index``.

    Optional: :meth:`moments` (a structure's ``means_``/``covariances_``) and :meth:`observed` (rows with missing
    entries). Closed-form divergences between components are no member: they are registered by pairs of classes
    (:func:`~ppmix.components.divergence.register_kl`). The Gaussians' fused E-step (``_expected_statistics``, with
    ``_scored`` and ``_statistics_given``) is a private fast path, not part of the contract: its default is the
    definition, which :func:`~ppmix.components.family_tools.mixture_statistics` runs.

    Examples
    --------
    >>> import torch
    >>> from ppmix.components.poisson import PoissonComponents
    >>> comp = PoissonComponents(torch.tensor([[1.0], [4.0]], dtype=torch.float64))
    >>> comp.log_prob(torch.tensor([[2.0]], dtype=torch.float64)).shape
    torch.Size([1, 2])
    >>> class Incomplete(ComponentFamily):
    ...     param_names = ("rate",)
    >>> Incomplete()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: Can't instantiate abstract class Incomplete with abstract methods fit_statistics, log_prob, ...
    """

    #: the members of the contract on the components (the rest is on the family's class)
    __contract__: ClassVar[tuple[str, ...]] = (
        "log_prob",
        "statistics",
        "fit_statistics",
        "pyro_dist",
        "sample",
        "moments",
        "observed",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kl" in vars(cls):  # a member before issue 50: refused, not silently ignored
            raise TypeError(
                f"{cls.__name__} defines 'kl', which is no longer a member of the family contract: register the "
                "divergence with ppmix.components.register_kl"
            )

    # ----------------------------------------------------------------- required
    @abc.abstractmethod
    def log_prob(self, data: Any) -> torch.Tensor:
        """Every row's log-density under every component, ``(N, K)``; ``data`` as the family's ``prepare`` gives
        it."""

    @abc.abstractmethod
    def statistics(self, data: Any, weights: torch.Tensor) -> Any:
        """The weighted sufficient statistics of the rows under ``weights`` ``(N, K)``: a
        :class:`~ppmix.components.family.Statistics` whose ``counts`` ``(K,)`` is each component's total weight."""

    @abc.abstractmethod
    def fit_statistics(self, stats: Any) -> "ComponentFamily":
        """The weighted MLE from :meth:`statistics` (merged over shards, scaled by online EM), in place; returns
        self."""

    @abc.abstractmethod
    def pyro_dist(self, index: torch.Tensor | None = None) -> Any:
        """The ``pyro.distributions`` object of the components at ``index`` (all of them for None), with event
        shape one row."""

    @abc.abstractmethod
    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One draw from component ``index[n]`` for every ``n``, ``(N, D)``."""

    # ----------------------------------------------------------------- optional
    def moments(self) -> "Moments":
        """Each component's mean ``(K, D)`` and covariance (``(K, D)`` variances for independent features, else
        ``(K, D, D)``; None where the family has none), a structure's ``means_`` and ``covariances_``; default: a
        ``TypeError`` naming the class."""
        raise TypeError(f"{type(self).__name__} does not define its components' moments")

    def observed(self) -> "ParameterBatch | None":
        """These components seen through the observed entries of rows with missing entries (NaN, missing at
        random): a view whose ``log_prob`` is each row's marginal density of its observed entries, whose
        ``statistics`` and ``fit_statistics`` make EM's M-step exact on them, and whose ``imputed(resp, x)`` gives
        the missing entries' conditional means in the rows ``x`` under posterior probabilities ``resp`` ``(N, K)``;
        None where the family offers none (default; the Gaussians have their own path,
        :mod:`ppmix.components.gaussian_missing`)."""
        return None

    # ------------------------------------------------- private fast path (not the contract)
    def _expected_statistics(
        self, data: Any, log_weights: torch.Tensor, row_weights: torch.Tensor | None = None
    ) -> tuple[Any, torch.Tensor]:
        """The E-step of a mixture of these components for families with ``log_prob`` and ``statistics``:
        ``statistics(data, r)`` under the responsibilities ``r_nk ∝ weights_k p_k(x_n)`` and the
        log-likelihood ``sum_n log sum_k weights_k p_k(x_n)`` (``log_weights`` the log mixing weights ``(K,)``).
        With ``row_weights`` ``(N,)`` (``sample_weight``) row ``n`` counts ``row_weights[n]`` times: its
        responsibilities and its log-likelihood are multiplied by its weight.

        This is the definition, in two passes (log-densities, then statistics, sharing what
        :meth:`_scored` computes for both); families with a fused single pass (the Gaussians) override it and
        fall back to it where their rounding calls for it.
        """
        log_prob, shared = self._scored(data)
        resp, log_norm = normalize_log_joint_(log_prob.add_(log_weights.to(dtype=self.dtype, device=self.device)))
        if row_weights is None:
            return self._statistics_given(data, resp, shared), log_norm.sum()
        row_weights = row_weights.to(dtype=self.dtype, device=self.device)
        stats = self._statistics_given(data, resp.mul_(row_weights[:, None]), shared)
        return stats, log_norm.reshape(-1) @ row_weights

    def _scored(self, data: Any) -> tuple[torch.Tensor, Any]:
        """``log_prob(data)`` (a fresh tensor) and whatever of its work :meth:`statistics` can reuse (default:
        nothing): the hook of the two-pass E-step."""
        return self.log_prob(data), None

    def _statistics_given(self, data: Any, weights: torch.Tensor, shared: Any) -> Any:
        """``statistics(data, weights)``, given what :meth:`_scored` shared (default: recomputed)."""
        return self.statistics(data, weights)
