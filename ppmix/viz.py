"""Plots of fitted mixtures (matplotlib is imported lazily)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot_clusters", "plot_history"]


def _projection(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """First two principal directions (or the raw axes when D <= 2)."""
    centre = x.mean(0)
    if x.shape[1] <= 2:
        basis = np.eye(x.shape[1])[:, :2]
        return centre, basis, [f"x{i}" for i in range(basis.shape[1])]
    _, _, vt = np.linalg.svd(x - centre, full_matrices=False)
    return centre, vt[:2].T, ["PC1", "PC2"]


def plot_clusters(model: Any, X: Any, ax: Any = None) -> Any:
    """Scatter of ``X`` coloured by ``model.predict(X)`` with the component means.

    Data with more than two features are shown on their first two principal axes.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> X = np.random.default_rng(0).normal(size=(50, 3))
    >>> ax = plot_clusters(GMM(2, seed=0, progress=False).fit(X), X)
    """
    import matplotlib.pyplot as plt

    x = np.asarray(X, dtype=float)
    labels = np.asarray(model.predict(x))
    centre, basis, names = _projection(x)
    proj = (x - centre) @ basis
    if proj.shape[1] == 1:
        proj = np.column_stack([proj[:, 0], np.zeros(len(proj))])
        names = names + [""]
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(proj[:, 0], proj[:, 1], c=labels, s=6, cmap="tab10", alpha=0.6)
    means = getattr(model, "means_", None)
    if means is not None:
        m = (np.asarray(means.detach().cpu()) - centre) @ basis
        m = m if m.shape[1] == 2 else np.column_stack([m[:, 0], np.zeros(len(m))])
        ax.scatter(m[:, 0], m[:, 1], marker="x", c="black", s=60, label="component means")
        ax.legend(loc="best")
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.set_title(f"{type(model).__name__} (K={model.n_components})")
    return ax


def plot_history(model: Any, ax: Any = None) -> Any:
    """The objective per data point after each EM iteration / SVI step."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    ax.plot(model.history_)
    ax.set_xlabel("iteration" if model.engine_ == "em" else "step")
    ax.set_ylabel("objective per point")
    return ax
