"""A suite, or one task x variant from the command line -> a `Plan`: the RunSpecs of a command, with each
task's data checked once and each variant's config resolved once. Every command builds one plan and hands
it on: `bench` to the executor and then to the leaderboard, `tune` to its studies, `run` to the runner."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from datamodules.paths import MissingDataError
from modules.tasks import Metric, TrivialBaseline, get_task

from harness.plan.spec import RunSpec, make_spec, resolve_attention
from harness.plan.suite import Suite, SuiteError
from harness.plan.tuned import DEFAULT_ROOT, budget_mismatch, load_tuned


@dataclass
class Plan:
    suite: Suite | None
    """None for a single run planned from the command line."""
    specs: list[RunSpec]
    skipped_tasks: dict[str, str]
    """Optional tasks left out because their data is absent -> why."""
    untuned: list[str] = field(default_factory=list)
    """With tuned parameters asked for: the task x variant pairs that have no tuned-parameters file."""
    missing_data: dict[str, str] = field(default_factory=dict)
    """Required tasks whose data is absent -> why; `require_data` stops a command that would run them."""
    metrics: dict[str, tuple[Metric, ...]] = field(default_factory=dict)
    """Each planned task's test metrics, the primary (ranking) one first."""
    tuned_budget: list[str] = field(default_factory=list)
    """With tuned parameters asked for: the pairs tuned with another epoch budget than the suite's, and why."""
    tuned_as_defaults: list[str] = field(default_factory=list)
    """With tuned parameters asked for: the pairs whose tuned parameters are their defaults (tuning kept them),
    planned once: a "(tuned)" row of the same runs would only add a row that counts twice in every comparison."""

    task_params: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each planned task's parameters as the plan was given them (before a tuned row's own)."""
    data_root: str | None = None
    table_tasks: dict[str, str | None] = field(default_factory=dict)
    """A board of records (harness/report/records_plan.py) names its tables after task and parameters: table ->
    the registered task, or None where its plugin is not loaded (no trivial baseline then). Empty: tables are tasks."""
    _baselines: dict[str, TrivialBaseline | None] = field(default_factory=dict, repr=False)
    _checkpoints: dict[str, str] | None = field(default=None, repr=False)

    def trivial_baseline(self, task: str) -> TrivialBaseline | None:
        """The task's input-blind baseline (Task.trivial_baseline) from the data this plan checked, computed on
        first use and kept: only the leaderboard asks, so running a suite never pays for it. Values are
        rounded to 6 significant digits so that float32 noise cannot reach a board."""
        if task not in self._baselines and self.table_tasks.get(task, task) is None:
            self._baselines[task] = None
        if task not in self._baselines:
            task_def = get_task(self.table_tasks.get(task, task))
            found = task_def.trivial_baseline(task_def.params(self.task_params.get(task)), self.data_root)
            if found is not None:
                found = dataclasses.replace(found, metrics={k: (float(f"{v:.6g}") if v is not None else None) for k, v in found.metrics.items()})
            self._baselines[task] = found
        return self._baselines[task]

    def require_data(self) -> None:
        if self.missing_data:
            raise MissingDataError("\n".join(self.missing_data.values()))

    def missing_checkpoints(self) -> dict[str, str]:
        """Run key -> why the pretrained weights the run starts from cannot be loaded here (Task.checkpoint_problem):
        not missing data, so the runs stay planned; a dry run marks them and a command that trains refuses them
        (`require_checkpoints`). Checked on first use, once per task and parameters: boards never ask, so
        rendering one looks nothing up on the Hub."""
        if self._checkpoints is None:
            problems: dict[str, str | None] = {}
            self._checkpoints = {}
            for spec in self.specs:
                which = (spec.task, json.dumps(dict(spec.params), sort_keys=True, default=str))
                if which not in problems:
                    task_def = get_task(spec.task)
                    problems[which] = task_def.checkpoint_problem(task_def.params(spec.params))
                if problems[which]:
                    self._checkpoints[spec.key] = problems[which]
        return self._checkpoints

    def checkpoint_report(self, keys: Iterable[str] | None = None) -> str | None:
        """Why runs (these `keys`, default all) cannot start for want of a checkpoint, one line per problem with
        the tasks it blocks; None when nothing is missing."""
        missing = self.missing_checkpoints()
        task_of = {spec.key: spec.task for spec in self.specs}
        tasks_by_problem: dict[str, dict[str, None]] = {}
        for key in missing if keys is None else keys:
            if key in missing:
                tasks_by_problem.setdefault(missing[key], {})[task_of[key]] = None
        return "\n".join(f"{', '.join(tasks)}: {problem}" for problem, tasks in tasks_by_problem.items()) or None

    def require_checkpoints(self, keys: Iterable[str] | None = None) -> None:
        """Refuses, before anything runs or is recorded, runs (these `keys`, default all) whose checkpoint cannot
        be loaded; finished runs left out of `keys` need none."""
        report = self.checkpoint_report(keys)
        if report:
            raise MissingCheckpointError(report)


class MissingCheckpointError(ValueError):
    """A run's pretrained checkpoint (a text backbone, a vision-language task's timm encoder weights) is neither
    cached nor reachable; the message names the model, the cache looked in and how to fetch it. A ValueError: the
    CLI reports it and exits 2."""


def _check_tasks(tasks: Mapping[str, tuple[Mapping[str, Any], bool]], data_root: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """task -> (params, optional): the one data check of each task; returns (skipped optional, missing required)."""
    skipped, missing = {}, {}
    for name, (params, optional) in tasks.items():
        task_def = get_task(name)
        problem = task_def.check_data(data_root, task_def.params(params))
        if problem:
            (skipped if optional else missing)[name] = problem
    return skipped, missing


COMMITTED_PARAMS = Path(__file__).resolve().parents[2] / DEFAULT_ROOT
"""leaderboards/params of this checkout, whatever the working directory: a suite's `tuned` rows are the committed ones."""


def plan(suite: Suite, data_root: str | None = None, variant_filter: str | None = None, tuned_dir: str | Path | None = None,
         precision: str = "32") -> Plan:
    """Every (task, variant, seed) of the suite as RunSpecs; optional tasks without data are skipped.
    With `tuned_dir`, each variant that `attnbench tune` has tuned on a task also runs with its tuned
    parameters, on the same seeds, as its own "<label> (tuned)" row."""
    task_params = {task.name: {**suite.params, **task.params} for task in suite.tasks}
    skipped, missing = _check_tasks({t.name: (task_params[t.name], t.optional) for t in suite.tasks}, data_root)
    patterns = [pattern.strip() for pattern in variant_filter.split(",")] if variant_filter else None

    def selects(row: str, base: str | None = None) -> bool:
        # a row is selected by its board label; a "(tuned)" row also by its variant's (so 'bam-*' keeps both rows
        # and 'bam-weibull (tuned)' picks only the tuned one, as re-running a board's row needs)
        return patterns is None or any(fnmatch.fnmatch(row, p) or (base is not None and fnmatch.fnmatch(base, p)) for p in patterns)

    variants = [v for v in suite.variants if selects(v.label or v.name)
                or (v.name in suite.tuned or tuned_dir is not None) and selects(f"{v.label or v.name} (tuned)")]
    specs: list[RunSpec] = []
    untuned: list[str] = []
    tuned_as_defaults: list[str] = []
    tuned_budget: list[str] = []
    metrics = {}
    for task in suite.tasks:
        if task.name in skipped:
            continue
        params = task_params[task.name]
        metrics[task.name] = tuple(get_task(task.name).metrics)
        for variant in variants:
            where = f"suite {suite.name}: task {task.name}, variant {variant.label or variant.name}"
            attention = variant.resolved or {"name": variant.name, **variant.config}
            default_specs = []
            for seed in suite.seeds_of(task):
                try:
                    spec = make_spec(task.name, attention, seed, params, label=variant.label, extra={"suite": suite.name},
                                     precision=precision)
                except (ValueError, TypeError) as exc:
                    raise SuiteError(f"{where}: {exc}") from exc
                default_specs.append(spec)
            if selects(variant.label or variant.name):
                specs += default_specs
            # a variant the suite lists as `tuned` reads the committed parameters unless another folder is given
            root = tuned_dir if tuned_dir is not None else (COMMITTED_PARAMS if variant.name in suite.tuned and not variant.label else None)
            if root is None:
                continue
            tuned = load_tuned(task.name, variant.name, root)
            if tuned is None:
                if _has_knobs(variant.name):  # `tune` refuses a variant without knobs: no hint may send it there
                    untuned.append(f"{task.name} x {variant.label or variant.name}")
                continue
            mismatch = budget_mismatch(tuned, params_of_task(task.name, params))
            if mismatch:
                tuned_budget.append(f"{task.name} x {variant.label or variant.name}: {mismatch}")
            tuned_attention = resolve_attention({**variant.config, **tuned["attention"], "name": variant.name})
            tuned_specs = [make_spec(
                task.name,
                tuned_attention,
                seed,
                {**params, **(tuned.get("params") or {})},
                label=f"{variant.label or variant.name} (tuned)",
                extra={"suite": suite.name, "tuning": tuned.get("tuning", {})},
                precision=precision,
            ) for seed in suite.seeds_of(task)]
            if tuned_specs[-1].key == default_specs[-1].key:  # the same seed's run: same config, parameters and versions
                tuned_as_defaults.append(f"{task.name} x {variant.label or variant.name}")
                continue
            if selects(f"{variant.label or variant.name} (tuned)", variant.label or variant.name):
                specs += tuned_specs
    return Plan(suite, specs, skipped, untuned, missing, metrics, tuned_as_defaults=tuned_as_defaults, tuned_budget=tuned_budget, task_params={t: p for t, p in task_params.items() if t in metrics},
                data_root=data_root)


def _has_knobs(variant: str) -> bool:
    from modules.attention.registry import search_space_options

    return bool(search_space_options(variant))


def params_of_task(task: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A task's full parameters, defaults filled in (what a run of `params` trains with)."""
    return dataclasses.asdict(get_task(task).params(params))


def plan_runs(jobs: list[tuple[str, str | Mapping[str, Any], int, Mapping[str, Any]]], data_root: str | None,
              extra: Mapping[str, Any] | None = None, precision: str = "32") -> Plan:
    """(task, attention, seed, params) jobs from the command line (`run`, `tune`): names and defaults are
    resolved and each task's data is checked, once; a missing dataset is in `missing_data`."""
    specs = [make_spec(task, attention, seed, params, extra=extra, precision=precision) for task, attention, seed, params in jobs]
    first_params = {}
    for task, _, _, params in jobs:
        first_params.setdefault(task, (params, False))
    _, missing = _check_tasks(first_params, data_root)
    return Plan(None, specs, {}, missing_data=missing, metrics={task: tuple(get_task(task).metrics) for task in first_params},
                task_params={task: params for task, (params, _) in first_params.items()}, data_root=data_root)


def configuration(spec: RunSpec) -> str:
    """What the seeds of one seed batch share: everything in the key but the seed."""
    return json.dumps([spec.task, spec.task_version, spec.variant, spec.variant_version, spec.precision,
                       dict(spec.attention), dict(spec.params)], sort_keys=True, default=str)


def seed_batch_problem(spec: RunSpec) -> str | None:
    """None when this spec's seeds can train as one seed-batched model; otherwise why each runs alone."""
    task = get_task(spec.task)
    if task.seed_batching is not None:
        return task.seed_batching
    if spec.precision != "32":
        return f"precision {spec.precision}: the seed-batched loop runs fp32 only"
    return None


def seed_batches(specs: list[RunSpec], workers: int = 1, enabled: bool = True) -> list[list[RunSpec]]:
    """The work items of a command: the seeds of each configuration whose task batches seeds, as one item, or
    split into as many near-equal items as it takes to give every worker one when there are fewer
    configurations than workers; every other spec alone. Order: first appearance in `specs`."""
    groups: dict[str, list[RunSpec]] = {}
    items: list[list[RunSpec]] = []
    for spec in specs:
        if not enabled or seed_batch_problem(spec) is not None:
            items.append([spec])
            continue
        key = configuration(spec)
        if key not in groups:
            groups[key] = []
            items.append(groups[key])
        groups[key].append(spec)
    batched = [item for item in items if any(item is g for g in groups.values())]
    parts = max(1, -(-workers // len(batched))) if batched else 1
    out: list[list[RunSpec]] = []
    for item in items:
        if parts > 1 and any(item is g for g in groups.values()):
            size = -(-len(item) // min(parts, len(item)))
            out.extend(item[i:i + size] for i in range(0, len(item), size))
        else:
            out.append(item)
    return out
