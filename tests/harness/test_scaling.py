"""attnbench scaling: every worker count runs the whole plan from scratch, in its own records folder."""

import pytest

from harness.studies.scaling import measure_scaling


@pytest.mark.slow  # starts three executors (warm-up, 1 and 2 workers): about a minute of process start-up
def test_scaling_runs_every_worker_count_on_the_whole_plan(shared_data, tmp_path, monkeypatch, capsys):
    suite = tmp_path / "tiny.yaml"
    suite.write_text("name: tiny\ntasks: [cora]\nvariants: [softmax, fenchel]\nseeds: 1\nparams: {max_epochs: 2, patience: 2}\n")
    monkeypatch.setenv("ATTNBENCH_RUNS", str(tmp_path / "real-runs"))
    results = measure_scaling(str(suite), [1, 2], data_root=str(shared_data))
    assert [r["workers"] for r in results] == [1, 2]
    # timing is not asserted: each worker count's wall time is filled in; the speed-up below is its own ratio, any size
    assert all(r["runs"] == 2 and r["seconds"] > 0 for r in results)
    assert results[0]["speedup"] == 1.0 and results[1]["speedup"] == pytest.approx(results[0]["seconds"] / results[1]["seconds"])
    assert not (tmp_path / "real-runs").exists()  # the suite's own records are untouched
    out = capsys.readouterr().out
    assert "| 2 | 2 |" in out and "speed-up vs 1" in out


@pytest.mark.slow  # starts three executors: about a minute of process start-up
def test_scaling_compares_seed_counts_at_the_same_workers_with_seeds_batched_as_bench_does(shared_data, tmp_path, capsys):
    suite = tmp_path / "tiny.yaml"
    suite.write_text("name: tiny\ntasks: [cora]\nvariants: [softmax]\nseeds: 1\nparams: {max_epochs: 2, patience: 2}\n")
    results = measure_scaling(str(suite), [1], seeds=[1, 3], data_root=str(shared_data))
    assert [(r["seeds"], r["runs"], r["seed_batches"]) for r in results] == [(1, 1, 0), (3, 3, 1)]
    assert results[0]["time_ratio"] == 1.0 and results[1]["time_ratio"] == pytest.approx(results[1]["seconds"] / results[0]["seconds"])
    assert "time vs 1 seed(s)" in capsys.readouterr().out
    lone = measure_scaling(str(suite), [1], seeds=[3], seed_batch=False, data_root=str(shared_data))
    assert lone[0]["seed_batches"] == 0 and lone[0]["runs"] == 3


def test_scaling_rejects_bad_worker_counts():
    with pytest.raises(ValueError, match="positive"):
        measure_scaling("quick", [0, 2])


def test_scaling_rejects_bad_seed_counts():
    with pytest.raises(ValueError, match="seed counts"):
        measure_scaling("quick", [1], seeds=[0, 20])


def test_a_seed_count_replaces_the_seeds_a_task_sets_for_itself(shared_data, tmp_path, monkeypatch):
    """paper-gat's CiteSeer has 36 seeds of its own; `--seeds 1,20` must run 1 and 20 there too."""
    from harness.studies import scaling

    suite = tmp_path / "own.yaml"
    suite.write_text("name: own\ntasks: [cora, {name: citeseer, seeds: 5}]\nvariants: [softmax]\nseeds: 2\n")
    ran = []
    monkeypatch.setattr(scaling.LocalExecutor, "run", lambda self, items, on_result: ran.append(sorted((s.task, s.seed) for item in items for s in (item if isinstance(item, list) else [item]))))
    results = measure_scaling(str(suite), [1], seeds=[1, 3], data_root=str(shared_data))
    assert [r["runs"] for r in results] == [2, 6]
    assert ran[1] == [("citeseer", 0), ("cora", 0)]
    assert ran[2] == sorted([("citeseer", s) for s in range(3)] + [("cora", s) for s in range(3)])
