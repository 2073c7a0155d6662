"""NUTS's potential from a model's own likelihood (:mod:`ppmix.engines.potential`) is the potential of its Pyro
program: equal, with its gradient, to the one Pyro's NUTS builds by tracing the program with the discrete latents
enumerated (``initialize_model``: ``-log p(x, theta)`` plus the transforms' log-Jacobians), and to ``TraceEnum_ELBO``'s
log joint under a point-mass guide; models whose hooks do not describe their program get none; a short run of
``engine="mcmc"`` on it recovers planted parameters."""

from __future__ import annotations

import gc
import importlib
import warnings

import numpy as np
import pytest
import torch
from pyro import poutine
from pyro.infer import TraceEnum_ELBO
from pyro.infer.mcmc.util import initialize_model

from ppmix import GMM, HMM, PFGMM, Mixture
from ppmix.components.registry import FAMILIES
from ppmix.engines import hmm_chains
from ppmix.engines import potential as potential_module
from ppmix.engines.potential import FlatPotential, describes_program, likelihood_potential
from tests.common import (
    SEQUENCE_FAMILIES,
    StudentTMixture,
    make_blobs,
    make_family_rows,
    make_family_sequences,
    make_sequences,
)

ROW_FAMILIES = sorted(set(FAMILIES) - SEQUENCE_FAMILIES)


def _mixture(family: str):
    return Mixture(2, family=family, seed=0, progress=False), make_family_rows(family, 30)[0]


def _gmm(covariance_type: str):
    return GMM(2, covariance_type=covariance_type, seed=0, progress=False), make_family_rows("gaussian", 30, 3)[0]


def _hmm(emission: str, **options):
    return HMM(2, emission=emission, seed=0, progress=False, **options), make_family_sequences(emission, 3, (3, 6))[0]


CASES = {
    **{f"mixture-{family}": (lambda family=family: _mixture(family)) for family in ROW_FAMILIES},
    **{f"gmm-{c}": (lambda c=c: _gmm(c)) for c in ("diag", "full", "tied", "spherical")},
    "mixture-student_t-full": lambda: (
        Mixture(2, family={"name": "student_t", "covariance_type": "full"}, seed=0, progress=False),
        make_family_rows("student_t", 30)[0],
    ),
    **{f"hmm-{e}": (lambda e=e: _hmm(e)) for e in ("gaussian", "poisson", "autoregressive")},
    "hmm-left-right": lambda: _hmm("gaussian", transition_pattern="left-right"),
    # the Gaussians' other paths, which NUTS meets far out in warmup: whitening (full covariances), and a component
    # scored from its deviations where the expansion would cancel digits (diagonal)
    "gmm-full-whitened": lambda: _gmm("full"),
    "gmm-diag-cancelled": lambda: _gmm("diag"),
}
#: the cases whose batched potential has no autograd graph (:meth:`FlatPotential._direct`: a compiled likelihood, every
#: site's gradient in closed form)
DIRECT = {"gmm-diag", "gmm-diag-cancelled", "hmm-gaussian", "hmm-left-right", "mixture-gaussian", "mixture-student_t"}
#: the module settings that send a case down its path: (module, name, value)
PATHS = {
    "gmm-full-whitened": ("ppmix.components.gaussian_full", "MOMENTS_BUDGET_BYTES", 0),
    "gmm-diag-cancelled": ("ppmix.components.gaussian_diag", "cancellation_tol", lambda dtype: -1.0),
}


def _fitted(case: str):
    model, x = CASES[case]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, max_iter=5)
    return model, model.prepare_data(x)


def _random_points(potential, n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {name: site.transform.inverse_shape(site.prior.shape()) for name, site in potential.sites.items()}
    return [
        {name: torch.randn(shape, generator=gen, dtype=torch.float64) for name, shape in shapes.items()}
        for _ in range(n)
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_potential_and_its_gradient_are_those_of_the_enumerated_program(case, monkeypatch):
    """At random unconstrained points: Pyro's own NUTS potential of the program (discrete latents enumerated, the
    same ``biject_to`` transforms and their log-Jacobians) equals ours to 1e-8, and so does its gradient."""
    model, data = _fitted(case)
    if case in PATHS:
        module, name, value = PATHS[case]
        monkeypatch.setattr(importlib.import_module(module), name, value)
    with model.bayesian():
        potential = likelihood_potential(model, data)
        assert potential is not None
        _, pyro_potential, _, _ = initialize_model(model.model, (data,), max_plate_nesting=model.max_plate_nesting)
        for point in _random_points(potential, 3, seed=1):
            ours = {k: v.clone().requires_grad_() for k, v in point.items()}
            theirs = {k: v.clone().requires_grad_() for k, v in point.items()}
            u_ours, u_theirs = potential(ours), pyro_potential(theirs)
            assert float(u_ours.detach()) == pytest.approx(float(u_theirs.detach()), rel=1e-10, abs=1e-8)
            grads = torch.autograd.grad(u_ours, list(ours.values()))
            expected = torch.autograd.grad(u_theirs, list(theirs.values()))
            for name, g, e in zip(ours, grads, expected):
                torch.testing.assert_close(g, e, rtol=1e-8, atol=1e-8, msg=f"gradient of {name}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_chain_of_the_batched_potential_is_the_potential_of_its_row(case, monkeypatch):
    """:class:`FlatPotential` on three chains at once (the priors broadcast, an HMM's forward algorithm over every
    chain's sequences) gives each row the potential and gradient of that chain's point alone, and packs and unpacks
    the sites without loss."""
    model, data = _fitted(case)
    if case in PATHS:
        module, name, value = PATHS[case]
        monkeypatch.setattr(importlib.import_module(module), name, value)
    with model.bayesian():
        potential = likelihood_potential(model, data)
        flat = FlatPotential(potential)
        points = _random_points(potential, 3, seed=3)
        stacked = {name: torch.stack([point[name] for point in points]) for name in points[0]}
        z = flat.pack(stacked)
        assert all(torch.equal(flat.unpack(z)[name], stacked[name]) for name in stacked)
        u, grad = flat(z)
        assert flat._direct_possible == (case in DIRECT)  # the path without autograd was taken where it applies
        for c, point in enumerate(points):
            alone = {k: v.clone().requires_grad_() for k, v in point.items()}
            expected = potential(alone)
            grads = torch.autograd.grad(expected, list(alone.values()))
            assert float(u[c]) == pytest.approx(float(expected.detach()), rel=1e-10, abs=1e-8)
            torch.testing.assert_close(grad[c], torch.cat([g.reshape(-1) for g in grads]), rtol=1e-8, atol=1e-8)


def _flat_at_random_points(case: str, chains: int = 3):
    model, data = _fitted(case)
    with model.bayesian():
        potential = likelihood_potential(model, data)
    flat = FlatPotential(potential)
    points = _random_points(potential, chains, seed=5)
    return model, flat, flat.pack({name: torch.stack([point[name] for point in points]) for name in points[0]})


@pytest.mark.parametrize("case", ["hmm-gaussian", "hmm-left-right"])
def test_the_diag_gaussian_hmm_potential_runs_without_autograd(case, monkeypatch):
    """An HMM with diagonal Gaussian emissions (forbidden transitions included): its batched potential and gradient
    come from the compiled kernel and the closed-form site gradients, with no autograd pass, and equal the autograd
    path's."""
    model, flat, z = _flat_at_random_points(case)
    expected = flat._by_autograd(z)

    def refuse(*args, **kwargs):
        raise AssertionError("autograd was used")

    monkeypatch.setattr(torch.autograd, "grad", refuse)
    with model.bayesian():
        u, grad = flat(z)
    assert flat._direct_possible
    torch.testing.assert_close(u, expected[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, expected[1], rtol=1e-10, atol=1e-10)


def test_an_hmm_kernel_failure_falls_back_for_that_call_only(monkeypatch):
    """Where the kernel's rescaling fails at a point (a nearly impossible step), that call gets the autograd path's
    answer and the next calls still try the kernel."""
    model, flat, z = _flat_at_random_points("hmm-gaussian")
    expected = flat._by_autograd(z)
    monkeypatch.setattr(hmm_chains, "gaussian_chains_log_likelihood", lambda *args: None)
    u, grad = flat(z)
    assert flat._direct_possible
    torch.testing.assert_close(u, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(grad, expected[1], rtol=0, atol=0)


@pytest.mark.parametrize("case", ["gmm-full", "mixture-poisson", "hmm-gaussian"])
def test_the_potential_is_minus_the_trace_enum_log_joint_less_the_jacobians(case):
    """``TraceEnum_ELBO`` on the program with the globals conditioned on ``theta`` (and no guide) is
    ``-log p(x, theta)``, the discrete latents enumerated: the potential is it less the log-Jacobians at ``u``."""
    model, data = _fitted(case)
    with model.bayesian():
        potential = likelihood_potential(model, data)
        point = _random_points(potential, 1, seed=2)[0]
        values = potential.constrained(point)
        # the globals conditioned (observed sites, their priors counted), no guide: the loss is -log p(x, theta)
        conditioned = poutine.condition(model.model, data=values)
        log_joint = -TraceEnum_ELBO(max_plate_nesting=model.max_plate_nesting).loss(conditioned, lambda *_: None, data)
        jacobian = sum(
            float(site.transform.log_abs_det_jacobian(point[name], values[name]).sum())
            for name, site in potential.sites.items()
        )
    assert float(potential(point)) == pytest.approx(-(log_joint + jacobian), rel=1e-10, abs=1e-8)


def test_a_program_the_hooks_do_not_compute_gets_no_potential():
    """A user's program (a subclass replacing ``model()``, or a base-class model without EM) and a fit with known
    latents run NUTS on the traced program."""

    class Custom(GMM):
        def model(self, x):
            super().model(x)

    assert not describes_program(Custom(2))
    assert not describes_program(StudentTMixture(2))
    assert describes_program(GMM(2)) and describes_program(HMM(2))


def test_a_program_with_a_discrete_global_site_gets_no_potential():
    """A pf model samples its features' relevance indicators as global sites: NUTS cannot move them, so no potential
    (``engine="mcmc"`` then runs on the traced program, as before)."""
    x = make_blobs(40, n_features=2)[0]
    model = PFGMM(2, seed=0, progress=False).fit(x)
    with model.bayesian():
        assert likelihood_potential(model, model.prepare_data(x)) is None


def test_nuts_on_the_potential_recovers_planted_parameters():
    """Two well separated Gaussian clusters and a sticky two-state HMM: the posterior means are the planted values,
    and the draws are the program's sites, constrained (weights on the simplex, positive scales)."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-4.0, 1.0, (30, 1)), rng.normal(4.0, 0.5, (70, 1))])
    gmm = GMM(2, seed=0, progress=False).fit(x, engine="mcmc", num_samples=30, warmup_steps=30)
    order = np.argsort(gmm.means_[:, 0].numpy())
    np.testing.assert_allclose(gmm.means_[order, 0].numpy(), [-4.0, 4.0], atol=0.3)
    np.testing.assert_allclose(gmm.weights_[order].numpy(), [0.3, 0.7], atol=0.1)
    draws = gmm.mcmc_samples_
    assert draws["weights"].shape == (2, 30, 2) and torch.allclose(draws["weights"].sum(-1), torch.ones(2, 30).double())
    assert bool((draws["scales"] > 0).all())

    seqs, _, _ = make_sequences(5, (15, 25), n_features=1, seed=0)
    hmm = HMM(2, seed=0, progress=False).fit(seqs, engine="mcmc", num_samples=25, warmup_steps=25)
    em = HMM(2, seed=0, progress=False).fit(seqs)
    np.testing.assert_allclose(np.sort(hmm.means_[:, 0].numpy()), np.sort(em.means_[:, 0].numpy()), atol=0.3)
    assert float(hmm.transition_.diagonal().min()) > 0.6


def test_the_hmm_prediction_batch_is_remembered_per_model_data_and_components():
    """The HMM potential prepares its frames once for a model, data and components (every leapfrog step reuses
    them), again when the components change, and forgets them with the model."""
    model, data = _fitted("hmm-gaussian")
    first = potential_module._prediction_batch(model, data)
    assert potential_module._prediction_batch(model, data) is first
    model._set_globals(model._get_globals())  # new components: the frames are prepared for them
    again = potential_module._prediction_batch(model, data)
    assert again is not first and torch.equal(again.rows.x, first.rows.x)
    del model, first, again
    gc.collect()
    assert potential_module._last_prediction == []
