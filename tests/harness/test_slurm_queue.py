"""SlurmQueue (harness/run/job_array.py) against a stand-in `squeue` on PATH: an squeue that fails ("Socket timed
out", a busy controller) ends no task: it is asked again, and a streak of failures is reported with what failed;
only squeue's "Invalid job id" (the controller forgot ended ids) or a final state ends tasks."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace


from harness.run import job_array
from harness.run.job_array import SQUEUE_FAILURES_REPORTED, SlurmQueue

IDS = ["12_0", "12_1"]


def fake_squeue(folder: Path, monkeypatch, *, stdout: str = "", stderr: str = "", status: int = 0) -> Path:
    """An `squeue` first on PATH that prints `stdout`/`stderr` and exits with `status`; it logs its calls."""
    folder.mkdir(parents=True, exist_ok=True)
    calls = folder / "calls"
    script = folder / "squeue"
    script.write_text("#!/bin/sh\n"
                      f"echo \"$@\" >> '{calls}'\n"
                      f"printf '%s' '{stdout}'\n"
                      f"printf '%s\\n' '{stderr}' >&2\n"
                      f"exit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return calls


def pending(tmp_path: Path):
    """(job, shard) pairs whose tasks have written no result."""
    return [(SimpleNamespace(job_id=job_id, paths=SimpleNamespace(folder=tmp_path, result_pickle=tmp_path / f"{job_id}.pkl")), None)
            for job_id in IDS]


def test_a_failing_squeue_ends_no_task_is_asked_again_and_says_what_failed(tmp_path, monkeypatch):
    calls = fake_squeue(tmp_path / "bin", monkeypatch, stderr="slurm_load_jobs error: Socket timed out on send/recv operation", status=1)
    monkeypatch.setattr(job_array, "RESULT_GRACE_S", 0.0)  # a task squeue called ended would be over at once
    lines: list[str] = []
    queue = SlurmQueue(log=lines.append)
    for _ in range(SQUEUE_FAILURES_REPORTED):
        assert queue.ended(IDS) is None
        assert queue.finished(pending(tmp_path), poll_s=0.0) == []
    assert len(calls.read_text().splitlines()) == 2 * SQUEUE_FAILURES_REPORTED  # asked at every poll
    reports = [line for line in lines if "squeue failed" in line]
    assert len(reports) == 2  # after the third failure in a row, and the sixth
    assert "Socket timed out on send/recv operation" in reports[-1] and "not ended" in reports[-1]


def test_a_missing_squeue_ends_no_task(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    lines: list[str] = []
    queue = SlurmQueue(log=lines.append)
    assert all(queue.ended(IDS) is None for _ in range(SQUEUE_FAILURES_REPORTED))
    assert any("squeue failed 3 times" in line for line in lines)


def test_squeue_ends_tasks_it_lists_as_final_or_forgot(tmp_path, monkeypatch):
    fake_squeue(tmp_path / "listed", monkeypatch, stdout="12_0 RUNNING\n12_1 COMPLETED\n")
    queue = SlurmQueue(log=lambda line: None)
    assert queue.ended(IDS) == {"12_1"} and queue.last_state == {"12_0": "RUNNING", "12_1": "COMPLETED"}
    fake_squeue(tmp_path / "forgot", monkeypatch, stderr="slurm_load_jobs error: Invalid job id specified", status=1)
    assert queue.ended(IDS) == set(IDS)


def test_a_streak_is_counted_afresh_after_an_answer(tmp_path, monkeypatch):
    lines: list[str] = []
    queue = SlurmQueue(log=lines.append)
    fake_squeue(tmp_path / "down", monkeypatch, stderr="Socket timed out", status=1)
    queue.ended(IDS), queue.ended(IDS)
    fake_squeue(tmp_path / "up", monkeypatch, stdout="12_0 RUNNING\n12_1 RUNNING\n")
    assert queue.ended(IDS) == set()
    fake_squeue(tmp_path / "down2", monkeypatch, stderr="Socket timed out", status=1)
    queue.ended(IDS)
    assert not any("squeue failed" in line for line in lines)
