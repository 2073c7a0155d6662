"""What PRESTO needs from its ``K`` components (fit on a partition, per-point losses, regulariser,
marginal gains, predictions), behind one small interface: :class:`Adapter` for any component family,
its logistic, softmax and linear-Gaussian specialisations with leave-one-out gains, :class:`TorchAdapter` for
user ``nn.Module`` components, :func:`make_adapter`, which picks one for PRESTO's ``component``, and
the executor the components are trained on (:func:`check_executor`, :func:`open_executor`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, Iterator

import torch

from ppmix.components import GaussianExpert, LogisticExpert, SoftmaxExpert
from ppmix.optimizers.persist import move_object_tensors
from ppmix.optimizers.presto.components import check_torch_component
from ppmix.optimizers.presto.loo import gaussian_loo_gains, logistic_loo_gains, softmax_loo_gains
from ppmix.parallel import run_tasks

__all__ = [
    "Adapter",
    "GaussianAdapter",
    "LogisticAdapter",
    "SoftmaxAdapter",
    "TorchAdapter",
    "check_executor",
    "component_kind",
    "make_adapter",
    "open_executor",
]

logger = logging.getLogger(__name__)

_DTYPE = torch.float64


def check_executor(executor: Any) -> None:
    """Raise ``TypeError`` unless ``executor`` is one PRESTO accepts (see its ``executor`` parameter)."""
    ex = executor
    if not (ex is None or ex in ("processes", "inline") or isinstance(ex, Executor) or hasattr(ex, "get_executor")):
        raise TypeError(
            "executor must be None (in-process), 'processes', 'inline', a concurrent.futures.Executor "
            f"or a dask.distributed.Client; got {ex!r}"
        )


@contextlib.contextmanager
def open_executor(executor: Any) -> Iterator[Any]:
    """The executor of one fit; ``'processes'`` starts one local spawn pool for the whole fit."""
    if isinstance(executor, str) and executor == "processes":
        with ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")) as pool:
            yield pool
    else:
        yield executor


def _fit_member_task(task: tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor | None]) -> Any:
    """Train one component on the rows of its part (runs on an executor): a module, or a family member
    with the rows' weights (``None``: ones)."""
    comp, x, y, weight = task
    if isinstance(comp, torch.nn.Module):
        return comp.fit(x, y)
    comp.fit((x, y), torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device) if weight is None else weight[:, None])
    return comp


def _member(family: Any, k: int) -> Any:
    """Component ``k`` of a family, as an independent family with one member."""
    one = family.clone()
    for name in family.param_names:
        setattr(one, name, getattr(family, name)[k : k + 1].clone())
    return one


class Adapter:
    """A component family seen by PRESTO: fit, per-point loss, penalty, gains.

    With ``executor=None`` the ``K`` members are fitted at once (one batched call with
    one-hot weights); otherwise every non-empty member is fitted on its own rows as one
    task of :func:`ppmix.parallel.run_tasks` (families with ``param_names`` only).
    ``comp`` already lives on ``device``, where every tensor the adapter makes is put.

    ``onehot`` may hold membership weights (:func:`~.assignment.partition_onehot` with ``sample_weight``):
    the fits are then weighted, and :meth:`gains` are those of removing one copy (one unit of weight) of a
    member row.
    """

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

    def _fit_members(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> None:
        ks = [k for k in range(self.k) if onehot[:, k].any()]
        tasks = []
        for k in ks:
            rows = onehot[:, k] > 0
            tasks.append((_member(self.comp, k), x[rows], y[rows], onehot[rows, k]))
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

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-point loss ``l_i(theta_k)``, shape (N, K)."""
        return -torch.as_tensor(self.comp.log_prob((x, y))).to(device=self.device, dtype=_DTYPE)

    def penalty(self) -> torch.Tensor:
        """Regulariser ``R(theta_k)``, shape (K,): the family's own ``penalty()`` (the ridge term its fit
        maximises against), zeros for a family without one."""
        if callable(getattr(self.comp, "penalty", None)):
            return self.comp.penalty().to(device=self.device, dtype=_DTYPE)
        return torch.zeros(self.k, dtype=_DTYPE, device=self.device)

    def gains(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Fallback: the marginal gain of a member is approximated by its own loss (no regulariser known)."""
        losses = self.losses(x, y)
        return torch.where(onehot > 0, losses, torch.zeros_like(losses))

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.comp, "mean"):
            return self.comp.mean(x)
        if hasattr(self.comp, "predict_proba"):
            return (torch.as_tensor(self.comp.predict_proba(x)) > 0.5).to(device=self.device, dtype=_DTYPE)
        raise TypeError(f"{type(self.comp).__name__} has neither mean(x) nor predict_proba(x); cannot predict")


class LogisticAdapter(Adapter):
    """:class:`~ppmix.components.LogisticExpert` components, ``R = ridge/2 ||coef||^2``."""

    def gains(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Approximate gains: one Newton step from the full fit (:func:`~.loo.logistic_loo_gains`)."""
        return logistic_loo_gains(x, y, onehot, self.comp.coef, self.comp.intercept, self.ridge)[1]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return (self.comp.predict_proba(x) > 0.5).to(_DTYPE)

    def proba(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities ``[P(y=0), P(y=1)]`` of every member, shape (N, K, 2)."""
        p1 = self.comp.predict_proba(x)
        return torch.stack([1 - p1, p1], dim=-1)


class SoftmaxAdapter(Adapter):
    """:class:`~ppmix.components.SoftmaxExpert` components (labels coded ``0..C-1``), ``R = ridge/2 ||coef||^2``."""

    def gains(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Approximate gains: one Newton step from the full fit (:func:`~.loo.softmax_loo_gains`)."""
        targets = torch.nn.functional.one_hot(y.long(), self.comp.n_classes).to(_DTYPE)
        return softmax_loo_gains(x, targets, onehot, self.comp.coef, self.comp.intercept, self.ridge)[1]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.comp.predict_proba(x).argmax(-1).to(_DTYPE)

    def proba(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities of every member, shape (N, K, C)."""
        return self.comp.predict_proba(x)


class GaussianAdapter(Adapter):
    """:class:`~ppmix.components.GaussianExpert` components, ``R = ridge ||coef||^2 / (2 sigma^2)``.

    The family's fit is the joint optimum of the penalised likelihood: ridge least squares, then
    ``sigma^2 = (RSS + ridge ||coef||^2) / n`` (floored at the family's ``min_variance``).
    """

    def gains(self, x: torch.Tensor, y: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Exact closed-form leave-one-out gains (:func:`~.loo.gaussian_loo_gains`)."""
        return gaussian_loo_gains(x, y, onehot, self.ridge, self.comp.min_variance)[1]


class TorchAdapter(Adapter):
    """``K`` user ``nn.Module`` components (see :mod:`ppmix.optimizers.presto.components`).

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
            tasks.append((module, self._cast(module, x[rows]), self._cast(module, y[rows]), None))
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


def make_adapter(
    component: Any,
    ridge: float,
    k: int,
    p: int,
    device: torch.device,
    executor: Any = None,
    n_classes: int = 2,
) -> Adapter:
    """The adapter of PRESTO's ``component`` with ``k`` members on ``p`` features, on ``device``.

    ``"logistic"``, ``"softmax"`` (``n_classes`` classes) and ``"linear"`` (or ``"gaussian"``) build
    fresh families with ``ridge``;
    an ``nn.Module`` (copied ``k`` times) or a list of ``k`` modules gives a :class:`TorchAdapter`;
    any other object needs ``log_prob(data) -> (N, K)`` and ``fit(data, weights)`` and is copied
    to ``device`` (the built-in families keep their own ``ridge``).
    """
    if isinstance(component, str):
        kind = component.lower()
        zeros = torch.zeros(k, p, dtype=_DTYPE, device=device)
        if kind == "logistic":
            return LogisticAdapter(LogisticExpert(zeros, ridge=ridge), ridge, k, device, executor)
        if kind == "softmax":
            coef = torch.zeros(k, n_classes, p, dtype=_DTYPE, device=device)
            return SoftmaxAdapter(SoftmaxExpert(coef, ridge=ridge), ridge, k, device, executor)
        if kind in ("linear", "gaussian"):
            return GaussianAdapter(GaussianExpert(zeros, ridge=ridge), ridge, k, device, executor)
        raise ValueError(f"component must be 'logistic', 'softmax', 'linear' or a component object; got {component!r}")
    if isinstance(component, torch.nn.Module) or (
        isinstance(component, (list, tuple)) and any(isinstance(c, torch.nn.Module) for c in component)
    ):
        modules = list(component) if isinstance(component, (list, tuple)) else [component]
        if len(modules) not in (1, k):
            raise ValueError(f"component is a list of {len(modules)} modules but n_components={k}")
        for i, module in enumerate(modules):
            check_torch_component(module, "component" if len(modules) == 1 else f"component[{i}]")
        modules = [copy.deepcopy(modules[0 if len(modules) == 1 else i]).to(device) for i in range(k)]
        return TorchAdapter(modules, k, device, executor)
    if not (callable(getattr(component, "log_prob", None)) and callable(getattr(component, "fit", None))):
        raise TypeError(
            "component must be 'logistic', 'linear', a component family with log_prob(data) -> (N, K) and "
            "fit(data, weights), or a torch.nn.Module with per_sample_loss(x, y) and fit(x, y); "
            f"got {type(component).__name__}"
        )
    if hasattr(component, "n_components") and int(component.n_components) != k:
        raise ValueError(f"component has {component.n_components} members but n_components={k}")
    comp = move_object_tensors(copy.deepcopy(component), device)
    if isinstance(comp, LogisticExpert):
        return LogisticAdapter(comp, comp.ridge, k, device, executor)
    if isinstance(comp, SoftmaxExpert):
        return SoftmaxAdapter(comp, comp.ridge, k, device, executor)
    if isinstance(comp, GaussianExpert):
        return GaussianAdapter(comp, comp.ridge, k, device, executor)
    return Adapter(comp, 0.0, k, device, executor)


def component_kind(component: Any) -> str:
    """``"logistic"``, ``"softmax"``, ``"linear"``, ``"torch"`` or ``"other"``: how PRESTO predicts with it."""
    if isinstance(component, str):
        return component.lower() if component.lower() in ("logistic", "softmax") else "linear"
    if isinstance(component, (torch.nn.Module, list, tuple)):
        return "torch"
    if isinstance(component, SoftmaxExpert):
        return "softmax"
    return "logistic" if isinstance(component, LogisticExpert) else "other"
