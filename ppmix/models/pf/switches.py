"""The prediction-focused machinery shared by pf-GMM and pf-HMM (Sharma et al., 2023, §4 and Supplement B).

Every observed frame ``x_n`` (a data point of a mixture, a time step of an HMM) has
per-feature switches ``S_nd ~ Bern(p)``: a switched-on feature is emitted by the
frame's component, a switched-off one by a single background Gaussian. The
variational family ties ``q(S_nd) = Bern(phi_d)`` across frames, so the E-step of the
frame's component uses ``sum_d phi_d log N(x_nd | k)`` and ``phi`` has the closed-form
update of B.2.1. A binary label per frame is emitted by the component
(``Bern(eta_k)``); missing labels (NaN) contribute nothing.

With ``p = 1`` every ``phi_d`` is 1 and the model is the supervised mixture/HMM: one
code path, not a copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.ops.indexing import Vindex

from ppmix._validation import InvalidDataError
from ppmix.components import BernoulliLabel, DiagGaussian
from ppmix.components.gaussian_statistics import GaussianStatistics
from ppmix.models.pf._observed import (
    Frames,
    ObservedStatistics,
    frame_log_prob,
)
from ppmix.ops.scaling import column_variance

__all__ = [
    "FrameLabels",
    "Switches",
    "label_ratio",
    "label_ratio_from_statistics",
    "label_relevant_features",
    "switch_frame_sites",
    "switch_guide",
    "switch_kl_terms",
    "switched_log_joint",
]

#: the guide keeps q(S) strictly inside (0, 1) so Pyro's enumerated ELBO stays finite
_PHI_FLOOR = 1e-12
#: starts of the pf models' EM: label-informed k-means, or those of the Gaussian mixtures
PF_INIT_METHODS = ("relevance", "kmeans", "k-means++", "random")
#: k-means runs behind one pf start: the pf models diversify their starts by restarts of their own
#: (:mod:`~ppmix.models.pf.restarts`), so each start keeps the best of 3 runs, not 10
PF_KMEANS_RUNS = 3
#: p-value of the per-feature label test that selects the features of the "relevance" initialisation
RELEVANCE_P_VALUE = 1e-3


@dataclass
class FrameLabels:
    """Per-frame binary labels with a mask of which are observed (missing rows hold 0)."""

    y: torch.Tensor  # (N,) float in {0, 1}
    observed: torch.Tensor  # (N,) bool

    @property
    def any(self) -> bool:
        return bool(self.observed.any())

    @property
    def all(self) -> bool:
        return bool(self.observed.all())

    @classmethod
    def from_values(cls, y: Any, n: int, dtype: torch.dtype, device: torch.device, *, name: str = "y") -> "FrameLabels":
        """Validate labels: shape ``(n,)``, values in {0, 1}, NaN (or None) for missing."""
        if isinstance(y, torch.Tensor):
            y = y.detach().cpu().numpy()
        elif hasattr(y, "to_numpy"):  # pandas Series / one-column DataFrame
            y = y.to_numpy()
        try:
            values = np.asarray(y, dtype=np.float64)  # None -> NaN
        except (TypeError, ValueError):
            raise TypeError(f"{name} must hold numeric labels 0/1 (NaN for missing)") from None
        if values.ndim == 2 and values.shape[1] == 1:
            values = values[:, 0]
        if values.ndim != 1 or values.shape[0] != n:
            raise InvalidDataError(f"{name} must have shape ({n},) to match X; got {values.shape}")
        observed = ~np.isnan(values)
        if not np.all(np.isin(values[observed], (0.0, 1.0))):
            bad = sorted(set(values[observed].tolist()) - {0.0, 1.0})[:5]
            raise InvalidDataError(f"{name} must hold binary labels 0/1 (NaN for missing); found {bad}")
        if not observed.any():
            raise InvalidDataError(f"{name} has no observed label; pass y=None to fit without labels")
        filled = np.where(observed, values, 0.0)
        return cls(torch.as_tensor(filled, dtype=dtype, device=device), torch.as_tensor(observed, device=device))

    @classmethod
    def missing(cls, n: int, dtype: torch.dtype, device: torch.device) -> "FrameLabels":
        return cls(torch.zeros(n, dtype=dtype, device=device), torch.zeros(n, dtype=torch.bool, device=device))


def switch_kl_terms(phi: torch.Tensor, prior: float) -> torch.Tensor:
    """``E_q[log p(S) - log q(S)]`` of one frame's switches, summed over features (a scalar).

    ``sum_d phi_d log(p / phi_d) + (1 - phi_d) log((1 - p) / (1 - phi_d))``, with ``0 log 0 = 0``.
    """
    p = torch.as_tensor(prior, dtype=phi.dtype, device=phi.device)
    off = 1.0 - phi
    terms = torch.xlogy(phi, p) - torch.xlogy(phi, phi) + torch.xlogy(off, 1.0 - p) - torch.xlogy(off, off)
    return terms.sum()


def switched_log_joint(
    components: DiagGaussian,
    label_family: BernoulliLabel,
    phi: torch.Tensor | None,
    log_prior: torch.Tensor,
    frames: Frames,
    labels: FrameLabels,
) -> torch.Tensor:
    """``log prior_k + E_q(S)[log p(x_n | k, S)]`` (relevant part) ``+ log p(y_n | k)``, ``(N, K)``.

    The switch-weighted component log-density (``phi=None``: every feature on) plus the
    label term where it is observed; differentiable in the families' parameters, so it
    serves the EM E-step and the SVI guide alike. Missing entries of ``frames`` (``missing="marginalize"``) drop
    out (:func:`~ppmix.models.pf._observed.frame_log_prob`).
    """
    log_joint = frame_log_prob(components, frames, phi).add_(log_prior)
    if labels.any:
        log_joint = log_joint + label_family.log_prob(labels.y) * labels.observed[:, None]
    return log_joint


@dataclass(frozen=True)
class Switches:
    """The per-feature switches of a prediction-focused model, a part pf-GMM and pf-HMM both hold: the prior
    ``S_nd ~ Bern(p)``, the variational posterior ``q(S_nd) = Bern(phi_d)`` tied across frames and the background
    Gaussian that emits a switched-off feature. It gives their share of the ELBO, the closed-form update of ``phi``
    (B.2.1), the density of the fitted switches and their Pyro sites.

    Parameters
    ----------
    prior : float
        ``p`` in ``(0, 1]``.
    probs : Tensor (D,)
        ``phi``.
    background : DiagGaussian
        One Gaussian ``(1, D)``.
    all_on : bool
        ``p = 1`` (the supervised model): every ``phi_d`` is 1 and there are no switch sites.

    Examples
    --------
    >>> one = torch.ones(1, 2, dtype=torch.float64)
    >>> part = Switches(0.5, torch.tensor([0.5, 0.5], dtype=torch.float64), DiagGaussian(one, one), all_on=False)
    >>> float(part.objective(10.0))  # phi = p: the switches' KL is zero
    0.0
    """

    prior: float
    probs: torch.Tensor
    background: DiagGaussian
    all_on: bool

    def objective(self, n_frames: float) -> torch.Tensor:
        """``n_frames`` times the switches' ``E_q[log p(S) - log q(S)]``: the part of the ELBO that is not a sum
        over the data's values (added once on the driver of a sharded fit)."""
        return n_frames * switch_kl_terms(self.probs, self.prior)

    def objective_terms(self, frames: Frames, weight: torch.Tensor | None = None) -> torch.Tensor:
        """ELBO terms outside the components: the switched-off features' background log-density of ``frames``
        (their observed entries) and the switches' prior/entropy (every frame counted ``weight`` times, where
        given; a missing entry's switch too)."""
        off = 1.0 - self.probs
        background: torch.Tensor | float = 0.0
        if bool((off > 0).any()):
            log_prob = frame_log_prob(self.background, frames, off)[:, 0]
            background = log_prob.sum() if weight is None else log_prob @ weight.to(log_prob)
        n_frames = frames.x.shape[0] if weight is None else float(weight.sum())
        return background + self.objective(n_frames)

    def updated_probs(
        self, relevant_ll: torch.Tensor, background_ll: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """``phi`` by its closed form (B.2.1): ``sigmoid(logit p + gain_d)``, ``gain_d`` the relevant features'
        log-likelihood ``relevant_ll`` ``(D,)`` over the background's ``background_ll`` per frame (``counts`` the
        components' frame counts); all ones when ``p = 1``."""
        if self.all_on:
            return torch.ones_like(background_ll)
        logit_p = math.log(self.prior) - math.log1p(-self.prior)
        return torch.sigmoid(logit_p + (relevant_ll - background_ll) / counts.sum())

    def mixture_log_prob(
        self,
        components: DiagGaussian,
        x: torch.Tensor,
        features: torch.Tensor,
        switches: str = "map",
        chunk: int = 4096,
    ) -> torch.Tensor:
        """``log prod_{d in features} [s_d N(x_d | k) + (1 - s_d) N(x_d | background)]``, ``(N, K)``.

        ``switches="map"`` takes ``s_d = 1[phi_d > 0.5]`` (the most probable switch
        configuration under ``q(S)``, how the paper scores its fits); ``"mean"`` takes
        ``s_d = phi_d`` (switches drawn from ``q(S)`` per point). Either way the density
        is proper and a product over features, so restricted to some features it is
        exactly the marginal on them (``log p(x_R)``): a missing entry (NaN) drops its factor.
        """
        if switches not in ("map", "mean"):
            raise ValueError(f"switches must be 'map' or 'mean'; got {switches!r}")
        bg = self.background
        loc, scale = components.loc[:, features], components.scale[:, features]
        bg_loc, bg_scale = bg.loc[0, features], bg.scale[0, features]
        phi = self.probs[features]
        if switches == "map":
            phi = (phi > 0.5).to(phi.dtype)
        log_on, log_off = torch.log(phi), torch.log1p(-phi)
        out = []
        for start in range(0, x.shape[0], chunk):
            xs = x[start : start + chunk][:, features]
            missing = torch.isnan(xs)
            xs = torch.where(missing, 0.0, xs)  # scored, then dropped
            on = dist.Normal(loc, scale).log_prob(xs[:, None, :]) + log_on  # (n, K, D)
            off = dist.Normal(bg_loc, bg_scale).log_prob(xs) + log_off  # (n, D)
            out.append(torch.where(missing[:, None, :], 0.0, torch.logaddexp(on, off[:, None, :])).sum(-1))
        return torch.cat(out)


def switch_frame_sites(
    sites: dict,
    z: torch.Tensor,
    x: torch.Tensor,
    labels: FrameLabels | None,
    prior: float | None,
    suffix: str = "",
    features: pyro.plate | None = None,
) -> None:
    """Inside the frame plate (dim -2): the label and, per feature (plate dim -1), switch and value.

    ``z`` is the frame's component (enumerated, shape broadcasting to ``(N, 1)``); ``prior`` is ``p`` (None when
    every feature is relevant: no switch sites). The sites are ``y``, ``s`` and ``x`` followed by ``suffix``; a
    model with several frames per plate entry (an HMM: one per time step) names them apart and passes its one
    ``features`` plate.
    """
    if labels is not None and labels.any:
        with pyro.poutine.mask(mask=labels.observed[:, None]):
            pyro.sample(f"y{suffix}", dist.Bernoulli(sites["label_probs"][z]), obs=labels.y[:, None])
    d = x.shape[-1]
    feature_index = torch.arange(d, device=x.device)
    with features or pyro.plate("features", d, dim=-1):
        loc, scale = Vindex(sites["loc"])[z, feature_index], Vindex(sites["scale"])[z, feature_index]
        if prior is not None:
            on = pyro.sample(f"s{suffix}", dist.Bernoulli(torch.as_tensor(prior, dtype=x.dtype, device=x.device)))
            on = on.bool()
            loc = torch.where(on, loc, sites["bg_loc"])
            scale = torch.where(on, scale, sites["bg_scale"])
        pyro.sample(f"x{suffix}", dist.Normal(loc, scale), obs=x)


def switch_guide(phi: torch.Tensor, suffix: str = "", features: pyro.plate | None = None) -> None:
    """Inside the frame plate: ``q(S_nd) = Bern(phi_d)`` at site ``s{suffix}``, enumerated."""
    with features or pyro.plate("features", phi.shape[0], dim=-1):
        pyro.sample(
            f"s{suffix}",
            dist.Bernoulli(phi.clamp(_PHI_FLOOR, 1.0 - _PHI_FLOOR)),
            infer={"enumerate": "parallel"},
        )


def label_relevant_features(
    x: torch.Tensor, y: torch.Tensor, p_value: float = RELEVANCE_P_VALUE, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Features whose distribution changes with a binary label, ``(D,)`` bool.

    Per feature, twice the log-likelihood ratio of class-conditional Gaussians (own mean
    and variance per class) over one pooled Gaussian (:func:`label_ratio`, rows counted
    ``weight`` times where given) is compared with the ``chi^2_2`` quantile at ``p_value``.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> y = (torch.arange(400) % 2).double()
    >>> x = torch.randn(400, 3, generator=g, dtype=torch.float64)
    >>> x[:, 0] += 3 * y
    >>> label_relevant_features(x, y).tolist()
    [True, False, False]
    """
    from scipy.stats import chi2

    return label_ratio(x, y, weight) > chi2.ppf(1.0 - p_value, df=2)


def label_ratio(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per feature, twice the log-likelihood ratio of class-conditional Gaussians over one pooled Gaussian, ``(D,)``.

    ``x`` ``(N, D)`` and labels ``y`` ``(N,)`` in {0, 1}; a class with fewer than two rows adds nothing.
    With row ``weight`` ``(N,)`` (``sample_weight``) a row counts that many times (the counts are total
    weights and the variances weighted): for integer weights, the ratio of the rows repeated. Where ``x`` has
    missing entries (NaN), each feature's ratio is that of the rows observing it.

    Examples
    --------
    >>> y = torch.tensor([0.0, 0.0, 1.0, 1.0])
    >>> x = torch.tensor([[0.0], [2.0], [4.0], [6.0]])
    >>> round(label_ratio(x, y).item(), 4)  # 4 log 5 - 4 log 1
    6.4378
    >>> rows = [0, 1, 1, 2, 3]  # row 1 twice: weight 2
    >>> bool(torch.isclose(label_ratio(x, y, torch.tensor([1.0, 2.0, 1.0, 1.0])), label_ratio(x[rows], y[rows])))
    True
    """
    observed = ~torch.isnan(x)
    if not bool(observed.all()):  # missing entries (NaN): each feature on the rows that observe it
        columns = [x[o, d : d + 1] for d, o in enumerate(observed.T)]
        return torch.cat(
            [label_ratio(c, y[o], None if weight is None else weight[o]) for c, o in zip(columns, observed.T)]
        )
    if weight is None:
        members = [x[y == c] for c in (0.0, 1.0)]
        classes = [(m.shape[0], column_variance(m) if m.shape[0] > 1 else None) for m in members]
        return _label_ratio(x.shape[0], column_variance(x), classes)
    weight = weight.to(x)
    classes = []
    for c in (0.0, 1.0):
        member_weight = weight * (y == c)
        count = float(member_weight.sum())
        classes.append((count, _weighted_variance(x, member_weight) if count > 1 else None))
    return _label_ratio(float(weight.sum()), _weighted_variance(x, weight), classes)


def _weighted_variance(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Each column's variance (divided by the total weight) of the rows of ``x`` counted ``weight`` times, ``(D,)``."""
    total = weight.sum().clamp_min(torch.finfo(x.dtype).tiny)
    mean = (weight @ x) / total
    return (weight @ (x - mean).square()) / total


def label_ratio_from_statistics(stats: GaussianStatistics | ObservedStatistics) -> torch.Tensor:
    """:func:`label_ratio` from the Gaussian statistics ``(2, D)`` of the rows of class 0 and of class 1 (as merged
    across shards; :class:`~ppmix.models.pf._observed.ObservedStatistics` of rows with missing entries: each
    feature's from its observed entries).

    Examples
    --------
    >>> y = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    >>> x = torch.tensor([[0.0], [2.0], [4.0], [6.0]], dtype=torch.float64)
    >>> family = DiagGaussian(torch.zeros(2, 1, dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64))
    >>> stats = family.statistics(x, torch.stack([y == 0, y == 1], 1).double())
    >>> bool(torch.isclose(label_ratio_from_statistics(stats), label_ratio(x, y)).all())
    True
    """
    if isinstance(stats, ObservedStatistics):  # one feature at a time: its cells of class 0 and class 1
        cells, d = stats.cells, stats.feature_counts().shape[1]
        features = [torch.tensor([j, d + j], device=cells.counts.device) for j in range(d)]
        parts = [GaussianStatistics(cells.counts[i], cells.mean[i], cells.scatter[i]) for i in features]
        return torch.cat([label_ratio_from_statistics(part) for part in parts])
    counts = stats.counts

    def part(c: int) -> GaussianStatistics:
        return GaussianStatistics(counts[c : c + 1], stats.mean[c : c + 1], stats.scatter[c : c + 1])

    pooled = part(0).merge(part(1))
    classes = [(float(counts[c]), stats.scatter[c] / counts[c].clamp_min(1.0)) for c in (0, 1)]
    return _label_ratio(float(pooled.counts[0]), pooled.scatter[0] / pooled.counts[0].clamp_min(1.0), classes)


def _label_ratio(n: float, variance: torch.Tensor, classes: list[tuple[float, torch.Tensor | None]]) -> torch.Tensor:
    """``n log var - sum_c n_c log var_c`` over the classes with more than one row."""

    def log_var(v: torch.Tensor) -> torch.Tensor:
        # a constant feature (zero variance) at the smallest normal number, not at an absolute
        # floor, so that the test is the same for ``x`` and ``c * x`` at any scale
        return v.clamp_min(torch.finfo(v.dtype).tiny).log()

    ratio = n * log_var(variance)
    for count, class_variance in classes:
        if count > 1 and class_variance is not None:
            ratio = ratio - count * log_var(class_variance)
    return ratio
