"""Programs the built-in structures cannot serve are refused with a clear error, not fitted or scored wrongly.

- A subclass of ``HMM`` that replaces ``model`` with another emission would have been fitted as the Gaussian
  HMM by EM (and failed at the end of SVI/MCMC): every engine refuses it and points to ``HMM(emission=...)``.
- A ``MixtureModel`` subclass whose latents form a ``pyro.markov`` chain gets SVI from the base class, but the
  inherited per-point scores and predictions assume one latent per data point: they refuse.
"""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from ppmix import HMM, MixtureModel

pytestmark = pytest.mark.filterwarnings("ignore::ppmix.engines.result.ConvergenceWarning")


class PoissonEmissionHMM(HMM):
    """What a user wrote before emissions were families: HMM with its program replaced."""

    def model(self, batch):
        k = self.n_components
        opts = {"dtype": batch.x.dtype}
        rates = pyro.sample("rates", dist.Gamma(torch.ones(k, 1, **opts), 0.1).to_event(1))
        with self._data_plate(batch.n_sequences) as idx:
            z = None
            for t in pyro.markov(range(batch.max_length)):
                probs = torch.ones(k, **opts) / k if z is None else torch.full((k, k), 1.0 / k, **opts)[z]
                z = pyro.sample(f"z_{t}", dist.Categorical(probs), infer={"enumerate": "parallel"})
                with poutine.mask(mask=t < batch.lengths[idx]):
                    pyro.sample(f"x_{t}", dist.Poisson(rates[z]).to_event(1), obs=batch.x[idx, t])


class ChainModel(MixtureModel):
    """A two-state chain over each row's entries, written on MixtureModel: SVI works, per-point outputs do not."""

    max_plate_nesting = 1

    def model(self, x):
        opts = {"dtype": x.dtype}
        locs = pyro.sample("locs", dist.Normal(torch.zeros(2, **opts), 5.0).to_event(1))
        with self._data_plate(x.shape[0]) as idx:
            z = None
            for t in pyro.markov(range(x.shape[1])):
                probs = (
                    torch.full((2,), 0.5, **opts) if z is None else torch.tensor([[0.9, 0.1], [0.1, 0.9]], **opts)[z]
                )
                z = pyro.sample(f"z_{t}", dist.Categorical(probs), infer={"enumerate": "parallel"})
                pyro.sample(f"x_{t}", dist.Normal(locs[z], 1.0), obs=x[idx, t])


def _counts(n_sequences: int = 4, length: int = 6):
    rng = np.random.default_rng(0)
    return [rng.poisson(3.0, size=(length, 1)).astype(float) for _ in range(n_sequences)]


@pytest.mark.parametrize("engine", ["em", "svi", "mcmc"])
def test_a_subclass_of_hmm_with_its_own_program_is_refused_by_every_engine(engine):
    model = PoissonEmissionHMM(2, seed=0, progress=False)
    with pytest.raises(TypeError, match=r"PoissonEmissionHMM replaces model\(\).*HMM\(emission=\.\.\.\)"):
        model.fit(_counts(), engine=engine)


def test_hmm_with_the_emission_as_a_family_is_the_way():
    assert HMM(2, emission="gaussian", seed=0, progress=False).fit(_counts(), max_iter=3).is_fitted


@pytest.fixture(scope="module")
def chain_fit():
    x = torch.as_tensor(np.random.default_rng(1).normal(size=(20, 5)))
    return ChainModel(2, seed=0, progress=False).fit(x, engine="svi", num_steps=5), x


@pytest.mark.parametrize("method", ["score_samples", "score", "predict_proba", "predict", "to_arviz"])
def test_a_markov_chain_written_on_mixture_model_gets_a_clear_error_from_per_point_outputs(chain_fit, method):
    model, x = chain_fit
    with pytest.raises(NotImplementedError, match=r"ChainModel's program enumerates .* pyro\.markov chain"):
        getattr(model, method)(x)


def test_the_chain_still_has_its_elbo_from_pyro(chain_fit):
    """What the base class can compute correctly for such a program stays available."""
    model, x = chain_fit
    assert np.isfinite(model.elbo(x))
