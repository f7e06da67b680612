"""How many CPU threads a run uses: torch's intra-op pool, split between the processes running at once."""

from __future__ import annotations

import os
import sys

import torch


def threads_per_worker(workers: int) -> int:
    """The CPU cores split evenly between the worker processes running at once."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def configure_threads(threads: int | None) -> None:
    """torch threads of this process; None: every CPU it may run on (a scheduler's allocation included)."""
    if threads is None:
        affinity = getattr(os, "sched_getaffinity", None)
        threads = len(affinity(0)) if affinity else os.cpu_count() or 1
    torch.set_num_threads(threads)
    if sys.platform.startswith("linux"):
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def configure_worker_threads(workers: int) -> None:
    """This process is one of `workers` running at once: it takes its even share of the cores."""
    configure_threads(threads_per_worker(workers))
