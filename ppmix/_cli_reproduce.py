"""What ``ppmix reproduce`` and ``ppmix dmoe`` print: the readable "ours (paper)" tables of the
reproductions, and progress lines on stderr while they run."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import time
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator, Sequence

__all__ = ["ProgressExecutor", "format_report", "progress_lines"]


# ------------------------------------------------------------------------------------- progress
class _StepLines(logging.Handler):
    """Writes a logger's INFO records to stderr as ``[  12.3s] what: message`` lines, one per step.

    Multi-line records and whole-row dumps (the final tables, which the command prints on
    stdout anyway) are left out.
    """

    def __init__(self, what: str, stream: Any) -> None:
        super().__init__(logging.INFO)
        self.what, self.stream, self.start = what, stream, time.perf_counter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if "\n" in message or record.msg == "%s" or message.startswith("paper"):
                return
            self.stream.write(f"[{time.perf_counter() - self.start:7.1f}s] {self.what}: {message}\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must never break the run
            self.handleError(record)


@contextlib.contextmanager
def progress_lines(what: str, loggers: Sequence[str], *, enabled: bool) -> Iterator[Callable[[str], None]]:
    """Route the INFO records of ``loggers`` to stderr as progress lines while the block runs.

    Yields ``say(message)``, which writes a line of the same form. With ``enabled`` false
    (``--quiet``) nothing is written. When the root logger already shows INFO records
    (``ppmix --verbose``), they are left to it, so no line appears twice.
    """
    handler = _StepLines(what, sys.stderr)
    if not enabled:
        yield lambda message: None
        return
    if logging.getLogger().isEnabledFor(logging.INFO):
        yield lambda message: handler.emit(logging.makeLogRecord({"msg": message, "levelno": logging.INFO}))
        return
    saved = []
    for name in loggers:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate))
        logger.setLevel(logging.INFO)
        logger.propagate = False  # the root handler shows WARNING and above only; warnings come through here
        logger.addHandler(handler)
    warnings = logging.StreamHandler(sys.stderr)
    warnings.setLevel(logging.WARNING)
    warnings.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    for logger, _, _ in saved:
        logger.addHandler(warnings)
    handler.addFilter(lambda record: record.levelno < logging.WARNING)
    try:
        yield lambda message: handler.emit(logging.makeLogRecord({"msg": message, "levelno": logging.INFO}))
    finally:
        for logger, level, propagate in saved:
            logger.removeHandler(handler)
            logger.removeHandler(warnings)
            logger.setLevel(level)
            logger.propagate = propagate


class ProgressExecutor(Executor):
    """An executor that forwards every task to ``inner`` and calls ``on_done(seconds)`` as each one finishes.

    With ``renew`` (a factory of a fresh pool), a task lost because a worker died and broke
    the pool is resubmitted once on a fresh pool, as :func:`ppmix.parallel.run_tasks` does for
    the pools it starts itself; the pools are shut down with this executor. Without it
    (an executor the caller passed, e.g. a Dask client's), the error is passed on as it is.
    """

    def __init__(self, inner: Executor, on_done: Callable[[], None], renew: Callable[[], Executor] | None = None):
        self._inner, self._on_done, self._renew = inner, on_done, renew
        self._lock = threading.Lock()
        self._retired: list[Executor] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        outer: Future = Future()
        self._forward(outer, fn, args, kwargs, retry=self._renew is not None)
        return outer

    def _forward(self, outer: Future, fn: Callable[..., Any], args: tuple, kwargs: dict, retry: bool) -> None:
        pool = self._inner
        try:
            inner = pool.submit(fn, *args, **kwargs)
        except BrokenProcessPool:
            if not retry:
                raise
            self._replace(pool)
            return self._forward(outer, fn, args, kwargs, retry=False)

        def done(future: Future) -> None:
            if future.cancelled():
                outer.cancel()
                return
            error = future.exception()
            if isinstance(error, BrokenProcessPool) and retry:
                self._replace(pool)
                try:
                    self._forward(outer, fn, args, kwargs, retry=False)
                except BaseException as again:  # noqa: BLE001 - delivered through the future
                    outer.set_exception(again)
                return
            if error is not None:
                outer.set_exception(error)
            else:
                outer.set_result(future.result())
                self._on_done()

        inner.add_done_callback(done)

    def _replace(self, broken: Executor) -> None:
        with self._lock:
            if self._inner is broken and self._renew is not None:
                self._retired.append(broken)
                self._inner = self._renew()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._renew is None:  # not ours
            return
        self._inner.shutdown(wait=wait, cancel_futures=cancel_futures)
        for pool in self._retired:
            pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------------------------------- tables
def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Left-aligned first column, right-aligned others, two spaces between columns."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and not math.isfinite(value):
        return "-" if math.isnan(value) else str(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e4 or (0 < abs(value) < 1e-3) else f"{value:.3f}"
    return str(value)


def _pair(ours: Any, paper: Any) -> str:
    return f"{_cell(ours)} ({_cell(paper)})"


def _pf_gmm(result: dict) -> list[str]:
    return [line for line in result.get("report", []) if line is not None]


def _pf_hmm(result: dict) -> list[str]:
    lines = ["Test AUROC against the state budget K (the paper gives curves, no numbers; its claim is below)"]
    for setting in result["settings"]:
        methods = list(setting["test_auroc"])
        rows = [[m, *setting["test_auroc"][m]] for m in methods]
        rows.append(["Bayes limit", *([setting["bayes_auroc"]] * len(setting["K"]))])
        lines += ["", f"D_R = {setting['n_relevant']} relevant features"]
        lines += _table(["method", *(f"K={k}" for k in setting["K"])], rows)
        lines.append(f"pf-HMM at least as good as the baselines at every K: {_cell(setting['pf_beats_baselines'])}")
    lines += ["", f"paper: {result['paper']}"]
    return lines


def _presto(result: dict) -> list[str]:
    rows = [[r["method"], _pair(r["NMI"], r["paper NMI"]), _pair(r["ARI"], r["paper ARI"]), r["seconds"]]
            for r in result["table"]]  # fmt: skip
    lines = [f"PRESTO on the 2-D synthetic ({result['n_points']} points): Table 5, ours (paper)"]
    lines += _table(["method", "NMI", "ARI", "seconds"], rows)
    return lines + ["", result.get("paper_notes", "")]


def _rw(result: dict) -> list[str]:
    rows = [
        [f"{d:g}", *(result["max_dist_over_R"][m][i] for m in ("rw", "kmeans", "gmm"))]
        for i, d in enumerate(result["outlier_distance"])
    ]
    lines = [f"Breakdown (Theorem 2): max inlier-to-centre distance / R; the paper bounds RW by "
             f"{result['theorem_bound']:g}"]  # fmt: skip
    lines += _table(["outlier distance", "RW", "KMeans", "GaussianMixture"], rows)
    lines.append(f"RW within the bound at every distance: {_cell(result['rw_within_bound'])}")
    correct = result["regression_correct_per_curve"]
    lines += ["", "Fat-tailed regression (Figure 2.1): points assigned to their own curve, ours (paper)"]
    lines += _table(
        ["method", "curve 1", "curve 2", "accuracy"],
        [
            ["RW (robust joint loss)", *(_pair(o, p) for o, p in zip(correct["rw"], correct["paper_rw"])),
             result["regression_accuracy"]["rw"]],
            ["minimum loss", *(_pair(o, p) for o, p in zip(correct["min_loss"], correct["paper_min_loss"])),
             result["regression_accuracy"]["min_loss"]],
        ],
    )  # fmt: skip
    return lines


def _dmoe(result: dict) -> list[str]:
    lines = ["Distributed MoE on the S4.1 simulation: test-set means over seeds (the paper gives box plots only)"]
    for expert in dict.fromkeys(r["expert"] for r in result["table"]):
        rows = [r for r in result["table"] if r["expert"] == expert]
        metrics = [m for m in ("transport", "log_lik", "mse", "rpe", "accuracy", "log_loss", "ari", "seconds")
                   if any(m in r for r in rows)]  # fmt: skip
        lines += ["", f"{expert} experts"]
        lines += _table(["estimator", "M", *metrics], [[r["estimator"], r["M"], *(r.get(m) for m in metrics)]
                                                          for r in rows])  # fmt: skip
    checks = result.get("quality_bar", [])
    if checks:
        lines += ["", "quality bar (the paper's claims as checks)"]
        lines += _table(
            ["expert", "M", "check", "pass"], [[c["expert"], c["M"], c["check"], c["pass"]] for c in checks]
        )
    lines += [""] + [f"paper ({when}): {claim}" for when, claim in result.get("paper_claims", {}).items()]
    return lines


def _generic(result: dict) -> list[str]:
    lines = []
    for key, value in result.items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            lines.append(f"{key}: {_cell(value)}")
        elif isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            headers = list(dict.fromkeys(k for r in value for k in r))
            lines += [f"{key}:", *_table(headers, [[r.get(h) for h in headers] for r in value])]
    return lines


_FORMATS: dict[str, Callable[[dict], list[str]]] = {
    "pf-gmm": _pf_gmm,
    "pf-hmm": _pf_hmm,
    "presto": _presto,
    "rw": _rw,
    "dmoe": _dmoe,
}


def format_report(name: str, result: dict) -> str:
    """The readable report of reproduction ``name``: our numbers with the paper's in parentheses,
    or beside its claims where the paper prints none, then the files written."""
    try:
        lines = _FORMATS.get(name, _generic)(result)
    except (KeyError, TypeError, IndexError, ValueError):  # a result of another shape: show what it has
        lines = _generic(result)
    files = result.get("files") or []
    if files:
        lines += ["", "written: " + ", ".join(str(f) for f in files)]
    return "\n".join(lines).strip("\n")
