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

import contextlib
import copy
import logging
import math
import multiprocessing
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, Iterator

import numpy as np
import torch
from tqdm import tqdm

from ppmix._validation import (
    NotFittedError,
    as_numpy,
    check_matrix,
    check_n_components,
    check_positive_int,
    resolve_device,
    to_output,
)
from ppmix.components import GaussianExpert, LogisticExpert, SoftmaxGate
from ppmix.inference.optimizers.persist import (
    SavableEstimator,
    load_object_tensors,
    move_object_tensors,
    object_tensors,
)
from ppmix.inference.optimizers.presto.components import check_torch_component
from ppmix.inference.optimizers.presto.loo import gaussian_loo_gains, logistic_loo_gains
from ppmix.io import register_savable
from ppmix.ops.kmeans import kmeans
from ppmix.parallel import run_tasks

__all__ = ["PRESTO", "greedy_capacity_assignment"]

logger = logging.getLogger(__name__)

_DTYPE = torch.float64


def greedy_capacity_assignment(scores: torch.Tensor, capacity: torch.Tensor | int | None) -> torch.Tensor:
    """Assign every row to one column, cheapest pairs first, under column capacities.

    All ``N K`` pairs are sorted once (ascending; ``+inf`` pairs are never taken);
    a pair is accepted when its point is still free and its column has room
    (lines 19-24 of Algorithm 1, with the capacities of App. D.3).

    Parameters
    ----------
    scores : Tensor, shape (N, K)
    capacity : int, Tensor of shape (K,), or None (unbounded)
        Must satisfy ``sum(capacity) >= N``.

    Returns
    -------
    Tensor, shape (N,)
        Column of every row.

    Examples
    --------
    >>> import torch
    >>> s = torch.tensor([[0.0, 1.0], [0.1, 2.0], [0.2, 0.3]])
    >>> greedy_capacity_assignment(s, 2).tolist()
    [0, 0, 1]
    """
    n, k = scores.shape
    if capacity is None:
        cap = np.full(k, n, dtype=np.int64)
    else:
        cap = np.broadcast_to(np.asarray(torch.as_tensor(capacity).cpu(), dtype=np.int64), (k,)).copy()
    if cap.sum() < n:
        raise ValueError(f"capacities sum to {int(cap.sum())} < {n} points; not every point can be assigned")
    finite = torch.isfinite(scores)
    if not finite.any(dim=1).all():
        raise ValueError("every point needs at least one finite score")
    flat = torch.where(finite, scores, torch.full_like(scores, math.inf)).reshape(-1).cpu()
    order = torch.argsort(flat, stable=True)
    order = order[torch.isfinite(flat[order])].numpy()
    rows, cols = np.divmod(order, k)
    assigned = np.full(n, -1, dtype=np.int64)
    remaining = n
    for i, c in zip(rows.tolist(), cols.tolist()):
        if assigned[i] < 0 and cap[c] > 0:
            assigned[i] = c
            cap[c] -= 1
            remaining -= 1
            if remaining == 0:
                break
    if remaining:
        raise ValueError("the capacities could not hold every point with a finite score")
    return torch.as_tensor(assigned, device=scores.device)


# --------------------------------------------------------------------------- component adapters
def _fit_member_task(task: tuple[Any, torch.Tensor, torch.Tensor]) -> Any:
    """Train one component on the rows of its part (runs on an executor): family member or module."""
    comp, x, y = task
    if isinstance(comp, torch.nn.Module):
        return comp.fit(x, y)
    comp.fit((x, y), torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device))
    return comp


def _member(family: Any, k: int) -> Any:
    """Component ``k`` of a family, as an independent family with one member."""
    one = family.clone()
    for name in family.param_names:
        setattr(one, name, getattr(family, name)[k : k + 1].clone())
    return one


class _Adapter:
    """What PRESTO needs from a component family: fit, per-point loss, penalty, gains.

    With ``executor=None`` the ``K`` members are fitted at once (one batched call with
    one-hot weights); otherwise every non-empty member is fitted on its own rows as one
    task of :func:`ppmix.parallel.run_tasks` (families with ``param_names`` only).
    ``comp`` already lives on ``device``, where every tensor the adapter makes is put.
    """

    exact_gains = False

    def __init__(self, comp: Any, ridge: float, k: int, device: torch.device, executor: Any = None) -> None:
        self.comp, self.ridge, self.k, self.device, self.executor = comp, ridge, k, device, executor

    def fit(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> None:
        counts = onehot.sum(0)
        empty = counts == 0
        if self.executor is not None and getattr(self.comp, "param_names", ()):
            self._fit_members(x, y, onehot)
        else:
            old = copy.deepcopy(self.comp)
            weights = onehot.clone()
            weights[:, empty] = 1.0  # keeps the batched fit well posed; restored below
            self.comp.fit((x, y), weights)
            if empty.any():
                self._restore(old, empty)
        if empty.any():
            logger.info("PRESTO: components %s are empty and keep their parameters", empty.nonzero().flatten().tolist())
        self._after_fit(x, y, onehot)

    def _fit_members(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> None:
        ks = [k for k in range(self.k) if onehot[:, k].any()]
        tasks = []
        for k in ks:
            rows = onehot[:, k] > 0
            tasks.append((_member(self.comp, k), x[rows], y[rows]))
        results = run_tasks(_fit_member_task, tasks, [f"component-{k}" for k in ks], executor=self.executor)
        for k, result in zip(ks, results):
            for name in self.comp.param_names:
                value = getattr(self.comp, name).clone()
                value[k] = getattr(result.value, name)[0].to(value)
                setattr(self.comp, name, value)

    def _restore(self, old: Any, rows: torch.Tensor) -> None:
        names = getattr(self.comp, "param_names", ())
        for name in names:
            current = getattr(self.comp, name).clone()
            current[rows] = getattr(old, name)[rows]
            setattr(self.comp, name, current)
        if not names:
            self.comp = old

    def _after_fit(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> None:
        pass

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-point loss ``l_i(theta_k)``, shape (N, K)."""
        return -torch.as_tensor(self.comp.log_prob((x, y))).to(device=self.device, dtype=_DTYPE)

    def penalty(self) -> torch.Tensor:
        """Regulariser ``R(theta_k)``, shape (K,)."""
        return torch.zeros(self.k, dtype=_DTYPE, device=self.device)

    def gains(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Fallback: the marginal gain of a member is approximated by its own loss."""
        return onehot * self.losses(x, y)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.comp, "mean"):
            return self.comp.mean(x)
        if hasattr(self.comp, "predict_proba"):
            return (torch.as_tensor(self.comp.predict_proba(x)) > 0.5).to(device=self.device, dtype=_DTYPE)
        raise TypeError(f"{type(self.comp).__name__} has neither mean(x) nor predict_proba(x); cannot predict")


class _LogisticAdapter(_Adapter):
    def penalty(self) -> torch.Tensor:
        return 0.5 * self.ridge * self.comp.coef.square().sum(-1)

    def gains(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        return logistic_loo_gains(x, y, onehot, self.comp.coef, self.comp.intercept, self.ridge)[1]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return (self.comp.predict_proba(x) > 0.5).to(_DTYPE)


class _GaussianAdapter(_Adapter):
    exact_gains = True

    def _after_fit(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> None:
        # joint optimum of the penalised Gaussian likelihood: s2 = (RSS + ridge ||beta||^2) / n
        resid2 = (y[:, None] - self.comp.linear_predictor(x)).square()
        q = (onehot * resid2).sum(0) + self.ridge * self.comp.coef.square().sum(-1)
        counts = onehot.sum(0)
        s2 = (q / counts.clamp_min(1.0)).clamp_min(self.comp.min_variance)
        self.comp.scale = torch.where(counts > 0, s2.sqrt(), self.comp.scale)

    def penalty(self) -> torch.Tensor:
        return self.ridge * self.comp.coef.square().sum(-1) / (2 * self.comp.scale.square())

    def gains(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        return gaussian_loo_gains(x, y, onehot, self.ridge, self.comp.min_variance)[1]


class _TorchAdapter(_Adapter):
    """``K`` user ``nn.Module`` components (see :mod:`ppmix.inference.optimizers.presto.components`).

    Each module is trained on the rows of its part, in this process or as a task of
    :func:`ppmix.parallel.run_tasks`; empty parts keep their module untouched. The
    marginal gain of a member is its own per-sample loss (stated approximation).
    """

    def __init__(self, modules: list[torch.nn.Module], k: int, device: torch.device, executor: Any = None) -> None:
        super().__init__(torch.nn.ModuleList(modules), 0.0, k, device, executor)

    @staticmethod
    def _cast(module: torch.nn.Module, t: torch.Tensor) -> torch.Tensor:
        param = next(module.parameters(), None)
        return t if param is None else t.to(device=param.device, dtype=param.dtype)

    def fit(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> None:
        ks = [k for k in range(self.k) if onehot[:, k].any()]
        tasks = []
        for k in ks:
            rows = onehot[:, k] > 0
            module = self.comp[k]
            tasks.append((module, self._cast(module, x[rows]), self._cast(module, y[rows])))
        names = [f"component-{k}" for k in ks]
        if self.executor is None:
            trained = [_fit_member_task(task) for task in tasks]
        else:
            trained = [r.value for r in run_tasks(_fit_member_task, tasks, names, executor=self.executor)]
        for k, module in zip(ks, trained):
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"component {k}: fit(x, y) must return the trained module; got {type(module).__name__}")
            self.comp[k] = module.to(self.device)  # a module trained on a worker may come back elsewhere

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        columns = []
        with torch.no_grad():
            for k, module in enumerate(self.comp):
                loss = torch.as_tensor(module.per_sample_loss(self._cast(module, x), self._cast(module, y)))
                if loss.shape != (x.shape[0],):
                    raise ValueError(
                        f"component {k}: per_sample_loss must return shape ({x.shape[0]},); got {tuple(loss.shape)}"
                    )
                columns.append(loss.detach().to(device=x.device, dtype=_DTYPE))
        out = torch.stack(columns, dim=1)
        if not torch.isfinite(out).all():
            raise FloatingPointError("a component's per_sample_loss returned NaN or infinite values")
        return out

    def penalty(self) -> torch.Tensor:
        with torch.no_grad():
            values = [
                float(module.penalty()) if callable(getattr(module, "penalty", None)) else 0.0 for module in self.comp
            ]
        return torch.tensor(values, dtype=_DTYPE, device=self.device)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            outputs = [
                torch.as_tensor(
                    module.predict(self._cast(module, x))
                    if callable(getattr(module, "predict", None))
                    else module(self._cast(module, x))
                )
                .reshape(x.shape[0])
                .to(device=x.device, dtype=_DTYPE)
                for module in self.comp
            ]
        return torch.stack(outputs, dim=1)


# --------------------------------------------------------------------------- estimator
@register_savable
class PRESTO(SavableEstimator):
    """Partition ``N`` points into ``K`` parts while training one model per part.

    Implements Algorithm 1 of Sangani et al. (PRESTO) with the practical choices
    of their App. D.3. Each iteration

    1. fits all ``K`` components at once on their parts (one-hot ``weights[N, K]``);
    2. scores every pair ``(i, k)`` by the modular upper bound (eq. 13):
       ``M[i, k] = alpha * (G(S_k) - G(S_k \\ i))`` for members and
       ``M[i, k] = G({(i, k)}) / alpha`` for non-members;
    3. assigns every point by one sort of all ``M[i, k] + epsilon * ||x_i - c_k||^2``
       (``c_k`` the mean of part ``k``; the tie-break of App. D.3, squared here so
       that the tie-break is a k-means term of one joint objective), greedily under
       the capacity ``ceil((1 + leeway) N / K)`` per part (always enough for all
       points);
    4. accepts the new partition only if it does not increase the bound
       ``sum_i M[i, part_i]``; when the capacity-constrained greedy does, it falls back
       to single-point improving moves (largest improvement first, within capacity),
       and stops when no point can improve.

    **Objective.** ``G(S) = min_theta sum_{i in S} l_i(theta) + R(theta)`` with
    ``l_i = -log p(y_i | x_i, theta)``. Logistic: ``R = ridge/2 ||coef||^2``.
    Linear-Gaussian: ``R = ridge ||coef||^2 / (2 sigma^2)`` and the noise variance
    is refitted jointly, ``sigma^2 = (RSS + ridge ||coef||^2) / n`` (floored); the
    intercept is never penalised. ``history_`` holds the objective minimised,
    ``sum_k G(S_k) + epsilon * sum_k sum_{i in S_k} ||x_i - c_k||^2`` (``G`` alone
    when ``epsilon=0``), after each fit; ``loss_history_`` holds ``sum_k G(S_k)``.

    **Marginal gains** ``G(S_k) - G(S_k \\ i)`` are computed without retraining:

    - linear-Gaussian: *exact* closed-form leave-one-out (ridge hat-matrix
      leverage ``h_i``: the penalised RSS drops by ``e_i^2 / (1 - h_i)``; the noise
      variance of the reduced set is refitted in closed form too);
    - logistic: *approximate*, one Newton step from the full fit (influence
      function): ``gain_i ~= l_i + (p_i - y_i)^2 h_i / (2 (1 - v_i h_i))`` with
      ``v_i = p_i (1 - p_i)`` and ``h_i = a_i' H^{-1} a_i`` (``H`` the penalised Hessian);
    - any other component object (``log_prob(data) -> (N, K)``, ``fit(data, weights)``):
      the member's own per-sample loss ``l_i(theta_k)`` (no regulariser known);
    - user ``torch.nn.Module`` components: *approximate*, the member's own per-sample
      loss ``l_i(theta_k)`` at the trained parameters (the authors' per-sample score;
      see :mod:`ppmix.inference.optimizers.presto.components`).

    **Singleton term.** With an unpenalised intercept the exact ``G({(i, k)})`` is
    degenerate (infimum 0 for logistic, ``log(2 pi floor) / 2`` for Gaussian: the
    intercept fits the single point at no penalty) and, for identical
    architectures, independent of ``k``. Like the paper's ``Train({i}; theta_k)``
    warm-started at the current ``theta_k``, PRESTO uses ``l_i(theta_k)``, which is
    never smaller than ``G({(i, k)})`` for these families and so keeps (13) an
    upper bound while telling the components apart. ``scores="loss"`` instead scores every pair by
    ``l_i(theta_k)``: the bound ``G(S') <= sum_k [G(S_k) + sum_{i in S'_k} l_ik -
    sum_{i in S_k} l_ik]`` then holds with no submodularity assumption (the
    per-sample quantity of the authors' code).

    **Monotonicity.** With ``scores="loss"`` and exactly optimal fits the history
    is non-increasing (the acceptance test makes this hold also when capacities
    bind). With ``scores="presto"`` it is guaranteed only if ``G`` is
    ``alpha``-submodular with the given ``alpha`` (Theorem 2 gives a lower bound
    ``alpha_G`` depending on Lipschitz and curvature constants that are rarely
    known) and the gains are exact; the logistic gains and Newton fits are
    approximate, so small increases are possible.

    Parameters
    ----------
    n_components : int
        Number of parts ``K``.
    component : {"logistic", "linear"}, component family, ``nn.Module`` or list of ``K`` modules
        ``"logistic"``: :class:`~ppmix.components.LogisticExpert` (binary ``y``);
        ``"linear"`` (or ``"gaussian"``): :class:`~ppmix.components.GaussianExpert`.
        A family object must offer ``log_prob((x, y)) -> (N, K)`` and ``fit((x, y), weights)``.
        A ``torch.nn.Module`` must follow :class:`~ppmix.inference.optimizers.presto.components.TorchComponent`
        (``per_sample_loss(x, y)``, ``fit(x, y)``); it is copied ``K`` times (a list gives
        one module per part). Examples: :class:`~ppmix.inference.optimizers.presto.components.LinearSVMComponent`
        (hinge loss, the paper's §4.1 component) and
        :class:`~ppmix.inference.optimizers.presto.components.MLPComponent`.
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
    router_ : fitted router
    history_ : list of float
        Objective (with the tie-break term) after the initial fit and every accepted iteration.
    loss_history_ : list of float
        ``sum_k G(S_k)`` at the same points.
    n_iter_ : int
    converged_ : bool
    part_sizes_ : ndarray of shape (K,)

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
        check_positive_int(self.max_iter, "max_iter")
        ex = self.executor
        if not (ex is None or ex in ("processes", "inline") or isinstance(ex, Executor) or hasattr(ex, "get_executor")):
            raise TypeError(
                "executor must be None (in-process), 'processes', 'inline', a concurrent.futures.Executor "
                f"or a dask.distributed.Client; got {ex!r}"
            )
        if not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise ValueError(f"tol must be a number >= 0; got {self.tol!r}")

    @contextlib.contextmanager
    def _executor_context(self) -> Iterator[Any]:
        """The executor of this fit; ``'processes'`` starts one local spawn pool for the whole fit."""
        if isinstance(self.executor, str) and self.executor == "processes":
            with ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")) as pool:
                yield pool
        else:
            yield self.executor

    def _check_y(self, y: Any, n: int, device: torch.device) -> torch.Tensor:
        arr = as_numpy(y.to_numpy() if hasattr(y, "to_numpy") else y)
        if arr.dtype == object or arr.dtype.kind not in "biuf":
            raise TypeError(f"y must be numeric; got dtype {arr.dtype}")
        arr = arr.astype(np.float64)
        if arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        if arr.shape != (n,):
            raise ValueError(f"y must have shape ({n},) to match X; got {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError("y contains NaN or infinite values")
        if self._kind == "logistic" and not np.isin(arr, (0.0, 1.0)).all():
            raise ValueError("y must hold binary labels in {0, 1} for component='logistic'")
        return torch.as_tensor(arr, dtype=_DTYPE, device=device)

    def _make_adapter(self, k: int, p: int, device: torch.device, executor: Any = None) -> _Adapter:
        comp = self.component
        if isinstance(comp, str):
            kind = comp.lower()
            zeros = torch.zeros(k, p, dtype=_DTYPE, device=device)
            if kind == "logistic":
                return _LogisticAdapter(LogisticExpert(zeros, ridge=self.ridge), self.ridge, k, device, executor)
            if kind in ("linear", "gaussian"):
                return _GaussianAdapter(GaussianExpert(zeros, ridge=self.ridge), self.ridge, k, device, executor)
            raise ValueError(f"component must be 'logistic', 'linear' or a component object; got {comp!r}")
        if isinstance(comp, torch.nn.Module) or (
            isinstance(comp, (list, tuple)) and any(isinstance(c, torch.nn.Module) for c in comp)
        ):
            modules = list(comp) if isinstance(comp, (list, tuple)) else [comp]
            if len(modules) not in (1, k):
                raise ValueError(f"component is a list of {len(modules)} modules but n_components={k}")
            for i, module in enumerate(modules):
                check_torch_component(module, "component" if len(modules) == 1 else f"component[{i}]")
            modules = [copy.deepcopy(modules[0 if len(modules) == 1 else i]).to(device) for i in range(k)]
            return _TorchAdapter(modules, k, device, executor)
        if not (callable(getattr(comp, "log_prob", None)) and callable(getattr(comp, "fit", None))):
            raise TypeError(
                "component must be 'logistic', 'linear', a component family with log_prob(data) -> (N, K) and "
                "fit(data, weights), or a torch.nn.Module with per_sample_loss(x, y) and fit(x, y); "
                f"got {type(comp).__name__}"
            )
        if hasattr(comp, "n_components") and int(comp.n_components) != k:
            raise ValueError(f"component has {comp.n_components} members but n_components={k}")
        comp = move_object_tensors(copy.deepcopy(comp), device)
        if isinstance(comp, LogisticExpert):
            return _LogisticAdapter(comp, comp.ridge, k, device, executor)
        if isinstance(comp, GaussianExpert):
            return _GaussianAdapter(comp, comp.ridge, k, device, executor)
        return _Adapter(comp, 0.0, k, device, executor)

    @property
    def _kind(self) -> str:
        comp = self.component
        if isinstance(comp, str):
            return "logistic" if comp.lower() == "logistic" else "linear"
        if isinstance(comp, (torch.nn.Module, list, tuple)):
            return "torch"
        return "logistic" if isinstance(comp, LogisticExpert) else "other"

    # ------------------------------------------------------------------ fitting
    def fit(self, X: Any, y: Any) -> "PRESTO":
        """Partition ``(X, y)`` and fit the components and the router.

        Parameters
        ----------
        X : array-like of shape (N, P)
        y : array-like of shape (N,)
            Binary labels in {0, 1} for ``component="logistic"``, real values for
            ``"linear"``.

        Returns
        -------
        self
        """
        self._check_params()
        device = resolve_device(self.device)
        x, names = check_matrix(X, "X", dtype=_DTYPE, device=device)
        n, p = x.shape
        k = check_n_components(self.n_components, n)
        yt = self._check_y(y, n, device)
        generator = torch.Generator().manual_seed(int(self.seed) if self.seed is not None else 0)
        if self.seed is None:
            generator.seed()
        capacity = None if self.leeway is None else math.ceil((1.0 + float(self.leeway)) * n / k)

        with self._executor_context() as executor:
            eps = float(self.epsilon)
            adapter = self._make_adapter(k, p, device, executor)
            part = self._initial_partition(x, k, capacity, generator)
            if capacity is not None and int(torch.bincount(part, minlength=k).max()) > capacity:
                # make the start feasible: nearest centre of the initial parts, under the capacities
                part = greedy_capacity_assignment(_sq_distances(x, _onehot(part, k)), capacity)
            onehot = _onehot(part, k)
            adapter.fit(x, yt, onehot)
            objective = self._objective(adapter, x, yt, onehot, eps)
            history, loss_history = [objective], [self._objective(adapter, x, yt, onehot)]
            converged, iteration = False, 0
            with tqdm(total=int(self.max_iter), disable=not self.progress, desc="PRESTO", leave=False) as bar:
                for iteration in range(1, int(self.max_iter) + 1):
                    bound = self._scores(adapter, x, yt, onehot) + eps * _sq_distances(x, onehot)
                    new = greedy_capacity_assignment(bound, capacity)
                    old_value = bound.gather(1, part[:, None]).sum()
                    new_value = bound.gather(1, new[:, None]).sum()
                    if new_value > old_value:
                        # the capacity-constrained greedy is not an exact minimiser; fall back to
                        # the improving single-point moves that fit under the capacities
                        new = _improving_moves(bound, part, capacity)
                        new_value = bound.gather(1, new[:, None]).sum()
                    bar.update(1)
                    if new_value > old_value + 1e-12 * old_value.abs():
                        logger.info("PRESTO: iteration %d would raise the bound; keeping the partition", iteration)
                        converged = True
                        break
                    moved = int((new != part).sum())
                    if moved == 0:
                        converged = True
                        break
                    part, onehot = new, _onehot(new, k)
                    adapter.fit(x, yt, onehot)
                    objective = self._objective(adapter, x, yt, onehot, eps)
                    previous = history[-1]
                    history.append(objective)
                    loss_history.append(self._objective(adapter, x, yt, onehot))
                    bar.set_postfix(objective=f"{objective:.6g}", moved=moved)
                    logger.debug("PRESTO iteration %d: objective %.6g, %d points moved", iteration, objective, moved)
                    if abs(previous - objective) <= float(self.tol) * abs(objective):
                        converged = True
                        break
        if not converged:
            logger.warning("PRESTO did not converge in max_iter=%d iterations", self.max_iter)

        adapter.executor = None  # the fitted object keeps no reference to a (closed) pool
        self.components_ = adapter.comp
        self._adapter = adapter
        self._fit_device = device
        self.partition_ = as_numpy(part)
        self.part_sizes_ = np.bincount(self.partition_, minlength=k)
        self.history_ = history
        self.loss_history_ = loss_history
        self.n_iter_ = iteration
        self.converged_ = converged
        self.n_features_in_ = p
        self.feature_names_in_ = names
        self.router_ = self._fit_router(x, onehot, k)
        return self

    def _initial_partition(
        self, x: torch.Tensor, k: int, capacity: int | None, generator: torch.Generator
    ) -> torch.Tensor:
        n = x.shape[0]
        init = self.init
        if isinstance(init, str):
            if init == "random":
                return (torch.randperm(n, generator=generator) % k).to(x.device)
            if init == "kmeans":
                scale = x.std(0).clamp_min(1e-12)
                centres, _ = kmeans((x - x.mean(0)) / scale, k, generator, n_init=3)
                dist = torch.cdist((x - x.mean(0)) / scale, centres).square()
                return greedy_capacity_assignment(dist, capacity)
            if init == "ward":
                from sklearn.cluster import AgglomerativeClustering

                labels = AgglomerativeClustering(k, linkage="ward").fit_predict(as_numpy(x))
                return torch.as_tensor(labels, dtype=torch.long, device=x.device)
            raise ValueError(f"init must be 'kmeans', 'ward', 'random' or an array of shape ({n},); got {init!r}")
        arr = as_numpy(init)
        if arr.shape != (n,) or arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= k:
            raise ValueError(f"init must be an integer array of shape ({n},) with values in [0, {k}); got {arr!r}")
        return torch.as_tensor(arr, dtype=torch.long, device=x.device)

    def _objective(
        self, adapter: _Adapter, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor, eps: float = 0.0
    ) -> float:
        value = float((onehot * adapter.losses(x, y)).sum() + (adapter.penalty() * (onehot.sum(0) > 0)).sum())
        if eps > 0:
            value += eps * float((onehot * _sq_distances(x, onehot)).sum())
        if not math.isfinite(value):
            raise FloatingPointError(f"PRESTO objective became {value}; scale the data or increase ridge")
        return value

    def _scores(self, adapter: _Adapter, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        losses = adapter.losses(x, y)
        if self.scores == "loss":
            return losses
        alpha = float(self.alpha)
        member = alpha * adapter.gains(x, y, onehot)
        singleton = losses / alpha
        return torch.where(onehot > 0, member, singleton)

    def _fit_router(self, x: torch.Tensor, onehot: torch.Tensor, k: int) -> Any:
        if isinstance(self.router, str):
            if self.router != "softmax":
                raise ValueError(f"router must be 'softmax' or a classifier object; got {self.router!r}")
            gate = SoftmaxGate(torch.zeros(k, x.shape[1], dtype=_DTYPE, device=x.device), ridge=self.router_ridge)
            return gate.fit(x, onehot)
        if not (callable(getattr(self.router, "fit", None)) and callable(getattr(self.router, "predict_proba", None))):
            raise TypeError("router must be 'softmax' or an object with fit(X, labels) and predict_proba(X)")
        try:
            from sklearn.base import clone

            router = clone(self.router)
        except (ImportError, TypeError):
            router = copy.deepcopy(self.router)
        router.fit(as_numpy(x), self.partition_)  # scikit-learn routers run on the CPU
        return router

    # ------------------------------------------------------------------ saving
    _SAVED_PARAMS = (
        "n_components",
        "ridge",
        "alpha",
        "leeway",
        "epsilon",
        "scores",
        "max_iter",
        "tol",
        "router_ridge",
        "seed",
        "progress",
        "device",
    )

    def get_params(self) -> dict[str, Any]:
        """Constructor arguments as a saved file records them.

        A component object is recorded as ``None`` (pass it to :meth:`load`), an
        ``init`` array as ``"kmeans"`` and ``executor`` not at all.
        """
        params = super().get_params()
        params["component"] = self.component if isinstance(self.component, str) else None
        params["init"] = self.init if isinstance(self.init, str) else "kmeans"
        params["router"] = self.router if isinstance(self.router, str) else None
        return params

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Partition, component parameters and router parameters (what :meth:`save` writes)."""
        self._check_fitted()
        if not isinstance(self.router_, SoftmaxGate):
            raise TypeError(
                f"a PRESTO with a custom router ({type(self.router_).__name__}) cannot be saved safely; "
                "use router='softmax' or save the router yourself"
            )
        tensors = {"partition": torch.as_tensor(self.partition_, dtype=torch.long)}
        tensors.update(object_tensors(self.components_, "component"))
        tensors.update(object_tensors(self.router_, "router"))
        return tensors

    def extra_state(self) -> dict[str, Any]:
        """JSON-able fitted state beyond the tensors."""
        return {
            "loss_history": [float(v) for v in self.loss_history_],
            "component_type": self.component if isinstance(self.component, str) else type(self.component).__name__,
        }

    def _restore(self, tensors: dict[str, torch.Tensor], extra: dict[str, Any], template: Any) -> None:
        k, p = int(self.n_components), int(self.n_features_in_)
        if self.component is None:
            if template is None:
                raise ValueError(
                    f"this PRESTO was saved with a {extra.get('component_type')} component object; pass an "
                    "unfitted one of the same kind to PRESTO.load(path, component=...)"
                )
            self.component = template
        device = resolve_device(self.device)
        adapter = self._make_adapter(k, p, device)
        load_object_tensors(adapter.comp, tensors, "component")
        self._adapter = adapter
        self._fit_device = device
        self.components_ = adapter.comp
        gate = SoftmaxGate(torch.zeros(k, p, dtype=_DTYPE, device=device), ridge=self.router_ridge)
        load_object_tensors(gate, tensors, "router")
        self.router_ = gate
        self.partition_ = as_numpy(tensors["partition"])
        if self.partition_.ndim != 1 or (
            self.partition_.size and not 0 <= self.partition_.min() <= self.partition_.max() < k
        ):
            raise ValueError(f"saved partition must hold part indices in [0, {k})")
        self.part_sizes_ = np.bincount(self.partition_, minlength=k)
        self.loss_history_ = [float(v) for v in extra["loss_history"]]

    @classmethod
    def load(cls, path: Any, component: Any = None, map_location: str | torch.device | None = None) -> "PRESTO":
        """Load a PRESTO written by :meth:`save` (safe tensor loading, checksum and version checked).

        Parameters
        ----------
        path : str or Path
            Directory written by :meth:`save`.
        component : object, optional
            Required when the saved PRESTO used a component object (a family or
            ``nn.Module``): an unfitted object of the same kind; its parameters are
            replaced by the saved ones.
        map_location : str or torch.device, optional
            Device to load onto; it becomes the loaded estimator's ``device``. By
            default the saved ``device`` is used (tensors are always saved from the CPU).

        Raises
        ------
        ValueError
            Corrupt or modified files, another format version, another class, or
            saved tensors that do not fit ``component``.

        Examples
        --------
        >>> import tempfile
        >>> import numpy as np
        >>> X = np.linspace(-1, 1, 40)[:, None]
        >>> model = PRESTO(2, "linear", seed=0, progress=False).fit(X, np.abs(X[:, 0]))
        >>> again = PRESTO.load(model.save(tempfile.mkdtemp()))
        >>> bool((again.predict(X) == model.predict(X)).all())
        True
        """
        return cls._load(path, component, map_location)

    # ------------------------------------------------------------------ prediction
    def _check_fitted(self) -> None:
        if not hasattr(self, "partition_"):
            raise NotFittedError("this PRESTO instance is not fitted yet; call fit(X, y) first")

    def _check_X(self, X: Any) -> torch.Tensor:
        """``X`` (any array-like, a tensor on any device) on the device the fitted state lives on."""
        self._check_fitted()
        return check_matrix(X, "X", dtype=_DTYPE, device=self._fit_device, n_features=self.n_features_in_)[0]

    def _routing_proba(self, x: torch.Tensor) -> torch.Tensor:
        k = int(self.n_components)
        if isinstance(self.router_, SoftmaxGate):
            return self.router_.log_prob(x).exp()
        proba = torch.as_tensor(np.asarray(self.router_.predict_proba(as_numpy(x))), dtype=_DTYPE, device=x.device)
        classes = np.asarray(getattr(self.router_, "classes_", np.arange(proba.shape[1]))).astype(np.int64)
        full = torch.zeros(x.shape[0], k, dtype=_DTYPE, device=x.device)
        full[:, torch.as_tensor(classes, device=x.device)] = proba
        return full

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
        if self._kind == "logistic":
            values = values.long()
        return to_output(values, X)

    def predict_proba(self, X: Any) -> Any:
        """``[P(y=0), P(y=1)]`` under the routed logistic component, shape ``(N, 2)``."""
        self._check_fitted()
        if not hasattr(self.components_, "predict_proba"):
            raise TypeError("predict_proba needs a classification component (component='logistic')")
        x = self._check_X(X)
        route = self._routing_proba(x).argmax(1)
        p1 = torch.as_tensor(self.components_.predict_proba(x)).gather(1, route[:, None]).squeeze(1)
        return to_output(torch.stack([1 - p1, p1], dim=1), X)

    def objective(self, X: Any, y: Any, partition: Any) -> float:
        """``sum_k G(S_k)`` of a given partition of ``(X, y)`` (components refitted on it)."""
        self._check_params()
        device = resolve_device(self.device)
        x, _ = check_matrix(X, "X", dtype=_DTYPE, device=device)
        n, p = x.shape
        k = check_n_components(self.n_components, n)
        yt = self._check_y(y, n, device)
        part = torch.as_tensor(as_numpy(partition), dtype=torch.long, device=device)
        if part.shape != (n,) or part.min() < 0 or part.max() >= k:
            raise ValueError(f"partition must have shape ({n},) with values in [0, {k})")
        adapter = self._make_adapter(k, p, device)
        onehot = _onehot(part, k)
        adapter.fit(x, yt, onehot)
        return self._objective(adapter, x, yt, onehot)


def _improving_moves(bound: torch.Tensor, part: torch.Tensor, capacity: int | None) -> torch.Tensor:
    """Move points to their cheapest part, largest improvement first, while capacity allows.

    Every accepted move lowers ``sum_i bound[i, part_i]``, so the result never raises it.
    """
    n, k = bound.shape
    best = bound.argmin(1)
    gain = bound.gather(1, part[:, None]).squeeze(1) - bound.gather(1, best[:, None]).squeeze(1)
    order = torch.argsort(gain, descending=True, stable=True)
    order = order[gain[order] > 0].tolist()
    new = as_numpy(part).copy()
    counts = np.bincount(new, minlength=k)
    cap = n if capacity is None else int(capacity)
    target = as_numpy(best)
    for i in order:
        if counts[target[i]] < cap:
            counts[new[i]] -= 1
            counts[target[i]] += 1
            new[i] = target[i]
    return torch.as_tensor(new, device=part.device)


def _onehot(part: torch.Tensor, k: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(part, k).to(_DTYPE)


def _sq_distances(x: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """Squared distances of every point to the centre (mean) of every part, shape (N, K)."""
    counts = onehot.sum(0)
    centres = (onehot.T @ x) / counts.clamp_min(1.0)[:, None]
    centres = torch.where(counts[:, None] > 0, centres, x.mean(0, keepdim=True).expand_as(centres))
    return torch.cdist(x, centres).square()
