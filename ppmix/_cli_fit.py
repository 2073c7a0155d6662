"""``ppmix fit MODEL DATA.csv``: fit a GMM, an HMM, a pf-GMM or a mixture of experts to a CSV file.

Every form writes ``OUT/model/`` (the fitted model, ``Model.load``-able), ``OUT/summary.json``
(standard JSON: the fit's parameters, its scores and the column names) and ``OUT/plot.png``
(on the data's own scale, axes named after the CSV's columns), and prints one line.
A column option naming a missing column, or data the model cannot fit (e.g. more
components than rows), is one ``ppmix: error:`` line naming the option or the file, exit code 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from ppmix._cli_common import UserError

__all__ = ["add_fit_parsers"]


# ------------------------------------------------------------------------------------- parsers
def add_fit_parsers(fit_sub: Any, positive: Callable[[str], int], seed: Callable[[str], int]) -> None:
    """Add ``hmm``, ``pfgmm`` and ``moe`` to the ``fit`` subparsers (``gmm`` is added by :mod:`ppmix.cli`)."""
    hmm = fit_sub.add_parser(
        "hmm",
        help="Gaussian hidden Markov model",
        description="Fit an HMM (Baum-Welch EM, or SVI) to the rows of a CSV file, read as time steps. "
        "With --sequence-column the rows are split into sequences by that column's id (rows in time order "
        "within each sequence); without it the whole file is one sequence.",
    )
    hmm.add_argument("data", help="CSV file with a header row, all columns numeric")
    hmm.add_argument("--k", type=positive, required=True, help="number of hidden states")
    hmm.add_argument("--sequence-column", metavar="COLUMN", help="column holding the sequence id of every row")
    hmm.add_argument("--covariance", choices=["diag", "full", "spherical", "tied"], default="diag")
    hmm.add_argument(
        "--emission",
        default="gaussian",
        help="the emissions' family, by its registered name: gaussian (default; --covariance applies), poisson, ...",
    )
    hmm.add_argument(
        "--emission-option",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the emissions' family, repeatable; VALUE is read as JSON where it parses, else as text: "
        "e.g. --emission gmm --emission-option n_mix=3 (a GMM-HMM of 3 Gaussians per state; --covariance applies)",
    )
    _add_engine(hmm, positive)
    _add_common(hmm, positive, seed, n_init=1, max_iter=100)

    pf = fit_sub.add_parser(
        "pfgmm",
        help="prediction-focused GMM (a binary label and the features relevant to it)",
        description="Fit a pf-GMM to the feature columns of a CSV file and its binary --target column; "
        "reports the training AUROC and which features are relevant to the label.",
    )
    pf.add_argument("data", help="CSV file with a header row; features numeric, the target any two values")
    pf.add_argument("--target", metavar="COLUMN", required=True, help="column holding the binary label")
    pf.add_argument("--k", type=positive, required=True, help="number of components")
    pf.add_argument(
        "--switch-prior",
        type=_switch_prior,
        default="auto",
        help="prior probability p that a feature is relevant, or 'auto' (default: chosen by cross-validation)",
    )
    pf.add_argument(
        "--n-restarts",
        type=positive,
        default=3,
        help="EM starts (the model's own, class-stratified, relevance-scaled), the best kept (default: 3)",
    )
    _add_common(pf, positive, seed, n_init=1, max_iter=200)

    moe = fit_sub.add_parser(
        "moe",
        help="mixture of experts (Gaussian regression or logistic experts)",
        description="Fit a mixture of experts y | x by EM to the columns of a CSV file: --target is y, "
        "the other columns are x.",
    )
    moe.add_argument("data", help="CSV file with a header row; covariates numeric")
    moe.add_argument("--target", metavar="COLUMN", required=True, help="column holding the response y")
    moe.add_argument("--k", "--experts", dest="k", type=_at_least_two, required=True, help="number of experts K (>= 2)")
    moe.add_argument("--expert", choices=["gaussian", "logistic"], default="gaussian")
    moe.add_argument("--split-merge-search", choices=["proposal", "screened"], default="proposal",
                     help="split-and-merge moves after EM: one proposal per round, or every move screened on a "
                          "subsample (slower, finds better optima; see MixtureOfExperts)")  # fmt: skip
    _add_common(moe, positive, seed, n_init=10, max_iter=100)


def _add_engine(parser: argparse.ArgumentParser, positive: Callable[[str], int]) -> None:
    parser.add_argument("--engine", choices=["em", "svi"], default="em")
    parser.add_argument("--num-steps", type=positive, default=1000, help="SVI steps")


def _add_common(parser: Any, positive: Callable[[str], int], seed: Callable[[str], int], *, n_init, max_iter) -> None:
    parser.add_argument("--n-init", type=positive, default=n_init, help="EM restarts")
    parser.add_argument("--max-iter", type=positive, default=max_iter, help="EM iterations")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--out", required=True, help="output directory (model/, summary.json, plot.png)")
    parser.set_defaults(func=FIT_COMMANDS[parser.prog.split()[-1]])


def _switch_prior(text: str) -> float | str:
    return "auto" if text == "auto" else _probability(text)


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in (0, 1]; got {value}")
    return value


def _at_least_two(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer >= 2 (a mixture of experts); got {value}")
    return value


# ------------------------------------------------------------------------------------- helpers
def _read(args: argparse.Namespace, text_columns: tuple[str, ...] = (), named: dict | None = None):
    # through ppmix.cli, so that replacing ppmix.cli._read_csv (as a test of internal errors does) applies here
    from ppmix import cli

    return cli._read_csv(Path(args.data), text_columns, named)


def _column(frame: Any, name: str, option: str, path: str) -> Any:
    if name not in frame.columns:
        raise UserError(
            f"{option}: no column {name!r} in data file {path} (columns: {', '.join(map(str, frame.columns))})"
        )
    return frame[name]


def _target(frame: Any, args: argparse.Namespace) -> Any:
    """The ``--target`` column, refused (naming it, the file and the first row) if a value is missing or infinite."""
    import numpy as np
    import pandas as pd

    column = _column(frame, args.target, "--target", args.data)
    bad = column.isna().to_numpy()
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        bad = bad | np.isinf(column.to_numpy(dtype=float))
    if bad.any():
        first = int(np.argmax(bad))
        raise UserError(
            f"--target: column {args.target!r} of data file {args.data} has {int(bad.sum())} missing or infinite "
            f"value(s), the first in data row {first + 1} ({_plain(column.iloc[first])!r})"
        )
    return column


def _binary_target(frame: Any, args: argparse.Namespace) -> tuple[Any, Any, list]:
    """The features, the target as 0/1 floats and the two classes ``[negative, positive]`` (sorted)."""
    import numpy as np

    column = _target(frame, args)
    classes = sorted(column.unique().tolist(), key=lambda v: (str(type(v)), v))
    if len(classes) != 2:
        shown = classes[:5] + (["..."] if len(classes) > 5 else [])
        raise UserError(f"--target: column {args.target!r} must hold two classes; it holds {len(classes)}: {shown}")
    y = (column == classes[1]).to_numpy(dtype=np.float64)
    features = frame.drop(columns=[args.target])
    _check_features(features, args)
    return features, y, [_plain(c) for c in classes]


def _check_features(features: Any, args: argparse.Namespace) -> None:
    import pandas as pd

    if features.shape[1] == 0:
        raise UserError(f"data file {args.data} has no feature columns besides the target {args.target!r}")
    text = [str(c) for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if text:
        raise UserError(f"data file {args.data} has non-numeric columns {text}; drop them first")


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value (for JSON)."""
    return value.item() if hasattr(value, "item") else value


def _fit(model: Any, args: argparse.Namespace, *data: Any, **options: Any) -> Any:
    from ppmix._validation import InvalidDataError

    try:
        return model.fit(*data, **options)
    except InvalidDataError as err:  # the data cannot be fitted as given; any other error is an internal one
        raise UserError(f"data file {args.data}: {err}") from None


def _engine_options(args: argparse.Namespace) -> dict:
    return {"engine": args.engine, **({"num_steps": args.num_steps} if args.engine == "svi" else {})}


def _save(model: Any, summary: dict, out: Path, draw: Callable[[Any], None], n_panels: int) -> None:
    """Write ``out/model``, ``out/summary.json`` and ``out/plot.png`` (``draw(axes)`` fills the panels)."""
    import matplotlib

    from ppmix.io.reports import write_json

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model")
    write_json(out / "summary.json", summary)
    fig, axes = plt.subplots(1, n_panels, figsize=(5 * n_panels, 4), squeeze=False)
    draw(axes[0])
    fig.tight_layout()
    fig.savefig(out / "plot.png", dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------- gmm
def write_gmm_outputs(model: Any, frame: Any, out: Path) -> dict:
    """``model/``, ``summary.json`` and ``plot.png`` of a fitted GMM (also used by ``ppmix demo``)."""
    from ppmix.viz import plot_clusters, plot_history

    summary = {**model.summary(), "n_samples": int(len(frame)), "bic": model.bic(frame)}

    def draw(axes: Any) -> None:
        plot_clusters(model, frame, ax=axes[0])
        plot_history(model, ax=axes[1])

    _save(model, summary, out, draw, 2)
    return summary


def gmm_model(args: argparse.Namespace) -> Any:
    from ppmix import GMM

    return GMM(args.k, covariance_type=args.covariance, n_init=args.n_init, max_iter=args.max_iter,
               seed=args.seed, progress=not args.quiet)  # fmt: skip


def fit_gmm(args: argparse.Namespace) -> int:
    """``ppmix fit gmm DATA.csv``."""
    frame = _read(args)
    model = _fit(gmm_model(args), args, frame, **_engine_options(args))
    summary = write_gmm_outputs(model, frame, Path(args.out))
    print(
        f"fitted GMM(k={args.k}, {args.covariance}) by {args.engine}: "
        f"mean log-likelihood {summary['mean_log_likelihood']:.4f}, BIC {summary['bic']:.1f}, "
        f"{summary['n_iter']} iterations -> {args.out}"
    )
    return 0


# ------------------------------------------------------------------------------------- hmm
def fit_hmm(args: argparse.Namespace) -> int:
    """``ppmix fit hmm DATA.csv [--sequence-column ID]``."""
    import numpy as np

    from ppmix import HMM
    from ppmix.components.registry import family_from
    from ppmix.viz import plot_clusters, plot_history

    column = args.sequence_column
    frame = _read(args, text_columns=(column,) if column else (), named={"--sequence-column": column})
    if column is not None:
        if frame.shape[1] < 2:
            raise UserError(f"data file {args.data} has no feature columns besides the sequence column {column!r}")
        data = frame
        sequences = [g.drop(columns=[column]) for _, g in frame.groupby(column, sort=False)]
    else:
        sequences = [frame]
        data = [frame]
    emission = _emission(args)
    try:
        family_from(emission, "--emission")
    except (TypeError, ValueError) as err:
        raise UserError(f"--emission{'-option' if args.emission_option else ''}: {err}") from None
    model = HMM(args.k, emission=emission, covariance_type=args.covariance, n_init=args.n_init,
                max_iter=args.max_iter, sequence_column=column, seed=args.seed, progress=not args.quiet)  # fmt: skip
    _fit(model, args, data, **_engine_options(args))
    states = [np.asarray(s) for s in model.predict(data)]
    summary = {
        "model": "HMM",
        "n_components": args.k,
        "emission": emission,
        "covariance_type": args.covariance,
        "engine": model.engine_,
        "n_iter": model.n_iter_,
        "converged": bool(model.converged_),
        "mean_log_likelihood": model.lower_bound_,
        "initial": model.initial_.cpu().tolist(),
        "transition": model.transition_.cpu().tolist(),
        "means": model.means_.cpu().tolist(),
        "feature_names": model.feature_names_in_,
        "sequence_column": column,
        "n_sequences": len(sequences),
        "n_samples": int(len(frame)),
        "bic": model.bic(data),
        "state_counts": np.bincount(np.concatenate(states), minlength=args.k).tolist(),
    }
    frames = np.concatenate([s.to_numpy(dtype=float) for s in sequences])

    def draw(axes: Any) -> None:
        plot_clusters(model, frames, ax=axes[0], labels=np.concatenate(states), feature_names=model.feature_names_in_)
        first, name = sequences[0].to_numpy(dtype=float)[:, 0], model.feature_names_in_[0]
        axes[1].plot(first, color="grey", lw=0.8)
        axes[1].scatter(np.arange(len(first)), first, c=states[0], cmap="tab10", s=10, vmin=0, vmax=9)
        axes[1].set_xlabel("time step")
        axes[1].set_ylabel(name)
        axes[1].set_title("first sequence, coloured by the most probable state")
        plot_history(model, ax=axes[2])

    _save(model, summary, Path(args.out), draw, 3)
    print(
        f"fitted HMM(k={args.k}, {args.covariance if args.emission == 'gaussian' else args.emission}) by "
        f"{args.engine} on {len(sequences)} sequence(s) of "
        f"{len(frame)} rows: mean log-likelihood {summary['mean_log_likelihood']:.4f}, BIC {summary['bic']:.1f}, "
        f"{summary['n_iter']} iterations -> {args.out}"
    )
    return 0


def _key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--emission-option`` as ``(key, value)``, the value read as JSON where it parses (``3``,
    ``1e-4``, ``"full"``), else as the text."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. n_mix=3); got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _emission(args: argparse.Namespace) -> Any:
    """``--emission``, or with ``--emission-option`` settings the family's dict form (``{"name": "gmm", "n_mix":
    3}``), given ``--covariance`` where the family takes a ``covariance_type`` and no option sets it."""
    if not args.emission_option:
        return args.emission
    from ppmix.components.registry import family_options

    settings = dict(args.emission_option)
    try:
        accepted = family_options(args.emission) or ()
    except ValueError as err:
        raise UserError(f"--emission: {err}") from None
    if "covariance_type" in accepted:
        settings.setdefault("covariance_type", args.covariance)
    return {"name": args.emission, **settings}


# ------------------------------------------------------------------------------------- pf-GMM
def fit_pfgmm(args: argparse.Namespace) -> int:
    """``ppmix fit pfgmm DATA.csv --target LABEL``."""
    import numpy as np

    from ppmix import PFGMM
    from ppmix.metrics import auroc
    from ppmix.viz import plot_history, plot_relevance

    frame = _read(args, text_columns=(args.target,), named={"--target": args.target})
    features, y, classes = _binary_target(frame, args)
    model = PFGMM(args.k, switch_prior=args.switch_prior, n_restarts=args.n_restarts, n_init=args.n_init,
                  max_iter=args.max_iter, seed=args.seed, progress=not args.quiet)  # fmt: skip
    _fit(model, args, features, y)
    proba = np.asarray(model.predict_proba(features))[:, 1]
    relevance = [float(r) for r in np.asarray(model.relevance_, dtype=float).reshape(-1)]
    names = list(model.feature_names_in_)
    # relevant: PFGMM.relevant_features_ (the gain and the label association both significant at 0.05 / D)
    relevant = [n for n, on in zip(names, np.asarray(model.relevant_features_, dtype=bool)) if on]
    summary = {
        **model.summary(),
        "target": args.target,
        "classes": classes,
        "positive_class": classes[1],
        "n_samples": int(len(frame)),
        "train_auroc": float(auroc(y, proba)),
        "relevant_features": relevant,
        "n_relevant": len(relevant),
        "relevant_rule": "PFGMM.relevant_features_: gain (chi2, 2(K-1) df) and label association (chi2, 2 df) "
        "both significant at level 0.05 / n_features",
        "relevance_by_feature": dict(zip(names, relevance)),
        "relevance_gain_by_feature": dict(zip(names, np.asarray(model.relevance_gain_, dtype=float).tolist())),
    }

    def draw(axes: Any) -> None:
        plot_relevance(model, ax=axes[0])
        plot_history(model, ax=axes[1])

    _save(model, summary, Path(args.out), draw, 2)
    print(
        f"fitted PFGMM(k={args.k}, switch_prior={args.switch_prior}, p={model.p_:.3g}) to {args.target!r} "
        f"(positive class {classes[1]!r}): training AUROC {summary['train_auroc']:.3f}; "
        f"relevant features ({len(relevant)} of {len(names)}): {', '.join(relevant) or 'none'} -> {args.out}"
    )
    return 0


# ------------------------------------------------------------------------------------- MoE
def fit_moe(args: argparse.Namespace) -> int:
    """``ppmix fit moe DATA.csv --target Y --expert gaussian|logistic``."""
    import numpy as np

    from ppmix import MixtureOfExperts
    from ppmix.metrics import auroc
    from ppmix.viz import plot_experts, plot_history

    logistic = args.expert == "logistic"
    frame = _read(args, text_columns=(args.target,) if logistic else (), named={"--target": args.target})
    if logistic:
        features, y, classes = _binary_target(frame, args)
    else:
        y = _target(frame, args).to_numpy(dtype=float)
        features = frame.drop(columns=[args.target])
        _check_features(features, args)
    model = MixtureOfExperts(args.k, expert=args.expert, n_init=args.n_init, max_iter=args.max_iter,
                             split_merge_search=args.split_merge_search, seed=args.seed,
                             progress=not args.quiet)  # fmt: skip
    _fit(model, args, features, y)
    summary = {**model.summary(), "target": args.target, "n_samples": int(len(frame))}
    summary["expert_share"] = np.bincount(np.asarray(model.predict_components(features)), minlength=args.k).tolist()
    if logistic:
        proba = np.asarray(model.predict_proba(features))[:, 1]
        summary.update(classes=classes, positive_class=classes[1], train_auroc=float(auroc(y, proba)),
                       train_accuracy=float(np.mean((proba >= 0.5) == (y == 1))))  # fmt: skip
        score = f"training accuracy {summary['train_accuracy']:.3f}, AUROC {summary['train_auroc']:.3f}"
    else:
        residual = y - np.asarray(model.predict(features))
        summary["train_rmse"] = float(np.sqrt(np.mean(residual**2)))
        summary["train_r2"] = float(1 - np.mean(residual**2) / max(np.var(y), np.finfo(float).tiny))
        score = f"training RMSE {summary['train_rmse']:.4g}, R^2 {summary['train_r2']:.3f}"

    def draw(axes: Any) -> None:
        plot_experts(model, features, y, ax=axes[0])
        axes[0].set_title(f"{args.k} {args.expert} experts along {model.feature_names_in_[0]} (others at their mean)")
        if logistic:
            axes[0].set_ylabel(f"P({args.target} = {classes[1]!r} | x, expert)")
        else:
            axes[0].set_ylabel(args.target)
        plot_history(model, ax=axes[1])

    _save(model, summary, Path(args.out), draw, 2)
    print(
        f"fitted MixtureOfExperts(k={args.k}, {args.expert}) to {args.target!r}: mean log-likelihood "
        f"{summary['mean_log_likelihood']:.4f}, {score}, {summary['n_iter']} iterations -> {args.out}"
    )
    return 0


FIT_COMMANDS = {"hmm": fit_hmm, "pfgmm": fit_pfgmm, "moe": fit_moe}
