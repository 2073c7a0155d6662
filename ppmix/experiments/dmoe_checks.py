"""The checks of the distributed-MoE reproduction (:mod:`ppmix.experiments.dmoe`), each printed ✔ or ✘.

Three bars, from the issue that set them:

- **against the truth** (:func:`truth_bar`): Global, EM on all training rows, within 10% of
  the data-generating model's test loss (log-loss for logistic experts, RPE for Gaussian
  ones) and with ARI at least 0.9, on the mean over seeds (the issue's decision: a miss on
  the mean is a miss; every seed's value is printed beside it). The ``Truth-EM`` row, EM started at the
  planted parameters, is checked the same way: it tells a poor basin (Truth-EM passes,
  Global fails) from a maximum-likelihood optimum that itself over-fits (both fail);
- **against Global, on the means over seeds** (:func:`quality_bar`): the Reduction within 2%
  of Global at ``M <= 16``, better than Middle and Weighted at ``M >= 64``;
- **against Global, on every seed** (:func:`seed_bar`): the within-2% check at ``M <= 16``.
"""

from __future__ import annotations

__all__ = [
    "CHECKED",
    "CLOSE_TO_GLOBAL",
    "ESTIMATORS",
    "MIN_ARI",
    "TRUTH_TOLERANCE",
    "format_checks",
    "quality_bar",
    "seed_bar",
    "seed_table",
    "truth_bar",
]

#: "Truth" is the data-generating model scored on the same test set: the reference for Global;
#: "Truth-EM" is EM on all training rows started at the planted parameters
ESTIMATORS = (
    "Truth",
    "Truth-EM",
    "Global",
    "Reduction",
    "Reduction-2",
    "Reduction-2L",
    "Reduction-S4",
    "Middle",
    "Weighted",
)
#: the estimators the quality bar checks against Global
CHECKED = ("Reduction", "Reduction-2", "Reduction-2L")
#: the quality bar's metrics at M <= 16, with sign +1 where lower is better and -1 where higher is
CLOSE_TO_GLOBAL = {"gaussian": (("rpe", 1.0), ("log_lik", -1.0)), "logistic": (("accuracy", -1.0), ("log_loss", 1.0))}
#: the loss the truth bar compares with the data-generating model's (lower is better)
TRUTH_LOSS = {"gaussian": "rpe", "logistic": "log_loss"}
#: how much worse than the truth's test loss a fit on all rows may be, relative
TRUTH_TOLERANCE = 0.10
#: the least ARI of the gate-MAP clustering against the true experts
MIN_ARI = 0.9


def truth_bar(rows: list[dict]) -> list[dict]:
    """Global (and Truth-EM, where present) against the data-generating model, on the mean over seeds.

    Two checks per expert kind and estimator: the test loss at most 10% above the truth's
    (``gaps``: relative excess per seed; ``mean``: their mean, which is checked) and ARI at
    least 0.9 (``values`` per seed; ``mean`` checked).

    Examples
    --------
    >>> rows = [{"expert": "logistic", "seed": s, "M": 0, "estimator": "Truth", "log_loss": 0.020, "ari": 0.97}
    ...         for s in (0, 1)]
    >>> rows += [{"expert": "logistic", "seed": s, "M": 1, "estimator": "Global", "log_loss": loss, "ari": ari}
    ...          for s, loss, ari in ((0, 0.021, 0.95), (1, 0.030, 0.70))]
    >>> for check in truth_bar(rows):
    ...     print(check["check"], check["mean"], check.get("gaps", check.get("values")), check["pass"])
    log_loss at most 10% worse than Truth on the mean over seeds 0.275 [0.05, 0.5] False
    ari at least 0.9 on the mean over seeds 0.825 [0.95, 0.7] False
    """
    index = {(r["expert"], r["seed"], r["estimator"]): r for r in rows}
    fits = {(e, n) for e, _, n in index if n in ("Truth-EM", "Global")}
    groups = sorted(fits, key=lambda g: (g[0], g[1] != "Global"))
    checks = []
    for expert, name in groups:
        seeds = sorted(s for e, s, n in index if (e, n) == (expert, name))
        key = TRUTH_LOSS[expert]
        gaps = [round(_gap(index[(expert, s, name)], index[(expert, s, "Truth")], key, 1.0), 4) for s in seeds]
        aris = [round(index[(expert, s, name)]["ari"], 4) for s in seeds]
        mean_gap, mean_ari = round(sum(gaps) / len(gaps), 4), round(sum(aris) / len(aris), 4)
        base = {"expert": expert, "M": 1, "estimator": name, "seeds": seeds}
        checks.append({**base, "check": f"{key} at most {TRUTH_TOLERANCE:.0%} worse than Truth on the mean over seeds",
                       "mean": mean_gap, "gaps": gaps, "pass": bool(mean_gap <= TRUTH_TOLERANCE)})  # fmt: skip
        checks.append({**base, "check": f"ari at least {MIN_ARI} on the mean over seeds", "mean": mean_ari,
                       "values": aris, "pass": bool(mean_ari >= MIN_ARI)})  # fmt: skip
    return checks


def _gap(entry: dict, glob: dict, key: str, sign: float) -> float:
    """How much worse than Global ``entry`` is in ``key``, relative to Global (negative when better)."""
    return sign * (entry[key] - glob[key]) / abs(glob[key])


def quality_bar(table: list[dict]) -> list[dict]:
    """The issue's checks: Reduction within 2% of Global at M <= 16; better than Middle/Weighted at M >= 64.

    At ``M <= 16`` Gaussian experts are checked on test RPE and log-likelihood, logistic
    experts (the classification variant) on test accuracy and log-loss. "Within 2%" is
    one-sided: ``gap`` is how much worse than Global the Reduction is, relative to
    Global (negative when it is better), and the check passes at ``gap <= 0.02``; a
    Reduction that beats Global does not fail it. Reduction-2 (two rounds), where the
    table has it, is checked the same way.

    Examples
    --------
    >>> table = [{"expert": "logistic", "M": 1, "estimator": "Global", "accuracy": 0.98, "log_loss": 0.030},
    ...          {"expert": "logistic", "M": 4, "estimator": "Reduction", "accuracy": 0.95, "log_loss": 0.028}]
    >>> [(c["check"], c["gap"], c["pass"]) for c in quality_bar(table)]
    [('accuracy at most 2% worse than Global', 0.0306, False), ('log_loss at most 2% worse than Global', -0.0667, True)]
    """
    index = {(t["expert"], t["M"], t["estimator"]): t for t in table}
    checks = []
    for (expert, m, name), entry in index.items():
        if name not in CHECKED:
            continue
        glob = index[(expert, 1, "Global")]
        base = {"expert": expert, "M": m, "estimator": name}
        if m <= 16:
            for key, sign in CLOSE_TO_GLOBAL[expert]:
                gap = _gap(entry, glob, key, sign)
                checks.append({**base, "check": f"{key} at most 2% worse than Global",
                               "gap": round(gap, 4), "pass": bool(gap <= 0.02)})  # fmt: skip
        else:
            for key, better in (("transport", min), ("ari", max)):
                rivals = [index[(expert, m, r)][key] for r in ("Middle", "Weighted")]
                ok = better(entry[key], *rivals) == entry[key]
                checks.append({**base, "check": f"{key}: {name} beats Middle and Weighted",
                               "value": entry[key], "rivals": rivals, "pass": bool(ok)})  # fmt: skip
    return checks


def seed_bar(rows: list[dict]) -> list[dict]:
    """The within-2%-of-Global checks at ``M <= 16`` on every seed: ``pass`` when the worst seed's gap is <= 2%.

    ``gaps`` lists the gap of every seed (as in :func:`quality_bar`, against Global on the same seed).

    Examples
    --------
    >>> rows = [{"expert": "gaussian", "seed": s, "M": 1, "estimator": "Global", "rpe": 0.1, "log_lik": -2.0}
    ...         for s in (0, 1)]
    >>> rows += [{"expert": "gaussian", "seed": s, "M": 4, "estimator": "Reduction", "rpe": r, "log_lik": -2.0}
    ...          for s, r in ((0, 0.101), (1, 0.104))]
    >>> [(c["check"], c["gaps"], c["pass"]) for c in seed_bar(rows)][0]
    ('rpe at most 2% worse than Global on every seed', [0.01, 0.04], False)
    """
    index = {(r["expert"], r["seed"], r["M"], r["estimator"]): r for r in rows}
    groups = sorted({(e, m, n) for e, _, m, n in index if n in CHECKED and m <= 16}, key=lambda g: (g[0], g[1], g[2]))
    checks = []
    for expert, m, name in groups:
        seeds = sorted(s for e, s, mm, n in index if (e, mm, n) == (expert, m, name))
        for key, sign in CLOSE_TO_GLOBAL[expert]:
            gaps = [
                round(_gap(index[(expert, s, m, name)], index[(expert, s, 1, "Global")], key, sign), 4) for s in seeds
            ]
            checks.append({"expert": expert, "M": m, "estimator": name, "seeds": seeds,
                           "check": f"{key} at most 2% worse than Global on every seed", "gaps": gaps,
                           "pass": bool(max(gaps) <= 0.02)})  # fmt: skip
    return checks


def format_checks(checks: list[dict]) -> list[str]:
    """One line per check, marked ✔ (passed) or ✘ (failed).

    Examples
    --------
    >>> format_checks([{"expert": "gaussian", "M": 4, "estimator": "Reduction", "check": "rpe at most 2% worse",
    ...                 "gap": 0.01, "pass": True}])
    ['✔ gaussian M=4 Reduction: rpe at most 2% worse (gap +1.00%)']
    """
    lines = []
    for c in checks:
        if "gaps" in c:
            detail = "gaps " + ", ".join(f"{g:+.2%}" for g in c["gaps"])
            detail = f"mean {c['mean']:+.2%}; {detail}" if "mean" in c else detail
        elif "values" in c:
            detail = "values " + ", ".join(f"{v:.3f}" for v in c["values"])
            detail = f"mean {c['mean']:.3f}; {detail}" if "mean" in c else detail
        elif "gap" in c:
            detail = f"gap {c['gap']:+.2%}"
        else:
            detail = f"{c['value']:.4g} vs {', '.join(f'{r:.4g}' for r in c['rivals'])}"
        lines.append(f"{'✔' if c['pass'] else '✘'} {c['expert']} M={c['M']} {c['estimator']}: {c['check']} ({detail})")
    return lines


def seed_table(rows: list[dict]) -> list[str]:
    """Per-seed lines for Truth, Truth-EM, Global, Reduction and Reduction-2: metrics and the second round's cost.

    Examples
    --------
    >>> seed_table([{"expert": "gaussian", "seed": 0, "M": 1, "estimator": "Global", "rpe": 0.1, "log_lik": -2.0,
    ...              "seconds": 3.0}])[1]
    'gaussian  0     1 Global       rpe=0.1000  log_lik=-2.0000'
    """
    lines = ["expert   seed  M   estimator    metrics   [round 2: critical-path s, share of slowest local fit, "
             "compute share, passes]"]  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["expert"], r["seed"], r["M"], ESTIMATORS.index(r["estimator"]))):
        if r["estimator"] not in ("Truth", "Truth-EM", "Global", *CHECKED):
            continue
        shown = [key for key, _ in CLOSE_TO_GLOBAL[r["expert"]]] + [k for k in ("ari", "train_log_lik") if k in r]
        metrics = "  ".join(f"{key}={r[key]:.4f}" for key in shown)
        cost = ""
        if "round2_seconds" in r:
            cost = (f"  [{r['round2_seconds']:.2f}s, {r['round2_share']:.1%}, {r['round2_compute_share']:.1%}, "
                    f"{r['round2_passes']}]")  # fmt: skip
        lines.append(f"{r['expert']:<9} {r['seed']:<3} {r['M']:>3} {r['estimator']:<12} {metrics}{cost}")
    return lines
