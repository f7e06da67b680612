"""GPU failures are infrastructure failures (issue #18): an OOM or CUDA error marks the run retryable with
its error kept, the worker process that saw it ends and a fresh one takes its place, and device memory and
peak statistics are released between runs. No GPU is needed: the failures are raised on purpose."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from harness.plan.spec import make_spec
from harness.run import runner
from harness.run.worker_pool import LocalExecutor, WorkerOptions


def test_device_failures_are_recognised_and_ordinary_ones_are_not():
    assert runner.is_device_failure(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert runner.is_device_failure(RuntimeError("CUDA error: device-side assert triggered"))
    try:
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        except RuntimeError as inner:
            raise ValueError("metric failed") from inner
    except ValueError as chained:
        assert runner.is_device_failure(chained)
    assert not runner.is_device_failure(RuntimeError("deliberate failure in test-raises"))
    assert not runner.is_device_failure(FloatingPointError("test metrics ['accuracy'] are not finite"))


def test_an_oom_makes_the_run_retryable_with_the_error_kept(monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(runner, "_prepare", out_of_memory)
    record = runner.execute(make_spec("cora", "softmax", 0, {"max_epochs": 1}))
    assert record["status"] == "failed" and record.retryable
    assert record["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert not record.is_final()  # the next bench runs it again

    def ordinary(*args, **kwargs):
        raise ValueError("a bug in the run")

    monkeypatch.setattr(runner, "_prepare", ordinary)
    record = runner.execute(make_spec("cora", "softmax", 1, {"max_epochs": 1}))
    assert record["status"] == "failed" and not record.retryable and record.is_final()


def test_memory_is_released_and_peaks_reset_before_each_run(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset_peak"))
    runner.release_device_memory()
    assert calls == ["empty_cache", "reset_peak"]


PLUGIN = textwrap.dedent('''
    """Test plugin (loaded in each worker process): seed 0 hits a CUDA OOM, other seeds fail ordinarily;
    both messages carry the worker's pid."""
    import os

    import torch

    from harness.run import runner

    def _prepare(spec, *args, **kwargs):
        if spec.seed == 0:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (pid {os.getpid()})")
        raise ValueError(f"ordinary failure (pid {os.getpid()})")

    runner._prepare = _prepare
''')


def test_the_worker_that_saw_a_device_failure_is_replaced(tmp_path: Path):
    plugin = tmp_path / "oom_plugin.py"
    plugin.write_text(PLUGIN)
    specs = [make_spec("cora", "softmax", seed, {"max_epochs": 1}) for seed in (0, 1, 2)]
    options = WorkerOptions(runs_dir=str(tmp_path / "runs"), data_root=None, cache_dir=None, plugin_files=[str(plugin)], workers=1)
    results = []
    LocalExecutor(options, gpus=[]).run(specs, lambda spec, summary: results.append((spec.seed, summary)))
    assert [seed for seed, _ in results] == [0, 1, 2]
    records = {json.loads(p.read_text())["spec"]["seed"]: json.loads(p.read_text()) for p in (tmp_path / "runs" / "records").glob("*.json")}
    assert records[0]["retryable"] is True and "CUDA out of memory" in records[0]["error"]
    assert "retryable" not in records[1] and "retryable" not in records[2]
    pid = {seed: r["error"].rsplit("pid ", 1)[1].rstrip(")") for seed, r in records.items()}
    assert pid[1] != pid[0], "the worker that hit the OOM ran the next run"
    assert pid[2] == pid[1], "an ordinary failure must not cost the worker"
