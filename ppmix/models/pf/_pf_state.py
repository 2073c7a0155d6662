"""What pf-GMM and pf-HMM share beyond their chains and weights, as functions of the model: the checks of the
switch prior and of the features, the label, background and switch globals, the data scale, the start of an EM
restart, the background's fit, the M-step of the components, labels and switches, the Pyro sites of the labels
and the background, the Laplace target and the summary.

The switches themselves are a part the models hold (:class:`~ppmix.models.pf.switches.Switches`, built by
:func:`switches` from the fitted ``switch_probs_`` and ``background_``); the labels are a binary classifier's
(:data:`~ppmix.models._target.BINARY`). Both models call these functions from their own (private) hooks, so
neither inherits them.
"""

from __future__ import annotations

from typing import Any, Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import InvalidDataError, check_float
from ppmix.algorithms.kmeans import kmeans_start
from ppmix.components import BernoulliLabel, DiagGaussian
from ppmix.components.centred import CentredData
from ppmix.components.family import DensityFamily, Statistics
from ppmix.components.family_tools import rescaled
from ppmix.components.gaussian_family import GaussianFamily, rounding_tolerance, weighted_data_scale
from ppmix.models._arviz import LaplaceTarget, global_supports
from ppmix.models._family_components import drop_leading_ones
from ppmix.models._flat import flat_prior
from ppmix.models._missing import fill_column_means
from ppmix.models.pf._observed import (
    Frames,
    fit_frame_statistics,
    frame_log_prob,
    frame_statistics,
    map_fit_frame_statistics,
    start_frames,
)
from ppmix.models.pf.switches import (
    PF_INIT_METHODS,
    PF_KMEANS_RUNS,
    FrameLabels,
    Switches,
    label_relevant_features,
    switched_log_joint,
)

__all__ = ["ONLINE_EM_UNAVAILABLE", "PF_DIMS", "POSTERIOR_REMEDY", "switches"]

#: ArviZ dimensions of the label, background and switch sites
PF_DIMS: dict[str, list[str]] = {
    "label_probs": ["component"],
    "background_loc": ["feature"],
    "background_scale": ["feature"],
    "switch_probs": ["feature"],
}

#: online EM (``partial_fit``) is not available; see :mod:`~ppmix.models._online`
ONLINE_EM_UNAVAILABLE = (
    "the switch update weighs the components' gain against a background fitted on all the data, which a "
    "stream does not have; fit on shards with ppmix.distributed.fit_em instead"
)

#: what gives a pf model posterior draws (the PointEstimateWarning's remedy; see ``draw_remedies``)
POSTERIOR_REMEDY = (
    "use to_arviz's Laplace approximation of the ELBO (approximation='laplace' beyond 500 parameters), which "
    "needs the ELBO strictly concave at the fit: refit with fewer components where one is empty or duplicated "
    "(engine='mcmc' and SVI's guide='normal' are not offered for the pf models: their switches' posterior is "
    "the variational one)"
)


# ------------------------------------------------------------------ settings
def pf_component_family(reg_covar: float) -> DensityFamily:
    """The pf models' features are diagonal Gaussians (the switch algebra of §B needs independent features)."""
    return GaussianFamily("diag", reg_covar)


def auto_switch_prior(model: Any) -> bool:
    """Whether ``switch_prior`` is ``"auto"``."""
    return isinstance(model.switch_prior, str) and model.switch_prior == "auto"


def switch_p(model: Any) -> float:
    """The switch prior in use: ``switch_prior``, or for ``"auto"`` the value ``fit`` chose (``p_``)."""
    if not auto_switch_prior(model):
        return float(model.switch_prior)
    chosen = getattr(model, "p_", None)
    if chosen is None:
        raise ValueError(
            f"switch_prior='auto' is chosen by {type(model).__name__}.fit; pass a number in (0, 1] to fit otherwise"
        )
    return float(chosen)


def all_relevant(model: Any) -> bool:
    """Whether every feature is relevant (``switch_prior = 1``: the supervised model, no switches)."""
    return not auto_switch_prior(model) and float(model.switch_prior) == 1.0


def switches(model: Any) -> Switches:
    """The model's switches: the prior in use, the fitted ``phi`` and background."""
    return Switches(switch_p(model), model.switch_probs_, model.background_, all_relevant(model))


def validate_pf_params(model: Any) -> None:
    """Check the switch prior, the start, the EM settings and ``priors`` shared by the pf models."""
    p = model.switch_prior
    if not (auto_switch_prior(model) and getattr(model, "supports_auto_switch_prior", False)):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
            raise ValueError(f"switch_prior must be a probability in (0, 1]; got {p!r}")
    model._validate_em_settings(PF_INIT_METHODS)
    check_float(model.reg_covar, "reg_covar", positive=False)
    model._validate_priors()


def check_pf_features(model: Any, frames: torch.Tensor) -> None:
    """At least two features to select among (when ``p < 1``) and no constant feature (named): one whose observed
    entries all equal its first up to rounding (:func:`~ppmix.components.gaussian_family.rounding_tolerance`)."""
    if frames.shape[1] < 2 and not all_relevant(model):
        raise InvalidDataError("X has 1 feature(s): it needs at least 2 features to select from (switch_prior < 1)")
    if frames.shape[0] < 2:
        raise InvalidDataError("X has 1 sample: every feature is constant; fitting needs at least 2")
    observed = ~torch.isnan(frames)  # missing entries (NaN): constant over the observed ones
    first = frames.gather(0, observed.to(torch.uint8).argmax(0, keepdim=True))
    constant = (((frames - first).abs() <= rounding_tolerance(first)) | ~observed).all(0)
    if constant.any():
        names = model.feature_names_in_ or list(range(frames.shape[1]))
        bad = [names[i] for i in torch.nonzero(constant).flatten().tolist()][:10]
        where = "" if bool(observed.all()) else " (over their observed entries)"
        raise InvalidDataError(f"X has constant feature(s) {bad}{where}: they carry no information; drop them")


# ------------------------------------------------------------------- globals
def pf_globals(model: Any) -> dict[str, torch.Tensor]:
    """Label probabilities, background and (when ``p < 1``) switch probabilities, keyed by site name.

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models.pf.pf_gmm import PFGMM
    >>> data = make_pf_synthetic(200, n_relevant=2, n_features=4, seed=0)
    >>> model = PFGMM(2, switch_prior=0.3, seed=0, progress=False).fit(data.X, data.y)
    >>> sorted(pf_globals(model))
    ['background_loc', 'background_scale', 'label_probs', 'switch_probs']
    """
    values = {
        "label_probs": model.labels_.probs.clone(),
        "background_loc": model.background_.loc[0].clone(),
        "background_scale": model.background_.scale[0].clone(),
    }
    if not all_relevant(model):
        values["switch_probs"] = model.switch_probs_.clone()
    return values


def pf_state_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """The shapes of :func:`pf_globals` for these settings."""
    d = model.n_features_in_
    shapes = {"label_probs": (model.n_components,), "background_loc": (d,), "background_scale": (d,)}
    return shapes if all_relevant(model) else {**shapes, "switch_probs": (d,)}


def set_pf_globals(model: Any, values: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`pf_globals` (``phi = 1`` where ``switch_probs`` is absent)."""
    opts = {"dtype": model.dtype, "device": model._device}
    model.labels_ = BernoulliLabel(torch.as_tensor(values["label_probs"]).to(**opts))
    bg_loc = torch.as_tensor(values["background_loc"]).to(**opts)
    bg_scale = torch.as_tensor(values["background_scale"]).to(**opts)
    model.background_ = DiagGaussian(bg_loc[None], bg_scale[None], reg_covar=model.reg_covar)
    phi = values.get("switch_probs")
    model.switch_probs_ = torch.ones_like(bg_loc) if phi is None else torch.as_tensor(phi).to(**opts)


# ---------------------------------------------------------------- data scale
def record_data_scale(model: Any, x: torch.Tensor, name: str, record: Callable[[torch.Tensor, str], None]) -> None:
    """The family's checks and data scale of the training frames ``x`` (``record``: the structure's own, e.g.
    ``super()._record_data_scale``); where entries are missing (``missing="marginalize"``), the checks see them
    filled with their columns' means and each column's scale (the variance floor) is that of its observed entries
    (:func:`weighted_data_scale`). Within the restarts of one fit (:func:`~ppmix.models.pf.restarts.fit_restarts`,
    which sets the model's ``_restart_data_scale`` memo) a restart after the first takes the scale the first
    measured on the same frames."""
    memo = model._restart_data_scale
    if memo is not None and "scale" in memo:
        model._take_data_scale(lambda family: memo["scale"])
        return
    if not bool(torch.isnan(x).any()):
        record(x, name)
    else:
        record(fill_column_means(x), name)
        record_weighted_data_scale(model, x, x.new_ones(x.shape[0]))
    if memo is not None:
        memo["scale"] = model._data_scale


def record_weighted_data_scale(model: Any, frames: torch.Tensor, weight: torch.Tensor) -> None:
    """Replace the data scale just recorded (``_record_data_scale``) by that of the ``frames`` ``(N, D)``
    counted ``weight`` ``(N,)`` times each (:func:`weighted_data_scale`); fitted components (a warm start)
    take it. The frames of positive weight must not hold a constant feature (as the repeated frames must not)."""
    check_pf_features(model, frames[weight > 0])
    model._data_scale = weighted_data_scale(frames, weight, float(model.reg_covar))
    if getattr(model, "components_", None) is not None:
        model.components_ = rescaled(model._component_family(), model.components_, model._data_scale)


# ------------------------------------------------------------------------ EM
def pf_start(
    model: Any,
    frames: Frames,
    labels: FrameLabels,
    generator: torch.Generator,
    centred: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Start an EM restart: background fitted once, fresh components, ``label_probs = 1/2``, ``phi = p``.

    Returns the first frame responsibilities, from (relevance-)k-means; ``centred`` are the
    frames the relevance test sees (default: ``frames``). Frame ``weight`` ``(N,)`` (``sample_weight``)
    weighs the background, the relevance test and k-means.
    """
    set_background(model, background_statistics(model, frames, weight))  # it does not depend on phi (B.2.3)
    frames = start_frames(frames, weight)  # the start sees missing entries filled with their columns' means
    model.components_ = model._new_components(frames.x)
    model.labels_ = BernoulliLabel(frames.x.new_full((model.n_components,), 0.5))
    model.switch_probs_ = frames.x.new_full((frames.x.shape[1],), switch_p(model))
    if model.init_params == "relevance":
        return initial_frame_responsibilities(model, frames, labels, generator, centred, weight)
    return model._initial_responsibilities(frames, generator, weight)


def initial_frame_responsibilities(
    model: Any,
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
    _, assignment = kmeans_start(x, model.n_components, generator, runs=PF_KMEANS_RUNS, weight=weight)
    return torch.nn.functional.one_hot(assignment, model.n_components).to(frames.x.dtype)


def _variance_floor(model: Any) -> float | torch.Tensor:
    """``reg_covar`` times each feature's squared robust spread in the training data (``reg_covar`` before)."""
    return model._scale.get("floor", model.reg_covar)


def background_statistics(model: Any, frames: Frames, weight: torch.Tensor | None = None) -> Statistics:
    """The background's statistics of ``frames`` (every frame weight one, or its ``weight`` ``(N,)``;
    additive across shards; of the observed entries where some are missing)."""
    one = frames.x.new_ones(1, frames.x.shape[1])
    family = DiagGaussian(one, one, reg_covar=_variance_floor(model))
    frame_weight = frames.x.new_ones(frames.x.shape[0]) if weight is None else weight.to(frames.x)
    return frame_statistics(family, frames, frame_weight[:, None])


def set_background(model: Any, stats: Statistics) -> None:
    """The background fitted on (merged) statistics, and its per-feature log-likelihood of those frames."""
    one = torch.ones(1, model.n_features_in_, dtype=model.dtype, device=model._device)
    model.background_ = DiagGaussian(one, one, reg_covar=_variance_floor(model))
    if model.priors is None:
        model._background_ll = fit_frame_statistics(model.background_, stats)[0]  # (D,)
    else:  # MAP: every frame counts (the Laplace target's background, see pf_laplace_target)
        model._background_ll = _map_fit(model, model.background_, stats, one[0])[0]


def frame_log_joint(model: Any, frames: Frames, labels: FrameLabels, log_prior: torch.Tensor) -> torch.Tensor:
    """:func:`~ppmix.models.pf.switches.switched_log_joint` at the fitted components, labels and relevance."""
    return switched_log_joint(model.components_, model.labels_, model.switch_probs_, log_prior, frames, labels)


def frame_statistics_of(model: Any, frames: Frames, labels: FrameLabels, resp: torch.Tensor) -> dict[str, Any]:
    """What :func:`update_from_frame_statistics` needs of ``frames`` (additive across shards)."""
    rows = slice(None) if labels.all else labels.observed  # no copies when every label is observed
    return {
        "components": frame_statistics(model.components_, frames, resp),
        "labels": model.labels_.statistics(labels.y[rows], resp[rows]),
    }


def update_from_frame_statistics(model: Any, stats: dict[str, Any]) -> None:
    """Components and labels from (merged) statistics, then ``phi`` (B.2.1): the relevant features'
    log-likelihood gain over the background (of their observed entries), per frame."""
    components = stats["components"]
    if model.priors is None:
        relevant_ll = fit_frame_statistics(model.components_, components).sum(0)  # (D,)
    else:
        relevant_ll = _map_fit(model, model.components_, components, model.switch_probs_).sum(0)
    model.labels_.fit_statistics(stats["labels"])
    counts = components.counts.to(model.dtype)
    model.switch_probs_ = switches(model).updated_probs(relevant_ll, model._background_ll, counts)


def _map_fit(model: Any, gaussians: DiagGaussian, stats: Statistics, phi: torch.Tensor) -> torch.Tensor:
    """MAP-EM's update of ``gaussians`` (the components, or the background with ``phi`` one) under ``priors``:
    :func:`~ppmix.models.pf._observed.map_fit_frame_statistics` (a family without one refuses, naming
    itself); their log-likelihood ``(K, D)``."""
    model._validate_priors(map_em=True)
    return map_fit_frame_statistics(model._prior_family(), gaussians, stats, phi, model._scale)


def background_log_prior(model: Any) -> torch.Tensor:
    """MAP-EM's log prior of the background: the components' (the family's, under ``priors``)."""
    return model._prior_family().priors().map_log_prior(model.background_, int(model.n_features_in_), model._scale)


def frame_objective_terms(model: Any, frames: Frames, weight: torch.Tensor | None = None) -> torch.Tensor:
    """ELBO terms outside the components (:meth:`~ppmix.models.pf.switches.Switches.objective_terms`)."""
    return switches(model).objective_terms(frames, weight)


def background_data_statistics(model: Any, frames: Frames, weight: torch.Tensor | None) -> Statistics:
    """Before a sharded or warm-started fit: the background's statistics of ``frames`` (it is fitted once, on all
    of this fit's data; every frame counted as often as its sample ``weight``, where there are some)."""
    return background_statistics(model, frames, weight)


# ---------------------------------------------------------------------- Pyro
def pf_global_sites(model: Any, k: int, d: int, opts: dict, components: pyro.plate | None = None) -> dict:
    """Sample the component, label and background sites (flat priors: point estimates).

    ``components`` is the model's ``components`` plate when it already opened one.
    """
    components = components or pyro.plate("components", k)
    family = model._sample_components(k, d, opts, plate=components)
    with components:  # values given from outside (Predictive) may carry leading singleton dimensions
        label_probs = drop_leading_ones(pyro.sample("label_probs", _pf_prior(model, "label_probs", (k,), (), opts)), 1)
    bg_loc = drop_leading_ones(pyro.sample("background_loc", _pf_prior(model, "background_loc", (), (d,), opts)), 1)
    bg_scale = pyro.sample("background_scale", _pf_prior(model, "background_scale", (), (d,), opts))
    bg_scale = drop_leading_ones(bg_scale, 1)
    return {
        "loc": family.loc,
        "scale": family.scale,
        "label_probs": label_probs,
        "bg_loc": bg_loc,
        "bg_scale": bg_scale,
    }


def _pf_prior(model: Any, site: str, batch: tuple[int, ...], event: tuple[int, ...], opts: dict) -> dist.Distribution:
    """Flat for maximum likelihood (sampled: a point mass at the current value, see
    :func:`~ppmix.models._flat.flat_prior`); inside :meth:`bayesian`, ``Beta(1, 1)`` label
    probabilities and the components' weak priors for the background."""
    if not model.is_bayesian:
        support = {
            "label_probs": constraints.unit_interval,
            "background_loc": constraints.real,
            "background_scale": constraints.positive,
        }[site]
        return flat_prior(model, site, support, batch, event, opts)
    if site == "label_probs":
        return dist.Beta(torch.ones(batch, **opts), torch.ones(batch, **opts))
    return model._component_prior("locs" if site == "background_loc" else "scales", 1, event[0], opts)


def pf_guide_global_sites(values: dict[str, torch.Tensor], components: pyro.plate) -> None:
    """Point masses on the sites of :func:`pf_global_sites` at ``values`` (keyed by site name)."""
    with components:
        pyro.sample("locs", dist.Delta(values["locs"], event_dim=1))
        pyro.sample("scales", dist.Delta(values["scales"], event_dim=1))
        pyro.sample("label_probs", dist.Delta(values["label_probs"]))
    pyro.sample("background_loc", dist.Delta(values["background_loc"], event_dim=1))
    pyro.sample("background_scale", dist.Delta(values["background_scale"], event_dim=1))


# ------------------------------------------------------------ fitted outputs
def pf_laplace_target(model: Any, data: Any, elbo: Callable[[Any], torch.Tensor]) -> LaplaceTarget:
    """What ``to_arviz`` takes its Laplace approximation of (:func:`~ppmix.models._arviz.laplace_draws`): the
    objective variational EM maximises, the ELBO with ``q(z)`` optimal (``elbo``, differentiable in the globals;
    labels used where observed; with ``priors``, MAP-EM's ELBO plus the log prior: a log posterior), as a function
    of the continuous globals, the switches held at their fitted variational posterior ``q(S_d = 1) = phi_d``
    (``switch_probs`` is the same in every draw).

    The background is fitted once, on every frame (B.2.3), where the ELBO counts feature ``d``'s background
    density on the switched-off share ``1 - phi_d`` of the frames only; the target counts it on all
    of them (adding ``phi_d`` times its log-density), so that its precision is that of its fit, finite for a
    relevant feature too, and its mode the fitted background (with ``priors``, MAP on every frame).

    Examples
    --------
    >>> from ppmix.datasets import make_pf_synthetic
    >>> from ppmix.models.pf.pf_gmm import PFGMM
    >>> data = make_pf_synthetic(100, n_relevant=1, n_features=2, seed=0)
    >>> model = PFGMM(2, switch_prior=0.3, seed=0, progress=False).fit(data.X, data.y)
    >>> target = model._laplace_target(model.prepare_data(data.X, data.y))
    >>> sorted(target.supports)
    ['background_loc', 'background_scale', 'label_probs', 'locs', 'scales', 'weights']
    """
    values = model._get_globals()
    varying = [name for name in values if name != "switch_probs"]
    batch = model._em_data(data)

    def log_density(point: dict[str, torch.Tensor]) -> torch.Tensor:
        model._set_globals(point)
        background = frame_log_prob(model.background_, batch.rows, model.switch_probs_)[:, 0].sum()
        return elbo(batch) + background

    return LaplaceTarget(values, global_supports(model, data, varying), log_density)


def switch_relevance(model: Any) -> Any:
    """``phi`` as numpy, or a pandas Series indexed by the feature names."""
    model._check_fitted()
    return feature_output(model, model.switch_probs_.detach().cpu().numpy(), "relevance")


def feature_output(model: Any, values: Any, name: str) -> Any:
    """``values`` (numpy, ``(D,)``) as they are, or a pandas Series indexed by the model's feature names."""
    if model.feature_names_in_ is None:
        return values
    import pandas as pd

    return pd.Series(values, index=model.feature_names_in_, name=name)


def pf_summary(model: Any, **fit: Any) -> dict[str, Any]:
    """A JSON-able description of the fit: the model's own entries ``fit``, then labels and relevance."""
    model._check_fitted()
    relevance = model.switch_probs_.cpu().tolist()
    return {
        "model": type(model).__name__,
        "n_components": model.n_components,
        "switch_prior": switch_p(model),
        "n_iter": model.n_iter_,
        "converged": model.converged_,
        **fit,
        "label_probs": model.labels_.probs.cpu().tolist(),
        "relevance": relevance,
        "n_relevant": int(sum(r > 0.5 for r in relevance)),
        "feature_names": model.feature_names_in_,
    }
