"""The local worker pool: N long-lived worker processes (one per GPU when GPUs exist), one run at a time each.

Written on multiprocessing rather than concurrent.futures because a worker that dies (segfault, OOM
kill) must cost exactly the run it held: ProcessPoolExecutor breaks the whole pool and cannot say
which run killed it. Workers write their own records (atomically), so a record survives even if the
coordinator is killed right after the run finishes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

from harness.plan.spec import RunSpec
from harness.results.record import Record
from harness.results.store import RecordStore
from harness.run.devices import require_usable_gpus
from harness.run.progress import progress_lines
from harness.run.threads import available_cpus, threads_per_worker
from harness.run.worker import RunWorker, WorkerSettings, run_item


BATCH_PROGRESS_EVERY_S = 30.0
"""A seed batch in a worker prints its progress line (harness/run/progress.py) at most this often into bench's log:
a quick batch trains for a minute or two, a paper-gat batch of 20 seeds for an hour, both silent between their
seeds' result lines otherwise; every epoch would be 300 lines a batch."""


@dataclass
class WorkerOptions:
    runs_dir: str
    data_root: str | None
    cache_dir: str | None
    plugin_files: Sequence[str] = ()
    commit: str | None = None
    workers: int = 1
    env: dict[str, str] = field(default_factory=dict)
    workers_per_gpu: int = 1
    """Workers sharing each GPU: tiny runs (a Cora GAT) are launch-bound and leave a GPU mostly idle."""

    def settings(self, gpu: str | None) -> WorkerSettings:
        """Every worker, GPU or CPU, takes its even share of the cores this process may use."""
        return WorkerSettings(self.runs_dir, self.data_root, self.cache_dir, tuple(self.plugin_files), self.commit,
                              threads=threads_per_worker(self.workers), gpu=gpu, env=dict(self.env),
                              execution={"launcher": "workers", "workers": self.workers})


def serve(conn: Connection, settings: WorkerSettings, coordinator: int | None = None) -> None:
    """A worker process: run each work item the coordinator sends (a list of specs: one run, or the seeds of
    one seed batch), answering ("record", summary) as each of its runs ends and then ("done", whether this
    worker retires). It retires after a device failure (OOM, CUDA error): a corrupted CUDA context would fail
    every later run on its GPU, so the coordinator starts a fresh process in its place."""
    # the coordinator's pid from the coordinator itself: killed while this process was still importing, getppid()
    # here would already name its new parent
    threading.Thread(target=_end_with_the_coordinator, args=(coordinator or os.getppid(),), daemon=True).start()
    worker = RunWorker(settings)
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the coordinator is gone
            return
        if message is None:
            return
        with progress_lines(every_s=BATCH_PROGRESS_EVERY_S):  # printed: a spawned worker shares bench's standard output
            records = run_item(worker, message, lambda record: conn.send(("record", record.summary())))
        retire = any(record.retryable for record in records)
        conn.send(("done", retire))
        if retire:
            return


def _end_with_the_coordinator(coordinator: int, every_s: float = 0.5) -> None:
    """End this worker as soon as its coordinator is gone (killed alone, e.g. `kill PID`): an orphan would
    run its item to the end and race the fresh workers of a resumed bench on the same keys. Its unfinished
    run is lost, as the coordinator's own death loses it; finished records are already written."""
    while True:
        time.sleep(every_s)
        if os.getppid() != coordinator:
            os._exit(1)


@dataclass
class _Worker:
    process: mp.Process
    conn: Connection
    gpu: str | None
    item: list[RunSpec] | None = None
    """The work item it runs; its runs not yet answered for."""
    started: float = 0.0


def visible_gpus() -> list[str]:
    """The GPUs the workers are dealt; raises GpuUnusableError if the node has GPUs that torch cannot use."""
    require_usable_gpus()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() != ""]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        return []


def default_workers(workers_per_gpu: int = 1) -> int:
    """workers_per_gpu per visible GPU, else one per CPU this process may use."""
    gpus = visible_gpus()
    return len(gpus) * max(1, workers_per_gpu) if gpus else available_cpus()


class LocalExecutor:
    def __init__(self, options: WorkerOptions, gpus: Sequence[str] | None = None):
        self.options = options
        gpus = list(gpus) if gpus is not None else visible_gpus()
        per_gpu = max(1, options.workers_per_gpu)
        if gpus and options.workers > per_gpu * len(gpus):
            raise ValueError(f"{options.workers} workers but only {len(gpus)} GPU(s) visible with {per_gpu} worker(s) per GPU; "
                             f"use --workers {per_gpu * len(gpus)} or fewer, or more --workers-per-gpu")
        # GPU-major: with fewer workers than slots, the first workers spread over different GPUs.
        slots = [gpu for _ in range(per_gpu) for gpu in gpus]
        self.slots: list[str | None] = slots[: options.workers] if gpus else [None] * options.workers
        self.ctx = mp.get_context("spawn")
        self.store = RecordStore(options.runs_dir)

    def _start(self, gpu: str | None) -> _Worker:
        parent, child = self.ctx.Pipe()
        # Not a daemon: a daemonic process may not have children, so a run's DataLoader could not use
        # worker processes. `run` ends every worker it started (a shutdown message, then join or kill).
        process = self.ctx.Process(target=serve, args=(child, self.options.settings(gpu), os.getpid()), daemon=False)
        process.start()
        child.close()
        return _Worker(process, parent, gpu)

    def run(self, items: Sequence[RunSpec | Sequence[RunSpec]], on_result: Callable[[RunSpec, dict[str, Any]], None],
            on_start: Callable[[list[RunSpec]], None] | None = None) -> None:
        """Run work items (a spec, or the seeds of one seed batch: harness/plan/planner.py seed_batches);
        `on_result` is called once per spec, as its run ends, and `on_start` with an item's specs as a worker takes it."""
        pending = deque([item] if isinstance(item, RunSpec) else list(item) for item in items)
        workers = [self._start(gpu) for gpu in self.slots[: max(1, min(len(self.slots), len(pending)))]]
        try:
            while pending or any(w.item is not None for w in workers):
                for worker in workers:
                    if worker.item is None and pending:
                        worker.item = pending.popleft()
                        worker.started = time.perf_counter()
                        if on_start is not None:
                            on_start(list(worker.item))
                        worker.conn.send([spec.to_dict() for spec in worker.item])
                busy = [w for w in workers if w.item is not None]
                ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
                for worker in busy:
                    if worker.conn in ready:
                        try:
                            kind, payload = worker.conn.recv()
                        except EOFError:  # it died before answering: a death, handled below
                            kind = None
                        if kind == "record":
                            spec = next(s for s in worker.item if s.key == payload.get("key"))
                            worker.item.remove(spec)
                            on_result(spec, payload)
                            continue
                        if kind == "done":
                            unanswered, worker.item = worker.item, None
                            if payload:  # a device failure: the process ends itself; a fresh one takes its GPU
                                worker.process.join(timeout=30)
                                if worker.process.is_alive():
                                    worker.process.kill()
                                    worker.process.join(timeout=5)
                                workers[workers.index(worker)] = self._start(worker.gpu)
                                if unanswered:  # runs after the failure never started: the next worker takes them
                                    pending.appendleft(unanswered)
                            continue
                    if worker.process.sentinel in ready or not worker.process.is_alive():
                        worker.process.join(timeout=1)
                        unanswered, worker.item = worker.item, None
                        for spec in unanswered:
                            on_result(spec, self._worker_died(spec, worker).summary())
                        workers[workers.index(worker)] = self._start(worker.gpu)
        finally:
            for worker in workers:
                try:
                    worker.conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
            for worker in workers:
                worker.process.join(timeout=10)
                if worker.process.is_alive():
                    worker.process.kill()

    def _worker_died(self, spec: RunSpec, worker: _Worker) -> Record:
        """A worker died mid-run (segfault, OOM kill): that run is recorded as failed, the rest go on."""
        existing = self.store.read(spec.key)
        if existing is not None:  # it finished and wrote its record just before dying
            return existing
        code = worker.process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        record = Record.died(spec.key, spec.to_dict(),
                             f"WorkerDied: the worker process running this run died ({how}); out of memory, a crash in native code, or killed",
                             commit=self.options.commit, wall_time_s=time.perf_counter() - worker.started)
        self.store.write(record)
        return record


def log(message: str) -> None:
    print(message, flush=True)  # bench's output is often a file or pipe (nohup, SLURM): each progress line now
