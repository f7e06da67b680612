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
    assert "attnbench: resuming cora x bam-weibull seed 0 from its checkpoint at epoch " in resumed.stdout, resumed.stdout[-2000:]
    unkilled = subprocess.run(run_command(tmp_path / "unkilled", epochs), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert unkilled.returncode == 0, unkilled.stderr[-2000:]
    assert_same(tmp_path / "killed", tmp_path / "unkilled")
    assert not any(folder.glob("*")), "the finished record removes its checkpoint"


def test_a_killed_seed_batch_run_names_its_checkpoint_and_counts_on_from_its_epoch(tmp_path):
    """`run --seeds` killed after epoch 4's checkpoint (a real SIGKILL, tests/harness/preemption_cli_child.py): the
    re-run names the checkpoint it resumes from with its epoch, its progress lines count on from epoch 5, and each
    record says which part of the fit ran in the resuming process."""
    import json

    child = Path(__file__).with_name("preemption_cli_child.py")
    command = [sys.executable, str(child), "run", "cora", "softmax", "--seeds", "0,1", "--set", "max_epochs=8", "--set", "patience=8",
               "--runs-dir", str(tmp_path), "--data-root", str(DATA)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNBENCH_CHECKPOINT_EVERY": "1", "PYTHONPATH": str(REPO)}
    killed = subprocess.run(command, env={**env, "KILL_AFTER": "4"}, cwd=REPO, capture_output=True, text=True, timeout=300,
                            start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    assert "resuming" not in killed.stdout
    resumed = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    lines = resumed.stdout.splitlines()
    assert any(line.startswith("attnbench: resuming cora x softmax seeds 0, 1 from their seed batch's checkpoint at epoch 4 (batch-")
               for line in lines), resumed.stdout
    epochs = [line for line in lines if line.startswith("attnbench: seed batch epoch")]
    assert epochs[0].startswith("attnbench: seed batch epoch 5/8:") and epochs[-1].startswith("attnbench: seed batch epoch 8/8:"), epochs
    for record in (json.loads(p.read_text()) for p in (tmp_path / "records").glob("*.json")):
        assert record["execution"]["resumed_from_epoch"] == 4 and record["epochs"] == 8
        # timing is not asserted: the resumed process fitted a part of the whole fit, at any speed (4 of its 8 epochs)
        assert 0 < record["fit_time_this_process_s"] < record["fit_time_s"]
