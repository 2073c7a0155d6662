"""``MixtureOfExperts``: softmax-gated Gaussian-regression or logistic-regression experts."""

from __future__ import annotations

from typing import Any, Self

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from sklearn.utils.metaestimators import available_if

from ppmix._validation import to_output
from ppmix.components import GaussianExpert, LogisticExpert, SoftmaxExpert, SoftmaxGate
from ppmix.components.expert_family import ExpertFamily, TargetScale
from ppmix.components.family import PriorKey
from ppmix.components.registry import expert_family_from, family_config
from ppmix.engines.result import FitResult, convergence_warnings_ignored
from ppmix.models._arviz import LaplaceTarget, global_supports
from ppmix.models._flat import flat_prior
from ppmix.models._params import store_params
from ppmix.models._target import TargetCoding
from ppmix.models._weights import split_weights
from ppmix.models.base import MixtureModel
from ppmix.models.moe_build import ExpertParts, model_from_families, model_from_parameters, parts_globals
from ppmix.models.moe_data import (
    check_response,
    check_settings,
    check_training_data,
    restandardised,
    unstandardised,
)
from ppmix.models.moe_moves import SCREENED_WEIGHTS, initial_responsibilities, split_and_merge
from ppmix.models.moe_polish import polished, warn_unconverged
from ppmix.models.moe_predict import binary_proba, class_log_proba, conditional_mean, draw
from ppmix.models.moe_priors import ExpertPriors, check_expert_priors, prior_keys
from ppmix.ops.logspace import normalize_log_joint_

__all__ = ["MixtureOfExperts"]

INIT_METHODS = ("kmeans", "random")


def _family_attribute(family: str, name: str, doc: str) -> property:
    """A read-only property: the attribute ``name`` of the property ``family`` (``gate_`` or ``experts_``)."""
    return property(lambda self: getattr(getattr(self, family), name), doc=doc)


class MixtureOfExperts(MixtureModel):
    """Mixture of experts: ``z | x ~ softmax(x^T alpha)``, ``y | x, z = k ~ expert_k(x)``.

    A mixture whose weights are a softmax gate of the covariates and whose components are experts: it holds its
    parts, the gate and the experts (on the standardised covariates; built by
    :class:`~ppmix.models.moe_build.ExpertParts`, each with its own update, penalty and sites), the prior ``priors=``
    sets (:class:`~ppmix.models.moe_priors.ExpertPriors`) and the coding of its target
    (:class:`~ppmix.models._target.TargetCoding`: a regressor or a classifier by its experts); its predictions are
    functions of the fitted parts (:mod:`~ppmix.models.moe_predict`).

    The gate is a :class:`~ppmix.components.SoftmaxGate` (the last gate fixed to zero,
    which makes it identifiable); the experts are Gaussian regressions
    ``N(x^T beta_k + b_k, sigma_k^2)`` or logistic regressions ``Bernoulli(sigmoid(x^T
    beta_k + b_k))`` (:class:`~ppmix.components.GaussianExpert`,
    :class:`~ppmix.components.LogisticExpert`).

    One Pyro program (the expert index ``z`` enumerated in parallel), three engines:
    ``fit(X, y, engine="em")`` (responsibilities; gate by damped Newton/IRLS on the soft
    targets; experts by weighted least squares or weighted IRLS), ``"svi"`` and
    ``"mcmc"`` through the base class. EM and SVI are maximum likelihood (flat priors:
    the ELBO is the log-likelihood; EM's with the ``ridge``); MCMC uses ``N(0, 10^2)`` priors on the
    (standardised) coefficients and ``LogNormal(log std(y), 1)`` on the noise scales. With ``priors``
    one proper prior serves every engine: EM and SVI are MAP fits under it and MCMC samples it.

    The covariates are standardised inside (``standardize=True``); fitted parameters
    (``gate_coef_``, ``coef_``, ...) are reported on the user's scale. After an EM or SVI
    fit the experts are put in a canonical order: by decreasing mean gate probability
    on the training data (then the last gate is re-zeroed).

    Parameters
    ----------
    n_experts : int, default 2
        Number of experts ``K`` (at least 2).
    expert : {"gaussian", "logistic", "softmax", "poisson"} or ExpertFamily, default "gaussian"
        Regression experts, binary classifiers (any two labels), multi-class ones
        (:class:`~ppmix.components.SoftmaxExpert`, any number of labels; not for ``fit_distributed``) or
        Poisson regressions of counts (:class:`~ppmix.components.PoissonExpert`, log link; a regressor): a
        registered name (:data:`ppmix.components.registry.EXPERT_FAMILIES`) or a family object
        (:class:`~ppmix.components.expert_family.ExpertFamily`, e.g. ``GaussianExpertFamily()``), whose
        ``target_kind`` makes the model a regressor or a classifier.
    n_init : int, default 10
        EM starts; the best log-likelihood is kept.
    init_iter : int or None, default 5
        "Small EM" (:func:`~ppmix.engines.em.run_em`): every start runs this many EM
        iterations and only the best runs on to convergence; ``None`` runs every start to the end.
        On 40 two-expert fits (``benchmarks/bench_moe_starts.py``) one plain start ended in a worse
        optimum 6 times, the default never, at 1.6 times the time of one start.
    max_iter : int, default 100
    tol : float, default 1e-6
        EM stops when the log-likelihood per observation changes by at most ``tol`` (nats).
    ridge : float, optional
        Ridge penalty on the slopes of the gate and of the experts (standardised scale:
        ``ridge / 2 * ||slopes||^2`` in the Newton fits, ``ridge * ||slopes||^2`` added to the
        Gaussian experts' least squares); it keeps the fits finite on separable data. ``None`` (default) is
        ``1e-6`` for Gaussian experts (a sharp regime boundary then gives a large but finite
        gate slope: ``gate_coef_`` 309 in the example below, whose true gate is a step) and
        ``1e-2`` for logistic and softmax experts, a weak Gaussian prior (sd 10 on the
        standardised slopes) under which near-separable experts do not over-fit: on the
        S4.1 logistic simulation (N = 10^5) EM started at the truth then stays within 3% of
        the truth's test log-loss on seeds 0–4, against 32% worse on seed 0 at ``1e-6``. For
        classifying experts the penalty is part of the EM objective (:meth:`_ridge_penalty`). Not with ``priors``
        (whose ``gate_slope_scale`` and ``slope_scale`` stand for it: ``ridge = 1 / scale^2``).
    priors : dict, optional
        A proper prior (:mod:`~ppmix.models.moe_priors`), by key (each optional, a positive number; :meth:`prior_keys`
        lists them with their defaults), on the standardised covariates: ``"gate_slope_scale"`` and
        ``"gate_intercept_scale"`` the sds of every expert's gate slopes and intercept before the reference gate's
        are subtracted (10 and 10; the free rows' prior does not depend on which expert is the reference);
        ``"slope_scale"`` and ``"intercept_scale"`` the sds of the experts' slopes and intercepts (10 and 10 on the
        log-odds or log-rate scale, the Poisson intercepts centred at ``log mean(y)``; Gaussian experts: in units
        of ``std(y)``, the intercepts centred at ``mean(y)``); for Gaussian experts ``"variance_concentration"``
        ``a`` and ``"variance_rate"`` ``b`` (in units of ``var(y)``) the inverse-gamma prior of every noise variance
        (1 and 0.01). MCMC samples it, ``to_arviz``'s ``prior`` group draws from it and, given (even ``{}``),
        ``engine="em"`` is MAP-EM: its objective (``history_``) is the log-likelihood plus :meth:`_log_prior`, raised
        at every M-step (the gate and logistic, Poisson and softmax experts by penalised Newton steps, Gaussian
        experts' coefficients by ridge least squares at the current noise, then the variance ``(RSS_k + 2 b) / (n_k
        + 2 a + 1)``) and by the polish; SVI with the point guide is MAP too; ``to_arviz``'s Laplace approximation
        is then that of the posterior at its mode. None (default): maximum likelihood with ``ridge``. An unknown
        key or a value that is not a positive number is a ``ValueError`` naming ``priors``. On the contract suite's
        small fits (N = 60) ``priors={}`` gives the Gaussian experts, whose gate saturates, a Laplace approximation
        (none without), and a near-separable logistic fit a finite ``az.loo`` (NaN without); yet the Laplace draws of
        logistic experts on so few rows leave most Pareto k above 0.7, where MCMC is the remedy.
    min_variance : float, default 1e-4
        Floor of the Gaussian experts' noise variance, as a fraction of the variance of
        ``y`` in ``fit`` (it keeps an expert from collapsing onto a few points, where the
        likelihood is unbounded).
    split_merge : int, default 3
        After EM, at most this many split-and-merge moves (:func:`~ppmix.models.moe_moves.split_and_merge`:
        one expert is freed and takes the upper half of the worst-fitting expert's points),
        each kept only if the log-likelihood per point then rises by more than ``tol``
        (relative). 0 gives plain EM. After a kept move ``history_`` is the objective of
        the EM run that followed it and ``n_iter_`` counts the iterations of all runs.
    split_merge_search : {"proposal", "screened"}, default "proposal"
        Which moves a round tries. ``"proposal"``: one, chosen by the criteria above.
        ``"screened"``: every move of a (freed, keeping, split) triple of experts, its split by
        residual or along the covariates' main axis (at most 120 moves), and every worst-fit move
        (a freed expert takes the 5% of points the mixture fits worst) runs 60 EM iterations
        on a subsample of at most 10 000 rows, and EM on all rows goes on from the 3 best; the
        best of those is kept if it beats the round's start. Every round screens a fresh
        subsample, and the search ends when two rounds in a row keep nothing (one, where the
        rows are few enough to be screened whole, and in the proposal search). It finds optima that need moves no
        single proposal picks, at several times the cost (see the user guide's
        mixture-of-experts page, docs/guide/mixture-of-experts.md, for the S4.1 logistic simulation).
    polish : bool, default True
        After EM (and after the EM run of every split-and-merge move), go on by L-BFGS on the
        same objective until 5 iterations gain at most ``tol`` per point in all, or for at most
        ``max_iter`` iterations (:mod:`~ppmix.models.moe_polish`). EM crawls near the optimum where experts
        overlap; on the S4.1 logistic simulation the polish gained in 12 s what 1 000 more EM
        iterations gain in 4 minutes. ``history_`` and ``n_iter_`` then include its iterations.
    init_params : {"random", "kmeans"}, default "random"
        Starting responsibilities: from a random gate (coefficients ``N(0, 2^2)`` on the
        standardised covariates; Chamroukhi & Pham (2026) keep the best of five random starts) or from
        k-means on the standardised ``(x, y)``.
    standardize : bool, default True
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Attributes
    ----------
    gate_ : SoftmaxGate
        The gate on the user's scale (``gate_coef_``, ``gate_intercept_`` are its parameters).
    experts_ : GaussianExpert, LogisticExpert or SoftmaxExpert
        The experts on the user's scale (``coef_``, ``intercept_``, ``scale_``).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-3, 3, size=(400, 1))
    >>> y = np.where(X[:, 0] < 0, 2 * X[:, 0], -3 * X[:, 0] + 1) + 0.1 * rng.normal(size=400)
    >>> moe = MixtureOfExperts(2, seed=0, progress=False).fit(X, y)
    >>> np.round(np.sort(moe.coef_[:, 0].numpy())).tolist()
    [-3.0, 2.0]
    >>> moe.predict(np.array([[-1.0], [1.0]])).round().tolist()
    [-2.0, -2.0]
    """

    def __init__(
        self,
        n_experts: int = 2,
        *,
        expert: str | ExpertFamily | dict = "gaussian",
        n_init: int = 10,
        init_iter: int | None = 5,
        max_iter: int = 100,
        tol: float = 1e-6,
        ridge: float | None = None,
        priors: dict[str, Any] | None = None,
        min_variance: float = 1e-4,
        split_merge: int = 3,
        split_merge_search: str = "proposal",
        polish: bool = True,
        init_params: str = "random",
        standardize: bool = True,
        seed: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float64,
        progress: bool = True,
    ) -> None:
        super().__init__(n_experts)
        store_params(self, locals())

    def _expert_family(self) -> ExpertFamily:
        """The experts' family (from ``expert``: a registered name or a family object)."""
        return expert_family_from(self.expert)

    @property
    def target_kind(self) -> str:
        """What ``y`` is: ``"real"`` or ``"count"`` (a regression), ``"binary"`` or ``"categorical"`` (a classifier)."""
        return self._expert_family().target_kind

    @property
    def _target(self) -> TargetCoding:
        """The coding of ``y``, by the experts' family: a regressor's or a classifier's."""
        return TargetCoding(self.target_kind)

    @property
    def _n_classes(self) -> int | None:
        """``C`` for a categorical target (one row of coefficients per class), else None."""
        return len(self.classes_) if self._target.multiclass else None

    def __sklearn_tags__(self) -> Any:
        return self._target.tags(super().__sklearn_tags__())

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:  # type: ignore[override]
        """Accuracy of :meth:`predict` (classifying experts) or its R² (a regressor), as scikit-learn's classifiers
        and regressors score."""
        return self._target.score(self, X, y, sample_weight)

    def _saved_params(self) -> dict[str, Any]:
        params = super()._saved_params()
        params["expert"] = family_config(params["expert"])
        return params

    @property
    def n_components(self) -> int:
        """The number of mixture components: ``n_experts`` (the parameter to set)."""
        return self.n_experts

    @n_components.setter
    def n_components(self, value: int) -> None:
        if "n_experts" in vars(self):  # MixtureModel.__init__ sets it before n_experts exists
            raise AttributeError("a MixtureOfExperts has n_experts components; set n_experts instead")

    def _validate_hyperparameters(self) -> None:
        super()._validate_hyperparameters()
        self._validate_em_settings(INIT_METHODS)
        check_settings(self)
        check_expert_priors(self.priors, self.ridge, self._expert_family())

    @property
    def n_parameters(self) -> int:
        """Number of free parameters: ``(K-1)(P+1)`` gate and the experts' (e.g. ``K(P+1)`` coefficients and ``K``
        variances of Gaussian experts, ``K(C-1)(P+1)`` of softmax experts over ``C`` classes)."""
        k, p = int(self.n_experts), self.n_features_in_
        return (k - 1) * (p + 1) + self._expert_family().n_parameters(k, p, self._n_classes)

    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Standardised covariates and the response, ``(x, y)`` (``y`` is ``None`` when not given)."""
        y = self._target.encode(self, y, fitting=fitting)
        if fitting:
            return self._prepare_training_data(X, y)
        x = self._covariates(X)
        response = None if y is None else check_response(y, x.shape[0], self._expert_family())
        return x, None if response is None else response.to(dtype=self.dtype, device=self._device)

    def _prepare_training_data(self, X: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Check the training data and record the scales fitted on them
        (:func:`~ppmix.models.moe_data.check_training_data`); a warm start continues from the same model,
        re-expressed on the new covariate scales."""
        held = unstandardised(self._get_globals(), self._x_mean, self._x_scale) if self.is_fitted else None
        settings = {"dtype": self.dtype, "device": self._device, "standardize": self.standardize}
        data = check_training_data(
            X,
            y,
            self._expert_family(),
            self.n_experts,
            {**settings, "min_variance": self.min_variance},
            self._fit_sample_weight,
        )
        self.n_features_in_, self.feature_names_in_ = int(data.x.shape[1]), data.feature_names
        self._x_mean, self._x_scale = data.x_mean, data.x_scale
        if held is not None:
            self._set_globals(restandardised(held, self._x_mean, self._x_scale))
        self._y_mean, self._y_std, self._noise_floor = data.y_mean, data.y_std, data.noise_floor
        return self._standardise(data.x), data.response

    def _covariates(self, X: Any) -> torch.Tensor:
        return self._standardise(self._fitted_matrix(X))

    def _standardise(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self._x_mean) / self._x_scale

    def _n_observations(self, data: Any) -> int | float:
        """The rows of ``data``; of :class:`~ppmix.models.batch.Batch` data, their total weight."""
        rows, weight = split_weights(data)
        return int(rows[0].shape[0]) if weight is None else float(weight.sum())

    def _sample_weight_units(self, data: Any) -> tuple[str, int]:
        """One ``sample_weight`` per row of ``(x, y)``."""
        return "row", int(split_weights(data)[0][0].shape[0])

    def _observed_data(self, data: Any) -> dict[str, torch.Tensor]:
        return {"y": data[1]}

    @staticmethod
    def _require_y(data: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor]:
        if data[1] is None:
            raise ValueError("y is required: a mixture of experts models y given X")
        return data[0], data[1]

    # ------------------------------------------------------------ the program
    def _prior(
        self, site: str, batch: int, event: tuple[int, ...], opts: dict, support: Any = constraints.real
    ) -> dist.Distribution:
        """Flat for maximum likelihood (sampled: a point mass at the current value, see
        :func:`~ppmix.models._flat.flat_prior`); under MCMC (and MAP fits) the prior ``priors`` sets
        (:mod:`~ppmix.models.moe_priors`), or without ``priors`` ``N(0, 10^2)`` on the gate and the experts' family's
        weakly informative priors (before a fit, centred at 0 with unit scale). With ``priors`` the gate's sites
        are one draw of all ``batch`` free rows (batch shape ``()``, their prior correlates them)."""
        priors = self._expert_priors()
        if priors is not None:
            shape = ((), (batch, *event)) if site.startswith("gate_") else ((batch,), event)
            if not self.is_bayesian:
                return flat_prior(self, site, support, *shape, opts)
            return priors.site_prior(site, batch, event, opts)
        if not self.is_bayesian:
            return flat_prior(self, site, support, (batch,), event, opts)
        if site.startswith("gate_"):
            return dist.Normal(torch.zeros(batch, *event, **opts), 10.0).to_event(len(event))
        return self._expert_family().prior(site, batch, event, self._target_scale(), opts)

    # ------------------------------------------------------------ priors
    def prior_keys(self) -> dict[str, PriorKey]:
        """Every hyperparameter ``priors=`` may set (the gate's, then the experts' family's), each with its default.

        Examples
        --------
        >>> from ppmix import MixtureOfExperts
        >>> sorted(MixtureOfExperts(2, expert="logistic").prior_keys())
        ['gate_intercept_scale', 'gate_slope_scale', 'intercept_scale', 'slope_scale']
        >>> MixtureOfExperts(2).prior_keys()["variance_rate"].doc
        'the inverse-gamma rate of every noise variance, in units of var(y) (default 0.01)'
        """
        return prior_keys(self._expert_family())

    def _target_scale(self) -> TargetScale:
        """The response's mean and sd on the training data (0 and 1 before a fit): what the experts' priors scale by."""
        return {"mean": getattr(self, "_y_mean", torch.tensor(0.0)), "std": getattr(self, "_y_std", torch.tensor(1.0))}

    def _expert_priors(self) -> ExpertPriors | None:
        """The prior ``priors`` sets (None without)."""
        if self.priors is None:
            return None
        return ExpertPriors.of(self.priors, self._expert_family(), self._target_scale())

    def _log_prior(self) -> torch.Tensor:
        """The log density of ``priors``' prior at the current parameters (differentiable in them): what MAP-EM adds
        to the log-likelihood, and what the program's prior sites sum to under MCMC.

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(100, 1))
        >>> y = (X[:, 0] + 0.5 * rng.normal(size=100) > 0).astype(int)
        >>> moe = MixtureOfExperts(2, expert="logistic", priors={}, seed=0, progress=False).fit(X, y)
        >>> round(float(moe.log_likelihood(X, y) + moe._log_prior()) / 100 - moe.lower_bound_, 10)
        0.0
        """
        priors = self._expert_priors()
        assert priors is not None, "_log_prior needs priors"
        return priors.log_prior(self._gate, self._experts)

    def model(self, data: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Gate and expert globals, then ``z_n ~ gate(x_n)`` (enumerated) and ``y_n ~ expert_z(x_n)``."""
        x, y = data
        k, p = self.n_experts, x.shape[1]
        opts = {"dtype": x.dtype, "device": x.device}
        if self.priors is None:
            with pyro.plate("gates", k - 1):
                gate_coef = pyro.sample("gate_coef", self._prior("gate_coef", k - 1, (p,), opts))
                gate_intercept = pyro.sample("gate_intercept", self._prior("gate_intercept", k - 1, (), opts))
        else:  # the free rows' prior (ReferencedNormal) correlates them: one site each, outside the plate
            gate_coef = pyro.sample("gate_coef", self._prior("gate_coef", k - 1, (p,), opts))
            gate_intercept = pyro.sample("gate_intercept", self._prior("gate_intercept", k - 1, (), opts))
        sites = self._expert_family().sites(k, p, self._n_classes)
        with pyro.plate("experts", k):
            params = {
                site: pyro.sample(site, self._prior(site, k, spec.event_shape, opts, spec.support))
                for site, spec in sites.items()
            }
        gate = self._make_gate(gate_coef, gate_intercept)
        experts = self._make_experts(params)
        with self._data_plate(x.shape[0]) as idx:
            xi = x[idx]
            z = pyro.sample("z", gate.pyro_dist(x=xi), infer={"enumerate": "parallel"})
            pyro.sample("y", experts.pyro_dist(z, x=xi), obs=y[idx])

    def _arviz_dims(self) -> dict[str, list[str]]:
        return {"gate_coef": ["gate", "feature"], "gate_intercept": ["gate"], **self._expert_family().site_dims()}

    # ------------------------------------------------------------------- EM
    def _em_initialize(self, data: Any, generator: torch.Generator) -> None:
        """Responsibilities by :func:`~ppmix.models.moe_moves.initial_responsibilities` (k-means on the weighted
        rows of :class:`~ppmix.models.batch.Batch` data), then one M-step."""
        (x, y), weight = split_weights(data)
        k = self.n_experts
        zeros = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device)
        self._gate = self._make_gate(zeros[:-1].clone(), zeros[:-1, 0].clone())
        sites = self._expert_family().sites(k, x.shape[1], self._n_classes)
        params = {
            site: (x.new_ones if spec.support is constraints.positive else x.new_zeros)(k, *spec.event_shape)
            for site, spec in sites.items()
        }
        self._experts = self._make_experts(params)
        self._m_step(data, initial_responsibilities(x, y, k, self.init_params, generator, weight))

    def _log_joint(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._gate.log_prob(x) + self._experts.log_prob((x, y))

    def _e_step(self, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Responsibilities and the EM objective: the log-likelihood ``sum_n log sum_k pi_k(x_n) p_k(y_n | x_n)``
        (row ``n`` counted ``w_n`` times on :class:`~ppmix.models.batch.Batch` data) less
        :meth:`_ridge_penalty`."""
        rows, weight = split_weights(data)
        resp, log_norm = normalize_log_joint_(self._log_joint(*rows))
        return resp, _weighted_sum(log_norm.reshape(-1), weight) - self._ridge_penalty()

    def _penalised_log_likelihood(
        self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """EM's objective on standardised data, differentiable in the parameters: the log-likelihood
        ``sum_n w_n log sum_k pi_k(x_n) p_k(y_n | x_n)`` (``w_n = 1`` without row ``weight``) less
        :meth:`_ridge_penalty` (plus :meth:`_log_prior` with ``priors``)."""
        return _weighted_sum(torch.logsumexp(self._log_joint(x, y), dim=1), weight) - self._ridge_penalty()

    #: what gives posterior draws (the PointEstimateWarning's remedy; :func:`~ppmix.models._arviz.draw_remedies`)
    posterior_remedy = (
        "fit with engine='svi' with guide='normal' or engine='mcmc' (N(0, 10^2) priors on the standardised "
        "slopes; minutes beyond a few hundred rows); where the gate saturates or an expert separates its classes, "
        "a proper prior (priors={}, MAP-EM) or a larger ridge gives to_arviz's Laplace approximation curvature"
    )

    def _laplace_target(self, data: Any) -> LaplaceTarget:
        """What ``to_arviz`` takes its Laplace approximation of (:func:`~ppmix.models._arviz.laplace_draws`): EM's
        objective, :meth:`_penalised_log_likelihood`: with ``priors``, the log posterior density under them; else
        under the prior the ridge stands for: ``N(0, 1 / ridge)`` on the (standardised) slopes of the gate and of
        logistic, softmax and Poisson experts, ``N(0, scale_k^2 / ridge)`` on a Gaussian expert's, flat on the
        intercepts and noise scales.
        The program's log-likelihood alone (flat priors everywhere) has no curvature along the slopes of a
        saturated gate or of near-separable experts; this prior keeps their Laplace draws finite.

        Examples
        --------
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(80, 1, generator=g, dtype=torch.float64)
        >>> y = (x[:, 0] + 0.3 * torch.randn(80, generator=g, dtype=torch.float64) > 0).long()
        >>> moe = MixtureOfExperts(2, expert="logistic", seed=0, progress=False).fit(x, y)
        >>> target = moe._laplace_target(moe.prepare_data(x, y))
        >>> round(float(target.log_density(target.values)) / 80 - moe.lower_bound_, 8)  # EM's objective per row
        0.0
        """
        values = self._get_globals()
        x, y = self._require_y(split_weights(data)[0])

        def log_density(point: dict[str, torch.Tensor]) -> torch.Tensor:
            self._assign_globals(point)
            return self._penalised_log_likelihood(x, y)

        held = {}
        if isinstance(self._experts, SoftmaxExpert):  # the reference class stays at zero (a common shift is flat)
            held = {name: torch.zeros_like(values[name], dtype=torch.bool) for name in ("coef", "intercept")}
            for mask in held.values():
                mask[:, -1] = True
        return LaplaceTarget(values, global_supports(self, data, list(values)), log_density, held)

    @property
    def ridge_value(self) -> float:
        """``ridge``, or its default for the experts' family (``default_ridge``) when it is None."""
        return self._expert_family().default_ridge if self.ridge is None else float(self.ridge)

    def _ridge_penalty(self) -> torch.Tensor:
        """The penalty of the EM objective, on the standardised scale: with ``priors``, minus :meth:`_log_prior`
        (MAP-EM); else the ridge term, the gate's and the experts' ``penalty()`` (``ridge / 2 * ||coef||^2``; for
        Gaussian experts ``ridge ||coef[k]||^2 / (2 scale[k]^2)``).

        Every M-step maximises the log-likelihood less exactly this (a Gaussian prior on the
        slopes), so ``history_`` and ``lower_bound_`` are the penalised log-likelihood and never
        fall. With the log-likelihood alone they could: a saturated gate's slopes drift under
        the ridge at every M-step (a gate of norm 800 lost 1e-6 nats per step). Under ``priors`` the
        components' ``penalty()`` is minus the same log prior up to a constant, which the M-steps leave out."""
        if self.priors is not None:
            return -self._log_prior()
        return self._gate.penalty().sum() + self._experts.penalty().sum()

    def _m_step(self, data: Any, resp: torch.Tensor) -> None:
        """Experts by weighted least squares / weighted IRLS, gate by Newton on the soft targets (the
        responsibilities times the rows' weights on :class:`~ppmix.models.batch.Batch` data; the ridge
        unchanged)."""
        (x, y), weight = split_weights(data)
        if weight is not None:
            resp = resp * weight[:, None]
        self._experts.fit((x, y), resp)
        self._gate.fit(x, resp)
        self._invalidate_guide()

    # ------------------------------------------------------------------- fit
    def fit(
        self, X: Any, y: Any = None, *, sample_weight: Any = None, engine: str = "em", **options: Any
    ) -> "MixtureOfExperts":
        """Fit by ``engine`` (``"em"``, ``"svi"`` or ``"mcmc"``); see :meth:`MixtureModel.fit`.

        ``y`` is required (binary 0/1 for logistic experts).

        ``sample_weight`` (EM only): one non-negative weight per row, scikit-learn's semantics (an integer
        weight is the row repeated that many times, zero drops it). Everything the fit does is weighted: the
        standardisation of ``X`` and the scales of ``y``, the k-means start, the E-step's objective, the
        M-step (responsibilities times the weights; the ridge unchanged), the restarts, the split-and-merge
        proposals and the polish, so integer weights give the fit of the repeated rows (to rounding; the
        random start draws the same gate for both). ``split_merge_search="screened"`` refuses it.

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(-3, 3, size=(60, 1))
        >>> y = np.where(X[:, 0] < 0, 2 * X[:, 0], -3 * X[:, 0] + 1) + 0.1 * rng.normal(size=60)
        >>> w = rng.integers(0, 3, size=60)
        >>> weighted = MixtureOfExperts(2, n_init=2, seed=0, progress=False).fit(X, y, sample_weight=w)
        >>> repeated = MixtureOfExperts(2, n_init=2, seed=0, progress=False).fit(X.repeat(w, 0), y.repeat(w))
        >>> bool(np.allclose(weighted.coef_, repeated.coef_, rtol=1e-8, atol=1e-10))
        True
        """
        if sample_weight is not None and self.split_merge and self.split_merge_search == "screened":
            raise ValueError(SCREENED_WEIGHTS)
        object.__setattr__(self, "_fit_sample_weight", sample_weight)  # the scales prepare_data fits are weighted
        try:
            with convergence_warnings_ignored(engine == "em" and self.polish):  # the polish's verdict replaces EM's
                super().fit(X, y, sample_weight=sample_weight, engine=engine, **options)
        finally:
            object.__setattr__(self, "_fit_sample_weight", None)
        train = self._train_data if sample_weight is None else self._weigh(self._train_data, sample_weight)
        if engine == "em":
            em = FitResult(self.history_, self.n_iter_, self.converged_)
            em = polished(self, self._em_data(train), em, options)
            self._record_result("em", split_and_merge(self, train, options, em))
            warn_unconverged(self)
        if engine in ("em", "svi"):
            self._canonical_order(train)
        return self

    def _canonical_order(self, data: Any) -> None:
        """Order experts by decreasing mean gate probability over the training rows (weighted where ``data`` is
        :class:`~ppmix.models.batch.Batch`); re-zero the last gate."""
        (x, _), weight = split_weights(data)
        gate = self._gate.log_prob(x).exp()
        mean = gate.mean(0) if weight is None else (weight[:, None] * gate).sum(0) / weight.sum()
        order = torch.argsort(mean, descending=True, stable=True)
        gate_coef, gate_intercept = self._gate.coef[order], self._gate.intercept[order]
        self._gate = self._make_gate((gate_coef - gate_coef[-1])[:-1], (gate_intercept - gate_intercept[-1])[:-1])
        self._experts = self._make_experts({n: v[order] for n, v in self._experts.state_dict().items()})
        self._invalidate_guide()

    # ---------------------------------------------------------- parameters
    def _parts(self) -> ExpertParts:
        """How the gate and the experts are built under the current settings (standardised covariates)."""
        floor = getattr(self, "_noise_floor", self.min_variance)
        return ExpertParts(self._expert_family(), self.n_experts, self.ridge_value, floor, self._expert_priors())

    def _make_gate(self, free_coef: torch.Tensor, free_intercept: torch.Tensor) -> SoftmaxGate:
        return self._parts().gate(free_coef, free_intercept)

    def _make_experts(self, params: dict[str, torch.Tensor]) -> GaussianExpert | LogisticExpert | SoftmaxExpert:
        return self._parts().experts(params)

    def _get_globals(self) -> dict[str, torch.Tensor]:
        return parts_globals(self._gate, self._experts)

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        self._assign_globals({k: torch.as_tensor(v).detach().to(**opts) for k, v in values.items()})

    def _assign_globals(self, values: dict[str, torch.Tensor]) -> None:
        """Build the gate and the experts from ``values`` (``_get_globals``' keys) as they are: unlike
        :meth:`_set_globals`, without detaching or converting them, so that autograd sees through."""
        self._gate, self._experts = self._parts().from_globals(values)
        self._invalidate_guide()

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """The globals and the covariates' scales; under ``priors``, also the response's mean and sd on the
        training data, which scale the experts' priors (``y_mean``, ``y_std``, where a fit set them)."""
        tensors = {**self._get_globals(), "x_mean": self._x_mean.clone(), "x_scale": self._x_scale.clone()}
        if self.priors is not None:
            scale = self._target_scale()
            opts = {"dtype": self.dtype, "device": self._device}
            tensors.update(
                y_mean=torch.as_tensor(scale["mean"]).to(**opts), y_std=torch.as_tensor(scale["std"]).to(**opts)
            )
        return tensors

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        d, classes = self.n_features_in_, getattr(self, "classes_", None)
        shapes = {
            **self._parts().global_shapes(d, None if classes is None else len(classes)),
            "x_mean": (d,),
            "x_scale": (d,),
        }
        return shapes if self.priors is None else {**shapes, "y_mean": (), "y_std": ()}

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        opts = {"dtype": self.dtype, "device": self._device}
        self._x_mean, self._x_scale = tensors["x_mean"].to(**opts), tensors["x_scale"].to(**opts)
        if "y_mean" in tensors:
            self._y_mean, self._y_std = tensors["y_mean"].to(**opts), tensors["y_std"].to(**opts)
        self._set_globals({k: v for k, v in tensors.items() if k not in ("x_mean", "x_scale", "y_mean", "y_std")})

    @classmethod
    def from_parameters(
        cls,
        *,
        gate_coef: Any,
        gate_intercept: Any,
        coef: Any,
        intercept: Any,
        scale: Any = None,
        feature_names: list[str] | None = None,
        engine: str = "given",
        **kwargs: Any,
    ) -> Self:
        """A fitted model with the given parameters on the user's scale.

        ``scale=None`` means logistic experts (unless ``expert=`` says otherwise). ``gate_coef`` has shape ``(K, P)`` or
        ``(K-1, P)`` (then the last gate is zero); it is shifted so its last row is zero. ``kwargs`` go to the
        constructor.

        Examples
        --------
        >>> import numpy as np
        >>> moe = MixtureOfExperts.from_parameters(gate_coef=[[1.0], [0.0]], gate_intercept=[0.0, 0.0],
        ...                                        coef=[[1.0], [-1.0]], intercept=[0.0, 0.0], scale=[1.0, 1.0])
        >>> moe.predict(np.zeros((1, 1))).tolist()
        [0.0]
        """
        given = dict(gate_coef=gate_coef, gate_intercept=gate_intercept, coef=coef, intercept=intercept, scale=scale)
        return model_from_parameters(cls, **given, feature_names=feature_names, engine=engine, **kwargs)

    @classmethod
    def _from_families(cls, gate: SoftmaxGate, experts: GaussianExpert | LogisticExpert, **kwargs: Any) -> Self:
        """A fitted model from a gate and experts on the user's scale
        (:func:`~ppmix.models.moe_build.model_from_families`)."""
        return model_from_families(cls, gate, experts, **kwargs)

    def _unstandardise(self, coef: torch.Tensor, intercept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        user = coef / self._x_scale
        return user, intercept - user @ self._x_mean

    @property
    def gate_(self) -> SoftmaxGate:
        """The gate on the user's scale (last row zero)."""
        self._check_fitted()
        return SoftmaxGate(*self._unstandardise(self._gate.coef, self._gate.intercept), ridge=self.ridge_value)

    @property
    def experts_(self) -> GaussianExpert | LogisticExpert:
        """The experts on the user's scale."""
        self._check_fitted()
        state = self._experts.state_dict()
        state["coef"], state["intercept"] = self._unstandardise(state["coef"], state["intercept"])
        return self._make_experts(state)

    gate_coef_ = _family_attribute("gate_", "coef", "Gate coefficients ``(K, P)`` on the user's scale (last row zero).")
    gate_intercept_ = _family_attribute("gate_", "intercept", "Gate intercepts ``(K,)`` (last zero).")
    coef_ = _family_attribute("experts_", "coef", "Expert coefficients ``(K, P)`` on the user's scale.")
    intercept_ = _family_attribute("experts_", "intercept", "Expert intercepts ``(K,)`` on the user's scale.")

    @property
    def scale_(self) -> torch.Tensor:
        """Noise standard deviations ``(K,)`` of Gaussian experts."""
        if "scale" not in self._expert_family().site_dims():
            raise AttributeError(f"{self._expert_family().name} experts have no noise scale")
        self._check_fitted()
        return self._experts.scale

    # --------------------------------------------------------- predictions
    def gate_probabilities(self, X: Any) -> Any:
        """``P(z = k | x)`` for every row of ``X``, shape ``(N, K)``."""
        self._check_fitted()
        return to_output(self._gate.log_prob(self._covariates(X)).exp(), X)

    def predict_components(self, X: Any) -> Any:
        """The gate-MAP expert of every row of ``X`` (does not look at ``y``)."""
        self._check_fitted()
        return to_output(self._gate.log_prob(self._covariates(X)).argmax(-1), X)

    def _expert_means(self, x: torch.Tensor) -> torch.Tensor:
        return self._expert_family().expected_target(self._experts, x)

    def predict(self, X: Any) -> Any:
        """``E[y | x]`` for a real target; the most probable class (of ``classes_``) for classifying experts."""
        self._check_fitted()
        x, target = self._covariates(X), self._target
        if target.multiclass:
            return target.decode(self, class_log_proba(self._gate, self._experts, x).argmax(-1), X)
        mean = conditional_mean(self._gate, self._experts, self._expert_family(), x)
        return target.decode(self, (mean >= 0.5).long(), X) if target.classifies else to_output(mean, X)

    @available_if(lambda self: self._target.classifies)
    def predict_proba(self, X: Any) -> Any:
        """``P(y = c | x)`` for every class of ``classes_``, shape ``(N, C)`` (logistic and softmax experts only:
        Gaussian experts have no such method)."""
        self._check_fitted()
        x = self._covariates(X)
        if self._target.multiclass:
            return to_output(class_log_proba(self._gate, self._experts, x).exp(), X)
        return to_output(binary_proba(self._gate, self._experts, x), X)

    def _responsibilities(self, data: Any) -> torch.Tensor:
        return torch.softmax(self._log_joint(*self._require_y(data)), dim=1)

    def _posterior_marginals(self, data: Any) -> dict[str, torch.Tensor]:
        return {"z": self._responsibilities(data)}

    def _pointwise_log_likelihood(self, data: Any) -> torch.Tensor:
        return torch.logsumexp(self._log_joint(*self._require_y(data)), dim=1)

    def sample(self, X: Any) -> dict[str, Any]:  # type: ignore[override]
        """Draw an expert ``z`` and a response ``y`` for every row of ``X``: ``{"y", "z"}``."""
        self._check_fitted()
        z, y = draw(self._gate, self._experts, self._covariates(X), self._generator(offset=7919))
        return {"y": y.cpu().numpy(), "z": z.cpu().numpy()}

    def summary(self) -> dict[str, Any]:
        """A JSON-able description of the fit (parameters on the user's scale)."""
        self._check_fitted()
        out = {
            "model": "MixtureOfExperts",
            "expert": self._expert_family().name,
            "n_experts": self.n_experts,
            "engine": self.engine_,
            "n_iter": self.n_iter_,
            "converged": self.converged_,
            "mean_log_likelihood": self.lower_bound_,
            "gate_coef": self.gate_coef_.tolist(),
            "gate_intercept": self.gate_intercept_.tolist(),
            "coef": self.coef_.tolist(),
            "intercept": self.intercept_.tolist(),
            "feature_names": self.feature_names_in_,
        }
        if "scale" in self._expert_family().site_dims():
            out["scale"] = self.scale_.tolist()
        return out

    _gate: SoftmaxGate
    _experts: GaussianExpert | LogisticExpert
    #: the ``sample_weight`` of the fit under way (None otherwise): the scales ``prepare_data`` fits are weighted
    _fit_sample_weight: Any = None
    _x_mean: torch.Tensor
    _x_scale: torch.Tensor


def _weighted_sum(values: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """``sum_n values[n]``, or ``sum_n weight[n] values[n]`` with row weights (the same sum: weights of one give
    the unweighted value bit for bit)."""
    return values.sum() if weight is None else (values * weight).sum()
