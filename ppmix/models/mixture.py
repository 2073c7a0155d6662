"""``Mixture``: a finite mixture of components of any :class:`~ppmix.components.family.DensityFamily`."""

from __future__ import annotations

from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ppmix._validation import check_n_components, check_positive_int, check_seed, to_output
from ppmix.components.centred import padded_counts
from ppmix.components.family import DensityFamily, PriorKey, SiteSpec, Statistics
from ppmix.components.family_tools import data_rows, family_settings, mixture_statistics, start_points
from ppmix.components.gaussian_family import GaussianFamily
from ppmix.components.gaussian_mixture import GaussianMixtureFamily
from ppmix.components.registry import family_config, family_from
from ppmix.models import _variational as vb
from ppmix.models._family_components import FamilyModel
from ppmix.models._gibbs import MixtureGibbs
from ppmix.models._missing import (
    check_missing_option,
    fill_missing,
    fit_statistics,
    impute_rows,
    log_prob_with_missing,
    partly_observed_e_step,
    partly_observed_rows,
    partly_observed_statistics,
    sample_missing,
)
from ppmix.models._mixture_draws import mixture_draws_log_likelihood, mixture_draws_replicated
from ppmix.models._online import partial_fit
from ppmix.models._params import store_params
from ppmix.models._starts import start_responsibilities
from ppmix.models.batch import Batch, as_batch

__all__ = ["Mixture"]


class Mixture(FamilyModel):
    """Finite mixture: ``z_n ~ Cat(weights)``, ``x_n | z_n = k ~ family(theta_k)``.

    One Pyro program, four engines: ``fit(X, engine="em")`` (closed-form EM through the
    family's weighted statistics, the default), ``"svi"`` (``TraceEnum_ELBO`` on the same
    model), ``"mcmc"`` (NUTS under ``weights ~ Dirichlet(1)`` and the family's weak priors) and,
    for a family whose prior is conjugate (Poisson, Bernoulli, exponential, categorical,
    multinomial), ``"gibbs"`` (blocked Gibbs sweeps of the same posterior, all chains at once:
    :mod:`ppmix.models._gibbs`).
    EM and SVI estimate by maximum likelihood (flat priors, so the ELBO equals the
    log-likelihood). Sharded EM (:func:`ppmix.distributed.fit_em`) and online EM
    (``partial_fit``) work for every family, through its mergeable statistics.

    Parameters
    ----------
    n_components : int, default 1
    family : str or DensityFamily, default "gaussian"
        The components' family: a registered name (:data:`ppmix.components.registry.FAMILIES`, e.g.
        ``"gaussian"``, ``"poisson"``) with its default settings, or a family object
        (e.g. ``GaussianFamily("full", reg_covar=1e-4)``). :class:`~ppmix.models.gmm.GMM` is this
        mixture with the Gaussian family and its settings as arguments.
    n_init : int, default 1
        EM restarts; the best objective is kept.
    max_iter : int, default 1000
        EM's iterations at most. EM converges linearly, slowly where components overlap: a categorical or gamma
        mixture from its start often needs 100-300 iterations to meet ``tol`` (``benchmarks/_defaults_starts.py``);
        a fit that has converged stops there, whatever ``max_iter``. (:class:`~ppmix.models.gmm.GMM`: 100.)
    tol : float, default 1e-6
        EM stops when the log-likelihood per observation changes by at most ``tol`` (nats).
    init_params : {"kmeans", "k-means++", "random"}, default "kmeans"
        ``"kmeans"``: the best (by inertia) of 10 runs of greedy k-means++ seeding and
        Lloyd iterations on a random subsample of ``max(1000, 250 K)`` rows, then every
        row assigned to its nearest centre (:func:`~ppmix.algorithms.kmeans.kmeans_start`: one
        pass over the data beyond a fixed cost); ``"k-means++"``: one seeding on all rows; ``"random"``: random
        responsibilities. The Bernoulli, categorical, exponential and gamma families soften k-means' hard clusters
        (each row counted half to its cluster, half spread over all components: :mod:`ppmix.models._starts`),
        whose extreme frequencies and shapes would hold EM near the start.
    warm_start : bool, default False
        Continue EM from the current parameters on the next ``fit``.
    missing : {"error", "marginalize"}, default "error"
        What a NaN in ``X`` is: an error naming ``X``, or (``"marginalize"``: the Gaussian family, the families
        of independent features, ``"poisson"``, ``"bernoulli"``, ``"categorical"``, ``"exponential"``, ``"gamma"``,
        ``"lognormal"``, the diagonal ``"student_t"``, ``"multinomial"`` and ``"gmm"`` with diagonal Gaussians) an
        entry missing at random: EM scores a row by the marginal density of its observed entries (the multinomial:
        the observed counts given their total) and its M-step takes the missing block's conditional expectations
        (Gaussian) or weighs each feature by whether it is observed (independent features): exact EM; predictions
        and ``score`` take such rows too, and :meth:`impute` fills them in. EM only (``fit``, ``partial_fit``).
    priors : dict, optional
        The priors' hyperparameters, by key (each optional; None: every default): ``"weights"`` the Dirichlet
        concentration of the weights (default 1), and the family's (:meth:`prior_keys` lists them; e.g. Poisson
        ``"rate_concentration"``, ``"rate_rate"``; Bernoulli ``"probs_concentration1"``, ``"probs_concentration0"``;
        categorical and multinomial ``"probs_concentration"``; exponential ``"rate_concentration"``,
        ``"rate_rate"``; Gaussian as for :class:`~ppmix.models.gmm.GMM`; defaults in each family's notes). MCMC,
        Gibbs and ``to_arviz``'s ``prior`` group use them. Given (even ``{}``), ``engine="em"`` is MAP-EM: it
        maximises log-likelihood plus log prior (reported in ``history_``) by the families' MAP updates (every built-in
        family's: conjugate modes, or generalised EM steps where there is no closed form)
        and ``weights = (N_k + alpha - 1) / (N + K (alpha - 1))``; None: maximum likelihood. An unknown key or a
        value outside its domain is a ``ValueError`` naming ``priors``. ``engine="vb"`` takes the family's conjugate
        prior from them too.
    weight_concentration_prior_type : {"dirichlet_process", "dirichlet_distribution"}, default "dirichlet_process"
        ``engine="vb"`` only (variational-Bayes EM, :func:`ppmix.engines.vb.run_vb`: Gaussian components, and the
        Poisson, exponential, Bernoulli, categorical and multinomial families): the weights' prior, stick-breaking
        or Dirichlet.
    weight_concentration_prior : float, optional
        ``engine="vb"`` only: its concentration (default ``1 / n_components``).
    seed, device, dtype, progress : see :class:`~ppmix.models.base.MixtureModel`.

    Attributes
    ----------
    weights_ : Tensor (K,)
    components_ : ComponentFamily
        The fitted components (e.g. ``PoissonComponents`` with ``rate`` ``(K, D)``).
    means_ : Tensor (K, D)

    Notes
    -----
    **Partly labelled fits.** ``fit(X, known_labels=z)`` takes the component of some rows, ``z[n]`` in
    ``0..K-1`` or -1 where unknown: EM's E-step and the enumeration of SVI and MCMC clamp them, and the fit
    maximises ``log p(X, known labels)`` (in ``history_``); every label known gives the supervised closed form,
    none the unsupervised fit (:mod:`ppmix.models.known_latents`: the start, the engines). ``y`` stays ignored.

    **Frozen parameters.** ``fit(X, fixed={"weights": w, "locs": mu})`` keeps the named parameters exactly (by site
    name, or as ``weights_``, ``means_``, ``covariances_``) in every engine and fits the others given them
    (:mod:`ppmix.models.frozen`); ``fixed_`` names them after the fit.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix.components.gaussian_family import GaussianFamily
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(-4, 1, (100, 2)), rng.normal(4, 1, (100, 2))])
    >>> mix = Mixture(2, family=GaussianFamily("full"), seed=0, progress=False).fit(X)
    >>> np.round(np.sort(mix.means_[:, 0].numpy()))
    array([-4.,  4.])

    MAP-EM of Poisson rates under ``Gamma(a, b)``: ``(sum x + a - 1) / (n_k + b)``:

    >>> counts = np.concatenate([rng.poisson(2.0, (200, 1)), rng.poisson(15.0, (200, 1))])
    >>> prior = {"rate_concentration": 201.0, "rate_rate": 20.0}  # a mode of 10, worth 20 rows
    >>> poisson = Mixture(2, family="poisson", priors=prior, seed=0, progress=False).fit(counts)
    >>> np.round(np.sort(poisson.means_[:, 0].numpy()), 1)
    array([ 2.8, 14.7])

    Partly labelled: four clusters in the corners of a rectangle, which EM splits left and right (the wide side);
    a label on one row in ten asks for bottom (0) and top (1), and the fit follows:

    >>> corners = np.array([[-4.0, -2.5], [4.0, -2.5], [-4.0, 2.5], [4.0, 2.5]])
    >>> X = np.repeat(corners, 100, axis=0) + rng.normal(size=(400, 2))
    >>> top = (X[:, 1] > 0).astype(int)
    >>> z = np.where(np.arange(400) % 10 == 0, top, -1)
    >>> np.round(Mixture(2, seed=0, progress=False).fit(X).means_.numpy()[:, 0])  # left and right
    array([-4.,  4.])
    >>> labelled = Mixture(2, seed=0, progress=False).fit(X, known_labels=z)
    >>> np.round(labelled.means_.numpy()[:, 1])  # bottom (0) and top (1)
    array([-2.,  2.])
    >>> float((labelled.predict(X) == top).mean()) > 0.99  # every row, the unlabelled ones too
    True
    """

    known_latents_argument = "known_labels"

    def __init__(
        self,
        n_components: int = 1,
        *,
        family: str | DensityFamily | dict = "gaussian",
        n_init: int = 1,
        max_iter: int = 1000,
        tol: float = 1e-6,
        init_params: str = "kmeans",
        warm_start: bool = False,
        missing: str = "error",
        priors: dict[str, Any] | None = None,
        weight_concentration_prior_type: str = "dirichlet_process",
        weight_concentration_prior: float | None = None,
        seed: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float64,
        progress: bool = True,
    ) -> None:
        super().__init__()
        store_params(self, locals())

    def _component_family(self) -> DensityFamily:
        return family_from(self.family, "family").measured(self._scale)

    def _saved_params(self) -> dict[str, Any]:
        params = super()._saved_params()
        if "family" in params:
            params["family"] = family_config(params["family"])
        return params

    #: the default of a subclass whose constructor does not take ``missing``
    missing: str = "error"

    def _validate_hyperparameters(self) -> None:
        super()._validate_hyperparameters()
        self._validate_family_params()
        check_missing_option(self.missing, self._component_family())

    @property
    def _accepts_missing(self) -> bool:  # type: ignore[override]
        return self.missing == "marginalize"

    partial_fit = partial_fit

    def _gibbs_sampler(self) -> MixtureGibbs:
        """The blocked Gibbs sampler of ``engine="gibbs"`` (:mod:`ppmix.models._gibbs`)."""
        return MixtureGibbs(self)

    # ------------------------------------------- variational Bayes (engine="vb": ppmix.models._variational)
    #: the defaults of a subclass whose constructor does not take them
    weight_concentration_prior_type: str = "dirichlet_process"
    weight_concentration_prior: float | None = None

    @property
    def n_effective_components_(self) -> int:
        """The components whose weight exceeds 1 % (:data:`~ppmix.models._variational.EFFECTIVE_WEIGHT`), whatever
        the engine."""
        self._check_fitted()
        return vb.effective_components(self.weights_)

    def _vb_components(self, data: torch.Tensor, component_prior: Any) -> Any:
        return vb.components_factor(self, data, component_prior)

    def _vb_latent(self, data: torch.Tensor) -> Any:
        return vb.weights_factor(self)

    def _vb_initial_responsibilities(self, data: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return vb.start_responsibilities_of(self, data, generator)

    def _vb_record(self, latent: Any, components: Any) -> None:
        vb.record_weights(self, latent, components)

    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False) -> torch.Tensor:
        x = super().prepare_data(X, y, fitting=fitting)
        measurable = fill_missing(x, self._component_family()) if self._accepts_missing else x
        if fitting:
            check_n_components(self.n_components, x.shape[0])
            self._record_data_scale(measurable)
        else:
            self._component_family().check_data(measurable, "X")
        return x

    # ------------------------------------------------------------ the program
    def model(self, x: torch.Tensor) -> None:
        """``weights -> z_n -> x_n`` with the component index enumerated in parallel."""
        if self._accepts_missing and bool(torch.isnan(x).any()):
            raise ValueError("X has missing entries (NaN): missing='marginalize' is for EM (fit, partial_fit) only")
        k, d = self.n_components, x.shape[1]
        opts = {"dtype": x.dtype, "device": x.device}
        weights = pyro.sample("weights", self._simplex_prior("weights", (), k, opts))
        family = self._sample_components(k, d, opts)
        with self._data_plate(x.shape[0]) as idx:
            z = pyro.sample("z", dist.Categorical(weights), infer={"enumerate": "parallel"})
            if self._known_latents is not None:
                self._known_latents.factor("z", z, idx)
            pyro.sample("x", family.pyro_dist(z), obs=x[idx])

    # -------------------------------------------------------------- globals
    def _get_globals(self) -> dict[str, torch.Tensor]:
        return {"weights": self.weights_.clone(), **self._component_globals()}

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        weights = torch.as_tensor(values["weights"]).to(dtype=self.dtype, device=self._device)
        self.weights_ = weights / weights.sum()
        self._set_component_globals(values)
        self._invalidate_guide()

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        return {"weights": self.weights_.clone(), **self.components_.state_dict()}

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.weights_ = tensors["weights"].to(dtype=self.dtype, device=self._device)
        self._load_component_state(tensors)
        self._invalidate_guide()

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        return {"weights": (self.n_components,), **self._component_state_shapes()}

    def _arviz_dims(self) -> dict[str, list[str]]:
        return {"weights": ["component"], **self._component_dims()}

    # ------------------------------------------------------------------- EM
    def _sample_weight_units(self, data: Any) -> tuple[str, int]:
        return "row", as_batch(data).n_rows

    def _weigh(self, data: Any, sample_weight: Any, *, fitting: bool = True) -> Batch:
        """As :meth:`MixtureModel._weigh`; for ``fitting``, the data scale of the rows just prepared (the variance
        floor) becomes that of the rows counted as often as their weights: for integer weights, the rows repeated."""
        weighted = super()._weigh(data, sample_weight, fitting=fitting)
        if fitting:
            self._record_weighted_data_scale(data, weighted.weight)
        return weighted

    def _em_data(self, data: Any) -> Batch:
        """The batch of the rows (and their weights, any known labels), prepared once by the family; with missing
        entries, as :class:`~ppmix.models._missing.PartlyObserved` rows."""
        batch = as_batch(data).prepared(known=self._known_latents)
        family = self._component_family()
        observed = partly_observed_rows(batch.data, family) if self._accepts_missing else None
        if observed is not None:
            return batch.prepared(observed=observed)
        return batch.prepared(rows=family.prepare(batch.data))

    def _n_observations(self, data: Any) -> float:
        return as_batch(data).n_observations

    def _em_initialize(self, data: Batch, generator: torch.Generator) -> None:
        """Responsibilities from k-means (or its seeding, or at random; on the weighted rows), then one M-step
        (rows with missing entries start with their columns' means filled in)."""
        family = self._component_family()
        if data.observed is not None:
            data = data.prepared(rows=family.prepare(fill_missing(data.data, family, data.weight)), observed=None)
        self.components_ = self._new_components(data_rows(data.rows))
        resp = self._initial_responsibilities(data.rows, generator, data.weight)
        if self.init_params != "random":  # k-means' hard clusters, softened for the families that ask
            resp = start_responsibilities(family, resp)
        if self._fixed is not None:
            resp = self._fixed.start(self, data.rows, resp)
        if data.known is not None:
            resp = data.known.start(resp, start_points(data.rows), weight=data.weight, family=family)
        self._m_step(data, resp)

    def _e_step(self, data: Batch) -> tuple[Statistics, torch.Tensor]:
        """The M-step's statistics under the responsibilities and the log-likelihood
        ``sum_n log sum_k w_k p_k(x_n)`` (every row counted as often as its sample weight), in one pass where
        the family fuses them (:func:`~ppmix.components.family_tools.mixture_statistics`);
        :meth:`_m_step` and :meth:`_em_statistics` take the (merged) statistics as they are. In a partly labelled fit,
        the clamped E-step (:meth:`~ppmix.models.known_latents.Clamp.mixture_e_step`) and ``log p(X, known labels)``."""
        if data.known is not None:
            stats, objective = data.known.mixture_e_step(self, data)
        elif data.observed is not None:
            stats, objective = partly_observed_e_step(self.components_, self.weights_.log(), data.observed, data.weight)
        else:
            stats, objective = mixture_statistics(self.components_, data.rows, self.weights_.log(), data.weight)
        return stats, objective if self.priors is None else objective + self._log_prior()

    def _m_step(self, data: Batch, resp: Statistics | torch.Tensor) -> None:
        """The family's weighted MLE and ``weights = mean responsibility``, from the E-step's statistics or
        from responsibilities ``(N, K)``."""
        self._em_update(self._em_statistics(data, resp))

    def _em_statistics(self, data: Batch, resp: Statistics | torch.Tensor) -> Statistics:
        """What the M-step needs of ``data`` under ``resp`` (responsibilities ``(N, K)``, times the rows' sample
        weights; or the E-step's statistics, returned as they are): statistics that merge across shards
        (:func:`ppmix.distributed.fit_em`)."""
        if isinstance(resp, Statistics):
            return resp
        resp = resp if data.weight is None else resp * data.weight[:, None].to(resp)
        if data.observed is not None:
            return partly_observed_statistics(self.components_, data.observed, resp)
        return self.components_.statistics(data.rows, resp)

    def _em_update(self, stats: Statistics) -> None:
        """The M-step from (merged) statistics: the components' weighted MLE, ``weights`` their total weights;
        with ``priors``, MAP-EM: the family's MAP update and ``weights = (N_k + alpha - 1) / (N + K (alpha - 1))``."""
        counts = stats.counts.to(self.dtype)
        if self._fixed is not None:  # the free parameters given the frozen ones (ppmix.models.frozen)
            stats = self._fixed.given(stats)
        if self.priors is None:
            fit_statistics(self.components_, stats)
        else:
            self._map_update_components(stats)
            counts = counts + self._concentration("weights", (self.n_components,)) - 1
        counts = padded_counts(counts)
        self.weights_ = counts / counts.sum()
        if self._fixed is not None:
            self._fixed.impose(self)
        self._invalidate_guide()

    def _fixed_structure_sites(self) -> dict[str, tuple[str, SiteSpec]]:
        return {"weights": ("weights_", SiteSpec(constraints.simplex, (int(self.n_components),), shared=True))}

    def _structure_prior_keys(self) -> dict[str, PriorKey]:
        return {"weights": PriorKey("the Dirichlet concentration of the weights (default 1)", "concentration")}

    def _em_global_objective(self, n_observations: int) -> torch.Tensor:
        """The objective's term that is no sum over the rows (counted once on shards, :func:`ppmix.distributed.fit_em`):
        MAP-EM's log prior (zero without ``priors``)."""
        return self.weights_.new_zeros(()) if self.priors is None else self._log_prior()

    def _log_prior(self) -> torch.Tensor:
        """MAP-EM's log prior: ``log Dirichlet(weights | alpha)`` and the components' (the family's)."""
        alpha = self._concentration("weights", (self.n_components,))
        return dist.Dirichlet(alpha).log_prob(self.weights_) + self._map_log_prior_components()

    # ---------------------------------------------------------- predictions
    def _log_joint(self, data: torch.Tensor) -> torch.Tensor:
        if self._accepts_missing:
            return log_prob_with_missing(self.components_, data) + self.weights_.log()
        return self.components_.log_prob(data) + self.weights_.log()

    def impute(self, X: Any, *, method: str = "mean", seed: int | None = None) -> Any:
        """``X`` with every missing entry (NaN) filled in given the row's observed entries under the fitted mixture;
        observed entries, and rows without a missing entry, as they are. The families that ``missing="marginalize"``
        serves, but the multinomial (which does not model a row's total); any ``missing`` setting.

        Parameters
        ----------
        X : array-like (N, D)
        method : {"mean", "sample"}, default "mean"
            ``"mean"``: the conditional expectation, each component's conditional mean (Gaussian conditioning on
            the observed block; a feature's mean under independent features) weighted by the row's posterior
            probabilities given the observed entries (categorical features: the most probable level).
            ``"sample"`` (Gaussian components, and mixtures of Gaussians): a draw from the conditional
            distribution, a component from the row's posterior probabilities, then the missing block from that
            component's conditional Gaussian (multiple imputation: one draw per call).
        seed : int, optional
            The draws' seed (``"sample"``); by default the model's ``seed`` (the same draws on every call).

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.multivariate_normal([0, 0], [[1.0, 0.9], [0.9, 1.0]], size=500)
        >>> gmm = Mixture(1, family={"name": "gaussian", "covariance_type": "full"}, seed=0, progress=False).fit(X)
        >>> filled = gmm.impute(np.array([[2.0, np.nan]]))
        >>> bool(abs(filled[0, 1] - 0.9 * 2.0) < 0.2)
        True
        >>> draws = gmm.impute(np.tile([[2.0, np.nan]], (2000, 1)), method="sample", seed=0)[:, 1]
        >>> bool(abs(draws.mean() - filled[0, 1]) < 0.05), bool(abs(draws.std() - np.sqrt(1 - 0.9**2)) < 0.05)
        (True, True)
        """
        self._check_fitted()
        if method not in ("mean", "sample"):
            raise ValueError(f"method must be 'mean' or 'sample'; got {method!r}")
        family = self._component_family()
        check_missing_option("marginalize", family)
        x = self._fitted_matrix(X, allow_missing=True)
        if method == "mean":
            return to_output(impute_rows(self.components_, self.weights_.log(), x), X)
        if not isinstance(family, (GaussianFamily, GaussianMixtureFamily)):
            raise ValueError(
                f"method='sample' is for Gaussian components and mixtures of Gaussians; got the {family.name!r} family"
            )
        generator = self._generator(offset=7927) if seed is None else torch.Generator().manual_seed(check_seed(seed))
        return to_output(sample_missing(self.components_, self.weights_.log(), x, generator), X)

    def _responsibilities(self, data: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self._log_joint(data), dim=1)

    def _posterior_marginals(self, data: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"z": self._responsibilities(data)}

    def _pointwise_log_likelihood(self, data: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(self._log_joint(data), dim=1)

    def _draws_log_likelihood(
        self, data: torch.Tensor, draws: dict[str, torch.Tensor], marginals: bool = True, dtype: Any = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`_pointwise_log_likelihood` ``(S, N)`` (in ``dtype``, default the model's) and (``marginals``)
        :meth:`_posterior_marginals` ``{"z": (S, N, K)}`` at every one of ``S`` draws of the globals
        ``{site: (S, ...)}``, for ``to_arviz``: a block of draws scored by one ``log_prob``
        (:func:`~ppmix.models._mixture_draws.mixture_draws_log_likelihood`)."""
        return mixture_draws_log_likelihood(self, data, draws, marginals, dtype)

    def _draws_replicated(self, data: torch.Tensor, draws: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One replicated data set per draw of the globals, ``{"x": (S, N, D)}``, for ``to_arviz``'s
        ``posterior_predictive`` (:func:`~ppmix.models._mixture_draws.mixture_draws_replicated`)."""
        return mixture_draws_replicated(self, data, draws)

    @property
    def n_parameters(self) -> int:
        """Number of free parameters: ``K - 1`` weights and the components'."""
        return (int(self.n_components) - 1) + self._component_parameters

    def sample(self, n_samples: int = 1) -> dict[str, Any]:
        """Draw ``n_samples`` points: ``{"x": (n, D) array, "z": (n,) component indices}``."""
        self._check_fitted()
        n = check_positive_int(n_samples, "n_samples")
        gen = self._generator(offset=7919)
        z = torch.multinomial(self.weights_.cpu(), n, replacement=True, generator=gen).to(self._device)
        x = self.components_.sample(z, generator=gen if self._device.type == "cpu" else None)
        return {"x": x.cpu().numpy(), "z": z.cpu().numpy()}

    # ------------------------------------------------------------ attributes
    def summary(self) -> dict[str, Any]:
        """A JSON-able description of the fit."""
        self._check_fitted()
        return {
            "model": type(self).__name__,
            "n_components": self.n_components,
            "family": {"name": self._component_family().name, **family_settings(self._component_family())},
            "engine": self.engine_,
            "n_iter": self.n_iter_,
            "converged": self.converged_,
            "mean_log_likelihood": self.lower_bound_,
            "weights": to_output(self.weights_, None).tolist(),
            "means": to_output(self.means_, None).tolist(),
            "feature_names": self.feature_names_in_,
        }
