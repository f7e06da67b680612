"""What the node has (issue #18): threads per worker from affinity, cgroup quota and SLURM; workers per GPU;
no silent CPU fallback when the node shows GPUs torch cannot use. Simulated: no GPU or SLURM needed."""

from __future__ import annotations

import os

import pytest

from harness.cli import main
from harness.run import devices, threads
from harness.run.worker_pool import LocalExecutor, WorkerOptions


def test_cgroup_quota_v2_and_v1_are_read(tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 4.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None


def test_slurm_cpu_counts_are_read():
    assert threads.slurm_cpu_limit({"SLURM_CPUS_PER_TASK": "6"}) == 6
    assert threads.slurm_cpu_limit({"SLURM_JOB_CPUS_PER_NODE": "16(x2)"}) == 16
    assert threads.slurm_cpu_limit({}) is None


def test_threads_per_worker_take_the_fewest_cpus_the_node_allows(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda root=threads.CGROUP_ROOT: 32.0)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.delenv("SLURM_JOB_CPUS_PER_NODE", raising=False)
    assert threads.available_cpus() == 32  # the quota, not the 64 cores of the affinity mask or the 128 of the machine
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "16")
    assert threads.available_cpus() == 16
    assert threads.threads_per_worker(8) == 2
    assert threads.threads_per_worker(32) == 1  # never 0


def test_gpu_workers_split_the_cores_and_share_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(threads, "available_cpus", lambda: 64)
    options = WorkerOptions(runs_dir=str(tmp_path), data_root=None, cache_dir=None, workers=16, workers_per_gpu=2)
    executor = LocalExecutor(options, gpus=[str(i) for i in range(8)])
    assert executor.slots == [str(i) for i in range(8)] * 2
    assert options.settings("3").threads == 4  # 64 CPUs over 16 workers, GPU workers included
    with pytest.raises(ValueError, match="workers-per-gpu"):
        LocalExecutor(WorkerOptions(runs_dir=str(tmp_path), data_root=None, cache_dir=None, workers=17, workers_per_gpu=2),
                      gpus=[str(i) for i in range(8)])


def test_workers_are_not_daemons_so_loaders_may_use_worker_processes(tmp_path):
    executor = LocalExecutor(WorkerOptions(runs_dir=str(tmp_path), data_root=None, cache_dir=None, workers=1), gpus=[])
    worker = executor._start(None)
    try:
        assert worker.process.daemon is False
    finally:
        worker.conn.send(None)
        worker.process.join(timeout=120)
        if worker.process.is_alive():
            worker.process.kill()


def test_bench_stops_when_the_node_shows_gpus_torch_cannot_use(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "node_gpus", lambda: ["NVIDIA H100 80GB HBM3, 470.57.02"] * 8)
    monkeypatch.setattr(devices, "torch_gpu_count", lambda: 0)
    code = main(["bench", "--suite", "quick", "--runs-dir", str(tmp_path / "runs"), "--leaderboard-dir", str(tmp_path / "boards")])
    err = capsys.readouterr().err
    assert code == 2
    import torch

    assert "8 NVIDIA GPU(s)" in err and "470.57.02" in err and torch.__version__ in err and "CUDA_VISIBLE_DEVICES=" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))
    # hiding the GPUs on purpose is not a silent fallback
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    devices.require_usable_gpus()


def test_proc_driver_is_read_without_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    real_path = devices.Path

    def fake_path(p):
        return real_path(str(p).replace("/proc/driver/nvidia", str(tmp_path)))

    (tmp_path / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.57.02\n")
    monkeypatch.setattr(devices, "Path", fake_path)
    assert devices.node_gpus() == ["0000:3b:00.0, NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.57.02"]


def test_gpu_smoke_without_a_gpu_says_so_and_exits_0(monkeypatch, capsys, tmp_path):
    import torch

    from harness.studies import gpu_smoke

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "node_gpus", lambda: [])
    assert gpu_smoke.main(["--out", str(tmp_path / "smoke")]) == 0
    assert "gpu-smoke: no GPU usable by torch" in capsys.readouterr().out
    assert not (tmp_path / "smoke").exists()
