"""The one worker body: a process that runs specs one after another and writes each record itself.

Both launchers use it: a local worker process (worker_pool.py) feeds it specs from a pipe, a job-array task
(job_array.py) from its shard. Writing the record in the worker (atomic rename) rather than in the
coordinator means a record survives the coordinator being killed right after a run finished."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from harness.plan.spec import RunSpec
from harness.results.checkpoints import Checkpoints
from harness.results.record import Record
from harness.results.store import RecordStore
from harness.run.threads import configure_threads


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs, passed explicitly: a job on a compute node sees neither the submitter's
    environment variables nor its working directory's defaults."""

    runs_dir: str
    data_root: str | None
    cache_dir: str | None
    plugin_files: Sequence[str] = ()
    commit: str | None = None
    threads: int | None = None
    """torch threads; None: every CPU this process may use."""
    gpu: str | None = None
    """The one GPU this worker sees (CUDA_VISIBLE_DEVICES); None: whatever the process was given."""
    env: Mapping[str, str] = field(default_factory=dict)
    execution: Mapping[str, Any] = field(default_factory=dict)
    """How this worker's runs are launched ({"launcher": "workers", "workers": 2}, a job array's shard), for
    every record it writes (`Record.execution`: metadata, never the key)."""


class RunWorker:
    """Set up once per process (GPU pinning before torch initialises CUDA, threads, plugins), then `run`."""

    def __init__(self, settings: WorkerSettings):
        if settings.gpu is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = settings.gpu
        os.environ.update(settings.env)
        # After CUDA_VISIBLE_DEVICES is set: the runner and plugins import torch and may touch CUDA.
        from harness.run import runner
        from modules.registry import load_plugin_file

        configure_threads(settings.threads)
        for plugin in settings.plugin_files:
            load_plugin_file(plugin)
        self.runner = runner
        self.settings = settings
        self.store = RecordStore(settings.runs_dir)
        # mid-run checkpoints beside the records, at the interval of ATTNBENCH_CHECKPOINT_EVERY (inherited, or in
        # settings.env for a job-array task); harness/results/checkpoints.py
        self.checkpoints = Checkpoints(settings.runs_dir)

    def run(self, spec_dict: Mapping[str, Any]) -> Record:
        spec = RunSpec.from_dict(spec_dict)
        record = self.runner.execute(spec, data_root=self.settings.data_root, cache_dir=self.settings.cache_dir,
                                     commit=self.settings.commit, execution=self.settings.execution,
                                     checkpoints=self.checkpoints)
        self.store.write(record)
        if not record.retryable:  # written: nothing resumes from it now (a device failure's retry still may)
            self.checkpoints.remove_run(spec.key)
        return record


def run_item(worker: RunWorker, spec_dicts: Sequence[Mapping[str, Any]],
             on_record: Callable[[Record], None] = lambda r: None) -> list[Record]:
    """A work item for `worker`: one spec run alone, or the seeds of one configuration as one seed batch
    (falling back to one run per seed where this process cannot batch them). Each record is written, then passed to
    `on_record`, as soon as its seed ends."""
    from harness.run.seed_batch import execute_batch, seed_batch_problem

    specs = [RunSpec.from_dict(d) for d in spec_dicts]
    cps = worker.checkpoints
    if len(specs) > 1 and not cps.off:
        # a seed with a lone run's checkpoint (from a --no-seed-batch run, or a batch's last seed) resumes alone first
        alone = [s for s in specs if cps.run_path(s.key).is_file()]
        if alone:
            records = run_item(worker, [s.to_dict() for s in alone], on_record)
            rest = [s.to_dict() for s in specs if s not in alone]
            return records + (run_item(worker, rest, on_record) if rest and not any(r.retryable for r in records) else [])
    # one seed left of a killed batch resumes from the batch's checkpoint, as a batch of one (bit for bit its lone run)
    resume_batch = len(specs) == 1 and not cps.off and not cps.run_path(specs[0].key).is_file() and bool(cps.batch_covering([specs[0].key]))
    if (len(specs) > 1 or resume_batch) and seed_batch_problem(specs[0]) is None:
        def written(record: Record) -> None:
            worker.store.write(record)
            on_record(record)

        return execute_batch(specs, data_root=worker.settings.data_root, cache_dir=worker.settings.cache_dir,
                             commit=worker.settings.commit, on_record=written, execution=worker.settings.execution,
                             checkpoints=cps)
    records = []
    for spec_dict in spec_dicts:
        records.append(worker.run(spec_dict))
        on_record(records[-1])
        if records[-1].retryable:  # a device failure: this process stops here (worker_pool.serve)
            break
    return records
