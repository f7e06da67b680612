"""S seeds of one configuration in one process: build each seed as its lone run builds it, train them as one
seed-batched model (the task's `train_seed_batch`), then test and record each seed as soon as it ends.

Each seed keeps its own key and record; how it ran goes to `Record.execution` ({"seed_batch": S, ...}),
never into the key. Records are written one by one as seeds finish, so a batch killed midway keeps its
finished seeds and the next bench re-runs only the others.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

import lightning as L
import torch

from modules.tasks import get_task

from harness.plan.planner import configuration, seed_batch_problem as planned_problem
from harness.plan.spec import RunSpec
from harness.results.record import Record, utc_now
from harness.run.runner import LOGGER_ENV, PeakMemory, is_device_failure, quiet_lightning, release_device_memory, run_context, test_outcome


def seed_batch_problem(spec: RunSpec) -> str | None:
    """None when this spec's seeds can train as one batch in this process; otherwise why each runs alone."""
    if os.environ.get(LOGGER_ENV):
        return "--logger: per-epoch curves are written by Lightning's loggers, which only lone runs have"
    return planned_problem(spec)


def execute_batch(specs: Sequence[RunSpec], *, data_root: str | None = None, cache_dir: str | None = None,
                  commit: str | None = None, on_record: Callable[[Record], None],
                  execution: Mapping[str, Any] | None = None) -> list[Record]:
    """Run specs that differ only in their seed as one batch; `on_record` gets each seed's record as it ends
    (write it there). Never raises for a failing seed: failures are data, and a failure of the whole batch
    (an out-of-memory error) fails every seed not yet recorded."""
    if len({configuration(s) for s in specs}) != 1:
        raise ValueError("a seed batch holds seeds of one configuration; got " + ", ".join(sorted({s.display for s in specs})))
    quiet_lightning()
    release_device_memory()
    t0 = time.perf_counter()
    memory = PeakMemory()
    memory.reset()
    context = run_context(specs[0], commit)
    task = get_task(specs[0].task)
    params = task.Params(**specs[0].params)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    records: dict[int, Record] = {}
    execution = {**(execution or {}), "seed_batch": len(specs), "seeds": [s.seed for s in specs]}

    def measured(epochs: int, fit_time_s: float | None, history, batch_epoch_s: Sequence[float]) -> dict[str, Any]:
        return dict(
            epochs=epochs,
            time_per_epoch_s=fit_time_s / epochs if epochs and fit_time_s is not None else None,
            fit_time_s=fit_time_s,
            wall_time_s=time.perf_counter() - t0,
            peak_memory_mb=memory.peak_mb(),
            history=history,
            finished=utc_now(),
            # time_per_epoch_s and fit_time_s are this seed's share of the batch's epochs (README, "Seed batching");
            # peak_memory_mb is the whole batch's.
            execution={**execution, "batch_epoch_s": sum(batch_epoch_s) / len(batch_epoch_s) if batch_epoch_s else None},
            **context,
        )

    def record(index: int, rec: Record) -> None:
        records[index] = rec
        on_record(rec)

    try:
        modules, datamodule = [], None
        for spec in specs:
            # Exactly as a lone run (runner._prepare): seed, then build, so the initial parameters are its own.
            L.seed_everything(spec.seed, workers=True, verbose=False)
            dm, module = task.build(params, spec.attention, data_root=data_root, cache_dir=cache_dir)
            datamodule = datamodule or dm
            modules.append(module.to(device))
        rules = [task.stopping_rule(params) for _ in specs]  # each seed's own, the one its lone run stops by

        def finished(outcome) -> None:
            spec = specs[outcome.index]
            history = _compact(outcome.history, params.max_epochs)
            fields = measured(outcome.epochs, outcome.fit_time_s, history, outcome.batch_epoch_s)
            if outcome.error is not None:
                record(outcome.index, Record.failed(spec, outcome.error, **fields))
                return
            try:
                tester = L.Trainer(accelerator="auto", devices=1, logger=False, enable_checkpointing=False,
                                   enable_progress_bar=False, enable_model_summary=False)
                monitor = outcome.best_metrics.get(task.monitor.name)
                result = test_outcome(task, spec, tester, outcome.module, datamodule, outcome.best_epoch, monitor,
                                      rule=rules[outcome.index].description)
            except Exception as exc:  # noqa: BLE001 - this seed's failure is its record, the batch goes on
                record(outcome.index, Record.failed(spec, f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=8)[-4000:], **fields))
                return
            record(outcome.index, Record.ok(spec, **result, **{**fields, "wall_time_s": time.perf_counter() - t0}))
            outcome.module.cpu()  # tested: its memory is no longer the batch's

        task.train_seed_batch(params, datamodule, modules, rules, finished)
    except Exception as exc:  # noqa: BLE001 - the whole batch failed: every seed without a record fails with it
        error = f"{type(exc).__name__}: {exc}"
        extra = {"retryable": True} if is_device_failure(exc) else {}
        for index, spec in enumerate(specs):
            if index not in records:
                record(index, Record.failed(spec, error, traceback=traceback.format_exc(limit=8)[-4000:], **extra,
                                            **measured(0, None, None, [])))
    return [records[i] for i in range(len(specs))]


def _compact(rows: list[dict[str, float]], max_epochs: int):
    """The record's history in the lone run's compact form (harness/run/callbacks.py History)."""
    from harness.run.callbacks import History

    history = History()
    history.epochs = rows
    history._max_epochs = max_epochs
    return history.compact()
