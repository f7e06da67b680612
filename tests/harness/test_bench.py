"""End to end through the real command: workers, records, failures, resume after SIGKILL, leaderboard."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAULTY = Path(__file__).with_name("plugins_faulty.py")


def bench(suite, runs, *extra, leaderboards=None, **popen):
    cmd = [sys.executable, "-m", "harness.cli", "bench", "--suite", str(suite), "--runs-dir", str(runs), "--workers", "2",
           "--leaderboard-dir", str(leaderboards or Path(runs) / "lb"), *extra]
    return cmd


def records(runs):
    return {p.stem: json.loads(p.read_text()) for p in (Path(runs) / "records").glob("*.json")}


@pytest.fixture
def env(shared_data):
    return {**os.environ, "ATTNBENCH_DATA": str(shared_data), "PYTHONPATH": str(REPO)}


def check_ok_record(ok, found):
    """Every field of a finished cora/softmax record (seed 0, 5 epochs, 2 workers) against its reference value."""
    import importlib.metadata

    import torch

    from harness.plan.spec import make_spec
    from harness.run.runner import cpu_model, git_commit
    from harness.run.threads import threads_per_worker
    from modules.hosts.gat import GAT

    spec = make_spec("cora", "softmax", 0, {"max_epochs": 5, "patience": 5}, extra=ok["spec"]["extra"])
    assert found[spec.key] is ok and ok["key"] == spec.key and ok["spec"] == spec.to_dict()
    assert ok["status"] == "ok" and "error" not in ok and "retryable" not in ok
    assert list(ok["metrics"]) == ["test/acc", "test/macro_f1"]  # the task's metrics, primary first
    assert all(m["higher_is_better"] is True and 0 <= m["value"] <= 1 for m in ok["metrics"].values())
    # Cora's public split tests on 1000 nodes: accuracy is a multiple of 1/1000
    assert ok["metrics"]["test/acc"]["value"] * 1000 == pytest.approx(round(ok["metrics"]["test/acc"]["value"] * 1000), abs=1e-3)
    assert ok["epochs"] == 5 and 1 <= ok["best_epoch"] <= 5 and ok["best_monitor"]["name"] == "val/loss"
    assert ok["parameters"] == sum(p.numel() for p in GAT(1433, 7, "softmax").parameters())
    # timing is not asserted: the record's three times nest by construction (an epoch's mean within the fit, the fit within the run)
    assert 0 < ok["time_per_epoch_s"] <= ok["fit_time_s"] <= ok["wall_time_s"]
    assert ok["peak_memory_mb"] > 100  # a process with torch loaded
    threads = threads_per_worker(2)
    assert ok["hardware"]["threads"] == threads and ok["hardware"]["accelerator"] == "cpu"
    assert ok["hardware"]["label"] == f"CPU {cpu_model()} ({threads} thread{'s' if threads > 1 else ''}/run)"
    assert ok["versions"]["torch"] == torch.__version__
    assert ok["versions"]["lightning"] == importlib.metadata.version("lightning")
    assert ok["commit"] == git_commit()
    assert ok["started"] <= ok["finished"]


def test_failures_are_recorded_the_suite_goes_on_and_rerun_skips_finished(tmp_path, env):
    suite = tmp_path / "faulty.yaml"
    suite.write_text(textwrap.dedent("""
        name: faulty
        tasks: [cora]
        variants: [softmax, test-raises, test-nan]
        seeds: 2
        params: {max_epochs: 5, patience: 5}
    """))
    runs = tmp_path / "runs"
    done = subprocess.run(bench(suite, runs, "--plugin", str(FAULTY)), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    # exit 1: runs of the selection failed, yet the whole suite ran and the board was written
    assert done.returncode == 1, done.stderr[-3000:]
    assert "4 run(s) of the selection failed" in done.stderr
    found = records(runs)
    assert len(found) == 6
    by_variant = {}
    for r in found.values():
        by_variant.setdefault(r["spec"]["variant"], []).append(r)
    assert all(r["status"] == "ok" for r in by_variant["softmax"])
    assert all(r["status"] == "failed" and "deliberate failure" in r["error"] for r in by_variant["test-raises"])
    assert all(r["status"] == "failed" and "Diverged" in r["error"] for r in by_variant["test-nan"])
    ok = min(by_variant["softmax"], key=lambda r: r["spec"]["seed"])
    check_ok_record(ok, found)
    # how each ran is metadata in every record, failed or not, batched or alone
    assert all(r["execution"]["launcher"] == "workers" and r["execution"]["workers"] == 2 for r in found.values())
    assert all(r["execution"]["seed_batch"] == 2 for r in by_variant["softmax"])
    assert "[6/6]" in done.stdout and "ETA" in done.stdout
    # The results table (mean ± sd of the primary metric per variant) comes before the leaderboard's paths.
    import statistics

    accuracies = [r["metrics"]["test/acc"]["value"] for r in by_variant["softmax"]]
    import re

    header = re.search(r"^variant +cora test/acc$", done.stdout, re.M)  # columns padded to the longest variant name
    assert header, done.stdout[-2000:]
    table = done.stdout[header.start():done.stdout.index("leaderboard written to")]
    assert f"softmax      {statistics.fmean(accuracies):.4f} ± {statistics.stdev(accuracies):.4f}" in table
    assert "test-raises  failed" in table and "test-nan     failed" in table

    board = (runs / "lb" / "faulty.md").read_text()
    assert "`softmax`" in board and "`test-raises`" in board and "deliberate failure" in board
    csv_lines = (runs / "lb" / "faulty.csv").read_text().splitlines()
    assert len(csv_lines) == 8  # header, 6 runs, cora's trivial baseline

    again = subprocess.run(bench(suite, runs, "--plugin", str(FAULTY)), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 1 and "6 already finished, 0 to run" in again.stdout  # recorded failures still fail the selection
    assert records(runs) == found


def test_sigkill_mid_suite_then_rerun_loses_and_duplicates_nothing(tmp_path, env):
    suite = tmp_path / "killme.yaml"
    suite.write_text("name: killme\ntasks: [cora]\nvariants: [softmax]\nseeds: 6\nparams: {max_epochs: 25, patience: 25}\n")
    runs = tmp_path / "runs"
    # Lone runs: a seed batch writes its seeds' records within ~0.1 s of each other (every seed stops at epoch 25),
    # so a poll could find all six before the kill (measured: 6 records 0.1-0.3 s after the first); lone runs on
    # 2 workers finish two at a time, a run (~1.5 s) apart. (Killed seed batches: tests/harness/test_preemption.py.)
    proc = subprocess.Popen(bench(suite, runs, "--no-seed-batch"), env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not ((runs / "records").exists() and records(runs)) and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # coordinator and workers, mid-suite
    proc.wait(timeout=30)
    before = records(runs)
    assert 1 <= len(before) < 6, "the kill should land while runs are still in flight"

    done = subprocess.run(bench(suite, runs, "--no-seed-batch"), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{len(before)} already finished, {6 - len(before)} to run" in done.stdout
    after = records(runs)
    assert len(after) == 6 and all(r["status"] == "ok" for r in after.values())
    assert {k: after[k] for k in before} == before  # finished results were kept, not re-run
    assert sorted(r["spec"]["seed"] for r in after.values()) == list(range(6))


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
def test_workers_end_when_only_the_coordinator_is_killed(tmp_path, env):
    """`kill -9 PID` of bench alone: its workers must not run on as orphans (they would race the workers of
    the resumed bench on the same keys)."""
    suite = tmp_path / "orphans.yaml"
    suite.write_text("name: orphans\ntasks: [cora]\nvariants: [softmax]\nseeds: 4\nparams: {max_epochs: 400, patience: 400}\n")
    runs = tmp_path / "runs"
    proc = subprocess.Popen(bench(suite, runs, "--no-seed-batch"), env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300
        workers = []
        while time.time() < deadline and len(workers) < 2:
            time.sleep(0.5)
            workers = [pid for pid in _children(proc.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")]
        assert len(workers) == 2, "bench --workers 2 starts two worker processes"
        proc.kill()  # the coordinator only
        proc.wait(timeout=30)
        deadline = time.time() + 20
        while time.time() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers), "orphaned workers kept running after their coordinator died"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_results_table_shows_mean_and_sd_per_task_and_variant_before_the_paths():
    """Against statistics.fmean/stdev of the records' primary metric; failed and unrecorded runs named."""
    import statistics

    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.report.summary import results_table
    from harness.results.record import Record

    the_plan = plan(load_suite("quick"), variant_filter="softmax,entmax15,sparsemax")
    values = {}
    records = {}
    for i, spec in enumerate(the_plan.specs):
        if spec.display == "sparsemax":
            continue  # never ran
        if spec.display == "entmax15" and spec.task == "citeseer":
            records[spec.key] = Record.failed(spec, "RuntimeError: boom")
            continue
        if spec.display == "entmax15" and spec.seed == 2:
            continue  # 2 of 3 seeds finished
        value = 0.5 + 0.01 * i
        values.setdefault((spec.task, spec.display), []).append(value)
        records[spec.key] = Record.ok(spec, {"test/acc": {"value": value, "higher_is_better": True}})
    lines = results_table(the_plan, records).splitlines()
    assert lines[0].split() == ["variant", "cora", "test/acc", "citeseer", "test/acc"]
    row = {line.split()[0]: line for line in lines[1:4]}
    cora = values["cora", "softmax"]
    assert f"{statistics.fmean(cora):.4f} ± {statistics.stdev(cora):.4f}" in row["softmax"]
    entmax = values["cora", "entmax15"]
    assert f"{statistics.fmean(entmax):.4f} ± {statistics.stdev(entmax):.4f} (2/3)" in row["entmax15"]
    assert row["entmax15"].rstrip().endswith("failed")
    assert row["sparsemax"].split()[1:] == ["—", "—"]


ONCE = Path(__file__).with_name("plugins_once.py")


def test_a_dead_worker_is_retried_and_retry_failed_reruns_failed_keys(tmp_path, env):
    suite = tmp_path / "once.yaml"
    suite.write_text("name: once\ntasks: [cora]\nvariants: [test-dies-once, test-fails-once]\nseeds: 1\n"
                     "params: {max_epochs: 2, patience: 2}\n")
    runs, markers = tmp_path / "runs", tmp_path / "markers"
    markers.mkdir()
    env = {**env, "ATTNBENCH_TEST_MARKERS": str(markers)}

    def run(*extra):
        cmd = bench(suite, runs, "--plugin", str(ONCE), *extra)
        cmd[cmd.index("--workers") + 1] = "1"
        return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)

    def by_variant():
        return {r["spec"]["variant"]: r for r in records(runs).values()}

    first = run()
    assert first.returncode == 1, first.stderr[-3000:]
    died, failed = by_variant()["test-dies-once"], by_variant()["test-fails-once"]
    assert died["status"] == "failed" and died["retryable"] is True and died["error"].startswith("WorkerDied")
    assert "killed by signal 9" in died["error"]
    assert failed["status"] == "failed" and "retryable" not in failed and "deliberate first-attempt failure" in failed["error"]

    # The next bench re-runs the dead worker's run (not its fault) and keeps the ordinary failure.
    second = run()
    assert second.returncode == 1, second.stderr[-3000:]
    assert "1 already finished, 1 to run" in second.stdout
    assert by_variant()["test-dies-once"]["status"] == "ok"
    assert by_variant()["test-fails-once"] == failed

    # --retry-failed runs the failed key again; the ok one stays as it is.
    ok = by_variant()["test-dies-once"]
    third = run("--retry-failed")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "1 already finished, 1 to run" in third.stdout
    assert by_variant()["test-fails-once"]["status"] == "ok" and by_variant()["test-dies-once"] == ok


def test_a_run_alone_in_a_worker_says_how_it_was_launched(tmp_path, shared_data):
    import torch

    from harness.plan.spec import make_spec
    from harness.results.store import RecordStore
    from harness.run.worker import RunWorker
    from harness.run.worker_pool import WorkerOptions

    threads = torch.get_num_threads()
    try:
        worker = RunWorker(WorkerOptions(str(tmp_path / "runs"), str(shared_data), None, workers=2).settings(None))
        record = worker.run(make_spec("cora", "softmax", 0, {"max_epochs": 1}).to_dict())
    finally:
        torch.set_num_threads(threads)  # the worker set its own share for this process
    assert record.execution == {"launcher": "workers", "workers": 2}
    assert RecordStore(tmp_path / "runs").read(record.key).execution == record.execution
