"""The ``ppmix`` command: fit models to CSV files, run the demo and the paper reproductions."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, NoReturn, Sequence
from urllib.parse import urlsplit

from ppmix._cli_common import UserError, read_csv

__all__ = ["main"]

logger = logging.getLogger("ppmix")

DEMO_COMPONENTS = 4  # the demo plants and fits this many components, so it needs at least as many points
SCHEDULER_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
SCHEDULER_TIMEOUT_S = 5


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one ``ppmix: error:`` line (no usage block) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line naming the subcommand and exit with code 2."""
        where = self.prog.removeprefix("ppmix").strip()
        _print_error(f"{where + ': ' if where else ''}{message} (see '{self.prog} --help')")
        sys.exit(2)


def _print_error(message: str) -> None:
    """Write ``message`` to stderr as a single ``ppmix: error:`` line."""
    print(f"ppmix: error: {' '.join(message.split())}", file=sys.stderr)


def _int_at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An argparse ``type=`` that accepts integers ``>= minimum``; ``why`` explains the bound in the error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}{why}; got {value}")
        return value

    return parse


def _seed(text: str) -> int:
    """An argparse ``type=`` for a seed: an integer in [0, 2**63 - 1] (:func:`ppmix._validation.check_seed`)."""
    from ppmix._validation import check_seed

    value = _int_at_least(0)(text)
    try:
        return int(check_seed(value))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("seed ")) from None


def _scheduler_address(text: str) -> str:
    """An argparse ``type=`` for a Dask scheduler address ``SCHEME://HOST:PORT``."""
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in SCHEDULER_SCHEMES or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a scheduler address of the form tcp://HOST:PORT")
    return text


def _read_csv(path: Path, text_columns: Sequence[str] = (), named: dict | None = None):
    """The CSV file at ``path`` as a DataFrame (see :func:`ppmix._cli_common.read_csv`), or a :class:`UserError`."""
    return read_csv(path, text_columns, named)


def _cmd_fit(args: argparse.Namespace) -> int:
    """``ppmix fit gmm``: a CSV file in memory, or shards where they are read."""
    import glob

    from ppmix._cli_fit import fit_gmm

    if args.scheduler or args.workers or glob.has_magic(args.data) or not args.data.lower().endswith(".csv"):
        return _fit_shards(args, sorted(glob.glob(args.data)) if glob.has_magic(args.data) else [args.data])
    return fit_gmm(args)


def _fit_shards(args: argparse.Namespace, paths: list[str]) -> int:
    """``ppmix fit gmm 'data/part-*.parquet'``: exact EM on shards held by local processes or a Dask cluster."""
    from ppmix._cli_fit import gmm_model
    from ppmix._validation import InvalidDataError
    from ppmix.distributed import fit_em
    from ppmix.io.reports import write_json
    from ppmix.parallel import TaskError, TaskInputError

    if not paths:
        raise UserError(f"data: no shard files match {args.data!r}")
    if args.engine != "em":
        raise UserError("--engine: shards are fitted by EM only (ppmix.distributed.fit_em)")
    client = _connect(args.scheduler) if args.scheduler else None
    try:
        model = fit_em(gmm_model(args), paths, executor=client, max_workers=args.workers)
    except TaskError as err:  # a shard that cannot be read is the user's; a worker that keeps failing is not
        if all(isinstance(e, TaskInputError) for e in err.failures.values()):
            raise UserError(str(err)) from None
        raise
    except InvalidDataError as err:
        raise UserError(f"data: {err}") from None
    finally:
        if client is not None:
            client.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model")
    summary = {**model.summary(), "fit_report": model.fit_report_}
    write_json(out / "summary.json", summary)
    rows = sum(shard["n_units"] for shard in model.fit_report_["shards"])
    where = f"the Dask cluster at {args.scheduler}" if args.scheduler else "local processes"
    print(
        f"fitted GMM(k={args.k}, {args.covariance}) by EM on {len(paths)} shards ({rows} rows) on {where}: "
        f"mean log-likelihood {model.lower_bound_:.4f}, {model.n_iter_} iterations -> {out}"
    )
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from ppmix._cli_reproduce import format_report, progress_lines
    from ppmix.experiments import registry
    from ppmix.io.reports import strict_json

    if args.list or not args.name:
        items = registry.registered()
        if not items:
            print("No paper reproductions are registered yet.")
        for item in items:
            print(f"{item.name:20s} {item.description}")
        return 0
    try:
        item = registry.get(args.name)
    except KeyError as err:
        raise UserError(str(err.args[0])) from None
    with progress_lines(f"reproduce {item.name}", ["ppmix.experiments"], enabled=not args.quiet) as say:
        say(f"running{' (quick)' if args.quick else ''} into {args.out}")
        result = item.execute(Path(args.out), args.quick)  # writes OUT/NAME.json and OUT/NAME.png
        say("done")
    print(strict_json(result, default=str) if args.json else format_report(item.name, result))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import numpy as np
    import pandas as pd
    import torch

    from ppmix import GMM
    from ppmix._cli_fit import write_gmm_outputs
    from ppmix.components import DiagGaussian
    from ppmix.datasets import make_gaussian_mixture
    from ppmix.metrics import adjusted_rand_index

    data = make_gaussian_mixture(args.n, n_components=4, n_features=2, seed=args.seed)
    frame = pd.DataFrame(data.X, columns=["x0", "x1"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "data.csv", index=False)
    rows = []
    for engine, options in (("em", {}), ("svi", {"num_steps": args.svi_steps})):
        model = GMM(4, seed=args.seed, progress=False).fit(frame, engine=engine, **options)
        summary = write_gmm_outputs(model, frame, out / engine)
        rows.append(
            (
                engine,
                summary["mean_log_likelihood"],
                adjusted_rand_index(data.labels, model.predict(frame)),
                model.n_iter_,
            )
        )
    planted = DiagGaussian(torch.as_tensor(data.means), torch.as_tensor(data.scales))
    planted_ll = torch.logsumexp(planted.log_prob(torch.as_tensor(data.X)) + torch.as_tensor(data.weights).log(), 1)
    print(f"GMM demo on {args.n} points from a planted 4-component mixture (outputs in {out}):")
    print(f"{'engine':8s} {'mean log-lik':>13s} {'ARI':>6s} {'iters':>6s}")
    for engine, ll, ari, iters in rows:
        print(f"{engine:8s} {ll:13.4f} {ari:6.3f} {iters:6d}")
    print(f"{'planted':8s} {float(planted_ll.mean()):13.4f} {1.0:6.3f} {'':>6s}")
    return 0 if np.isfinite([r[1] for r in rows]).all() else 1


def _connect(address: str):
    """A Dask client of the scheduler at ``address``, or a :class:`UserError` within ``SCHEDULER_TIMEOUT_S``."""
    from distributed import Client

    try:
        return Client(address, timeout=f"{SCHEDULER_TIMEOUT_S}s")
    except (OSError, TimeoutError, ValueError) as err:
        raise UserError(f"--scheduler: cannot connect to the Dask scheduler at {address}: {err}") from None


def _cmd_dmoe(args: argparse.Namespace) -> int:
    import glob

    from ppmix._cli_reproduce import ProgressExecutor, progress_lines
    from ppmix.distributed import fit_distributed
    from ppmix.io.reports import write_json
    from ppmix.parallel import TaskError, _process_pool

    paths = sorted(glob.glob(args.shards))
    if not paths:
        raise UserError(f"--shards: no shard files match {args.shards!r}")
    client = _connect(args.scheduler) if args.scheduler else None
    loggers = ["ppmix.distributed", "ppmix.parallel"]
    with progress_lines("dmoe", loggers, enabled=not args.quiet) as say:
        done = []

        def tick() -> None:
            done.append(1)
            if len(done) <= len(paths):
                say(f"local fit {len(done)}/{len(paths)} done")
            else:  # --rounds 2: the gate refit's passes over the shards
                gate_pass, shard = divmod(len(done) - len(paths) - 1, len(paths))
                say(f"second round, pass {gate_pass + 1}: shard {shard + 1}/{len(paths)} done")

        if client is not None:
            executor = ProgressExecutor(client.get_executor(), tick)
        else:  # a local pool of ours: a worker that dies is replaced, as fit_distributed's own pool would be
            executor = ProgressExecutor(_process_pool(args.workers), tick, renew=lambda: _process_pool(args.workers))
        where = f"the Dask cluster at {args.scheduler}" if client is not None else "a local process pool"
        say(f"fitting {len(paths)} local {args.expert} MoEs (K={args.experts}) on {where}")
        try:
            fit = fit_distributed(
                paths,
                args.experts,
                expert=args.expert,
                target=args.target,
                executor=executor,
                support_size=args.support_size,
                n_init=args.n_init,
                max_iter=args.max_iter,
                seed=args.seed,
                max_workers=args.workers,
                rounds=args.rounds,
                round_objective=args.round_objective,
            )
        except (TaskError, TypeError, ValueError) as err:
            raise UserError(str(err)) from None
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
            if client is not None:
                client.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fit.model.save(out / "model")
    summary = fit.summary()
    write_json(out / "summary.json", summary)
    print(
        f"reduced {len(paths)} local {args.expert} MoE fits (K={args.experts}) on "
        f"{'the Dask cluster at ' + args.scheduler if args.scheduler else 'a local process pool'}: "
        f"slowest local fit {max(fit.local_seconds):.2f}s, aggregation {fit.aggregation_seconds:.2f}s, "
        f"critical path {fit.critical_path_seconds:.2f}s -> {out}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``ppmix`` argument parser; numeric options are range-checked here, before any work."""
    from ppmix._cli_fit import add_fit_parsers

    positive = _int_at_least(1)
    seed = _seed
    parser = _Parser(prog="ppmix", description="Mixture models as probabilistic programs.")
    parser.add_argument("--verbose", action="store_true", help="log progress messages")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    sub = parser.add_subparsers(dest="command", required=True)

    fit = sub.add_parser("fit", help="fit a model to a CSV file or to data shards")
    fit_sub = fit.add_subparsers(dest="model", required=True)
    gmm = fit_sub.add_parser(
        "gmm", help="Gaussian mixture model", description="Fit a GMM to the numeric columns of a CSV file."
    )
    gmm.add_argument(
        "data",
        help="CSV file with a header row, all columns numeric; or a glob of shard files (Parquet/CSV/NPY/NPZ, "
        "e.g. 'data/part-*.parquet'), fitted by exact EM where they are read",
    )
    gmm.add_argument("--k", type=positive, required=True, help="number of components")
    gmm.add_argument("--covariance", choices=["diag", "full", "spherical", "tied"], default="diag")
    gmm.add_argument("--engine", choices=["em", "svi"], default="em")
    gmm.add_argument("--n-init", type=positive, default=1, help="EM restarts")
    gmm.add_argument("--max-iter", type=positive, default=100, help="EM iterations")
    gmm.add_argument("--num-steps", type=positive, default=1000, help="SVI steps")
    gmm.add_argument("--seed", type=seed, default=0)
    gmm.add_argument("--quiet", action="store_true", help="no progress bar")
    gmm.add_argument(
        "--scheduler", type=_scheduler_address, help="Dask scheduler (tcp://HOST:PORT) that holds the shards"
    )
    gmm.add_argument("--workers", type=positive, help="local processes that hold the shards (default: one per CPU)")
    gmm.add_argument("--out", required=True, help="output directory (model/, summary.json, plot.png)")
    gmm.set_defaults(func=_cmd_fit)
    add_fit_parsers(fit_sub, positive, seed)

    rep = sub.add_parser("reproduce", help="regenerate a paper's table or figure")
    rep.add_argument("name", nargs="?", help="reproduction name (see --list)")
    rep.add_argument("--list", action="store_true", help="list the available reproductions")
    rep.add_argument("--quick", action="store_true", help="small, fast version (used by the tests)")
    rep.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    rep.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    rep.add_argument("--out", default="out/reproduce", help="output directory (NAME.json, NAME.png)")
    rep.set_defaults(func=_cmd_reproduce)

    dmoe = sub.add_parser(
        "dmoe",
        help="fit a mixture of experts on data shards and aggregate by optimal transport",
        description="Fit a MoE by EM on every shard (where it lives), then reduce the local fits to one.",
    )
    dmoe.add_argument("--shards", required=True, help="glob of Parquet/CSV/NPZ shard files, e.g. 'data/part-*.parquet'")
    dmoe.add_argument("--target", default="y", help="name of the response column (array in NPZ files)")
    dmoe.add_argument(
        "--experts", type=_int_at_least(2, " (a mixture of experts)"), required=True, help="number of experts K"
    )
    dmoe.add_argument("--expert", choices=["gaussian", "logistic"], default="gaussian")
    dmoe.add_argument(
        "--scheduler",
        type=_scheduler_address,
        help="address of a Dask scheduler (tcp://HOST:PORT); default a local pool",
    )
    dmoe.add_argument("--workers", type=positive, help="size of the local process pool")
    dmoe.add_argument("--support-size", type=positive, help="total supporting sample size (default about N / M)")
    dmoe.add_argument("--n-init", type=positive, default=10, help="EM starts of every local fit")
    dmoe.add_argument("--max-iter", type=positive, default=100, help="EM iterations of every local fit")
    dmoe.add_argument(
        "--rounds",
        type=int,
        choices=[1, 2],
        default=1,
        help="1: the paper's one communication round; 2: then refit the gate by Newton steps on all shards",
    )
    dmoe.add_argument(
        "--round-objective",
        choices=["likelihood", "kl"],
        default="likelihood",
        help="the second round's gate objective: f^W's expected log-likelihood (kl) or the shards' own (likelihood)",
    )
    dmoe.add_argument("--seed", type=seed, default=0)
    dmoe.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    dmoe.add_argument("--out", required=True, help="output directory (model/, summary.json)")
    dmoe.set_defaults(func=_cmd_dmoe)

    demo = sub.add_parser("demo", help="fit a GMM by EM and SVI on planted data and report")
    demo.add_argument(
        "--n",
        type=_int_at_least(DEMO_COMPONENTS, f" (the demo fits {DEMO_COMPONENTS} components)"),
        default=2000,
        help="number of points",
    )
    demo.add_argument("--svi-steps", type=positive, default=500, help="SVI steps")
    demo.add_argument("--seed", type=seed, default=0)
    demo.add_argument("--out", default="out/demo", help="output directory")
    demo.set_defaults(func=_cmd_demo)
    return parser


def _check_out(out: Path, saves_model: bool) -> None:
    """``--out`` must be a directory we may write (and, for commands that save a model, ``out/model``
    an empty directory or an earlier ppmix save); checked before any work starts."""
    from ppmix.io import check_save_target

    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is a file, not a directory")
    _check_writable(out)
    if saves_model:
        check_save_target(out / "model")


def _check_writable(out: Path) -> None:
    """``out``, or the nearest directory above it that exists, must let us create entries: tried by making
    (and removing at once) an empty directory there, which answers for read-only file systems and for root."""
    existing = out.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"{out} cannot be created: {existing} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ppmix-probe-", dir=existing))
    except OSError as err:
        raise PermissionError(
            f"cannot write to {existing} ({err.strerror or err}); choose a directory you may write"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ppmix`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        try:
            lists_only = args.command == "reproduce" and (args.list or not args.name)
            if not lists_only:
                _check_out(Path(args.out), saves_model=args.command in ("fit", "dmoe"))
        except (ValueError, OSError) as err:  # before any fitting: one line, exit code 2
            raise UserError(f"--out: {err}") from None
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
        return int(args.func(args))
    except UserError as err:
        _print_error(str(err))
        raise SystemExit(2) from None
    except Exception as err:  # an internal error: one line, unless --debug asks for the traceback
        if args.debug:
            raise
        _print_error(f"internal error: {type(err).__name__}: {err} (run with --debug for the traceback)")
        raise SystemExit(1) from None


if __name__ == "__main__":
    sys.exit(main())
