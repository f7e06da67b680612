"""How many CPU threads a run uses: torch's intra-op pool, split between the processes running at once.

The cores a process may use are the fewest of what the node allows it: its CPU affinity (taskset, a SLURM
allocation with task binding), its cgroup CPU quota (a container or a SLURM job with cgroup limits: affinity
still shows every core there) and SLURM's own count of the CPUs given to the task. os.cpu_count() counts the
machine, so 8 GPU workers taking it each would run 8x the threads there are cores."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the cgroup quota allows (cgroup v2 cpu.max, else v1 cpu.cfs_quota_us / cpu.cfs_period_us); None
    if unlimited or unreadable. Reads the root of the mount, which is this process's cgroup in a container."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def slurm_cpu_limit(env: dict[str, str] | os._Environ = os.environ) -> int | None:
    """CPUs SLURM gave this task: SLURM_CPUS_PER_TASK, else SLURM_JOB_CPUS_PER_NODE (first entry, e.g.
    '16(x2)'), else None outside SLURM."""
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE"):
        value = env.get(name)
        if value:
            try:
                return int(value.split(",")[0].split("(")[0])
            except ValueError:
                continue
    return None


def available_cpus() -> int:
    """The CPUs this process may really use: the fewest of affinity, cgroup quota and SLURM's count."""
    affinity = getattr(os, "sched_getaffinity", None)
    limits = [len(affinity(0)) if affinity else os.cpu_count() or 1]
    quota = cgroup_cpu_limit()
    if quota is not None:
        limits.append(max(1, math.floor(quota)))
    slurm = slurm_cpu_limit()
    if slurm is not None:
        limits.append(slurm)
    return max(1, min(limits))


def threads_per_worker(workers: int) -> int:
    """The available CPUs split evenly between the worker processes running at once (GPU workers included:
    each drives its GPU from the host, and 8 of them with every core each oversubscribe the node)."""
    return max(1, available_cpus() // max(1, workers))


def configure_threads(threads: int | None) -> None:
    """torch threads of this process; None: every CPU it may run on (a scheduler's allocation included)."""
    if threads is None:
        threads = available_cpus()
    torch.set_num_threads(threads)
    if sys.platform.startswith("linux"):
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def configure_worker_threads(workers: int) -> None:
    """This process is one of `workers` running at once: it takes its even share of the cores."""
    configure_threads(threads_per_worker(workers))
