"""A quick smoke run of every benchmark in ``benchmarks/``, checked through the JSON it writes.

Each benchmark runs in its own process (its thread settings, imports and process pools stay
out of the test process) with ``--quick``, at one thread and with ``--out`` in the test's
temporary directory, so the recorded results in ``benchmarks/results`` are never touched.
Timings are only checked to be positive; what must hold whatever the machine load is checked
exactly: the structure, the thread count actually used, and the agreement between libraries
that run the same algorithm from the same start. The peer libraries (scikit-learn, hmmlearn,
pomegranate) are required: a missing one fails its benchmark, and so the test.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the runs of bench_gmm and bench_hmm besides the reference library's
BOTH_DTYPES = {f"{library}-{dtype}" for library in ("ppmix", "pomegranate") for dtype in ("float32", "float64")}


def run_quick(script: str, out: Path, *args: str) -> dict[str, Any]:
    """Run ``benchmarks/<script> --quick --threads 1 --out <out> *args`` and return the JSON it wrote."""
    command = [sys.executable, f"benchmarks/{script}", "--quick", "--threads", "1", "--out", str(out), *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return json.loads(out.read_text())


def assert_timing(*values: float) -> None:
    """Seconds and ratios of seconds: positive and finite (their size depends on the machine)."""
    for value in values:
        assert 0 < value < math.inf


def test_bench_gmm_quick(tmp_path):
    report = run_quick("bench_gmm.py", tmp_path / "gmm.json")
    config = report["config"]
    assert report["benchmark"] == "gmm_em" and report["quick"]
    # pomegranate's import resets torch's thread count to the number of CPUs: the run must still use one
    assert config["threads"] == 1 and report["machine"]["torch_num_threads"] == 1
    # the smoke run steps scikit-learn through public API only (its private _e_step/_m_step are for full runs)
    assert config["peer_api"] == "public"
    assert report["machine"]["pomegranate"] is not None
    settings = [(s["name"], s["covariance_type"]) for s in report["settings"]]
    assert settings == [("A", "diag"), ("B", "full"), ("C", "full")]
    kernel = report["estep_kernel"]
    assert kernel["gemm_gflops"] > 0 and kernel["e_step_gflops"] > 0 and kernel["log_prob_normalise_gflops"] > 0
    assert kernel["e_step_share_of_gemm"] == pytest.approx(kernel["e_step_gflops"] / kernel["gemm_gflops"])
    for setting in report["settings"]:
        e2e = setting["end_to_end"]  # every library's whole default fit, 1 thread
        for library in ("ppmix", "scikit-learn"):
            assert e2e[library]["fit_wall_s"] > 0 and math.isfinite(e2e[library]["mean_loglik"])
            assert e2e[library]["n_iter"] >= 1
        walls = e2e["ppmix"]["fit_wall_s"], e2e["scikit-learn"]["fit_wall_s"]
        assert e2e["ratio_ppmix_vs_sklearn"] == pytest.approx(walls[0] / walls[1])
        results = setting["results"]
        assert set(results) == BOTH_DTYPES | {"sklearn"}
        assert math.isfinite(setting["true_mean_loglik"])
        sklearn_after = results["sklearn"]["per_iteration"]["mean_loglik_after"]
        # EM from scikit-learn's start only climbs
        assert sklearn_after > setting["init_mean_loglik"]
        for key, res in results.items():
            timing = res["per_iteration"]
            assert timing["torch_threads"] == 1
            assert timing["n_timed"] == config["timed_iters"] == len(timing["samples_s"])
            assert_timing(timing["median_s"], timing["min_s"], res["ratio_vs_sklearn"])
            if key == "sklearn":  # one public fit call per iteration: E and M are not timed apart
                assert timing["api"] == "public" and timing["e_median_s"] is None
            else:
                assert_timing(timing["e_median_s"])
            assert timing["min_s"] <= timing["q25_s"] <= timing["median_s"] <= timing["q75_s"]
            # the same start and the same number of iterations: the same EM path in every library, up to the
            # variance floor (scikit-learn adds reg_covar to every variance, ppmix floors at reg_covar * var(X))
            tol = 1e-8 if key == "sklearn" else 1e-6 if key == "ppmix-float64" else 1e-4
            assert timing["mean_loglik_after"] == pytest.approx(sklearn_after, rel=0, abs=tol), key
            fit = res["fit_default_init"]
            assert 1 <= fit["n_iter"] <= config["max_iter"] and fit["fit_wall_s"] > 0
            assert math.isfinite(fit["mean_loglik"])
            if res["library"] == "ppmix":  # from scikit-learn's start ppmix ends where scikit-learn's fit does
                assert abs(res["fit_sklearn_init"]["dloglik_vs_sklearn"]) < 1e-4, key
        assert results["sklearn"]["ratio_vs_sklearn"] == 1.0
        assert results["sklearn"]["fit_default_init"]["dloglik_vs_sklearn"] == 0.0


def test_bench_hmm_quick(tmp_path):
    report = run_quick("bench_hmm.py", tmp_path / "hmm.json")
    assert report["benchmark"] == "hmm_em_iteration" and report["threads"] == 1
    assert {"hmmlearn", "pomegranate"} <= set(report["versions"])
    (result,) = report["results"]
    assert result["torch_threads"] == 1
    assert result["n_sequences"] == 60 and 10 * 60 <= result["n_frames"] <= 50 * 60
    e2e = result["end_to_end"]  # every library's whole default fit, 1 thread
    for library in ("ppmix", "hmmlearn"):
        assert_timing(e2e[library]["fit_wall_s"])
        assert math.isfinite(e2e[library]["loglik_per_step"])
    assert e2e["ratio_ppmix_vs_hmmlearn"] == pytest.approx(e2e["ppmix"]["fit_wall_s"] / e2e["hmmlearn"]["fit_wall_s"])
    rows = {row["key"]: row for row in result["libraries"]}
    assert set(rows) == BOTH_DTYPES | {"hmmlearn-float64"}
    assert rows["hmmlearn-float64"]["ratio_to_hmmlearn"] == 1.0
    for key, row in rows.items():
        assert row["n_timed"] == len(row["samples_s"]) == 2
        assert_timing(row["median_s"], row["min_s"], row["ratio_to_hmmlearn"])
        assert row["cpu_median_s"] >= 0
        # the same start, one iteration at a time: the same EM path, so the same log-likelihood
        tol = 1e-9 if row["dtype"] == "float64" else 1e-3
        assert abs(row["loglik_diff_vs_hmmlearn_after_1_iteration"]) < tol, key
        assert abs(row["loglik_diff_vs_hmmlearn"]) < tol, key
        assert result["loglik_per_step_at_start"] < row["loglik_per_step_after_1_iteration"] < row["loglik_per_step"]


def test_bench_partition_quick(tmp_path):
    report = run_quick("bench_partition.py", tmp_path / "partition.json")
    assert report["torch_threads"] == 1
    large = report["rw"]["large"]
    for tol in (1e-4, 1e-6):
        solve = large[f"ours_tol{tol:g}"]
        assert solve["converged"] and solve["rel_gap"] <= tol
        assert_timing(solve["seconds"])
    assert large["ours_tol1e-06"]["n_iter"] >= large["ours_tol0.0001"]["n_iter"]
    (peer,) = report["rw"]["peers"]
    assert set(peer) >= {"ours", "projected_gradient", "slsqp"}
    assert peer["ours"]["converged"] and peer["projected_gradient"]["converged"]
    for name in ("ours", "projected_gradient", "slsqp"):  # the same QP: optima within the certified gaps
        assert peer[name]["objective"] == pytest.approx(peer["ours"]["objective"], rel=1e-5), name
        assert_timing(peer[name]["seconds"])
    logistic = report["presto"]["logistic_synthetic"]
    assert logistic["n_iter"] >= 1 and 0 < logistic["ari_vs_true_sets"] <= 1 and 0.5 < logistic["train_accuracy"] <= 1
    exact = report["presto"]["linear_exact_check"]
    # closed-form leave-one-out reproduces the literal retraining: same partition, iterations, objective
    assert exact["identical_assignment_fraction"] == 1.0
    assert exact["ppmix_n_iter"] == exact["literal_n_iter"]
    assert exact["ppmix_objective"] == pytest.approx(exact["literal_objective"], rel=1e-9)
    assert_timing(exact["ppmix_seconds"], exact["literal_seconds"], exact["speedup"])


def test_bench_pf_gmm_quick(tmp_path):
    report = run_quick("bench_pf_gmm.py", tmp_path / "pf_gmm.json")
    assert report["quick"] and report["threads"] == 1
    (e2e,) = report["end_to_end"]
    assert e2e["threads"] == 1 and set(e2e["fit_wall_s"]) == {"pf-GMM", "our GMM", "scikit-learn GMM"}
    assert_timing(*e2e["fit_wall_s"].values())
    per_iteration = report["per_iteration"]
    names = {"pf-GMM", "GMM (ours)", "scikit-learn"}
    for field in ("seconds_per_iteration", "cpu_seconds_per_iteration", "ratio_to_our_gmm", "cpu_ratio_to_our_gmm"):
        assert set(per_iteration[field]) == names
    for name in names:
        assert_timing(per_iteration["seconds_per_iteration"][name], per_iteration["ratio_to_our_gmm"][name])
    assert per_iteration["ratio_to_our_gmm"]["GMM (ours)"] == 1.0
    assert per_iteration["scikit_learn_api"] == "public"
    race = report["em_vs_svi"]
    assert 1 <= race["em_iterations"] <= 300 and race["em_seconds"] > 0
    assert math.isfinite(race["em_elbo_per_point"]) and math.isfinite(race["svi_final_elbo_per_point"])
    # EM converged on the ELBO; SVI reaches it within the gap or not at all in the few quick steps
    reached = race["svi_steps_to_reach"]
    assert (reached is None) == (race["svi_seconds_to_reach"] is None)
    if reached is None:
        assert race["svi_final_elbo_per_point"] < race["em_elbo_per_point"]


def test_bench_moe_quick(tmp_path):
    report = run_quick("bench_moe.py", tmp_path / "moe.json", "--workers", "1")  # each pool worker costs an import
    settings = report["settings"]
    assert report["benchmark"] == "moe" and settings["quick"]
    n, max_iter, n_init = int(settings["n"]), settings["max_iter"], settings["local_n_init"]
    fit = report["global_em"]
    assert fit["n"] == n and fit["threads"] == 1 and fit["em_iterations"] >= 1
    # EM and then the L-BFGS polish, each at most max_iter, in the fit and in up to 3 kept split-and-merge moves
    assert 1 <= fit["iterations"] <= 2 * max_iter * 4
    assert_timing(fit["seconds_total"], fit["seconds_per_iteration_median"])
    assert 0 < fit["rss_after_data_mb"] <= fit["peak_rss_mb"]
    # the fitted model scores its training data at least about as well as the model that generated it
    assert fit["mean_log_likelihood"] > fit["true_model_log_likelihood"] - 0.05
    assert [d["M"] for d in report["distributed"]] == settings["machines"]
    for dist in report["distributed"]:
        m = dist["M"]
        assert dist["rows_per_shard"] == n // m and dist["local_n_init"] == n_init
        assert n // m <= dist["support_size"] <= n // m + m  # each shard sends ceil(rows / M) support rows
        assert 0 < dist["local_seconds_max"] <= dist["local_seconds_total"]
        assert_timing(dist["aggregation_seconds"], dist["critical_path_seconds"])
        critical_path = dist["local_seconds_max"] + dist["aggregation_seconds"]  # the slowest shard, then the reduction
        assert dist["critical_path_seconds"] == pytest.approx(critical_path, abs=2e-3)
        ratio = dist["aggregation_seconds"] / dist["local_seconds_total"]
        assert dist["aggregation_over_local_total"] == pytest.approx(ratio, rel=0.05, abs=1e-3)
        assert dist["aggregation_over_local_total_per_start"] == pytest.approx(
            n_init * dist["aggregation_over_local_total"], rel=1e-3, abs=1e-3
        )
        assert dist["mm_iterations"] >= 1
    assert set(report["targets"]) == {
        "global_fit_under_120s",
        "peak_memory_under_4GB",
        "aggregation_under_5pct_of_local",
    }


def test_bench_scale_quick(tmp_path):
    report = run_quick("bench_scale.py", tmp_path / "scale.json", "--data-dir", str(tmp_path / "shards"))
    assert report["benchmark"] == "gmm_scale" and report["quick"] and report["note"]
    config = report["config"]
    small = config["rows_per_shard"] * config["shards_small"]
    in_memory, sharded, large = report["in_memory_1e7"], report["sharded_1e7"], report["sharded_1e8"]
    # quick mode measures small sizes under the full run's keys, each saying what N it measured
    assert in_memory["N"] == sharded["N"] == report["sklearn_1e7"]["N"] == small
    assert large["N"] == config["rows_per_shard"] * large["n_shards"] and large["goal_s_per_iter"] == 10
    for entry in (in_memory, sharded, large, report["sklearn_1e7"]):
        assert_timing(entry["s_per_iter"], *entry.get("iteration_seconds", entry.get("s_per_iter_samples")))
    assert in_memory["iterations"] == sharded["iterations"] == config["iterations"]
    assert_timing(sharded["ratio_to_in_memory_per_row"], sharded["peak_rss_driver_gb"], sharded["peak_rss_worker_gb"])
    assert_timing(large["peak_rss_driver_gb"], large["peak_rss_worker_gb"], in_memory["peak_rss_gb"])
    # the same start and the same iterations: exact EM on shards ends where in-memory EM does (float32 rounding)
    assert sharded["final_mean_loglik"] == pytest.approx(in_memory["final_mean_loglik"], rel=1e-4)
    bound = report["bound"]
    for key in ("in_memory_1e7", "sharded_1e7", "sharded_1e8"):
        assert bound[key]["N"] == report[key]["N"]
        assert_timing(bound[key]["bound_as_implemented_s"], bound[key]["measured_over_bound_as_implemented"])


def test_bench_moe_starts_quick(tmp_path):
    report = run_quick("bench_moe_starts.py", tmp_path / "moe_starts.json")
    assert report["benchmark"] == "moe_starts" and report["settings"]["threads"] == 1
    strategies = report["strategies"]
    assert set(strategies) == {"one start", "small EM", "five full starts"} and report["fits"] == 2
    # problem 0 at seed 4 is a case where one plain start ends in a worse optimum; the default does not
    assert strategies["one start"]["misses"] == 1 and strategies["small EM"]["misses"] == 0
    for fit in report["per_fit"]:
        best = max(fit[name]["log_likelihood"] for name in strategies)
        assert fit["small EM"]["log_likelihood"] == pytest.approx(best, abs=report["settings"]["miss_threshold"])
    for summary in strategies.values():
        assert_timing(summary["seconds"], summary["seconds_over_one_start"])


def test_bench_threads_quick(tmp_path):
    report = run_quick("bench_threads.py", tmp_path / "threads.json")
    assert report["benchmark"] == "threads" and report["quick"] and report["spinners"] == 1
    assert set(report["loads"]) == {"idle", "loaded"}
    for rows in report["loads"].values():
        assert len(rows) == 2  # the quick cases: a small GMM and a small MoE
        for row in rows.values():
            assert set(row["seconds"]) == {"1 thread", "all threads", "all threads + policy"}
            ratios = [row["all threads / 1 thread"], row["all threads + policy / 1 thread"]]
            assert_timing(*row["seconds"].values(), *ratios)
    assert report["cpu_count"] >= 1 and report["all_threads"] == 1


def test_bench_threads_stops_a_fit_past_the_cap_and_records_it_as_censored(tmp_path):
    report = run_quick("bench_threads.py", tmp_path / "threads.json", "--cap", "0.001")
    assert report["cap_seconds"] == 0.001
    for rows in report["loads"].values():
        for row in rows.values():
            assert set(row["seconds"].values()) == {None} and row["all threads / 1 thread"] is None


def test_bench_gmm_start_quick(tmp_path):
    report = run_quick("bench_gmm_start.py", tmp_path / "gmm_start.json")
    assert report["benchmark"] == "gmm_start" and report["threads"] == 1
    assert [s["name"] for s in report["settings"]] == ["overlap", "unequal", "full-overlap"]
    for setting in report["settings"]:
        for start in ("sampled", "previous"):
            runs = setting["runs"][start]
            assert len(runs) == 2 and all(math.isfinite(r["mean_loglik"]) and r["n_iter"] >= 1 for r in runs)
            assert_timing(*(r["fit_wall_s"] for r in runs))
            summary = setting[start]
            assert summary["median_mean_loglik"] >= summary["worst_mean_loglik"]
            assert 0 <= summary["at_least_as_good"] <= 2


def test_bench_families_quick(tmp_path):
    report = run_quick("bench_families.py", tmp_path / "families.json")
    assert report["benchmark"] == "families" and report["threads"] == 1
    rows = {(r["model"], r["family"]): r for r in report["results"]}
    mixtures = ["poisson", "bernoulli", "exponential", "gamma", "lognormal", "student_t", "categorical", "multinomial"]
    assert list(rows) == [("Mixture", f) for f in mixtures] + [("HMM", e) for e in ("poisson", "categorical", "gmm")]
    assert report["versions"]["pomegranate"] and report["versions"]["hmmlearn"]
    for key, result in rows.items():
        if key == ("Mixture", "multinomial"):  # no peer has it: ppmix alone
            assert result["peer"] is None and result["ratio_ppmix_over_peer"] is None
            assert_timing(result["ppmix_iteration_s"])
            continue
        assert_timing(result["ppmix_iteration_s"], result["peer_iteration_s"], result["ratio_ppmix_over_peer"])
        assert math.isfinite(result["ppmix_mean_loglik"]) and math.isfinite(result["peer_mean_loglik"])
        # the same EM from the same start in both libraries: the same log-likelihood
        assert result["same_em"] == (key not in {("Mixture", "gamma"), ("Mixture", "student_t"), ("HMM", "gmm")})
        if result["same_em"]:
            assert abs(result["loglik_difference"]) < 1e-6 * abs(result["peer_mean_loglik"])


def test_bench_missing_quick(tmp_path):
    report = run_quick("bench_missing.py", tmp_path / "missing.json")
    assert report["benchmark"] == "missing" and report["threads"] == 1
    assert [row["covariance_type"] for row in report["cost"]] == ["diag", "full"]
    for row in report["cost"]:
        assert_timing(row["complete_iteration_s"], row["missing_iteration_s"], row["ratio_missing_over_complete"])
    recovery = report["recovery"]
    assert recovery["rmse"]["impute"] < recovery["rmse"]["column_means"]
    assert recovery["heldout_relative_difference"] < 0.05


def test_bench_bayes_quick(tmp_path):
    """ppmix's Gibbs on the three models (NumPyro's NUTS beside it on the GMM in the quick run), the draws of both
    relabelled and scored by ArviZ."""
    report = run_quick("bench_bayes.py", tmp_path / "bayes.json")
    assert report["benchmark"] == "bayes" and report["threads"] == 1
    rows = {row["model"]: row for row in report["rows"]}
    assert sorted(rows) == ["gmm", "hmm", "poisson_mixture"]
    timed = [row["ppmix_gibbs"] for row in rows.values()] + [rows["gmm"]["numpyro_nuts"], report["hmm_40x40_4x1000"]]
    for row in timed:
        assert_timing(row["seconds"], row["min_ess"], row["ess_per_s"])
    assert rows["poisson_mixture"]["ppmix_gibbs"]["max_rhat"] < 1.1  # 4 chains x 100 draws of separated counts
    nuts = {row["model"]: row for row in report["nuts_rows"]}  # ppmix's NUTS on its own potential (issue 52)
    assert sorted(nuts) == ["gmm_diag", "hmm"]
    for row in nuts.values():
        ours, gradient = row["ppmix_nuts"], row["gradient"]
        assert_timing(ours["seconds"], ours["min_ess"], gradient["ppmix_s"], gradient["pyro_traced_s"])
        assert ours["potential_calls"] > 0 and 0 < ours["gradient_share"] <= 1


def test_bench_defaults_quick(tmp_path):
    """The three sections of issue 49's defaults benchmark in one quick run, each checked through its JSON."""
    report = run_quick("bench_defaults.py", tmp_path / "defaults.json")
    assert report["benchmark"] == "defaults" and report["quick"] and report["threads"] == 1
    small = report["small"]
    rows = small["configurations"]
    assert len({(r["dataset"], r["k"], r["covariance_type"]) for r in rows}) == len(rows) == 36
    for row in rows:
        for library in ("ppmix", "sklearn"):
            assert_timing(row[library]["wall_s"], row[library]["cpu_s"])
            assert math.isfinite(row[library]["mean_loglik"]) and row[library]["n_iter"] >= 1
        assert row["ratio"] == pytest.approx(row["ppmix"]["wall_s"] / row["sklearn"]["wall_s"])
        assert row["loglik_diff"] == pytest.approx(row["ppmix"]["mean_loglik"] - row["sklearn"]["mean_loglik"])
    ratios = [r["ratio"] for r in rows]
    assert small["summary"]["geomean_ratio"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert small["summary"]["max_ratio"] == max(ratios)
    # both libraries fit a well-separated case to the same optimum, scored by one evaluator
    iris = next(r for r in rows if (r["dataset"], r["k"], r["covariance_type"]) == ("iris", 2, "diag"))
    assert abs(iris["loglik_diff"]) < 1e-3
    starts = {result["family"]: result for result in report["starts"]["results"]}
    assert {"gamma", "categorical", "bernoulli", "poisson", "gaussian"} <= set(starts)
    for family in ("gamma", "categorical", "bernoulli"):  # the three: default start near the best random one
        assert starts[family]["median_gap"] > -1e-3 and starts[family]["fraction_converged"] == 1.0
    digits = report["digits"]["covariance_types"]
    assert set(digits) == {"diag", "full"}
    for result in digits.values():
        held_out = [run["ppmix"] for run in result["runs"]] + [run["sklearn"] for run in result["runs"]]
        assert all(math.isfinite(value) for value in held_out)
    # near-constant pixels: ppmix's floor keeps the default fit's held-out score at least scikit-learn's
    assert digits["diag"]["median_ppmix"] >= digits["diag"]["median_sklearn"]


def test_bench_vb_quick(tmp_path):
    """ppmix's VB-EM against scikit-learn's BayesianGaussianMixture, every covariance type: the same lower bounds
    from the same start (what holds whatever the load), timings positive."""
    report = run_quick("bench_vb.py", tmp_path / "vb.json")
    assert report["benchmark"] == "vb_gmm" and report["quick"] and report["machine"]["torch_num_threads"] == 1
    assert [row["covariance_type"] for row in report["settings"]] == ["full", "tied", "diag", "spherical"]
    for row in report["settings"]:
        assert_timing(*row["seconds_per_iteration"].values())
        assert row["lower_bound_max_rel_diff"] < 1e-8


def test_bench_hsmm_quick(tmp_path):
    report = run_quick("bench_hsmm.py", tmp_path / "hsmm.json")
    assert report["benchmark"] == "hsmm_em_iteration" and report["quick"]
    assert report["machine"]["torch_num_threads"] == 1
    assert report["config"]["n_sequences"] == 60 and report["config"]["max_duration"] == 50
    assert_timing(*report["median_s"].values())
    for name, values in report["samples_s"].items():
        assert len(values) == len(report["cpu_samples_s"][name]) == 2
    fitted = report["fitted"]  # the planted chain recovered: mean durations (rates + 1) and emission means
    assert fitted["mean_durations"] == pytest.approx(fitted["true_mean_durations"], rel=0.1)
    assert fitted["means"] == pytest.approx([-3.0, -1.0, 1.0, 3.0], abs=0.1)
