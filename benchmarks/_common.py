"""Thread settings shared by the benchmark scripts.

Import this module before numpy and torch: :func:`early_threads` must put ``--threads`` in
the environment before those libraries start their thread pools. It imports nothing but
the standard library at module level.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # numpy is imported after early_threads has set the thread variables
    import numpy as np

# Read by OpenMP (torch, scikit-learn) and the BLAS libraries (numpy/scipy OpenBLAS, torch MKL) when they load.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def early_threads(default: int) -> int:
    """Put the script's ``--threads`` (read from ``sys.argv``) into every thread variable.

    Parameters
    ----------
    default : int
        The script's default for ``--threads``.

    Returns
    -------
    int
        The thread count written to the environment.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=default)
    ns, _ = pre.parse_known_args()
    for var in THREAD_VARS:
        os.environ[var] = str(ns.threads)
    return ns.threads


def set_torch_threads(threads: int, *, uses_pomegranate: bool) -> None:
    """Set torch's thread count, after importing pomegranate if the benchmark uses it.

    Importing pomegranate (its ``apricot`` dependency) resets the OpenMP thread count,
    which torch shares, to the number of CPUs. Imported lazily inside a timed run, it
    would silently change the thread count of every timing after it; imported here, it
    happens before the count is set.

    Parameters
    ----------
    threads : int
        Threads for torch's intra-op pool.
    uses_pomegranate : bool
        Whether the run will use pomegranate.
    """
    import torch

    if uses_pomegranate:
        import pomegranate.distributions  # noqa: F401
    torch.set_num_threads(threads)


def require_torch_threads(expected: int) -> int:
    """Return torch's thread count, or raise if it is not the one a timing was meant to use.

    Parameters
    ----------
    expected : int
        The thread count the timing was run at.

    Returns
    -------
    int
        ``torch.get_num_threads()`` (equal to ``expected``).

    Raises
    ------
    RuntimeError
        If torch ran with another thread count.
    """
    import torch

    used = torch.get_num_threads()
    if used != expected:
        raise RuntimeError(f"torch ran with {used} threads, not the {expected} this timing is for")
    return used


def add_peer_api_argument(parser: argparse.ArgumentParser) -> None:
    """``--peer-api {internal,public}``: how the per-iteration timing steps scikit-learn's EM.

    ``internal`` (the default of a full run) times one E-step plus one M-step through
    scikit-learn's private ``_e_step``/``_m_step``, the fair per-iteration cost. ``public``
    (the default of ``--quick``, which the test suite runs) steps EM through the public API
    only: ``fit`` with ``warm_start=True, max_iter=1``, which also runs scikit-learn's final
    E-step, so its "iteration" costs about one E-step more. A renamed private function then
    breaks only the full benchmark, never the tests.
    """
    parser.add_argument(
        "--peer-api",
        choices=("internal", "public"),
        default=None,
        help="step scikit-learn's EM through its private _e_step/_m_step (default of a full run) "
        "or its public fit(warm_start=True) (default of --quick; costs one extra E-step per iteration)",
    )


def sklearn_private(obj: object, name: str):
    """Return ``obj.name`` from scikit-learn's private API, or fail naming what changed.

    Parameters
    ----------
    obj : object
        A scikit-learn estimator or module.
    name : str
        The private attribute the full benchmark relies on.

    Returns
    -------
    callable
        The attribute.

    Raises
    ------
    RuntimeError
        If this scikit-learn no longer has it (rerun with ``--peer-api public``).
    """
    import sklearn

    found = getattr(obj, name, None)
    if not callable(found):
        raise RuntimeError(
            f"scikit-learn {sklearn.__version__} has no {name} on {obj!r}: its private API changed; "
            "run the benchmark with --peer-api public"
        )
    return found


def sklearn_public_em(weights, means, covariances, covariance_type: str, reg_covar: float, seed: int):
    """A ``GaussianMixture`` whose every ``fit`` call is one EM iteration from the given parameters.

    The first ``fit`` starts from ``weights``/``means``/``covariances`` (given as
    ``*_init``; the precisions are their inverses), later calls continue (``warm_start``).
    Only public API is used.

    Parameters
    ----------
    weights, means, covariances : numpy.ndarray
        Starting parameters, shapes (K,), (K, D) and (K, D) or (K, D, D).
    covariance_type : {"diag", "full"}
        scikit-learn's covariance type.
    reg_covar : float
        Added to the diagonal of every covariance estimate.
    seed : int
        ``random_state`` (used only by the initialisation that the ``*_init`` values override).

    Returns
    -------
    sklearn.mixture.GaussianMixture
    """
    import numpy as np
    from sklearn.mixture import GaussianMixture

    precisions = 1.0 / covariances if covariance_type == "diag" else np.linalg.inv(covariances)
    return GaussianMixture(
        n_components=len(weights),
        covariance_type=covariance_type,
        reg_covar=reg_covar,
        tol=0.0,
        max_iter=1,
        n_init=1,
        warm_start=True,
        init_params="random_from_data",
        weights_init=weights,
        means_init=means,
        precisions_init=precisions,
        random_state=seed,
    )


def machine_load() -> dict[str, Any]:
    """Load average and CPU pressure (PSI): how busy the machine was while we measured."""
    out: dict[str, Any] = {"loadavg": [round(v, 2) for v in os.getloadavg()]}
    try:
        out["cpu_pressure"] = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        pass
    return out


def sticky_paths(rng: "np.random.Generator", n_sequences: int, k: int, stay: float = 0.9) -> Iterator["np.ndarray"]:
    """State paths of sticky ``k``-state chains (self-transition ``stay``, the rest spread evenly), lengths
    uniform in 10..50, drawn lazily from ``rng``: a caller's emission draws for a path come before the next path's.

    Examples
    --------
    >>> import numpy as np
    >>> [len(z) for z in sticky_paths(np.random.default_rng(0), 3, 4)]
    [44, 41, 21]
    """
    import numpy as np

    transition = np.full((k, k), (1.0 - stay) / (k - 1))
    np.fill_diagonal(transition, stay)
    for _ in range(n_sequences):
        length = int(rng.integers(10, 51))
        z = np.empty(length, dtype=int)
        z[0] = rng.integers(k)
        for t in range(1, length):
            z[t] = rng.choice(k, p=transition[z[t - 1]])
        yield z


def gaussian_mixture_mean_loglik(x: Any, weights: Any, means: Any, covariances: Any) -> float:
    """One float64 evaluator of ``mean_n log sum_k w_k N(x_n | mu_k, Sigma_k)`` for every library's fit.

    Parameters
    ----------
    x : array (N, D)
    weights, means, covariances : arrays or tensors
        Shapes ``(K,)``, ``(K, D)`` and ``(K, D)`` (diagonal) or ``(K, D, D)``; copied to float64 on the CPU.

    Returns
    -------
    float
    """
    import math

    import numpy as np
    import torch

    def float64(value: Any) -> "torch.Tensor":
        if isinstance(value, torch.Tensor):
            return value.detach().to("cpu", torch.float64).clone()
        return torch.tensor(np.asarray(value, dtype=np.float64))

    xt = float64(x)
    w, mu, cov = (float64(v) for v in (weights, means, covariances))
    d = xt.shape[1]
    columns = []
    for j in range(mu.shape[0]):
        diff = xt - mu[j]
        if cov.dim() == 2:
            maha, log_det = (diff.square() / cov[j]).sum(1), cov[j].log().sum()
        else:
            chol = torch.linalg.cholesky(cov[j])
            maha = torch.linalg.solve_triangular(chol, diff.T, upper=False).square().sum(0)
            log_det = 2.0 * torch.diagonal(chol).log().sum()
        columns.append(-0.5 * (d * math.log(2 * math.pi) + log_det + maha) + w[j].log())
    return float(torch.logsumexp(torch.stack(columns, 1), 1).mean())
