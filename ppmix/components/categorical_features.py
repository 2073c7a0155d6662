"""The categorical family: ``K`` components over ``D`` independent categorical features,
``x_d ~ Categorical(probs_kd)``.

Each feature holds an integer level code in ``0..C-1``. A mixture of them is latent class analysis of
survey-like answers; an HMM of them has multivariate categorical emissions. The number of levels ``C`` is the
family's ``n_levels``, or measured on the training data (``max + 1``) and recorded by the model with its data
scale (:meth:`CategoricalFamily.measured` fills it in). The rows are one-hot encoded once per fit
(:class:`LevelCodes`), so the log-densities are one GEMM. Registered in :mod:`ppmix.components.registry` as
``"categorical"`` (the label family of the pf models is :class:`~ppmix.components.CategoricalLabel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import InvalidDataError
from ppmix.components.base import ComponentFamily
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    MeanStatisticsComponents,
    PriorKey,
    SiteSpec,
    WeightedSums,
    posterior_mode,
)
from ppmix.components.independent import IndependentFeatures

__all__ = ["CategoricalComponents", "CategoricalFamily", "LevelCodes"]


@dataclass
class LevelCodes:
    """Level codes ``codes`` ``(N, D)`` with their one-hot encoding ``one_hot`` ``(N, D * C)`` (feature-major)."""

    codes: torch.Tensor
    one_hot: torch.Tensor

    @classmethod
    def encode(cls, codes: torch.Tensor, n_levels: int, name: str = "X") -> "LevelCodes":
        """One-hot encode ``codes`` on ``n_levels`` levels, refusing a code ``>= n_levels`` (naming ``name``).

        Examples
        --------
        >>> LevelCodes.encode(torch.tensor([[0.0, 2.0]]), 3).one_hot.tolist()
        [[1.0, 0.0, 0.0, 0.0, 0.0, 1.0]]
        """
        if codes.numel() and int(codes.max()) >= n_levels:
            raise InvalidDataError(
                f"{name} holds the level code {int(codes.max())}, but the categorical components have {n_levels} "
                f"levels (codes 0..{n_levels - 1})"
            )
        one_hot = torch.nn.functional.one_hot(codes.long(), n_levels).to(codes.dtype)
        return cls(codes, one_hot.reshape(codes.shape[0], -1))


class CategoricalComponents(IndependentFeatures, MeanStatisticsComponents):
    """``K`` components of independent categorical features with level probabilities ``probs`` ``(K, D, C)``.

    Parameters
    ----------
    probs : Tensor (K, D, C)
        Each ``probs[k, d]`` on the simplex.
    floor : float, default 1e-4
        The weighted MLE gives every level a probability of at least about ``floor`` (floored, then
        renormalised), so a level unseen in a component keeps a finite log-density.

    Examples
    --------
    >>> comp = CategoricalComponents(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]], dtype=torch.float64))
    >>> comp.log_prob(torch.tensor([[1.0, 0.0]], dtype=torch.float64)).exp()
    tensor([[0.4500]], dtype=torch.float64)
    """

    param_names = ("probs",)

    def __init__(self, probs: torch.Tensor, floor: float = 1e-4) -> None:
        probs = torch.as_tensor(probs)
        if probs.dim() != 3:
            raise ValueError(f"probs must have shape (K, D, C); got {tuple(probs.shape)}")
        if not bool((probs >= 0).all()):
            raise ValueError("probs must be non-negative")
        self.probs, self.floor = probs, float(floor)

    @property
    def n_levels(self) -> int:
        return int(self.probs.shape[-1])

    @property
    def mean(self) -> torch.Tensor:
        """The expected level code ``sum_c c probs_kdc`` ``(K, D)``."""
        return self.probs @ torch.arange(self.n_levels, dtype=self.dtype, device=self.device)

    @property
    def covariance(self) -> torch.Tensor:
        """The variance of the level code ``(K, D)``."""
        levels = torch.arange(self.n_levels, dtype=self.dtype, device=self.device)
        return self.probs @ levels**2 - self.mean**2

    def imputed(self, resp: torch.Tensor) -> torch.Tensor:
        """Each row's most probable level of every feature under the mixture of the components' level probabilities
        with the row's posterior probabilities ``resp`` ``(N, K)``, ``(N, D)`` (a level, not an expected code)."""
        return torch.einsum("nk,kdc->ndc", resp.to(self.dtype), self.probs).argmax(-1).to(self.dtype)

    def _one_hot(self, data: Any) -> torch.Tensor:
        """The ``(N, D * C)`` one-hot rows of ``data`` (prepared :class:`LevelCodes`, re-encoded if they were
        prepared for another number of levels, or raw codes)."""
        if isinstance(data, LevelCodes):
            if data.one_hot.shape[1] == data.codes.shape[1] * self.n_levels:
                return data.one_hot.to(self.dtype)
            data = data.codes
        return LevelCodes.encode(data.to(self.dtype), self.n_levels).one_hot

    def log_prob(self, data: Any) -> torch.Tensor:
        """``sum_d log probs_k,d,x_d``, ``(N, K)``: one GEMM of the one-hot rows with the log-probabilities (a
        probability of 0 taken as the smallest positive number, so no ``0 * inf`` appears)."""
        log_probs = self.probs.clamp_min(torch.finfo(self.dtype).tiny).log()
        return self._one_hot(data) @ log_probs.reshape(self.n_components, -1).T

    def statistics(self, data: Any, weights: torch.Tensor) -> WeightedSums:
        """The total weights ``(K,)`` and the weighted level counts ``(K, D * C)``."""
        return super().statistics(self._one_hot(data), weights)

    def fit_statistics(self, stats: WeightedSums) -> "CategoricalComponents":
        """The weighted MLE ``probs_kdc = sum_n r_nk [x_nd = c] / sum_n r_nk``, floored at ``floor`` and
        renormalised (uniform for a component without weight); in place."""
        k, c = self.n_components, self.n_levels
        frequencies = self.weighted_means(stats).reshape(k, -1, c)
        frequencies = torch.where(stats.counts.to(self.dtype)[:, None, None] > 0, frequencies, 1.0 / c)
        floored = frequencies.clamp_min(self.floor)
        self.probs = floored / floored.sum(-1, keepdim=True)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        probs = self.probs if index is None else self.probs[index]
        return dist.Categorical(probs=probs).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        probs = self.probs[index]
        codes = torch.multinomial(probs.reshape(-1, self.n_levels), 1, generator=generator)
        return codes.reshape(probs.shape[:-1]).to(self.dtype)

    def kl(self, other: "CategoricalComponents") -> torch.Tensor:
        """``KL(self_i || other_j)``, ``(K, K')``: ``sum_d sum_c p log(p / q)``."""
        p, q = self.probs[:, None], other.probs[None, :]
        return torch.xlogy(p, p / q).sum((-1, -2))


class CategoricalFamily(DensityFamily):
    """Categorical components over level-coded features, for the structures (registered as ``"categorical"``).

    Parameters
    ----------
    n_levels : int, optional
        The number of levels ``C`` of every feature (codes ``0..C-1``); None: measured on the training data as
        its largest code plus one, recorded and saved by the model. A row with a code ``>= C`` is refused.
    floor : float, default 1e-4
        The smallest fitted probability of a level (before renormalising). Not much smaller: a level that the
        hard k-means start leaves out of a component gets it, and SVI, which starts from that M-step, moves a
        probability of 1e-10 up too slowly (in its unconstrained coordinates it is 23 units away, not 9).

    Notes
    -----
    The Pyro site is ``probs`` ``(K, D, C)`` (as in ``torch.distributions.Categorical``); under MCMC its prior
    is ``Dirichlet(1, ..., 1)`` (uniform) for every feature. A model's ``priors=`` sets its concentration
    ``probs_concentration`` (default 1: a number, one per level ``(C,)`` or per feature and level ``(D, C)``);
    MAP-EM's probabilities are ``level counts + alpha - 1``, normalised. The ArviZ dimensions are
    ``component``, ``feature`` and ``level``.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import Mixture
    >>> rng = np.random.default_rng(0)
    >>> answers = [rng.choice(3, size=(200, 5), p=p) for p in ([0.8, 0.1, 0.1], [0.1, 0.1, 0.8])]
    >>> mix = Mixture(2, family="categorical", seed=0, progress=False).fit(np.concatenate(answers))
    >>> mix.components_.probs.shape
    torch.Size([2, 5, 3])
    >>> np.round(np.sort(mix.components_.probs[:, :, 0].mean(1).numpy()), 1)
    array([0.1, 0.8])
    """

    name = "categorical"
    #: k-means' hard clusters start softened (:mod:`ppmix.models._starts`):
    #: a level missing from a hard cluster would start at the floor
    start_spread = 0.5
    components_class = CategoricalComponents

    def __init__(self, n_levels: int | None = None, floor: float = 1e-4) -> None:
        self.n_levels, self.floor = n_levels, floor

    def validate(self) -> None:
        if self.n_levels is not None and not (isinstance(self.n_levels, int) and self.n_levels >= 1):
            raise ValueError(f"n_levels must be None or a positive integer; got {self.n_levels!r}")
        if not (isinstance(self.floor, (int, float)) and 0 < self.floor < 1e-2):
            raise ValueError(f"floor must be a number in (0, 0.01); got {self.floor!r}")

    def measured(self, scale: DataScale) -> "CategoricalFamily":
        """This family with ``n_levels`` measured on the training data (``scale["n_levels"]``) where not given."""
        if self.n_levels is not None or "n_levels" not in scale:
            return self
        return type(self)(int(scale["n_levels"]), self.floor)

    def _levels(self) -> int:
        if self.n_levels is None:
            raise ValueError(
                "the categorical family's number of levels is not known yet: pass n_levels, or use the family of a "
                "fitted model (its component_family()) or family.measured(family.data_scale(X))"
            )
        return self.n_levels

    # ---------------------------------------------------------------------- data
    def check_data(self, x: torch.Tensor, name: str = "X") -> None:
        if not bool(((x >= 0) & (x == x.round())).all()):
            raise InvalidDataError(f"{name} must hold level codes (non-negative integers) for the categorical family")
        if self.n_levels is not None and x.numel() and int(x.max()) >= self.n_levels:
            raise InvalidDataError(
                f"{name} holds the level code {int(x.max())}, but the categorical family has n_levels="
                f"{self.n_levels} (codes 0..{self.n_levels - 1})"
            )

    def data_scale(self, x: torch.Tensor, name: str = "X") -> DataScale:
        """``n_levels``: the family's, or the training data's largest code plus one."""
        self.check_data(x, name)
        levels = self.n_levels if self.n_levels is not None else int(x.max()) + 1 if x.numel() else 1
        return {"n_levels": torch.tensor(float(levels), dtype=x.dtype, device=x.device)}

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> LevelCodes:
        """The codes with their one-hot encoding, on the fitted components' levels or, for training data, on
        ``n_levels`` (if not given, the data's largest code plus one: what :meth:`data_scale` measures)."""
        if components is not None:
            levels = components.n_levels  # type: ignore[attr-defined]
        else:
            levels = self.n_levels if self.n_levels is not None else int(x.max()) + 1 if x.numel() else 1
        return LevelCodes.encode(x, levels)

    def rows(self, data: Any) -> torch.Tensor:
        return data.codes if isinstance(data, LevelCodes) else data

    def start_points(self, data: Any) -> torch.Tensor:
        """The one-hot rows: k-means compares answers level by level, not by the codes' order."""
        return data.one_hot if isinstance(data, LevelCodes) else data

    # ----------------------------------------------------------- the components
    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"probs": SiteSpec(constraints.simplex, (d, self._levels()))}

    def site_values(self, components: ComponentFamily) -> dict[str, torch.Tensor]:
        return {"probs": components.state_dict()["probs"]}

    def placeholder(self, k: int, d: int, scale: DataScale, opts: dict) -> ComponentFamily:
        levels = self.measured(scale)._levels()
        return CategoricalComponents(torch.full((k, d, levels), 1.0 / levels, **opts), self.floor)

    def _component_options(self, scale: DataScale) -> dict[str, Any]:
        return {"floor": self.floor}

    def prior_keys(self) -> dict[str, PriorKey]:
        return {
            "probs_concentration": PriorKey("the Dirichlet concentration of the levels (default 1)", "concentration")
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        alpha = self.prior_value("probs_concentration", torch.ones(d, self.measured(scale)._levels(), **opts))
        return dist.Dirichlet(alpha).to_event(1)

    def map_update(self, components: CategoricalComponents, stats: WeightedSums, scale: DataScale) -> None:
        """``probs_kd ∝ level counts + alpha - 1`` under ``Dirichlet(alpha)`` (uniform where that is all zero),
        floored at ``floor`` and renormalised."""
        opts = {"dtype": components.dtype, "device": components.device}
        mode = posterior_mode(self.conjugate_posterior("probs", stats, {}, scale, opts)).to(**opts)
        floored = mode.clamp_min(components.floor)
        components.probs = floored / floored.sum(-1, keepdim=True)

    def conjugate_posterior(
        self, site: str, stats: WeightedSums, values: dict, scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """``probs_kd | rows ~ Dirichlet(alpha + level counts)`` per feature under the prior ``Dirichlet(alpha)``."""
        k, levels = stats.counts.shape[0], self.measured(scale)._levels()
        counts = stats.totals.reshape(k, -1, levels)
        prior = self.prior(site, 1, counts.shape[1], scale, opts).base_dist
        return dist.Dirichlet(prior.concentration + counts)

    def n_parameters(self, k: int, d: int) -> int:
        return k * d * (self._levels() - 1)

    def site_dims(self) -> dict[str, list[str]]:
        return {"probs": ["component", "feature", "level"]}
