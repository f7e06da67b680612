"""`attnbench run` and `attnbench results checkpoints` over mid-run checkpoints (issue 40): a killed `run` resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.test_preemption import DATA, REPO, assert_same

pytestmark = pytest.mark.skipif(not (DATA / "planetoid").exists(), reason="needs the Planetoid data under ../shared/data")


def run_command(runs: Path, epochs: int) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "run", "cora", "bam-weibull", "--set", f"max_epochs={epochs}", "--set", f"patience={epochs}",
            "--runs-dir", str(runs), "--data-root", str(DATA)]


def test_a_killed_run_command_resumes_from_its_checkpoint_to_the_unkilled_record(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNBENCH_CHECKPOINT_EVERY": "1", "PYTHONPATH": str(REPO)}
    epochs = 40
    killed = subprocess.Popen(run_command(tmp_path / "killed", epochs), env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(folder.glob("*.ckpt")) and not any(folder.glob("*.pt")) and killed.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)  # a few epochs past the first checkpoint
    assert killed.poll() is None, "the run ended before it could be killed: raise its epochs"
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert not (tmp_path / "killed" / "records").exists() or not any((tmp_path / "killed" / "records").glob("*.json"))
    listed = subprocess.run([sys.executable, "-m", "harness.cli", "results", "checkpoints", "--runs-dir", str(tmp_path / "killed")],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    # the run's checkpoint is listed as unfinished work (a save in progress may show beside it)
    assert listed.returncode == 0 and "checkpoint(s) in" in listed.stdout and "1 of 1 run(s) unfinished" in listed.stdout, listed.stdout + listed.stderr
    resumed = subprocess.run(run_command(tmp_path / "killed", epochs), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    unkilled = subprocess.run(run_command(tmp_path / "unkilled", epochs), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert unkilled.returncode == 0, unkilled.stderr[-2000:]
    assert_same(tmp_path / "killed", tmp_path / "unkilled")
    assert not any(folder.glob("*")), "the finished record removes its checkpoint"
