"""What this machine offers a command: CPU cores and GPUs, counted before anything starts.

Counted without importing torch (seconds at start-up) where the system says it directly: the CPUs this
process may run on (a SLURM allocation or `taskset` included, as sched_getaffinity reports them) and the
NVIDIA GPUs the driver lists, narrowed by CUDA_VISIBLE_DEVICES. Only on a ROCm machine (/dev/kfd), whose
devices the system does not list this plainly, torch is asked."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
"""One folder per GPU the NVIDIA driver manages."""


def cpu_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        # "" and "-1" hide every GPU; the list stops at its first invalid entry, as CUDA reads it.
        count = 0
        for entry in visible.split(","):
            if not entry.strip() or entry.strip().startswith("-"):
                break
            count += 1
        return count
    if NVIDIA_GPUS.is_dir():
        return sum(1 for _ in NVIDIA_GPUS.iterdir())
    devices = [name for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name)] if os.path.isdir("/dev") else []
    if devices:
        return len(devices)
    if os.path.exists("/dev/kfd"):
        import torch

        return torch.cuda.device_count()
    return 0


@dataclass(frozen=True)
class Machine:
    cores: int
    gpus: int

    @classmethod
    def here(cls) -> "Machine":
        return cls(cpu_cores(), gpu_count())

    def describe(self) -> str:
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else "no GPU"
        return f"this machine has {self.cores} CPU core{'s' if self.cores != 1 else ''} and {gpus}"

    def worker_problem(self, workers: int, workers_per_gpu: int = 1) -> str | None:
        """Why `bench --workers N` cannot run here, or None: one worker per GPU (or `workers_per_gpu` sharing
        each), else one per CPU core, since more CPU workers than cores only take turns on them."""
        if workers < 1:
            return f"--workers {workers}: expected an integer >= 1"
        if self.gpus:
            most = self.gpus * workers_per_gpu
            if workers > most:
                per = f" x {workers_per_gpu} per GPU" if workers_per_gpu > 1 else " (one per GPU)"
                return f"--workers {workers}: {self.describe()}; at most {most} workers{per}"
            return None
        if workers > self.cores:
            return f"--workers {workers}: {self.describe()}; at most {self.cores} CPU workers (one per core)"
        return None

    def ddp_problem(self, devices: int, strategy: str) -> str | None:
        """Why `--strategy ddp --devices N` cannot run here, or None: N GPUs on this node, or without GPUs N
        CPU processes (gloo), at most one per core."""
        if strategy != "ddp" or devices < 1:
            return None  # harness/run/distributed.py refuses these, with the fix
        if self.gpus:
            if devices > self.gpus:
                return f"--devices {devices}: {self.describe()}; DDP runs one process per GPU, so at most --devices {self.gpus}"
            return None
        if devices > self.cores:
            return (f"--devices {devices}: {self.describe()}; DDP on CPU runs one process per device, "
                    f"so at most --devices {self.cores} (one per core)")
        return None


def gpu_sharing(workers: int, gpus: int) -> int:
    """Workers per GPU when `workers` are dealt over `gpus` (1 without GPUs): what `scaling --workers 1,2,4`
    on a one-GPU node measures."""
    return max(1, -(-workers // gpus)) if gpus else 1


def workers_per_gpu_rule(runs_per_gpu: Mapping[str, int], machine: Machine) -> tuple[int, str]:
    """bench's default workers per GPU for a plan whose tasks declare `runs_per_gpu` (modules/tasks/base.py, each
    from a measurement of how busy one run keeps a GPU), and the rule in one line for `bench --dry-run` and the log.

    The smallest of the tasks' values: any worker may take any run of the plan, so the task that fills a GPU
    most sets the share. At most the CPU cores per GPU: a worker drives its GPU from one core (kernel launches,
    the data loader), and a launch-bound run is exactly the kind that wants a core of its own."""
    if not machine.gpus:
        return 1, "no GPU: one worker per CPU core"
    named = ", ".join(f"{task} {count}" for task, count in sorted(runs_per_gpu.items())) or "none"
    wanted = min(runs_per_gpu.values(), default=1)
    cap = max(1, machine.cores // machine.gpus)
    share = max(1, min(wanted, cap))
    capped = f", capped at the {cap} CPU core(s) per GPU" if wanted > cap else ""
    return share, (f"{share} per GPU: the fewest runs per GPU among the plan's tasks ({named}){capped}; "
                   f"--workers-per-gpu K overrides")
