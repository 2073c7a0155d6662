"""``partial_fit``: online EM (Cappé & Moulines, 2009) on chunks approaches the batch EM fit on planted data."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from ppmix.engines.em import em_loop
from ppmix.models import GMM, HMM
from ppmix.models._online import Stream

MEANS = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
WEIGHTS = np.array([0.5, 0.3, 0.2])


def _chunk(rng: np.random.Generator, n: int) -> np.ndarray:
    z = rng.choice(3, size=n, p=WEIGHTS)
    return MEANS[z] + rng.normal(size=(n, 2)) * [1.0, 0.5]


def _sorted(gmm: GMM) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort(gmm.means_.numpy().T[::-1])
    return gmm.weights_.numpy()[order], gmm.means_.numpy()[order]


def test_a_stream_of_planted_chunks_approaches_batch_em():
    rng = np.random.default_rng(0)
    chunks = [_chunk(rng, 500) for _ in range(200)]
    online = GMM(3, seed=0, progress=False)
    for chunk in chunks:
        online.partial_fit(chunk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = GMM(3, seed=0, progress=False).fit(np.concatenate(chunks))
    (w_on, m_on), (w_batch, m_batch) = _sorted(online), _sorted(batch)
    np.testing.assert_allclose(w_on, w_batch, atol=0.01)
    np.testing.assert_allclose(m_on, m_batch, atol=0.05)
    variances = [np.sort(m.covariances_.numpy(), 0) for m in (online, batch)]
    np.testing.assert_allclose(*variances, rtol=0.05)
    assert online.n_iter_ == 200 and len(online.history_) == 200 and online.engine_ == "online-em"
    # the chunks' log-likelihood under the running parameters settles at the batch fit's
    assert abs(np.mean(online.history_[-50:]) - batch.lower_bound_) < 0.05


def test_the_first_chunk_is_one_em_iteration_from_the_start():
    chunk = _chunk(np.random.default_rng(1), 400)
    online = GMM(3, seed=0, progress=False).partial_fit(chunk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = GMM(3, seed=0, progress=False).fit(chunk, max_iter=1)
    for name, value in batch._state_tensors().items():
        np.testing.assert_allclose(online._state_tensors()[name].numpy(), value.numpy(), rtol=1e-9, atol=1e-12)


def test_a_fitted_model_continues_and_a_new_fit_restarts_the_stream():
    rng = np.random.default_rng(2)
    model = GMM(3, seed=0, progress=False).fit(_chunk(rng, 2000))
    fitted, chunk = copy.deepcopy(model), _chunk(rng, 500)
    model.partial_fit(chunk)
    assert model.n_iter_ == 1 and model.history_ == [pytest.approx(fitted.score(chunk), rel=1e-12)]
    model.partial_fit(_chunk(rng, 500))
    assert model.n_iter_ == 2
    model.fit(_chunk(rng, 1000))
    model.partial_fit(_chunk(rng, 500))
    assert model.n_iter_ == 1  # after another engine's fit, the stream starts again


def test_an_hmm_learns_its_transitions_from_a_stream_of_sequences():
    rng = np.random.default_rng(3)
    transition = np.array([[0.9, 0.1], [0.2, 0.8]])

    def sequence(length: int) -> np.ndarray:
        states = [0]
        for _ in range(length - 1):
            states.append(rng.choice(2, p=transition[states[-1]]))
        return np.asarray(states)[:, None] * 4.0 + rng.normal(size=(length, 1))

    hmm = HMM(2, seed=0, progress=False)
    for _ in range(60):
        hmm.partial_fit([sequence(50) for _ in range(5)])
    order = np.argsort(hmm.means_.numpy()[:, 0])
    np.testing.assert_allclose(hmm.transition_.numpy()[np.ix_(order, order)], transition, atol=0.05)


@pytest.mark.parametrize(
    "kwargs, match", [({"step_exponent": 0.5}, "step_exponent"), ({"step_offset": -1}, "step_offset")]
)
def test_bad_step_sizes_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GMM(2).partial_fit(np.ones((10, 2)), **kwargs)


def test_a_chunk_with_other_columns_is_refused():
    model = GMM(2, seed=0, progress=False).partial_fit(_chunk(np.random.default_rng(4), 100))
    with pytest.raises(ValueError, match="features"):
        model.partial_fit(np.ones((10, 3)))


def test_the_pf_models_refuse_partial_fit_and_name_fit_em():
    from ppmix.models.pf.pf_hmm import PFHMM

    assert not hasattr(PFHMM(2), "partial_fit")  # scikit-learn then never calls it
    assert "fit_em" in PFHMM.online_em_unavailable


@pytest.mark.parametrize("make", [lambda: GMM(3, seed=0, progress=False), lambda: HMM(2, seed=0, progress=False)])
def test_a_weighted_chunk_is_the_chunk_with_its_rows_repeated(make):
    """partial_fit's sample_weight (per row; per sequence for an HMM): the same step as on the repeated chunk."""
    rng = np.random.default_rng(3)
    hmm = isinstance(make(), HMM)
    chunk = [_chunk(rng, 20) for _ in range(6)] if hmm else _chunk(rng, 120)
    model = make().partial_fit(chunk)
    weight = rng.integers(0, 4, len(chunk))
    repeated = [s for s, c in zip(chunk, weight) for _ in range(c)] if hmm else np.repeat(chunk, weight, axis=0)
    weighted, plain = copy.deepcopy(model).partial_fit(chunk, sample_weight=weight), model.partial_fit(repeated)
    for site, value in plain._get_globals().items():
        np.testing.assert_allclose(weighted._get_globals()[site].numpy(), value.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weighted.history_, plain.history_, rtol=1e-10)


POISSON_PRIOR = {"rate_concentration": 1001.0, "rate_rate": 50.0, "weights": 5.0}  # 50 rows' worth at rate 20


def _counts(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.poisson(np.where(rng.random(n) < 0.5, 2.0, 12.0))[:, None].astype(float)


@pytest.mark.parametrize("structure", ["Mixture", "GMM", "HMM"])
def test_with_priors_the_first_chunk_is_one_map_em_iteration(structure):
    """The prior counts once against the chunk's rows: the first step is ``fit(max_iter=1)`` with the same prior."""
    from ppmix.models import Mixture

    rng = np.random.default_rng(5)
    if structure == "Mixture":
        make, chunk = (
            lambda: Mixture(2, family="poisson", priors=POISSON_PRIOR, seed=0, progress=False),
            _counts(rng, 300),
        )
    elif structure == "GMM":
        prior = {"variance_concentration": 50.0, "variance_rate": 200.0, "weights": 3.0}
        make, chunk = lambda: GMM(3, priors=prior, seed=0, progress=False), _chunk(rng, 300)
    else:
        make, chunk = lambda: HMM(2, transition_prior=30.0, seed=0, progress=False), [_chunk(rng, 20) for _ in range(8)]
    online = make().partial_fit(chunk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = make().fit(chunk, max_iter=1)
    for name, value in batch._state_tensors().items():
        np.testing.assert_allclose(online._state_tensors()[name].numpy(), value.numpy(), rtol=1e-9, atol=1e-12)


def test_with_priors_a_stream_approaches_batch_map_em_on_the_rows_seen():
    """A prior worth 50 rows at rate 20 on each rate, against 4 000 rows of rates 2 and 12 in 200 chunks of 20: the
    stream ends near batch MAP-EM of the 4 000 rows (rates about 2.5 and 12.4), not at maximum likelihood (2, 12),
    nor where the prior counted against each chunk would hold it (about 17 and 20)."""
    from ppmix.models import Mixture

    rng = np.random.default_rng(6)
    chunks = [_counts(rng, 20) for _ in range(200)]
    online = Mixture(2, family="poisson", priors=POISSON_PRIOR, seed=0, progress=False)
    for chunk in chunks:
        online.partial_fit(chunk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = Mixture(2, family="poisson", priors=POISSON_PRIOR, seed=0, progress=False).fit(np.concatenate(chunks))
    rates, batch_rates = np.sort(online.means_.numpy()[:, 0]), np.sort(batch.means_.numpy()[:, 0])
    assert batch_rates[0] > 2.3 and batch_rates[1] > 12.2  # the prior pulls batch MAP-EM visibly off (2, 12)
    np.testing.assert_allclose(rates, batch_rates, atol=0.2)


def test_an_hmms_transition_prior_counts_once_against_the_stream():
    """``transition_prior`` = 200 against some 5 000 transitions: batch MAP-EM's stay probabilities sit well below
    the planted 0.9 and 0.8 (maximum likelihood), and the stream ends there too (counted against the running
    average of one step's counts, the prior would flatten every row to 1/2)."""
    rng = np.random.default_rng(3)
    transition = np.array([[0.9, 0.1], [0.2, 0.8]])

    def sequence(length: int) -> np.ndarray:
        states = [0]
        for _ in range(length - 1):
            states.append(rng.choice(2, p=transition[states[-1]]))
        return np.asarray(states)[:, None] * 4.0 + rng.normal(size=(length, 1))

    chunks = [[sequence(50) for _ in range(5)] for _ in range(20)]
    online = HMM(2, transition_prior=200.0, seed=0, progress=False)
    for chunk in chunks:
        online.partial_fit(chunk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = HMM(2, transition_prior=200.0, seed=0, progress=False).fit([s for c in chunks for s in c])

    def stays(model: HMM) -> np.ndarray:
        order = np.argsort(model.means_.numpy()[:, 0])
        return np.diag(model.transition_.numpy()[np.ix_(order, order)])

    assert (stays(batch) < transition.diagonal() - 0.04).all()
    np.testing.assert_allclose(stays(online), stays(batch), atol=0.02)


@pytest.mark.parametrize("structure", ["gmm", "hmm"])
def test_a_stream_is_a_source_of_the_one_em_loop(structure):
    """``partial_fit`` is :func:`~ppmix.engines.em.em_loop` on a :class:`~ppmix.models._online.Stream` of one chunk:
    a stream of several chunks in one loop gives, bit for bit, the parameters and history of ``partial_fit`` chunk
    by chunk, and the loop ends with the stream (no convergence claimed)."""
    rng = np.random.default_rng(3)
    if structure == "gmm":
        chunks = [_chunk(rng, 200) for _ in range(4)]
        make = lambda: GMM(3, seed=0, progress=False)  # noqa: E731
    else:
        chunks = [[_chunk(rng, 30) for _ in range(5)] for _ in range(4)]
        make = lambda: HMM(3, seed=0, progress=False)  # noqa: E731
    by_chunk = make()
    for chunk in chunks:
        by_chunk.partial_fit(chunk)
    looped = make().partial_fit(chunks[0])
    data = (looped._em_data(looped.prepare_data(chunk)) for chunk in chunks[1:])
    stream = Stream(looped, data, looped._online, step_offset=2.0, step_exponent=0.6)
    result = em_loop(stream, max_iter=100, tol=0.0)
    assert (result.n_iter, result.converged) == (3, False)
    assert looped.history_ + result.history == by_chunk.history_
    assert stream.state.steps == by_chunk._online.steps == 4
    for name, value in by_chunk._state_tensors().items():
        assert torch.equal(looped._state_tensors()[name], value), name
