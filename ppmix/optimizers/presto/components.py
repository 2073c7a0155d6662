"""User ``torch.nn.Module`` components for :class:`~ppmix.inference.PRESTO`, and two examples.

PRESTO accepts, besides the shared component families, any ``torch.nn.Module`` that
satisfies the small :class:`TorchComponent` protocol:

``per_sample_loss(x, y) -> Tensor[N]``
    The loss ``l_i(theta)`` of every row (non-negative, finite, no reduction). PRESTO
    calls it under ``torch.no_grad()`` on all ``N`` rows to score every pair ``(i, k)``.
``fit(x, y) -> module``
    Train on the given rows (the member rows of one part), warm-started from the
    current parameters, and return the trained module (``self`` in-process; on a
    process pool or Dask the returned copy replaces the original). It should minimise
    ``sum_i l_i(theta) + penalty(theta)``, the paper's ``Train(S; theta_k)``, and be
    deterministic given its inputs, so that a fit on an executor equals a fit in-process.
``penalty() -> Tensor`` *(optional)*
    The regulariser ``R(theta)`` included in ``G(S) = sum_{i in S} l_i + R`` (0 if absent).
``predict(x) -> Tensor[N]`` *(optional)*
    What :meth:`PRESTO.predict` returns for the rows routed to this component
    (default: ``forward(x)``).

PRESTO copies the module to its ``device`` (``module.to(device)``; CPU by default) and
passes ``x`` and ``y`` already converted to the module's device and floating dtype
(that of its first parameter), so a component needs no device handling of its own as
long as every tensor it creates takes the device of its inputs or parameters. With a process pool
or Dask, the module's class must be importable by the workers (defined in a module,
not in ``__main__``); a module that comes back from a worker is moved to ``device``.

**Marginal gains of a torch component.** There is no closed form for
``G(S_k) - G(S_k \\ i)`` of a general network, and retraining once per point is what
PRESTO avoids, so for torch components the gain of a member is approximated by its
own per-sample loss at the trained parameters, ``l_i(theta_k)`` (the quantity the
authors' reference code scores points by); the singleton term ``G({(i, k)})`` is
likewise ``l_i(theta_k)`` (Algorithm 1 trains it warm-started at ``theta_k``). The
influence-function correction is used only for the logistic family, where it is
cheap (see :mod:`ppmix.optimizers.presto.loo`).

Examples
--------
>>> import torch
>>> svm = LinearSVMComponent(2, epochs=50)
>>> x = torch.tensor([[0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
>>> y = torch.tensor([1.0, 0.0], dtype=torch.float64)
>>> svm = svm.fit(x, y)
>>> svm.predict(x).tolist()
[1, 0]
>>> isinstance(svm, TorchComponent)
True
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LinearSVMComponent", "MLPComponent", "TorchComponent", "check_torch_component"]


@runtime_checkable
class TorchComponent(Protocol):
    """What PRESTO needs from a user ``nn.Module`` component (see the module docstring).

    Examples
    --------
    It is a runtime-checkable protocol: any module with ``per_sample_loss`` and ``fit`` is one.

    >>> import torch
    >>> from torch import nn
    >>> class Constant(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.value = nn.Parameter(torch.zeros(()))
    ...     def forward(self, x):
    ...         return self.value.expand(len(x))
    ...     def per_sample_loss(self, x, y):
    ...         return (self(x) - y) ** 2
    ...     def fit(self, x, y):
    ...         self.value.data = y.mean()
    ...         return self
    >>> isinstance(Constant(), TorchComponent), isinstance(nn.Linear(2, 1), TorchComponent)
    (True, False)
    """

    def per_sample_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-row loss, shape ``(N,)``."""
        ...

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> nn.Module:
        """Train on the given rows (warm start) and return the trained module."""
        ...


def check_torch_component(module: object, name: str = "component") -> nn.Module:
    """Check that ``module`` is an ``nn.Module`` with ``per_sample_loss`` and ``fit``; return it.

    Raises
    ------
    TypeError
        Naming the missing method.

    Examples
    --------
    >>> check_torch_component(torch.nn.Linear(2, 1))
    Traceback (most recent call last):
    ...
    TypeError: component (Linear) has no per_sample_loss(x, y) method: PRESTO needs the loss of every row ...
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module; got {type(module).__name__}")
    kind = type(module).__name__
    if not callable(getattr(module, "per_sample_loss", None)):
        raise TypeError(
            f"{name} ({kind}) has no per_sample_loss(x, y) method: PRESTO needs the loss of every row "
            "(a Tensor of shape (N,), no reduction); see ppmix.optimizers.presto.components"
        )
    if not callable(getattr(module, "fit", None)):
        raise TypeError(
            f"{name} ({kind}) has no fit(x, y) method: PRESTO needs a training routine that trains the "
            "module on the rows of its part and returns it; see ppmix.optimizers.presto.components"
        )
    return module


def _train(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Full-batch Adam on ``sum_i l_i + penalty`` for ``module.epochs`` steps (deterministic)."""
    optimiser = torch.optim.Adam(module.parameters(), lr=module.lr)
    for _ in range(module.epochs):
        optimiser.zero_grad()
        loss = module.per_sample_loss(x, y).sum() + module.penalty()
        loss.backward()
        optimiser.step()


def _signed(y: torch.Tensor) -> torch.Tensor:
    """Labels in {0, 1} or {-1, +1} as {-1, +1}."""
    return torch.where(y > 0, torch.ones_like(y), -torch.ones_like(y))


def _check_training_args(epochs: int, lr: float, ridge: float) -> None:
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer; got {epochs!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number; got {lr!r}")
    if not (isinstance(ridge, (int, float)) and math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be a finite number >= 0; got {ridge!r}")


class LinearSVMComponent(nn.Module):
    """Linear SVM ``h(x) = w'x + b`` with the hinge loss ``(1 - s h(x))_+``, the component of PRESTO §4.1.

    Labels may be given in {0, 1} or {-1, +1} (``s = +1`` for ``y > 0``). ``fit``
    minimises ``sum_i (1 - s_i h(x_i))_+ + ridge ||w||^2`` (the paper's ``lambda ||theta||^2``,
    intercept not shrunk) by full-batch Adam, ``epochs`` steps from the current
    parameters, so refits across PRESTO iterations are warm-started.

    Parameters
    ----------
    n_features : int
    ridge : float, default 1e-4
        ``lambda`` (App. D.3 of the paper uses 1e-4).
    lr : float, default 0.05
    epochs : int, default 200
        Adam steps per ``fit``.
    dtype : torch.dtype, default torch.float64

    Examples
    --------
    >>> import torch
    >>> x = torch.linspace(-1, 1, 20, dtype=torch.float64)[:, None]
    >>> svm = LinearSVMComponent(1).fit(x, (x[:, 0] > 0.2).double())
    >>> float((svm.predict(x) == (x[:, 0] > 0.2).long()).double().mean())
    1.0
    """

    def __init__(
        self,
        n_features: int,
        *,
        ridge: float = 1e-4,
        lr: float = 0.05,
        epochs: int = 200,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        _check_training_args(epochs, lr, ridge)
        self.linear = nn.Linear(n_features, 1, dtype=dtype)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.ridge, self.lr, self.epochs = float(ridge), float(lr), int(epochs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Decision value ``w'x + b``, shape ``(N,)``."""
        return self.linear(x).squeeze(-1)

    def per_sample_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Hinge loss ``(1 - s_i h(x_i))_+``, shape ``(N,)``."""
        return F.relu(1.0 - _signed(y) * self(x))

    def penalty(self) -> torch.Tensor:
        """``ridge ||w||^2``."""
        return self.ridge * self.linear.weight.square().sum()

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> "LinearSVMComponent":
        """Train on ``(x, y)`` from the current parameters; returns ``self``."""
        _train(self, x, y)
        return self

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class in {0, 1} (``1`` where ``h(x) > 0``)."""
        with torch.no_grad():
            return (self(x) > 0).long()


class MLPComponent(nn.Module):
    """A small multilayer perceptron component: one hidden layer (tanh), binary or real target.

    ``task="classification"``: per-sample loss is the binary cross-entropy of the
    logit (labels in {0, 1}); ``task="regression"``: half the squared error. ``fit``
    minimises ``sum_i l_i + ridge * (sum of squared weights)`` by full-batch Adam,
    ``epochs`` steps from the current parameters.

    Parameters
    ----------
    n_features : int
    hidden : int, default 16
    task : {"classification", "regression"}, default "classification"
    ridge : float, default 1e-4
    lr : float, default 0.02
    epochs : int, default 200
    seed : int, default 0
        Seed of the initial weights (the module is then deterministic).
    dtype : torch.dtype, default torch.float64

    Examples
    --------
    >>> import torch
    >>> x = torch.linspace(-2, 2, 40, dtype=torch.float64)[:, None]
    >>> mlp = MLPComponent(1, task="regression", epochs=300).fit(x, x[:, 0].square())
    >>> float(mlp.per_sample_loss(x, x[:, 0].square()).detach().mean()) < 0.05
    True
    """

    def __init__(
        self,
        n_features: int,
        *,
        hidden: int = 16,
        task: str = "classification",
        ridge: float = 1e-4,
        lr: float = 0.02,
        epochs: int = 200,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        _check_training_args(epochs, lr, ridge)
        if task not in ("classification", "regression"):
            raise ValueError(f"task must be 'classification' or 'regression'; got {task!r}")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden must be a positive integer; got {hidden!r}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(
                nn.Linear(n_features, hidden, dtype=dtype), nn.Tanh(), nn.Linear(hidden, 1, dtype=dtype)
            )
        self.task, self.ridge, self.lr, self.epochs = task, float(ridge), float(lr), int(epochs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logit (classification) or prediction (regression), shape ``(N,)``."""
        return self.net(x).squeeze(-1)

    def per_sample_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy or half squared error per row, shape ``(N,)``."""
        out = self(x)
        if self.task == "classification":
            return F.binary_cross_entropy_with_logits(out, y, reduction="none")
        return 0.5 * (out - y).square()

    def penalty(self) -> torch.Tensor:
        """``ridge`` times the sum of squared weights (biases not shrunk)."""
        return self.ridge * sum(m.weight.square().sum() for m in self.net if isinstance(m, nn.Linear))

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> "MLPComponent":
        """Train on ``(x, y)`` from the current parameters; returns ``self``."""
        _train(self, x, y)
        return self

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class in {0, 1} (classification) or the predicted value (regression)."""
        with torch.no_grad():
            out = self(x)
        return (out > 0).long() if self.task == "classification" else out
