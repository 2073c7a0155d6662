"""The models' Pyro programs work with Pyro's own tools under the default flat priors.

A flat prior has log-density 0 (so ``TraceEnum_ELBO`` stays the EM objective) and samples a
point mass at the model's current value: ``poutine.trace``, ``Predictive``, ``infer_discrete``,
``pyro.render_model`` and a user's own SVI loop run the fitted model without ``bayesian()``;
an unfitted model raises an error that says to fit first or to use ``bayesian()``.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.infer import SVI, Predictive, TraceEnum_ELBO, config_enumerate, infer_discrete
from pyro.infer.autoguide import AutoDelta, init_to_sample
from pyro.infer.inspect import get_model_relations

from ppmix import GMM, HMM, PFGMM, PFHMM, MixtureOfExperts, SupervisedGMM, SupervisedHMM
from ppmix.models._flat import FlatPrior, FlatPriorError
from tests.common import assert_close, make_blobs, make_expert_data, make_labelled_blobs, make_sequences

HAVE_GRAPHVIZ = importlib.util.find_spec("graphviz") is not None


@dataclass
class Case:
    name: str
    make: Callable[[], Any]  # an unfitted model
    args: tuple  # fit(*args) and prepare_data(*args)
    observed: str  # the observed site checked (its name)
    observed_shape: Callable[[Any], tuple]  # its shape from the prepared data
    discrete: Callable[[Any], list[str]]  # the enumerated sites given the prepared data


def _frames(data: Any) -> list[str]:
    return [f"z_{t}" for t in range(data.max_length)]


X_BLOBS, _ = make_blobs(40, 2)
X_LAB, Y_LAB = make_labelled_blobs(40, 3)
X_SEQ, Y_SEQ, _ = make_sequences(4, (3, 6))
X_MOE, Y_MOE = make_expert_data(40)
X_LOGISTIC, Y_LOGISTIC = make_expert_data(40, expert="logistic")  # noisy labels: replicated data sets vary
OPTS = {"seed": 0, "progress": False, "max_iter": 10}

CASES = [
    Case("gmm-diag", lambda: GMM(2, **OPTS), (X_BLOBS,), "x", lambda d: tuple(d.shape), lambda d: ["z"]),
    Case(
        "gmm-full",
        lambda: GMM(2, covariance_type="full", **OPTS),
        (X_BLOBS,),
        "x",
        lambda d: tuple(d.shape),
        lambda d: ["z"],
    ),
    Case("hmm", lambda: HMM(2, **OPTS), (X_SEQ,), "x_0", lambda d: (d.n_sequences, d.n_features), _frames),
    Case("moe", lambda: MixtureOfExperts(2, **OPTS), (X_MOE, Y_MOE), "y", lambda d: tuple(d[1].shape), lambda d: ["z"]),
    Case(
        "moe-logistic",
        lambda: MixtureOfExperts(2, expert="logistic", **OPTS),
        (X_LOGISTIC, Y_LOGISTIC),
        "y",
        lambda d: tuple(d[1].shape),
        lambda d: ["z"],
    ),
    Case(
        "pfgmm",
        lambda: PFGMM(2, switch_prior=0.5, **OPTS),
        (X_LAB, Y_LAB),
        "x",
        lambda d: tuple(d.x.shape),
        lambda d: ["z", "s"],
    ),
    Case("supgmm", lambda: SupervisedGMM(2, **OPTS), (X_LAB, Y_LAB), "x", lambda d: tuple(d.x.shape), lambda d: ["z"]),
    Case(
        "pfhmm",
        lambda: PFHMM(2, switch_prior=0.5, **OPTS),
        (X_SEQ, Y_SEQ),
        "x_0",
        lambda d: (d.n_sequences, d.n_features),
        lambda d: _frames(d) + [f"s_{t}" for t in range(d.max_length)],
    ),
    Case(
        "suphmm",
        lambda: SupervisedHMM(2, **OPTS),
        (X_SEQ, Y_SEQ),
        "x_0",
        lambda d: (d.n_sequences, d.n_features),
        _frames,
    ),
]
IDS = [c.name for c in CASES]


@pytest.fixture(scope="module")
def fitted() -> dict[str, Any]:
    models = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in CASES:
            models[case.name] = case.make().fit(*case.args)
    return models


def _setup(case: Case, fitted: dict[str, Any]) -> tuple[Any, Any]:
    model = fitted[case.name]
    return model, model.prepare_data(*case.args)


def _global_sites(model: Any, trace: Any) -> list[str]:
    return [name for name in model._get_globals() if name in trace.nodes]


# ---------------------------------------------------------------------------------- poutine.trace
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_trace_runs_the_fitted_model_and_keeps_the_flat_log_density(case, fitted):
    model, data = _setup(case, fitted)
    before = model._get_globals()
    trace = poutine.trace(model.model).get_trace(data)
    sites = _global_sites(model, trace)
    assert len(sites) >= 3
    for name in sites:  # every global site carries the fitted value
        assert_close(trace.nodes[name]["value"], before[name], msg=name)
    assert trace.nodes[case.observed]["is_observed"]
    assert tuple(trace.nodes[case.observed]["value"].shape) == case.observed_shape(data)
    trace.compute_log_prob()
    flat = [n for n in sites if isinstance(trace.nodes[n]["fn"], FlatPrior)]
    assert flat, "the default priors are flat"
    for name in flat:  # log-density 0: the ELBO stays the log-likelihood
        assert float(trace.nodes[name]["log_prob_sum"]) == 0.0
    for name, value in model._get_globals().items():  # tracing changes nothing
        assert_close(value, before[name], msg=name)


def test_trace_values_follow_set_globals(fitted):
    gmm = fitted["gmm-diag"]
    x = gmm.prepare_data(X_BLOBS)
    values = gmm._get_globals()
    try:
        gmm._set_globals({**values, "locs": values["locs"] + 1.0})
        assert_close(poutine.trace(gmm.model).get_trace(x).nodes["locs"]["value"], values["locs"] + 1.0)
    finally:
        gmm._set_globals(values)


# ------------------------------------------------------------------------------------ Predictive
PREDICTIVE_CASES = [pytest.param(c, id=c.name) for c in CASES]


@pytest.mark.parametrize("case", PREDICTIVE_CASES)
def test_predictive_with_the_guide_samples_the_data_site(case, fitted):
    model, data = _setup(case, fitted)
    samples = Predictive(model.model, guide=model.guide, num_samples=3)(data)
    observed = poutine.trace(model.model).get_trace(data).nodes[case.observed]["value"]
    assert tuple(samples[case.observed].shape) == (3, *case.observed_shape(data))
    assert torch.equal(samples[case.observed][0], observed)  # Pyro returns observed sites as observed
    assert samples[case.discrete(data)[0]].shape[0] == 3
    # posterior predictive draws: the program unconditioned
    fresh = Predictive(poutine.uncondition(model.model), guide=model.guide, num_samples=3)(data)
    assert tuple(fresh[case.observed].shape) == (3, *case.observed_shape(data))
    assert not torch.equal(fresh[case.observed][0], observed)


@pytest.mark.parametrize("case", [p for p in PREDICTIVE_CASES if p.id in ("gmm-diag", "gmm-full", "hmm", "moe")])
def test_predictive_without_a_guide_uses_the_point_estimates(case, fitted):
    model, data = _setup(case, fitted)
    samples = Predictive(poutine.uncondition(model.model), num_samples=3)(data)
    assert tuple(samples[case.observed].shape) == (3, *case.observed_shape(data))
    for name, value in model._get_globals().items():
        if name in samples:  # a point mass: every draw is the fitted value
            assert_close(samples[name].reshape(3, *value.shape), value.expand(3, *value.shape), msg=name)
    observed = poutine.trace(model.model).get_trace(data).nodes[case.observed]["value"]
    assert not torch.equal(samples[case.observed][0], observed)  # fresh data, not the observed values


def test_predictive_draws_follow_the_fitted_clusters(fitted):
    gmm = fitted["gmm-diag"]
    x = gmm.prepare_data(X_BLOBS)
    samples = Predictive(poutine.uncondition(gmm.model), guide=gmm.guide, num_samples=2)(x)
    z, draws = samples["z"].reshape(-1), samples["x"].reshape(-1, x.shape[1])
    for k in range(2):
        assert_close(draws[z == k].mean(0), gmm.means_[k], atol=1.0)


# -------------------------------------------------------------------------------- infer_discrete
def _enumerated(model: Any) -> Callable:
    """The program with every discrete site enumerated: the pf models mark theirs for enumeration
    in their guide only, so Pyro's model-side tools need ``config_enumerate``."""
    return config_enumerate(model.model, "parallel") if isinstance(model, PFGMM | PFHMM) else model.model


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_infer_discrete_gives_the_assignments(case, fitted):
    model, data = _setup(case, fitted)
    program = infer_discrete(_enumerated(model), first_available_dim=-1 - model.max_plate_nesting, temperature=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every discrete site enumerated
        trace = poutine.trace(program).get_trace(data)
    n = case.observed_shape(data)[0]
    for name in case.discrete(data):
        z = trace.nodes[name]["value"]
        assert z.shape[0] == n and z.numel() == n * (z.shape[-1] if name.startswith("s") else 1), name
        assert int(z.min()) >= 0 and int(z.max()) < model.n_components


def test_infer_discrete_map_equals_predict(fitted):
    gmm = fitted["gmm-diag"]
    x = gmm.prepare_data(X_BLOBS)
    program = infer_discrete(gmm.model, first_available_dim=-2, temperature=0)
    z = poutine.trace(program).get_trace(x).nodes["z"]["value"]
    np.testing.assert_array_equal(z.numpy(), np.asarray(gmm.predict(X_BLOBS)))


# --------------------------------------------------------------------------------- render_model
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_render_model(case, fitted):
    model, data = _setup(case, fitted)
    relations = get_model_relations(model.model, model_args=(data,))
    assert case.observed in relations["observed"]
    assert case.discrete(data)[0] in relations["sample_dist"]
    if not HAVE_GRAPHVIZ:
        pytest.skip("the graphviz Python package is not installed: pyro.render_model's drawing is not checked")
    import graphviz

    assert isinstance(pyro.render_model(model.model, model_args=(data,)), graphviz.Digraph)


# ------------------------------------------------------------------------------ a user's own SVI
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_user_svi_loop_with_autodelta(case, fitted):
    model, data = _setup(case, fitted)
    program = _enumerated(model)
    guide = AutoDelta(poutine.block(program, hide=case.discrete(data)))
    elbo = TraceEnum_ELBO(max_plate_nesting=model.max_plate_nesting)
    svi = SVI(program, guide, pyro.optim.Adam({"lr": 0.01}), elbo)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every latent enumerated, every global in the guide
        losses = [svi.step(data) for _ in range(3)]
    assert all(math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES if c.name.startswith(("pf", "sup"))])
def test_user_svi_loop_without_enumeration_runs(case, fitted):
    """Without ``config_enumerate`` a pf model's discrete sites are sampled, not summed: still finite."""
    model, data = _setup(case, fitted)
    guide = AutoDelta(poutine.block(model.model, hide=case.discrete(data)))
    svi = SVI(model.model, guide, pyro.optim.Adam({"lr": 0.01}), TraceEnum_ELBO(max_plate_nesting=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pyro says the discrete sites are not enumerated
        losses = [svi.step(data) for _ in range(3)]
    assert all(math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize("name", ["hmm", "pfhmm", "suphmm"])
def test_model_side_enumeration_is_exact(name, fitted):
    """A user's enumerated ELBO at the fitted values equals the sum over every state path, brute force."""
    case = next(c for c in CASES if c.name == name)
    model = fitted[name]
    data = model.prepare_data(*([a[0][:3]] for a in case.args))  # one sequence of three steps
    steps = [f"z_{t}" for t in range(3)]
    hide = steps + [f"s_{t}" for t in range(3)]

    def log_evidence(program: Callable) -> float:
        program = config_enumerate(program, "parallel")
        pyro.clear_param_store()
        guide = AutoDelta(poutine.block(program, hide=hide), init_loc_fn=init_to_sample)
        return -TraceEnum_ELBO(max_plate_nesting=model.max_plate_nesting).loss(program, guide, data)

    shape = (1,) * model.max_plate_nesting
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a path of the HMM leaves nothing to enumerate
        paths = [
            log_evidence(poutine.condition(model.model, {z: torch.full(shape, k) for z, k in zip(steps, path)}))
            for path in np.ndindex(*(model.n_components,) * 3)
        ]
    exact = float(torch.logsumexp(torch.tensor(paths, dtype=torch.float64), 0))
    assert_close(log_evidence(model.model), exact, rtol=1e-9)


def test_user_svi_starting_at_the_fit_reports_its_log_likelihood(fitted):
    gmm = fitted["gmm-diag"]
    x = gmm.prepare_data(X_BLOBS)
    guide = AutoDelta(poutine.block(gmm.model, hide=["z"]), init_loc_fn=init_to_sample)
    svi = SVI(gmm.model, guide, pyro.optim.Adam({"lr": 0.01}), TraceEnum_ELBO(max_plate_nesting=1))
    first_loss = svi.step(x)  # the loss at the starting point, the fitted parameters
    assert_close(first_loss, -float(np.sum(gmm.score_samples(X_BLOBS))), rtol=1e-9)


def test_point_guide_elbo_is_the_log_likelihood(fitted):
    """The invariant the flat priors keep: TraceEnum_ELBO with the point-mass guide = log-likelihood."""
    gmm = fitted["gmm-diag"]
    x = gmm.prepare_data(X_BLOBS)
    loss = TraceEnum_ELBO(max_plate_nesting=1).loss(gmm.model, gmm.guide, x)
    assert_close(-loss, float(np.sum(gmm.score_samples(X_BLOBS))), rtol=1e-9)


def test_guides_of_two_models_do_not_share_parameters():
    """The default guide runs under local_params(): a second model's guide never reads the first one's values."""
    a = GMM(2, seed=0, progress=False).fit(X_BLOBS)
    b = GMM(2, seed=0, progress=False).fit(X_BLOBS + 10.0)
    x = a.prepare_data(X_BLOBS)
    poutine.trace(a.guide).get_trace(x)
    assert_close(poutine.trace(b.guide).get_trace(x).nodes["locs"]["value"], b.means_)


# --------------------------------------------------------------------------------- before a fit
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_unfitted_model_names_fit_and_bayesian(case):
    model = case.make()
    data = model.prepare_data(*case.args, fitting=True)  # shapes known, no parameters yet
    with pytest.raises(FlatPriorError, match=r"fit the model first.*model\.bayesian\(\)"):
        poutine.trace(model.model).get_trace(data)
    with pytest.raises(FlatPriorError, match=r"bayesian\(\)"):
        Predictive(model.model, num_samples=2)(data)
    with model.bayesian():  # the way the message offers: proper priors
        trace = poutine.trace(model.model).get_trace(data)
    assert tuple(trace.nodes[case.observed]["value"].shape) == case.observed_shape(data)


def test_unfitted_gmm_renders_under_bayesian():
    gmm = GMM(3)
    x = torch.as_tensor(X_BLOBS)
    with gmm.bayesian():
        relations = get_model_relations(gmm.model, model_args=(x,))
    assert "z" in relations["sample_sample"]["x"]


# ------------------------------------------------------------------------------------- FlatPrior
def test_flat_prior_samples_its_value_and_scores_zero():
    value = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    prior = FlatPrior(constraints.real, (2,), (2,), value=lambda: value, site="'locs'")
    assert prior.sample((3,)).shape == (3, 2, 2)
    assert_close(prior.sample(), value)
    expanded = prior.expand((5, 2))
    assert isinstance(expanded, FlatPrior) and expanded.sample().shape == (5, 2, 2)
    assert_close(expanded.sample()[4], value)
    assert prior.log_prob(value).dtype == torch.float64 and float(prior.log_prob(value).sum()) == 0.0
    sample = prior.sample()
    sample += 1.0  # a copy: the model's value is untouched
    assert_close(value[0, 0], 1.0)


def test_flat_prior_errors():
    with pytest.raises(FlatPriorError, match=r"site 'w'.*bayesian\(\)"):
        FlatPrior(constraints.simplex, (), (3,), site="'w'").sample()
    with pytest.raises(ValueError, match="does not match the shape"):
        FlatPrior(constraints.real, (4,), (), value=torch.zeros(3)).sample()
