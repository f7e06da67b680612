"""`bench --launcher local|slurm` through submitit: sharding, independent array tasks, resume, clear errors."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.run.job_array import LauncherError, Shard, SubmititOptions, record_dead_shard, shard_runs
from harness.results.store import RecordStore
from harness.plan.spec import make_spec

REPO = Path(__file__).resolve().parents[2]


def records(runs):
    return {p.stem: json.loads(p.read_text()) for p in (Path(runs) / "records").glob("*.json")}


@pytest.fixture
def tiny_suite(tmp_path):
    suite = tmp_path / "tiny.yaml"
    suite.write_text(textwrap.dedent("""
        name: tiny
        tasks: [cora]
        variants: [softmax, fenchel]
        seeds: 2
        params: {max_epochs: 3, patience: 3}
    """))
    return suite


@pytest.mark.parametrize("runs, shards", [(1, 1), (4, 2), (7, 3), (5, 64), (64, 64), (130, 64)])
def test_shards_cover_every_run_exactly_once_and_are_balanced(runs, shards):
    specs = [f"run{i}" for i in range(runs)]
    dealt = shard_runs(specs, shards)
    assert len(dealt) == min(runs, shards) and all(dealt)
    assert sorted(s for shard in dealt for s in shard) == sorted(specs)
    assert max(map(len, dealt)) - min(map(len, dealt)) <= 1


def test_shards_must_be_positive():
    with pytest.raises(LauncherError, match="--shards must be at least 1"):
        shard_runs(["a"], 0)
    with pytest.raises(LauncherError, match="--slurm-time-min"):
        SubmititOptions(time_min=0)


def test_a_dead_shard_blames_the_run_it_was_on_and_leaves_it_retryable(runs):
    specs = [make_spec("cora", "softmax", seed, {"max_epochs": 3}) for seed in range(3)]
    store = RecordStore(runs)
    store.write({"key": specs[0].key, "status": "ok", "metrics": {}})
    store.write({"key": specs[1].key, "status": "failed", "retryable": True, "error": "WorkerDied: earlier"})
    shard = Shard(index=0, specs=tuple(s.to_dict() for s in specs), runs_dir=str(runs), data_root=None, cache_dir=None)

    assert record_dead_shard(shard, "job 7 ended without a result") == specs[1].key
    blamed = store.read(specs[1].key)
    assert blamed["status"] == "failed" and blamed["retryable"] and "job 7 ended without a result" in blamed["error"]
    assert not store.finished(specs[1].key)  # the next bench runs it again
    assert store.read(specs[2].key) is None and store.read(specs[0].key)["status"] == "ok"
    # Under --retry-failed an old failed record and the re-run's cannot be told apart: nothing is blamed.
    assert record_dead_shard(dataclasses.replace(shard, retry_failed=True), "job 8") is None


def test_local_launcher_jobs_outlive_the_submitter_then_resume_runs_only_the_rest(tmp_path, tiny_suite, shared_data, capsys):
    runs, lb = tmp_path / "runs", tmp_path / "lb"
    common = ["--suite", str(tiny_suite), "--runs-dir", str(runs), "--leaderboard-dir", str(lb), "--launcher", "local"]

    # --no-wait: the submitter exits at once; the job it left behind still writes both softmax records.
    env = {**os.environ, "ATTNBENCH_DATA": str(shared_data), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # Files, not pipes: the job inherits the submitter's descriptors, and a pipe would stay open until it ends.
    log = tmp_path / "submit.log"
    with open(log, "w") as out:
        submitted = subprocess.run([sys.executable, "-m", "harness.cli", "bench", *common, "--variants", "softmax", "--shards", "1", "--no-wait"],
                                   env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=300)
    assert submitted.returncode == 0, log.read_text()[-3000:]
    assert len(records(runs)) < 2, "the submitter should exit before its job is done"
    printed = log.read_text()
    assert "submitted 2 runs as 1 local job(s)" in printed and "attnbench leaderboard --suite" in printed
    assert not (lb / "tiny.md").exists()
    deadline = time.time() + 240
    while time.time() < deadline and len(records(runs)) < 2:
        time.sleep(0.5)
    first = records(runs)
    assert len(first) == 2 and {r["spec"]["variant"] for r in first.values()} == {"softmax"}
    assert all(r["execution"]["launcher"] == "job-array" and r["execution"]["shard"] == 0 for r in first.values())

    # Waiting: only the two fenchel runs are left; the leaderboard is written at the end. One shard, as
    # every job pays ~10 s of imports on this test's shared cores.
    assert main(["bench", *common, "--shards", "1", "--data-root", str(shared_data)]) == 0
    out = capsys.readouterr().out
    assert "2 already finished, 2 to run on local through submitit" in out
    assert "[1/1 shards]" in out and "2 ran (2 ok, 0 failed), 0 already recorded" in out
    assert "ran 2 runs" in out
    after = records(runs)
    assert len(after) == 4 and all(r["status"] == "ok" for r in after.values())
    assert {k: after[k] for k in first} == first
    assert sorted((r["spec"]["variant"], r["spec"]["seed"]) for r in after.values()) == [
        ("fenchel", 0), ("fenchel", 1), ("softmax", 0), ("softmax", 1)]
    board = (lb / "tiny.md").read_text()
    assert "`softmax`" in board and "`fenchel`" in board and "4 of 4 planned runs" in board
    assert len((lb / "tiny.csv").read_text().splitlines()) == 6  # header, 4 runs, cora's trivial baseline

    # A third submission has nothing to run and submits nothing.
    assert main(["bench", *common, "--data-root", str(shared_data)]) == 0
    out = capsys.readouterr().out
    assert "4 already finished, 0 to run" in out and "submitted" not in out
    assert records(runs) == after


def test_slurm_without_sbatch_stops_with_the_fix(tmp_path, tiny_suite, shared_data, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"  # a PATH with git (records name the commit) but no SLURM
    bin_dir.mkdir()
    os.symlink(shutil.which("git"), bin_dir / "git")
    monkeypatch.setenv("PATH", str(bin_dir))
    code = main(["bench", "--suite", str(tiny_suite), "--runs-dir", str(tmp_path / "runs"), "--leaderboard-dir", str(tmp_path / "lb"),
                 "--launcher", "slurm", "--data-root", str(shared_data)])
    err = capsys.readouterr().err
    assert code == 2
    assert "sbatch" in err and "login node" in err and "--launcher local" in err
    assert not records(tmp_path / "runs")


def test_slurm_array_carries_the_flags_and_no_wait_returns(tmp_path, tiny_suite, shared_data, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"  # stand-ins that record the script instead of queueing it
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {tmp_path}/job.sh\necho "Submitted batch job 4242"\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code = main(["bench", "--suite", str(tiny_suite), "--runs-dir", str(tmp_path / "runs"), "--leaderboard-dir", str(tmp_path / "lb"),
                 "--data-root", str(shared_data), "--launcher", "slurm", "--no-wait", "--shards", "3", "--slurm-partition", "gpu",
                 "--slurm-time-min", "90", "--slurm-cpus-per-task", "4", "--slurm-array-parallelism", "2", "--slurm-account", "lab"])
    out = capsys.readouterr().out
    assert code == 0
    assert "submitted 4 runs as 3 slurm job(s) 4242_[0-2]" in out and "attnbench leaderboard --suite" in out
    script = (tmp_path / "job.sh").read_text()
    for flag in ("--array=0-2%2", "--partition=gpu", "--time=90", "--cpus-per-task=4", "--account=lab", "--gpus-per-node=1",
                 "--job-name=attnbench-tiny"):
        assert f"#SBATCH {flag}" in script, flag
    assert not (tmp_path / "lb").exists()


def test_submitit_flags_without_a_submitit_launcher_are_an_error(tmp_path, tiny_suite, capsys):
    code = main(["bench", "--suite", str(tiny_suite), "--runs-dir", str(tmp_path / "runs"), "--shards", "4", "--no-wait"])
    assert code == 2
    assert "--shards, --no-wait apply to --launcher slurm or local" in capsys.readouterr().err
