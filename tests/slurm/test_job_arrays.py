"""`bench --launcher slurm` against a real scheduler (tests/slurm/cluster.py: one node, accounting off): the array's
records are the worker launcher's, `--no-wait` leaves the array to finish and `leaderboard` reads it, and a task that
`scontrol requeue` preempts twice resumes from its checkpoints to the unkilled record.

One small suite for all of them: Cora, softmax and bam-weibull (whose noise stream must resume too), one seed, 40
epochs, a checkpoint every 5 epochs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from tests.conftest import REPO
from tests.harness.test_preemption import comparable

EVERY = 5
# a hung wait fails within minutes, not at the suite's 900 s (the dead-task test: bench used to wait for ever)
pytestmark = pytest.mark.timeout(420)


def records(runs: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((runs / "records").glob("*.json"))}


def same_experiment(record: dict) -> dict:
    """What two executions of one run on one machine share: `comparable` (no timings, no `execution`), and no commit
    either, which another engineer's commit in this working tree between two benches changes (the code path does not)."""
    return {k: v for k, v in comparable(record).items() if k not in ("commit", "dirty")}


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "slurm-tiny.yaml"
    path.write_text(textwrap.dedent("""
        name: slurm-tiny
        tasks: [cora]
        variants: [softmax, bam-weibull]
        seeds: 1
        params: {max_epochs: 40, patience: 40}
    """))
    return path


@pytest.fixture(scope="module")
def env(slurm, shared_data) -> dict[str, str]:
    return {**slurm.env, "ATTNBENCH_DATA": str(shared_data), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "ATTNBENCH_CHECKPOINT_EVERY": str(EVERY)}


@pytest.fixture
def in_process(env, monkeypatch):
    """`main(...)` in this process sees the cluster and passes it to the jobs it submits (sbatch exports the environment)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in [n for n in os.environ if n.startswith("SLURM_") and n not in env]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def threads() -> int:
    """Each array task gets the torch threads a worker of `--workers 2` gets, so that the two launchers' records can be
    equal bit for bit (the thread count changes a CPU run's float sums)."""
    from harness.run.threads import threads_per_worker

    return threads_per_worker(2)


@pytest.fixture(scope="module")
def unkilled(suite, env, tmp_path_factory) -> dict[str, dict]:
    """The suite through the default launcher: worker processes on this machine, each seed alone as an array task runs it."""
    runs = tmp_path_factory.mktemp("workers") / "runs"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNBENCH_CHECKPOINT_EVERY", str(EVERY))  # checkpoints change no number; the same interval anyway
        assert main(["bench", "--suite", str(suite), "--runs-dir", str(runs), "--leaderboard-dir", str(runs / "lb"), "--workers", "2",
                     "--no-seed-batch", "--data-root", env["ATTNBENCH_DATA"]]) == 0
    found = records(runs)
    assert len(found) == 2 and all(r["status"] == "ok" and r["epochs"] == 40 for r in found.values())
    return found


def slurm_bench(suite, runs, threads, *extra) -> list[str]:
    return ["bench", "--suite", str(suite), "--runs-dir", str(runs), "--leaderboard-dir", str(runs / "lb"), "--launcher", "slurm",
            "--slurm-gpus-per-task", "0", "--slurm-cpus-per-task", str(threads), *extra]


def checkpoint_epoch(runs: Path, key: str) -> int | None:
    """The epochs the run's checkpoint holds (None before its first). Checkpoints are renamed into place, so a read
    never sees half of one."""
    import torch

    try:
        return int(torch.load(runs / "checkpoints" / f"{key}.pt", weights_only=True)["attnbench"]["epoch"])
    except FileNotFoundError:  # none yet, or removed with the record written
        return None


def test_bench_waits_through_two_requeues_of_a_task_and_writes_the_worker_launchers_records(slurm, suite, env, threads, unkilled,
                                                                                              tmp_path):
    runs, log = tmp_path / "runs", tmp_path / "bench.log"
    with open(log, "w") as out:  # a file, not a pipe: nothing here reads it until bench ends
        bench = subprocess.Popen([sys.executable, "-m", "harness.cli", *slurm_bench(suite, runs, threads, "--shards", "2")], env=env,
                                 cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        submitted = slurm.wait_for(lambda: re.search(r"submitted 2 runs as 2 slurm job\(s\) (\d+)_\[0-1\]", log.read_text()),
                                   "bench to submit the array", timeout=120)
        array = submitted.group(1)
        bam = next(key for key, r in unkilled.items() if r["spec"]["variant"] == "bam-weibull")
        task = f"{array}_1"  # shards are dealt round-robin in the plan's order (softmax, bam-weibull)
        resumed_from = []
        for kill in range(2):
            # after the first checkpoint of this execution: the run's first, then the first of the resumed run
            before = resumed_from[-1] if resumed_from else 0
            slurm.wait_for(lambda: (checkpoint_epoch(runs, bam) or 0) > before, f"a checkpoint past epoch {before} (requeue {kill + 1})")
            assert slurm.states(task)[task] == "RUNNING", "the run ended before it could be requeued: give it more epochs"
            slurm.requeue(task)
            # The task is pending again, its process gone: this checkpoint is the one its next start resumes from.
            resumed_from.append(checkpoint_epoch(runs, bam))
            assert resumed_from[-1] % EVERY == 0 and resumed_from[-1] < 40
        assert resumed_from[1] > resumed_from[0]
        assert bench.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if bench.poll() is None:
            bench.kill()
    out = log.read_text()
    assert "[2/2 shards]" in out and "ran 2 runs" in out and (runs / "lb" / "slurm-tiny.md").is_file()
    assert set(slurm.states(array).values()) == {"COMPLETED"}
    found = records(runs)
    assert sorted(found) == sorted(unkilled)
    # Bit for bit by construction: the same machine, code path and thread count, and the checkpoint holds every state
    # the run's next epochs depend on (weights, Adam, the generators, bam-weibull's noise stream, early stopping).
    for key, record in found.items():
        assert same_experiment(record) == same_experiment(unkilled[key]), key
    assert found[bam]["execution"] == {"launcher": "job-array", "shard": 1, "resumed_from_epoch": resumed_from[1], "resumes": 2}
    softmax = next(r for key, r in found.items() if key != bam)
    assert softmax["execution"] == {"launcher": "job-array", "shard": 0}
    assert not list((runs / "checkpoints").glob("*.pt"))  # recorded: nothing is left to resume from
    # No accounting on this cluster: one line says what that means, instead of submitit's warning at every poll
    # (and sacct's own message beside each).
    assert out.count("sacct does not answer here (Slurm accounting storage is disabled)") == 1, out[-3000:]
    assert "Bypassing sacct error" not in out and out.count("accounting storage is disabled") == 1


def test_no_wait_leaves_the_array_to_finish_and_leaderboard_reads_it(slurm, suite, threads, unkilled, in_process, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(slurm_bench(suite, runs, threads, "--variants", "softmax", "--no-wait")) == 0
    out = capsys.readouterr().out
    job = re.search(r"submitted 1 runs as 1 slurm job\(s\) (\d+);", out)  # submitit submits an array of one as one job
    assert job, out
    assert "attnbench leaderboard --suite" in out and not (runs / "lb").exists()
    assert slurm.wait_until_ended(job.group(1)) == {job.group(1): "COMPLETED"}

    assert main(["leaderboard", "--suite", str(suite), "--runs-dir", str(runs), "--out", str(runs / "lb")]) == 0
    board = (runs / "lb" / "slurm-tiny.md").read_text()
    assert "`softmax`" in board and "1 of 2 planned runs" in board
    (key, record), = records(runs).items()
    assert same_experiment(record) == same_experiment(unkilled[key])


def test_a_task_that_dies_is_reported_with_squeues_state_without_accounting(slurm, in_process, tmp_path, monkeypatch):
    """Without accounting, submitit's sacct never says a task without a result has ended: bench waited for ever on a
    cancelled task. squeue says so; bench reports the task with its state and blames the run it was on."""
    import time

    from harness.plan.spec import make_spec
    from harness.results.store import RecordStore
    from harness.run import job_array

    monkeypatch.setattr(job_array, "RESULT_GRACE_S", 0.5)  # this cluster's folders are local: no cache to wait out
    options = job_array.SubmititOptions(launcher="slurm", gpus_per_task=0, poll_s=0.5)
    # a task that only sleeps (no torch to import): the test is about the task's end, not its work
    (job,) = job_array.make_executor(options, tmp_path / "submitit" / "%j", "attnbench-dies").map_array(time.sleep, [600])
    spec = make_spec("cora", "softmax", 0, {"max_epochs": 3})
    shard = job_array.Shard(index=0, specs=(spec.to_dict(),), runs_dir=str(tmp_path / "runs"), data_root=None, cache_dir=None)
    slurm.wait_for(lambda: slurm.states(job.job_id).get(job.job_id) == "RUNNING", "the task to start", timeout=60)
    assert slurm.command("scancel", job.job_id).returncode == 0
    lines: list[str] = []
    outcome = job_array._wait([job], [shard], options, [job.job_id], str, lines.append)
    assert outcome.lost_shards == [0] and outcome.failed == 1
    assert f"job {job.job_id} FAILED: ended without a result (state CANCELLED" in lines[-1], lines
    record = RecordStore(tmp_path / "runs").read(spec.key)
    assert record["status"] == "failed" and record["retryable"]  # the next bench runs it again
    assert sum("sacct does not answer here" in line for line in lines) == 1
