"""``to_arviz()`` where it cannot give posterior draws (issue 49, item 6): after a ``missing="marginalize"`` fit it
refuses the rows with missing entries up front (one message naming the entry and what takes them, no Pyro trace
dump), and a user family whose log-density is not twice differentiable in a parameter is named as the reason there is
no Laplace approximation (not "an empty or duplicated component?")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions import constraints

from ppmix import GMM, HMM, Mixture
from ppmix.components import AdditiveStatistics, ComponentFamily, DensityFamily, FamilyPriors, Moments, SiteSpec
from ppmix.models._arviz import PointEstimateWarning, curvature_free_sites

RNG = np.random.default_rng(0)
X = np.r_[RNG.laplace(0.0, 1.0, (60, 2)), RNG.laplace(6.0, 1.0, (60, 2))]


@pytest.mark.parametrize(
    "make, data",
    [
        (lambda: GMM(2, missing="marginalize", seed=0, progress=False), lambda x: x),
        (lambda: HMM(2, missing="marginalize", seed=0, progress=False), lambda x: [x[:60], x[60:]]),
    ],
)
def test_to_arviz_refuses_missing_entries_up_front_and_takes_the_complete_rows(make, data, capsys):
    x = X.copy()
    x[3, 1] = np.nan
    model = make().fit(data(x))
    with pytest.raises(ValueError, match=r"to_arviz\(\) needs data without missing entries.*NaN at \(3, 1\)") as info:
        model.to_arviz()
    assert "Trace Shapes" not in str(info.value) and "missing='marginalize', fit, partial_fit, predict" in str(
        info.value
    )
    assert "Trace Shapes" not in capsys.readouterr().err
    complete = data(np.delete(x, 3, axis=0)) if isinstance(model, GMM) else [x[60:]]
    assert "posterior" in model.to_arviz(complete, approximation=None).groups()


# ----------------------------------------------------------- a user family that is not smooth in its location
@dataclass(frozen=True)
class _Rows(AdditiveStatistics):
    counts: torch.Tensor  # (K,)
    x: torch.Tensor  # (N, D): the rows (a weighted median needs them all)
    weights: torch.Tensor  # (N, K)


class _Laplaces(ComponentFamily):
    """Laplace components: ``log p = -log(2 scale) - |x - loc| / scale``, piecewise linear in ``loc``."""

    param_names = ("loc", "scale")

    def __init__(self, loc, scale):
        self.loc, self.scale = loc, scale

    def moments(self):
        return Moments(self.loc, 2 * self.scale.square())

    def log_prob(self, x):
        return dist.Laplace(self.loc, self.scale).log_prob(x[:, None, :]).sum(-1)

    def statistics(self, x, weights):
        return _Rows(weights.sum(0), x, weights)

    def fit_statistics(self, stats):  # the weighted median and mean absolute deviation of every component
        order = stats.x.argsort(0)
        locs = []
        for w in stats.weights.T:
            cumulative = w[order].cumsum(0)
            locs.append(stats.x.gather(0, order).gather(0, (cumulative < cumulative[-1:] / 2).sum(0, keepdim=True))[0])
        self.loc = torch.stack(locs)
        deviation = (stats.x[:, None, :] - self.loc).abs()
        self.scale = ((stats.weights[..., None] * deviation).sum(0) / stats.counts[:, None]).clamp_min(1e-6)
        return self

    def pyro_dist(self, index):
        return dist.Laplace(self.loc[index], self.scale[index]).to_event(1)

    def sample(self, index, generator=None):
        return dist.Laplace(self.loc[index], self.scale[index]).sample()


class _LaplacePriors(FamilyPriors):
    def prior(self, site, k, d, scale, opts):
        return (
            dist.Normal(torch.zeros(d, **opts), 10.0).to_event(1)
            if site == "loc"
            else dist.LogNormal(torch.zeros(d, **opts), 2.0).to_event(1)
        )


class _LaplaceFamily(DensityFamily):
    name = "laplace"
    components_class = _Laplaces

    def sites(self, k, d):
        return {"loc": SiteSpec(constraints.real, (d,)), "scale": SiteSpec(constraints.positive, (d,))}

    def priors(self):
        return _LaplacePriors(self)


def test_a_family_without_curvature_in_a_parameter_is_named_as_the_reason_for_no_laplace_draws():
    mix = Mixture(2, family=_LaplaceFamily(), seed=0, progress=False).fit(X)
    assert sorted(np.round(mix.means_[:, 0].numpy())) == [0.0, 6.0]
    assert curvature_free_sites(mix, mix.prepare_data(X)) == ["loc"]
    with pytest.raises(ValueError, match=r"_Laplaces has no curvature in loc .* for posterior draws, fit with engine="):
        mix.to_arviz(approximation="laplace")
    with pytest.warns(PointEstimateWarning, match=r"engine='mcmc'.*no curvature in loc") as record:
        idata = mix.to_arviz()
    assert idata.attrs["ppmix_draws"] == "point_estimate"
    assert not any("duplicated component" in str(w.message) for w in record)


def test_smooth_families_have_no_curvature_free_site():
    counts = RNG.poisson(3.0, (40, 2)).astype(float)
    for model, x in (
        (GMM(2, seed=0, progress=False), X),
        (Mixture(2, family="poisson", seed=0, progress=False), counts),
    ):
        model.fit(x)
        assert curvature_free_sites(model, model.prepare_data(x)) == []
