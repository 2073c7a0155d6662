"""PRESTO on the 2-D synthetic of Sangani et al. (§4.1): Table 5 and Figure 1.

Partition quality (NMI, ARI against the true sets ``S_1* .. S_4*``) of PRESTO with
logistic components, its ``scores="loss"`` variant and of the baselines of Table 5:
k-means++ (scikit-learn), Ward agglomerative clustering (scikit-learn, on a
subsample when ``N`` is large, the rest assigned to the nearest cluster centre),
a full-covariance :class:`ppmix.GMM` and a hard alternating-minimisation mixture of
logistic regressions (Learn-MLR style, random start, App. D). The row
"PRESTO start (k-means)" is PRESTO's own initial partition, so that the gain of
Algorithm 1 over its initialisation is visible.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ppmix.components import LogisticExpert
from ppmix.datasets.presto import make_presto_synthetic
from ppmix.experiments.registry import register
from ppmix.io.reports import write_json
from ppmix.metrics import adjusted_rand_index, normalized_mutual_info
from ppmix.optimizers.presto.components import LinearSVMComponent

__all__ = ["hard_alternating_minimisation", "label_grouped_partition", "run"]

logger = logging.getLogger(__name__)

K = 4
SEED = 0
#: Table 5 of the paper (NMI, ARI), exactly as printed; it has no GMM row.
PAPER_TABLE5: dict[str, tuple[float, float]] = {
    "Kmeans++": (0.26, 0.09),
    "Agglomerative": (0.71, 0.79),
    "MoE": (0.28, 0.21),
    "Learn-MLR": (0.59, 0.63),
    "PRESTO": (0.86, 0.92),
}
#: our method name -> the Table 5 row it is compared with (None: no row in Table 5)
_PAPER_ROW = {
    "PRESTO (logistic)": "PRESTO",
    "PRESTO (linear SVM, hinge)": "PRESTO",
    "PRESTO (scores='loss')": None,
    "PRESTO start (k-means)": None,
    "k-means++": "Kmeans++",
    "Agglomerative (Ward)": "Agglomerative",
    "GMM (full)": None,
    "Learn-MLR (hard AM)": "Learn-MLR",
    "Learn-MLR (hard AM, k-means start)": None,
}
#: best in tests/inference/test_presto.py; the paper's algorithm runs on the raw data (no internal standardisation)
_PRESTO_SETTINGS = {"ridge": 1.0, "epsilon": 3.0, "init": "kmeans", "standardize": False}
#: the paper's own component (§4.1): linear SVMs with the hinge loss, lambda = 1e-4 (App. D.3)
_SVM_SETTINGS = {"ridge": 1e-4, "lr": 0.05, "epochs": 100}


def label_grouped_partition(y: np.ndarray, k: int) -> np.ndarray:
    """Split every class into ``k / n_classes`` consecutive chunks: a partition in which every part has one label.

    Every part is then fitted with zero training error by any classifier with an
    intercept, so ``sum_k G(S_k)`` is close to its infimum (the regulariser only)
    whatever the true sets are. Used to show that PRESTO's objective alone cannot
    single out the true sets of the 2-D synthetic.
    """
    classes = np.unique(y)
    per_class = max(k // classes.size, 1)
    part = np.empty(y.shape[0], dtype=np.int64)
    for c_index, c in enumerate(classes):
        rows = np.flatnonzero(y == c)
        part[rows] = c_index * per_class + (np.arange(rows.size) * per_class) // rows.size
    return part


def hard_alternating_minimisation(
    X: np.ndarray,
    y: np.ndarray,
    k: int,
    *,
    ridge: float = 1e-4,
    max_iter: int = 50,
    seed: int = 0,
    init: np.ndarray | None = None,
) -> tuple[np.ndarray, list[float]]:
    """Learn-MLR-style hard AM: fit ``k`` logistic experts, move each point to its lowest loss, repeat.

    Random initial partition (or ``init``), no capacities, no distance term (App. D). An expert
    whose part empties keeps its parameters. Returns the partition and the summed
    loss (with ridge penalty) after every fit.
    """
    x = torch.as_tensor(X, dtype=torch.float64)
    yt = torch.as_tensor(y, dtype=torch.float64)
    rng = np.random.default_rng(seed)
    start = rng.integers(0, k, size=x.shape[0]) if init is None else np.asarray(init, dtype=np.int64)
    part = torch.as_tensor(start)
    experts = LogisticExpert(torch.zeros(k, x.shape[1], dtype=torch.float64), ridge=ridge)
    history: list[float] = []
    for _ in range(max_iter):
        onehot = torch.nn.functional.one_hot(part, k).to(torch.float64)
        empty = onehot.sum(0) == 0
        old = (experts.coef.clone(), experts.intercept.clone())
        weights = onehot.clone()
        weights[:, empty] = 1.0  # keeps the batched Newton fit well posed; restored below
        experts.fit((x, yt), weights)
        if empty.any():
            experts.coef = torch.where(empty[:, None], old[0], experts.coef)
            experts.intercept = torch.where(empty, old[1], experts.intercept)
        losses = -experts.log_prob((x, yt))
        penalty = 0.5 * ridge * experts.coef.square().sum(-1)
        history.append(float((onehot * losses).sum() + (penalty * ~empty).sum()))
        new = losses.argmin(1)
        if torch.equal(new, part):
            break
        part = new
    return part.numpy(), history


def _within_sum_of_squares(X: np.ndarray, part: np.ndarray) -> float:
    """``sum_k sum_{i in S_k} ||x_i - c_k||^2`` with ``c_k`` the mean of part ``k`` (PRESTO's tie-break term)."""
    return float(sum(((X[part == j] - X[part == j].mean(0)) ** 2).sum() for j in np.unique(part)))


def _agglomerative(X: np.ndarray, k: int, max_points: int, seed: int) -> np.ndarray:
    from sklearn.cluster import AgglomerativeClustering

    n = X.shape[0]
    if n <= max_points:
        return AgglomerativeClustering(k, linkage="ward").fit_predict(X)
    sub = np.random.default_rng(seed).choice(n, max_points, replace=False)
    labels = AgglomerativeClustering(k, linkage="ward").fit_predict(X[sub])
    centres = np.stack([X[sub][labels == j].mean(0) for j in range(k)])
    return ((X[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _plot(path: Path, X: np.ndarray, sets: np.ndarray, partition: np.ndarray, history: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_show = min(X.shape[0], 4000)
    show = np.random.default_rng(0).permutation(X.shape[0])[:n_show]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, labels, title in ((axes[0], partition, "PRESTO partition"), (axes[1], sets, "true sets $S_k^*$")):
        ax.scatter(X[show, 0], X[show, 1], c=labels[show], cmap="tab10", vmin=0, vmax=9, s=3)
        ax.set(title=title, xlabel="$x_1$", ylabel="$x_2$")
    axes[2].plot(range(len(history)), history, marker="o")
    axes[2].set(title="PRESTO objective", xlabel="iteration", ylabel="objective")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@register("presto", "PRESTO on the 2-D synthetic (Table 5, Figure 1)")
def run(out_dir: Path, quick: bool) -> dict:
    """Table 5 and Figure 1 of PRESTO on the 2-D synthetic; writes ``presto.json`` and ``presto.png``."""
    from sklearn.cluster import KMeans

    from ppmix import GMM
    from ppmix.inference import PRESTO

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_per_set = 300 if quick else 5000
    max_agglo = 2000 if quick else 8000
    data = make_presto_synthetic(n_per_set, seed=SEED)
    X, y, sets = data.X, data.y, data.sets
    logger.info("PRESTO synthetic: %d points (%d per set), quick=%s", X.shape[0], n_per_set, quick)

    partitions: dict[str, np.ndarray] = {}
    seconds: dict[str, float] = {}

    presto, seconds["PRESTO (logistic)"] = _timed(
        lambda: PRESTO(K, "logistic", **_PRESTO_SETTINGS, seed=SEED, progress=False).fit(X, y)
    )
    partitions["PRESTO (logistic)"] = presto.partition_
    # PRESTO's own initial partition (the same generator state as in fit)
    capacity = None if presto.leeway is None else math.ceil((1.0 + float(presto.leeway)) * X.shape[0] / K)
    start, seconds["PRESTO start (k-means)"] = _timed(
        lambda: presto._initial_partition(
            torch.as_tensor(X, dtype=torch.float64), K, capacity, torch.Generator().manual_seed(SEED)
        )
    )
    partitions["PRESTO start (k-means)"] = start.numpy()
    svm_model, seconds["PRESTO (linear SVM, hinge)"] = _timed(
        lambda: PRESTO(
            K,
            LinearSVMComponent(X.shape[1], **_SVM_SETTINGS),
            epsilon=_PRESTO_SETTINGS["epsilon"],
            init="kmeans",
            standardize=False,
            max_iter=30,
            seed=SEED,
            progress=False,
        ).fit(X, y)
    )
    partitions["PRESTO (linear SVM, hinge)"] = svm_model.partition_
    loss_model, seconds["PRESTO (scores='loss')"] = _timed(
        lambda: PRESTO(K, "logistic", **_PRESTO_SETTINGS, scores="loss", seed=SEED, progress=False).fit(X, y)
    )
    partitions["PRESTO (scores='loss')"] = loss_model.partition_
    partitions["k-means++"], seconds["k-means++"] = _timed(
        lambda: KMeans(K, init="k-means++", n_init=10, random_state=SEED).fit_predict(X)
    )
    partitions["Agglomerative (Ward)"], seconds["Agglomerative (Ward)"] = _timed(
        lambda: _agglomerative(X, K, max_agglo, SEED)
    )
    gmm, seconds["GMM (full)"] = _timed(
        lambda: GMM(K, covariance_type="full", n_init=3, seed=SEED, progress=False).fit(X)
    )
    partitions["GMM (full)"] = np.asarray(gmm.predict(X))
    (partitions["Learn-MLR (hard AM)"], am_history), seconds["Learn-MLR (hard AM)"] = _timed(
        lambda: hard_alternating_minimisation(X, y, K, seed=SEED)
    )
    (partitions["Learn-MLR (hard AM, k-means start)"], _), seconds["Learn-MLR (hard AM, k-means start)"] = _timed(
        lambda: hard_alternating_minimisation(X, y, K, seed=SEED, init=partitions["PRESTO start (k-means)"])
    )

    table = []
    for method, part in partitions.items():
        paper = PAPER_TABLE5.get(_PAPER_ROW[method]) if _PAPER_ROW[method] else None
        row = {
            "method": method,
            "NMI": round(float(normalized_mutual_info(sets, part)), 4),
            "ARI": round(float(adjusted_rand_index(sets, part)), 4),
            "paper NMI": paper[0] if paper else None,
            "paper ARI": paper[1] if paper else None,
            "seconds": round(seconds[method], 2),
        }
        table.append(row)
        logger.info(
            "%-36s NMI %.3f  ARI %.3f  (paper %s / %s)  %.1fs",
            method,
            row["NMI"],
            row["ARI"],
            row["paper NMI"],
            row["paper ARI"],
            row["seconds"],
        )

    # Is the true partition the optimum of PRESTO's objective on this data? Refit the components
    # on the true sets, on PRESTO's partition and on a label-grouped partition and compare.
    diagnosis = {}
    for name, part in (
        ("true sets", sets),
        ("PRESTO (logistic)", presto.partition_),
        ("label-grouped", label_grouped_partition(y, K)),
    ):
        g = presto.objective(X, y, part)
        diagnosis[name] = {
            "sum_G (ridge=1)": round(g, 3),
            "sum_G + eps * sum ||x - c||^2 (what PRESTO (logistic) minimises)": round(
                g + presto.epsilon * _within_sum_of_squares(X, part), 3
            ),
            "sum_G (ridge=1e-4, paper lambda)": round(
                PRESTO(K, "logistic", ridge=1e-4, standardize=False, progress=False).objective(X, y, part), 3
            ),
        }
    logger.info("objective of partitions (lower is better for PRESTO): %s", diagnosis)

    result = {
        "reproduction": "presto",
        "quick": quick,
        "n_points": int(X.shape[0]),
        "n_per_set": n_per_set,
        "presto_settings": dict(_PRESTO_SETTINGS, leeway=presto.leeway, alpha=presto.alpha, seed=SEED),
        "agglomerative_subsample": min(max_agglo, X.shape[0]),
        "table": table,
        "paper_table5": {name: {"NMI": v[0], "ARI": v[1]} for name, v in PAPER_TABLE5.items()},
        "paper_notes": "Table 5 has rows Kmeans++, Agglomerative, MoE, Learn-MLR, PRESTO; no GMM row. "
        "MoE is not run here. Learn-MLR starts from a random partition as in App. D (ridge 1e-4); "
        "the extra row starts it from PRESTO's k-means partition. "
        "The paper's components (§4.1, Figure 1) are linear SVMs with the hinge loss: row "
        "'PRESTO (linear SVM, hinge)' uses them (ppmix.optimizers.presto.components.LinearSVMComponent); "
        "'PRESTO (logistic)' uses the logistic family with its influence-function gains.",
        "svm_settings": dict(_SVM_SETTINGS, epsilon=_PRESTO_SETTINGS["epsilon"], max_iter=30),
        "objective_of_partitions": diagnosis,
        "diagnosis": "Lower is better for every column. If the true sets are not the lowest in the column that "
        "PRESTO minimises, a better optimiser of that objective moves away from them: the gap to Table 5 then "
        "lies in the data set (eqs. 14-17 cannot hold as printed) and in the objective (a partition with one "
        "label per part has near-zero loss for any classifier with an intercept), not in the optimisation.",
        "presto_history": [float(v) for v in presto.history_],
        "presto_loss_history": [float(v) for v in presto.loss_history_],
        "presto_n_iter": int(presto.n_iter_),
        "presto_converged": bool(presto.converged_),
        "presto_part_sizes": [int(v) for v in presto.part_sizes_],
        "learn_mlr_history": am_history,
    }
    write_json(out_dir / "presto.json", result)
    _plot(out_dir / "presto.png", X, sets, presto.partition_, result["presto_history"])
    result["files"] = [str(out_dir / "presto.json"), str(out_dir / "presto.png")]
    logger.info("PRESTO reproduction written to %s", out_dir)
    return result
