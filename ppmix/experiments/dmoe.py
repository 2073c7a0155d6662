"""Distributed mixture of experts by OT aggregation (Chamroukhi & Pham, 2026): Figures 1–4 at CPU scale.

The simulation of Supplement S4.1 (``K = 4``, ``d = 20``), an 80/20 train/test split,
and four estimators: **Global** (EM on all training rows), **Reduction** (local EM fits
on ``M`` equal shards, reduced by :func:`~ppmix.optimizers.ot.reduction.ot_reduce` over the
supporting sample the shards send, ``S ~ N / M``), **Middle** and **Weighted** (label-aligned
parameter average) built from the same local fits. Metrics on the test set: the expected
transport divergence to the true model (on ``eval_points`` test rows), the mean test
log-likelihood, the label-matched parameter MSE, RPE (Gaussian experts) or accuracy and
log-loss (logistic experts), ARI of the gate-MAP clustering against the true experts,
and the learning time (critical path: slowest local fit + aggregation, as in S4.2).
``Reduction`` is :func:`~ppmix.optimizers.ot.reduction.ot_reduce` with its defaults: the
gate fitted (S5) to the matched local experts' gate mass for Gaussian experts, and for
logistic experts to the plan's marginals with the exact expert update
(``logistic_update="newton"``); then the gate refitted, the experts fixed, to minimise the
expected KL divergence from the weighted average ``f^W`` (``gate_refit="kl"``).
``Reduction-S4`` is the algorithm exactly as the paper prints it: the gate fitted to the
per-point plan's marginals (S4)–(S5) and, for logistic experts, the closed form S14.
``Reduction-2`` (beyond the paper, ``rounds=(1, 2)``) is ``Reduction`` with a second
communication round: the reduced gate refitted to ``f^W`` over every training row of every
shard (``fit_distributed(rounds=2, round_objective="kl")``), from the same local fits;
``Reduction-2L`` refits it instead to the shards' observed responses (the default,
``round_objective="likelihood"``). Their
rows carry the round's cost as a share of the local fitting time. ``Truth-EM`` is EM on
all training rows started at the planted parameters (the checks are in
:mod:`ppmix.experiments.dmoe_checks`).

The paper reports these as box plots only (no numbers), so the reproduction prints its
qualitative claims beside our numbers. ``python -m ppmix.experiments.dmoe --help`` runs
other sizes (e.g. ``--n-samples 1000000``).
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ppmix.datasets.moe import make_moe
from ppmix.distributed import fit_distributed
from ppmix.distributed.gate_rounds import GateRounds, refit_gate_on_shards
from ppmix.experiments.dmoe_checks import ESTIMATORS, format_checks, quality_bar, seed_bar, seed_table, truth_bar
from ppmix.experiments.registry import register
from ppmix.io.reports import strict_json, write_json
from ppmix.metrics import adjusted_rand_index, relative_prediction_error
from ppmix.models.moe import MixtureOfExperts
from ppmix.optimizers.ot.baselines import align_experts, middle_estimator, weighted_average_estimator
from ppmix.optimizers.ot.divergence import transport_divergence
from ppmix.optimizers.ot.reduction import ot_reduce

__all__ = ["PAPER_CLAIMS", "compare_estimators", "parameter_mse", "run"]

logger = logging.getLogger(__name__)

#: the estimators built from the local fits
DISTRIBUTED = ESTIMATORS[3:]
#: box-plot labels
SHORT_NAMES = {
    "Global": "G",
    "Reduction": "R",
    "Reduction-2": "R2",
    "Reduction-2L": "R2L",
    "Reduction-S4": "R4",
    "Middle": "M",
    "Weighted": "W",
}
#: the second round's cost, reported on the Reduction-2 rows (see ``DistributedFit.second_round_share``)
ROUND_COST = ("round2_seconds", "round2_share", "round2_compute_share", "round2_passes")
#: the paper's findings (Figures 1–4 and §5; the figures carry no printed numbers)
PAPER_CLAIMS = {
    "M<=16": "Reduction performs comparably to Global (RPE, log-likelihood, MSE, ARI, transport divergence)",
    "M>=64": "Reduction is slightly worse than Global but better than Middle and Weighted",
    "transport": "Reduction is as close to the true model as Global in transport divergence, even at M=128",
    "time": "distributed learning is 3 to 10 times faster than Global for M between 4 and 64",
}


def parameter_mse(model: MixtureOfExperts, truth: MixtureOfExperts, X: Any) -> float:
    """Mean squared error of all parameters (gate, experts, variances) after matching labels to ``truth``.

    Labels are matched by :func:`~ppmix.optimizers.ot.baselines.align_experts`; the gate is
    re-zeroed on the matched last expert so that both gates use the same reference.

    Examples
    --------
    >>> from ppmix.datasets.moe import make_moe
    >>> truth = make_moe(50, n_experts=2, n_features=2, seed=0).true_model()
    >>> parameter_mse(truth, truth, make_moe(50, n_experts=2, n_features=2, seed=0).X)
    0.0
    """
    perm = align_experts(model, truth, X)
    gate_coef, gate_intercept = model.gate_coef_.numpy()[perm], model.gate_intercept_.numpy()[perm]
    est = [gate_coef - gate_coef[-1], gate_intercept - gate_intercept[-1]]
    ref = [truth.gate_coef_.numpy(), truth.gate_intercept_.numpy()]
    est += [model.coef_.numpy()[perm], model.intercept_.numpy()[perm]]
    ref += [truth.coef_.numpy(), truth.intercept_.numpy()]
    if model.target_kind == "real":
        est.append(model.scale_.numpy()[perm] ** 2)
        ref.append(truth.scale_.numpy() ** 2)
    diff = np.concatenate([(e - r).ravel() for e, r in zip(est, ref)])
    return float(np.mean(diff**2))


def _metrics(model: MixtureOfExperts, truth: MixtureOfExperts, data: dict[str, np.ndarray], eval_points: int) -> dict:
    X, y, labels = data["X"], data["y"], data["labels"]
    out = {
        "transport": transport_divergence(truth, model, X[:eval_points]),
        "log_lik": model.log_likelihood(X, y) / len(y),
        "mse": parameter_mse(model, truth, X[:eval_points]),
        "ari": adjusted_rand_index(labels, model.predict_components(X)),
    }
    if model.target_kind == "real":
        out["rpe"] = relative_prediction_error(y, model.predict(X))
    else:
        out["accuracy"] = float(np.mean(model.predict(X) == y))
        out["log_loss"] = -out["log_lik"]  # -mean log P(y | x), computed in log space
    return out


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - start


def _em_from_truth(data: Any, X: np.ndarray, y: np.ndarray, max_iter: int) -> MixtureOfExperts:
    """EM on ``(X, y)`` started at the planted parameters (no split-and-merge): the optimum of the truth's basin."""
    model = data.true_model().set_params(max_iter=max_iter, split_merge=0, progress=False)
    return model.fit(X, y, warm_start=True)


def compare_estimators(
    *,
    n_samples: int,
    machines: Sequence[int],
    seeds: Sequence[int],
    experts: Sequence[str] = ("gaussian", "logistic"),
    n_init: int = 5,
    max_iter: int = 100,
    eval_points: int = 2000,
    middle_points: int = 25,
    executor: Any = "inline",
    rounds: Sequence[int] = (1,),
    split_merge_search: str = "proposal",
    split_merge: int = 3,
) -> list[dict]:
    """One row per (expert kind, seed, M, estimator) with the metrics and learning time.

    Global rows have ``M = 1``; "Truth" rows (``M = 0``, no learning time) score the
    data-generating model, the best any estimator can do on average. ``middle_points``
    test-free supporting rows score the Middle estimator's ``M^2`` transport divergences.
    With ``2`` in ``rounds`` the distributed fits take a second round and Reduction-2
    rows join (Reduction stays the one-round model of the same local fits).
    ``split_merge_search`` and ``split_merge`` are the Global and local fits' (``MixtureOfExperts``); an empty
    ``machines`` gives the Truth, Truth-EM and Global rows only.
    """
    if not rounds or any(r not in (1, 2) for r in rounds):
        raise ValueError(f"rounds must list 1 and/or 2; got {rounds!r}")
    two = 2 in rounds
    rows: list[dict] = []
    for expert in experts:
        for seed in seeds:
            data = make_moe(n_samples, expert=expert, seed=seed)
            truth = data.true_model()
            n_train = int(0.8 * n_samples)
            test = {"X": data.X[n_train:], "y": data.y[n_train:], "labels": data.labels[n_train:]}
            X, y = data.X[:n_train], data.y[:n_train]
            settings = {"n_init": n_init, "max_iter": max_iter}
            search = {"split_merge_search": split_merge_search, "split_merge": split_merge}
            global_model, seconds = _timed(
                MixtureOfExperts(4, expert=expert, seed=seed, progress=False, **settings, **search).fit, X, y
            )
            base = {"expert": expert, "seed": seed, "n_samples": n_samples}
            rows.append({**base, "M": 0, "estimator": "Truth", **_metrics(truth, truth, test, eval_points)})
            at_truth, at_truth_seconds = _timed(_em_from_truth, data, X, y, max_iter)
            rows.append(
                {
                    **base,
                    "M": 1,
                    "estimator": "Truth-EM",
                    "seconds": at_truth_seconds,
                    "train_log_lik": at_truth.lower_bound_,
                    **_metrics(at_truth, truth, test, eval_points),
                }
            )
            rows.append(
                {
                    **base,
                    "M": 1,
                    "estimator": "Global",
                    "seconds": seconds,
                    "train_log_lik": global_model.lower_bound_,
                    **_metrics(global_model, truth, test, eval_points),
                }
            )
            for m in machines:
                shards = [(X[i::m], y[i::m]) for i in range(m)]
                fit = fit_distributed(
                    shards,
                    4,
                    expert=expert,
                    executor=executor,
                    seed=seed,
                    rounds=2 if two else 1,
                    round_objective="kl",  # Reduction-2; Reduction-2L is the likelihood round from the same fits
                    model_options=search,
                    **settings,
                )
                local = [fit.local_models[i] for i in fit.canonical_order]
                weights = [fit.n_rows[i] for i in fit.canonical_order]
                slowest = max(fit.local_seconds)
                (middle, _), middle_seconds = _timed(
                    middle_estimator, local, fit.X_support[:middle_points], weights=weights
                )
                weighted, weighted_seconds = _timed(weighted_average_estimator, local, fit.X_support, weights=weights)
                literal, literal_seconds = _timed(
                    ot_reduce,
                    local,
                    fit.X_support,
                    weights=weights,
                    seed=seed,
                    gate_targets="plan",
                    gate_refit="s5",
                    logistic_update="s14",
                )
                estimators, costs = {}, {}
                if 1 in rounds:
                    estimators["Reduction"] = (fit.one_round_model if two else fit.model, fit.aggregation_seconds)
                if two:
                    by_likelihood, costs["Reduction-2L"] = _likelihood_round(fit, shards, executor)
                    costs["Reduction-2"] = fit.gate_rounds
                    estimators["Reduction-2"] = (fit.model, fit.critical_path_seconds - slowest)
                    likelihood_seconds = fit.aggregation_seconds + costs["Reduction-2L"].critical_path_seconds
                    estimators["Reduction-2L"] = (by_likelihood, likelihood_seconds)
                estimators["Reduction-S4"] = (literal, literal_seconds)
                estimators["Middle"] = (middle, middle_seconds)
                estimators["Weighted"] = (weighted, weighted_seconds)
                for name, (model, aggregation) in estimators.items():
                    row = {**base, "M": m, "estimator": name, "seconds": slowest + aggregation}
                    row.update(aggregation_seconds=aggregation, **_metrics(model, truth, test, eval_points))
                    rows.append({**row, **(_round_cost(costs[name], fit.local_seconds) if name in costs else {})})
                logger.info("%s seed %d M=%d done (slowest local fit %.2fs)", expert, seed, m, slowest)
    return rows


def _round_cost(rounds: GateRounds, local_seconds: Sequence[float]) -> dict[str, float]:
    """A second round's critical-path seconds, its shares of the local fitting time and its passes."""
    return {
        "round2_seconds": rounds.critical_path_seconds,
        "round2_share": rounds.critical_path_seconds / max(local_seconds),
        "round2_compute_share": (rounds.worker_seconds + rounds.driver_seconds) / sum(local_seconds),
        "round2_passes": rounds.n_passes,
    }


def _shard_rows(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return X, y


def _likelihood_round(fit: Any, shards: list[tuple[np.ndarray, np.ndarray]], executor: Any) -> tuple[Any, GateRounds]:
    """The second round on the observed responses (``round_objective="likelihood"``) from ``fit``'s one-round model."""
    order = fit.canonical_order
    return refit_gate_on_shards(
        fit.one_round_model,
        [fit.local_models[i] for i in order],
        [fit.n_rows[i] for i in order],
        [functools.partial(_shard_rows, *shards[i]) for i in order],
        [fit.shard_names[i] for i in order],
        executor=executor,
        objective="likelihood",
    )


#: the test-set metrics of every row
METRICS = ("transport", "log_lik", "mse", "rpe", "accuracy", "log_loss", "ari")


def _summarise(rows: list[dict]) -> list[dict]:
    """Mean and standard deviation over seeds per (expert, M, estimator)."""
    keys = sorted({(r["expert"], r["M"], ESTIMATORS.index(r["estimator"])) for r in rows})
    table = []
    for expert, m, e in keys:
        group = [r for r in rows if (r["expert"], r["M"], r["estimator"]) == (expert, m, ESTIMATORS[e])]
        entry: dict[str, Any] = {"expert": expert, "M": m, "estimator": ESTIMATORS[e], "n_seeds": len(group)}
        for metric in (*METRICS, "train_log_lik", "seconds", *ROUND_COST):
            if metric in group[0]:  # Truth rows have no learning time
                values = np.array([r[metric] for r in group])
                entry[metric] = round(float(values.mean()), 6)
                entry[f"{metric}_sd"] = round(float(values.std()), 6)
        table.append(entry)
    return table


def _plot(path: Path, rows: list[dict], expert: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ["transport", "log_lik", "mse", "rpe" if expert == "gaussian" else "accuracy", "ari", "seconds"]
    machines = sorted({r["M"] for r in rows if r["M"] > 1})
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, metric in zip(axes.ravel(), metrics):
        labels, data = [], []
        glob = [r[metric] for r in rows if r["expert"] == expert and r["estimator"] == "Global"]
        labels.append("G"), data.append(glob)
        for m in machines:
            for name in DISTRIBUTED:
                values = [r[metric] for r in rows if r["expert"] == expert and r["M"] == m and r["estimator"] == name]
                if values:  # Reduction or Reduction-2 is left out by ``rounds``
                    labels.append(f"{SHORT_NAMES[name]}{m}"), data.append(values)
        ax.boxplot(data)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=90, fontsize=7)
        ax.set_title(metric)
        if metric in ("log_lik", "rpe", "accuracy", "ari"):  # the true model, where it is not 0 by definition
            truth = [r[metric] for r in rows if r["expert"] == expert and r["estimator"] == "Truth"]
            ax.axhline(float(np.mean(truth)), color="grey", linestyle="--", linewidth=1)
        if metric in ("transport", "mse", "seconds"):
            ax.set_yscale("log")
    fig.suptitle(
        f"{expert} experts: Global (G), Reduction (R; R2/R2L: two rounds, f^W/data; R4: as printed), Middle (M), "
        "Weighted (W); dashed: the true model"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def reproduce(out_dir: Path, *, quick: bool, **options: Any) -> dict:
    """Run :func:`compare_estimators`, write ``dmoe.json`` and one box-plot figure per expert kind."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = compare_estimators(**options)
    table = _summarise(rows)
    result = {
        "reproduction": "dmoe",
        "quick": quick,
        "settings": {
            k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in options.items() if k != "executor"
        },
        "table": table,
        "quality_bar": quality_bar(table),
        "seed_bar": seed_bar(rows),
        "truth_bar": truth_bar(rows),
        "paper_claims": PAPER_CLAIMS,
        "rows": rows,
    }
    write_json(out_dir / "dmoe.json", result)
    files = [str(out_dir / "dmoe.json")]
    for expert in options.get("experts", ("gaussian", "logistic")):
        _plot(out_dir / f"dmoe_{expert}.png", rows, expert)
        files.append(str(out_dir / f"dmoe_{expert}.png"))
    for entry in table:
        logger.info("%s", entry)
    for claim in PAPER_CLAIMS.values():
        logger.info("paper: %s", claim)
    result["files"] = files
    return result


@register("dmoe", "Distributed MoE by OT aggregation (Chamroukhi & Pham, 2026), Figures 1-4: Global, Reduction, Middle")
def run(out_dir: Path, quick: bool) -> dict:
    """``ppmix reproduce dmoe``: N = 10^5, M in {4, 16, 64, 128}, 3 seeds, local fits on a process pool.

    ``quick``: N = 5000, M in {4, 8}, one seed, in-process. Both run one and two rounds. The full
    run takes hours on two cores; ``python -m ppmix.experiments.dmoe`` chooses sizes, seeds and experts.
    """
    if quick:
        options = {"n_samples": 5000, "machines": (4, 8), "seeds": (0,), "n_init": 2, "max_iter": 50, "rounds": (1, 2)}
    else:
        options = {
            "n_samples": 100_000,
            "machines": (4, 16, 64, 128),
            "seeds": (0, 1, 2),
            "n_init": 5,
            "executor": None,
            "rounds": (1, 2),
        }
    return reproduce(out_dir, quick=quick, **options)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ppmix.experiments.dmoe``: the comparison at other sizes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=float, default=1e5)
    parser.add_argument("--machines", type=int, nargs="*", default=[4, 16, 64, 128],
                        help="numbers of machines M; none: the Truth, Truth-EM and Global rows only")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--experts", nargs="+", default=["gaussian", "logistic"], choices=["gaussian", "logistic"])
    parser.add_argument("--n-init", type=int, default=5)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--rounds", type=int, nargs="+", default=[1, 2], choices=[1, 2],
                        help="communication rounds: 1 is the paper's Reduction, 2 adds Reduction-2")  # fmt: skip
    parser.add_argument("--split-merge-search", choices=["proposal", "screened"], default="proposal",
                        help="the Global and local fits' split-and-merge search (MixtureOfExperts)")  # fmt: skip
    parser.add_argument("--split-merge", type=int, default=3, help="their most split-and-merge rounds")
    parser.add_argument("--workers", type=int, help="run the local fits on a process pool of this size")
    parser.add_argument("--out", default="out/reproduce/dmoe")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    executor = "inline"
    if args.workers:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        executor = ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"))
    result = reproduce(
        Path(args.out),
        quick=False,
        n_samples=int(args.n_samples),
        machines=args.machines,
        seeds=args.seeds,
        experts=args.experts,
        n_init=args.n_init,
        max_iter=args.max_iter,
        executor=executor,
        rounds=args.rounds,
        split_merge_search=args.split_merge_search,
        split_merge=args.split_merge,
    )
    report = [strict_json({"table": result["table"], "quality_bar": result["quality_bar"]})]
    report += ["", *seed_table(result["rows"])]
    report += ["", "checks against the truth, on the mean over seeds:", *format_checks(result["truth_bar"])]
    report += ["", "checks on the means over seeds:", *format_checks(result["quality_bar"])]
    report += ["", "checks on every seed:", *format_checks(result["seed_bar"])]
    print("\n".join(report))  # the command's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
