"""The MCMC engine: NUTS over the continuous globals, discrete latents summed out (ppmix's NUTS vectorised over
chains on the model's own potential where it has one, Pyro's NUTS kernel otherwise)."""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.autoguide import init_to_median, init_to_value
from pyro.infer.mcmc.util import initialize_model
from tqdm.auto import tqdm

from ppmix._validation import check_positive_int
from ppmix.engines.chain_starts import chain_starts, warn_single_chain
from ppmix.engines.draws import RHAT_THRESHOLD, ChainsDisagreeWarning, keep_draws
from ppmix.engines.nuts import sample_nuts
from ppmix.engines.params import local_params
from ppmix.engines.potential import FlatPotential, LikelihoodPotential, likelihood_potential
from ppmix.engines.result import FitResult

if TYPE_CHECKING:
    from ppmix.models.base import MixtureModel

__all__ = ["run_mcmc", "ChainsDisagreeWarning", "RHAT_THRESHOLD", "SAMPLE_STATS"]

logger = logging.getLogger(__name__)

#: the statistics NUTS records for every kept draw, named as ArviZ's ``sample_stats`` group names them
SAMPLE_STATS = ("lp", "energy", "diverging", "n_steps", "tree_depth", "step_size", "acceptance_rate")

#: the NUTS implementations ``run_mcmc(sampler=...)`` chooses between
SAMPLERS = ("auto", "ppmix", "pyro")

#: ppmix's NUTS draws its random numbers from ``model._generator(NUTS_SEED_OFFSET)``
NUTS_SEED_OFFSET = 7877


class _RecordingNUTS(NUTS):
    """Pyro's NUTS, recording for every kept draw the statistics of ArviZ's ``sample_stats`` group.

    Pyro's MCMC keeps no per-draw statistics; this kernel notes them as its transitions run and returns
    them with its end-of-chain :meth:`diagnostics` (the dict Pyro sends back from a chain's worker process),
    so they reach :func:`run_mcmc` whether the chains ran in this process or in others:

    - ``energy``: the Hamiltonian at the start of the transition, after the momentum is drawn (what
      ``az.bfmi`` and ``az.plot_energy`` compare between transitions);
    - ``lp``: the log density of the kept state in the unconstrained space (minus NUTS's potential energy,
      the log joint of the program plus the log-Jacobian of the transforms, as Stan's ``lp__``);
    - ``n_steps``: the leapfrog steps of the transition; ``tree_depth``: ``floor(log2(n_steps)) + 1``
      (ArviZ's rule for NumPyro); ``acceptance_rate``: the mean acceptance probability over those steps;
      ``diverging``: whether a step diverged; ``step_size``: the step size used.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pid = os.getpid()

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        if os.getpid() != self._pid:
            # a chain in a worker process Pyro forked: torch's intra-op thread pool does not survive a fork (the
            # chain's first parallel operation hangs), and the chains are the parallelism here
            torch.set_num_threads(1)
        super().setup(warmup_steps, *args, **kwargs)
        self._kept: list[tuple[float, ...]] = []

    def sample(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self._energy, self._steps, self._accept, self._diverged = float("nan"), 0, 0.0, False
        step_size = float(self.step_size)
        z = super().sample(params)
        if self._t > self._warmup_steps:
            lp = -float(self._fetch_from_cache()[1])
            accept = self._accept / self._steps if self._steps else float("nan")
            self._kept.append((lp, self._energy, self._diverged, self._steps, step_size, accept))
        return z

    def _sample_r(self, name: str) -> tuple[dict, dict]:
        r, r_unscaled = super()._sample_r(name)
        self._energy = float(self._kinetic_energy(r_unscaled) + self._fetch_from_cache()[1])
        return r, r_unscaled

    def _build_basetree(self, *args: Any) -> Any:
        leaf = super()._build_basetree(*args)  # one leapfrog step
        self._steps += 1
        self._accept += float(leaf.sum_accept_probs)
        self._diverged = self._diverged or bool(leaf.diverging)
        return leaf

    def diagnostics(self) -> dict[str, Any]:
        kept = np.array(self._kept, dtype=np.float64).reshape(-1, 6)
        lp, energy, diverging, n_steps, step_size, accept = kept.T
        stats = {
            "lp": lp,
            "energy": energy,
            "diverging": diverging.astype(bool),
            "n_steps": n_steps.astype(np.int64),
            "tree_depth": np.floor(np.log2(np.maximum(n_steps, 1))).astype(np.int64) + 1,
            "step_size": step_size,
            "acceptance_rate": accept,
        }
        return {**super().diagnostics(), "sample_stats": stats}


def run_mcmc(
    model: "MixtureModel",
    data: Any,
    *,
    num_samples: int = 200,
    warmup_steps: int = 200,
    num_chains: int = 2,
    target_accept_prob: float = 0.8,
    max_tree_depth: int = 8,
    relabel: bool = True,
    jit_compile: bool = False,
    progress: bool | None = None,
    sampler: str = "auto",
) -> FitResult:
    """Sample the posterior of the global sites with NUTS.

    The model runs under :meth:`MixtureModel.bayesian` (proper priors); discrete
    latents are summed out by enumeration. Every chain starts at its own point
    (:func:`~ppmix.engines.chain_starts.chain_starts`: chain 0 at ``model._init_values``, the EM
    initialisation for models with EM, every other chain at an initialisation of its own seed; sites without
    a start at the median of a few prior draws, drawn anew for each chain), so chains in different modes of
    the posterior show in r_hat. The default is two chains; one chain warns
    (:class:`~ppmix.engines.chain_starts.SingleChainWarning`: r_hat is NaN). The draws are kept in
    ``model.mcmc_samples_`` (``{site: (chains, draws, ...)}``) and the point
    estimates are set to their posterior means; :meth:`MixtureModel.to_arviz`
    turns them into ``InferenceData``.

    **Label switching.** With ``relabel=True`` (default) the draws are relabelled
    before they are stored (:mod:`ppmix.engines.relabel`: per draw, the
    permutation of the components whose means best match a reference labelling, by a
    Hungarian assignment, then refined on all per-component sites, Stephens' 2000
    algorithm in Celeux's normalised form), so chains in swapped labellings agree and
    the posterior means do not average components. Every site with a component axis (named
    ``"component"`` in :meth:`~ppmix.models.base.MixtureModel._arviz_dims`, or, for
    sites it does not name, a plate of size ``K`` or a ``K``-simplex) is permuted.

    **The potential.** For ppmix's structures with EM (:class:`~ppmix.models.mixture.Mixture`,
    :class:`~ppmix.models.gmm.GMM`, :class:`~ppmix.models.hmm.HMM`: every family and covariance type) NUTS runs
    on the potential built from the model's own batched log-likelihood, the discrete latents summed out (one
    ``logsumexp`` for a mixture, the forward algorithm for an HMM), plus the
    priors and log-Jacobians of the program's global sites (:mod:`ppmix.engines.potential`; the program stays the
    definition: the two potentials are tested equal): no trace per leapfrog step. On it runs ppmix's own NUTS
    (:mod:`ppmix.engines.nuts`, ``sampler="auto"`` or ``"ppmix"``): every chain advances in one batched call of the
    potential and its gradient per leapfrog step (the priors and Jacobians broadcast over the chains, in closed
    form: :mod:`ppmix.engines.nuts_priors`; a mixture's components of every chain scored by one ``log_prob``, the
    gradient of the Gaussian and Student t families' log-likelihood in closed form,
    :mod:`ppmix.engines.potential_grads`; an HMM's scaled forward algorithm over every chain's sequences at once,
    its gradient from the backward recursion, :mod:`ppmix.engines.hmm_chains`), chains whose trajectory has stopped
    masked, with Stan's adaptation (dual averaging of the step size, a diagonal mass matrix from windows of the
    warmup) per chain, from a first diagonal metric of the potential's curvature at each chain's start.
    ``sampler="pyro"`` runs Pyro's NUTS kernel on the same potential instead (the path before; about 1 ms of Python
    per leapfrog step and chain). A program the hooks do not compute (a subclass writing its own
    ``model()``, a model without EM, a fit with known latents) runs Pyro's NUTS on the traced program, every
    leapfrog step tracing it with its discrete sites enumerated (about 10 ms of Python overhead whatever ``N``; an
    HMM's ``pyro.markov`` steps one by one); ``jit_compile=True`` compiles that traced potential with the PyTorch
    JIT (a few seconds once, then about twice as fast per step) and is ignored on the model's own potential.

    **Diagnostics.** ``model.mcmc_diagnostics_`` holds ``r_hat`` (the largest rank-
    normalised split r_hat per site after relabelling; NaN with one chain, as r_hat
    compares chains), ``r_hat_before_relabelling``, ``relabelled_fraction`` (draws
    whose labels changed) and ``divergences``; ``model.mcmc_sample_stats_`` the statistics of every draw
    (``{name: (chains, draws)}`` arrays named as ArviZ's ``sample_stats`` group names them, listed in
    :data:`SAMPLE_STATS`: ``lp``, ``energy``, ``diverging``, ``n_steps``, ``tree_depth``, ``step_size``,
    ``acceptance_rate``; :meth:`~ppmix.models.base.MixtureModel.to_arviz` puts them there, for
    ``az.bfmi`` and ``az.plot_energy``). With ``num_chains >= 2``, a
    :class:`ChainsDisagreeWarning` (a ``UserWarning``, through :func:`warnings.warn`)
    names the sites whose r_hat exceeds :data:`RHAT_THRESHOLD`. ppmix's NUTS runs the chains together in one
    process (an iteration costs the leapfrog steps of its longest chain, each step one batched call); Pyro's runs
    them in parallel processes (forked, one torch thread each) when the machine has more CPUs than chains,
    otherwise one after another, each chain costing as much as a single-chain run.

    Parameters
    ----------
    model : MixtureModel
        The model; usually called by ``model.fit(X, engine="mcmc")``.
    data : Any
        The data as the model's ``prepare_data`` returns it.
    num_samples : int, default 200
        Draws kept per chain.
    warmup_steps : int, default 200
        NUTS adaptation steps per chain.
    num_chains : int, default 1
        Chains (r_hat needs at least two).
    target_accept_prob : float, default 0.8
        NUTS's target acceptance probability.
    max_tree_depth : int, default 8
        NUTS's largest tree depth.
    relabel : bool, default True
        Relabel the draws against label switching (above).
    jit_compile : bool, default False
        Compile the potential with the PyTorch JIT (above).
    progress : bool, optional
        Show a progress bar; the model's ``progress`` by default.
    sampler : {"auto", "ppmix", "pyro"}, default "auto"
        ``"ppmix"``: ppmix's NUTS vectorised over chains (:mod:`ppmix.engines.nuts`: every chain advances in one
        batched call of the model's own potential per leapfrog step), for the models with that potential (above);
        ``"pyro"``: Pyro's NUTS kernel, the chains one after another or in processes; ``"auto"``: ppmix's where
        the model has its own potential, Pyro's otherwise. ``"ppmix"`` on a model without its own potential is a
        ``ValueError``.

    Returns
    -------
    FitResult
        Empty ``history``; ``n_iter`` is ``num_samples``.

    Examples
    --------
    >>> import torch
    >>> from ppmix import GMM
    >>> x = torch.cat([torch.randn(30, 1) - 3, torch.randn(30, 1) + 3])
    >>> gmm = GMM(2, seed=0, progress=False).fit(x, engine="mcmc", num_samples=10, warmup_steps=10)
    >>> gmm.mcmc_samples_["locs"].shape  # (chains, draws, K, D)
    torch.Size([2, 10, 2, 1])
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    warmup_steps = check_positive_int(warmup_steps, "warmup_steps")
    num_chains = check_positive_int(num_chains, "num_chains")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}; got {sampler!r}")
    show = model.progress if progress is None else progress
    warn_single_chain(num_chains, "mcmc")

    with local_params(), model.bayesian(), model._forked_rng():
        starts = chain_starts(model, data, num_chains, model._generator())
        potential = likelihood_potential(model, data) if starts[0] else None
        if sampler == "ppmix" and potential is None:
            raise ValueError(
                f"sampler='ppmix' needs the model's own potential, which {type(model).__name__} has not here (a "
                "program of its own, known latents or discrete globals); use sampler='pyro' or 'auto'"
            )
        settings = {"target_accept_prob": target_accept_prob, "max_tree_depth": max_tree_depth}
        if potential is not None and sampler != "pyro":
            samples, stats = _run_ppmix_nuts(model, potential, starts, num_samples, warmup_steps, show, settings)
        else:
            samples, stats = _run_pyro_nuts(
                model, data, potential, starts, num_samples, warmup_steps, show, settings, jit_compile
            )
    return _keep(model, data, samples, stats, relabel)


def _run_pyro_nuts(
    model: "MixtureModel",
    data: Any,
    potential: LikelihoodPotential | None,
    starts: list[dict[str, torch.Tensor]],
    num_samples: int,
    warmup_steps: int,
    show: bool,
    settings: dict[str, Any],
    jit_compile: bool,
) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """Pyro's NUTS kernel on the model's potential (where it has one) or on its traced program: the draws
    ``{site: (chains, draws, ...)}`` and their statistics."""
    num_chains = len(starts)
    if potential is not None:
        kernel = _RecordingNUTS(potential_fn=potential, **settings)
        unconstrained = [potential.unconstrained(start) for start in starts]
        initial = {site: torch.stack([chain[site] for chain in unconstrained]) for site in unconstrained[0]}
        run_options = {
            "initial_params": initial if num_chains > 1 else unconstrained[0],
            "transforms": potential.to_unconstrained,
        }
    else:
        kernel = _RecordingNUTS(
            model.model,
            max_plate_nesting=model.max_plate_nesting,
            jit_compile=jit_compile,
            ignore_jit_warnings=jit_compile,
            init_strategy=_init_strategy(starts[0]),
            **settings,
        )
        run_options = {"initial_params": _unconstrained_starts(model, data, starts) if num_chains > 1 else None}
    with warnings.catch_warnings():  # Pyro's note that the chains run one after another: the docstring says when
        warnings.filterwarnings("ignore", message=r"num_chains=\d+ is more than available_cpu")
        mcmc = MCMC(
            kernel,
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            num_chains=num_chains,
            disable_progbar=not show,
            **run_options,
        )
    mcmc.run(data)
    samples = {k: v.detach() for k, v in mcmc.get_samples(group_by_chain=True).items()}
    return samples, _sample_stats(mcmc, num_chains)


def _keep(
    model: "MixtureModel", data: Any, samples: dict[str, torch.Tensor], stats: dict[str, np.ndarray], relabel: bool
) -> FitResult:
    """Store the draws ``{site: (chains, draws, ...)}`` and their statistics on the model (relabelled, with the
    diagnostics: :func:`~ppmix.engines.draws.keep_draws`)."""
    model.mcmc_sample_stats_ = stats
    if model._fixed is not None:  # the frozen sites' draws: their values, repeated
        samples = model._fixed.draws(samples)
    diagnostics = keep_draws(model, data, samples, relabel, divergences=int(stats["diverging"].sum()))
    chains, draws = stats["diverging"].shape
    logger.info(
        "NUTS finished: %d chains x %d draws; %.0f%% of draws relabelled; divergences %d",
        chains,
        draws,
        100 * diagnostics["relabelled_fraction"],
        diagnostics["divergences"],
    )
    return FitResult(history=[], n_iter=draws, converged=True)


def _run_ppmix_nuts(
    model: "MixtureModel",
    potential: LikelihoodPotential,
    starts: list[dict[str, torch.Tensor]],
    num_samples: int,
    warmup_steps: int,
    show: bool,
    settings: dict[str, Any],
) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """ppmix's NUTS (:func:`~ppmix.engines.nuts.sample_nuts`) on the model's potential, every chain at once from its
    start: the draws of the global sites ``{site: (chains, draws, ...)}`` and their statistics."""
    flat = FlatPotential(potential)
    per_chain = [potential.unconstrained(start) for start in starts]
    initial = flat.pack({name: torch.stack([chain[name] for chain in per_chain]) for name in flat.shapes})
    total = num_samples + warmup_steps
    with tqdm(total=total, disable=not show, desc="NUTS") as bar, torch.no_grad():
        draws = sample_nuts(
            flat,
            initial.detach(),
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            generator=model._generator(NUTS_SEED_OFFSET),
            progress=lambda _: bar.update(),
            **settings,
        )
    chains, kept, size = draws.samples.shape
    values = potential.constrained(flat.unpack(draws.samples.reshape(chains * kept, size)))
    samples = {name: value.reshape(chains, kept, *value.shape[1:]).detach() for name, value in values.items()}
    return samples, draws.stats


def _init_strategy(start: dict[str, torch.Tensor]) -> Any:
    """Pyro's init strategy for a chain starting at ``start`` (the prior median for the sites it lacks)."""
    return init_to_value(values=start, fallback=init_to_median) if start else init_to_median


def _unconstrained_starts(
    model: "MixtureModel", data: Any, starts: list[dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """Every chain's start in NUTS's unconstrained space, ``{site: (chains, ...)}`` (Pyro's ``initial_params``)."""
    per_chain = [
        initialize_model(
            model.model, (data,), max_plate_nesting=model.max_plate_nesting, init_strategy=_init_strategy(start)
        )[0]
        for start in starts
    ]
    return {site: torch.stack([chain[site] for chain in per_chain]) for site in per_chain[0]}


def _sample_stats(mcmc: MCMC, num_chains: int) -> dict[str, np.ndarray]:
    """The per-draw statistics every chain's kernel recorded, ``{name: (chains, draws)}``."""
    per_chain = mcmc.diagnostics()["sample_stats"]
    chains = [per_chain[f"chain {c}"] for c in range(num_chains)]
    return {name: np.stack([chain[name] for chain in chains]) for name in SAMPLE_STATS}
