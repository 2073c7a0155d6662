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
from pyro.distributions import constraints
from pyro.ops.indexing import Vindex

from ppmix._validation import InvalidDataError, check_float
from ppmix.algorithms.kmeans import kmeans_start
from ppmix.components import BernoulliLabel, DiagGaussian
from ppmix.components.centred import CentredData
from ppmix.components.family import DensityFamily, Statistics
from ppmix.components.gaussian_family import GaussianFamily, rounding_tolerance
from ppmix.components.gaussian_statistics import GaussianStatistics
from ppmix.models._family_components import drop_leading_ones
from ppmix.models._flat import flat_prior
from ppmix.models.pf._observed import (
    Frames,
    ObservedStatistics,
    fit_frame_statistics,
    frame_log_prob,
    frame_statistics,
    map_fit_frame_statistics,
)
from ppmix.ops.scaling import column_variance

__all__ = [
    "FrameLabels",
    "PredictionFocusedMixin",
    "label_ratio",
    "label_ratio_from_statistics",
    "label_relevant_features",
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


class PredictionFocusedMixin:
    """Switches, background and labels for a prediction-focused model over frames.

    The host class has ``switch_prior`` (``p``), diagonal ``components_`` (``(K, D)``)
    and sets ``background_`` (``(1, D)``), ``switch_probs_`` (``phi``, ``(D,)``) and
    ``labels_`` (a :class:`~ppmix.components.BernoulliLabel`) while fitting.
    """

    switch_prior: float | str
    #: whether the host accepts ``switch_prior="auto"`` (it then sets ``p_`` before fitting; see :attr:`_switch_p`)
    supports_auto_switch_prior = False
    components_: DiagGaussian
    background_: DiagGaussian
    switch_probs_: torch.Tensor
    labels_: BernoulliLabel
    _background_ll: torch.Tensor

    def _component_family(self) -> DensityFamily:
        """The pf models' features are diagonal Gaussians (the switch algebra of §B needs independent features)."""
        return GaussianFamily("diag", self.reg_covar)

    @property
    def _variance_floor(self) -> float | torch.Tensor:
        """``reg_covar`` times each feature's squared robust spread in the training data (``reg_covar`` before)."""
        return self._scale.get("floor", self.reg_covar)

    def _validate_pf_params(self) -> None:
        """Check the switch prior, the start, the EM settings and ``priors`` shared by the pf models."""
        self._validate_switch_prior()
        self._validate_em_settings(PF_INIT_METHODS)
        check_float(self.reg_covar, "reg_covar", positive=False)
        self._validate_priors()

    def _check_pf_features(self, frames: torch.Tensor) -> None:
        """At least two features to select among (when ``p < 1``) and no constant feature (named): one whose observed
        entries all equal its first up to rounding (:func:`~ppmix.components.gaussian_family.rounding_tolerance`)."""
        if frames.shape[1] < 2 and not self._all_relevant:
            raise InvalidDataError("X has 1 feature(s): it needs at least 2 features to select from (switch_prior < 1)")
        if frames.shape[0] < 2:
            raise InvalidDataError("X has 1 sample: every feature is constant; fitting needs at least 2")
        observed = ~torch.isnan(frames)  # missing entries (NaN): constant over the observed ones
        first = frames.gather(0, observed.to(torch.uint8).argmax(0, keepdim=True))
        constant = (((frames - first).abs() <= rounding_tolerance(first)) | ~observed).all(0)
        if constant.any():
            names = self.feature_names_in_ or list(range(frames.shape[1]))
            bad = [names[i] for i in torch.nonzero(constant).flatten().tolist()][:10]
            where = "" if bool(observed.all()) else " (over their observed entries)"
            raise InvalidDataError(f"X has constant feature(s) {bad}{where}: they carry no information; drop them")

    def _validate_switch_prior(self) -> None:
        p = self.switch_prior
        if self._auto_switch_prior and self.supports_auto_switch_prior:
            return
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
            raise ValueError(f"switch_prior must be a probability in (0, 1]; got {p!r}")

    @property
    def _auto_switch_prior(self) -> bool:
        return isinstance(self.switch_prior, str) and self.switch_prior == "auto"

    @property
    def _switch_p(self) -> float:
        """The switch prior in use: ``switch_prior``, or for ``"auto"`` the value ``fit`` chose (``p_``)."""
        if not self._auto_switch_prior:
            return float(self.switch_prior)
        chosen = getattr(self, "p_", None)
        if chosen is None:
            raise ValueError(
                f"switch_prior='auto' is chosen by {type(self).__name__}.fit; pass a number in (0, 1] to fit otherwise"
            )
        return float(chosen)

    @property
    def _all_relevant(self) -> bool:
        return not self._auto_switch_prior and float(self.switch_prior) == 1.0

    # ---------------------------------------------------------------- EM parts
    def _fit_background(self, frames: Frames, weight: torch.Tensor | None = None) -> None:
        """The background Gaussian's update does not depend on ``phi`` (B.2.3): fit it once (on the frames
        counted ``weight`` times each, where given)."""
        self._set_background(self._background_statistics(frames, weight))

    def _background_statistics(self, frames: Frames, weight: torch.Tensor | None = None) -> Statistics:
        """The background's statistics of ``frames`` (every frame weight one, or its ``weight`` ``(N,)``;
        additive across shards; of the observed entries where some are missing)."""
        one = frames.x.new_ones(1, frames.x.shape[1])
        family = DiagGaussian(one, one, reg_covar=self._variance_floor)
        frame_weight = frames.x.new_ones(frames.x.shape[0]) if weight is None else weight.to(frames.x)
        return frame_statistics(family, frames, frame_weight[:, None])

    def _set_background(self, stats: Statistics) -> None:
        """The background fitted on (merged) statistics, and its per-feature log-likelihood of those frames."""
        one = torch.ones(1, self.n_features_in_, dtype=self.dtype, device=self._device)
        self.background_ = DiagGaussian(one, one, reg_covar=self._variance_floor)
        if self.priors is None:
            self._background_ll = fit_frame_statistics(self.background_, stats)[0]  # (D,)
        else:  # MAP: every frame counts (the Laplace target's background, see PFStateMixin._laplace_target)
            self._background_ll = self._map_fit(self.background_, stats, one[0])[0]

    def _frame_log_joint(self, frames: Frames, labels: FrameLabels, log_prior: torch.Tensor) -> torch.Tensor:
        """:func:`switched_log_joint` at the fitted components, labels and relevance."""
        return switched_log_joint(self.components_, self.labels_, self.switch_probs_, log_prior, frames, labels)

    def _frame_objective_terms(self, frames: Frames, weight: torch.Tensor | None = None) -> torch.Tensor:
        """ELBO terms outside the components: the switched-off features' background log-density of ``frames``
        (their observed entries) and the switches' prior/entropy (every frame counted ``weight`` times, where
        given; a missing entry's switch too)."""
        off = 1.0 - self.switch_probs_
        background: torch.Tensor | float = 0.0
        if bool((off > 0).any()):
            log_prob = frame_log_prob(self.background_, frames, off)[:, 0]
            background = log_prob.sum() if weight is None else log_prob @ weight.to(log_prob)
        n_frames = frames.x.shape[0] if weight is None else float(weight.sum())
        return background + self._switch_objective(n_frames)

    def _switch_objective(self, n_frames: float) -> torch.Tensor:
        """``n_frames`` times the switches' ``E_q[log p(S) - log q(S)]``: the part of the ELBO that is not a sum
        over the data's values (added once on the driver of a sharded fit)."""
        return n_frames * switch_kl_terms(self.switch_probs_, self._switch_p)

    def _update_frame_parameters(self, frames: Frames, labels: FrameLabels, resp: torch.Tensor) -> None:
        """Components and labels by weighted MLE, then ``phi`` by its closed form (B.2.1)."""
        self._update_from_frame_statistics(self._frame_statistics(frames, labels, resp))

    def _frame_statistics(self, frames: Frames, labels: FrameLabels, resp: torch.Tensor) -> dict[str, Any]:
        """What :meth:`_update_from_frame_statistics` needs of ``frames`` (additive across shards)."""
        rows = slice(None) if labels.all else labels.observed  # no copies when every label is observed
        return {
            "components": frame_statistics(self.components_, frames, resp),
            "labels": self.labels_.statistics(labels.y[rows], resp[rows]),
        }

    def _update_from_frame_statistics(self, stats: dict[str, Any]) -> None:
        """Components and labels from (merged) statistics, then ``phi`` (B.2.1): the relevant features'
        log-likelihood gain over the background (of their observed entries), per frame."""
        components = stats["components"]
        if self.priors is None:
            relevant_ll = fit_frame_statistics(self.components_, components).sum(0)  # (D,)
        else:
            relevant_ll = self._map_fit(self.components_, components, self.switch_probs_).sum(0)
        self.labels_.fit_statistics(stats["labels"])
        if self._all_relevant:
            self.switch_probs_ = torch.ones_like(self._background_ll)
            return
        counts = components.counts.to(self.dtype)
        logit_p = math.log(self._switch_p) - math.log1p(-self._switch_p)
        self.switch_probs_ = torch.sigmoid(logit_p + (relevant_ll - self._background_ll) / counts.sum())

    def _map_fit(self, gaussians: DiagGaussian, stats: Statistics, phi: torch.Tensor) -> torch.Tensor:
        """MAP-EM's update of ``gaussians`` (the components, or the background with ``phi`` one) under ``priors``:
        :func:`~ppmix.models.pf._observed.map_fit_frame_statistics` (a family without one refuses, naming
        itself); their log-likelihood ``(K, D)``."""
        self._validate_priors(map_em=True)
        return map_fit_frame_statistics(self._prior_family(), gaussians, stats, phi, self._scale)

    def _background_log_prior(self) -> torch.Tensor:
        """MAP-EM's log prior of the background: the components' (the family's, under ``priors``)."""
        return self._prior_family().map_log_prior(self.background_, int(self.n_features_in_), self._scale)

    def _initial_frame_responsibilities(
        self,
        frames: CentredData,
        labels: FrameLabels,
        generator: torch.Generator,
        test_x: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hard k-means responsibilities, on the label-relevant features when labels are given.

        The "relevance" start: each feature is tested for a change of its distribution
        with the label (likelihood ratio of class-conditional vs pooled Gaussians,
        ``chi^2_2`` at p = 1e-3); k-means runs on the features that pass (all features if
        none pass). Plain k-means on all features follows
        whichever structure dominates the variance, usually the irrelevant one.
        ``test_x`` (``(N, D)``, default the frames) is what the label test sees, e.g. an
        HMM's frames centred per time step. With frame ``weight`` ``(N,)`` (``sample_weight``) the
        test counts every frame that many times and k-means runs on the weighted frames.
        """
        x = frames.centred
        if labels.any:
            test_x = frames.x if test_x is None else test_x
            observed = labels.observed
            selected = label_relevant_features(
                test_x[observed], labels.y[observed], weight=None if weight is None else weight[observed]
            )
            if selected.any():
                x = x[:, selected]
        _, assignment = kmeans_start(x, self.n_components, generator, runs=PF_KMEANS_RUNS, weight=weight)
        return torch.nn.functional.one_hot(assignment, self.n_components).to(frames.x.dtype)

    # -------------------------------------------------------------- predictions
    def _switch_mixture_log_prob(
        self, x: torch.Tensor, features: torch.Tensor, switches: str = "map", chunk: int = 4096
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
        comp, bg = self.components_, self.background_
        loc, scale = comp.loc[:, features], comp.scale[:, features]
        bg_loc, bg_scale = bg.loc[0, features], bg.scale[0, features]
        phi = self.switch_probs_[features]
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

    def _switch_relevance(self) -> Any:
        """``phi`` as numpy, or a pandas Series indexed by the feature names."""
        values = self.switch_probs_.detach().cpu().numpy()
        if self.feature_names_in_ is None:
            return values
        import pandas as pd

        return pd.Series(values, index=self.feature_names_in_, name="relevance")

    # -------------------------------------------------------------------- Pyro
    def _pf_global_sites(
        self, k: int, d: int, opts: dict, components: pyro.plate | None = None
    ) -> dict[str, torch.Tensor]:
        """Sample the component, label and background sites (flat priors: point estimates).

        ``components`` is the model's ``components`` plate when it already opened one.
        """
        components = components or pyro.plate("components", k)
        family = self._sample_components(k, d, opts, plate=components)
        with components:  # values given from outside (Predictive) may carry leading singleton dimensions
            label_probs = drop_leading_ones(
                pyro.sample("label_probs", self._pf_prior("label_probs", (k,), (), opts)), 1
            )
        bg_loc = drop_leading_ones(pyro.sample("background_loc", self._pf_prior("background_loc", (), (d,), opts)), 1)
        bg_scale = pyro.sample("background_scale", self._pf_prior("background_scale", (), (d,), opts))
        bg_scale = drop_leading_ones(bg_scale, 1)
        return {
            "loc": family.loc,
            "scale": family.scale,
            "label_probs": label_probs,
            "bg_loc": bg_loc,
            "bg_scale": bg_scale,
        }

    def _pf_prior(self, site: str, batch: tuple[int, ...], event: tuple[int, ...], opts: dict) -> dist.Distribution:
        """Flat for maximum likelihood (sampled: a point mass at the current value, see
        :func:`~ppmix.models._flat.flat_prior`); inside :meth:`bayesian`, ``Beta(1, 1)`` label
        probabilities and the components' weak priors for the background."""
        if not self.is_bayesian:
            support = {
                "label_probs": constraints.unit_interval,
                "background_loc": constraints.real,
                "background_scale": constraints.positive,
            }[site]
            return flat_prior(self, site, support, batch, event, opts)
        if site == "label_probs":
            return dist.Beta(torch.ones(batch, **opts), torch.ones(batch, **opts))
        return self._component_prior("locs" if site == "background_loc" else "scales", 1, event[0], opts)

    def _pf_guide_global_sites(self, values: dict[str, torch.Tensor], components: pyro.plate) -> None:
        """Point masses on the sites of :meth:`_pf_global_sites` at ``values`` (keyed by site name)."""
        with components:
            pyro.sample("locs", dist.Delta(values["locs"], event_dim=1))
            pyro.sample("scales", dist.Delta(values["scales"], event_dim=1))
            pyro.sample("label_probs", dist.Delta(values["label_probs"]))
        pyro.sample("background_loc", dist.Delta(values["background_loc"], event_dim=1))
        pyro.sample("background_scale", dist.Delta(values["background_scale"], event_dim=1))

    def _pf_frame_sites(
        self,
        sites: dict,
        z: torch.Tensor,
        x: torch.Tensor,
        labels: FrameLabels | None,
        suffix: str = "",
        features: pyro.plate | None = None,
    ) -> None:
        """Inside the frame plate (dim -2): the label and, per feature (plate dim -1), switch and value.

        ``z`` is the frame's component (enumerated, shape broadcasting to ``(N, 1)``). The
        sites are ``y``, ``s`` and ``x`` followed by ``suffix``; a model with several frames
        per plate entry (an HMM: one per time step) names them apart and passes its one
        ``features`` plate.
        """
        if labels is not None and labels.any:
            with pyro.poutine.mask(mask=labels.observed[:, None]):
                pyro.sample(f"y{suffix}", dist.Bernoulli(sites["label_probs"][z]), obs=labels.y[:, None])
        d = x.shape[-1]
        feature_index = torch.arange(d, device=x.device)
        with features or pyro.plate("features", d, dim=-1):
            loc, scale = Vindex(sites["loc"])[z, feature_index], Vindex(sites["scale"])[z, feature_index]
            if not self._all_relevant:
                prior = dist.Bernoulli(torch.as_tensor(self._switch_p, dtype=x.dtype, device=x.device))
                on = pyro.sample(f"s{suffix}", prior).bool()
                loc = torch.where(on, loc, sites["bg_loc"])
                scale = torch.where(on, scale, sites["bg_scale"])
            pyro.sample(f"x{suffix}", dist.Normal(loc, scale), obs=x)

    def _pf_guide_switches(self, phi: torch.Tensor, suffix: str = "", features: pyro.plate | None = None) -> None:
        """Inside the frame plate: ``q(S_nd) = Bern(phi_d)`` at site ``s{suffix}``, enumerated (none when ``p = 1``)."""
        if self._all_relevant:
            return
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
