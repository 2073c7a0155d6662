"""CUDA paths of the EM engines: a ``device="cuda"`` fit equals the CPU fit, outputs land where they should.

Every test needs a GPU (``requires_cuda``) and is skipped without one. The data are tiny, so the
file runs in seconds on a GPU.

Tolerances. A float64 fit on CUDA starts from the same initialisation as on the CPU (the
k-means seeding and random starts draw from a CPU ``torch.Generator`` in both cases), and every
later step is the same arithmetic; only the order of the floating-point reductions differs
(cuBLAS vs MKL/OpenBLAS matrix products, tree vs sequential sums), about 1e-16 relative per
operation. EM is a contraction near a well-separated optimum, so these differences do not grow:
parameters, log-likelihoods and posteriors agree to ~1e-12. We test at ``rtol=1e-8`` (plus an
``atol`` for entries that are zero up to rounding): a hundred times the margin any reordering
can produce, and far below what a wrong initialisation, a skipped update, a parameter left on the
wrong device or float32 arithmetic (relative error ~1e-7 per operation, ~1e-5 after a fit) would
give. Iteration counts and hard assignments (labels, Viterbi paths) must be identical, and a model
saved on CUDA must load on the CPU with its saved tensors bit for bit equal. float32
fits on CUDA are compared with the float64 CPU fit at ``rtol=1e-3``/``atol=1e-3`` on parameters
of order one, and 1e-4 relative on the mean log-likelihood.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ppmix import GMM, HMM, PFGMM, Mixture, MixtureOfExperts
from ppmix.datasets import make_pf_synthetic
from ppmix.inference import ConvergenceWarning, forward_backward, viterbi
from tests.common import (
    FAMILY_DATA,
    assert_close,
    make_expert_data,
    make_family_rows,
    make_family_sequences,
    requires_cuda,
)

pytestmark = requires_cuda

#: the accelerator every test compares against the CPU
GPU = "cuda"

F64 = {"rtol": 1e-8, "atol": 1e-10}
F32 = {"rtol": 1e-3, "atol": 1e-3}


def _is_on_gpu(t: torch.Tensor) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == torch.device(GPU).type


def _assert_same_state(loaded, fitted) -> None:
    """The tensors a model saves are stored bit for bit (derived attributes may differ by rounding across devices)."""
    mine, theirs = loaded._state_tensors(), fitted._state_tensors()
    assert mine.keys() == theirs.keys()
    for name, value in mine.items():
        assert value.dtype == theirs[name].dtype, name
        assert torch.equal(value.cpu(), theirs[name].cpu()), name


def _fit_quietly(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(*args, **kwargs)


# ---------------------------------------------------------------------- data
def gmm_data(n: int = 300, seed: int = 0) -> np.ndarray:
    """Three well-separated clusters in 3-D (unequal weights and scales)."""
    rng = np.random.default_rng(seed)
    means = np.array([[-5.0, 0.0, 1.0], [4.0, 4.0, -2.0], [0.0, -6.0, 5.0]])
    scales = np.array([[1.0, 0.5, 0.8], [0.6, 1.2, 0.7], [0.9, 0.9, 0.4]])
    z = rng.choice(3, size=n, p=[0.5, 0.3, 0.2])
    return means[z] + scales[z] * rng.normal(size=(n, 3))


def hmm_data(n_sequences: int = 12, seed: int = 0) -> list[np.ndarray]:
    """Sticky 2-state chains, lengths 5..30 (unequal, so padding is exercised), 2-D emissions."""
    rng = np.random.default_rng(seed)
    means = np.array([[-3.0, 0.0], [3.0, 1.0]])
    seqs = []
    for _ in range(n_sequences):
        n = int(rng.integers(5, 31))
        z = np.empty(n, dtype=int)
        z[0] = rng.integers(2)
        for t in range(1, n):
            z[t] = z[t - 1] if rng.random() < 0.9 else 1 - z[t - 1]
        seqs.append(means[z] + rng.normal(size=(n, 2)))
    return seqs


def moe_data(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two linear regimes split at x_0 = 0."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, size=(n, 2))
    y = np.where(x[:, 0] < 0, 2 * x[:, 0] + x[:, 1], -3 * x[:, 0] + 1) + 0.2 * rng.normal(size=n)
    return x, y


# ----------------------------------------------------------------------- GMM
def _gmm(covariance_type: str, device: str, dtype: torch.dtype = torch.float64) -> GMM:
    return GMM(3, covariance_type=covariance_type, seed=0, device=device, dtype=dtype, progress=False)


@pytest.mark.parametrize("covariance_type", ["diag", "full", "spherical", "tied"])
def test_gmm_cuda_float64_matches_cpu(covariance_type):
    x = gmm_data()
    cpu = _gmm(covariance_type, "cpu").fit(x)
    gpu = _gmm(covariance_type, GPU).fit(x)
    assert gpu.n_iter_ == cpu.n_iter_ and gpu.converged_ == cpu.converged_
    for name in ("weights_", "means_", "covariances_"):
        value = getattr(gpu, name)
        assert _is_on_gpu(value) and value.dtype == torch.float64, name
        assert_close(value, getattr(cpu, name), **F64, msg=name)
    assert_close(gpu.history_, cpu.history_, **F64)
    assert gpu.score(x) == pytest.approx(cpu.score(x), rel=1e-8)
    assert gpu.bic(x) == pytest.approx(cpu.bic(x), rel=1e-8)
    # numpy in -> numpy out, equal to the CPU's
    for method in ("predict_proba", "score_samples"):
        out = getattr(gpu, method)(x)
        assert isinstance(out, np.ndarray), method
        assert_close(out, getattr(cpu, method)(x), **F64, msg=method)
    labels = gpu.predict(x)
    assert isinstance(labels, np.ndarray)
    np.testing.assert_array_equal(labels, cpu.predict(x))


@pytest.mark.parametrize("where", ["cuda-tensor", "cpu-tensor"])
def test_gmm_tensor_in_gives_tensor_on_cuda_out(where):
    x = gmm_data(120)
    gpu = _gmm("full", GPU).fit(x)
    xt = torch.as_tensor(x, device=GPU if where == "cuda-tensor" else "cpu")
    expected = gpu.predict_proba(x)
    for method in ("predict_proba", "score_samples", "predict"):
        out = getattr(gpu, method)(xt)
        assert _is_on_gpu(out), (method, out.device if isinstance(out, torch.Tensor) else type(out))
    assert_close(gpu.predict_proba(xt), expected, rtol=0, atol=0)


def test_gmm_fit_on_a_cuda_tensor_equals_fit_on_numpy():
    x = gmm_data(200)
    from_numpy = _gmm("diag", GPU).fit(x)
    from_tensor = _gmm("diag", GPU).fit(torch.as_tensor(x, device=GPU))
    assert_close(from_tensor.means_, from_numpy.means_, rtol=0, atol=0)


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_gmm_float32_on_cuda(covariance_type):
    x = gmm_data()
    ref = _gmm(covariance_type, "cpu").fit(x)
    gpu = _fit_quietly(_gmm(covariance_type, GPU, torch.float32), x)
    for name in ("weights_", "means_", "covariances_"):
        value = getattr(gpu, name)
        assert _is_on_gpu(value) and value.dtype == torch.float32, name
        assert_close(value, getattr(ref, name), **F32, msg=name)
    assert gpu.score(x) == pytest.approx(ref.score(x), rel=1e-4)
    np.testing.assert_array_equal(gpu.predict(x), ref.predict(x))
    assert gpu.predict_proba(torch.as_tensor(x, dtype=torch.float32, device=GPU)).dtype == torch.float32


def test_gmm_elbo_and_sample_on_cuda():
    """The Pyro program on CUDA tensors: TraceEnum_ELBO equals the EM log-likelihood (flat priors)."""
    x = gmm_data(150)
    gpu = _gmm("full", GPU).fit(x)
    cpu = _gmm("full", "cpu").fit(x)
    assert gpu.elbo(x) == pytest.approx(gpu.log_likelihood(x), rel=1e-8)
    assert gpu.elbo(x) == pytest.approx(cpu.elbo(x), rel=1e-8)
    draw = gpu.sample(50)
    assert isinstance(draw["x"], np.ndarray) and draw["x"].shape == (50, 3) and draw["z"].shape == (50,)


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_gmm_saved_on_cuda_loads_on_cpu(tmp_path, covariance_type):
    x = gmm_data(150)
    gpu = _gmm(covariance_type, GPU).fit(x)
    path = gpu.save(tmp_path / "gmm")
    cpu = GMM.load(path, map_location="cpu")
    assert cpu.means_.device.type == "cpu" and cpu.covariances_.device.type == "cpu"
    _assert_same_state(cpu, gpu)
    for name in ("weights_", "means_", "covariances_"):  # derived on each device (full: L L^T), to rounding
        assert_close(getattr(cpu, name), getattr(gpu, name), **F64, msg=name)
    assert_close(cpu.predict_proba(x), gpu.predict_proba(x), **F64)
    assert cpu.n_iter_ == gpu.n_iter_
    back = GMM.load(path)  # the saved device: CUDA again
    assert _is_on_gpu(back.means_)
    _assert_same_state(back, gpu)
    assert_close(back.score_samples(x), gpu.score_samples(x), **F64)


# ----------------------------------------------------------------------- HMM
def _hmm(covariance_type: str, device: str, dtype: torch.dtype = torch.float64) -> HMM:
    return HMM(2, covariance_type=covariance_type, seed=0, device=device, dtype=dtype, progress=False)


@pytest.mark.parametrize("covariance_type", ["diag", "full", "spherical", "tied"])
def test_hmm_cuda_float64_matches_cpu(covariance_type):
    seqs = hmm_data()
    cpu = _hmm(covariance_type, "cpu").fit(seqs)
    gpu = _hmm(covariance_type, GPU).fit(seqs)
    assert gpu.n_iter_ == cpu.n_iter_
    for name in ("initial_", "transition_", "means_", "covariances_"):
        value = getattr(gpu, name)
        assert _is_on_gpu(value) and value.dtype == torch.float64, name
        assert_close(value, getattr(cpu, name), **F64, msg=name)
    assert_close(gpu.history_, cpu.history_, **F64)
    assert gpu.score(seqs) == pytest.approx(cpu.score(seqs), rel=1e-8)
    post_gpu, post_cpu = gpu.predict_proba(seqs), cpu.predict_proba(seqs)
    assert len(post_gpu) == len(seqs)
    for p, q, s in zip(post_gpu, post_cpu, seqs):
        assert isinstance(p, np.ndarray) and p.shape == (len(s), 2)
        assert_close(p, q, **F64)
    (best_gpu, paths_gpu), (best_cpu, paths_cpu) = gpu.decode(seqs), cpu.decode(seqs)
    assert isinstance(best_gpu, np.ndarray)
    assert_close(best_gpu, best_cpu, **F64)
    for p, q in zip(paths_gpu, paths_cpu):
        assert isinstance(p, np.ndarray)
        np.testing.assert_array_equal(p, q)


def test_hmm_tensor_inputs_give_cuda_outputs():
    seqs = hmm_data(8)
    gpu = _hmm("diag", GPU).fit(seqs)
    on_gpu = [torch.as_tensor(s, device=GPU) for s in seqs]
    for post in gpu.predict_proba(on_gpu):
        assert _is_on_gpu(post)
    best, paths = gpu.decode(on_gpu)
    assert _is_on_gpu(best) and all(_is_on_gpu(p) for p in paths)
    # a padded (B, T, D) tensor with its lengths, both on the GPU
    lengths = torch.tensor([len(s) for s in seqs], device=GPU)
    padded = torch.nn.utils.rnn.pad_sequence(on_gpu, batch_first=True)
    assert gpu.score((padded, lengths)) == pytest.approx(gpu.score(seqs), rel=1e-12)
    for p, q in zip(gpu.predict((padded, lengths)), gpu.predict(seqs)):
        assert _is_on_gpu(p)
        np.testing.assert_array_equal(p.cpu().numpy(), q)


def test_hmm_float32_on_cuda():
    seqs = hmm_data()
    ref = _hmm("diag", "cpu").fit(seqs)
    gpu = _fit_quietly(_hmm("diag", GPU, torch.float32), seqs)
    for name in ("initial_", "transition_", "means_", "covariances_"):
        value = getattr(gpu, name)
        assert _is_on_gpu(value) and value.dtype == torch.float32, name
        assert_close(value, getattr(ref, name), **F32, msg=name)
    assert gpu.score(seqs) == pytest.approx(ref.score(seqs), rel=1e-4)
    for p, q in zip(gpu.predict(seqs), ref.predict(seqs)):
        np.testing.assert_array_equal(p, q)


def test_hmm_saved_on_cuda_loads_on_cpu(tmp_path):
    seqs = hmm_data(8)
    gpu = _hmm("full", GPU).fit(seqs)
    cpu = HMM.load(gpu.save(tmp_path / "hmm"), map_location="cpu")
    assert cpu.transition_.device.type == "cpu"
    _assert_same_state(cpu, gpu)
    for name in ("initial_", "transition_", "means_", "covariances_"):
        assert_close(getattr(cpu, name), getattr(gpu, name), **F64, msg=name)
    assert cpu.score(seqs) == pytest.approx(gpu.score(seqs), rel=1e-10)


# --------------------------------------------------------------------- PFGMM
@pytest.fixture(scope="module")
def pf_data():
    return make_pf_synthetic(300, n_relevant=3, n_features=8, seed=0)


def _pf(device: str, dtype: torch.dtype = torch.float64) -> PFGMM:
    return PFGMM(4, switch_prior=0.3, seed=0, device=device, dtype=dtype, progress=False)


def test_pfgmm_cuda_float64_matches_cpu(pf_data):
    X, y = pf_data.X, pf_data.y
    cpu = _pf("cpu").fit(X, y)
    gpu = _pf(GPU).fit(X, y)
    assert gpu.n_iter_ == cpu.n_iter_
    assert isinstance(gpu.relevance_, np.ndarray)
    assert_close(gpu.relevance_, cpu.relevance_, **F64)
    assert (gpu.relevance_ > 0.5).tolist() == pf_data.relevant.tolist()
    for name in ("weights_", "label_probs_"):
        value = getattr(gpu, name)
        assert _is_on_gpu(value), name
        assert_close(value, getattr(cpu, name), **F64, msg=name)
    assert_close(gpu.history_, cpu.history_, **F64)
    for method in ("predict_proba", "predict_components", "score_samples"):
        out = getattr(gpu, method)(X)
        assert isinstance(out, np.ndarray), method
        assert_close(out, getattr(cpu, method)(X), **F64, msg=method)
    out = gpu.predict_proba(torch.as_tensor(X))
    assert _is_on_gpu(out) and out.shape == (len(X), 2)


def test_pfgmm_float32_on_cuda_and_saved_model_loads_on_cpu(tmp_path, pf_data):
    X, y = pf_data.X, pf_data.y
    ref = _pf("cpu").fit(X, y)
    gpu32 = _fit_quietly(_pf(GPU, torch.float32), X, y)
    assert gpu32.weights_.dtype == torch.float32 and _is_on_gpu(gpu32.weights_)
    assert_close(gpu32.relevance_, ref.relevance_, **F32)
    assert_close(gpu32.predict_proba(X), ref.predict_proba(X), **F32)
    gpu = _pf(GPU).fit(X, y)
    cpu = PFGMM.load(gpu.save(tmp_path / "pf"), map_location="cpu")
    assert cpu.weights_.device.type == "cpu"
    _assert_same_state(cpu, gpu)
    assert_close(cpu.relevance_, gpu.relevance_, **F64)
    assert_close(cpu.predict_proba(X), gpu.predict_proba(X), **F64)


# ------------------------------------------------- every density family
def _family_model(structure: str, name: str, device: str):
    options = {"seed": 0, "device": device, "progress": False}
    if structure == "Mixture":
        return Mixture(2, family=name, **options)
    return HMM(2, emission=name, **options)


def _family_data(structure: str, name: str):
    if structure == "Mixture":
        return make_family_rows(name, 200, 3)[0]
    return make_family_sequences(name, 8, (10, 30), 3)[0]


@pytest.mark.parametrize("structure", ["Mixture", "HMM"])
@pytest.mark.parametrize("name", sorted(FAMILY_DATA))
def test_every_family_on_cuda_matches_cpu(structure, name):
    """Every registered family, in a mixture and as HMM emissions: the float64 fit on CUDA equals the CPU's."""
    x = _family_data(structure, name)
    cpu = _fit_quietly(_family_model(structure, name, "cpu"), x)
    gpu = _fit_quietly(_family_model(structure, name, GPU), x)
    assert gpu.n_iter_ == cpu.n_iter_
    mine, theirs = gpu._state_tensors(), cpu._state_tensors()
    assert mine.keys() == theirs.keys()
    for key, value in mine.items():
        if value.is_floating_point():
            assert _is_on_gpu(value), key
            assert_close(value, theirs[key], **F64, msg=key)
    assert gpu.score(x) == pytest.approx(cpu.score(x), rel=1e-8)
    gpu_post, cpu_post = gpu.predict_proba(x), cpu.predict_proba(x)
    for p, q in zip(gpu_post, cpu_post) if structure == "HMM" else [(gpu_post, cpu_post)]:
        assert isinstance(p, np.ndarray)
        assert_close(p, q, **F64)


def test_weighted_gmm_on_cuda_matches_cpu():
    """``sample_weight`` on CUDA: the weighted fit equals the CPU's."""
    x = gmm_data()
    weights = np.random.default_rng(1).uniform(0.2, 3.0, size=len(x))
    cpu = _gmm("full", "cpu").fit(x, sample_weight=weights)
    gpu = _gmm("full", GPU).fit(x, sample_weight=weights)
    assert gpu.n_iter_ == cpu.n_iter_
    for name in ("weights_", "means_", "covariances_"):
        assert_close(getattr(gpu, name), getattr(cpu, name), **F64, msg=name)
    assert gpu.score(x, sample_weight=weights) == pytest.approx(cpu.score(x, sample_weight=weights), rel=1e-8)


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_missing_values_on_cuda_match_cpu(covariance_type):
    """``missing="marginalize"`` on CUDA (the batched conditional path): the fit, the marginal scores of rows
    with missing entries and ``impute`` equal the CPU's."""
    x = gmm_data()
    holes = x.copy()
    holes[np.random.default_rng(2).random(x.shape) < 0.25] = np.nan
    holes[np.isnan(holes).all(axis=1), 0] = 0.0
    fits = [
        _fit_quietly(
            GMM(3, covariance_type=covariance_type, missing="marginalize", seed=0, device=d, progress=False), holes
        )
        for d in ("cpu", GPU)
    ]
    cpu, gpu = fits
    assert gpu.n_iter_ == cpu.n_iter_
    for name in ("weights_", "means_", "covariances_"):
        assert _is_on_gpu(getattr(gpu, name)), name
        assert_close(getattr(gpu, name), getattr(cpu, name), **F64, msg=name)
    assert_close(gpu.score_samples(holes), cpu.score_samples(holes), **F64)
    assert_close(gpu.impute(holes), cpu.impute(holes), **F64)


# ------------------------------------------------------ mixture of experts
#: the data's two regimes are split by a hyperplane, where an unpenalised gate has no finite maximum: its
#: slope grows along a direction where the likelihood is flat to ~1e-12 and EM stops on that slope wherever
#: the tolerance is met, so reordered sums move the stop by ~1e-7 relative (seen on an H100: gate slope
#: 486.55590 on CUDA, 486.55609 on the CPU). A small ridge gives the gate a finite, well-conditioned
#: maximum, where the devices can be held to F64.
RIDGE = {"ridge": 0.1}
#: the experts' EM contracts slowly (the logistic fit here takes ~130 iterations), and a slow contraction
#: multiplies the rounding of reordered sums by ~1 / (1 - rate) before the tolerance stops it: seen on an
#: H100, coefficients of order one equal to 1e-9 and those near zero (-0.00503) apart by 6e-8. Held at 1e-6,
#: far below what a wrong update or a parameter on the wrong device gives; the log-likelihood stays at 1e-8.
MOE = {"rtol": 1e-6, "atol": 1e-6}


def _moe(device: str, dtype: torch.dtype = torch.float64) -> MixtureOfExperts:
    return MixtureOfExperts(2, expert="gaussian", n_init=2, seed=0, device=device, dtype=dtype, progress=False, **RIDGE)


def test_moe_gaussian_cuda_float64_matches_cpu(tmp_path):
    X, y = moe_data()
    cpu = _moe("cpu").fit(X, y)
    gpu = _moe(GPU).fit(X, y)
    assert gpu.n_iter_ == cpu.n_iter_
    for name in ("coef_", "intercept_", "scale_", "gate_coef_", "gate_intercept_"):
        value = getattr(gpu, name)
        assert _is_on_gpu(value) and value.dtype == torch.float64, name
        assert_close(value, getattr(cpu, name), **MOE, msg=name)
    assert_close(gpu.history_, cpu.history_, **F64)
    assert gpu.log_likelihood(X, y) == pytest.approx(cpu.log_likelihood(X, y), rel=1e-8)
    for method in ("predict", "gate_probabilities", "predict_components"):
        out = getattr(gpu, method)(X)
        assert isinstance(out, np.ndarray), method
        assert_close(out, getattr(cpu, method)(X), **MOE, msg=method)
    assert _is_on_gpu(gpu.predict(torch.as_tensor(X)))
    loaded = MixtureOfExperts.load(gpu.save(tmp_path / "moe"), map_location="cpu")
    assert loaded.coef_.device.type == "cpu"
    _assert_same_state(loaded, gpu)
    assert_close(loaded.coef_, gpu.coef_, **F64)
    assert_close(loaded.predict(X), gpu.predict(X), **F64)


def test_weighted_moe_on_cuda_matches_cpu():
    """``sample_weight`` through the default mixture-of-experts fit on CUDA equals the CPU's."""
    X, y = moe_data()
    w = np.random.default_rng(4).integers(0, 3, size=len(y)).astype(float)
    cpu = _fit_quietly(_moe("cpu"), X, y, sample_weight=w)
    gpu = _fit_quietly(_moe(GPU), X, y, sample_weight=w)
    for name in ("coef_", "intercept_", "gate_coef_", "gate_intercept_"):
        assert _is_on_gpu(getattr(gpu, name)), name
        assert_close(getattr(gpu, name), getattr(cpu, name), **MOE, msg=name)
    assert gpu.score(X, y, sample_weight=w) == pytest.approx(cpu.score(X, y, sample_weight=w), rel=1e-8)


@pytest.mark.parametrize("expert", ["logistic", "poisson"])
def test_moe_glm_experts_on_cuda_match_cpu(expert):
    """The Newton M-step of the GLM experts (logistic, Poisson) on CUDA: the float64 fit equals the CPU's."""
    X, y = make_expert_data(300, expert=expert)
    models = [
        MixtureOfExperts(2, expert=expert, seed=0, device=device, progress=False, **RIDGE) for device in ("cpu", GPU)
    ]
    cpu, gpu = (_fit_quietly(model, X, y) for model in models)
    assert gpu.n_iter_ == cpu.n_iter_
    for name in ("coef_", "intercept_", "gate_coef_", "gate_intercept_"):
        value = getattr(gpu, name)
        assert _is_on_gpu(value), name
        assert_close(value, getattr(cpu, name), **MOE, msg=name)
    assert gpu.log_likelihood(X, y) == pytest.approx(cpu.log_likelihood(X, y), rel=1e-8)
    assert_close(gpu.predict(X), cpu.predict(X), **MOE)


def test_moe_gaussian_float32_on_cuda():
    X, y = moe_data()
    ref = _moe("cpu").fit(X, y)
    gpu = _fit_quietly(_moe(GPU, torch.float32), X, y)
    assert gpu.coef_.dtype == torch.float32 and _is_on_gpu(gpu.coef_)
    assert_close(gpu.coef_, ref.coef_, rtol=1e-2, atol=1e-2)
    assert gpu.log_likelihood(X, y) == pytest.approx(ref.log_likelihood(X, y), rel=1e-3)


# ---------------------------------------------- forward-backward and Viterbi
def random_hmm(batch: int, steps: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    log_init = torch.log_softmax(torch.randn(k, generator=g, dtype=torch.float64), 0)
    log_trans = torch.log_softmax(2 * torch.randn(k, k, generator=g, dtype=torch.float64), 1)
    log_emit = 3 * torch.randn(batch, steps, k, generator=g, dtype=torch.float64)
    return log_init, log_trans, log_emit


@pytest.mark.parametrize("method", ["auto", "logsumexp"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared-params", "per-sequence-params"])
def test_forward_backward_cuda_matches_cpu(method, shared):
    log_init, log_trans, log_emit = random_hmm(6, 40, 4, seed=1)
    if not shared:  # per-sequence initial and transition probabilities
        log_init = log_init.expand(6, 4) + 0.1 * torch.arange(6.0, dtype=torch.float64)[:, None]
        log_init = torch.log_softmax(log_init, -1)
        log_trans = torch.log_softmax(log_trans.expand(6, 4, 4) + 0.05 * log_emit[:, :4], -1)
    lengths = torch.tensor([40, 1, 17, 39, 2, 25])
    ref = forward_backward(log_init, log_trans, log_emit, lengths, method=method)
    on = [t.to(GPU) for t in (log_init, log_trans, log_emit, lengths)]
    res = forward_backward(*on, method=method)
    for name in ("log_likelihood", "posterior", "pair_counts", "initial"):
        value = getattr(res, name)
        assert _is_on_gpu(value) and value.dtype == torch.float64, name
        assert_close(value, getattr(ref, name), **F64, msg=name)
    # lengths may stay on the CPU
    res_cpu_lengths = forward_backward(*on[:3], lengths, method=method)
    assert_close(res_cpu_lengths.log_likelihood, res.log_likelihood, rtol=0, atol=0)
    paths_ref, best_ref = viterbi(log_init, log_trans, log_emit, lengths)
    paths, best = viterbi(*on)
    assert _is_on_gpu(paths) and _is_on_gpu(best) and paths.dtype == torch.long
    np.testing.assert_array_equal(paths.cpu().numpy(), paths_ref.numpy())
    assert_close(best, best_ref, **F64)


def test_forward_backward_cuda_wide_dynamic_range_falls_back_exactly():
    """Emissions spanning hundreds of nats: "auto" must fall back and still match the CPU."""
    log_init, log_trans, log_emit = random_hmm(3, 30, 3, seed=2)
    log_emit = log_emit * 200
    lengths = torch.tensor([30, 11, 4])
    ref = forward_backward(log_init, log_trans, log_emit, lengths, method="logsumexp")
    res = forward_backward(*(t.to(GPU) for t in (log_init, log_trans, log_emit, lengths)))
    assert_close(res.log_likelihood, ref.log_likelihood, **F64)
    assert_close(res.posterior, ref.posterior, **F64)


def test_forward_backward_float32_on_cuda():
    log_init, log_trans, log_emit = random_hmm(5, 50, 3, seed=3)
    lengths = torch.tensor([50, 3, 49, 20, 1])
    ref = forward_backward(log_init, log_trans, log_emit, lengths)
    res = forward_backward(*(t.to(GPU, torch.float32) for t in (log_init, log_trans, log_emit)), lengths.to(GPU))
    assert res.posterior.dtype == torch.float32 and _is_on_gpu(res.posterior)
    assert_close(res.log_likelihood, ref.log_likelihood, rtol=1e-5, atol=1e-3)
    assert_close(res.posterior, ref.posterior, rtol=0, atol=1e-4)
    paths, _ = viterbi(*(t.to(GPU, torch.float32) for t in (log_init, log_trans, log_emit)), lengths.to(GPU))
    np.testing.assert_array_equal(paths.cpu().numpy(), viterbi(log_init, log_trans, log_emit, lengths)[0].numpy())


def test_forward_backward_rejects_mixed_devices():
    log_init, log_trans, log_emit = random_hmm(2, 5, 2, seed=4)
    with pytest.raises(ValueError, match="on cpu but log_emit is on cuda"):
        forward_backward(log_init, log_trans, log_emit.to(GPU))
