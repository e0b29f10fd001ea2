"""The benchmark harness's plumbing: fresh-process measurements, ratios and reports. (It asserts no speeds:
speed is measured by `make bench`, never by unit tests.)"""

from __future__ import annotations

from pathlib import Path

from multihead.app.bench import CASES, markdown, plot, run, run_generation


def test_run_measures_in_fresh_processes_and_reports(tmp_path: Path) -> None:
    log: list[str] = []
    results = run(["paper-forward"], ["multihead-torch", "torch-sdpa", "tutorial"], 1, 0.0, log.append)
    assert results["matmul_gflops"] > 0
    rows = {row["impl"]: row for row in results["rows"]}
    assert set(rows) == {"multihead-torch", "torch-sdpa", "tutorial"}
    assert rows["multihead-torch"]["best_peer"] in ("torch-sdpa", "tutorial")
    best = rows[rows["multihead-torch"]["best_peer"]]
    assert best["ratio_to_best_peer"] == 1.0
    for row in rows.values():
        assert row["median_s"] > 0
        assert row["gflops"] == CASES["paper-forward"].flops / row["median_s"] / 1e9
    assert len([line for line in log if "paper-forward" in line]) == 3
    table = markdown(results)
    assert "| paper-forward | **multihead-torch** |" in table
    plot(results, tmp_path / "results.png")
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_skipped_cases_say_why() -> None:
    long = CASES["L16384-forward"]
    assert "tutorial" in long.skip
    assert "24 GiB" in long.why


def test_generation_is_timed_with_and_without_the_cache() -> None:
    log: list[str] = []
    generation = run_generation(["torch"], 3, 1, log.append)
    measured = generation["frameworks"]["torch"]
    assert set(measured["all_s"]) == {"cache", "recompute"}
    assert all(len(times) == 1 and times[0] > 0 for times in measured["all_s"].values())
    assert measured["speedup"] == measured["median_s"]["recompute"] / measured["median_s"]["cache"]
    assert len(log) == 2
    table = markdown({"matmul_gflops": 1.0, "repeats": 1, "rows": [], "generation": generation})
    assert "| torch |" in table
    assert "Greedy generation of 3 tokens" in table


def test_the_keras_layer_is_measured_on_each_backend_and_generation_compiled() -> None:
    """Each Keras implementation runs in a fresh process on the backend its name gives (TensorFlow without a
    suffix), whatever backend this process runs; compiled generation reports its first call apart."""
    results = run(["paper-forward"], ["multihead-keras-jax", "keras-mha-jax", "multihead-keras-torch"], 1, 0.0, print)
    rows = {row["impl"]: row for row in results["rows"]}
    assert set(rows) == {"multihead-keras-jax", "keras-mha-jax", "multihead-keras-torch"}
    assert all(row["median_s"] > 0 for row in rows.values())
    assert rows["multihead-keras-jax"]["best_peer"] == "keras-mha-jax"
    generation = run_generation(["keras-jax"], 2, 1, print)
    measured = generation["frameworks"]["keras-jax"]
    assert set(measured["all_s"]) == {"compiled"}
    assert measured["first_call_s"] > measured["median_s"]["compiled"] > 0
    assert measured["speedup"] is None
    assert "| keras-jax | compiled |" in markdown({**results, "generation": generation})
