"""PRESTO: partition the data and train one model per part (Sangani et al., Algorithm 1).

PRESTO minimises the summed regularised training loss of ``K`` component models,
each trained on its own part of a partition of the data,

``min_{S_1..S_K} sum_k G(S_k)``, ``G(S) = min_theta sum_{i in S} l_i(theta) + R(theta)``,

by majorisation-minimisation over the modular upper bound (eq. 13 of the paper):
at the current partition every pair ``(i, k)`` gets a score ``M[i, k]``, and the
new partition is the cheapest assignment of every point to one part under the
capacities, found greedily by one sort of all ``N K`` scores.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import has_fit_parameter

from ppmix._validation import (
    InvalidDataError,
    NotFittedError,
    as_numpy,
    check_matrix,
    check_n_components,
    check_positive_int,
    check_seed,
    ravel_column_vector,
    resolve_device,
    to_output,
)
from ppmix.models._target import TargetCoding
from ppmix.models._weights import check_sample_weight
from ppmix.ops.threads import threads_for, torch_threads
from ppmix.optimizers.presto._guarantee import theorem2_guarantee
from ppmix.optimizers.presto._mm import mm_sweep
from ppmix.optimizers.presto._persistence import PrestoPersistence
from ppmix.optimizers.presto._routing import fit_router, router_cost, routing_proba
from ppmix.optimizers.presto._scaling import (
    standardise_x,
    standardise_y,
    training_scales,
)
from ppmix.optimizers.presto.adapters import (
    Adapter,
    check_executor,
    component_kind,
    make_adapter,
    open_executor,
)
from ppmix.optimizers.presto.assignment import initial_partition, partition_onehot, sq_distances

__all__ = ["PRESTO"]

_DTYPE = torch.float64


class PRESTO(PrestoPersistence):
    """Partition ``N`` points into ``K`` parts while training one model per part.

    Implements Algorithm 1 of Sangani et al. (PRESTO) with the practical choices
    of their App. D.3. Each iteration

    1. fits all ``K`` components on their parts;
    2. scores every pair ``(i, k)`` by the modular upper bound (eq. 13):
       ``M[i, k] = alpha * (G(S_k) - G(S_k \\ i))`` for members and
       ``M[i, k] = G({(i, k)}) / alpha`` for non-members;
    3. assigns every point by one sort of all ``M[i, k] + epsilon * ||x_i - c_k||^2``
       (``c_k`` the mean of part ``k``: App. D.3's tie-break, squared to make it a k-means
       term of one joint objective), greedily under the capacity ``ceil((1 + leeway) N / K)``;
    4. accepts the new partition only if it does not increase the bound ``sum_i M[i, part_i]``
       (falling back to single-point improving moves within capacity), and stops when no
       point can improve.

    **Objective.** ``G(S) = min_theta sum_{i in S} l_i(theta) + R(theta)`` with
    ``l_i = -log p(y_i | x_i, theta)``. Logistic and softmax: ``R = ridge/2 ||coef||^2``.
    Linear-Gaussian: ``R = ridge ||coef||^2 / (2 sigma^2)``, the noise variance refitted
    jointly; the intercept is never penalised. ``history_`` holds ``sum_k G(S_k)`` plus
    ``epsilon`` times the within-part squared distances; ``loss_history_`` ``sum_k G(S_k)``.

    **Marginal gains** ``G(S_k) - G(S_k \\ i)`` are computed without retraining
    (:mod:`~ppmix.optimizers.presto.loo`): exactly for linear-Gaussian
    components, by one Newton step from the full fit for logistic and softmax ones; for other
    component objects and ``nn.Module`` components the member's own per-sample loss
    ``l_i(theta_k)`` stands in for it. A non-member scores its loss ``l_i(theta_k)``, an
    upper bound on the singleton ``G({(i, k)})`` that still tells the components apart.

    **Monotonicity.** ``history_`` is non-increasing for ``scores="loss"`` with exact fits;
    for ``scores="presto"`` only if ``G`` is ``alpha``-submodular (Theorem 2) and the gains
    are exact, so small increases are possible for logistic and softmax components.

    **Sample weights.** ``fit(X, y, sample_weight=w)`` runs the sweep of the rows repeated ``w`` times
    (an integer weight), restricted to partitions that keep a row's copies in one part: the loss of a
    row counts ``w_i`` times in ``G`` (``sum_i w_i l_i + R``), the fits, standardisation, part centres and
    router are weighted, every pair is scored per copy (a member's gain is that of removing one copy) and
    the bound sums ``w_i`` times a row's score, and a row takes ``w_i`` of a part's capacity
    ``ceil((1 + leeway) sum(w) / K)``. Without capacities (``leeway=None``) copies share their scores and
    so their part, and the fit is the repeated rows' fit from the same start; with capacities the
    repeated rows' greedy may split a row's copies where the weighted one keeps the row whole, so the fit
    is then the repeated problem's sweep restricted to unsplit rows. The k-means start runs on a weighted
    resample. A zero weight drops the row (its ``partition_`` entry is the router's part);
    ``part_sizes_`` counts rows, not weights. ``nn.Module`` components (``fit(x, y)`` takes no weights),
    ``init="ward"`` and routers whose ``fit`` has no ``sample_weight`` refuse weights.

    Parameters
    ----------
    n_components : int
        Number of parts ``K``.
    component : {"logistic", "softmax", "linear"}, component family, ``nn.Module`` or list of ``K`` modules
        ``"logistic"``: :class:`~ppmix.components.LogisticExpert` (binary ``y``);
        ``"softmax"``: :class:`~ppmix.components.SoftmaxExpert` (``y`` with any number of classes);
        ``"linear"`` (or ``"gaussian"``): :class:`~ppmix.components.GaussianExpert`.
        A family object must offer ``log_prob((x, y)) -> (N, K)`` and ``fit((x, y), weights)``.
        A ``torch.nn.Module`` must follow :class:`~ppmix.optimizers.presto.components.TorchComponent`
        (``per_sample_loss(x, y)``, ``fit(x, y)``); it is copied ``K`` times (a list gives
        one module per part). Examples: :class:`~ppmix.optimizers.presto.components.LinearSVMComponent`
        (hinge loss, the paper's §4.1 component) and
        :class:`~ppmix.optimizers.presto.components.MLPComponent`.
    ridge : float, default 0.1
        L2 penalty ``lambda`` on the coefficients (the paper's regulariser).
    alpha : float in (0, 1], default 1.0
        The submodularity ratio ``alpha_G`` of eq. (13); 1 gives the submodular bound.
    leeway : float or None, default 0.1
        Capacity ``ceil((1 + leeway) N / K)`` per part; ``None`` removes capacities.
    epsilon : float, default 6e-3
        Weight of the squared distance-to-centre tie-break (App. D.3 uses 6e-3 on
        the plain distance). Larger values favour spatially compact parts.
    scores : {"presto", "loss"}, default "presto"
        ``"presto"``: the bound (13) above; ``"loss"``: every pair scored by its loss
        ``l_i(theta_k)``, a bound that needs no submodularity assumption.
    init : {"kmeans", "ward", "random"} or array of shape (N,), default "kmeans"
        Initial partition (App. D.3 initialises by a clustering): ``"kmeans"`` on
        standardised ``X``, balanced under the capacities; ``"ward"``: scikit-learn's
        Ward agglomerative clustering of ``X`` (quadratic memory, small ``N`` only).
    max_iter : int, default 50
    tol : float, default 1e-6
        Stop when the relative change of the objective is at most ``tol`` or the
        partition does not change.
    router : "softmax" or classifier, default "softmax"
        Predicts the part of new points: a :class:`~ppmix.components.SoftmaxGate`
        fitted on the one-hot partition, or any object with ``fit(X, labels)`` and
        ``predict_proba(X)`` (e.g. a scikit-learn classifier; it is cloned).
    router_ridge : float, default 1e-4
        Ridge of the softmax router.
    router_weight : float, default 0.0
        ``mu >= 0``: puts the router into the MM (beyond the paper), so that the partition is one the
        router can reproduce at test time. Every point's score for part ``k`` gains
        ``mu * (-log pi_phi(k | x_i))``, the router ``pi_phi`` being refitted on the partition after
        every component fit; the sweep then minimises ``sum_k G(S_k) + mu * sum_i -log pi_phi(part_i | x_i)``
        (``history_`` includes the router term, ``loss_history_`` does not). ``0`` is the paper's
        algorithm, unchanged.
    standardize : bool, default True
        Fit on standardised data: every feature of ``X`` centred and divided by its standard
        deviation (and ``y`` too for ``"linear"`` components), so that ``ridge``, ``epsilon``,
        the router's ridge and the noise floor mean the same at any scale of the data and
        ``PRESTO`` fitted to ``c * X`` predicts as on ``X``. ``components_`` and ``router_``
        then act on standardised data (``predict*`` standardise ``X`` and return ``y`` on its
        own scale). ``False`` runs the paper's algorithm on the raw data.
    seed : int or None
    progress : bool, default True
        Show a tqdm progress bar.
    executor : None, "processes", "inline", concurrent.futures.Executor or dask Client
        Where the ``K`` components are trained. ``None`` (default): in this process, a
        family's ``K`` members in one batched call (the fastest for the built-in
        families). Otherwise each non-empty part is one task of
        :func:`ppmix.parallel.run_tasks`: ``"processes"`` starts one local process pool
        (spawn) for the whole fit; an executor or Dask client you pass is used and left
        running; ``"inline"`` runs the tasks here one by one. Useful for heavy
        ``nn.Module`` components; the partition is the same as in-process.
    device : str, torch.device or None, default None (CPU)
        Where the fit runs: the data (numpy, DataFrame or a tensor on any device) is
        moved there, and the component fits, loss matrices, marginal gains, the bound of
        every MM step and the softmax router are computed there; a component object
        (family or ``nn.Module``) is copied to it. The greedy assignment sorts its
        ``N K`` scores there and scans them on the CPU; the initialisation draws from a
        CPU generator, so a seed gives the same start on every device. ``"cuda"``
        without a usable GPU raises a ``ValueError`` at ``fit``. ``partition_`` and
        ``part_sizes_`` are numpy arrays whatever the device; ``components_`` and
        ``router_`` (softmax) stay on it.

    Attributes
    ----------
    partition_ : ndarray of shape (N,)
    components_ : component family with ``K`` members, or ``nn.ModuleList`` of ``K`` modules
        Fitted on the standardised data (see ``standardize`` and ``scales_``).
    router_ : fitted router
        Fitted on the standardised ``X``.
    history_ : list of float
        Objective (with the tie-break and router terms) after the initial fit and every accepted iteration.
    loss_history_ : list of float
        ``sum_k G(S_k)`` at the same points.
    n_iter_ : int
    converged_ : bool
    part_sizes_ : ndarray of shape (K,)
    routability_ : float
        Accuracy of the fitted router on the training partition (share of training points it
        routes to their own part).
    scales_ : dict of Tensor
        ``x_mean``, ``x_scale`` (``(P,)``), ``y_mean``, ``y_scale``: the standardisation the
        components and the router see (zeros and ones with ``standardize=False``).

    Notes
    -----
    :meth:`save` / :meth:`load` write and read a fitted PRESTO through :mod:`ppmix.io`
    (``config.json`` + ``tensors.pt``, safe loading, checksum). Only the softmax router
    can be saved; a component object (family or module) must be passed again to
    :meth:`load`, which restores its saved parameters.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-1, 1, size=(200, 1))
    >>> y = np.where(X[:, 0] < 0, 2 * X[:, 0] + 1, -3 * X[:, 0]) + 0.01 * rng.normal(size=200)
    >>> model = PRESTO(2, "linear", seed=0, progress=False).fit(X, y)
    >>> int(model.part_sizes_.sum()), model.partition_.shape
    (200, (200,))
    >>> float(np.abs(model.predict(X) - y).mean()) < 0.05
    True
    """

    def __init__(
        self,
        n_components: int,
        component: Any = "logistic",
        *,
        ridge: float = 0.1,
        alpha: float = 1.0,
        leeway: float | None = 0.1,
        epsilon: float = 6e-3,
        scores: str = "presto",
        init: Any = "kmeans",
        max_iter: int = 50,
        tol: float = 1e-6,
        router: Any = "softmax",
        router_ridge: float = 1e-4,
        router_weight: float = 0.0,
        standardize: bool = True,
        seed: int | None = None,
        progress: bool = True,
        executor: Any = None,
        device: str | torch.device | None = None,
    ) -> None:
        self.n_components = n_components
        self.component = component
        self.ridge = ridge
        self.alpha = alpha
        self.leeway = leeway
        self.epsilon = epsilon
        self.scores = scores
        self.init = init
        self.max_iter = max_iter
        self.tol = tol
        self.router = router
        self.router_ridge = router_ridge
        self.router_weight = router_weight
        self.standardize = standardize
        self.seed = seed
        self.progress = progress
        self.executor = executor
        self.device = device

    # ------------------------------------------------------------------ validation
    def _check_params(self) -> None:
        if not (isinstance(self.ridge, (int, float)) and self.ridge >= 0 and math.isfinite(self.ridge)):
            raise ValueError(f"ridge must be a finite number >= 0; got {self.ridge!r}")
        if not (isinstance(self.alpha, (int, float)) and 0 < self.alpha <= 1):
            raise ValueError(f"alpha must be in (0, 1]; got {self.alpha!r}")
        if self.leeway is not None and not (isinstance(self.leeway, (int, float)) and self.leeway >= 0):
            raise ValueError(f"leeway must be None or a number >= 0; got {self.leeway!r}")
        if not (isinstance(self.epsilon, (int, float)) and self.epsilon >= 0):
            raise ValueError(f"epsilon must be a number >= 0; got {self.epsilon!r}")
        if self.scores not in ("presto", "loss"):
            raise ValueError(f"scores must be 'presto' or 'loss'; got {self.scores!r}")
        mu = self.router_weight
        if not (isinstance(mu, (int, float)) and not isinstance(mu, bool) and math.isfinite(mu) and mu >= 0):
            raise ValueError(f"router_weight must be a finite number >= 0; got {mu!r}")
        check_positive_int(self.max_iter, "max_iter")
        check_executor(self.executor)
        if not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise ValueError(f"tol must be a number >= 0; got {self.tol!r}")

    def _check_y(self, y: Any, n: int, device: torch.device) -> torch.Tensor:
        if y is None:
            raise ValueError("y is required: PRESTO requires y to be passed, but the target y is None")
        arr = ravel_column_vector(as_numpy(y.to_numpy() if hasattr(y, "to_numpy") else y))
        if arr.dtype == object or arr.dtype.kind not in "biuf":
            raise TypeError(f"y must be numeric (Unknown label type: dtype {arr.dtype})")
        arr = arr.astype(np.float64)
        if arr.shape != (n,):
            raise ValueError(f"y must have shape ({n},) to match X; got {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError("y contains NaN or infinite values")
        if self._classifies and not np.isin(arr, np.arange(self._n_classes)).all():
            raise ValueError(f"y must hold class codes 0..{self._n_classes - 1} of classes_")
        return torch.as_tensor(arr, dtype=_DTYPE, device=device)

    @property
    def _target(self) -> TargetCoding:
        """What ``y`` is by the components: binary (logistic), categorical (softmax) or real."""
        kind = component_kind(self.component)
        return TargetCoding({"logistic": "binary", "softmax": "categorical"}.get(kind, "real"))

    @property
    def _classifies(self) -> bool:
        return self._target.classifies

    @property
    def _multiclass(self) -> bool:
        return self._target.multiclass

    def __sklearn_tags__(self) -> Any:
        return self._target.tags(super().__sklearn_tags__())

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy of :meth:`predict` (logistic and softmax components) or its R² (linear ones), as
        scikit-learn's classifiers and regressors score."""
        return self._target.score(self, X, y, sample_weight)

    @property
    def _n_classes(self) -> int:
        """Classes of the components: those of a given family, else those seen in ``fit`` (2 for logistic)."""
        if hasattr(self.component, "n_classes"):
            return int(self.component.n_classes)
        return len(self.classes_) if self._multiclass else 2

    def _make_adapter(self, k: int, p: int, device: torch.device, executor: Any = None) -> Adapter:
        n_classes = self._n_classes if self._classifies else 2
        return make_adapter(self.component, self.ridge, k, p, device, executor, n_classes=n_classes)

    # ------------------------------------------------------------------ fitting
    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> "PRESTO":
        """Partition ``(X, y)`` and fit the components and the router.

        Parameters
        ----------
        X : array-like of shape (N, P)
        y : array-like of shape (N,)
            Class labels for ``component="logistic"`` (two classes) and ``"softmax"`` (any
            number; recorded in ``classes_``), real values for ``"linear"``.
        sample_weight : array-like of shape (N,), optional
            Non-negative weight of every row (see *Sample weights* above): an integer weight counts as that
            many copies of the row, kept in one part; a zero weight drops the row. At least
            ``max(2, n_components)`` rows must weigh more than zero.

        Returns
        -------
        self
        """
        self._check_params()
        device = resolve_device(self.device)
        x, names = check_matrix(X, "X", dtype=_DTYPE, device=device)
        n, p = x.shape
        if n < 2:
            raise InvalidDataError("X has 1 sample (n_samples=1): PRESTO needs at least 2 to partition")
        k = check_n_components(self.n_components, n)
        yt = self._check_y(self._target.encode(self, y, fitting=True), n, device)
        weight, keep = self._check_sample_weight(sample_weight, n, k, device)
        fit_x, fit_y = (x, yt) if keep is None else (x[keep], yt[keep])
        self.scales_ = self._training_scales(fit_x, fit_y, weight)
        x = standardise_x(x, self.scales_)
        fit_x, fit_y = x if keep is None else x[keep], standardise_y(fit_y, self.scales_)
        seed = check_seed(self.seed)
        generator = torch.Generator().manual_seed(seed if seed is not None else 0)
        if self.seed is None:
            generator.seed()
        total = fit_x.shape[0] if weight is None else float(weight.sum())  # the number of repeated rows
        capacity = None if self.leeway is None else math.ceil((1.0 + float(self.leeway)) * total / k)

        # a sweep is many small operations: one thread unless the pass is large (ppmix.ops.threads)
        with open_executor(self.executor) as executor, torch_threads(threads_for(n * k * (p + 1))):
            adapter = self._make_adapter(k, p, device, executor)
            sweep = mm_sweep(
                adapter,
                fit_x,
                fit_y,
                self._initial_partition(fit_x, k, capacity, generator, weight, keep),
                capacity,
                scores=self._scores,
                objective=self._objective,
                eps=float(self.epsilon),
                max_iter=int(self.max_iter),
                tol=float(self.tol),
                progress=self.progress,
                router_cost=router_cost(self.router, self.router_ridge, float(self.router_weight), fit_x, weight),
                weight=weight,
            )

        adapter.executor = None  # the fitted object keeps no reference to a (closed) pool
        self.components_ = adapter.comp
        self._adapter = adapter
        self._fit_device = device
        part = as_numpy(sweep.part)
        self.history_ = sweep.history
        self.loss_history_ = sweep.loss_history
        self.n_iter_ = sweep.n_iter
        self.converged_ = sweep.converged
        self.n_features_in_ = p
        self.feature_names_in_ = names
        self.router_ = fit_router(self.router, self.router_ridge, fit_x, sweep.onehot, part, weight)
        routed = as_numpy(self._routing_proba(fit_x).argmax(1)) == part
        self.routability_ = float(routed.mean() if weight is None else np.average(routed, weights=as_numpy(weight)))
        if keep is None:
            self.partition_ = part
        else:  # a dropped row goes to the router's part
            self.partition_ = as_numpy(self._routing_proba(x).argmax(1))
            self.partition_[as_numpy(keep)] = part
        self.part_sizes_ = np.bincount(self.partition_, minlength=k)
        return self

    def _check_sample_weight(
        self, sample_weight: Any, n: int, k: int, device: torch.device
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The positive weights and the mask of the rows they keep (``None, None`` without ``sample_weight``);
        a ``ValueError`` naming ``sample_weight`` for bad weights and for the options that cannot take them."""
        if sample_weight is None:
            return None, None
        if component_kind(self.component) == "torch":
            raise ValueError(
                "sample_weight is not supported with nn.Module components: their fit(x, y) takes no weights"
            )
        if not isinstance(self.router, str) and not has_fit_parameter(self.router, "sample_weight"):
            raise ValueError(
                f"sample_weight needs a router whose fit takes sample_weight; {type(self.router).__name__}.fit "
                "does not (use router='softmax')"
            )
        weight = check_sample_weight(sample_weight, n, "row", dtype=_DTYPE, device=device, min_positive=max(k, 2))
        keep = weight > 0
        return weight[keep], keep

    def _training_scales(
        self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        return training_scales(x, y, standardize=bool(self.standardize), scale_y=not self._classifies, weight=weight)

    def _initial_partition(
        self,
        x: torch.Tensor,
        k: int,
        capacity: float | None,
        generator: torch.Generator,
        weight: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        init = self.init
        if keep is not None and not isinstance(init, str) and np.shape(as_numpy(init)) == tuple(keep.shape):
            init = as_numpy(init)[as_numpy(keep)]  # an initial partition of every row: of the rows kept
        return initial_partition(x, k, init, capacity, generator, weight)

    def _objective(
        self, adapter: Adapter, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor, eps: float = 0.0
    ) -> float:
        """``sum_k G(S_k)`` at the fitted components, plus ``eps`` times the within-part squared distances."""
        value = float((onehot * adapter.losses(x, y)).sum() + (adapter.penalty() * (onehot.sum(0) > 0)).sum())
        if eps > 0:
            value += eps * float((onehot * sq_distances(x, onehot)).sum())
        if not math.isfinite(value):
            raise FloatingPointError(f"PRESTO objective became {value}; scale the data or increase ridge")
        return value

    def _scores(self, adapter: Adapter, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Modular bound scores ``M[i, k]`` (eq. 13), shape (N, K).

        The exact singleton ``G({(i, k)})`` is degenerate with an unpenalised intercept, so
        (like the paper's warm-started ``Train({i}; theta_k)``) non-members score
        ``l_i(theta_k) / alpha >= G({(i, k)})``, which keeps (13) an upper bound.
        """
        losses = adapter.losses(x, y)
        if self.scores == "loss":
            return losses
        alpha = float(self.alpha)
        member = alpha * adapter.gains(x, y, onehot)
        singleton = losses / alpha
        return torch.where(onehot > 0, member, singleton)

    # ------------------------------------------------------------------ prediction
    def _check_fitted(self) -> None:
        if not hasattr(self, "partition_"):
            raise NotFittedError("this PRESTO instance is not fitted yet; call fit(X, y) first")

    def _check_X(self, X: Any) -> torch.Tensor:
        """``X`` (any array-like, a tensor on any device) on the device the fitted state lives on."""
        self._check_fitted()
        fitted = {"n_features": self.n_features_in_, "feature_names": getattr(self, "feature_names_in_", None)}
        return standardise_x(check_matrix(X, "X", dtype=_DTYPE, device=self._fit_device, **fitted)[0], self.scales_)

    def _routing_proba(self, x: torch.Tensor) -> torch.Tensor:
        return routing_proba(self.router_, x, int(self.n_components))

    def predict_partition_proba(self, X: Any) -> Any:
        """Router probabilities of every part, shape ``(N, K)``.

        Like every ``predict*`` method: a numpy array, or a tensor on this estimator's
        device when ``X`` is a tensor (``X`` may be on any device).
        """
        return to_output(self._routing_proba(self._check_X(X)), X)

    def predict_partition(self, X: Any) -> Any:
        """Part (component index) the router assigns to every row of ``X``, shape ``(N,)``."""
        return to_output(self._routing_proba(self._check_X(X)).argmax(1), X)

    def predict(self, X: Any) -> Any:
        """Prediction of the routed component: class (logistic) or conditional mean (linear)."""
        x = self._check_X(X)
        route = self._routing_proba(x).argmax(1)
        values = self._adapter.predict(x).gather(1, route[:, None]).squeeze(1)
        if self._classifies:
            return self._target.decode(self, values.long(), X)
        return to_output(values * self.scales_["y_scale"] + self.scales_["y_mean"], X)

    @available_if(lambda self: self._classifies)
    def predict_proba(self, X: Any) -> Any:
        """``P(y = classes_[c])`` under the routed component, shape ``(N, C)`` (logistic: ``C = 2``; softmax
        components only)."""
        self._check_fitted()
        x = self._check_X(X)
        route = self._routing_proba(x).argmax(1)
        proba = self._adapter.proba(x)
        return to_output(proba[torch.arange(x.shape[0], device=x.device), route], X)

    def guarantee_(self, X: Any, y: Any) -> dict[str, float]:
        """What Theorems 2 and 4 of the paper promise for this fit on its training data ``(X, y)``.

        Logistic and softmax components only. Returns ``lambda`` (``ridge / 2``), ``lipschitz`` (``L``),
        ``eps_min``, ``l_min_min``, ``l_min_max``, ``alpha_G``, ``kappa_G``, Theorem 4's ``factor``
        ``1 / ((1 - kappa_G) alpha_G^2)`` and its tighter form ``factor_tight`` (eq. 41), which bound ``G`` of
        the partition found over the optimum's. The constants are those of the paper's ``G``, whose penalty
        also shrinks the intercepts (:mod:`~ppmix.optimizers.presto._guarantee` says why).

        Examples
        --------
        >>> import numpy as np
        >>> X = np.random.default_rng(0).normal(size=(60, 2))
        >>> y = (X[:, 0] * X[:, 1] > 0).astype(int)
        >>> g = PRESTO(2, "logistic", seed=0, progress=False).fit(X, y).guarantee_(X, y)
        >>> 0 < g["alpha_G"] <= 1 and 0 <= g["kappa_G"] < 1 and g["factor"] >= g["factor_tight"] >= 1
        True
        """
        self._check_fitted()
        if not self._classifies:
            raise TypeError("guarantee_ is computed for logistic and softmax components only")
        x = self._check_X(X)
        codes = self._check_y(self._target.encode(self, y, fitting=False), x.shape[0], x.device)
        targets = torch.nn.functional.one_hot(codes.long(), self._n_classes).to(_DTYPE)
        return theorem2_guarantee(x, targets, float(self.ridge))

    def objective(self, X: Any, y: Any, partition: Any, sample_weight: Any = None) -> float:
        """``sum_k G(S_k)`` of a given partition of ``(X, y)`` (components refitted on it).

        With ``standardize=True`` the data are standardised as for the fitted estimator (by
        ``scales_``; before a fit, by ``(X, y)``'s own (weighted) scales), so objectives of different
        subsets of the data are comparable. With ``sample_weight`` every row's loss counts its weight
        times (the objective of the rows repeated, each row's copies in its part).
        """
        self._check_params()
        device = resolve_device(self.device)
        x, _ = check_matrix(X, "X", dtype=_DTYPE, device=device)
        n, p = x.shape
        k = check_n_components(self.n_components, n)
        yt = self._check_y(self._target.encode(self, y, fitting=not hasattr(self, "classes_")), n, device)
        weight = None
        if sample_weight is not None:
            weight = check_sample_weight(sample_weight, n, "row", dtype=_DTYPE, device=device)
        scales = self.scales_ if hasattr(self, "scales_") else self._training_scales(x, yt, weight)
        x, yt = standardise_x(x, scales), standardise_y(yt, scales)
        part = torch.as_tensor(as_numpy(partition), dtype=torch.long, device=device)
        if part.shape != (n,) or part.min() < 0 or part.max() >= k:
            raise ValueError(f"partition must have shape ({n},) with values in [0, {k})")
        adapter = self._make_adapter(k, p, device)
        onehot = partition_onehot(part, k, weight)
        adapter.fit(x, yt, onehot)
        return self._objective(adapter, x, yt, onehot)
