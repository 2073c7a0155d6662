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

from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import InvalidDataError
from ppmix.algorithms.floored_simplex import floored_frequencies
from ppmix.components.base import ComponentFamily, Moments
from ppmix.components.divergence import register_kl
from ppmix.components.family import (
    DataScale,
    DensityFamily,
    FamilyPriors,
    MeanStatisticsComponents,
    PreparedRows,
    PriorKey,
    SiteSpec,
    WeightedSums,
)
from ppmix.components.family_tools import prior_value
from ppmix.components.independent import IndependentFeatures

__all__ = [
    "CategoricalComponents",
    "CategoricalFamily",
    "CategoricalPriors",
    "LevelCodes",
    "distinct_codes",
    "measured_levels",
]

#: a feature's measured levels (its largest code plus one) look like identifiers, not levels, when more than this
#: share of them never occur, and at least ``ID_LIKE_MIN_UNSEEN`` of them
ID_LIKE_UNSEEN_SHARE = 0.5
ID_LIKE_MIN_UNSEEN = 10
#: what to do about codes that are not ``0..C-1``, in the errors
LEVELS_REMEDY = (
    "recode the column to 0..L-1 (e.g. with pandas.factorize or sklearn.preprocessing.OrdinalEncoder), or pass "
    "n_levels to the categorical family (e.g. family={'name': 'categorical', 'n_levels': L}; emission= for an HMM)"
)


def distinct_codes(x: torch.Tensor) -> list[torch.Tensor]:
    """Each feature's distinct level codes (missing entries, NaN, left out), one sorted tensor per column of ``x``.

    Examples
    --------
    >>> [c.tolist() for c in distinct_codes(torch.tensor([[2.0, 0.0], [2.0, float("nan")], [0.0, 5.0]]))]
    [[0.0, 2.0], [0.0, 5.0]]
    """
    return [torch.unique(column[~torch.isnan(column)]) for column in x.T]


def measured_levels(codes: list[torch.Tensor], name: str = "X") -> int:
    """The number of levels measured on data whose features hold the distinct ``codes`` (:func:`distinct_codes`):
    the largest code plus one (1 without any code). A feature whose codes look like identifiers rather than levels
    (of its levels ``0..max``, more than half never occur, and at least 10) is refused with a ``ValueError`` naming
    the column of ``name`` and the remedy (recoding, or ``n_levels``).

    Examples
    --------
    >>> measured_levels([torch.tensor([0.0, 1.0, 2.0]), torch.tensor([3.0])])
    4
    >>> measured_levels([torch.tensor([0.0, 1.0, 2.0, 20000.0])])
    Traceback (most recent call last):
    ...
    ppmix._validation.InvalidDataError: column 0 of X holds the level codes 0..20000 but only 4 distinct ones: ...
    """
    levels = 1
    for d, column in enumerate(codes):
        if not column.numel():
            continue
        largest = int(column.max())
        unseen = largest + 1 - column.numel()
        if unseen > ID_LIKE_UNSEEN_SHARE * (largest + 1) and unseen >= ID_LIKE_MIN_UNSEEN:
            raise InvalidDataError(
                f"column {d} of {name} holds the level codes 0..{largest} but only {column.numel()} distinct ones: "
                f"{unseen} of its {largest + 1} levels never occur, so the codes look like identifiers, not levels "
                f"(the categorical family fits one probability per level 0..{largest}); {LEVELS_REMEDY}"
            )
        levels = max(levels, largest + 1)
    return levels


class LevelCodes(PreparedRows):
    """Level codes ``codes`` ``(N, D)`` on ``n_levels`` levels, with their one-hot encoding ``one_hot``
    ``(N, D * C)`` (feature-major), built on first use (a shard read before the levels of every shard are known is
    encoded once, on the fitted components' levels: :meth:`on_levels`)."""

    def __init__(self, codes: torch.Tensor, n_levels: int) -> None:
        self.codes, self.n_levels = codes, int(n_levels)
        self._one_hot: torch.Tensor | None = None

    @classmethod
    def encode(cls, codes: torch.Tensor, n_levels: int, name: str = "X") -> "LevelCodes":
        """The codes on ``n_levels`` levels, refusing a code ``>= n_levels`` (naming ``name``).

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
        return cls(codes, n_levels)

    @property
    def rows(self) -> torch.Tensor:
        return self.codes

    @property
    def start_points(self) -> torch.Tensor:
        """The one-hot rows: k-means compares answers level by level, not by the codes' order."""
        return self.one_hot

    @property
    def one_hot(self) -> torch.Tensor:
        if self._one_hot is None:
            one_hot = torch.nn.functional.one_hot(self.codes.long(), self.n_levels).to(self.codes.dtype)
            self._one_hot = one_hot.reshape(self.codes.shape[0], -1)
        return self._one_hot

    def on_levels(self, n_levels: int) -> torch.Tensor:
        """The one-hot rows on ``n_levels`` levels: the codes are checked against them and kept on them (encoded
        once, then cached)."""
        if n_levels != self.n_levels:
            self.n_levels, self._one_hot = LevelCodes.encode(self.codes, n_levels).n_levels, None
        return self.one_hot


class CategoricalComponents(IndependentFeatures, MeanStatisticsComponents):
    """``K`` components of independent categorical features with level probabilities ``probs`` ``(K, D, C)``.

    Parameters
    ----------
    probs : Tensor (K, D, C)
        Each ``probs[k, d]`` on the simplex.
    floor : float, default 1e-4
        The M-step gives every level a probability of at least ``floor`` (beyond 10 levels ``10 * floor / C``, so
        the floors of a feature hold at most ``10 * floor`` in all), so a level unseen in a component keeps a
        finite log-density; it is the exact maximiser of the likelihood under that constraint
        (:func:`~ppmix.algorithms.floored_simplex.floored_frequencies`).

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

    def moments(self) -> Moments:
        """The expected level code ``sum_c c probs_kdc`` and its variance ``(K, D)``."""
        levels = torch.arange(self.n_levels, dtype=self.dtype, device=self.device)
        mean = self.probs @ levels
        return Moments(mean, self.probs @ levels**2 - mean**2)

    def imputed(self, resp: torch.Tensor) -> torch.Tensor:
        """Each row's most probable level of every feature under the mixture of the components' level probabilities
        with the row's posterior probabilities ``resp`` ``(N, K)``, ``(N, D)`` (a level, not an expected code)."""
        return torch.einsum("nk,kdc->ndc", resp.to(self.dtype), self.probs).argmax(-1).to(self.dtype)

    def _one_hot(self, data: Any) -> torch.Tensor:
        """The ``(N, D * C)`` one-hot rows of ``data``: prepared :class:`LevelCodes` (re-encoded once if they were
        prepared for another number of levels, e.g. a shard read before the levels of every shard were known), or
        raw codes."""
        codes = data if isinstance(data, LevelCodes) else LevelCodes.encode(data.to(self.dtype), self.n_levels)
        return codes.on_levels(self.n_levels).to(self.dtype)

    def log_prob(self, data: Any) -> torch.Tensor:
        """``sum_d log probs_k,d,x_d``, ``(N, K)``: one GEMM of the one-hot rows with the log-probabilities (a
        probability of 0 taken as the smallest positive number, so no ``0 * inf`` appears)."""
        log_probs = self.probs.clamp_min(torch.finfo(self.dtype).tiny).log()
        return self._one_hot(data) @ log_probs.reshape(self.n_components, -1).T

    def statistics(self, data: Any, weights: torch.Tensor) -> WeightedSums:
        """The total weights ``(K,)`` and the weighted level counts ``(K, D * C)``."""
        return super().statistics(self._one_hot(data), weights)

    def fit_statistics(self, stats: WeightedSums) -> "CategoricalComponents":
        """The weighted MLE ``probs_kd ∝ sum_n r_nk [x_nd = c]`` under the floor (``probs_kdc >= floor``, beyond 10
        levels ``10 * floor / C``: :func:`~ppmix.algorithms.floored_simplex.floored_frequencies`; uniform for a
        component without weight); in place."""
        self.fit_counts(stats.totals.to(self.dtype).reshape(self.n_components, -1, self.n_levels))
        return self

    def fit_counts(self, counts: torch.Tensor) -> "CategoricalComponents":
        """``probs`` the maximiser of ``sum_c counts_kdc log probs_kdc`` under the floor, from level counts
        ``(K, D, C)`` (weighted; or pseudo-counts, MAP-EM's); in place."""
        self.probs = floored_frequencies(counts, self.floor)
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        probs = self.probs if index is None else self.probs[index]
        return dist.Categorical(probs=probs).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        probs = self.probs[index]
        codes = torch.multinomial(probs.reshape(-1, self.n_levels), 1, generator=generator)
        return codes.reshape(probs.shape[:-1]).to(self.dtype)


@register_kl(CategoricalComponents, CategoricalComponents)
def _kl_categorical_components(p: CategoricalComponents, q: CategoricalComponents) -> torch.Tensor:
    """``KL(p_i || q_j)``, ``(K, K')``: ``sum_d sum_c p log(p / q)``."""
    first, second = p.probs[:, None], q.probs[None, :]
    return torch.xlogy(first, first / second).sum((-1, -2))


class CategoricalFamily(DensityFamily):
    """Categorical components over level-coded features, for the structures (registered as ``"categorical"``).

    Parameters
    ----------
    n_levels : int, optional
        The number of levels ``C`` of every feature (codes ``0..C-1``); None: measured on the training data as
        its largest code plus one, recorded and saved by the model (by ``fit_em``, over every shard). Codes that
        look like identifiers (of a feature's levels ``0..max``, more than half and at least 10 never occur) are
        then refused, suggesting a recoding to ``0..L-1`` or ``n_levels``; given ``n_levels`` they are accepted.
        A row with a code ``>= C`` is refused (a later chunk of ``partial_fit``, new data to predict).
    floor : float, default 1e-4
        The smallest fitted probability of a level; beyond 10 levels ``10 * floor / C``, so the floors of a feature
        hold at most ``10 * floor`` in all and the levels that occur keep their frequencies to within that however
        many levels never occur. The M-step is the exact maximiser of the likelihood (MAP-EM: of the posterior)
        under the floor, so EM's objective never decreases. Not much smaller: a level that the hard k-means start
        leaves out of a component gets the floor, and SVI, which starts from that M-step, moves a probability of
        1e-10 up too slowly (in its unconstrained coordinates it is 23 units away, not 9).

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
        self._check_settings()

    def _check_settings(self) -> None:
        """Refuse a bad setting with a ``ValueError`` naming it (the constructor's last step)."""
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
                f"{self.n_levels} (codes 0..{self.n_levels - 1}), given or measured on the training data (the "
                "first chunk of partial_fit); when later data may hold other codes, pass n_levels to the family "
                "(e.g. family={'name': 'categorical', 'n_levels': L}; emission= for an HMM)"
            )

    def _measured_levels(self, x: torch.Tensor, name: str) -> int:
        """``n_levels``, or the levels of the codes ``x`` (:func:`measured_levels`: id-like codes refused)."""
        return self.n_levels if self.n_levels is not None else measured_levels(distinct_codes(x), name)

    def data_scale(self, x: torch.Tensor, name: str = "X") -> DataScale:
        """``n_levels``: the family's, or the training data's largest code plus one (:func:`measured_levels`)."""
        self.check_data(x, name)
        return {"n_levels": torch.tensor(float(self._measured_levels(x, name)), dtype=x.dtype, device=x.device)}

    def prepare(self, x: torch.Tensor, components: ComponentFamily | None = None) -> LevelCodes:
        """The codes (one-hot encoded on first use) on the fitted components' levels or, for training data, on
        ``n_levels`` (if not given, the data's largest code plus one, as :meth:`data_scale` measures, which refuses
        id-like codes before a fit prepares its data)."""
        if components is not None:
            return LevelCodes.encode(x, components.n_levels)  # type: ignore[attr-defined]
        levels = self.n_levels if self.n_levels is not None else int(x.max()) + 1 if x.numel() else 1
        return LevelCodes.encode(x, levels)

    # ----------------------------------------------------------- the components
    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"probs": SiteSpec(constraints.simplex, (d, self._levels()), dims=("feature", "level"))}

    def site_values(self, components: ComponentFamily) -> dict[str, torch.Tensor]:
        return {"probs": components.state_dict()["probs"]}

    def components(self, values: dict[str, torch.Tensor], scale: DataScale) -> CategoricalComponents:
        """The level probabilities of the site values, with the family's floor."""
        return CategoricalComponents(values["probs"], floor=self.floor)

    def priors(self) -> "CategoricalPriors":
        return CategoricalPriors(self)


class CategoricalPriors(FamilyPriors):
    """The priors of :class:`CategoricalFamily` (its :meth:`~CategoricalFamily.priors`)."""

    family: CategoricalFamily

    def keys(self) -> dict[str, PriorKey]:
        return {
            "probs_concentration": PriorKey("the Dirichlet concentration of the levels (default 1)", "concentration")
        }

    def prior(self, site: str, k: int, d: int, scale: DataScale, opts: dict) -> dist.Distribution:
        alpha = prior_value(
            self.family, "probs_concentration", torch.ones(d, self.family.measured(scale)._levels(), **opts)
        )
        return dist.Dirichlet(alpha).to_event(1)

    def map_update(self, components: CategoricalComponents, stats: WeightedSums, scale: DataScale) -> None:
        """``probs_kd ∝ level counts + alpha - 1`` under ``Dirichlet(alpha)`` (uniform where that is all zero): the
        posterior mode under the floor (MAP-EM's objective adds the Dirichlet's log density, so this is its exact
        maximiser)."""
        opts = {"dtype": components.dtype, "device": components.device}
        posterior = self.conjugate_posterior("probs", stats, {}, scale, opts)
        components.fit_counts(posterior.concentration.to(**opts) - 1)

    def conjugate_posterior(
        self, site: str, stats: WeightedSums, values: dict, scale: DataScale, opts: dict
    ) -> dist.Distribution:
        """``probs_kd | rows ~ Dirichlet(alpha + level counts)`` per feature under the prior ``Dirichlet(alpha)``."""
        k, levels = stats.counts.shape[0], self.family.measured(scale)._levels()
        counts = stats.totals.reshape(k, -1, levels)
        prior = self.prior(site, 1, counts.shape[1], scale, opts).base_dist
        return dist.Dirichlet(prior.concentration + counts)
