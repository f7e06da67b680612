"""The plan of a board drawn from a runs folder's records instead of a suite (`attnbench leaderboard --runs-dir
DIR` without --suite): one's own `run`s, a tuning store, a colleague's exported results.

Every record carries the RunSpec it ran (`Record.spec`), so the board needs neither the suite nor the plugin
that defined a variant: names, configs and seeds come from the records. Runs of one task with different
parameters (say max_epochs=5 and 200) are different experiments, so each parameter set gets its own table,
named after the task and the parameters that differ; within a table, runs of one variant name with different
configs (entmax at two α) get rows named after the options that differ."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

from harness.plan.planner import Plan
from harness.plan.spec import RunSpec
from harness.plan.suite import Suite, TaskEntry
from harness.results.store import RecordStore


@dataclass(frozen=True)
class RecordedSpec(RunSpec):
    """A record's spec placed in a table of the records board: its key is the record's own (the key of its
    spec as the code that ran it computed it, which a later version of the code need not reproduce)."""

    recorded_key: str = ""

    @property
    def key(self) -> str:
        return self.recorded_key


def _canonical(values: Mapping[str, Any]) -> str:
    return json.dumps(dict(values), sort_keys=True, default=str)


def _differing(value_sets: list[Mapping[str, Any]]) -> list[str]:
    """The keys whose values are not the same in every one of `value_sets`."""
    keys = sorted({k for values in value_sets for k in values})
    return [k for k in keys if len({_canonical({k: values.get(k)}) for values in value_sets}) > 1]


def _named(base: str, values: Mapping[str, Any], differing: list[str]) -> str:
    return f"{base} ({', '.join(f'{k}={values.get(k)}' for k in differing)})" if differing else base


def _metrics_of(task: str, records: list) -> tuple:
    """The task's declared metrics, primary first; for a task whose plugin is not loaded, the metrics as its
    records list them (in the order the task logged them, so its primary comes first there too)."""
    from modules.tasks import Metric, get_task, list_tasks

    if task in list_tasks():
        return tuple(get_task(task).metrics)
    names: dict[str, bool] = {}
    for record in records:
        for name, entry in (record.metrics or {}).items():
            names.setdefault(name, bool(entry.get("higher_is_better", True)))
    return tuple(Metric(name, higher) for name, higher in names.items())


def plan_from_records(store: RecordStore, name: str, data_root: str | None = None) -> tuple[Plan, dict[str, str]]:
    """(the plan of every record in `store`, unreadable record files -> why). Conflicting copies are left to
    the board, which shows them as it does on a suite's board."""
    from modules.tasks import list_tasks

    loaded = store.load(sorted(path.stem for path in store.root.glob("*.json")))
    unreadable = dict(loaded.unreadable)
    by_task: dict[str, list[tuple[RunSpec, Any]]] = defaultdict(list)
    for key, record in sorted(loaded.records.items()):
        if not record.spec:
            unreadable[key] = f"records/{key}.json: the record has no spec, so it cannot be placed in a table"
            continue
        by_task[record.spec["task"]].append((RunSpec.from_dict(record.spec), record))

    specs, metrics, table_tasks, task_params = [], {}, {}, {}
    for task in sorted(by_task):
        param_sets = {_canonical(spec.params): spec.params for spec, _ in by_task[task]}
        param_keys = _differing(list(param_sets.values()))
        for params_id, params in sorted(param_sets.items()):
            table = _named(task, params, param_keys)
            entries = [(spec, record) for spec, record in by_task[task] if _canonical(spec.params) == params_id]
            configs: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
            for spec, _ in entries:
                configs[spec.display][_canonical(spec.attention)] = spec.attention
            for spec, record in entries:
                label = _named(spec.display, spec.attention, _differing(list(configs[spec.display].values())))
                specs.append(RecordedSpec(**{**spec.__dict__, "task": table, "label": label}, recorded_key=record.key))
            metrics[table] = _metrics_of(task, [record for _, record in entries])
            table_tasks[table] = task
            task_params[table] = params
    registered = set(list_tasks())
    suite = Suite(name=name, path=store.root.parent, description=f"Every record in {store.root.parent.name}/: one table per task and parameter set.",
                  tasks=tuple(TaskEntry(table) for table in metrics), variants=(), seeds=tuple(sorted({s.seed for s in specs})), params={})
    return Plan(suite, specs, {}, metrics=metrics, task_params=task_params, data_root=data_root,
                table_tasks={table: task if task in registered else None for table, task in table_tasks.items()}), unreadable
