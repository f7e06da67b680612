"""Read-only commands answer without importing torch or Lightning (issue 29 item 7): a board renders from
the suite's plan snapshot (harness/plan/catalogue.py), `results` never needs the registries. Checked in a
fresh interpreter through sys.modules, not by timing (`make startup` prints the times against their goals)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "lightning", "torch_geometric")


def _imports_of(argv, env):
    """Run `attnbench ARGV` in a fresh interpreter; (exit code, the heavy modules it imported)."""
    code = ("import json, sys\nfrom harness.cli import main\ncode = main(%r)\n"
            "print(json.dumps([code, [m for m in %r if m in sys.modules]]))" % (list(argv), HEAVY))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env(tmp_path, shared_data):
    return {**os.environ, "PYTHONPATH": str(REPO), "ATTNBENCH_CACHE": str(tmp_path / "cache"), "ATTNBENCH_DATA": str(shared_data),
            "OMP_NUM_THREADS": "1"}


def test_a_board_renders_from_its_snapshot_without_torch_and_byte_for_byte(tmp_path, shared_data):
    env = _env(tmp_path, shared_data)
    argv = ["leaderboard", "--suite", "quick", "--runs-dir", str(REPO / "leaderboards")]
    code, heavy = _imports_of([*argv, "--out", str(tmp_path / "cold")], env)  # plans, writes the snapshot
    assert code == 0 and "torch" in heavy
    code, heavy = _imports_of([*argv, "--out", str(tmp_path / "warm")], env)
    assert code == 0 and heavy == []
    for name in ("quick.md", "quick.csv", "quick.html"):
        assert (tmp_path / "warm" / name).read_bytes() == (tmp_path / "cold" / name).read_bytes() == (REPO / "leaderboards" / name).read_bytes()


def test_a_changed_suite_file_is_planned_again(tmp_path, shared_data):
    env = _env(tmp_path, shared_data)
    suite = tmp_path / "mine.yaml"
    suite.write_text("name: mine\ntasks: [cora]\nvariants: [softmax]\nseeds: 1\n")
    argv = ["leaderboard", "--suite", str(suite), "--runs-dir", str(REPO / "leaderboards"), "--out", str(tmp_path / "b"), "--allow-empty"]
    assert _imports_of(argv, env)[1] != []
    assert _imports_of(argv, env)[1] == []
    suite.write_text("name: mine\ntasks: [cora]\nvariants: [softmax, gmm]\nseeds: 1\n")
    code, heavy = _imports_of(argv, env)
    assert code == 0 and "torch" in heavy and "`gmm`" in (tmp_path / "b" / "mine.md").read_text()


def test_results_export_imports_no_torch(tmp_path, shared_data):
    code, heavy = _imports_of(["results", "export", str(tmp_path / "all.jsonl"), "--runs-dir", str(REPO / "leaderboards")],
                              _env(tmp_path, shared_data))
    assert code == 0 and heavy == []


def test_no_snapshot_is_kept_when_a_baseline_s_data_does_not_load(tmp_path, monkeypatch):
    """Offline without a data root the baselines cannot load; the next board, with data, must show them."""
    from harness.plan import catalogue
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite, suite_path
    from datamodules.paths import MissingDataError

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    the_plan = plan(load_suite("quick"))
    path = catalogue.plan_snapshot_file(suite_path("quick"), None, None)

    def offline(task):
        raise MissingDataError("offline")

    monkeypatch.setattr(the_plan, "trivial_baseline", offline)
    catalogue.save_plan(the_plan, path)
    assert catalogue.load_plan(path) is None


def test_a_snapshot_is_keyed_by_the_committed_tuned_parameters(tmp_path, monkeypatch):
    """A suite's `tuned` rows read the committed parameters: promoting one must plan afresh (a snapshot keyed
    without them kept the old plan, and its board lacked the new "(tuned)" rows)."""
    from harness.plan import catalogue
    from harness.plan.suite import suite_path

    monkeypatch.setattr(catalogue, "COMMITTED_PARAMS_DIR", tmp_path / "params")
    (tmp_path / "params" / "cora").mkdir(parents=True)
    (tmp_path / "params" / "cora" / "bam-weibull.yaml").write_text("task: cora\n")
    before = catalogue.plan_snapshot_file(suite_path("paper-gat"), None, None)
    (tmp_path / "params" / "citeseer").mkdir()
    (tmp_path / "params" / "citeseer" / "bam-weibull.yaml").write_text("task: citeseer\n")
    assert catalogue.plan_snapshot_file(suite_path("paper-gat"), None, None) != before
    # --params-dir names another folder: that one keys the snapshot
    other = tmp_path / "other"
    other.mkdir()
    assert catalogue.plan_snapshot_file(suite_path("paper-gat"), None, other) != before


def _committed_quick_record():
    """A committed record of the quick suite (cora, softmax, seed 0) and the `run` flags that name it."""
    from harness.plan.planner import plan_runs

    flags = ["--set", "max_epochs=300", "--set", "patience=100"]
    spec = plan_runs([("cora", {"name": "softmax"}, 0, {"max_epochs": 300, "patience": 100})], None).specs[0]
    path = REPO / "leaderboards" / "records" / f"{spec.key}.json"
    assert path.is_file(), "the quick suite's cora x softmax seed 0 record is committed"
    return path, flags


def test_a_finished_run_answers_again_without_torch(tmp_path, shared_data, monkeypatch):
    record, flags = _committed_quick_record()
    (tmp_path / "runs" / "records").mkdir(parents=True)
    (tmp_path / "runs" / "records" / record.name).write_text(record.read_text())
    env = _env(tmp_path, shared_data)
    argv = ["run", "cora", "softmax", "--seed", "0", *flags, "--runs-dir", str(tmp_path / "runs")]
    code, heavy = _imports_of(argv, env)  # plans (the sources are new to this cache) and finds the record
    assert code == 0 and "torch" in heavy
    code, heavy = _imports_of(argv, env)
    assert code == 0 and heavy == []
    # the memo answers only the command line it was made for (another seed is another run)
    known = json.loads((tmp_path / "cache" / "run-keys.json").read_text())
    assert list(known.values()) == [record.stem]
    from harness.plan import catalogue

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    params = {"max_epochs": 300, "patience": 100}
    assert catalogue.known_run_key("cora", "softmax", 0, params, {}, "32") == record.stem
    assert catalogue.known_run_key("cora", "softmax", 1, params, {}, "32") is None
    assert catalogue.known_run_key("cora", "softmax", 0, params, {}, "bf16-mixed") is None


def test_a_labelled_rows_settings_survive_the_snapshot(tmp_path, shared_data):
    env = _env(tmp_path, shared_data)
    suite = tmp_path / "rows.yaml"
    suite.write_text("name: rows\ntasks: [cora]\nvariants: [softmax, {name: entmax, label: entmax-a1.2, attention.alpha: 1.2}]\nseeds: 1\n")
    argv = ["leaderboard", "--suite", str(suite), "--runs-dir", str(REPO / "leaderboards"), "--allow-empty"]
    assert "torch" in _imports_of([*argv, "--out", str(tmp_path / "cold")], env)[1]
    assert _imports_of([*argv, "--out", str(tmp_path / "warm")], env)[1] == []
    for name in ("rows.md", "rows.html"):
        assert (tmp_path / "warm" / name).read_bytes() == (tmp_path / "cold" / name).read_bytes()
    assert "> `entmax-a1.2`: `entmax` with `attention.alpha` = `1.2`" in (tmp_path / "warm" / "rows.md").read_text()
