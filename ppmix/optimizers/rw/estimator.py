"""The Regularized Weighting estimator (Vainsencher, Mannor & Xu, 2013): robust multiple-model
learning that alternates the convex weight step of :mod:`~ppmix.optimizers.rw.weights`
with refitting each model of a :class:`~ppmix.optimizers.rw.learners.WeightedLearner`
to its weights, over several restarts, and flags the points left with no weight as outliers.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ppmix._validation import (
    NotFittedError,
    as_numpy,
    check_float,
    check_matrix,
    check_positive_int,
    check_seed,
    resolve_device,
    to_output,
    torch_ready,
)
from ppmix.engines.result import ConvergenceWarning
from ppmix.models._weights import check_sample_weight
from ppmix.ops.scaling import weighted_lower_median
from ppmix.optimizers.persist import (
    SavableEstimator,
    load_object_tensors,
    move_object_tensors,
    object_tensors,
)
from ppmix.optimizers.rw.learners import WeightedLearner, make_learner
from ppmix.optimizers.rw.learners import learner_data as _data
from ppmix.optimizers.rw.weights import solve_weights

__all__ = ["RegularizedWeighting"]

logger = logging.getLogger(__name__)


def _auto_alpha_per_point(losses: torch.Tensor, mass: torch.Tensor | None) -> float:
    """``alpha_per_point="auto"``: the (lower) median over the points of their smallest loss ``(k, n)``, each point
    counted ``mass_i`` times (the repeated points' median); the mean loss if that is zero, else 1.

    Examples
    --------
    >>> losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    >>> _auto_alpha_per_point(losses, None), _auto_alpha_per_point(losses, torch.tensor([1.0, 1.0, 3.0]))
    (2.0, 3.0)
    """
    smallest = losses.min(dim=0).values
    median = weighted_lower_median(smallest, mass)
    mean = losses.mean() if mass is None else (losses * mass).sum() / (losses.shape[0] * mass.sum())
    if float(median) > 0:
        return float(median)
    return float(mean) if float(mean) > 0 else 1.0


class RegularizedWeighting(SavableEstimator):
    """Multiple-model learning by Regularized Weighting (RW; Vainsencher, Mannor & Xu, 2013).

    Fits ``n_models`` models of one kind (cluster centres, regression lines,
    subspaces, Gaussians, or any :class:`~ppmix.optimizers.rw.learners.WeightedLearner`)
    together with a weight distribution ``w_j`` over the points for every model, by
    minimising the joint loss

        ``L_alpha(X, M, W) = alpha ||u - v||^2 + (1/k) sum_j w_j^T l_j(M)``,

    with ``v`` the average of the ``w_j`` and ``u`` the uniform distribution
    (Definition 2). Points far from every model get zero weight and are reported as
    outliers; the penalty stops any model from concentrating on a few points, which
    makes RW robust to outliers where k-means and EM are not (Theorem 2 gives a
    non-zero breakdown point for clustering).

    **Choosing alpha.** Weights are of order ``1/n``, so ``||u - v||^2`` is of order
    ``1/n`` while the weighted loss is of the order of a typical loss: ``alpha`` must
    scale like ``n`` times the loss scale. This estimator therefore takes
    ``alpha_per_point = alpha / n``, which has the units of a loss and does not change
    with ``n``. Guidance from the paper: ``alpha / n`` near the typical weighted loss
    (eq. 2.4); for clustering with squared distances, Theorem 2 needs
    ``r^2 <= alpha / n <= 13 R^2`` (``R`` the radius of a ball holding the inliers, ``r``
    the within-cluster radius). Lemma 1: with losses in ``[0, B]`` the optimum has
    ``||v - u||_inf <= B / (2 alpha)``, so ``alpha / n`` much above the outliers' losses
    forces near-uniform weights and removes the robustness. ``"auto"`` sets
    ``alpha / n`` to the median over points of the smallest loss under the first
    restart's initial models (a robust version of eq. 2.4), computed once so that all
    restarts minimise the same objective.

    **Algorithm.** Each restart initialises the models (``learner.init``), solves the
    weight step from uniform weights, and then alternates model refits (each model
    fitted to its own weights) and weight steps warm-started at the previous weights
    (:func:`solve_weights`, FISTA with step ``k / (2 alpha)``, each to a certified
    relative duality gap ``weight_tol``). Since every weight step returns weights no
    worse than its start and exact base learners (kmeans, regression, subspace)
    minimise their weighted loss, the joint loss never increases. A restart stops when
    the joint loss changes by at most ``tol`` relative to its value; the restart with
    the lowest joint loss is kept.

    **Sample weights.** ``fit(X, sample_weight=w)`` fits the rows repeated ``w`` times (see :meth:`fit`).

    Parameters
    ----------
    n_models : int
        Number of models ``k`` (at most the number of points).
    learner : {"kmeans", "regression", "subspace", "gaussian"}, ComponentFamily or WeightedLearner, default "kmeans"
        The base learner: squared distance to a centre, squared residual of a linear
        regression (needs ``y``), squared distance to a 1-D affine subspace (pass a
        :class:`~ppmix.optimizers.rw.learners.SubspaceLearner` for other dimensions),
        shifted negative log-likelihood of a diagonal Gaussian, or your own object
        any :class:`~ppmix.components.base.ComponentFamily` with ``n_models`` components (loss: its shifted
        negative log-likelihood, see :class:`~ppmix.optimizers.rw.learners.FamilyLearner`), or your
        own :class:`~ppmix.optimizers.rw.learners.WeightedLearner` (``data`` is ``X`` or ``(X, y)``,
        weights and losses ``(n_samples, k)``). An instance is copied, never modified.
    alpha_per_point : float or "auto", default "auto"
        ``alpha / n``, positive (see above).
    n_init : int, default 5
        Restarts; the lowest joint loss wins.
    max_iter : int, default 100
        Maximum number of alternations per restart.
    tol : float, default 1e-6
        Relative change of the joint loss that ends a restart.
    weight_max_iter : int, default 2000
        Maximum FISTA iterations per weight step.
    weight_tol : float, default 1e-8
        Relative duality gap that ends a weight step (see :func:`solve_weights`).
    outlier_threshold : float, default 1e-3
        A point is an outlier when its average weight ``v_i`` is below
        ``outlier_threshold / n`` (less than 0.1% of its uniform share); the weight
        step's projections put exact zeros on such points.
    seed : int, optional
        Seed of the initialisations; the fit is deterministic given it.
    progress : bool, default True
        Show a progress bar over alternations.
    device : str, torch.device or None, default None (CPU)
        Where the fit runs: the data (numpy, DataFrame or a tensor on any device) is
        moved there, and the learner's fits and losses, the FISTA weight steps and their
        simplex projections are computed there. Each restart initialises the learner on
        the CPU, from the seeded CPU generator (so a seed gives the same starting models
        on every device), and then moves its fitted tensors (attributes ending in ``_``,
        component families) to ``device``. ``"cuda"`` without a usable GPU raises a
        ``ValueError`` at ``fit``. ``weights_`` is kept on the CPU and ``labels_`` and
        ``outliers_`` are numpy arrays whatever the device; ``models_`` stays on it.

    Attributes
    ----------
    weights_ : Tensor, shape (n_models, n_samples), float64, on the CPU
        The weight distribution of every model over the training points.
    models_ : WeightedLearner
        The fitted learner (e.g. ``models_.centres_`` for ``"kmeans"``), on ``device``.
    labels_ : ndarray of int, shape (n_samples,)
        Model with the largest weight on each point, ``-1`` for outliers.
    outliers_ : ndarray of bool, shape (n_samples,)
    alpha_ : float
        The ``alpha`` used (``alpha_per_point * n``); ``alpha_per_point_`` is kept too.
    loss_ : float
        Final joint loss.
    history_ : list of float
        Joint loss after every alternation (index 0: initial models, optimal weights).
    n_iter_ : int
        Alternations of the kept restart.
    converged_ : bool

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = np.concatenate([rng.normal(0, 1, (50, 2)), rng.normal(10, 1, (50, 2)), [[1e6, 1e6]]])
    >>> rw = RegularizedWeighting(2, alpha_per_point=4.0, seed=0, progress=False).fit(X)
    >>> sorted(np.round(rw.models_.centres_.mean(dim=1).tolist()).tolist())
    [0.0, 10.0]
    >>> bool(rw.outliers_[-1]), int(rw.labels_[-1])
    (True, -1)
    """

    def __init__(
        self,
        n_models: int,
        learner: str | WeightedLearner = "kmeans",
        *,
        alpha_per_point: float | str = "auto",
        n_init: int = 5,
        max_iter: int = 100,
        tol: float = 1e-6,
        weight_max_iter: int = 2000,
        weight_tol: float = 1e-8,
        outlier_threshold: float = 1e-3,
        seed: int | None = None,
        progress: bool = True,
        device: str | torch.device | None = None,
    ) -> None:
        self.n_models = n_models
        self.learner = learner
        self.alpha_per_point = alpha_per_point
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.weight_max_iter = weight_max_iter
        self.weight_tol = weight_tol
        self.outlier_threshold = outlier_threshold
        self.seed = seed
        self.progress = progress
        self.device = device

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _check_y(y: Any, n: int, device: torch.device) -> torch.Tensor | None:
        if y is None:
            return None
        if hasattr(y, "to_numpy"):
            y = y.to_numpy()
        if isinstance(y, torch.Tensor):
            if y.dtype == torch.bool or y.is_complex():
                raise TypeError(f"y must be real numeric; got dtype {y.dtype}")
            tensor = y.detach().to(device=device, dtype=torch.float64)
        else:
            array = np.asarray(y)
            if array.dtype == object or array.dtype.kind not in "iuf":
                raise TypeError(f"y must be a real numeric array (Unknown label type: dtype {array.dtype})")
            tensor = torch.as_tensor(torch_ready(array, "y"), dtype=torch.float64, device=device)
        if tensor.shape != (n,):
            raise ValueError(f"y must have shape ({n},) to match X; got {tuple(tensor.shape)}")
        if not torch.isfinite(tensor).all():
            raise ValueError("y contains NaN or infinite values")
        return tensor

    def _losses(self, learner: WeightedLearner, X: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        """The learner's ``(n_samples, k)`` losses, checked, transposed to RW's ``(k, n_samples)`` layout."""
        losses = torch.as_tensor(learner.loss(_data(X, y))).to(device=X.device, dtype=torch.float64)
        k = check_positive_int(self.n_models, "n_models")
        if losses.shape != (X.shape[0], k):
            raise ValueError(
                f"learner.loss returned shape {tuple(losses.shape)}; expected (n_samples, n_models) = {(X.shape[0], k)}"
            )
        losses = losses.T
        if not torch.isfinite(losses).all():
            raise FloatingPointError("learner.loss returned NaN or infinite losses; check the data scale")
        if (losses < 0).any():
            raise ValueError("learner.loss returned negative losses; RW needs non-negative losses")
        return losses

    # --------------------------------------------------------------------- fit
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> "RegularizedWeighting":
        """Fit the models and weights to ``X`` (and targets ``y`` for regression learners).

        Parameters
        ----------
        X : array-like, shape (n_samples, n_features)
        y : array-like, shape (n_samples,), optional
            Required by the ``"regression"`` learner.
        sample_weight : array-like, shape (n_samples,), optional
            Non-negative weight of every row: an integer weight counts as that many copies of the row, a zero
            weight drops it (at least ``n_models`` rows must weigh more than zero). The fit is that of the
            repeated rows: ``n`` is the total weight (``alpha = alpha_per_point`` times it), the weight step
            solves the repeated problem (:func:`~ppmix.optimizers.rw.weights.solve_weights`), the
            learners are fitted to the copies' total weights, ``"auto"`` takes the weighted median, outliers
            are judged per copy (``v_i / sample_weight_i`` below ``outlier_threshold / n``), and each restart
            initialises the learner on a resample of the rows drawn in proportion to the weights (all rows
            when the weights are equal). ``weights_`` holds the copies' totals; a dropped row has weight
            zero, the label of its best model and is not an outlier.

        Returns
        -------
        self
        """
        device = resolve_device(self.device)
        X_all, names = check_matrix(X, "X", device=device)
        y_all = self._check_y(y, X_all.shape[0], device)
        k = check_positive_int(self.n_models, "n_models")
        X_t, y_t, mass, keep = X_all, y_all, None, None
        if sample_weight is not None:
            weight = check_sample_weight(
                sample_weight, X_all.shape[0], "row", dtype=torch.float64, device=device, min_positive=k
            )
            keep = weight > 0
            X_t, y_t, mass = X_all[keep], None if y_all is None else y_all[keep], weight[keep]
        n = X_t.shape[0]
        if k > n:
            raise ValueError(f"n_models={k} is larger than the number of samples ({n}): n_samples={n}")
        total = float(n if mass is None else mass.sum())  # the number of repeated rows
        n_init = check_positive_int(self.n_init, "n_init")
        max_iter = check_positive_int(self.max_iter, "max_iter")
        weight_max_iter = check_positive_int(self.weight_max_iter, "weight_max_iter")
        tol = check_float(self.tol, "tol", positive=False)
        weight_tol = check_float(self.weight_tol, "weight_tol", positive=False)
        threshold = check_float(self.outlier_threshold, "outlier_threshold", positive=False)
        auto = isinstance(self.alpha_per_point, str)
        if auto and self.alpha_per_point != "auto":
            raise ValueError(f"alpha_per_point must be a positive number or 'auto'; got {self.alpha_per_point!r}")
        alpha = None if auto else check_float(self.alpha_per_point, "alpha_per_point", positive=True) * total
        if self.learner == "regression" and y_t is None:
            raise ValueError("y is required for learner='regression'")
        template = make_learner(self.learner)
        seed = check_seed(self.seed)
        base_seed = seed if seed is not None else int(np.random.SeedSequence().generate_state(1)[0])

        best: dict[str, Any] | None = None
        for restart in range(n_init):
            generator = torch.Generator().manual_seed(int(base_seed) + restart)
            learner = self._init_learner(template, X_t, y_t, k, generator, device, mass)
            losses = self._losses(learner, X_t, y_t)
            if alpha is None:
                alpha = _auto_alpha_per_point(losses, mass) * total
                logger.info("RW: alpha_per_point='auto' resolved to %.6g", alpha / total)
            run = self._single_run(
                learner, X_t, y_t, losses, alpha, max_iter, tol, weight_max_iter, weight_tol, restart, mass
            )
            logger.info("RW restart %d: joint loss %.6g after %d alternations", restart, run["loss"], run["n_iter"])
            if best is None or run["loss"] < best["loss"]:
                best = run
        assert best is not None and alpha is not None
        if not best["converged"]:
            warnings.warn(
                f"RW did not converge in max_iter={max_iter} alternations (tol={tol}); increase max_iter or tol",
                ConvergenceWarning,
                stacklevel=2,
            )
        self.alpha_ = float(alpha)
        self.alpha_per_point_ = float(alpha) / total
        self.models_ = best["learner"]
        self.loss_ = best["loss"]
        self.history_ = best["history"]
        self.n_iter_ = best["n_iter"]
        self.converged_ = best["converged"]
        self._fit_device = device
        weights = best["weights"].cpu()
        v = weights.mean(dim=0) if mass is None else weights.mean(dim=0) / mass.cpu()  # per copy
        outliers = v * total < threshold
        labels = weights.argmax(dim=0)
        labels[outliers] = -1
        if keep is None:
            self.weights_, self.labels_, self.outliers_ = weights, labels.numpy(), outliers.numpy()
        else:  # dropped rows: no weight, the label of their best model, not outliers
            kept = as_numpy(keep.cpu())
            self.weights_ = torch.zeros(k, kept.size, dtype=weights.dtype)
            self.weights_[:, torch.as_tensor(kept)] = weights
            self.labels_ = np.zeros(kept.size, dtype=np.int64)
            self.labels_[kept] = labels.numpy()
            if not kept.all():
                dropped = None if y_all is None else y_all[~keep]
                self.labels_[~kept] = as_numpy(self._losses(self.models_, X_all[~keep], dropped).argmin(dim=0))
            self.outliers_ = np.zeros(kept.size, dtype=bool)
            self.outliers_[kept] = outliers.numpy()
        self.n_features_in_ = X_all.shape[1]
        self.feature_names_in_ = names
        self._supervised = y_t is not None
        return self

    @staticmethod
    def _init_learner(
        template: WeightedLearner,
        X: torch.Tensor,
        y: torch.Tensor | None,
        k: int,
        generator: torch.Generator,
        device: torch.device,
        mass: torch.Tensor | None = None,
    ) -> WeightedLearner:
        """A copy of ``template`` initialised on the CPU (from the CPU ``generator``), then moved to ``device``.

        With unequal row weights ``mass`` the learner is initialised on as many rows drawn (with replacement)
        in proportion to them: a uniform draw from the repeated rows."""
        X, y = X.cpu(), None if y is None else y.cpu()
        if mass is not None and not bool((mass == mass[0]).all()):
            rows = torch.multinomial(mass.cpu() / mass.sum().cpu(), X.shape[0], replacement=True, generator=generator)
            X, y = X[rows], None if y is None else y[rows]
        learner = copy.deepcopy(template).init(_data(X, y), k, generator)
        return move_object_tensors(learner, device)

    def _single_run(
        self,
        learner: WeightedLearner,
        X: torch.Tensor,
        y: torch.Tensor | None,
        losses: torch.Tensor,
        alpha: float,
        max_iter: int,
        tol: float,
        weight_max_iter: int,
        weight_tol: float,
        restart: int,
        mass: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        step = solve_weights(losses, alpha, max_iter=weight_max_iter, tol=weight_tol, sample_weight=mass)
        weights, current = step.weights, step.objective
        history = [current]
        converged = False
        n_iter = 0
        with tqdm(total=max_iter, disable=not self.progress, desc=f"RW (init {restart})", leave=False) as bar:
            for n_iter in range(1, max_iter + 1):
                previous = current
                learner.fit(_data(X, y), weights.T)
                losses = self._losses(learner, X, y)
                step = solve_weights(
                    losses, alpha, start=weights, max_iter=weight_max_iter, tol=weight_tol, sample_weight=mass
                )
                if not step.converged:
                    logger.debug("RW weight step stopped at max_iter with relative gap %.3g", step.gap / step.objective)
                weights, current = step.weights, step.objective
                logger.debug("RW alternation %d: joint loss %.10g (%d FISTA iterations)", n_iter, current, step.n_iter)
                history.append(current)
                bar.update(1)
                bar.set_postfix(loss=f"{current:.6g}")
                if abs(previous - current) <= tol * abs(current):
                    converged = True
                    break
        return {
            "learner": learner,
            "weights": weights,
            "loss": current,
            "history": history,
            "n_iter": n_iter,
            "converged": converged,
        }

    # ------------------------------------------------------------------ saving
    _SAVED_PARAMS = (
        "n_models",
        "alpha_per_point",
        "n_init",
        "max_iter",
        "tol",
        "weight_max_iter",
        "weight_tol",
        "outlier_threshold",
        "seed",
        "progress",
        "device",
    )
    _OBJECT_PARAM = "learner"

    def _check_fitted(self) -> None:
        if not hasattr(self, "models_"):
            raise NotFittedError("this RegularizedWeighting is not fitted yet; call fit first")

    def _saved_params(self) -> dict[str, Any]:
        """Constructor arguments as a saved file records them (a learner object as ``None``; pass it to ``load``)."""
        params = super()._saved_params()
        params["learner"] = self.learner if isinstance(self.learner, str) else None
        return params

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        """Weights, labels, outlier flags and the learner's fitted tensors (what :meth:`save` writes)."""
        self._check_fitted()
        tensors = {
            "weights": self.weights_.detach().cpu().contiguous(),
            "labels": torch.as_tensor(self.labels_, dtype=torch.long),
            "outliers": torch.as_tensor(self.outliers_, dtype=torch.bool),
        }
        tensors.update(object_tensors(self.models_, "learner"))
        return tensors

    def _extra_state(self) -> dict[str, Any]:
        """JSON-able fitted state beyond the tensors."""
        return {
            "alpha": self.alpha_,
            "alpha_per_point": self.alpha_per_point_,
            "loss": self.loss_,
            "supervised": self._supervised,
            "learner_type": self.learner if isinstance(self.learner, str) else type(self.learner).__name__,
        }

    def _stand_in_learner(self, supervised: bool, device: torch.device) -> WeightedLearner:
        """A learner of the fitted structure (``n_models`` models on ``n_features_in_`` features), fitted on
        stand-in data: what a save's learner tensors are loaded into."""
        k, p = int(self.n_models), int(self.n_features_in_)
        generator = torch.Generator().manual_seed(0)
        rows = max(2 * k, p + 2)
        stand_in = torch.randn(rows, p, generator=generator, dtype=torch.float64)
        target = torch.randn(rows, generator=generator, dtype=torch.float64)
        return self._init_learner(
            make_learner(self.learner), stand_in, target if supervised else None, k, generator, device
        )

    def _state_shapes(self) -> dict[str, tuple[int | None, ...]]:
        """Weights (``n_models`` rows), labels, outlier flags and the learner's tensors for these settings."""
        extra = getattr(self, "_loaded_extra", None)  # while loading; a fitted object knows
        supervised = self._supervised if extra is None else bool(extra.get("supervised", self.learner == "regression"))
        learner = object_tensors(self._stand_in_learner(supervised, torch.device("cpu")), "learner")
        return {
            "weights": (int(self.n_models), None),
            "labels": (None,),
            "outliers": (None,),
            **{name: tuple(value.shape) for name, value in learner.items()},
        }

    def _restore(self, tensors: dict[str, torch.Tensor], extra: dict[str, Any]) -> None:
        weights = tensors["weights"].to(device="cpu", dtype=torch.float64)
        k, n = int(self.n_models), weights.shape[1]
        if weights.shape[0] != k:
            raise ValueError(f"saved weights have {weights.shape[0]} rows but n_models={k}")
        device = resolve_device(self.device)
        supervised = bool(extra.get("supervised", self.learner == "regression"))
        learner = self._stand_in_learner(supervised, device)
        load_object_tensors(learner, tensors, "learner")
        self.models_ = learner
        self.weights_ = weights
        self._fit_device = device
        self.labels_ = as_numpy(tensors["labels"])
        self.outliers_ = as_numpy(tensors["outliers"])
        if self.labels_.shape != (n,) or self.outliers_.shape != (n,):
            raise ValueError(f"saved labels and outliers must have shape ({n},)")
        self.alpha_ = float(extra["alpha"])
        self.alpha_per_point_ = float(extra["alpha_per_point"])
        self.loss_ = float(extra["loss"])
        self._supervised = supervised

    @classmethod
    def load(
        cls, path: Any, learner: Any = None, map_location: str | torch.device | None = None
    ) -> "RegularizedWeighting":
        """Load a RegularizedWeighting written by :meth:`save` (safe tensor loading, checksum and version checked).

        Parameters
        ----------
        path : str or Path
            Directory written by :meth:`save`.
        learner : WeightedLearner, optional
            Required when the saved estimator used a learner object: an unfitted
            learner of the same kind (its fitted tensors are replaced by the saved ones).
        map_location : str or torch.device, optional
            Device to load onto; it becomes the loaded estimator's ``device``. By
            default the saved ``device`` is used (tensors are always saved from the CPU).

        Raises
        ------
        ValueError
            Corrupt or modified files, another format version, another class, or
            saved tensors that do not fit the learner.

        Examples
        --------
        >>> import tempfile
        >>> import numpy as np
        >>> X = np.concatenate([np.zeros((20, 2)), np.full((20, 2), 5.0)])
        >>> rw = RegularizedWeighting(2, alpha_per_point=4.0, n_init=1, seed=0, progress=False).fit(X)
        >>> again = RegularizedWeighting.load(rw.save(tempfile.mkdtemp()))
        >>> bool((again.predict(X) == rw.predict(X)).all()), again.loss_ == rw.loss_
        (True, True)
        """
        return cls._load(path, learner, map_location)

    # ----------------------------------------------------------------- predict
    def predict(self, X: Any, y: Any = None) -> Any:
        """Index of the model with the smallest loss on each point of ``X`` (``y`` for regression).

        Unlike :attr:`labels_`, no point is marked as an outlier: every point gets its best model.

        Returns
        -------
        ndarray or Tensor of int, shape (n_samples,)
            A tensor (on this estimator's device) if ``X`` is a tensor, else a numpy array.
        """
        self._check_fitted()
        X_t, _ = check_matrix(
            X, "X", device=self._fit_device, n_features=self.n_features_in_, feature_names=self.feature_names_in_
        )
        y_t = self._check_y(y, X_t.shape[0], self._fit_device)
        if self.learner == "regression" and y_t is None:
            raise ValueError("y is required to predict with learner='regression'")
        return to_output(self._losses(self.models_, X_t, y_t).argmin(dim=0), X)

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> np.ndarray:
        """Fit (with ``sample_weight``, see :meth:`fit`) and return :attr:`labels_` (``-1`` for outliers)."""
        return self.fit(X, y, sample_weight=sample_weight).labels_
