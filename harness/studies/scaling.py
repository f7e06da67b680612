"""`attnbench scaling`: the same suite run with 1, 2, ... workers, or with 1 and 20 seeds, in one command.

Every (seed count, worker count) pair runs every planned run from scratch, into its own temporary records
folder (the suite's real records are neither read nor written), after one untimed run per task has
filled the data caches, so no configuration pays for preprocessing that another one reuses. Work is
split exactly as `bench` splits it: seeds of one configuration as seed batches (`--no-seed-batch`: one
run each), the CPU cores shared between the workers.

`--seeds 1,20 --workers 2` checks what seed batching buys: the wall time of a 20-seed suite against the same suite
with one seed, same workers, side by side in one run.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Sequence

from harness.plan.machine import gpu_sharing
from harness.plan.planner import plan, seed_batches
from harness.plan.suite import load_suite
from harness.results.record import Status
from harness.run.runner import git_commit
from harness.run.worker_pool import LocalExecutor, WorkerOptions, log, visible_gpus


def measure_scaling(suite_name: str, worker_counts: Sequence[int], *, variant_filter: str | None = None,
                    seeds: int | Sequence[int] | None = None, seed_batch: bool = True,
                    data_root: str | None = None, cache_dir: str | None = None) -> list[dict]:
    """One row per (seed count, worker count): runs, seconds, `speedup` over the first worker count at the
    same seeds and `time_ratio` against the first seed count at the same workers."""
    if not worker_counts or any(n < 1 for n in worker_counts):
        raise ValueError(f"worker counts must be positive integers, got {list(worker_counts)}")
    seed_counts = [None] if seeds is None else [seeds] if isinstance(seeds, int) else list(seeds)
    if not seed_counts or any(n is not None and n < 1 for n in seed_counts):
        raise ValueError(f"seed counts must be positive integers, got {seeds}")
    base_suite = load_suite(suite_name)
    plans = {}
    for count in seed_counts:
        # A count replaces every task's seeds, those a task sets for itself included (paper-gat's CiteSeer
        # has 36): the comparison is between seed counts, so no task may keep its own.
        suite = base_suite if count is None else dataclasses.replace(
            base_suite, seeds=tuple(range(count)), tasks=tuple(dataclasses.replace(t, seeds=None) for t in base_suite.tasks))
        specs = plan(suite, data_root, variant_filter).specs
        if not specs:
            raise ValueError(f"suite {suite.name} plans no runs for variants {variant_filter!r}")
        plans[count] = specs
    commit = git_commit()
    failures: list[str] = []

    def execute_all(items, workers: int) -> float:
        with tempfile.TemporaryDirectory(prefix=f"attnbench-scaling-{workers}w-") as runs:
            options = WorkerOptions(runs_dir=runs, data_root=data_root, cache_dir=cache_dir, commit=commit, workers=workers,
                                    workers_per_gpu=gpu_sharing(workers, len(visible_gpus())))
            start = time.perf_counter()
            LocalExecutor(options).run(items, lambda spec, summary: summary.get("status") == Status.OK or failures.append(spec.display))
            return time.perf_counter() - start

    first = plans[seed_counts[0]]
    warmup = list({s.task: s for s in first}.values())
    log(f"attnbench scaling: warming the data caches with {len(warmup)} untimed run(s)")
    execute_all(warmup, 1)
    results = []
    for count, specs in plans.items():
        for workers in worker_counts:
            items = seed_batches(specs, workers, enabled=seed_batch)
            batched = sum(len(item) > 1 for item in items)
            how = f"{len(items)} work item(s), {batched} of them seed batches" if batched else f"{len(items)} lone runs"
            log(f"attnbench scaling: {len(specs)} runs of {base_suite.name} on {workers} worker(s) ({how}) ...")
            seconds = execute_all(items, workers)
            results.append({"seeds": count, "workers": workers, "runs": len(specs), "seconds": seconds, "seed_batches": batched})
            log(f"attnbench scaling: {workers} worker(s): {seconds:.1f} s")
    for r in results:
        r["speedup"] = next(b for b in results if b["seeds"] == r["seeds"])["seconds"] / r["seconds"]
        r["time_ratio"] = r["seconds"] / next(b for b in results if b["workers"] == r["workers"])["seconds"]
    seeds_column = len(seed_counts) > 1
    header = ["workers", "runs", "wall time", "runs/min", f"speed-up vs {worker_counts[0]} worker(s)"]
    if seeds_column:
        header = ["seeds", *header, f"time vs {seed_counts[0]} seed(s)"]
    log("\n| " + " | ".join(header) + " |")
    log("|" + "---:|" * len(header))
    for r in results:
        cells = [r["workers"], r["runs"], f"{r['seconds']:.1f} s", f"{60 * r['runs'] / r['seconds']:.1f}", f"{r['speedup']:.2f}x"]
        if seeds_column:
            cells = [r["seeds"], *cells, f"{r['time_ratio']:.2f}x"]
        log("| " + " | ".join(str(c) for c in cells) + " |")
    if failures:
        log(f"attnbench scaling: {len(failures)} run(s) failed ({sorted(set(failures))}); the timings include them")
    return results
