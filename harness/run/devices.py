"""Which GPUs this node has, and whether torch can use them: no silent fallback to CPU.

A driver older than the CUDA build of torch (or a CPU-only wheel on a GPU node) makes torch report 0 GPUs,
and a bench would then run its whole suite on CPU workers and label the boards CPU, hours later. The node's
own view (nvidia-smi, else /proc/driver/nvidia) is compared with torch's before any run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class GpuUnusableError(ValueError):
    """The node has NVIDIA GPUs that torch cannot use (a ValueError: the CLI reports it and exits 2)."""


def node_gpus() -> list[str]:
    """One line per NVIDIA GPU the node's driver shows ('name, driver version'), [] if none or no driver."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0:
                return [line.strip() for line in out.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        version = Path("/proc/driver/nvidia/version")
        driver = version.read_text().split("\n", 1)[0].strip() if version.is_file() else "driver version unknown"
        return [f"{entry.name}, {driver}" for entry in sorted(gpus.iterdir())]
    return []


def cpu_on_purpose() -> bool:
    """CUDA_VISIBLE_DEVICES set empty (or -1) hides the GPUs deliberately: running on CPU is then asked for."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.strip() in ("", "-1")


def torch_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def require_usable_gpus() -> None:
    """Raise GpuUnusableError when the node shows GPUs but torch sees none, with the versions that explain it."""
    if cpu_on_purpose():
        return
    shown = node_gpus()
    if not shown or torch_gpu_count() > 0:
        return
    import torch

    raise GpuUnusableError(
        f"this node shows {len(shown)} NVIDIA GPU(s) ({'; '.join(shown[:4])}{' ...' if len(shown) > 4 else ''}) but torch "
        f"{torch.__version__} (built for CUDA {torch.version.cuda or 'none: a CPU-only build'}) can use none of them, so every run "
        "would silently fall back to the CPU. Install a torch build whose CUDA version this driver supports (nvidia-smi's "
        "'CUDA Version' is the newest it runs), or set CUDA_VISIBLE_DEVICES= to run on the CPU on purpose."
    )
