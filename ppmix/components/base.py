"""The protocol every component family follows.

A component family is a batch of ``K`` components of one kind whose parameters are
tensors with leading dimension ``K``. The generative models, the EM engine, PRESTO,
Regularized Weighting and the OT aggregation all talk to components only through
this small protocol, so a family written once works everywhere.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ppmix.ops.logspace import normalize_log_joint_

__all__ = ["ComponentFamily"]


class ComponentFamily:
    """Base class of a batch of ``K`` components of one kind.

    Subclasses list their parameter tensors in ``param_names`` (each with leading
    dimension ``K``) and implement

    - ``log_prob(data) -> Tensor[N, K]``: per-point, per-component log-likelihood;
    - ``fit(data, weights: Tensor[N, K])``: weighted maximum likelihood, in place;
    - ``pyro_dist(index)``: the ``pyro.distributions`` object for use in a model;
    - ``sample(index)``: draws, one per entry of ``index``;
    - ``kl(other)``: pairwise KL divergences, where a closed form exists.

    The base class supplies parameter access, ``state_dict``/``load_state_dict``,
    ``to(device, dtype)`` and ``clone``.

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

    @property
    def mean(self) -> torch.Tensor:
        """Each component's mean, ``(K, D)``."""
        raise NotImplementedError(f"{type(self).__name__} does not define its components' means")

    @property
    def covariance(self) -> torch.Tensor:
        """Each component's covariance: ``(K, D)`` variances for independent features, else ``(K, D, D)``."""
        raise NotImplementedError(f"{type(self).__name__} does not define its components' covariances")

    def observed(self) -> "ComponentFamily | None":
        """These components seen through the observed entries of rows with missing entries (NaN, missing at
        random): a view whose ``log_prob`` is each row's marginal density of its observed entries, whose
        ``statistics`` and ``fit_statistics`` make EM's M-step exact on them, and whose ``imputed(resp, x)`` gives
        the missing entries' conditional means in the rows ``x`` under posterior probabilities ``resp`` ``(N, K)``;
        None where the family offers none (default; the Gaussians have their own path,
        :mod:`ppmix.components.gaussian_missing`)."""
        return None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters as a dict of detached tensors (a copy)."""
        return {name: getattr(self, name).detach().clone() for name in self.param_names}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> "ComponentFamily":
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

    def to(self, device: Any = None, dtype: torch.dtype | None = None) -> "ComponentFamily":
        """Move every parameter to ``device`` and/or ``dtype`` (in place); returns self."""
        for name in self.param_names:
            value = getattr(self, name)
            target_dtype = dtype if (dtype is not None and value.is_floating_point()) else value.dtype
            setattr(self, name, value.to(device=device, dtype=target_dtype))
        return self

    def clone(self) -> "ComponentFamily":
        """An independent copy with the same parameters."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for name in self.param_names:
            setattr(new, name, getattr(self, name).detach().clone())
        return new

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}={tuple(getattr(self, n).shape)}" for n in self.param_names)
        return f"{type(self).__name__}({shapes})"

    # ----------------------------------------------------------------- helpers
    def expected_statistics(
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
