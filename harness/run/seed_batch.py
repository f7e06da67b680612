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
from modules.lit.node_classification_seed_batch import Checkpointing, checkpointing

from harness.run.progress import batch_progress, resume_line, say
from harness.run.runner import LOGGER_ENV, PeakMemory, is_device_failure, quiet_lightning, release_device_memory, run_context, test_outcome


class _Progress:
    """One line per epoch once every seed that trained in it has reported: the seeds still training after it, each
    seed's best monitored value so far, the time per epoch and an upper bound on the time left (every seed running
    to max_epochs at the current speed; early stopping and a shrinking batch only make it shorter).

    A resumed batch counts from the epoch its checkpoint held (`start_epoch`): its first line is that epoch + 1, and
    the time per epoch, hence the time left, is measured over the epochs this process trained. With `every_s` the
    lines are at most that many seconds apart (the last, "done", always comes), and name the batch (bench's
    workers print several batches' lines into one log)."""

    def __init__(self, specs: Sequence[RunSpec], monitor, max_epochs: int, out: Callable[[str], None], start_epoch: int = 0,
                 every_s: float = 0.0):
        self.seeds = [s.seed for s in specs]
        self.monitor, self.max_epochs, self.out = monitor, max_epochs, out
        self.training = set(range(len(specs)))
        self.reported: set[int] = set()
        self.gone: set[int] = set()  # stopped by their rule, diverged or failed in this epoch
        self.best: dict[int, float] = {}
        self.start_epoch = self.epochs = start_epoch
        self.t0 = self.last_line = time.perf_counter()
        self.every_s = every_s
        self.label = f"{specs[0].task} x {specs[0].display} seeds {','.join(map(str, self.seeds))} " if every_s else ""

    def rule(self, index: int, rule):
        progress = self

        class Observed:
            def __getattr__(self, name):
                return getattr(rule, name)

            def update(self, metrics):
                decision = rule.update(metrics)
                progress.updated(index, metrics, decision.stop)
                return decision

        return Observed()

    def updated(self, index: int, metrics, stop: bool) -> None:
        value = metrics.get(self.monitor.name)
        if value is not None and value == value:  # NaN never counts as a best
            old = self.best.get(index)
            better = old is None or (value > old if self.monitor.higher_is_better else value < old)
            self.best[index] = float(value) if better else old
        self.reported.add(index)
        if stop or self.epochs + 1 >= self.max_epochs:
            self.gone.add(index)
        self._maybe_print()

    def finished(self, index: int) -> None:
        self.gone.add(index)
        self._maybe_print()

    def _maybe_print(self) -> None:
        if not self.training or not self.training <= self.reported | self.gone:
            return
        from harness.timing import format_duration

        self.epochs += 1
        self.training -= self.gone
        self.reported, self.gone = set(), set()
        now = time.perf_counter()
        if self.training and now - self.last_line < self.every_s:
            return
        self.last_line = now
        per_epoch = (now - self.t0) / (self.epochs - self.start_epoch)
        left = f"at most {format_duration(per_epoch * (self.max_epochs - self.epochs))} left" if self.training else "done"
        bests = " ".join(f"{self.seeds[i]}:{self.best[i]:.4f}" for i in sorted(self.best))
        self.out(f"attnbench: seed batch {self.label}epoch {self.epochs}/{self.max_epochs}: {len(self.training)} of {len(self.seeds)} seeds "
                 f"still training; best {self.monitor.name} by seed {bests or '-'}; {format_duration(per_epoch)}/epoch, {left}")


def seed_batch_problem(spec: RunSpec) -> str | None:
    """None when this spec's seeds can train as one batch in this process; otherwise why each runs alone."""
    if os.environ.get(LOGGER_ENV):
        return "--logger: per-epoch curves are written by Lightning's loggers, which only lone runs have"
    return planned_problem(spec)


def execute_batch(specs: Sequence[RunSpec], *, data_root: str | None = None, cache_dir: str | None = None,
                  commit: str | None = None, on_record: Callable[[Record], None],
                  execution: Mapping[str, Any] | None = None, checkpoints=None) -> list[Record]:
    """Run specs that differ only in their seed as one batch; `on_record` gets each seed's record as it ends
    (write it there). Never raises for a failing seed: failures are data, and a failure of the whole batch
    (an out-of-memory error) fails every seed not yet recorded.

    With `checkpoints` (harness/results/checkpoints.py Checkpoints), the batch saves every still-training seed's state at
    their interval to `batch-<digest of these keys>.pt`, and first resumes from the newest trusted batch checkpoint
    that holds every one of these seeds still training (one of an earlier, larger batch of them included: the seeds
    that finished since have records, and a CPU seed trains as its lone run whoever shares its batch). Each record's
    `execution` then says from which epoch; the batch's checkpoint is removed once every seed has its record."""
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
            # time_per_epoch_s and fit_time_s are this seed's share of the batch's epochs (docs/design/seed-batching.md);
            # peak_memory_mb is the whole batch's.
            execution={**execution, "batch_epoch_s": sum(batch_epoch_s) / len(batch_epoch_s) if batch_epoch_s else None},
            **context,
        )

    def record(index: int, rec: Record) -> None:
        records[index] = rec
        on_record(rec)

    saving, _, resumed = _checkpointing(specs, checkpoints, context["commit"])
    if resumed is not None:
        execution = {**execution, "resumed_from_epoch": resumed["epoch"], "resumes": resumed["resumes"]}

    try:
        modules, datamodule = [], None
        for spec in specs:
            # Exactly as a lone run (runner._prepare): seed, then build, so the initial parameters are its own.
            L.seed_everything(spec.seed, workers=True, verbose=False)
            dm, module = task.build(params, spec.attention, data_root=data_root, cache_dir=cache_dir)
            datamodule = datamodule or dm
            modules.append(module.to(device))
        rules = [task.stopping_rule(params) for _ in specs]  # each seed's own, the one its lone run stops by
        out = batch_progress()
        progress = _Progress(specs, task.monitor, params.max_epochs, out[0], start_epoch=resumed["epoch"] if resumed else 0,
                             every_s=out[1]) if out else None
        if progress:
            rules = [progress.rule(index, rule) for index, rule in enumerate(rules)]

        def finished(outcome) -> None:
            if progress:
                progress.finished(outcome.index)
            spec = specs[outcome.index]
            history = _compact(outcome.history)
            fields = {**measured(outcome.epochs, outcome.fit_time_s, history, outcome.batch_epoch_s),
                      **fit_in_this_process(resumed, outcome.index, outcome.fit_time_s)}
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
            # the mechanism diagnostics' last train and validation values beside the test pass's test/attn/*
            from harness.run.callbacks import final_diagnostics

            result["diagnostics"] = {**final_diagnostics(outcome.history), **result["diagnostics"]}
            record(outcome.index, Record.ok(spec, **result, **{**fields, "wall_time_s": time.perf_counter() - t0}))
            outcome.module.cpu()  # tested: its memory is no longer the batch's

        if resumed is not None:
            from harness.run.callbacks import set_global_rng_state

            set_global_rng_state(resumed["rng"])  # where the killed batch's stood; its loop restores the rest
        token = checkpointing.set(saving)
        try:
            task.train_seed_batch(params, datamodule, modules, rules, finished)
        finally:
            checkpointing.reset(token)
    except Exception as exc:  # noqa: BLE001 - the whole batch failed: every seed without a record fails with it
        error = f"{type(exc).__name__}: {exc}"
        extra = {"retryable": True} if is_device_failure(exc) else {}
        for index, spec in enumerate(specs):
            if index not in records:
                record(index, Record.failed(spec, error, traceback=traceback.format_exc(limit=8)[-4000:], **extra,
                                            **measured(0, None, None, [])))
    if checkpoints is not None and not any(r.retryable for r in records.values()):
        # every seed has its record: nothing resumes from this batch's checkpoint, nor from any other holding some of
        # these seeds once all of that one's seeds are recorded (another batch may still be resuming its other seeds).
        # Not only the one it resumed from: a batch killed as its seeds stopped leaves a chain (6 seeds, then the 4
        # left resumed from it and saved their own, then 3 from that), and the older links would outlive every record.
        from harness.results.store import RecordStore

        checkpoints.remove_batch(checkpoints.batch_path([s.key for s in specs]))
        checkpoints.remove_finished_batches([s.key for s in specs], RecordStore(checkpoints.root.parent).finished)
    return [records[i] for i in range(len(specs))]


def _checkpointing(specs: Sequence[RunSpec], checkpoints, commit: str | None):
    """The loop's Checkpointing (None when off), the checkpoint it resumes from and that checkpoint's
    {"epoch", "resumes", "rng", "seeds": {index: state}} (None when it starts afresh)."""
    if checkpoints is None or checkpoints.off:
        return None, None, None
    from harness.results import checkpoints as cp
    from harness.run.callbacks import global_rng_state

    keys = [s.key for s in specs]
    resumed_path = resumed = None
    for path in checkpoints.batch_covering(keys):
        payload = cp.load_trusted(path, keys=keys, commit=commit, kind="seed_batch")
        if payload is not None:
            meta = payload["attnbench"]
            resumed_path = path
            resumed = {"epoch": int(meta["epoch"]), "resumes": int(meta["resumes"]) + 1, "rng": payload["rng"],
                       "seeds": {index: payload["seeds"][key] for index, key in enumerate(keys)}}
            say(resume_line(specs, resumed["epoch"], path))
            break
    target = checkpoints.batch_path(keys)
    checkpoints.announce_batch(keys)
    resumes = resumed["resumes"] if resumed else 0

    def save(state: dict) -> None:
        active = [keys[index] for index in state["seeds"]]
        cp.save_atomically({"attnbench": cp.metadata("seed_batch", keys, commit, state["epoch"], resumes, active),
                            "rng": global_rng_state(),
                            "seeds": {keys[index]: seed for index, seed in state["seeds"].items()}}, target)

    return Checkpointing(due=checkpoints.interval.due, save=save, resume=resumed), resumed_path, resumed


def fit_in_this_process(resumed: Mapping[str, Any] | None, index: int, fit_time_s: float | None) -> dict[str, float]:
    """{"fit_time_this_process_s": ...} for a seed resumed from a checkpoint: its `fit_time_s` counts the whole fit,
    the epochs its checkpoint held included, while `wall_time_s` is this process's; {} for a fit that all ran here."""
    if resumed is None or fit_time_s is None:
        return {}
    return {"fit_time_this_process_s": fit_time_s - float(resumed["seeds"][index]["fit_time_s"])}


def _compact(rows: list[dict[str, float]]):
    """The record's history in the lone run's compact form (harness/run/callbacks.py History)."""
    from harness.run.callbacks import History

    history = History()
    history.epochs = rows
    return history.compact()
