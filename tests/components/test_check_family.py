"""A family written outside the package: ``ppmix.testing.check_family`` passes it, one call registers it, and
structures fit, save and load it by name; ``check_family`` names what a broken family breaks.

``LaplaceFamily`` below is what a user writes (about 70 lines): its parameters are listed in another order than
its constructor takes them (they are passed by name) and its components read the family's data scale (a floor on
the scales, passed in the family's ``components``, the one constructor of its components), which warm starts and
``fit_em`` hand it.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import warnings

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions import constraints

from ppmix import HMM, Mixture
from ppmix.components import (
    AutoRegressiveComponents,
    AutoRegressiveFamily,
    ComponentFamily,
    DensityFamily,
    Moments,
    SiteSpec,
    Statistics,
    register_family,
    registry,
)
from ppmix.components.autoregressive import lagged_sequences
from ppmix.components.family_tools import loaded, rescaled
from ppmix.distributed import fit_em
from ppmix.testing import check_family
from tests.common import make_family_sequences


# ------------------------------------------------------------------------------ the user's family (~70 lines)
@dataclasses.dataclass(frozen=True)
class LaplaceRows(Statistics):
    """The weighted median needs the rows: the statistics are the rows and their weights (merged by stacking)."""

    counts: torch.Tensor
    x: torch.Tensor
    weights: torch.Tensor

    def merge(self, other: "LaplaceRows") -> "LaplaceRows":
        return LaplaceRows(
            self.counts + other.counts, torch.cat([self.x, other.x]), torch.cat([self.weights, other.weights])
        )

    def scaled(self, factor: float) -> "LaplaceRows":
        return LaplaceRows(self.counts * factor, self.x, self.weights * factor)

    def to(self, dtype=None, device=None) -> "LaplaceRows":
        return LaplaceRows(*(t.to(dtype=dtype, device=device) for t in (self.counts, self.x, self.weights)))


class LaplaceComponents(ComponentFamily):
    param_names = ("scale", "loc")  # not the constructor's order: parameters are passed by name

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, floor: torch.Tensor | float = 1e-6) -> None:
        self.loc, self.scale, self.floor = loc, scale, floor

    def moments(self) -> Moments:
        return Moments(self.loc, 2 * self.scale.square())

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return dist.Laplace(self.loc, self.scale).log_prob(x.to(self.dtype)[:, None, :]).sum(-1)

    def statistics(self, x: torch.Tensor, weights: torch.Tensor) -> LaplaceRows:
        weights = self._check_weights(weights, x.shape[0])
        return LaplaceRows(weights.sum(0), x.to(self.dtype), weights)

    def fit_statistics(self, stats: LaplaceRows) -> "LaplaceComponents":
        """The weighted median of every feature (the first row past half the weight) and the weighted mean absolute
        deviation from it, at least the floor."""
        order = stats.x.argsort(0)  # (N, D)
        cumulative = stats.weights[order].cumsum(0)  # (N, D, K)
        first = (cumulative < cumulative[-1:] / 2).sum(0).clamp_max(stats.x.shape[0] - 1)  # (D, K)
        self.loc = stats.x.gather(0, order).gather(0, first.T)  # (K, D)
        deviation = (stats.x[:, None, :] - self.loc).abs()  # (N, K, D)
        totals = stats.counts.clamp_min(1e-300)[:, None]
        self.scale = torch.maximum((stats.weights[..., None] * deviation).sum(0) / totals, torch.as_tensor(self.floor))
        return self

    def pyro_dist(self, index: torch.Tensor | None = None) -> dist.Distribution:
        loc, scale = (self.loc, self.scale) if index is None else (self.loc[index], self.scale[index])
        return dist.Laplace(loc, scale).to_event(1)

    def sample(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        u = torch.rand(self.loc[index].shape, generator=generator, dtype=self.dtype) - 0.5
        return self.loc[index] - self.scale[index] * u.sign() * torch.log1p(-2 * u.abs())


class LaplaceFamily(DensityFamily):
    """Laplace components on independent features; the scales' floor is a millionth of each feature's range."""

    name = "laplace"
    components_class = LaplaceComponents

    def sites(self, k: int, d: int) -> dict[str, SiteSpec]:
        return {"loc": SiteSpec(constraints.real, (d,)), "scale": SiteSpec(constraints.positive, (d,))}

    def data_scale(self, x: torch.Tensor, name: str = "X") -> dict[str, torch.Tensor]:
        return {"range": x.amax(0) - x.amin(0)}

    def components(self, values: dict[str, torch.Tensor], scale: dict[str, torch.Tensor]) -> LaplaceComponents:
        floor = 1e-6 * scale["range"]  # a KeyError if a warm start or fit_em handed an empty scale
        return self.components_class(values["loc"], values["scale"], floor)


# ------------------------------------------------------------------------------------------------- the tests
PLANTED = np.array([[0.0, 0.0], [6.0, -4.0]])


def _rows(n: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return PLANTED[np.arange(n) % 2] + rng.laplace(0.0, 0.7, (n, 2))


@pytest.fixture
def families(monkeypatch):
    """The registry's families, restored after the test (a registration stays in the test)."""
    monkeypatch.setattr(registry, "FAMILIES", dict(registry.FAMILIES))
    return registry.FAMILIES


def test_a_family_written_outside_the_package_passes_check_family_registers_and_saves_by_name(families, tmp_path):
    x = _rows()
    check_family(LaplaceFamily(), x)
    register_family("laplace", LaplaceFamily)
    mix = Mixture(2, family="laplace", seed=0, progress=False).fit(x)
    order = np.argsort(mix.means_[:, 0].numpy())
    np.testing.assert_allclose(mix.means_.numpy()[order], PLANTED, atol=0.2)  # swapped parameters would not be
    loaded = Mixture.load(mix.save(tmp_path / "mix"))
    assert isinstance(loaded._component_family(), LaplaceFamily)
    np.testing.assert_array_equal(loaded.predict_proba(x), mix.predict_proba(x))
    hmm = HMM(2, emission="laplace", seed=0, progress=False).fit(np.array_split(x, 6))
    assert HMM.load(hmm.save(tmp_path / "hmm")).score(np.array_split(x, 6)) == hmm.score(np.array_split(x, 6))


def test_parameters_are_passed_by_name_in_any_order():
    """``param_names`` lists ``scale`` first, the constructor takes ``loc`` first: the components built by the
    default ``components`` (sites by name), from the site values (Pyro), from a state (loads) and on a new scale
    (warm starts) hold each tensor under its own name; the last three take the floor of their data scale."""
    family = LaplaceFamily()
    loc, scale = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]])
    data_scale, opts = {"range": torch.tensor([5.0, 7.0])}, {"dtype": torch.float32}
    by_default = DensityFamily.components(family, {"loc": loc, "scale": scale}, data_scale)
    built = family.components({"loc": loc, "scale": scale}, data_scale)
    state = loaded(family, {"scale": scale, "loc": loc}, 1, 2, data_scale, opts)
    moved = rescaled(family, by_default, data_scale)
    for components in (by_default, built, state, moved):
        assert torch.equal(components.loc, loc) and torch.equal(components.scale, scale)
    for components in (built, state, moved):
        assert torch.equal(components.floor, 1e-6 * data_scale["range"])


@pytest.mark.parametrize("structure", ["Mixture", "HMM"])
def test_a_family_reading_its_data_scale_survives_warm_starts_and_fit_em(structure, tmp_path):
    """The components' floor reads the recorded data scale: a warm start and ``fit_em`` (until now handed an empty
    scale, a ``KeyError``) keep the training data's."""
    x = _rows()
    if structure == "Mixture":
        model, data, shards = Mixture(2, family=LaplaceFamily(), seed=0, progress=False), x, []
        for i, part in enumerate(np.array_split(x, 2)):
            shards.append(tmp_path / f"part{i}.npy")
            np.save(shards[-1], part)
    else:
        model, data = HMM(2, emission=LaplaceFamily(), seed=0, progress=False), np.array_split(x, 6)
        shards = [tmp_path / "all.npz"]
        np.savez(shards[0], X=x, lengths=np.full(6, 50))
    floor = 1e-6 * torch.as_tensor(np.ptp(x, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(data, max_iter=3)
        for fit in (lambda m: m.fit(data, max_iter=3), lambda m: fit_em(m, shards, executor="inline", max_iter=3)):
            warm = fit(copy.deepcopy(model).set_params(warm_start=True))
            assert np.isfinite(warm.history_).all()
            assert torch.equal(warm.components_.floor, floor)


class _MeanLaplace(LaplaceComponents):
    def fit_statistics(self, stats):  # the weighted mean: not the Laplace MLE of the location
        super().fit_statistics(stats)
        self.loc = (stats.weights.T @ stats.x) / stats.counts[:, None]
        return self


@dataclasses.dataclass(frozen=True)
class _Uncounted(Statistics):  # statistics without the counts EM reads
    x: torch.Tensor

    def merge(self, other):
        return self

    def scaled(self, factor):
        return self

    def to(self, dtype=None, device=None):
        return self


class _UncountedLaplace(LaplaceComponents):
    def statistics(self, x, weights):
        return _Uncounted(x)


class _Unsampled(LaplaceComponents):
    sample = ComponentFamily.sample


def _family_of(components: type) -> DensityFamily:
    return type("BrokenLaplace", (LaplaceFamily,), {"components_class": components})()


@pytest.mark.parametrize(
    "components, message",
    [
        (_MeanLaplace, r"failed the M-step: parameters near the M-step's have a higher weighted log-likelihood"),
        (_UncountedLaplace, r"failed the contract: TypeError: _Uncounted has no 'counts'"),
        (_Unsampled, r"failed the contract: _Unsampled does not write \['sample'\]"),
    ],
    ids=["not-the-mle", "no-counts", "abstract"],
)
def test_check_family_names_what_a_broken_family_breaks(components, message):
    with pytest.raises(AssertionError, match=message):
        check_family(_family_of(components), _rows(120), structures=())


class _LagBlind(AutoRegressiveComponents):
    def fit_statistics(self, stats):  # the lags ignored: not the weighted least squares of the frames on them
        super().fit_statistics(stats)
        self.weights = torch.zeros_like(self.weights)
        return self


class _LagBlindFamily(AutoRegressiveFamily):
    name = "lag_blind"
    components_class = _LagBlind

    def components(self, values, scale):
        fitted = super().components(values, scale)
        return _LagBlind(fitted.weights, fitted.bias, fitted.scale_tril, fitted.reg_covar, fitted.diagonal)


class _LeakyLagsFamily(AutoRegressiveFamily):
    name = "leaky_lags"

    def sequence_rows(self, x):  # lags run on across the padded batch: a sequence's first lags depend on the batch
        b, t, d = x.shape
        return lagged_sequences(x.reshape(1, b * t, d), self.lags).reshape(b, t, -1)


def _sequences(n: int = 6) -> list[np.ndarray]:
    return make_family_sequences("autoregressive", n, (10, 20), 2)[0]


@pytest.mark.parametrize(
    "family, message",
    [
        (_LagBlindFamily(), r"failed the M-step: parameters near the M-step's have a higher weighted log-likelihood"),
        (_LeakyLagsFamily(), r"failed EM on shards = EM in memory in HMM: the history of EM on shards"),
    ],
    ids=["not-the-least-squares", "lags-across-sequences"],
)
def test_check_family_names_what_a_broken_sequence_family_breaks(family, message):
    """A sequence family is checked on the rows its sequences make (``AutoRegressiveFamily`` itself passes in
    tests/components/test_families.py): an autoregression ignoring its lags is not the M-step's MLE, and one whose
    lags run on from one sequence into the next gives another fit on shards than in memory."""
    with pytest.raises(AssertionError, match=message):
        check_family(family, _sequences())


@pytest.mark.parametrize(
    "family, data, structures, message",
    [
        (AutoRegressiveFamily(), np.zeros((40, 2)), None, r"data must be a list of sequences .* sequence family"),
        (AutoRegressiveFamily(), _sequences(), ("Mixture",), r"structures must not name 'Mixture' .*\('HMM',\)"),
        (AutoRegressiveFamily(), _sequences(2), None, r"at least 3 arrays \(T_i, n_features\)"),
        (LaplaceFamily(), np.zeros((2, 3, 4)), None, r"a 2-D array of rows .* or a list of sequences"),
        (LaplaceFamily(), _rows(40), ("GMM",), r"structures must be among \('Mixture', 'HMM'\)"),
    ],
    ids=["rows-for-a-sequence-family", "mixture-of-sequences", "two-sequences", "3-d", "unknown-structure"],
)
def test_check_family_refuses_data_and_structures_it_cannot_check(family, data, structures, message):
    with pytest.raises(ValueError, match=message):
        check_family(family, data, structures=structures)


def test_a_family_of_rows_is_checked_on_sequences_too():
    """Sequences given to a family of rows: the ``HMM`` fits them as given and the ``Mixture`` their frames."""
    check_family(LaplaceFamily(), np.array_split(_rows(120), 4))


def test_register_family_refuses_a_wrong_name_a_non_family_and_a_taken_name(families):
    with pytest.raises(ValueError, match=r"name must be the family's own name, LaplaceFamily.name = 'laplace'"):
        register_family("laplacian", LaplaceFamily)
    with pytest.raises(TypeError, match="cls must be a subclass of DensityFamily"):
        register_family("laplace", LaplaceComponents)
    taken = type("PoissonImpostor", (LaplaceFamily,), {"name": "poisson"})
    with pytest.raises(ValueError, match="'poisson' is registered to another family, PoissonFamily"):
        register_family("poisson", taken)
    unfinished = type("Unfinished", (DensityFamily,), {"name": "unfinished"})  # no sites
    with pytest.raises(TypeError, match=r"cls Unfinished is abstract: it must write \['sites'\]"):
        register_family("unfinished", unfinished)
    register_family("laplace", LaplaceFamily)
    register_family("laplace", LaplaceFamily)  # again: nothing happens
    assert registry.family_class("laplace") is LaplaceFamily


class EntryPointLaplace(LaplaceFamily):
    name = "laplace_entry_point"


def test_an_installed_package_registers_its_family_by_entry_point(families, monkeypatch, tmp_path):
    entry = importlib.metadata.EntryPoint(
        "laplace_entry_point", f"{__name__}:EntryPointLaplace", registry.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [entry] if group == entry.group else [])
    monkeypatch.setattr(registry, "_entry_points_read", False)
    mix = Mixture(2, family="laplace_entry_point", seed=0, progress=False).fit(_rows(100))
    assert type(Mixture.load(mix.save(tmp_path / "mix"))._component_family()) is EntryPointLaplace
