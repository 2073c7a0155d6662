"""RW weight step and PRESTO: ppmix vs generic / literal baselines on identical problems.

Run ``.venv/bin/python benchmarks/bench_partition.py`` (``--quick`` for a smoke run that writes to
the temp directory unless ``--out`` is given). Two parts:

1. **RW weight step** (:func:`ppmix.optimizers.rw.weights.solve_weights`): clustering losses (squared
   distances of random 2-D points to ``k`` random centres), ``alpha / n = 1``. Seconds to a
   certified relative duality gap of 1e-4 and 1e-6 at a large ``n``; on small ``n`` the same QP
   is also solved by scipy ``minimize(method="SLSQP")`` (simplex equalities + bounds) and by plain
   projected gradient (step ``k / (2 alpha)``, same projection, same stopping test, no momentum).
2. **PRESTO**: total ``fit`` seconds on the 2-D synthetic (logistic components, the settings of
   ``tests/inference/test_presto.py``), and, for linear-Gaussian components on a small ``N``,
   PRESTO vs a literal Algorithm 1 that retrains the component once per left-out member to get
   every marginal gain (same eq.-13 scores, same greedy assignment), from the same initial partition.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

from _common import early_threads

# Thread limits must be in the environment before numpy/torch load their pools.
early_threads(default=2)

import numpy as np  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "partition.json"
QUICK_OUT = Path(tempfile.gettempdir()) / "ppmix_bench_partition_quick.json"


# --------------------------------------------------------------------------- RW weight step
def rw_problem(n: int, k: int, seed: int):
    """Losses (k, n): squared distances of N(0, I_2) points to k N(0, I_2) centres; alpha = n."""
    import torch

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    centres = rng.normal(size=(k, 2))
    losses = ((x[None] - centres[:, None]) ** 2).sum(-1)
    return torch.as_tensor(losses, dtype=torch.float64), float(n)


def objective_and_gap(losses, w, alpha: float) -> tuple[float, float]:
    """The same certified gap as ``solve_weights`` uses, so every method stops on one test."""
    from ppmix.optimizers.rw.weights import weight_objective_and_gap

    return weight_objective_and_gap(losses, w, alpha)


def projected_gradient(losses, alpha: float, tol: float, max_iter: int, max_seconds: float) -> dict:
    """Plain projected gradient, step 1/L = k/(2 alpha), stopped by the same relative gap test."""
    import torch

    from ppmix.algorithms.simplex import project_simplex

    k, n = losses.shape
    u = 1.0 / n
    scaled = losses / (2.0 * alpha)
    start = time.perf_counter()
    w = torch.full((k, n), u, dtype=torch.float64)
    value, gap = objective_and_gap(losses, w, alpha)
    iteration = 0
    while gap > tol * value and iteration < max_iter and time.perf_counter() - start < max_seconds:
        w = project_simplex(w + (u - w.mean(dim=0)) - scaled, method="pivot")
        value, gap = objective_and_gap(losses, w, alpha)
        iteration += 1
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "objective": value,
        "rel_gap": gap / value,
        "n_iter": iteration,
        "converged": gap <= tol * value,
    }


def slsqp(losses, alpha: float, max_iter: int) -> dict:
    """scipy SLSQP on the same QP: variables W (k*n), sum_i w_ji = 1, 0 <= w_ji <= 1."""
    from scipy import optimize

    L = losses.numpy()
    k, n = L.shape
    u = 1.0 / n

    def fun(flat: np.ndarray) -> tuple[float, np.ndarray]:
        w = flat.reshape(k, n)
        v = w.mean(0)
        value = alpha * ((v - u) ** 2).sum() + (L * w).sum() / k
        grad = (L - 2.0 * alpha * (u - v)) / k
        return float(value), np.broadcast_to(grad, (k, n)).ravel().copy()

    a = np.kron(np.eye(k), np.ones((1, n)))
    start = time.perf_counter()
    result = optimize.minimize(
        fun,
        np.full(k * n, u),
        jac=True,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * (k * n),
        constraints=[{"type": "eq", "fun": lambda f: a @ f - 1.0, "jac": lambda f: a}],
        options={"maxiter": max_iter, "ftol": 1e-15},
    )
    seconds = time.perf_counter() - start
    import torch

    w = torch.as_tensor(result.x.reshape(k, n)).clamp_min(0.0)
    w = w / w.sum(1, keepdim=True)  # tiny infeasibility of SLSQP's iterate removed before scoring
    value, gap = objective_and_gap(losses, w, alpha)
    return {
        "seconds": seconds,
        "objective": value,
        "rel_gap": gap / value,
        "n_iter": int(result.nit),
        "success": bool(result.success),
        "message": str(result.message),
    }


def time_solve(losses, alpha: float, tol: float, repeats: int) -> dict:
    from ppmix.optimizers.rw.weights import solve_weights

    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = solve_weights(losses, alpha, tol=tol, max_iter=100_000)
        times.append(time.perf_counter() - start)
    return {
        "seconds": min(times),
        "seconds_all": times,
        "objective": result.objective,
        "rel_gap": result.gap / result.objective,
        "n_iter": result.n_iter,
        "converged": result.converged,
    }


def bench_rw(big: tuple[int, int], peers: list[tuple[int, int]], slsqp_max_n: int, repeats: int) -> dict:
    n, k = big
    time_solve(*rw_problem(1000, k, seed=2), 1e-6, 1)  # untimed warm-up
    losses, alpha = rw_problem(n, k, seed=0)
    large = {"n": n, "k": k, "alpha_per_point": alpha / n}
    for tol in (1e-4, 1e-6):
        large[f"ours_tol{tol:g}"] = time_solve(losses, alpha, tol, repeats)
    small = []
    for n_small, k_small in peers:
        losses, alpha = rw_problem(n_small, k_small, seed=1)
        row = {"n": n_small, "k": k_small, "tol": 1e-6}
        row["ours"] = time_solve(losses, alpha, 1e-6, repeats)
        row["projected_gradient"] = projected_gradient(losses, alpha, 1e-6, max_iter=200_000, max_seconds=60.0)
        if n_small * k_small <= slsqp_max_n:
            row["slsqp"] = slsqp(losses, alpha, max_iter=500)
        small.append(row)
    return {"large": large, "peers": small}


# --------------------------------------------------------------------------- PRESTO
def literal_presto(x, y, init: np.ndarray, k: int, ridge: float, epsilon: float, leeway: float, max_iter: int, tol):
    """Algorithm 1 with every marginal gain G(S_k) - G(S_k minus i) from an actual retraining.

    Linear-Gaussian components (``GaussianExpert``, ridge on the coefficients, noise variance
    refitted jointly as ``(RSS + ridge ||coef||^2) / n``), eq.-13 scores with ``alpha = 1``
    (members: gain; non-members: ``l_i(theta_k)``), the squared distance-to-centre tie-break,
    ``greedy_capacity_assignment`` under ``ceil((1 + leeway) N / K)`` with PRESTO's acceptance
    test and single-move fallback, PRESTO's stopping rules.
    """
    import torch

    from ppmix.components import GaussianExpert
    from ppmix.optimizers.presto.assignment import greedy_capacity_assignment

    n, p = x.shape
    capacity = math.ceil((1.0 + leeway) * n / k)

    def train(mask: torch.Tensor) -> tuple[GaussianExpert, float]:
        """Fit one component on the points of ``mask``; return it and G(S)."""
        comp = GaussianExpert(torch.zeros(1, p, dtype=torch.float64), ridge=ridge)
        comp.fit((x, y), mask[:, None])
        count = float(mask.sum())
        resid2 = (y - comp.linear_predictor(x)[:, 0]).square()
        q = float((mask * resid2).sum() + ridge * comp.coef.square().sum())
        comp.scale = torch.tensor([math.sqrt(max(q / count, comp.min_variance))], dtype=torch.float64)
        g = float(
            -(mask * comp.log_prob((x, y))[:, 0]).sum() + ridge * comp.coef.square().sum() / (2 * comp.scale[0] ** 2)
        )
        return comp, g

    def sq_dist(onehot: torch.Tensor) -> torch.Tensor:
        centres = (onehot.T @ x) / onehot.sum(0)[:, None]
        return torch.cdist(x, centres).square()

    def fit_all(part: torch.Tensor):
        onehot = torch.nn.functional.one_hot(part, k).to(torch.float64)
        comps, gs = zip(*(train(onehot[:, j]) for j in range(k)))
        value = sum(gs) + epsilon * float((onehot * sq_dist(onehot)).sum())
        return onehot, list(comps), list(gs), value

    part = torch.as_tensor(init, dtype=torch.long)
    onehot, comps, gs, value = fit_all(part)
    history = [value]
    iteration = 0
    for iteration in range(1, max_iter + 1):
        losses = torch.stack([-c.log_prob((x, y))[:, 0] for c in comps], dim=1)  # (N, K)
        gains = torch.zeros(n, k, dtype=torch.float64)
        for j in range(k):
            for i in torch.nonzero(onehot[:, j]).flatten().tolist():
                mask = onehot[:, j].clone()
                mask[i] = 0.0
                gains[i, j] = gs[j] - train(mask)[1]  # Algorithm 1, line 14: retrain without i
        bound = torch.where(onehot > 0, gains, losses) + epsilon * sq_dist(onehot)
        new = greedy_capacity_assignment(bound, capacity)
        old_value = bound.gather(1, part[:, None]).sum()
        new_value = bound.gather(1, new[:, None]).sum()
        if new_value > old_value:  # single improving moves, largest first, within capacity
            best = bound.argmin(1)
            gain = bound.gather(1, part[:, None]).squeeze(1) - bound.gather(1, best[:, None]).squeeze(1)
            order = torch.argsort(gain, descending=True, stable=True)
            counts = np.bincount(part.numpy(), minlength=k)
            moved_part = part.clone().numpy()
            for i in order[gain[order] > 0].tolist():
                if counts[int(best[i])] < capacity:
                    counts[moved_part[i]] -= 1
                    counts[int(best[i])] += 1
                    moved_part[i] = int(best[i])
            new = torch.as_tensor(moved_part)
            new_value = bound.gather(1, new[:, None]).sum()
        if new_value > old_value + 1e-12 * old_value.abs() or int((new != part).sum()) == 0:
            break
        part = new
        onehot, comps, gs, value = fit_all(part)
        previous = history[-1]
        history.append(value)
        if abs(previous - value) <= tol * abs(value):
            break
    return part.numpy(), history, iteration


def bench_presto(n_per_set_big: int, n_per_set_small: int, repeats: int) -> dict:
    import torch
    from sklearn.metrics import adjusted_rand_score

    from ppmix.datasets.presto import make_presto_synthetic
    from ppmix.optimizers.presto.estimator import PRESTO

    out = {}
    data = make_presto_synthetic(n_per_set_big, seed=0)
    times = []
    for _ in range(repeats):
        model = PRESTO(4, "logistic", ridge=1.0, epsilon=3.0, seed=0, progress=False)
        start = time.perf_counter()
        model.fit(data.X, data.y)
        times.append(time.perf_counter() - start)
    seconds = min(times)
    out["logistic_synthetic"] = {
        "N": int(data.X.shape[0]),
        "settings": "PRESTO(4, 'logistic', ridge=1.0, epsilon=3.0, seed=0)",
        "seconds": seconds,
        "seconds_all": times,
        "n_iter": model.n_iter_,
        "converged": model.converged_,
        "objective": model.history_[-1],
        "ari_vs_true_sets": float(adjusted_rand_score(data.sets, model.partition_)),
        "train_accuracy": float((model.predict(data.X) == data.y).mean()),
    }

    # small N: PRESTO's closed-form leave-one-out vs literal retraining, linear-Gaussian components
    data = make_presto_synthetic(n_per_set_small, seed=1)
    x = torch.as_tensor(data.X, dtype=torch.float64)
    y = torch.as_tensor(data.y_pm, dtype=torch.float64)
    n, k, ridge, epsilon, leeway, max_iter, tol = x.shape[0], 4, 0.1, 6e-3, 0.1, 50, 1e-6
    init = np.random.default_rng(0).permutation(n) % k
    # the literal algorithm runs on the raw data, so PRESTO's internal standardisation is off here
    ours = PRESTO(
        k,
        "linear",
        ridge=ridge,
        epsilon=epsilon,
        leeway=leeway,
        init=init,
        max_iter=max_iter,
        tol=tol,
        standardize=False,
    )
    ours.progress = False
    ours_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ours.fit(data.X, data.y_pm)
        ours_times.append(time.perf_counter() - start)
    ours_s = min(ours_times)
    start = time.perf_counter()
    lit_part, lit_hist, lit_iter = literal_presto(x, y, init, k, ridge, epsilon, leeway, max_iter, tol)
    lit_s = time.perf_counter() - start
    out["linear_exact_check"] = {
        "N": int(n),
        "data": f"make_presto_synthetic({n_per_set_small}, seed=1), y = y_pm (+-1) as a real target",
        "settings": f"PRESTO({k}, 'linear', ridge={ridge}, epsilon={epsilon}, leeway={leeway}, standardize=False), "
        "random balanced init",
        "ppmix_seconds": ours_s,
        "literal_seconds": lit_s,
        "speedup": lit_s / ours_s,
        "ppmix_n_iter": ours.n_iter_,
        "literal_n_iter": lit_iter,
        "ppmix_objective": ours.history_[-1],
        "literal_objective": lit_hist[-1],
        "identical_assignment_fraction": float((ours.partition_ == lit_part).mean()),
    }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (writes to the temp directory)")
    parser.add_argument("--threads", type=int, default=2, help="torch/BLAS threads (read before they start)")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON path (default {RESULTS}; --quick: {QUICK_OUT})")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    wall = time.perf_counter()
    if args.quick:
        rw = bench_rw((2000, 5), [(30, 3)], slsqp_max_n=100, repeats=1)
        presto = bench_presto(100, 8, 1)
    else:
        rw = bench_rw((100_000, 10), [(40, 5), (2000, 5)], slsqp_max_n=200, repeats=3)
        presto = bench_presto(5000, 60, 3)
    import scipy

    report = {
        "benchmark": "rw_weight_step_and_presto",
        "command": "python benchmarks/bench_partition.py" + (" --quick" if args.quick else ""),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "scipy": scipy.__version__,
        "torch_threads": torch.get_num_threads(),
        "total_seconds": time.perf_counter() - wall,
        "rw": rw,
        "presto": presto,
    }
    out = args.out or (QUICK_OUT if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))

    large = rw["large"]
    print(f"RW weight step, n={large['n']}, k={large['k']}, alpha/n=1")
    for tol in (1e-4, 1e-6):
        r = large[f"ours_tol{tol:g}"]
        print(f"  gap {tol:g}: {r['seconds']:.3f} s, {r['n_iter']} iterations, converged={r['converged']}")
    print(f"{'n':>6} {'k':>3} {'method':>20} {'seconds':>9} {'objective':>20} {'rel gap':>9} {'iters':>7}")
    for row in rw["peers"]:
        for name in ("ours", "projected_gradient", "slsqp"):
            if name in row:
                r = row[name]
                print(
                    f"{row['n']:6d} {row['k']:3d} {name:>20} {r['seconds']:9.4f} {r['objective']:20.14g} "
                    f"{r['rel_gap']:9.1e} {r['n_iter']:7d}"
                )
    s = presto["logistic_synthetic"]
    print(
        f"PRESTO logistic, N={s['N']}: {s['seconds']:.2f} s, {s['n_iter']} iterations, "
        f"ARI vs true sets {s['ari_vs_true_sets']:.3f}"
    )
    c = presto["linear_exact_check"]
    print(
        f"PRESTO linear N={c['N']}: ppmix {c['ppmix_seconds']:.3f} s vs literal {c['literal_seconds']:.3f} s "
        f"(speed-up {c['speedup']:.1f}x), identical assignments {c['identical_assignment_fraction']:.3f}"
    )
    print(f"total {report['total_seconds']:.1f} s; wrote {out}")


if __name__ == "__main__":
    main()
