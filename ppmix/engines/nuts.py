"""A No-U-Turn sampler vectorised over chains: every chain advances in one batched potential-and-gradient call.

The sampler of Hoffman & Gelman (2014) with the multinomial choice of the next state among the trajectory's points
(Betancourt 2017, "A Conceptual Introduction to Hamiltonian Monte Carlo", as Stan samples): a trajectory doubles in
a random direction until its ends turn back towards each other (the generalised criterion ``rho . M^{-1} r > 0`` at
both ends, ``rho`` the sum of the momenta), a sub-trajectory turns back, a step diverges (the Hamiltonian rises by
more than :data:`MAX_ENERGY_ERROR`) or the depth reaches ``max_tree_depth``. Within a new sub-trajectory the
candidate is drawn with probability proportional to ``exp(-H)`` of each point; the sub-trajectory's candidate
replaces the current one with probability ``min(1, w_new / w_old)`` (biased progressive sampling, favouring the
far end). A sub-trajectory that diverges or turns back is discarded whole.

**Vectorised over chains.** The chains are the rows of a ``(C, P)`` tensor. A doubling builds its ``2^j`` new points
one leapfrog step at a time, every chain at once (one call of the batched potential per step); a chain whose
trajectory has stopped is masked (its row is evaluated at its start and ignored), so an iteration costs the
leapfrog steps of its longest chain. The U-turn checks of the sub-trajectories ending at step ``n`` of a doubling
(those of size ``2^m`` with ``2^m`` dividing ``n + 1``) use the momentum at their first point and prefix sums of the
momenta, kept per level.

**Adaptation** (Stan's schedule, per chain, from a diagonal metric of the potential's curvature at the start,
:func:`curvature_metric`, not the identity): the step size by dual averaging (Nesterov 2009 as Hoffman & Gelman
use it: target ``target_accept_prob``, ``gamma = 0.05``, ``t0 = 10``, ``kappa = 0.75``, restarted at
``mu = log(10 eps)``), the diagonal inverse mass matrix from the variance of the draws in windows of doubling size
after an initial buffer of 75 iterations and before a final buffer of 50 (15% / 10% of short warmups), each
variance shrunk towards ``1e-3`` as Stan does (weight ``5 / (n + 5)``); after every window the step size is found
anew (doubled or halved until one step's acceptance crosses 0.8) and the dual averaging restarted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

__all__ = ["MAX_ENERGY_ERROR", "NutsDraws", "adaptation_windows", "curvature_metric", "sample_nuts"]

#: a leapfrog step whose Hamiltonian exceeds the trajectory's starting energy by more than this diverges
MAX_ENERGY_ERROR = 1000.0

#: the relative step of :func:`curvature_metric`'s differences
CURVATURE_STEP = 1e-4

#: ``(C, P) -> ((C,) potential, (C, P) gradient)``
PotentialAndGradient = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class NutsDraws:
    """The kept draws ``(C, S, P)`` in the unconstrained space and their statistics ``{name: (C, S)}`` (ArviZ's
    ``sample_stats`` names: ``lp``, ``energy``, ``diverging``, ``n_steps``, ``tree_depth``, ``step_size``,
    ``acceptance_rate``)."""

    samples: torch.Tensor
    stats: dict[str, np.ndarray]


@dataclass
class _State:
    """Each chain's current point: position, gradient and potential."""

    z: torch.Tensor
    grad: torch.Tensor
    potential: torch.Tensor


@dataclass
class _Transition:
    """What one NUTS iteration returns per chain."""

    state: _State
    energy: torch.Tensor
    n_steps: torch.Tensor
    depth: torch.Tensor
    accept: torch.Tensor
    diverging: torch.Tensor


class _DualAveraging:
    """Per-chain dual averaging of ``log(step size)`` towards an acceptance target (Hoffman & Gelman 2014, Alg. 5)."""

    def __init__(self, step_size: torch.Tensor, target: float) -> None:
        self.target = target
        self.restart(step_size)

    def restart(self, step_size: torch.Tensor) -> None:
        self.mu = torch.log(10 * step_size)
        self.t = 0
        self.h_bar = torch.zeros_like(step_size)
        self.log_eps_bar = torch.zeros_like(step_size)

    def update(self, accept: torch.Tensor) -> torch.Tensor:
        """Record one iteration's mean acceptance; the step size to use next."""
        self.t += 1
        eta = 1.0 / (self.t + 10.0)
        self.h_bar = (1 - eta) * self.h_bar + eta * (self.target - accept)
        log_eps = self.mu - math.sqrt(self.t) / 0.05 * self.h_bar
        weight = self.t**-0.75
        self.log_eps_bar = weight * log_eps + (1 - weight) * self.log_eps_bar
        return log_eps.exp()

    def final(self) -> torch.Tensor:
        """The averaged step size, kept for sampling."""
        return self.log_eps_bar.exp()


def adaptation_windows(warmup: int) -> list[tuple[int, int]]:
    """The windows ``[start, end)`` of warmup iterations whose draws estimate the mass matrix (Stan's schedule).

    Examples
    --------
    >>> adaptation_windows(1000)
    [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    >>> adaptation_windows(100)  # short: 15% initial buffer, 10% final buffer
    [(15, 90)]
    >>> adaptation_windows(10)
    []
    """
    init, term, base = 75, 50, 25
    if warmup < 20:
        return []
    if init + term + base > warmup:
        init, term = int(0.15 * warmup), int(0.1 * warmup)
        base = warmup - init - term
    ends, start, size = [], init, base
    last = warmup - term
    while start + size <= last:
        end = start + size
        if end + 2 * size > last:
            end = last
        ends.append((start, end))
        start, size = end, 2 * size
    return ends


def _kinetic(r: torch.Tensor, inv_mass: torch.Tensor) -> torch.Tensor:
    return 0.5 * (inv_mass * r * r).sum(-1)


Check = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _turn_dots(checks: list[Check], inv_mass: torch.Tensor) -> torch.Tensor:
    """``rho . M^{-1} r`` ``(2, K, C)`` at the start (``[0]``) and the end (``[1]``) of each of the ``K`` checks
    ``(rho, r_start, r_end)``, formed and summed in one batched pass: each ``(C,)`` row is bit for bit the sum
    ``(rho * inv_mass * r).sum(-1)`` of its own ``(C, P)`` product."""
    rhos, starts, ends = zip(*checks)
    weighted = torch.stack(rhos) * inv_mass
    return (weighted * torch.stack(starts + ends).unflatten(0, (2, len(checks)))).sum(-1)


def _any_turned(checks: list[Check], inv_mass: torch.Tensor) -> torch.Tensor:
    """Whether the generalised no-U-turn criterion fails for any of the ``checks``, per chain: a trajectory with
    momentum sum ``rho`` turns back at an end, ``rho . M^{-1} r <= 0`` (:func:`_turn_dots`)."""
    return (_turn_dots(checks, inv_mass) <= 0).flatten(0, 1).any(0)


class _Sampler:
    """One run's batched NUTS: the potential, the per-chain metric and step sizes, the random stream."""

    def __init__(
        self, fn: PotentialAndGradient, inv_mass: torch.Tensor, max_tree_depth: int, generator: torch.Generator
    ) -> None:
        self.fn, self.inv_mass, self.max_tree_depth, self.generator = fn, inv_mass, max_tree_depth, generator
        self.step_size = torch.ones(inv_mass.shape[0], dtype=inv_mass.dtype)

    def _uniform(self, like: torch.Tensor) -> torch.Tensor:
        return torch.rand(like.shape[0], dtype=like.dtype, generator=self.generator)

    def _momentum(self, z: torch.Tensor) -> torch.Tensor:
        return torch.randn(z.shape, dtype=z.dtype, generator=self.generator) / self.inv_mass.sqrt()

    def _steps(self, forward: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The half step ``eps / 2`` ``(C, 1)`` and the position step ``eps M^{-1}`` ``(C, P)`` of every chain's
        signed step size ``eps`` (backwards where ``forward`` is False)."""
        eps = self.step_size if forward is None else torch.where(forward, self.step_size, -self.step_size)
        eps = eps[:, None]
        return 0.5 * eps, eps * self.inv_mass

    def _leapfrog(self, z, r, grad, steps, fallback, moving, every):
        """One leapfrog step of the ``moving`` chains (``every``: all of them), ``steps`` from :meth:`_steps`; the
        others, and those whose new position is not finite, are evaluated at ``fallback`` (the latter's potential
        then NaN: a divergence)."""
        half, step = steps
        r = r - half * grad
        z = z + step * r
        # a finite sum has finite terms (one reduction); an overflowing one falls back to the exact test
        finite = None if math.isfinite(z.sum()) else torch.isfinite(z).all(-1)
        if every and finite is None:
            point = z
        else:
            evaluate = moving if finite is None else finite & moving
            point = torch.where(evaluate[:, None], z, fallback)
        potential, grad_new = self.fn(point)
        if finite is not None:
            potential = torch.where(finite, potential, torch.full_like(potential, float("nan")))
        return z, r - half * grad_new, grad_new, potential

    def find_step_size(self, state: _State) -> None:
        """Double or halve each chain's step size until one leapfrog step's acceptance crosses 0.8 (Stan)."""
        log_target = math.log(0.8)
        direction = None
        going = torch.ones_like(self.step_size, dtype=torch.bool)
        every = True
        for _ in range(60):
            r = self._momentum(state.z)
            h0 = state.potential + _kinetic(r, self.inv_mass)
            _, r1, _, u1 = self._leapfrog(state.z, r, state.grad, self._steps(None), state.z, going, every)
            delta = h0 - (u1 + _kinetic(r1, self.inv_mass))
            delta = torch.nan_to_num(delta, nan=-math.inf)
            up = delta > log_target
            if direction is None:
                direction = up
            going = going & (up == direction)
            every = bool(going.all())
            if not every and not bool(going.any()):
                return
            factor = torch.where(direction, 2.0, 0.5).to(self.step_size.dtype)
            self.step_size = torch.where(going, self.step_size * factor, self.step_size)

    def transition(self, state: _State) -> _Transition:
        """One NUTS iteration of every chain from ``state``."""
        chains = state.z.shape[0]
        r0 = self._momentum(state.z)
        h0 = state.potential + _kinetic(r0, self.inv_mass)
        ends = dict.fromkeys(("left", "right"), torch.stack([state.z, r0, state.grad], 1))  # (C, 3, P) each
        proposal = _State(state.z, state.grad, state.potential)
        log_weight = torch.zeros_like(h0)
        rho = r0.clone()
        done = torch.zeros(chains, dtype=torch.bool)
        depth = torch.zeros(chains, dtype=torch.long)
        counts = {"n": torch.zeros_like(h0), "accept": torch.zeros_like(h0)}
        diverging = torch.zeros(chains, dtype=torch.bool)
        for j in range(self.max_tree_depth):
            active = ~done
            if not bool(active.any()):
                break
            forward = self._uniform(h0) < 0.5
            start = torch.where(forward[:, None, None], ends["right"], ends["left"])
            sub = self._subtree(start.unbind(1), forward, j, active, h0, state.z, counts)
            diverging |= sub["diverged"]
            merge = active & ~sub["failed"]
            near, far = start[:, 1], torch.where(forward[:, None], ends["left"][:, 1], ends["right"][:, 1])
            checks = [(rho + sub["first"], far, sub["first"]), (near + sub["rho"], near, sub["end"][:, 1])]
            for side, mask in (("right", merge & forward), ("left", merge & ~forward)):
                ends[side] = torch.where(mask[:, None, None], sub["end"], ends[side])
            take = merge & (self._uniform(h0).log() < sub["log_weight"] - log_weight)
            picked = take[:, None]
            proposal = _State(torch.where(picked, sub["proposal"][0], proposal.z),
                              torch.where(picked, sub["proposal"][1], proposal.grad),
                              torch.where(take, sub["proposal"][2], proposal.potential))  # fmt: skip
            log_weight = torch.where(merge, torch.logaddexp(log_weight, sub["log_weight"]), log_weight)
            rho = torch.where(merge[:, None], rho + sub["rho"], rho)
            depth = torch.where(active, j + 1, depth)
            turned = _any_turned([*checks, (rho, ends["left"][:, 1], ends["right"][:, 1])], self.inv_mass)
            done = done | (active & sub["failed"]) | (merge & turned)
        accept = counts["accept"] / counts["n"].clamp(min=1)
        return _Transition(proposal, h0, counts["n"], depth, accept, diverging)

    def _subtree(self, start, forward, j, active, h0, fallback, counts) -> dict:
        """Build ``2^j`` new points from ``start`` in each chain's direction, masked to the ``active`` chains.

        A chain that stops keeps moving with the others, evaluated at ``fallback``: its values from then on are
        never read (every later use is masked by ``building``, and the caller keeps only the sub-trajectories of the
        chains that never stopped). ``every``: all the chains are still building (the counts need no mask)."""
        z, r, grad = start
        steps = self._steps(forward)
        log_weight = torch.full_like(h0, -math.inf)
        proposal = [z, grad, torch.zeros_like(h0)]
        building, failed, diverged = active, torch.zeros_like(active), torch.zeros_like(active)
        every = bool(active.all())
        prefix, previous = torch.zeros_like(z), r
        marks: dict[int, tuple[torch.Tensor, ...]] = {}
        for n in range(2**j):
            z, r, grad, u_new = self._leapfrog(z, r, grad, steps, fallback, building, every)
            delta = torch.nan_to_num(h0 - (u_new + _kinetic(r, self.inv_mass)), nan=-math.inf)
            diverges = building & (delta < -MAX_ENERGY_ERROR)
            gain = delta.clamp(max=0.0).exp()
            if every:
                counts["n"] += 1
                counts["accept"] += gain
            else:
                counts["n"] += building.to(delta.dtype)
                counts["accept"] += torch.where(building, gain, 0.0)
            keep = building & ~diverges
            new_weight = torch.logaddexp(log_weight, delta)
            take = keep & (self._uniform(h0).log() < delta - new_weight)
            picked = take[:, None]
            proposal = [torch.where(picked, z, proposal[0]), torch.where(picked, grad, proposal[1]),
                        torch.where(take, u_new, proposal[2])]  # fmt: skip
            log_weight = torch.where(keep, new_weight, log_weight)
            before, prefix = prefix, prefix + r
            checks = _subtree_checks(n, j, r, prefix, before, previous, marks)
            previous = r
            stop = building & (diverges | _any_turned(checks, self.inv_mass)) if checks else diverges
            if bool(stop.any()):
                diverged |= diverges
                failed |= stop
                building, every = building & ~stop, False
                if not bool(building.any()):
                    break
        return {
            "first": marks[0][0],
            "end": torch.stack([z, r, grad], 1),
            "proposal": proposal,
            "log_weight": log_weight,
            "rho": prefix,
            "failed": failed,
            "diverged": diverged,
        }


def _subtree_checks(n, j, r, prefix, before, previous, marks) -> list[Check]:
    """The U-turn checks ``(rho, r_start, r_end)`` (:func:`_any_turned`) of the sub-trajectories ending at step ``n``
    of a doubling of depth ``j``: those of size ``2^m`` dividing ``n + 1``, each checked whole and across its halves
    (Stan's extra checks: the first half with the second's first point, the first's last point with the second
    half). ``marks[m]`` holds, for the latest block of size ``2^m``, its first momentum, the momentum sum before it
    and the momentum before it; ``before`` and ``previous`` are the momentum sum and the momentum before step ``n``."""
    for m in range(j + 1):
        if n % 2**m:
            break
        marks[m] = (r, before, previous)
    checks = []
    for m in range(1, j + 1):
        if (n + 1) % 2**m:
            break
        first, sum_before, _ = marks[m]
        checks.append((prefix - sum_before, first, r))
        if m >= 2:
            half_first, half_before, half_previous = marks[m - 1]
            checks.append((half_before + half_first - sum_before, first, half_first))
            checks.append((prefix - half_before + half_previous, half_previous, r))
    return checks


def curvature_metric(fn: PotentialAndGradient, z: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The first inverse mass matrix ``(C, P)``: ``1 / U''_ii`` at each chain's start, the potential's curvature
    along every coordinate by a forward difference of its gradient (one batched call per coordinate, of step
    :data:`CURVATURE_STEP` times the coordinate's size), 1 where it is not positive and finite.

    At a start near a mode this is the posterior's scale in every coordinate, which the identity is not (a location
    in the data's units beside a log scale): the early trajectories, before the first adaptation window ends, then
    take a few steps instead of hundreds.

    Examples
    --------
    >>> import torch
    >>> def normal(z):  # variances 4 and 0.01
    ...     scales = torch.tensor([2.0, 0.1], dtype=z.dtype)
    ...     return 0.5 * ((z / scales) ** 2).sum(-1), z / scales**2
    >>> z = torch.zeros(1, 2, dtype=torch.float64)
    >>> curvature_metric(normal, z, normal(z)[1]).round(decimals=4)
    tensor([[4.0000, 0.0100]], dtype=torch.float64)
    """
    inv_mass = torch.ones_like(z)
    for i in range(z.shape[1]):
        step = CURVATURE_STEP * z[:, i].abs().clamp(min=1.0)
        moved = z.clone()
        moved[:, i] += step
        _, grad_moved = fn(moved)
        curvature = (grad_moved[:, i] - grad[:, i]) / step
        usable = torch.isfinite(curvature) & (curvature > 0)
        inv_mass[:, i] = torch.where(usable, 1 / curvature.clamp(min=torch.finfo(z.dtype).tiny), inv_mass[:, i])
    return inv_mass


class _Welford:
    """Per-chain running mean and variance of the positions in an adaptation window."""

    def __init__(self, like: torch.Tensor) -> None:
        self.n, self.mean, self.m2 = 0, torch.zeros_like(like), torch.zeros_like(like)

    def add(self, z: torch.Tensor) -> None:
        self.n += 1
        delta = z - self.mean
        self.mean = self.mean + delta / self.n
        self.m2 = self.m2 + delta * (z - self.mean)

    def inverse_mass(self) -> torch.Tensor:
        """The window's variances, shrunk towards ``1e-3`` (Stan's regularisation)."""
        n = self.n
        variance = self.m2 / max(n - 1, 1)
        return (n / (n + 5.0)) * variance + 1e-3 * (5.0 / (n + 5.0))


def sample_nuts(
    fn: PotentialAndGradient,
    initial: torch.Tensor,
    *,
    num_samples: int,
    warmup_steps: int,
    generator: torch.Generator,
    target_accept_prob: float = 0.8,
    max_tree_depth: int = 10,
    progress: Callable[[int], None] | None = None,
) -> NutsDraws:
    """Run NUTS on every chain at once (module notes): ``warmup_steps`` adapting iterations, then ``num_samples``
    kept ones.

    Parameters
    ----------
    fn : callable
        ``z (C, P) -> (potential (C,), gradient (C, P))``: the potential energy of every chain's position and its
        gradient (NaN or ``inf`` where undefined: a divergence).
    initial : Tensor
        ``(C, P)`` starting positions (finite potential).
    num_samples, warmup_steps : int
        Kept and adapting iterations per chain.
    generator : torch.Generator
        The random stream (the run is a function of it).
    target_accept_prob : float, default 0.8
        The dual averaging's target mean acceptance.
    max_tree_depth : int, default 10
        The most doublings of a trajectory (``2^max_tree_depth - 1`` leapfrog steps).
    progress : callable, optional
        Called with the iteration number after every iteration.

    Returns
    -------
    NutsDraws

    Examples
    --------
    >>> import torch
    >>> def normal(z):  # a standard normal in 2 dimensions
    ...     return 0.5 * (z * z).sum(-1), z
    >>> draws = sample_nuts(normal, torch.zeros(4, 2, dtype=torch.float64), num_samples=300, warmup_steps=200,
    ...                     generator=torch.Generator().manual_seed(0))
    >>> tuple(draws.samples.shape), bool(abs(draws.samples.mean()) < 0.15)
    ((4, 300, 2), True)
    """
    z = initial.detach().clone()
    potential, grad = fn(z)
    sampler = _Sampler(fn, curvature_metric(fn, z, grad), max_tree_depth, generator)
    state = _State(z, grad, potential)
    sampler.find_step_size(state)
    averaging = _DualAveraging(sampler.step_size, target_accept_prob)
    windows, window = adaptation_windows(warmup_steps), _Welford(z)
    ends = {end for _, end in windows}
    kept_z, kept_stats = [], []
    for it in range(warmup_steps + num_samples):
        step_size = sampler.step_size
        step = sampler.transition(state)
        state = step.state
        if it < warmup_steps:
            sampler.step_size = averaging.update(step.accept)
            if any(start <= it < end for start, end in windows):
                window.add(state.z)
            if it + 1 in ends:
                sampler.inv_mass = window.inverse_mass()
                window = _Welford(state.z)
                sampler.find_step_size(state)
                averaging.restart(sampler.step_size)
            if it + 1 == warmup_steps:
                sampler.step_size = averaging.final()
        else:
            kept_z.append(state.z)
            kept_stats.append(
                (-state.potential, step.energy, step.diverging, step.n_steps, step.depth, step_size, step.accept)
            )
        if progress is not None:
            progress(it)
    return NutsDraws(torch.stack(kept_z, dim=1), _stack_stats(kept_stats))


def _stack_stats(rows: list[tuple[torch.Tensor, ...]]) -> dict[str, np.ndarray]:
    names = ("lp", "energy", "diverging", "n_steps", "tree_depth", "step_size", "acceptance_rate")
    kinds = (np.float64, np.float64, bool, np.int64, np.int64, np.float64, np.float64)
    return {
        name: np.stack([row[i].detach().cpu().numpy() for row in rows], axis=1).astype(kind)
        for i, (name, kind) in enumerate(zip(names, kinds))
    }
