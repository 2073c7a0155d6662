"""The EM engine on a scripted model: stopping rule, restarts, history and failures."""

from __future__ import annotations

import math

import pytest
import torch

from ppmix.engines.em import EM_HOOKS, EMModel
from ppmix.inference import ConvergenceWarning, run_em


class Scripted:
    """A stand-in model whose objective after each M-step follows a given sequence per restart.

    It implements the :class:`EMModel` protocol and nothing else: the engine needs no more.
    """

    n_init, init_iter, max_iter, tol, warm_start = 1, None, 100, 1e-6, False
    progress = False
    is_fitted = False

    def __init__(self, sequences, **attrs):
        self.sequences, self.restart, self.step = sequences, -1, 0
        self.__dict__.update(attrs)

    def _em_data(self, data):
        return data

    def _n_observations(self, data):
        return 10

    def _em_initialize(self, data, generator):
        self.restart += 1
        self.step = 0

    def _e_step(self, data):
        return None, torch.tensor(self.sequences[self.restart][self.step], dtype=torch.float64)

    def _m_step(self, data, stats):
        self.step += 1

    def _get_globals(self):
        return {"restart": torch.tensor(self.restart)}

    def _set_globals(self, values):
        self.kept = int(values["restart"])

    def _generator(self, offset=0):
        return torch.Generator().manual_seed(offset)


def test_the_stand_in_and_every_em_model_follow_the_protocol():
    from ppmix import GMM, HMM, PFGMM, PFHMM, MixtureModel, MixtureOfExperts, SupervisedGMM

    assert isinstance(Scripted([[0.0]]), EMModel)
    for cls in (GMM, HMM, PFGMM, SupervisedGMM, PFHMM, MixtureOfExperts):
        model = cls(2)
        assert isinstance(model, EMModel) and model.supports_em, cls.__name__
        assert all(getattr(cls, hook) is not getattr(MixtureModel, hook) for hook in EM_HOOKS), cls.__name__

    class WithoutHooks(MixtureModel):  # inherits the settings, writes no hook: no EM
        pass

    assert not WithoutHooks(2).supports_em


def test_stops_on_relative_tolerance_and_records_history_per_point():
    model = Scripted([[-100.0, -50.0, -40.0, -39.99, -39.98999]])
    result = run_em(model, None, tol=1e-3, max_iter=10)
    assert result.converged and result.n_iter == 3
    assert result.history == pytest.approx([-10.0, -5.0, -4.0, -3.999], rel=1e-12)


def test_keeps_the_best_restart():
    model = Scripted([[-10.0, -9.0, -9.0], [-10.0, -2.0, -2.0], [-10.0, -5.0, -5.0]])
    result = run_em(model, None, n_init=3, tol=0.0, max_iter=2)
    assert model.kept == 1 and result.history[-1] == -0.2


def test_warns_when_iterations_run_out():
    model = Scripted([[-10.0, -9.0, -8.0, -7.0]])
    with pytest.warns(ConvergenceWarning):
        result = run_em(model, None, tol=1e-9, max_iter=3)
    assert not result.converged and result.n_iter == 3


def test_non_finite_objective_is_an_error():
    model = Scripted([[-10.0, math.nan]])
    with pytest.raises(FloatingPointError, match="iteration 1"):
        run_em(model, None, max_iter=3)


@pytest.mark.parametrize(
    "kwargs, match", [({"n_init": 0}, "n_init"), ({"max_iter": 0}, "max_iter"), ({"tol": -1.0}, "tol")]
)
def test_bad_engine_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_em(Scripted([[0.0]]), None, **kwargs)


def test_a_decreasing_objective_is_logged(caplog):
    model = Scripted([[-10.0, -5.0, -6.0, -6.0]])
    with caplog.at_level("WARNING", logger="ppmix.engines.em"):
        run_em(model, None, tol=0.0, max_iter=3)
    assert [r.message for r in caplog.records if "decreased at iteration 2" in r.getMessage()]


def test_a_rounding_level_decrease_is_not_logged(caplog):
    model = Scripted([[-10.0, -5.0, -5.0 - 1e-12, -5.0 - 1e-12]])
    with caplog.at_level("WARNING", logger="ppmix.engines.em"):
        run_em(model, None, tol=0.0, max_iter=3)
    assert not [r for r in caplog.records if "decreased" in r.getMessage()]


class Resumable(Scripted):
    """A stand-in whose kept parameters are its place in the sequence: restoring them resumes that run."""

    def _get_globals(self):
        return {"restart": torch.tensor(self.restart), "step": torch.tensor(self.step)}

    def _set_globals(self, values):
        self.restart, self.step = int(values["restart"]), int(values["step"])


def test_small_em_runs_on_only_the_best_short_run():
    plateau = [-10.0, -3.0, -2.5, -2.4, -2.4]  # best after two iterations, not at convergence
    late = [-10.0, -6.0, -5.0, -1.0, -1.0]
    model = Resumable([[-10.0, -9.0, -8.0, -8.0, -8.0], plateau, late])
    result = run_em(model, None, n_init=3, init_iter=2, tol=0.0, max_iter=10)
    assert model.restart == 1  # chosen on the short runs, then resumed, not restarted
    assert result.history == pytest.approx([v / 10 for v in plateau])
    assert result.converged and result.n_iter == 4
    # without init_iter every start runs to convergence and the late one wins
    result = run_em(Resumable([[-10.0, -9.0, -8.0, -8.0, -8.0], plateau, late]), None, n_init=3, tol=0.0, max_iter=10)
    assert result.history[-1] == pytest.approx(-0.1)
    with pytest.raises(ValueError, match="init_iter"):
        run_em(Resumable([[0.0]] * 2), None, n_init=2, init_iter=0)
