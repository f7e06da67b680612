"""`attnbench scaling`: the same suite run with 1, 2, ... workers in one command, and the speed-up.

Every worker count runs every planned run from scratch, into its own temporary records folder (the
suite's real records are neither read nor written), after one untimed run per task has filled the
data caches, so no configuration pays for preprocessing that another one reuses. Workers split the
CPU cores between them exactly as `bench --workers N` does.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Sequence

from harness.plan.planner import plan
from harness.plan.suite import load_suite
from harness.results.record import Status
from harness.run.runner import git_commit
from harness.run.worker_pool import LocalExecutor, WorkerOptions, log


def measure_scaling(suite_name: str, worker_counts: Sequence[int], *, variant_filter: str | None = None, seeds: int | None = None,
                    data_root: str | None = None, cache_dir: str | None = None) -> list[dict]:
    if not worker_counts or any(n < 1 for n in worker_counts):
        raise ValueError(f"worker counts must be positive integers, got {list(worker_counts)}")
    suite = load_suite(suite_name)
    if seeds is not None:
        if seeds < 1:
            raise ValueError("--seeds must be at least 1")
        suite = dataclasses.replace(suite, seeds=tuple(range(seeds)))
    specs = plan(suite, data_root, variant_filter).specs
    if not specs:
        raise ValueError(f"suite {suite.name} plans no runs for variants {variant_filter!r}")
    commit = git_commit()
    failures: list[str] = []

    def execute_all(todo, workers: int) -> float:
        with tempfile.TemporaryDirectory(prefix=f"attnbench-scaling-{workers}w-") as runs:
            options = WorkerOptions(runs_dir=runs, data_root=data_root, cache_dir=cache_dir, commit=commit, workers=workers)
            start = time.perf_counter()
            LocalExecutor(options).run(todo, lambda spec, summary: summary.get("status") == Status.OK or failures.append(spec.display))
            return time.perf_counter() - start

    warmup = list({s.task: s for s in specs}.values())
    log(f"attnbench scaling: warming the data caches with {len(warmup)} untimed run(s)")
    execute_all(warmup, 1)
    results = []
    for workers in worker_counts:
        log(f"attnbench scaling: {len(specs)} runs of {suite.name} on {workers} worker(s) ...")
        seconds = execute_all(specs, workers)
        results.append({"workers": workers, "runs": len(specs), "seconds": seconds})
        log(f"attnbench scaling: {workers} worker(s): {seconds:.1f} s")
    base = results[0]["seconds"]
    log(f"\n| workers | runs | wall time | runs/min | speed-up vs {results[0]['workers']} |")
    log("|---:|---:|---:|---:|---:|")
    for r in results:
        r["speedup"] = base / r["seconds"]
        log(f"| {r['workers']} | {r['runs']} | {r['seconds']:.1f} s | {60 * r['runs'] / r['seconds']:.1f} | {r['speedup']:.2f}x |")
    if failures:
        log(f"attnbench scaling: {len(failures)} run(s) failed ({sorted(set(failures))}); the timings include them")
    return results
