"""Plots of fitted mixtures (matplotlib is imported lazily).

Every plot is drawn on the user's scale and labelled with the user's column names
(the model's ``feature_names_in_``, a DataFrame's columns, or ``feature_names``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["plot_clusters", "plot_energy", "plot_experts", "plot_history", "plot_relevance"]


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=float)


def _names(model: Any, X: Any, n_features: int, feature_names: Sequence[str] | None) -> list[str]:
    """The column names: given, else the model's, else a DataFrame's, else ``x0, x1, ...``."""
    for names in (feature_names, getattr(model, "feature_names_in_", None), getattr(X, "columns", None)):
        if names is not None and len(names) == n_features:
            return [str(n) for n in names]
    return [f"x{i}" for i in range(n_features)]


def _projection(x: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The raw columns when D <= 2 (no centring: the user's scale), else the first two principal
    directions, each labelled with its largest loadings on the named columns."""
    if x.shape[1] <= 2:
        return np.zeros(x.shape[1]), np.eye(x.shape[1]), list(names)
    centre = x.mean(0)
    _, _, vt = np.linalg.svd(x - centre, full_matrices=False)
    labels = []
    for i, direction in enumerate(vt[:2]):
        top = np.argsort(-np.abs(direction))[:3]
        terms = " ".join(f"{'+' if direction[j] >= 0 else '-'} {abs(direction[j]):.2f}·{names[j]}" for j in top)
        labels.append(f"PC{i + 1} = {terms.removeprefix('+ ')}{' …' if x.shape[1] > 3 else ''}")
    return centre, vt[:2].T, labels


def plot_clusters(
    model: Any,
    X: Any,
    ax: Any = None,
    *,
    labels: Any = None,
    feature_names: Sequence[str] | None = None,
) -> Any:
    """Scatter of ``X`` coloured by ``model.predict(X)`` (or ``labels``) with the component means.

    One or two features are shown as they are, on their own scale and names; more are
    shown on their first two principal axes, labelled with their main loadings.

    Parameters
    ----------
    model : fitted model
        Any fitted model with ``predict``; its ``means_`` are drawn as crosses when it has them.
    X : array-like of shape (N, D) or DataFrame
        The data to draw.
    ax : matplotlib Axes, optional
        Where to draw; a new figure's by default.
    labels : array-like of shape (N,), optional
        The colours' labels, instead of ``model.predict(X)``.
    feature_names : sequence of str, optional
        The axis names; else the model's ``feature_names_in_``, a DataFrame's columns or ``x0, x1, ...``.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> from ppmix import GMM
    >>> X = pd.DataFrame(np.random.default_rng(0).normal(size=(50, 2)) + 100, columns=["height", "weight"])
    >>> ax = plot_clusters(GMM(2, seed=0, progress=False).fit(X), X)
    >>> ax.get_xlabel(), ax.get_ylabel(), bool(ax.get_xlim()[0] > 90)
    ('height', 'weight', True)
    """
    import matplotlib.pyplot as plt

    x = _numpy(X)
    labels = np.asarray(model.predict(X) if labels is None else labels).reshape(-1)
    names = _names(model, X, x.shape[1], feature_names)
    centre, basis, axis_names = _projection(x, names)
    proj = (x - centre) @ basis
    if proj.shape[1] == 1:
        proj = np.column_stack([proj[:, 0], np.zeros(len(proj))])
        axis_names = axis_names + [""]
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(proj[:, 0], proj[:, 1], c=labels, s=6, cmap="tab10", vmin=0, vmax=9, alpha=0.6)
    means = getattr(model, "means_", None)
    if means is not None:
        m = (_numpy(means) - centre) @ basis
        m = m if m.shape[1] == 2 else np.column_stack([m[:, 0], np.zeros(len(m))])
        ax.scatter(m[:, 0], m[:, 1], marker="x", c="black", s=60, label="component means")
        ax.legend(loc="best")
    ax.set_xlabel(axis_names[0])
    ax.set_ylabel(axis_names[1])
    ax.set_title(f"{type(model).__name__} (K={model.n_components})")
    return ax


def plot_history(model: Any, ax: Any = None) -> Any:
    """The objective per data point after each EM iteration / SVI step.

    Parameters
    ----------
    model : fitted model
        A model fitted by EM or SVI (its ``history_``).
    ax : matplotlib Axes, optional
        Where to draw; a new figure's by default.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> gmm = GMM(2, seed=0, progress=False).fit(np.random.default_rng(0).normal(size=(100, 2)))
    >>> len(plot_history(gmm).get_lines()[0].get_xdata()) == len(gmm.history_)
    True
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    ax.plot(model.history_)
    ax.set_xlabel("iteration" if model.engine_ == "em" else "step")
    ax.set_ylabel("objective per point")
    return ax


def plot_energy(idata: Any, **kwargs: Any) -> Any:
    """ArviZ's energy plot of a Hamiltonian sampler's draws, refused with the reason for any other draws.

    ``az.plot_energy`` and ``az.bfmi`` read the Hamiltonian energy of every draw, which only NUTS
    (``engine="mcmc"``) records. On the draws of Gibbs sampling or of a Laplace or SVI approximation ArviZ
    fails with a bare ``AttributeError`` (``'Dataset' object has no attribute 'energy'``); this function says
    why instead, and what stands in for it.

    Parameters
    ----------
    idata : arviz.InferenceData
        From a fitted model's ``to_arviz()``.
    **kwargs
        Passed to ``az.plot_energy``.

    Returns
    -------
    matplotlib Axes
        ``az.plot_energy``'s.

    Raises
    ------
    ValueError
        If ``idata`` has no ``sample_stats`` group or no ``energy`` in it, naming the sampler that made the draws.

    Examples
    --------
    >>> import numpy as np
    >>> from ppmix import GMM
    >>> x = np.random.default_rng(0).normal(size=(60, 2)) + np.repeat([[0.0, 0.0], [6.0, 6.0]], 30, axis=0)
    >>> gmm = GMM(2, covariance_type="diag", seed=0, progress=False).fit(
    ...     x, engine="gibbs", num_samples=20, warmup_steps=10
    ... )
    >>> try:
    ...     plot_energy(gmm.to_arviz())
    ... except ValueError as err:
    ...     print(str(err)[:62])
    idata: draws of 'gibbs' have no Hamiltonian energy to plot: az
    """
    import arviz as az

    stats = getattr(idata, "sample_stats", None)
    if stats is None or "energy" not in stats:
        source = idata.attrs.get("ppmix_draws") or (stats.attrs.get("ppmix_draws") if stats is not None else None)
        raise ValueError(
            f"idata: draws of {source or 'this sampler'!r} have no Hamiltonian energy to plot: az.plot_energy and "
            "az.bfmi are for NUTS (fit with engine='mcmc'); for Gibbs draws "
            "az.plot_trace(idata.sample_stats, var_names=['lp']) traces the log density instead"
        )
    return az.plot_energy(idata, **kwargs)


def plot_relevance(model: Any, ax: Any = None, *, feature_names: Sequence[str] | None = None) -> Any:
    """Bar chart of a pf model's switch posteriors ``relevance_`` per named feature (relevant above 0.5).

    Parameters
    ----------
    model : PFGMM or PFHMM
        A fitted prediction-focused model.
    ax : matplotlib Axes, optional
        Where to draw; a new figure's by default.
    feature_names : sequence of str, optional
        The bars' names, as for :func:`plot_clusters`.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> from ppmix import PFGMM
    >>> from ppmix.datasets import make_pf_synthetic
    >>> data = make_pf_synthetic(200, n_relevant=2, n_features=4, seed=0)
    >>> ax = plot_relevance(PFGMM(4, seed=0, progress=False).fit(data.X, data.y))
    >>> [t.get_text() for t in ax.get_xticklabels()]
    ['x0', 'x1', 'x2', 'x3']
    """
    import matplotlib.pyplot as plt

    relevance = _numpy(model.relevance_).reshape(-1)
    names = _names(model, None, relevance.size, feature_names)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.35 * relevance.size + 2), 3))
    ax.bar(np.arange(relevance.size), relevance, color=np.where(relevance > 0.5, "C3", "C0"))
    ax.axhline(0.5, color="k", lw=0.8, ls="--")
    ax.set_xticks(np.arange(relevance.size), names, rotation=90 if relevance.size > 8 else 0)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("relevance q(S_d = 1)")
    ax.set_title(f"{type(model).__name__}: relevant features (red)")
    return ax


def plot_experts(
    model: Any,
    X: Any,
    y: Any = None,
    ax: Any = None,
    *,
    feature: int | str = 0,
    feature_names: Sequence[str] | None = None,
    label: str | None = None,
    **line_style: Any,
) -> Any:
    """Each expert's mean response of a mixture of experts along one feature, on the user's scale.

    Gaussian experts are drawn as their regression lines ``intercept_k + coef_k · x``,
    logistic experts as ``P(y = 1 | x, expert k)``; the other features are held at their
    mean over ``X``. With ``y`` the data are drawn too, coloured by the gate's expert (expert
    ``k``'s line has the colour of its points unless ``line_style`` sets one).
    Call it once per model on the same ``ax`` to compare fits (e.g. local fits against
    their reduction); ``label`` names the first line of this model in the legend.

    Parameters
    ----------
    model : MixtureOfExperts
        A fitted mixture of experts.
    X : array-like of shape (N, D) or DataFrame
        The covariates: the range of the plotted feature and the means of the others.
    y : array-like of shape (N,), optional
        The responses; drawn as points when given.
    ax : matplotlib Axes, optional
        Where to draw; a new figure's by default.
    feature : int or str, default 0
        The feature along which the responses are drawn, by position or by name.
    feature_names : sequence of str, optional
        The feature names, as for :func:`plot_clusters`.
    label : str, optional
        The legend entry of this model's first line.
    **line_style
        Passed to ``ax.plot`` for every expert's line.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> from ppmix.datasets.moe import make_moe
    >>> from ppmix.models.moe import MixtureOfExperts
    >>> data = make_moe(300, n_experts=2, n_features=1, seed=0)
    >>> moe = MixtureOfExperts(2, seed=0, progress=False).fit(data.X, data.y)
    >>> len(plot_experts(moe, data.X, data.y).get_lines())
    2
    """
    import matplotlib.pyplot as plt

    x = _numpy(X)
    x = x.reshape(len(x), -1)
    names = _names(model, X, x.shape[1], feature_names)
    j = names.index(feature) if isinstance(feature, str) else int(feature)
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4))
    if y is not None:
        gate = np.asarray(model.predict_components(X)).reshape(-1)
        ax.scatter(x[:, j], _numpy(y).reshape(-1), c=gate, cmap="tab10", vmin=0, vmax=9, s=6, alpha=0.4)
    grid = np.linspace(x[:, j].min(), x[:, j].max(), 100)
    design = np.tile(x.mean(0), (grid.size, 1))
    design[:, j] = grid
    eta = design @ _numpy(model.coef_).T + _numpy(model.intercept_)  # (grid, K)
    mean = eta if getattr(model, "expert", "gaussian") == "gaussian" else 0.5 * (1.0 + np.tanh(eta / 2))
    for k in range(mean.shape[1]):
        style = {"color": f"C{k % 10}", **line_style}  # expert k in the colour of its points, unless told
        ax.plot(grid, mean[:, k], label=label if k == 0 else None, **style)
    ax.set_xlabel(names[j])
    ax.set_ylabel("E[y | x, expert]" if getattr(model, "expert", "gaussian") == "gaussian" else "P(y=1 | x, expert)")
    if label is not None:
        ax.legend(loc="best", fontsize=8)
    return ax
