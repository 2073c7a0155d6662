"""Initialisation of cluster centres: k-means++ seeding and Lloyd iterations, in torch.

A start for EM needs good centres, not a converged k-means of every row: :func:`kmeans` with
``sample_size`` seeds and runs Lloyd on a random subsample of the rows and assigns every row
to its nearest centre in one more pass, so the start costs a fixed amount however large ``N``.
"""

from __future__ import annotations

import math

import torch

from ppmix.ops.scaling import column_variance
from ppmix.ops.selection import beats

__all__ = ["kmeans", "kmeans_plusplus", "kmeans_start", "nearest_centre", "sampling_mass", "start_sample_size"]

#: k-means runs (best inertia kept) behind one start of EM (:func:`kmeans_start`): on a subsample they
#: cost little, and on overlapping or elongated clusters the best of 10 finds the better optimum far more
#: often than the best of 3 (``benchmarks/bench_gmm_start.py``)
START_RUNS = 10
#: rows (at least; and ``START_ROWS_PER_COMPONENT`` per cluster) of the subsample a start runs on
START_SAMPLE_ROWS = 1_000
START_ROWS_PER_COMPONENT = 250
#: Lloyd stops when its centres move less than this times the mean feature variance (scikit-learn's ``tol``)
LLOYD_TOL = 1e-4


def _power_of_two_scale(x: torch.Tensor) -> float:
    """``2^e`` close to ``max |x|``: dividing by it is exact and keeps squared distances finite
    (no overflow at 1e20 in float32, no underflow at 1e-150), and the results of the
    functions here are the same for ``x`` and ``2^j x``."""
    if not x.numel():
        return 1.0
    low, high = torch.aminmax(x)
    largest = max(-float(low), float(high))
    if not math.isfinite(largest):
        raise ValueError("X must be finite for k-means")
    return 2.0 ** math.frexp(largest)[1] if largest > 0 else 1.0


def _squared_distances(x: torch.Tensor, centres: torch.Tensor, x_sq: torch.Tensor) -> torch.Tensor:
    offset = x_sq[:, None] + centres.square().sum(1)[None, :]
    return torch.addmm(offset, x, centres.T, alpha=-2.0).clamp_min_(0.0)


def nearest_centre(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centre for every row of ``x``.

    One matrix product, ``argmin_k |c_k|^2 - 2 x . c_k`` (the row's own ``|x|^2`` does not
    change the argmin), with the centres divided by a power of two near their largest entry
    (exact) so that nothing overflows or underflows, and no pass over ``x`` besides the product.

    Examples
    --------
    >>> nearest_centre(torch.tensor([[0.0], [9.0]]), torch.tensor([[10.0], [1.0]])).tolist()
    [1, 0]
    """
    # min(0).indices, not argmin(0): the same first index, about 5x faster over (K, N) in torch's CPU kernels
    return _centre_scores(x, centres, _power_of_two_scale(centres)).min(dim=0).indices


def _centre_scores(x: torch.Tensor, centres: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``(|c_k|^2 - 2 c_k . x_n) / scale`` for every centre and row, ``(K, N)``: the squared distance less
    the row's own ``|x_n|^2``, one matrix product in the ``(K, N)`` orientation (the fast one in MKL for
    a few centres), with the centres divided by ``scale`` (a power of two: exact)."""
    if scale == 1.0:  # the same numbers without the two scalings
        return torch.addmm(centres.square().sum(1)[:, None], centres, x.T, alpha=-2.0)
    unit = centres / scale
    return torch.addmm((unit.square().sum(1) * scale)[:, None], unit, x.T, alpha=-2.0)


def kmeans_plusplus(
    x: torch.Tensor,
    n_clusters: int,
    generator: torch.Generator,
    n_trials: int | None = None,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii, 2007).

    Each new centre is the best, by the resulting k-means potential, of ``n_trials``
    candidates drawn with probability proportional to ``D^2`` (default
    ``2 + floor(log K)``, the usual greedy variant; ``1`` is plain k-means++). With row
    weights ``(N,)`` (non-negative, not all zero) the draws are proportional to ``w D^2`` and the
    potential is ``sum_n w_n D_n^2``: the seeding of the data with row ``n`` repeated ``w_n`` times.

    Examples
    --------
    >>> import torch
    >>> x = torch.cat([torch.zeros(5, 2), torch.ones(5, 2) * 10])
    >>> c = kmeans_plusplus(x, 2, torch.Generator().manual_seed(0))
    >>> sorted(c[:, 0].tolist())
    [0.0, 10.0]
    """
    scale = _power_of_two_scale(x)
    return _seedings(x / scale, n_clusters, generator, 1, n_trials, weight)[0] * scale


def _seedings(
    x: torch.Tensor,
    n_clusters: int,
    generator: torch.Generator,
    runs: int,
    n_trials: int | None = None,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """``runs`` independent greedy k-means++ seedings of ``x`` at once (:func:`kmeans_plusplus`), ``(runs, K, D)``:
    each step draws every run's candidates from that run's potential, and the distances of all the runs'
    candidates are one matrix product."""
    n = x.shape[0]
    trials = n_trials if n_trials is not None else 2 + int(math.log(n_clusters))
    x_sq = x.square().sum(1)
    unit_mass = None if weight is None else sampling_mass(weight)
    mass = None if unit_mass is None else unit_mass.to(dtype=x.dtype, device=x.device)
    every_run = torch.arange(runs, device=x.device)
    chosen = [_draw(unit_mass, n, runs, generator).to(x.device)]
    closest = _squared_distances(x, x[chosen[0]], x_sq).T  # (runs, N)
    for _ in range(1, n_clusters):
        potential = closest if mass is None else closest * mass
        # a run whose every point already coincides with a centre draws at random (in proportion to the weights)
        fallback = torch.ones_like(potential) if mass is None else mass.expand_as(potential)
        potential = torch.where(potential.sum(1, keepdim=True) > 0, potential, fallback)
        candidates = torch.multinomial(potential.cpu(), trials, replacement=True, generator=generator).to(x.device)
        distances = _squared_distances(x, x[candidates.reshape(-1)], x_sq).T.reshape(runs, trials, n)
        updated = torch.minimum(closest[:, None, :], distances)
        best = (updated.sum(2) if mass is None else updated @ mass).argmin(1)
        chosen.append(candidates[every_run, best])
        closest = updated[every_run, best]
    return x[torch.stack(chosen, dim=1)]


def _draw(weight: torch.Tensor | None, n: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """``size`` row indices drawn with replacement: uniformly, or in proportion to ``weight`` (a
    :func:`sampling_mass`)."""
    if weight is None:
        return torch.randint(n, (size,), generator=generator)
    return torch.multinomial(weight.cpu(), size, replacement=True, generator=generator)


def sampling_mass(weight: torch.Tensor) -> torch.Tensor:
    """Row weights as the k-means start draws with them: in float64, divided by the power of two at their largest.

    The division is exact, so the draws are the same for ``weight`` and ``2^j weight`` (and, up to rounding, for
    any ``c * weight``), and no weight of any finite scale overflows or underflows the probabilities (float32
    weights of 1e39 or all of 1e-50 would). A weight that is negative or not finite, or none positive, is a
    ``ValueError`` naming ``sample_weight``.

    Examples
    --------
    >>> sampling_mass(torch.tensor([3e300, 1e300], dtype=torch.float64)).tolist()[1] < 1
    True
    >>> sampling_mass(torch.tensor([4.0, 1.0])).tolist()
    [0.5, 0.125]
    """
    mass = weight.detach().to(torch.float64)
    largest = float(mass.max()) if mass.numel() else 0.0
    if not (math.isfinite(largest) and largest > 0 and bool((mass >= 0).all())):
        raise ValueError(
            "sample_weight must be finite and non-negative with a positive entry for the k-means start; "
            f"got weights whose largest is {largest}"
        )
    return mass / 2.0 ** math.frexp(largest)[1]


def kmeans(
    x: torch.Tensor,
    n_clusters: int,
    generator: torch.Generator,
    max_iter: int = 100,
    n_init: int = 1,
    sample_size: int | None = None,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy k-means++ seeding and Lloyd iterations until the assignment is stable.

    With ``n_init > 1`` the run with the lowest within-cluster sum of squares is
    kept. With ``sample_size`` and more rows than that, seeding and Lloyd run on
    ``sample_size`` rows drawn at random (with replacement) and every row of ``x`` is then
    assigned to its nearest centre: the cost no longer grows with ``N`` beyond that one
    pass, and the centres are those of the sample (as good as the full data's for a start
    of EM when the sample holds enough points of every cluster). Returns the centres
    ``(K, D)`` and the hard assignment of every row ``(N,)``. Empty clusters keep their
    previous centre. With row weights ``(N,)`` (``sample_weight``: non-negative, not all zero) the
    rows k-means runs on are a resample of the weighted rows (``sample_size`` of them, or ``N``), drawn
    in proportion to the weights: a row of weight zero is never a centre, and an integer weight
    counts as that many copies of the row.

    Examples
    --------
    >>> import torch
    >>> x = torch.cat([torch.zeros(5, 2), torch.ones(5, 2) * 10])
    >>> centres, labels = kmeans(x, 2, torch.Generator().manual_seed(0), n_init=2)
    >>> int(labels[0] != labels[-1])
    1
    >>> big = torch.cat([torch.zeros(5000, 2), torch.ones(5000, 2) * 10])
    >>> _, labels = kmeans(big, 2, torch.Generator().manual_seed(0), sample_size=100)
    >>> int(labels[:5000].unique().numel() == 1 and labels[0] != labels[-1])
    1
    """
    n = x.shape[0]
    sampled = weight is not None or (sample_size is not None and n > sample_size)
    size = n if sample_size is None else sample_size
    mass = None if weight is None else sampling_mass(weight)
    fit_rows = x[_draw(mass, n, size, generator).to(x.device)] if sampled else x
    scale = _power_of_two_scale(fit_rows)
    fit_rows = fit_rows / scale
    centres, labels, inertia = _lloyd(fit_rows, _seedings(fit_rows, n_clusters, generator, n_init), max_iter)
    best = 0
    for run in range(1, n_init):  # the first of equals: the same run on every device
        if beats(-inertia[run], -inertia[best], fit_rows.dtype):
            best = run
    centres = centres[best] * scale
    return centres, nearest_centre(x, centres) if sampled else labels[best]


def start_sample_size(n_clusters: int) -> int:
    """Rows of the subsample that a k-means start of EM runs on: ``max(START_SAMPLE_ROWS,
    START_ROWS_PER_COMPONENT * K)``.

    Examples
    --------
    >>> start_sample_size(4), start_sample_size(100)
    (1000, 25000)
    """
    return max(START_SAMPLE_ROWS, START_ROWS_PER_COMPONENT * int(n_clusters))


def kmeans_start(
    x: torch.Tensor,
    n_clusters: int,
    generator: torch.Generator,
    runs: int | None = None,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k-means start of EM: ``runs`` (default :data:`START_RUNS`) runs of greedy k-means++ and Lloyd
    on a random subsample of :func:`start_sample_size` rows (all rows when there are fewer), the best by
    inertia, and every row assigned to its nearest centre. Returns the centres and the assignment.
    Row ``weight`` (``sample_weight``) makes the subsample a weighted resample (:func:`kmeans`).

    A start needs centres, not a converged k-means of every row: the cost is one pass over
    ``x`` beyond a fixed amount of work, and the final log-likelihood after EM is that of
    full-data k-means starts (``benchmarks/bench_gmm_start.py``).

    Examples
    --------
    >>> x = torch.cat([torch.zeros(20, 2), torch.full((20, 2), 9.0)])
    >>> _, labels = kmeans_start(x, 2, torch.Generator().manual_seed(0))
    >>> int(labels[0] != labels[-1])
    1
    """
    runs = START_RUNS if runs is None else runs
    return kmeans(x, n_clusters, generator, n_init=runs, sample_size=start_sample_size(n_clusters), weight=weight)


def _lloyd_threshold(x: torch.Tensor) -> float:
    """:data:`LLOYD_TOL` times the mean feature variance of ``x`` (scikit-learn's ``KMeans`` criterion)."""
    return LLOYD_TOL * float(column_variance(x, correction=1).mean()) if x.shape[0] > 1 else 0.0


def _lloyd(
    x: torch.Tensor, seeds: torch.Tensor, max_iter: int, threshold: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Lloyd iterations of ``runs`` k-means runs at once from their seedings ``(runs, K, D)``, each until its
    assignment is stable or its centres move less than ``threshold`` (squared distance, summed over centres;
    default :func:`_lloyd_threshold` of ``x``). Returns every run's centres ``(runs, K, D)``, assignment
    ``(runs, N)`` and inertia.

    A pass over the batch of runs is two matrix products: the cluster sums, the one-hot assignments
    ``(runs K, N)`` times ``x``, and the scores of every centre against every row (:func:`_run_labels`). A run
    that stops keeps its state, as if it had run alone: it stays in the batch, frozen, until half the batch has
    stopped, and then the batch is gathered anew (a few gathers in all, not a gather and a scatter per pass)."""
    n = x.shape[0]
    threshold = _lloyd_threshold(x) if threshold is None else threshold
    x_t = x.T
    state = [seeds, _run_labels(x_t, seeds)]  # the batch's centres and assignments
    final = [value.clone() for value in state]
    batch = torch.arange(seeds.shape[0], device=x.device)  # the runs in the batch
    live, everyone = torch.ones_like(batch, dtype=torch.bool), True  # the runs of the batch still moving; all?
    for _ in range(max_iter):
        centres, labels = state
        runs, k, d = centres.shape
        one_hot = x.new_zeros(runs, k, n).scatter_(1, labels.unsqueeze(1), 1.0)
        counts = one_hot.sum(2, keepdim=True)
        # an empty cluster (0 / 0) keeps its centre
        new = torch.where(counts > 0, torch.mm(one_hot.view(runs * k, n), x).view(runs, k, d) / counts, centres)
        shift = (new - centres).square().sum((1, 2))
        new_labels = _run_labels(x_t, new)
        moved = (new_labels != labels).any(1) & (shift > threshold)
        if everyone:
            state = [new, new_labels]
        else:
            state = [torch.where(_mask(live, new), new, centres), torch.where(live[:, None], new_labels, labels)]
        live = moved if everyone else live & moved
        remaining = int(live.sum())
        if 2 * remaining <= batch.numel():  # half the batch has stopped: keep the stopped runs, go on with the rest
            for value, store in zip(state, final):
                store[batch] = value
            batch, state, live = batch[live], [value[live] for value in state], live[live]
        everyone = remaining == batch.numel()  # no run in the batch frozen: no masking on the next pass
        if not remaining:
            break
    for value, store in zip(state, final):
        store[batch] = value
    return final[0], final[1], _inertia(x, final[0], final[1])


def _inertia(x: torch.Tensor, centres: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Every run's within-cluster sum of squares, from its centres ``(runs, K, D)`` and assignment ``(runs, N)``."""
    runs, k, d = centres.shape
    scores = _centre_scores(x, centres.reshape(runs * k, d)).view(runs, k, -1).gather(1, labels.unsqueeze(1))
    return (scores.squeeze(1) + x.square().sum(1)).clamp_min(0.0).sum(1).tolist()


def _mask(live: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The runs' mask ``(runs,)`` shaped to select whole runs of ``like`` ``(runs, ...)``."""
    return live.view(-1, *([1] * (like.dim() - 1)))


def _run_labels(x_t: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """For every run's centres ``(runs, K, D)``: each row's nearest centre ``(runs, N)``, by the scores ``|c|^2 - 2 c
    . x`` (the squared distance less ``|x|^2``) of every centre against the rows (columns of ``x_t`` ``(D, N)``);
    one matrix product."""
    runs, n_clusters, d = centres.shape
    flat = centres.reshape(runs * n_clusters, d)
    return _centre_scores(x_t.T, flat).view(runs, n_clusters, -1).min(dim=1).indices
