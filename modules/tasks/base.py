"""What a task is: a datamodule, a host LightningModule, its metrics and its training budget."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Mapping

import lightning as L
from annotated_types import Ge

from ..validation import validate_fields

from ..registry import Registry
from .stopping import MonitorRule, StoppingRule

ENTRY_POINT_GROUP = "attnbench.tasks"


@dataclass(frozen=True)
class Metric:
    name: str
    """As logged by the LightningModule, e.g. "test/acc"."""
    higher_is_better: bool = True


@dataclass(frozen=True)
class TrivialBaseline:
    """What a predictor that ignores its input scores on a task's test split(s): the floor a leaderboard row
    must clear before its numbers say anything (harness/report marks rows not significantly above it)."""

    predictor: str
    """In words, e.g. "majority class 1 of the train labels (68.4%)"."""
    metrics: Mapping[str, float | None]
    """Test metric name -> the predictor's value; None where the metric is undefined for it (`note` says why)."""
    test_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Metric name -> number of test examples, for the metrics that are a fraction of correct predictions
    (with one seed, such a value is tested against the baseline with an exact binomial test) and for
    correlations (MCC, Pearson, Spearman: with one seed, tested against 0 from n)."""
    note: str = ""


@dataclass(frozen=True)
class TrainParams:
    """Knobs every task has; tasks subclass this with their own (frozen) fields and paper defaults."""

    max_epochs: Annotated[int, Ge(1)] = 1000
    patience: Annotated[int, Ge(0)] = 100
    """Epochs without improvement before training stops, by the task's `stopping_rule` (the monitored
    validation metric unless the task says otherwise); the kept epoch's weights are restored."""


def resolve_kernel_lr_scale(params: TrainParams) -> None:
    """In a frozen params' __post_init__: a None `kernel_lr_scale` becomes KERNEL_LR / lr once lr is known."""
    from ..lit.optimization import kernel_lr_scale_for

    if params.kernel_lr_scale is None and params.lr is not None:
        object.__setattr__(params, "kernel_lr_scale", kernel_lr_scale_for(params.lr))
    if params.kernel_lr_scale is not None and not params.kernel_lr_scale > 0:
        raise ValueError(f"kernel_lr_scale must be > 0, got {params.kernel_lr_scale}")


class Task:
    """Subclass, set the class attributes, implement `build`, and decorate with @register_task."""

    Params: ClassVar[type[TrainParams]] = TrainParams
    version: ClassVar[str] = "1"
    """Bump when data processing, model or training change: it is part of every run key."""
    metrics: ClassVar[tuple[Metric, ...]] = ()
    """Reported test metrics, the primary (leaderboard-ranking) metric first."""
    monitor: ClassVar[Metric] = Metric("val/loss", higher_is_better=False)
    seed_batching: ClassVar[str | None] = "its host has no seed axis"
    """None when S seeds of one configuration can train as one seed-batched model (`train_seed_batch`);
    otherwise, in one line, why each seed runs alone (shown by `describe`)."""
    runs_per_gpu: ClassVar[int] = 1
    """How many of this task's runs (a seed batch counts as one) share one GPU by default: bench's workers per GPU
    are the fewest among a plan's tasks (harness/plan/machine.py workers_per_gpu_rule). Set it from a
    measurement of how busy one run keeps a GPU, and say which in a comment; 1, a GPU per run, where none was made."""

    def __init__(self, name: str, preset: Mapping[str, Any]):
        self.name = name
        self.preset = dict(preset)

    def stopping_rule(self, params: TrainParams) -> StoppingRule:
        """A fresh rule per trained model that decides, epoch by epoch, which weights to keep and when to stop.
        Default: Lightning's EarlyStopping semantics on `monitor`. Every trainer (the lone runner's callback,
        a seed-batched loop) asks the task for it, so that they all stop by the same decisions."""
        return MonitorRule(self.monitor.name, self.monitor.higher_is_better, params.patience)

    @property
    def primary(self) -> Metric:
        return self.metrics[0]

    def params(self, overrides: Mapping[str, Any] | None = None) -> TrainParams:
        """The task's Params with `overrides` checked against the fields' declared types and ranges
        (modules/validation.py): a bad value raises ConfigError before anything is built."""
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        overrides = validate_fields(self.Params, overrides, owner=f"task {self.name!r}", noun="parameter")
        return self.Params(**{**self.preset, **overrides})

    def data_problem(self, data_root: str | None, params: TrainParams | None = None) -> str | None:
        """None when the task's data can be loaded with these params (None = the defaults); otherwise what
        is missing and how to fix it. Checked before any run starts."""
        return None

    def check_data(self, data_root: str | None, params: TrainParams | None = None) -> str | None:
        """data_problem, also for plugin tasks written before it took `params`."""
        import inspect

        if "params" in inspect.signature(self.data_problem).parameters:
            return self.data_problem(data_root, params=params)
        return self.data_problem(data_root)

    def checkpoint_problem(self, params: TrainParams | None = None) -> str | None:
        """None when the pretrained weights these params start from can be loaded here; otherwise which, where
        they were looked for and how to fetch them. Kept apart from `data_problem`: a missing checkpoint says
        nothing about the data, so planning still lists the runs it blocks (a dry run shows them) and only a
        command that would train refuses them (harness/plan/planner.py, Plan.require_checkpoints)."""
        return None

    def build(self, params: TrainParams, attention: Mapping[str, Any], *, data_root: str | None, cache_dir: str | None) -> tuple[L.LightningDataModule, L.LightningModule]:
        raise NotImplementedError

    def train_seed_batch(self, params: TrainParams, datamodule: L.LightningDataModule, modules: list[L.LightningModule],
                         rules: list, on_finished) -> None:
        """Train `modules` (each built by `build` after seeding with its own seed) as one seed-batched model,
        stopping each by its rule; call `on_finished(outcome)` for each seed as it ends, its best weights loaded
        into its module (harness/run/seed_batch.py tests it). Only for tasks whose `seed_batching` is None."""
        raise NotImplementedError(f"task {self.name}: {self.seed_batching}")

    def trivial_baseline(self, params: TrainParams, data_root: str | None) -> TrivialBaseline | None:
        """The input-blind predictor's test scores, from the task's own data (train labels choose the prediction,
        test labels score it); None for a task that declares none. Deterministic: boards are built from it."""
        return None


@dataclass(frozen=True)
class TaskEntry:
    cls: type[Task]
    preset: Mapping[str, Any]

    def create(self, name: str) -> Task:
        return self.cls(name, self.preset)


TASKS: Registry[TaskEntry] = Registry("task", ENTRY_POINT_GROUP)


def register_task(name: str, **preset: Any):
    """Class decorator: register a Task subclass under `name` with some Params fixed (stackable)."""

    def decorator(cls: type[Task]) -> type[Task]:
        known = {f.name for f in dataclasses.fields(cls.Params)}
        if set(preset) - known:
            raise ValueError(f"task {name!r}: preset keys {sorted(set(preset) - known)} are not fields of {cls.Params.__name__}")
        TASKS.register(name, TaskEntry(cls, dict(preset)))
        return cls

    return decorator


def get_task(name: str) -> Task:
    return TASKS.get(name).create(name)


def list_tasks(pattern: str | None = None) -> list[str]:
    return TASKS.names(pattern)
