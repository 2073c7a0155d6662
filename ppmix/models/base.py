"""``MixtureModel``: the base class of every generative model in ppmix.

A subclass writes the generative program ``model(data)`` (globals as ``pyro.sample``
sites, discrete latents marked ``infer={"enumerate": "parallel"}``, the data inside
``self._data_plate(N)``). The base class then supplies SVI, MCMC, predictions of the
discrete latents, log-likelihoods, the ELBO, sampling, ArviZ output and save/load.
EM is opt-in: implement ``_em_initialize``, ``_e_step`` and ``_m_step`` (and map the
globals onto your parameters with ``_get_globals``/``_set_globals``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import pyro
import torch
from pyro.nn import PyroModule
from sklearn.base import DensityMixin

from ppmix._estimator import Estimator
from ppmix._validation import NotFittedError, check_matrix, check_options, check_positive_int, resolve_device
from ppmix.engines import run_em, run_gibbs, run_mcmc, run_svi, run_vb
from ppmix.engines.em import EM_HOOKS
from ppmix.engines.enumeration import autoguide, enumerated_log_likelihood
from ppmix.engines.params import local_params, taking_turns
from ppmix.io import Savable, load_model, register_savable
from ppmix.io.model_files import save_model
from ppmix.models import _criteria, _predictions
from ppmix.models._missing import refuse_missing_in_program
from ppmix.models._params import check_seed, store_params
from ppmix.models._subclassing import refuse_stale_hooks
from ppmix.models._weights import check_sample_weight
from ppmix.models.batch import Batch
from ppmix.models.frozen import Fixed, fixing
from ppmix.models.known_latents import Clamp, clamping, known_latents
from ppmix.ops.selection import beats

__all__ = ["MixtureModel"]

ENGINES = ("em", "svi", "mcmc", "gibbs", "vb")
#: the types of attribute values that no Pyro or torch registration applies to (exact types: a ``Parameter`` is a
#: ``Tensor`` subclass, and is registered)
_PLAIN_VALUES = frozenset(
    {bool, int, float, str, type(None), tuple, list, dict, torch.dtype, torch.device, torch.Tensor}
)
#: where ``torch.nn.Module`` and ``PyroModule`` register the names they manage
_REGISTRIES = ("_parameters", "_buffers", "_modules", "_pyro_params", "_pyro_samples")


@Savable.register
@register_savable
class MixtureModel(DensityMixin, Estimator, PyroModule):
    """Base class of ppmix's generative mixture models.

    Parameters
    ----------
    n_components : int
        Number of mixture components ``K``.
    seed : int, optional
        Makes fitting deterministic. ``None`` draws a fresh seed.
    device : str or torch.device, optional
        Where parameters and data live (default CPU).
    dtype : torch.dtype, default torch.float64
    progress : bool, default True
        Show a tqdm progress bar during fits.

    Notes
    -----
    The predictions and scores are those of :mod:`ppmix.models._predictions`, ``bic``/``aic`` those of
    :mod:`ppmix.models._criteria`, ``save``/``load`` those of :mod:`ppmix.io.model_files` (a model is a
    :class:`~ppmix.io.Savable`, registered for loading when its class is defined); a model with an exact E-step
    overrides ``_posterior_marginals``, ``_responsibilities`` and ``_pointwise_log_likelihood``.

    A scikit-learn estimator (``get_params``, ``set_params``, ``clone``, pipelines, grid
    search): a density estimator whose ``score`` is the mean log-likelihood per data point.
    Fitted attributes end in ``_``: ``engine_``, ``history_`` (objective per data
    point after every iteration/step), ``n_iter_``, ``converged_``, ``lower_bound_``,
    ``n_features_in_`` and ``feature_names_in_``.

    Examples
    --------
    A mixture of Student-t distributions written by subclassing:

    >>> import pyro, pyro.distributions as dist, torch
    >>> from ppmix import MixtureModel
    >>> class StudentTMixture(MixtureModel):
    ...     def model(self, x):
    ...         k, d = self.n_components, x.shape[1]
    ...         w = pyro.sample("weights", dist.Dirichlet(torch.ones(k, dtype=x.dtype)))
    ...         with pyro.plate("components", k):
    ...             loc = pyro.sample("loc", dist.Normal(torch.zeros(d, dtype=x.dtype), 10.0).to_event(1))
    ...             scale = pyro.sample("scale", dist.LogNormal(torch.zeros(d, dtype=x.dtype), 1.0).to_event(1))
    ...         with self._data_plate(x.shape[0]) as idx:
    ...             z = pyro.sample("z", dist.Categorical(w), infer={"enumerate": "parallel"})
    ...             pyro.sample("x", dist.StudentT(4.0, loc[z], scale[z]).to_event(1), obs=x[idx])
    >>> x = torch.randn(60, 2, dtype=torch.float64)
    >>> m = StudentTMixture(2, seed=0, progress=False).fit(x, engine="svi", num_steps=20)
    >>> m.predict_proba(x).shape
    torch.Size([60, 2])
    """

    #: the ``fit`` argument giving the discrete latents known for some data points (``"known_labels"``,
    #: ``"known_states"``; None: the model takes none), :mod:`ppmix.models.known_latents`
    known_latents_argument: ClassVar[str | None] = None
    #: number of nested plates in ``model`` (the enumeration dims start left of them)
    max_plate_nesting: ClassVar[int] = 1
    #: name of the plate over data points used by :meth:`_data_plate`
    data_plate_name: ClassVar[str] = "data"
    #: EM settings (see :class:`~ppmix.engines.em.EMModel`), declared once here: these class
    #: defaults, and constructor arguments (kept by :func:`~ppmix.models._params.store_params`) of the
    #: models that write the EM hooks
    n_init: int = 1
    init_iter: int | None = None
    max_iter: int = 100
    tol: float = 1e-6
    reg_covar: float = 1e-6
    init_params: str = "kmeans"
    warm_start: bool = False

    def __init__(
        self,
        n_components: int = 1,
        *,
        seed: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float64,
        progress: bool = True,
    ) -> None:
        super().__init__()
        store_params(self, locals())
        object.__setattr__(self, "_globals", {})
        object.__setattr__(self, "_guide_cache", None)
        object.__setattr__(self, "_variational_guide", None)
        object.__setattr__(self, "_subsample_size", None)
        object.__setattr__(self, "_bayesian", False)

    def __setattr__(self, name: str, value: Any) -> None:
        """Plain values (settings, numbers, containers, plain tensors) under a name that Pyro and torch have not
        registered (no parameter, buffer, module or ``PyroParam`` of that name) are kept as they are, which is what
        ``PyroModule.__setattr__`` does for them after its checks; everything else goes through those checks. A
        small fit sets some fifty attributes, and the checks cost more than its first E-step."""
        if type(value) in _PLAIN_VALUES and not any(name in self.__dict__.get(kind, ()) for kind in _REGISTRIES):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    # ================================================================ to write
    def model(self, data: Any) -> None:
        """The generative program; subclasses must define it."""
        raise NotImplementedError(f"{type(self).__name__} must define model(data)")

    def guide(self, data: Any) -> None:
        """The variational family. Default: a point mass (``AutoDelta``) on every global
        site at the current parameter values, discrete latents enumerated in the model.

        Override to use another family (e.g. enumerated discrete sites in the guide).

        Its parameters stay local to this model (never in Pyro's global param store), so the
        guides of several models in one session cannot read each other's values.
        """
        with local_params():
            return self._point_guide()(data)

    # ------------------------------------------------------- optional EM hooks
    def _em_initialize(self, data: Any, generator: torch.Generator) -> None:
        """Set starting parameters for one EM restart (EM opt-in)."""
        raise NotImplementedError(f"{type(self).__name__} does not support engine='em'")

    def _e_step(self, data: Any) -> tuple[Any, torch.Tensor]:
        """Return ``(statistics for the M-step, objective at the current parameters)``."""
        raise NotImplementedError(f"{type(self).__name__} does not support engine='em'")

    def _m_step(self, data: Any, stats: Any) -> None:
        """Update the parameters in place from the E-step statistics."""
        raise NotImplementedError(f"{type(self).__name__} does not support engine='em'")

    @property
    def supports_em(self) -> bool:
        """Whether this model writes the EM hooks (``_em_initialize``, ``_e_step``, ``_m_step``; see
        :class:`~ppmix.engines.em.EMModel` for the whole protocol)."""
        cls = type(self)
        return all(getattr(cls, name) is not getattr(MixtureModel, name) for name in EM_HOOKS)

    # ------------------------------------------------ data handling (overridable)
    #: whether ``X`` may hold missing entries (NaN): models that marginalise them say so
    _accepts_missing: bool = False

    def prepare_data(self, X: Any, y: Any = None, *, fitting: bool = False) -> Any:
        """Validate user input and return what ``model``/``guide`` receive.

        Default: a single 2-D float matrix; ``y`` is ignored (scikit-learn's convention for
        unsupervised estimators, so they fit inside pipelines and cross-validation).
        """
        if not fitting:
            return self._fitted_matrix(X, allow_missing=self._accepts_missing)
        x, names = check_matrix(
            X,
            "X",
            dtype=self.dtype,
            device=self._device,
            allow_missing=self._accepts_missing,
            code_frame=self._frame_coder(learn=True),
        )
        self.n_features_in_ = int(x.shape[1])
        self.feature_names_in_ = names
        return x

    def _fitted_matrix(self, X: Any, *, allow_missing: bool = False) -> torch.Tensor:
        """``X`` checked as a matrix of the columns the model was fitted on (their number and names), in the
        model's dtype and on its device."""
        x, _ = check_matrix(
            X,
            "X",
            dtype=self.dtype,
            device=self._device,
            n_features=self.n_features_in_,
            feature_names=self.feature_names_in_,
            allow_missing=allow_missing,
            code_frame=self._frame_coder(learn=False),
        )
        return x

    def _frame_coder(self, *, learn: bool) -> Callable[[Any, str], Any] | None:
        """What a DataFrame ``X`` becomes before it is read as numbers (``check_matrix``'s ``code_frame``; ``learn``
        in fit); default: nothing (its columns must be numbers)."""
        return None

    def _em_data(self, data: Any) -> Any:
        """Data as the EM hooks want it (e.g. with cached statistics). Default: unchanged."""
        return data

    def _n_observations(self, data: Any) -> int:
        """Number of data points in ``data`` (the size of the data plate)."""
        return int(data.shape[0])

    def _sample_weight_units(self, data: Any) -> tuple[str, int] | None:
        """What one ``sample_weight`` entry weighs in prepared ``data`` and how many there are (e.g. ``("row",
        N)``); None (the default) for a model whose EM hooks do not take :class:`~ppmix.models.batch.Batch`
        data."""
        return None

    def _weigh(self, data: Any, sample_weight: Any, *, fitting: bool = True) -> Batch:
        """Prepared ``data`` with its ``sample_weight`` checked (one finite, non-negative entry per unit of
        :meth:`_sample_weight_units`; for ``fitting``, as many positive ones as components where a unit is a
        row), for the EM hooks, in the model's dtype (weights of any scale are first brought near one by an exact
        power of two, :func:`~ppmix.models._weights.in_safe_range`, so the dtype holds them)."""
        units = self._sample_weight_units(data)
        if units is None:
            raise TypeError(f"{type(self).__name__} does not take sample_weight")
        unit, count = units
        weight = check_sample_weight(
            sample_weight,
            count,
            unit,
            dtype=torch.float64,
            device=torch.device("cpu"),
            min_positive=int(self.n_components) if fitting and unit == "row" else 1,
            rescale=True,  # weights of any scale (1e-300, 1e300) in the dtype's safe range
        )
        return Batch(data, weight.to(dtype=self.dtype, device=self._device))

    def _observed_data(self, data: Any) -> dict[str, torch.Tensor]:
        """Observed sites and values, for ArviZ. Default: the matrix under the name ``"x"``."""
        return {"x": data}

    def _init_values(self, data: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Starting values of the global sites for SVI/MCMC.

        Default: for models with EM, the best (by objective) of ``n_init`` EM
        initialisations; otherwise none, and the prior medians are used (override
        this for data-driven starts).
        """
        if not self.supports_em:
            return {}
        em_data = self._em_data(data)
        best: tuple[float, dict[str, torch.Tensor]] | None = None
        for restart in range(int(self.n_init)):
            self._em_initialize(em_data, generator if restart == 0 else self._generator(restart))
            objective = float(self._e_step(em_data)[1])
            if beats(objective, None if best is None else best[0], getattr(self, "dtype", torch.float64)):
                best = (objective, self._get_globals())
        assert best is not None
        return best[1]

    # ---------------------------------------------------------------- globals
    def _get_globals(self) -> dict[str, torch.Tensor]:
        """Current point estimates of the global sites, keyed by site name."""
        return {k: v.detach().clone() for k, v in self._globals.items()}

    def _set_globals(self, values: dict[str, torch.Tensor]) -> None:
        """Set the point estimates of the global sites (e.g. after SVI or MCMC)."""
        object.__setattr__(self, "_globals", {k: torch.as_tensor(v).detach() for k, v in values.items()})
        self._invalidate_guide()

    def _invalidate_guide(self) -> None:
        object.__setattr__(self, "_guide_cache", None)

    def _point_guide(self) -> Any:
        if self._guide_cache is None:
            object.__setattr__(self, "_guide_cache", autoguide(self.model, "delta", self._get_globals()))
        return self._guide_cache

    @contextlib.contextmanager
    def _parameters_restored(self) -> Iterator[None]:
        """Inside the context the parameters may be set to anything (e.g. posterior draws, one by one); after it
        the fitted state and guide (e.g. a trained ``AutoNormal``) are exactly as they were."""
        saved_state, saved_guide = self._state_tensors(), self._guide_cache
        try:
            yield
        finally:
            self._load_state_tensors(saved_state)
            object.__setattr__(self, "_guide_cache", saved_guide)

    @property
    def variational_guide_(self) -> Any:
        """The fitted distributional guide of an SVI fit with ``guide="normal"`` (else None).

        Predictions always use the point estimates; this guide gives ArviZ its
        posterior draws and :meth:`elbo` its variational family.
        """
        return self._variational_guide

    def _set_variational_guide(self, guide: Any) -> None:
        """Record the distributional guide an SVI fit ends with (None clears it); see :attr:`variational_guide_`."""
        object.__setattr__(self, "_variational_guide", guide)

    def _make_svi_guide(self, kind: str, init: dict[str, torch.Tensor]) -> tuple[Any, list[torch.nn.Parameter]]:
        """The guide SVI optimises and a callable returning its parameters.

        ``kind`` is ``"delta"`` (MAP/ML point estimates) or ``"normal"`` (mean-field
        Gaussian in the unconstrained space). A subclass that overrides :meth:`guide`
        gets its own guide, and its parameters are those of the module.
        """
        if type(self).guide is not MixtureModel.guide:
            return self.guide, None
        return autoguide(self.model, kind, init), None

    # ---------------------------------------------------------- model helpers
    def _data_plate(self, size: int, name: str | None = None, dim: int = -1) -> pyro.plate:
        """``pyro.plate`` over data points, subsampled while SVI mini-batches.

        Use it as ``with self._data_plate(N) as idx: ... obs=x[idx]``.
        """
        return pyro.plate(name or self.data_plate_name, size, subsample_size=self._subsample_size, dim=dim)

    def _subsampling(self, batch_size: int | None) -> contextlib.AbstractContextManager[None]:
        """Within this context :meth:`_data_plate` draws mini-batches of ``batch_size``."""
        return self._overriding("_subsample_size", batch_size)

    def bayesian(self) -> contextlib.AbstractContextManager[None]:
        """Within this context ``model`` uses its proper (sampling) priors; see :attr:`is_bayesian`."""
        return self._overriding("_bayesian", True)

    def _fitting_priors(self) -> contextlib.AbstractContextManager[Any]:
        """The priors a point fit maximises with: where ``priors`` are set (a MAP fit: MAP-EM, SVI with a
        point-mass guide; the Laplace approximation at it), the proper priors as set (:meth:`bayesian`);
        otherwise the flat priors of maximum likelihood."""
        return self.bayesian() if getattr(self, "priors", None) is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _overriding(self, name: str, value: Any) -> Iterator[None]:
        """Set the private attribute ``name`` to ``value`` inside the context, restoring it after."""
        previous = getattr(self, name)
        object.__setattr__(self, name, value)
        try:
            yield
        finally:
            object.__setattr__(self, name, previous)

    @property
    def is_bayesian(self) -> bool:
        """True while MCMC runs: models with flat priors for ML should switch to proper ones."""
        return self._bayesian

    @property
    def _device(self) -> torch.device:
        return resolve_device(self.device)

    def _generator(self, offset: int = 0) -> torch.Generator:
        """A fresh ``torch.Generator`` seeded from ``seed + offset`` (from entropy if ``seed`` is None).

        Engines seed restart ``r`` with ``_generator(r)``, so every restart is reproducible.
        """
        gen = torch.Generator()
        seed = check_seed(self.seed)
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed + offset)
        return gen

    # ==================================================================== fit
    def fit(
        self, X: Any, y: Any = None, *, sample_weight: Any = None, engine: str = "em", **options: Any
    ) -> "MixtureModel":
        """Fit the model with one of the engines.

        Parameters
        ----------
        X, y : data (``y`` only for models with a target).
        sample_weight : array-like, optional
            One non-negative weight per row (per sequence for sequence models), as in scikit-learn: an
            integer weight counts as that many copies of the row, zero drops it. EM only (models that
            take it: :meth:`_sample_weight_units`).
        engine : {"em", "svi", "mcmc", "gibbs", "vb"}
            ``"em"``: the model's closed-form coordinate ascent (if it implements it);
            ``"svi"``: :func:`ppmix.engines.svi.run_svi`; ``"mcmc"``: NUTS via
            :func:`ppmix.engines.mcmc.run_mcmc`; ``"gibbs"``: blocked Gibbs sweeps for models with
            conjugate priors, :func:`ppmix.engines.conjugate_gibbs.run_gibbs`; ``"vb"``: variational-Bayes EM
            (Mixture, GMM, HMM: conjugate families), :func:`ppmix.engines.vb.run_vb`.
        **options
            Passed to the engine (e.g. ``num_steps``, ``lr``, ``batch_size`` for SVI;
            ``num_samples``, ``warmup_steps`` for MCMC; ``n_init``, ``max_iter``,
            ``tol`` for EM override the constructor's values), but for the latents known for some data points,
            under the name :attr:`known_latents_argument` of a structure that takes them (``known_labels`` of
            :class:`~ppmix.models.mixture.Mixture` and :class:`~ppmix.models.gmm.GMM`, ``known_states`` of
            :class:`~ppmix.models.hmm.HMM`; -1 where unknown): clamped in every engine (EM, SVI, MCMC),
            :mod:`ppmix.models.known_latents`; and ``fixed``, a dict of parameters kept exactly as given while
            the others are fitted given them (EM, SVI, MCMC, Gibbs; :class:`~ppmix.models.mixture.Mixture`,
            :class:`~ppmix.models.gmm.GMM`, :class:`~ppmix.models.hmm.HMM`), by site name (``weights``,
            ``initial``, ``transition``, the family's sites such as ``locs``, ``scales``, ``rate``) or fitted
            attribute (``weights_``, ``means_``, ``covariances_``, ``startprob_``, ``transmat_``):
            :mod:`ppmix.models.frozen`.

        Returns
        -------
        self
        """
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}; got {engine!r}")
        if engine == "em" and not self.supports_em:
            raise ValueError(f"{type(self).__name__} has no EM updates; use engine='svi' or 'mcmc'")
        refuse_stale_hooks(type(self), MixtureModel)
        self._validate_hyperparameters()
        if sample_weight is not None and engine != "em":
            raise ValueError(f"sample_weight is taken by engine='em' only; got engine={engine!r}")
        data = self.prepare_data(X, y, fitting=True)
        if engine != "em":
            refuse_missing_in_program(data, f"fit(engine={engine!r})")
        object.__setattr__(self, "_train_data", data)
        self._set_variational_guide(None)
        known = known_latents(self, options)
        fixed = options.pop("fixed", None)
        runner = {"em": run_em, "svi": run_svi, "mcmc": run_mcmc, "gibbs": run_gibbs, "vb": run_vb}[engine]
        check_options(runner, options, f"fit(engine={engine!r})")  # e.g. thin= for Gibbs: named, with the accepted
        fit_data = data if sample_weight is None else self._weigh(data, sample_weight)
        with clamping(self, known, data, engine, options), fixing(self, fixed, engine, options):
            return self._record_result(engine, runner(self, fit_data, **options))

    def _record_result(self, engine: str, result: Any) -> "MixtureModel":
        """Record an engine's :class:`~ppmix.engines.result.FitResult` as the fitted attributes
        (``engine_``, ``history_``, ``n_iter_``, ``converged_``, ``lower_bound_``): what an engine run outside
        :meth:`fit` (e.g. :func:`ppmix.distributed.fit_em`) calls to leave the model fitted."""
        self.engine_, self.history_ = engine, list(result.history)
        self.n_iter_, self.converged_ = int(result.n_iter), bool(result.converged)
        self.lower_bound_ = float(result.history[-1]) if result.history else float("nan")
        return self

    def _release_training_data(self) -> None:
        """Drop the prepared training data a fit keeps (for ``to_arviz()`` without data, split-and-merge, restarts),
        e.g. before the model travels to workers."""
        object.__setattr__(self, "_train_data", None)

    def _validate_hyperparameters(self) -> None:
        """Check constructor arguments (called by :meth:`fit`)."""
        check_positive_int(self.n_components, "n_components")
        check_seed(self.seed)
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype; got {self.dtype!r}")

    def _validate_em_settings(self, init_methods: tuple[str, ...]) -> None:
        """``init_params`` one of ``init_methods``; ``n_init`` and ``max_iter`` positive integers."""
        if self.init_params not in init_methods:
            raise ValueError(f"init_params must be one of {init_methods}; got {self.init_params!r}")
        check_positive_int(self.n_init, "n_init")
        check_positive_int(self.max_iter, "max_iter")

    def _output_like(self, X: Any) -> Any:
        """What decides the output type for input ``X`` (tensor in, tensor out); sequence models: its first item."""
        return X

    @property
    def is_fitted(self) -> bool:
        return hasattr(self, "engine_")

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")

    @contextlib.contextmanager
    def _forked_rng(self, offset: int = 0) -> Iterator[None]:
        """Seed torch's global RNG (used by Pyro) from ``seed`` without leaking the state, taking turns with
        other threads (:func:`~ppmix.engines.params.taking_turns`) so that none reseeds it meanwhile."""
        with taking_turns(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self._generator(offset).initial_seed()))
            yield

    # ================================================================ predictions and scores
    def predict_proba(self, X: Any) -> Any:
        """Posterior probabilities ``(N, K)`` of the component of each point (the first enumerated site)."""
        return _predictions.predict_proba(self, X)

    def predict(self, X: Any) -> Any:
        """Most probable component of each point."""
        return _predictions.predict(self, X)

    def fit_predict(self, X: Any, y: Any = None, **fit_options: Any) -> Any:
        """``fit(X, y, **fit_options)``, then :meth:`predict` on the same ``X``."""
        return self.fit(X, y, **fit_options).predict(X)

    def score_samples(self, X: Any) -> Any:
        """``log p(x_n)`` for every row of ``X``."""
        return _predictions.score_samples(self, X)

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Mean log-likelihood per data point (weighted by ``sample_weight``, one per point, where given)."""
        return _predictions.score(self, X, y, sample_weight)

    def log_likelihood(self, X: Any, y: Any = None) -> float:
        """Total log-likelihood ``log p(X | globals)`` at the point estimates."""
        return _predictions.log_likelihood(self, X, y)

    def elbo(self, X: Any, y: Any = None, num_particles: int = 1) -> float:
        """The ELBO of the model and guide, evaluated by Pyro's ``TraceEnum_ELBO``.

        With the default point-mass guide this equals the log-likelihood plus the log prior density of the point
        estimates (zero under flat priors); after an SVI fit with ``guide="normal"`` it is that guide's
        (stochastic) ELBO.
        """
        return _predictions.elbo(self, X, y, num_particles)

    def sample(self, n_samples: int = 1) -> dict[str, Any]:
        """Draw ``n_samples`` new data points (and their latents) from the fitted model.

        Returns a dict keyed by site name (observed and discrete sites). The default runs the model unconditioned
        at the point estimates on an ``n_samples``-row placeholder; models with a faster sampler override it.
        """
        return _predictions.sample(self, n_samples)

    def bic(self, X: Any, y: Any = None) -> float:
        """Bayesian information criterion ``-2 log L + p log N`` (lower is better); ``y`` for models with a target.

        ``N`` is the model's count of observations (the rows of a mixture, the time steps of an HMM) and ``p`` its
        free parameters (``n_parameters``, or counted from the program: :mod:`ppmix.models._criteria`).

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import GMM
        >>> X = np.random.default_rng(0).normal(size=(200, 2))
        >>> gmm = GMM(1, progress=False).fit(X)
        >>> bool(abs(gmm.bic(X) - gmm.aic(X) - gmm.n_parameters * (np.log(200) - 2)) < 1e-9)
        True
        """
        return _criteria.bic(self, X, y)

    def aic(self, X: Any, y: Any = None) -> float:
        """Akaike information criterion ``-2 log L + 2 p`` (lower is better)."""
        return _criteria.aic(self, X, y)

    def _posterior_marginals(self, data: Any) -> dict[str, torch.Tensor]:
        """Posterior probabilities of each enumerated site given ``data`` (tensors)."""
        return _predictions.program_marginals(self, data)

    def _responsibilities(self, data: Any) -> torch.Tensor:
        """``q(z_n = k)`` for the main discrete latent, as a tensor ``(N, K)``."""
        return _predictions.first_site_marginals(self, data)

    def _pointwise_log_likelihood(self, data: Any) -> torch.Tensor:
        """``log p(x_n | globals)`` for every data point, shape ``(N,)``.

        The default traces the model with every enumerated site enumerated in parallel, adds the log-densities of
        all sites inside the data plate and sums the enumerated values out. It is exact when each enumerated latent
        belongs to one data point (mixtures); models with latents spanning several points (HMMs) or nested plates
        override it.
        """
        return enumerated_log_likelihood(
            self.model, self.guide, data, self.max_plate_nesting, self.data_plate_name, type(self).__name__
        )

    def _elbo_tensor(self, data: Any, num_particles: int = 1) -> float:
        """:meth:`elbo` on already prepared data."""
        return _predictions.program_elbo(self, data, num_particles)

    # ================================================================== ArviZ
    def to_arviz(
        self,
        X: Any = None,
        y: Any = None,
        num_samples: int = 100,
        approximation: str | None = "auto",
        *,
        groups: Any = None,
        thin: int = 1,
        log_likelihood_dtype: str = "float32",
        predictive_draws: int | str = "auto",
    ) -> Any:
        """ArviZ ``InferenceData`` of the fit (groups and draws: :func:`ppmix.models._arviz.build_inference_data`).

        ``posterior`` holds the relabelled MCMC draws, an SVI ``normal`` guide's draws, or for EM/``delta``
        SVI Laplace draws at the point estimate (``"auto"``: where the model has one, with at most 500
        parameters; ``"laplace"``: always) or the one point estimate (``None``), which ``az.loo`` cannot
        use (a ``PointEstimateWarning`` says so). Laplace draws are an approximation, not posterior draws: the
        attributes of ``idata``, ``idata.posterior`` and ``idata.sample_stats`` say so (``ppmix_draws="laplace"``,
        ``approximation="laplace"``), and after maximum likelihood (``priors=None``, flat priors) there is no
        ``prior`` group (``to_arviz`` refuses to build one when asked); after MAP-EM (``priors=`` set) the
        ``prior`` group holds those priors, the ones the approximation is taken under. After ``engine="mcmc"``,
        ``sample_stats`` holds NUTS's statistics of every draw (``energy``, ``diverging``, ``tree_depth``, ... for
        ``az.bfmi`` and ``az.plot_energy``); after ``engine="gibbs"`` or Laplace, the log density ``lp`` (no
        ``energy``: ``az.bfmi`` and ``az.plot_energy`` do not apply). ``X`` defaults to the training data.

        Only what is asked is computed, in time and memory linear in it:

        - ``groups``: the groups to build (default all but ``"discrete_posterior"``, every draw's ``(N, K)``
          responsibilities; :data:`~ppmix.models._arviz_options.ALL_GROUPS` lists them; ``posterior`` is always
          built);
        - ``thin``: keep every ``thin``-th draw of every chain;
        - ``log_likelihood_dtype``: ``"float32"`` (default: half the memory; ``az.loo`` sums in float64) or
          ``"float64"``;
        - ``predictive_draws``: the draws of every chain given a replicated data set in ``posterior_predictive``
          (its ``draw`` coordinate names them): ``"auto"`` (every draw up to 20 million replicated values, else
          evenly spaced ones within that), ``"all"`` or a count.

        ``az.plot_loo_pit`` takes one scalar per row: the ``log_likelihood`` holds one value per row, the observed
        data a row of ``D`` features, so name the feature (``d``) with ``y=``/``y_hat=`` (every draw replicated:
        ``predictive_draws="all"`` where ``"auto"`` keeps fewer)::

            az.plot_loo_pit(idata, y=idata.observed_data["x"][:, d],
                            y_hat=idata.posterior_predictive["x"][..., d].stack(__sample__=("chain", "draw")))

        Examples
        --------
        >>> import numpy as np
        >>> from ppmix import GMM
        >>> X = np.random.default_rng(0).normal(size=(100, 2))
        >>> gmm = GMM(2, seed=0, progress=False).fit(X, engine="gibbs", num_samples=50, warmup_steps=20)
        >>> idata = gmm.to_arviz(groups=["log_likelihood"], thin=5)
        >>> sorted(idata.groups()), idata.log_likelihood["x"].shape, str(idata.log_likelihood["x"].dtype)
        (['log_likelihood', 'posterior'], (4, 10, 100), 'float32')
        """
        options = {"groups": groups, "thin": thin, "log_likelihood_dtype": log_likelihood_dtype}
        return self._inference_data(X, y, num_samples, approximation, predictive_draws=predictive_draws, **options)

    def _inference_data(
        self, X: Any, y: Any, num_samples: int, approximation: str | None, per_step: bool = False, **options: Any
    ) -> Any:
        """:meth:`to_arviz` on ``X`` (default the training data) with its keyword ``options``; ``per_step``: a
        sequence model's log-likelihood per step (:meth:`ppmix.models.hmm.HMM.to_arviz`)."""
        from ppmix.models._arviz import build_inference_data
        from ppmix.models._arviz_options import ArvizRequest

        self._check_fitted()
        request = ArvizRequest.checked(**options)
        if (data := self._train_data if X is None else self.prepare_data(X, y)) is None:
            raise ValueError("X is required: this model holds no training data (loaded from disk, or fitted on shards)")
        return build_inference_data(
            self, data, num_samples=num_samples, approximation=approximation, per_step=per_step, request=request
        )

    def _arviz_dims(self) -> dict[str, list[str]]:
        """Dimension names of each global site (after chain and draw), for ArviZ."""
        return {}

    # ============================================================ persistence
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_savable(cls)  # what load_model finds by the name a save records

    def save(self, path: str | Path) -> Path:
        """Write the fitted model to the directory ``path`` atomically (``config.json`` + ``tensors.pt``; see
        :func:`ppmix.io.save_model`).

        Examples
        --------
        >>> import tempfile, numpy as np
        >>> from ppmix import GMM
        >>> X = np.random.default_rng(0).normal(size=(50, 2))
        >>> gmm = GMM(2, seed=0, progress=False).fit(X)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     bool(np.allclose(GMM.load(gmm.save(f"{tmp}/gmm")).score_samples(X), gmm.score_samples(X)))
        True
        """
        return save_model(self, path)

    #: the persistence hooks' defaults, :class:`~ppmix.io.Savable`'s own
    _saved_params = Savable._saved_params
    _extra_state = Savable._extra_state
    _load_extra_state = Savable._load_extra_state
    _state_shapes = Savable._state_shapes
    _upgrade_saved = vars(Savable)["_upgrade_saved"]

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device | None = None) -> "MixtureModel":
        """Load a model written by :meth:`save` (safe tensor loading, version checked)."""
        return load_model(path, expected=cls, map_location=map_location)

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors that :meth:`save` writes; default: the globals."""
        return self._get_globals()

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Inverse of :meth:`_state_tensors`."""
        self._set_globals(tensors)

    # attributes read before fitting
    n_features_in_: int
    feature_names_in_: list[str] | None = None
    _train_data: Any = None
    #: the latents known during a fit (``known_labels``, ``known_states``), clamped by the E-step and the program
    _known_latents: Clamp | None = None
    #: the parameters frozen during a fit (``fixed``), kept by the M-step, the program and the samplers
    _fixed: Fixed | None = None
    #: the sites the last fit held fixed (``fit(..., fixed=...)``; empty: none), which Laplace draws hold too
    fixed_: tuple[str, ...] = ()

    def _fixed_structure_sites(self) -> dict[str, tuple[str, Any]] | None:
        """The structure's own global sites that ``fit(..., fixed=...)`` may freeze, each with its fitted attribute
        and :class:`~ppmix.components.family.SiteSpec` (its family's sites may be frozen too); None (the default):
        the model takes no frozen parameters (:mod:`ppmix.models.frozen`)."""
        return None
