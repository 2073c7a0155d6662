"""Autoguides that start at the fit (issue 40, item 5): ``fitted_autoguide`` against a user's own ``AutoNormal``."""

from __future__ import annotations

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions.transforms import biject_to
from pyro.infer import SVI, Predictive, TraceEnum_ELBO, config_enumerate
from pyro.infer.autoguide import AutoDelta, AutoNormal, init_to_value

from ppmix import GMM, PFGMM
from ppmix._validation import NotFittedError
from ppmix.engines.svi import fitted_autoguide
from tests.common import assert_close


def _two_groups(shift=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-3, 1, (40, 2)), rng.normal(3, 1, (40, 2))]) + shift


@pytest.fixture(scope="module")
def fits():
    """Two EM fits whose means differ by 100: a guide that starts at the wrong one is caught at once."""
    return [GMM(2, seed=0, progress=False).fit(_two_groups(shift)) for shift in (0.0, 100.0)]


def test_autonormal_and_autodelta_start_at_the_fitted_globals(fits):
    gmm = fits[0]
    data, fitted = gmm.prepare_data(_two_groups()), gmm._get_globals()
    normal = fitted_autoguide(gmm, "normal")
    assert isinstance(normal, AutoNormal)
    for name, value in fitted.items():
        # the initial loc, in the unconstrained space of the site's support, is the fit's value mapped there
        support = poutine.trace(gmm.model).get_trace(data).nodes[name]["fn"].support
        assert_close(getattr(normal.locs, name), biject_to(support).inv(value), rtol=1e-10)
        assert_close(normal.median(data)[name], value, rtol=1e-10)
        assert_close(getattr(normal.scales, name), torch.full_like(biject_to(support).inv(value), 0.01), rtol=0)
    delta = fitted_autoguide(gmm, "delta")
    assert isinstance(delta, AutoDelta)
    for name, value in fitted.items():
        assert_close(delta(data)[name], value, rtol=1e-12)


def test_two_models_guides_each_start_at_their_own_fit_in_the_global_param_store(fits):
    """The pitfall of a user's own autoguides: Pyro's global param store keeps the first guide's values under
    ``AutoNormal.locs.locs``, and the second guide starts there instead of at its fit."""
    first, second = fits
    datas = [m.prepare_data(_two_groups(s)) for m, s in zip(fits, (0.0, 100.0))]
    own = []
    for m, data in zip(fits, datas):
        guide = AutoNormal(poutine.block(m.model, hide=["z"]), init_loc_fn=init_to_value(values=m._get_globals()))
        guide(data)
        own.append(guide.median(data)["locs"])
    assert_close(own[0], first.means_, rtol=1e-10)
    assert float((own[1] - second.means_).abs().max()) > 50  # the user's second guide starts at the first fit
    guides = [fitted_autoguide(m, "normal") for m in fits]
    for m, guide, data in zip(fits, guides, datas):
        assert_close(guide.median(data)["locs"], m.means_, rtol=1e-10)
    # usable as it is by Pyro's SVI (its parameters are in the param store, under names of their own)
    svi = SVI(first.model, guides[0], pyro.optim.Adam({"lr": 1e-3}), TraceEnum_ELBO(max_plate_nesting=1))
    assert np.isfinite(svi.step(datas[0]))
    assert any(name.startswith("GMM_fit_") for name in pyro.get_param_store().keys())
    draws = Predictive(first.model, guide=guides[0], num_samples=3, return_sites=["locs"])(datas[0])["locs"]
    assert draws.shape == (3, 2, 2) and float((draws - first.means_).abs().max()) < 1.0


def test_pf_model_guide_covers_the_globals_with_switches_and_assignments_left_to_the_model():
    x = _two_groups()
    y = (x[:, 0] > 0).astype(int)
    pf = PFGMM(2, switch_prior=0.5, seed=0, progress=False).fit(x, y)
    data = pf.prepare_data(x, y)
    guide = fitted_autoguide(pf, "delta")
    fitted = pf._get_globals()
    assert set(guide.median(data)) == set(fitted) - {"switch_probs"}  # the switch posterior is no site
    for name, value in guide.median(data).items():
        assert_close(value, fitted[name], rtol=1e-12)
    loss = TraceEnum_ELBO(max_plate_nesting=2).loss(config_enumerate(pf.model, "parallel"), guide, data)
    assert np.isfinite(loss)


def test_an_unfitted_model_is_refused():
    with pytest.raises(NotFittedError, match="not fitted"):
        fitted_autoguide(GMM(2, progress=False))
