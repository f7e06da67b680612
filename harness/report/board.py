"""Plan + Records -> the leaderboard "board": per task, per variant, statistics over seeds.

The board is a typed, immutable model built once by `build_board` (Board > Group > Table > Row > MetricCell, with
MetricSpec, Cost, Chance, Resolution, TableFinding, OverallRow and GroupFinding: frozen dataclasses, as
harness/results/record.py is for records), from which the Markdown, CSV and HTML leaderboards are rendered, so that
every rendering shows the same numbers. Each part also reads like the dict boards were (`table["rows"]`), and
`json.dumps(board, default=dict)` writes it; `as_board` reads that dict form back. Parts still plain dicts: a
table's trivial baseline, tuning, epoch-cap counts, mechanism and entropy tables; the board's reproducibility, run
time, hardware classes, row settings, problems and CSV rows; a row's learning curves. This module
holds the numbers and marks only; what the boards say about them (findings, warnings, the legend) is
harness/report/sentences.py, read by both renderers.
Everything in it is in a deterministic order (no clock, no set order, ties broken by name): the same
records always give the same board.

One ranking across executions (docs/design/identity-and-execution.md). A run key is the experiment, so
quality (metrics, Δ, tests, ranks, ▲ / ▼, resolution) uses every finished record of the suite whatever machine
made it. Cost (time per epoch, total time, peak memory, GPU-hours) depends on the machine, so it is computed per
*hardware class*, the record's hardware label (device, its count, and for CPUs the threads per run: threads
change what a CPU run costs as much as a device does), with records trained in seed batches a class of their own
(`cost_class`: a batch's time per seed is not a lone run's), and never mixed across classes: a row has one cost per
class (`cost_by_class`), and `cost` is that cost only on a board with a single class. A key recorded by several
executions (another machine's copy, kept by RecordStore.import_record) counts once, as the copy the store chose
(`chosen_execution`: the earliest finished); the board's `reproducibility` says how far the copies agree.

Statistics (stats.py), per (task, variant, metric): mean, std and confidence interval over
seeds; against the `softmax` row of the same table a paired t-test, Holm-corrected across the variants of
the table. A cell is marked "better" or "worse" only when its Holm-adjusted p is below `ALPHA`.
Metric names and their order (the primary first) come from the plan; whether higher is better from the
records, which store it with every value.
Ranks never order rows the table cannot tell apart: the table's only tests are each row against `softmax`,
so a row's rank is its tier among them, ▲ rows (significantly better on the primary metric) first, then the
rows not significantly different from softmax (softmax with them), then the ▼ rows, with competition ranking
(rows of a tier share its rank, and the next tier's rank is 1 + the rows above it: 1, 1, 3, 3, 3, 6). Within
a tier rows are listed by mean, which the rank does not claim. A row with fewer than `MIN_SEEDS_TO_RANK`
finished seeds is shown but neither ranked nor marked. Each table opens with its finding (sentences.py
`finding_sentence`), built from the same marks (`_finding`); confidence intervals are clipped to what the metric
can take (stats.metric_range).

What a table can conclude: each task's trivial baseline (Task.trivial_baseline, an input-blind predictor
scored on the same test data) is shown, and a row whose primary metric is not significantly better than it
(one-sided, `above_chance_p`, Holm-corrected across the table's rows as the Δ tests are) is marked at chance. Each table states its resolution: the smallest paired
difference from `softmax` its seeds detect with 80% power, from the paired spread it observed.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

if TYPE_CHECKING:  # the boards read a plan as data (a snapshot's too) and never import the planner, nor torch
    from harness.plan.planner import Plan

from harness.results.record import Record, Status
from datamodules.paths import MissingDataError
from harness.report.stats import (ALPHA, BASELINE, CONFIDENCE, MIN_SEEDS_TO_RANK, POWER, above_chance_p, clip_interval,
                                  correlation_above_zero_p, detectable_difference, holm, metric_kind, metric_range, paired_p, summarize)

UNKNOWN_HARDWARE = "unknown"
MISSING = "missing"
"""A planned run without a record, counted next to the record statuses."""
UNREADABLE = "unreadable"
"""A planned run whose record file exists but does not load (truncated or corrupt JSON): counted apart from
missing, because its run did happen and its file needs repair or a re-run, not a first run."""
CONFLICT = "conflict"
"""A planned run with two different records (an import met a different one under its key): the board shows the
record the store had first and counts the run here until the wrong copy is deleted."""
NO_RECORDS = "no records yet"
"""The one group's label when nothing has run: the planned rows are still shown, all missing."""


class _Model(Mapping):
    """The shared shape of the board's typed parts (Board, Group, Table, Row): a frozen dataclass read by attribute
    (`table.rows`), which also reads like the dict boards were before (`table["rows"]`, `row.get("history")`), so
    that callers outside the renderers keep working. A field named in `_OPTIONAL` is absent from that mapping view
    when it is None (boards leave such keys out rather than write null). `from_dict` builds one from that dict form
    (a board written as JSON, a test's hand-made board), a missing field taking its default."""

    _OPTIONAL: frozenset[str] = frozenset()
    _NESTED: dict[str, Any] = {}
    """Fields holding a sequence of models, kept as a tuple."""
    _NESTED_LISTS: dict[str, Any] = {}
    """Fields holding a list of models, kept a list (it compares equal to the list of dicts it was)."""
    _NESTED_MAPS: dict[str, Any] = {}
    """Fields holding a name -> model mapping."""
    _NESTED_ONE: dict[str, Any] = {}
    """Fields holding one model (or None)."""

    def __getitem__(self, name: str) -> Any:
        if name not in self._names() or (name in self._OPTIONAL and getattr(self, name) is None):
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return (name for name in self._names() if not (name in self._OPTIONAL and getattr(self, name) is None))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        if isinstance(data, cls):
            return data
        values = {name: data[name] for name in cls._names() if name in data}
        for name, kind in cls._NESTED.items():
            if values.get(name) is not None:
                values[name] = tuple(kind.from_dict(part) for part in values[name])
        for name, kind in cls._NESTED_LISTS.items():
            if values.get(name) is not None:
                values[name] = [kind.from_dict(part) for part in values[name]]
        for name, kind in cls._NESTED_ONE.items():
            if values.get(name) is not None:
                values[name] = kind.from_dict(values[name])
        for name, kind in cls._NESTED_MAPS.items():
            if values.get(name) is not None:
                values[name] = {key: kind.from_dict(part) for key, part in values[name].items()}
        return cls(**values)

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, eq=False)
class MetricSpec(_Model):
    """One metric of a table: its name, whether higher is better (as its records say), and whether it is shown in
    percent. A table's first is its primary metric, the one it is ranked by."""

    name: str = ""
    higher_is_better: bool = True
    percent: bool = False


@dataclass(frozen=True, eq=False)
class Cost(_Model):
    """What a row's runs cost on one hardware class (means over its finished runs; GPU-hours over all of them);
    `runs` counts its runs on that class, and is None for the cost shown in a board's table of one class."""

    epochs: float | None = None
    time_per_epoch_s: float | None = None
    total_time_s: float | None = None
    gpu_hours: float | None = None
    peak_memory_mb: float | None = None
    parameters: int | None = None
    attention_paths: list[str] = dataclasses.field(default_factory=list)
    runs: int | None = None

    _OPTIONAL = frozenset({"runs"})


@dataclass(frozen=True, eq=False)
class Chance(_Model):
    """A row's one-sided test against the task's trivial baseline: its p, the test's name, its p Holm-corrected over
    the table's rows (None where a hand-made board left it out), and whether that leaves it at chance."""

    p: float = 1.0
    test: str = ""
    at_chance: bool = True
    p_holm: float | None = None

    _OPTIONAL = frozenset({"p_holm"})

    @property
    def decisive_p(self) -> float:
        """The p that decides `at_chance`: the corrected one, the row's own where none was stored."""
        return self.p_holm if self.p_holm is not None else self.p


@dataclass(frozen=True, eq=False)
class Resolution(_Model):
    """What a table resolves: the difference from the baseline its median paired spread and seed count detect with
    the board's power (`difference`, None without a spread), and the rows that vary more than the rest (`wider`:
    {"label", "spread", "difference"} each)."""

    pairs: int = 0
    spread: float | None = None
    variants: int = 0
    difference: float | None = None
    wider: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True, eq=False)
class TableFinding(_Model):
    """What a table's tests found, for the sentence it opens with: per metric the rows marked better and worse
    (`marks`: {"metric", "better", "worse"} each, the primary first), how many rows were tested, the rows left
    untested, and the rows at chance of those tested against the trivial baseline."""

    baseline: str | None = None
    tested: int = 0
    untested: list[str] = dataclasses.field(default_factory=list)
    marks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    at_chance: list[str] = dataclasses.field(default_factory=list)
    chance_tested: int = 0


@dataclass(frozen=True, eq=False)
class GroupFinding(_Model):
    """The board's opening finding: per variant the tasks whose primary metric is marked better / worse, and the
    tasks that tested anything."""

    baseline: str = BASELINE
    tasks: int = 0
    tested_tasks: list[str] = dataclasses.field(default_factory=list)
    better: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    worse: dict[str, list[str]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class MetricCell(_Model):
    """One row's values of one metric over its finished seeds: the values and their seeds, their summary
    (stats.summarize, the interval clipped to the metric's range), and the comparison with the table's baseline
    (None for the baseline itself and for a row not compared). Compares equal to the dict it reads as."""

    values: list[float] = dataclasses.field(default_factory=list)
    seeds: list[int] = dataclasses.field(default_factory=list)
    n: int = 0
    mean: float | None = None
    std: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_clipped: bool = False
    vs_baseline: Comparison | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricCell:
        cell = super().from_dict(data)
        versus = cell.vs_baseline
        if versus is None or isinstance(versus, Comparison):
            return cell
        # a hand-made board's comparison, as the dict boards stored before Comparison (its spread may be left out)
        return cell.replace(vs_baseline=Comparison(diff=versus["diff"], spread=versus.get("spread"), n_pairs=versus["n_pairs"],
                                                   p=versus["p"], p_holm=versus.get("p_holm"), mark=versus.get("mark")))

    @property
    def mark(self) -> str | None:
        """"better" / "worse" / None: this cell's mark against the baseline."""
        return self.vs_baseline.mark if self.vs_baseline is not None else None


@dataclass(frozen=True, eq=False)
class OverallRow(_Model):
    """One variant over every table of a group: its mean rank over the tasks where it has a ranked row, how many
    tasks that is, and on how many tasks its primary metric is marked better / worse."""

    variant: str = ""
    mean_rank: float | None = None
    tasks_covered: int = 0
    tasks_total: int = 0
    better: int = 0
    worse: int = 0


@dataclass(frozen=True, eq=True)
class Row(_Model):
    """One labelled row of a task's table: its seeds' counts, per metric its summary (a dict: values, seeds, mean,
    std, ci_low, ci_high, ci_clipped, vs_baseline: a Comparison or None), its rank, its cost."""

    variant: str = ""
    rank: int | None = None
    planned: int = 0
    n: int = 0
    failed: int = 0
    pruned: int = 0
    missing: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    metrics: dict[str, MetricCell] = dataclasses.field(default_factory=dict)
    cost: Cost | None = None
    cost_by_class: dict[str, Cost] = dataclasses.field(default_factory=dict)
    history: dict[str, list] | None = None
    """The seeds' mean learning curves; None (absent) when no record has one."""
    chance: Chance | None = None
    """The test against the task's trivial baseline: {"p", "test", "at_chance", "p_holm"}; None when not tested."""

    _OPTIONAL = frozenset({"history"})
    _NESTED_MAPS = {"metrics": MetricCell, "cost_by_class": Cost}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Row:
        row = super().from_dict(data)
        return row.replace(cost=None if row.cost is None else Cost.from_dict(row.cost),
                           chance=None if row.chance is None else Chance.from_dict(row.chance))


@dataclass(frozen=True, eq=True)
class Table(_Model):
    """One task's table: its metrics (the primary first), its rows in rank order, and what the table found."""

    task: str = ""
    versions: dict[str, Any] | None = None
    primary: str = ""
    higher_is_better: bool = True
    metrics: list[MetricSpec] = dataclasses.field(default_factory=list)
    commits: list[str] = dataclasses.field(default_factory=list)
    finished_range: list[str | None] = dataclasses.field(default_factory=lambda: [None, None])
    baseline: str | None = None
    trivial: dict[str, Any] | None = None
    chance_untested: bool | None = None
    """True when some single-seed row could not be tested against the trivial baseline; None (absent) otherwise."""
    resolution: Resolution | None = None
    finding: TableFinding | None = None
    epoch_cap: dict[str, Any] | None = None
    rows: tuple[Row, ...] = ()
    tuning: dict[str, Any] = dataclasses.field(default_factory=dict)
    mechanism: dict[str, Any] | None = None
    attention_entropy: dict[str, Any] | None = None

    _OPTIONAL = frozenset({"chance_untested", "mechanism", "attention_entropy"})
    _NESTED = {"rows": Row}
    _NESTED_LISTS = {"metrics": MetricSpec}
    _NESTED_ONE = {"resolution": Resolution, "finding": TableFinding}


@dataclass(frozen=True, eq=True)
class Group(_Model):
    """The one ranking over every execution (boards once had a group per hardware label): its provenance and tables."""

    hardware: str = ""
    accelerator: Any = None
    device: Any = None
    device_count: Any = None
    cpu: Any = None
    threads: Any = None
    torch: list[str] = dataclasses.field(default_factory=list)
    versions: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    records: int = 0
    commits: list[str] = dataclasses.field(default_factory=list)
    seed_batched: str = ""
    finished_range: list[str | None] = dataclasses.field(default_factory=lambda: [None, None])
    tasks: tuple[Table, ...] = ()
    overall: list[OverallRow] = dataclasses.field(default_factory=list)
    finding: GroupFinding | None = None

    _NESTED = {"tasks": Table}
    _NESTED_LISTS = {"overall": OverallRow}
    _NESTED_ONE = {"finding": GroupFinding}


@dataclass(frozen=True, eq=True)
class Board(_Model):
    """A suite's leaderboard, built once by `build_board`, from which every rendering (Markdown, HTML, CSV) is made.
    Optional parts (`row_settings`, `reproducibility`, `unreadable`, `conflicts`, `superseded`) are None when the
    board has none, so that a board without them reads exactly as before they existed."""

    suite: str = ""
    description: str = ""
    seeds: list[int] = dataclasses.field(default_factory=list)
    planned: int = 0
    recorded: int = 0
    status_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    commits: list[str] = dataclasses.field(default_factory=list)
    seed_batched: str = ""
    finished_range: list[str | None] = dataclasses.field(default_factory=lambda: [None, None])
    skipped_tasks: dict[str, str] = dataclasses.field(default_factory=dict)
    row_settings: dict[str, Any] | None = None
    alpha: float = ALPHA
    confidence: float = CONFIDENCE
    power: float = POWER
    min_seeds_to_rank: int = MIN_SEEDS_TO_RANK
    groups: tuple[Group, ...] = ()
    hardware_classes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    cost_classes: list[str] | None = None
    run_time: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reproducibility: dict[str, Any] | None = None
    unreadable: dict[str, str] | None = None
    conflicts: dict[str, list[str]] | None = None
    superseded: list[dict[str, Any]] | None = None
    csv: dict[str, list] = dataclasses.field(default_factory=lambda: {"header": [], "rows": []})

    _OPTIONAL = frozenset({"row_settings", "reproducibility", "unreadable", "conflicts", "superseded"})
    _NESTED = {"groups": Group}


def as_board(board: Board | Mapping[str, Any]) -> Board:
    """The model of `board`: itself, or built from its dict form (a board read back from JSON, a test's own)."""
    return Board.from_dict(board)


def is_fraction_metric(metric: str) -> bool:
    """Metrics shown in percent (accuracies and F1 scores in [0, 1])."""
    return metric.endswith(("acc", "accuracy", "f1"))  # f1 covers macro_f1


def build_board(suite, the_plan: Plan, records: Mapping[str, Record | Mapping[str, Any]], *,
                unreadable: Mapping[str, str] | None = None, conflicts: Mapping[str, Iterable[Any]] | None = None,
                executions: Mapping[str, Iterable[Record]] | None = None) -> Board:
    """`suite` and `the_plan` from harness.plan, `records` run key -> record (missing keys = not run yet),
    `unreadable` run key -> why its record file does not load, `conflicts` run key -> its conflicting copies,
    `executions` run key -> every finished execution of it (RecordStore.load), for keys run more than once.
    The unreadable and conflict counts (and their lists) and the reproducibility line appear only when there
    are some, so that a board without them reads exactly as before they existed."""
    unreadable = {k: v for k, v in (unreadable or {}).items() if k not in records}
    conflicts = conflicts or {}
    records = {key: r if isinstance(r, Record) else Record.from_dict(r) for key, r in records.items()}
    specs = sorted(the_plan.specs, key=lambda s: (s.task, s.display, s.seed, s.key))
    specs, superseded = current_versions(specs, records)
    task_order = [t.name for t in suite.tasks]
    tasks = sorted({s.task for s in specs}, key=lambda name: (task_order.index(name) if name in task_order else len(task_order), name))
    found = [records[s.key] for s in specs if s.key in records]
    unique = _unique_records(found)

    executions = {key: list(copies) for key, copies in (executions or {}).items() if key in records}
    by_label: dict[str, list[Record]] = defaultdict(list)
    for record in unique:
        for copy in executions.get(record.key) or [record]:  # every execution tells what the run costs on its class
            by_label[hardware_label(copy)].append(copy)
    labels = sorted(by_label)
    cost_classes = sorted({cost_class(copy) for copies in by_label.values() for copy in copies})
    trivial = {name: trivial_baseline(the_plan, name) for name in tasks}

    # One group: the ranking over every execution. (Boards had a group per hardware label; the list stays so
    # that a board's shape, and every renderer walking it, did not change with the rule.)
    groups = []
    for label in [" + ".join(labels) or NO_RECORDS]:
        group_records = unique
        hw = _group_hardware(group_records) if len(labels) == 1 else {name: None for name in _HARDWARE_FIELDS}
        tables = [_task_table(name, the_plan.metrics[name], [s for s in specs if s.task == name], records, cost_classes, trivial[name], executions)
                  for name in tasks]
        groups.append({
            "hardware": label,
            **hw,
            "torch": _versions(group_records, "torch"),
            "versions": {name: _versions(group_records, name) for name in ("python", "torch", "lightning")},
            "records": len(group_records),
            "commits": _commits(group_records),
            "seed_batched": seed_batched(group_records),
            "finished_range": _finished_range(group_records),
            "tasks": tables,
            "overall": _overall(tables),
            "finding": _overall_finding(tables),
        })

    counts = Counter(str(records[s.key].status) if s.key in records else UNREADABLE if s.key in unreadable else MISSING for s in specs)
    columns = (*map(str, Status), MISSING)
    planned_keys = sorted({s.key for s in specs})
    problems: dict[str, Any] = {}
    if any(key in unreadable for key in planned_keys):
        columns += (UNREADABLE,)
        problems["unreadable"] = {key: unreadable[key] for key in planned_keys if key in unreadable}
    conflicted = [key for key in planned_keys if conflicts.get(key)]
    if conflicted:
        counts[CONFLICT] = len(conflicted)
        columns += (CONFLICT,)
        problems["conflicts"] = {key: sorted(map(str, conflicts[key])) for key in conflicted}
    return Board.from_dict({
        "suite": suite.name,
        "description": " ".join(str(suite.description or "").split()),
        "seeds": list(suite.all_seeds()),
        "planned": len(specs),
        "recorded": sum(1 for s in specs if s.key in records),
        "status_counts": {status: counts.get(status, 0) for status in columns},
        "commits": _commits(unique),
        "seed_batched": seed_batched(unique),
        "finished_range": _finished_range(unique),
        "skipped_tasks": {task: without_data_root(why, the_plan.data_root) for task, why in sorted(the_plan.skipped_tasks.items())},
        **_row_settings(suite),
        "alpha": ALPHA,
        "confidence": CONFIDENCE,
        "power": POWER,
        "min_seeds_to_rank": MIN_SEEDS_TO_RANK,
        "groups": groups,
        "hardware_classes": [{"label": label, "records": len(by_label[label])} for label in labels],
        "cost_classes": cost_classes,
        "run_time": run_time(unique),
        **_reproducibility(specs, executions),
        **problems,
        **({"superseded": superseded} if superseded else {}),
        "csv": csv_rows(suite, the_plan, records, unreadable),
    })


def _finished_at(record: Record | None) -> str:
    return (record.finished or record.started or "") if record is not None else ""


def _newest(entries, version_of: Callable[[Any], str], records: Mapping[str, Record]) -> str:
    """The version whose latest record finished last: the code as it is now, for a board that cannot ask the
    registries (a plugin not loaded, a record of a colleague's). Ties (no records at all) go to the greater
    version string, so the choice never depends on the order of the specs."""
    latest: dict[str, str] = {}
    for spec in entries:
        version = version_of(spec)
        latest[version] = max(latest.get(version, ""), _finished_at(records.get(spec.key)))
    return max(latest, key=lambda version: (latest[version], version))


def current_versions(specs: list, records: Mapping[str, Record]) -> tuple[list, list[dict[str, Any]]]:
    """(the specs of each table's current versions, the superseded records counted per version). A row is one
    variant at one keyed version: records of an edited plugin's old source (or of a built-in before its version
    was bumped) are other experiments, and pooled with the new ones they would count as extra seeds of it (the
    same seeds twice, which also shrinks every p-value). A suite's plan holds one version of everything, so only
    a board of whatever a runs folder holds (records_plan.py) meets several: a table keeps its task's newest
    version, then each variant's newest, newest meaning the version whose latest record finished last."""
    by_task: dict[str, list] = defaultdict(list)
    for spec in specs:
        by_task[spec.task].append(spec)
    kept, dropped = [], Counter()
    for task, entries in by_task.items():
        task_now = _newest(entries, lambda s: s.task_version, records)
        for spec in entries:
            if spec.task_version != task_now:
                dropped[(task, "task", task, spec.task_version, task_now)] += spec.key in records
        entries = [s for s in entries if s.task_version == task_now]
        by_variant: dict[str, list] = defaultdict(list)
        for spec in entries:
            by_variant[spec.variant].append(spec)
        for variant, runs in by_variant.items():
            now = _newest(runs, lambda s: s.variant_version, records)
            for spec in runs:
                if spec.variant_version == now:
                    kept.append(spec)
                else:
                    dropped[(task, "variant", variant, spec.variant_version, now)] += spec.key in records
    superseded = [{"table": table, "of": of, "name": name, "version": version, "current": now, "records": n}
                  for (table, of, name, version, now), n in sorted(dropped.items()) if n]
    kept_ids = {id(s) for s in kept}  # specs hold dicts: not hashable
    return [s for s in specs if id(s) in kept_ids], superseded


def _reproducibility(specs, executions: Mapping[str, Iterable[Record]]) -> dict[str, Any]:
    """For the planned keys with two or more finished executions: per metric, in how many of them every copy gives
    the identical value, and the largest |difference| from the copy the board shows (in points for percent
    metrics). Empty (no line on the board) when no key ran twice."""
    keys = sorted({s.key for s in specs if len(list(executions.get(s.key, ()))) >= 2})
    if not keys:
        return {}
    from harness.results.store import chosen_execution  # the store's rule, so that board and store agree on the shown copy

    copies_count: Counter = Counter()
    classes: Counter = Counter()
    metrics: dict[str, dict[str, Any]] = {}
    row_of = {s.key: s.display for s in specs}
    per_row: dict[str, dict[str, int]] = {}
    for key in keys:
        copies = list(executions[key])
        copies_count[len(copies)] += 1
        classes.update(hardware_label(c) for c in copies)
        shown = chosen_execution(copies)
        row = per_row.setdefault(row_of[key], {"keys": 0, "differ": 0})
        row["keys"] += 1
        differs = False
        for name, cell in sorted((shown.metrics or {}).items()):
            value = cell.get("value")
            others = [(c.metrics or {}).get(name, {}).get("value") for c in copies if c is not shown]
            if value is None or any(v is None for v in others):
                continue
            entry = metrics.setdefault(name, {"metric": name, "percent": is_fraction_metric(name), "keys": 0, "identical": 0, "max_abs_diff": 0.0})
            entry["keys"] += 1
            differences = [abs(float(v) - float(value)) for v in others]
            entry["identical"] += all(d == 0 for d in differences)
            entry["max_abs_diff"] = max([entry["max_abs_diff"], *differences])
            differs = differs or any(d != 0 for d in differences)
        row["differ"] += differs
    # Which rows differ, by name: on one CPU class a difference is a determinism bug; across classes it is the
    # last-bit rounding of another CPU, which some variants' training amplifies into other epochs kept (docs/design/identity-and-execution.md,
    # "Reproducibility across CPUs") and a reader should see which ones.
    differing = [{"variant": name, **row} for name, row in sorted(per_row.items()) if row["differ"]]
    return {"reproducibility": {"keys": len(keys), "executions": dict(sorted(copies_count.items())), "classes": dict(sorted(classes.items())),
                                "metrics": list(metrics.values()), "differing_rows": differing}}


def _row_settings(suite) -> dict[str, Any]:
    """What each labelled row of the suite runs, when it sets options (`align-ct-paper-lambda` is align-ct with
    attention.weight = 0.01): a row's label alone would not say. Absent when no row sets any, so boards without
    such rows read as before."""
    settings = {entry.label: {"variant": entry.name, "options": {f"attention.{k}": v for k, v in sorted(entry.config.items())}}
                for entry in suite.variants if entry.label and entry.label != entry.name and entry.config}
    return {"row_settings": settings} if settings else {}


def without_data_root(reason: str, data_root: str | None) -> str:
    """A skipped task's reason names the files it looked for under this machine's data root; a board is regenerated
    byte for byte on other machines (CI clones elsewhere), so "in /some/root/planetoid" is written "in the data
    root's planetoid" there."""
    if not data_root:
        return reason
    for root in sorted({str(Path(data_root)), str(Path(data_root).resolve())}, key=len, reverse=True):
        reason = reason.replace(root.rstrip("/") + "/", "the data root's ")
    return reason


def trivial_baseline(the_plan: Plan, task: str) -> dict[str, Any] | None:
    """The task's trivial baseline as board data; None when it declares none or its data is not here (a plan
    made without checking data, say, where the board's other numbers still stand)."""
    if task in the_plan.missing_data:
        return None
    try:
        found = the_plan.trivial_baseline(task)
    except MissingDataError:
        return None
    if found is None:
        return None
    return {"predictor": found.predictor, "metrics": dict(found.metrics), "test_sizes": dict(found.test_sizes), "note": found.note}


def hardware_label(record: Record) -> str:
    return record.hardware_label or UNKNOWN_HARDWARE


def cost_class(record: Record) -> str:
    """What a record's time and memory measured: its hardware class, and whether it trained in a seed batch. A
    batch's time per seed is the batch's divided among its seeds, which on a CPU is slower than a lone run (on a
    GPU faster): averaging the two would describe neither, so they are costed apart."""
    batch = (record.execution or {}).get("seed_batch")
    return f"{hardware_label(record)}, seed batches of {int(batch)}" if batch else hardware_label(record)


def _unique_records(found: Iterable[Record]) -> list[Record]:
    """A tuned row whose best parameters are the defaults shares its runs (keys) with the default row."""
    by_key = {r.key: r for r in found}
    return [by_key[k] for k in sorted(by_key)]


_HARDWARE_FIELDS = ("accelerator", "device", "device_count", "cpu", "threads")


def _group_hardware(group_records: list[Record]) -> dict[str, Any]:
    """The label names the device; the first record (by key) gives the details, which the label fixes."""
    hw = (group_records[0].hardware or {}) if group_records else {}
    return {name: hw.get(name) for name in _HARDWARE_FIELDS}


def _versions(group_records: list[Record], name: str) -> list[str]:
    return sorted({(r.versions or {}).get(name) for r in group_records} - {None})


def seed_batched(found: Iterable[Record]) -> str:
    """How many records trained in seed batches and of what sizes (Record.execution), for the provenance line;
    "" when none did, so that boards of lone runs read as before."""
    sizes = [int(r.execution["seed_batch"]) for r in found if r.execution and r.execution.get("seed_batch")]
    if not sizes:
        return ""
    return f"{len(sizes)} trained in seed batches of {', '.join(str(n) for n in sorted(set(sizes)))} seeds"


def _commits(found: Iterable[Record]) -> list[str]:
    return sorted({r.commit or "unknown" for r in found})


def _finished_range(found: Iterable[Record]) -> list[str | None]:
    dates = sorted(r.finished[:10] for r in found if r.finished)
    return [dates[0], dates[-1]] if dates else [None, None]


def _direction(name: str, planned: bool, task_records: Iterable[Record]) -> bool:
    """Whether higher is better, as the records say (the value they were ranked by when they ran); the
    task's current declaration only for a metric no record has yet."""
    return next((bool(r.metrics[name]["higher_is_better"]) for r in task_records if r.metrics and name in r.metrics), planned)


def _task_table(task_name: str, planned_metrics, task_specs, records: Mapping[str, Record], classes: list[str],
                trivial: dict[str, Any] | None = None, executions: Mapping[str, list[Record]] | None = None) -> dict[str, Any]:
    task_records = [records[s.key] for s in task_specs if s.key in records]
    metrics = [{"name": m.name, "higher_is_better": _direction(m.name, m.higher_is_better, task_records), "percent": is_fraction_metric(m.name)}
               for m in planned_metrics]
    by_label: dict[str, list] = defaultdict(list)
    for spec in task_specs:
        by_label[spec.display].append(spec)
    rows = {label: _row(label, entries, records, classes, metrics, executions or {}) for label, entries in sorted(by_label.items())}

    baseline = _baseline_label(by_label, rows)
    for metric in metrics:
        _compare(rows, baseline, metric)

    primary = metrics[0]["name"]
    for row in rows.values():
        row["chance"] = _chance(row["metrics"][primary]["values"], trivial, primary, metrics[0]["higher_is_better"])
    _correct_chance(rows)
    untested = trivial is not None and trivial["metrics"].get(primary) is not None and metric_kind(primary) != "correlation" and any(
        row["chance"] is None and len(row["metrics"][primary]["values"]) == 1 for row in rows.values())
    ordered = _rank(list(rows.values()), primary, metrics[0]["higher_is_better"])
    table_records = _unique_records(records[s.key] for s in task_specs if s.key in records)
    tuning = {s.display: {**_plain(s.extra["tuning"]), "values": _tuned_values(s, task_specs)} for s in task_specs if s.extra.get("tuning")}
    return {
        "task": task_name,
        "versions": {"task": sorted({s.task_version for s in task_specs}),
                     "variants": {variant: sorted({s.variant_version for s in task_specs if s.variant == variant})
                                  for variant in sorted({s.variant for s in task_specs})}},
        "primary": primary,
        "higher_is_better": metrics[0]["higher_is_better"],
        "metrics": metrics,
        "commits": _commits(table_records),
        "finished_range": _finished_range(table_records),
        "baseline": baseline,
        "trivial": trivial,
        **({"chance_untested": True} if untested else {}),
        "resolution": _resolution(rows, primary),
        "finding": _finding(rows, baseline, metrics),
        "epoch_cap": epoch_cap_hits(table_records),
        "rows": ordered,
        "tuning": dict(sorted(tuning.items())),
        **_mechanism_diagnostics(task_specs, {**records, **_diagnosed(executions or {})}),
        **attention_entropy(task_specs, {**records, **_diagnosed(executions or {})}),
    }


def _diagnosed(executions: Mapping[str, list[Record]]) -> dict[str, Record]:
    """Per key run more than once, the record to read evidence at the evaluated weights from (report/evidence.py, as
    the claims page reads it): the shown execution's own test-pass values, completed from an execution of the same
    evaluated weights where it lacks them."""
    from harness.report.evidence import evidence_record

    return {key: evidence_record(copies) for key, copies in executions.items() if copies}


EVALUATED_KEY = re.compile(r"^test/(?:diag|attn)/([A-Za-z_][A-Za-z0-9_]*)$")
"""A value at the evaluated weights (test/diag/<name>, or test/attn/<name> in records made before test/diag existed);
per-layer keys (test/attn/l0/<name>) are not matched."""
NOT_MECHANISM = frozenset({"entropy", "support", "uniform_entropy"})
"""Test-pass attention statistics every kernel reports: the entropy table shows them, the mechanism line does not."""


def _mechanism_diagnostics(task_specs, records: Mapping[str, Record]) -> dict[str, Any]:
    """Per row, each mechanism diagnostic at the evaluated weights (the test pass: what the mechanism rules read): its
    mean over the seeds whose records carry it, and how many of the row's finished seeds that is. Validation and
    training values are never mixed in: they come from other weights than the test numbers. Read from the records
    alone, so that a board renders without the variants' code. Absent (no line on the board) when no record carries one."""
    found: dict[str, dict[str, list[float]]] = {}
    finished: dict[str, int] = {}
    for spec in task_specs:
        record = records.get(spec.key)
        if record is None or record.status is not Status.OK:
            continue
        finished[spec.display] = finished.get(spec.display, 0) + 1
        values = record.diagnostics or {}
        by_name: dict[str, float] = {}
        for key in sorted(values, key=lambda k: not k.startswith("test/diag/")):  # test/diag/ first where both exist
            match = EVALUATED_KEY.match(key)
            if match and match.group(1) not in NOT_MECHANISM and match.group(1) not in by_name and values[key] is not None \
                    and math.isfinite(float(values[key])):
                by_name[match.group(1)] = float(values[key])
        for name, value in by_name.items():
            found.setdefault(spec.display, {}).setdefault(name, []).append(value)
    if not found:
        return {}
    return {"mechanism": {label: {name: {"mean": statistics.fmean(v), "seeds": len(v), "of": finished[label]}
                                     for name, v in sorted(by_name.items())} for label, by_name in sorted(found.items())}}


ENTROPY_KEY = re.compile(r"^test/attn/(l\d+)/(entropy|uniform_entropy)$")


def attention_entropy(task_specs, records: Mapping[str, Record]) -> dict[str, Any]:
    """Per row and attention layer, the mean over its finished seeds of the test pass's attention entropy and of the
    entropy uniform weights over the same keys would have (`test/attn/l<i>/entropy`, `.../uniform_entropy`): how far
    the evaluated attention is from uniform; per row, how many seeds carry the uniform reference (`seeds`). Records
    from before the uniform reference have the entropy alone: their reference is None ("not recorded"), never
    estimated. Absent when no record has an entropy. The claims page reads softmax's row (claims.host_attention)."""
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    seeds: dict[str, int] = defaultdict(int)
    for spec in task_specs:
        record = records.get(spec.key)
        if record is None or record.status is not Status.OK:
            continue
        referenced = False
        for key, value in (record.diagnostics or {}).items():
            found = ENTROPY_KEY.match(key)
            if found and value is not None and math.isfinite(float(value)):
                values.setdefault(spec.display, {}).setdefault(found[1], {}).setdefault(found[2], []).append(float(value))
                referenced = referenced or found[2] == "uniform_entropy"
        seeds[spec.display] += referenced
    if not values:
        return {}
    layers = sorted({layer for by_layer in values.values() for layer in by_layer}, key=lambda name: int(name[1:]))
    rows = {label: {layer: {"entropy": statistics.fmean(cell["entropy"]) if cell.get("entropy") else None,
                            "uniform": statistics.fmean(cell["uniform_entropy"]) if cell.get("uniform_entropy") else None}
                    for layer, cell in sorted(by_layer.items(), key=lambda item: int(item[0][1:]))}
            for label, by_layer in sorted(values.items())}
    recorded = any(cell["uniform"] is not None for by_layer in rows.values() for cell in by_layer.values())
    return {"attention_entropy": {"layers": layers, "uniform_recorded": recorded, "rows": rows, "seeds": dict(sorted(seeds.items()))}}


def run_time(found: Iterable[Record]) -> list[dict[str, Any]]:
    """Per hardware class, the worker time its records took: each lone run's wall time, and each seed batch's once
    (a batch's records share their start, and each seed's wall time runs from it to the seed's record, so the
    batch took its last seed's). [] when no record has a wall time."""
    lone: dict[str, float] = defaultdict(float)
    batches: dict[str, dict[tuple, float]] = defaultdict(dict)
    runs: Counter = Counter()
    for record in found:
        if not record.wall_time_s:
            continue
        label = hardware_label(record)
        runs[label] += 1
        execution = record.execution or {}
        if execution.get("seed_batch"):
            batch = (record.started, tuple(execution.get("seeds") or ()), (record.spec or {}).get("task"))
            batches[label][batch] = max(batches[label].get(batch, 0.0), float(record.wall_time_s))
        else:
            lone[label] += float(record.wall_time_s)
    return [{"class": label, "runs": runs[label], "worker_s": lone[label] + sum(batches[label].values()),
             "batches": len(batches[label])} for label in sorted(runs)]


def _finding(rows: Mapping[str, dict[str, Any]], baseline: str | None, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """What the table's tests found, for the sentence that opens it (`finding_sentence`): per metric the rows
    marked better and worse than the baseline, how many rows were tested, the rows with finished seeds too few
    to test, and the rows not above the trivial baseline. Names in the table's order of means."""
    primary = metrics[0]["name"]

    def by_mean(labels: Iterable[str], metric: dict[str, Any]) -> list[str]:
        sign = -1.0 if metric["higher_is_better"] else 1.0
        return sorted(labels, key=lambda label: (sign * rows[label]["metrics"][metric["name"]]["mean"], label))

    marks = []
    for metric in metrics:
        marked = {kind: by_mean([label for label, row in rows.items()
                                 if (row["metrics"][metric["name"]]["vs_baseline"] or {}).get("mark") == kind], metric)
                  for kind in ("better", "worse")}
        marks.append({"metric": metric["name"], **marked})
    tested = [label for label, row in rows.items()
              if (row["metrics"][primary]["vs_baseline"] or {}).get("n_pairs", 0) >= MIN_SEEDS_TO_RANK]
    untested = sorted(label for label, row in rows.items()
                      if label != baseline and label not in tested and row["metrics"][primary]["n"])
    with_chance = [label for label, row in rows.items() if row.get("chance")]
    return {"baseline": baseline, "tested": len(tested), "untested": untested, "marks": marks,
            "at_chance": sorted(label for label in with_chance if rows[label]["chance"]["at_chance"]),
            "chance_tested": len(with_chance)}


def _overall_finding(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant, the tasks whose primary metric is marked better / worse; the tasks that tested anything."""
    better: dict[str, list[str]] = defaultdict(list)
    worse: dict[str, list[str]] = defaultdict(list)
    for table in tables:
        marks = (table.get("finding") or {}).get("marks") or [{"better": [], "worse": []}]
        for label in marks[0]["better"]:
            better[label].append(table["task"])
        for label in marks[0]["worse"]:
            worse[label].append(table["task"])
    return {"baseline": BASELINE, "tasks": len(tables), "tested_tasks": [t["task"] for t in tables if (t.get("finding") or {}).get("tested")],
            "better": dict(sorted(better.items())), "worse": dict(sorted(worse.items()))}


EPOCH_CAP_MARGIN = 0.05
"""A run whose best epoch lies within this share of its epoch cap may still have been improving when the cap
stopped it: a table where such runs pile up is under-trained, and says so (as it says how many ran to the cap)."""


def epoch_cap_hits(table_records: Iterable[Record]) -> dict[str, Any] | None:
    """Under-training counts over the finished runs that record their cap `max_epochs`: {"at_cap": how many trained
    all `max_epochs` epochs (their stopping rule never fired: the cap stopped them), "hits": how many kept an epoch
    within EPOCH_CAP_MARGIN of the cap, "runs", "caps", "margin"}; None when no finished run records a cap and a
    kept epoch. `best_epoch` counts from 0 (Lightning's current_epoch), so the best of a 300-epoch cap is 299; 5% of
    300 is 15 epochs: best epochs 285-300 (counted from 1) are at the cap. "at_cap" is None when no record counts
    its epochs (only kept epochs are then known)."""
    counted = []
    for record in table_records:
        cap = ((record.spec or {}).get("params") or {}).get("max_epochs")
        if record.status is Status.OK and record.best_epoch is not None and cap:
            counted.append((int(record.best_epoch) + 1, int(cap), record.epochs))
    if not counted:
        return None
    hits = sum(1 for best, cap, _ in counted if cap - best <= EPOCH_CAP_MARGIN * cap)
    at_cap = sum(1 for _, cap, epochs in counted if epochs is not None and int(epochs) >= cap) \
        if any(epochs is not None for _, _, epochs in counted) else None
    return {"at_cap": at_cap, "hits": hits, "runs": len(counted), "caps": sorted({cap for _, cap, _ in counted}), "margin": EPOCH_CAP_MARGIN}


def _chance(values: list[float], trivial: dict[str, Any] | None, metric: str, higher: bool) -> dict[str, Any] | None:
    if trivial is None or metric not in trivial["metrics"]:
        return None
    if metric_kind(metric) == "correlation":
        # Against 0 even where the baseline shows a value: a constant prediction leaves a correlation undefined,
        # and what torchmetrics returns for it then (CoLA: 0.0256) is an artefact of its zero-division guard.
        size = trivial["test_sizes"].get(metric)
        if len(values) == 1 and higher and size:
            p = correlation_above_zero_p(values[0], size, metric)
            tested = None if p is None else (p, "correlation")
        else:
            tested = above_chance_p(values, 0.0, higher)
    else:
        chance = trivial["metrics"][metric]
        if chance is None:
            return None
        tested = above_chance_p(values, chance, higher, trivial["test_sizes"].get(metric))
    if tested is None:
        return None
    p, test = tested
    return {"p": p, "test": test, "at_chance": p >= ALPHA}


def _correct_chance(rows: Mapping[str, dict[str, Any]]) -> None:
    """Holm over the table's rows tested against the trivial baseline, as the Δ tests are corrected over its variants:
    each row is one test of one family, and uncorrected, 2 of glue-mrpc's 11 rows came out "above" at p ~ 0.03 where
    one such p in 11 is what chance alone gives. `p` stays the row's own, `p_holm` decides `at_chance`."""
    tested = {label: row["chance"]["p"] for label, row in rows.items() if row.get("chance")}
    for label, p_holm in holm(tested).items():
        rows[label]["chance"]["p_holm"] = p_holm
        rows[label]["chance"]["at_chance"] = p_holm >= ALPHA


RESOLUTION_OUTLIER = 1.5
"""A variant whose own paired spread exceeds the table's by this factor is named beside the table's resolution."""


def _resolution(rows: Mapping[str, dict[str, Any]], primary: str) -> dict[str, Any] | None:
    """The detectable difference at the rows' median paired seed count, from the median of their paired spreads;
    None without two pairs. The median, not a pooled variance: pooling assumes every variant varies alike, and
    one unstable variant (paper-gat's bam-lognormal, paired spread 3 points against 0.7 for the rest) then hid
    what the table resolves for all the others. A row that varies more than `RESOLUTION_OUTLIER` times the
    median is named with its own resolution, so the sentence still says which rows it does not cover."""
    compared = {label: row["metrics"][primary]["vs_baseline"] for label, row in rows.items()}  # None for the baseline
    compared = {label: c for label, c in compared.items() if c and c["n_pairs"] >= 2}
    if not compared:
        return None
    spread = statistics.median(c["spread"] for c in compared.values())
    # the seed count most rows have paired (the lower median), not the best-covered row's: while a table fills
    # in, a few rows at 36 seeds must not lend their resolution to the many still at 20
    pairs = statistics.median_low(c["n_pairs"] for c in compared.values())
    wider = [{"label": label, "spread": c["spread"], "difference": detectable_difference(c["spread"], c["n_pairs"])}
             for label, c in sorted(compared.items(), key=lambda item: (-item[1]["spread"], item[0]))
             if c["spread"] > RESOLUTION_OUTLIER * spread]
    return {"pairs": pairs, "spread": spread, "variants": len(compared), "difference": detectable_difference(spread, pairs),
            "wider": wider}


def _baseline_label(by_label: Mapping[str, list], rows: Mapping[str, dict[str, Any]]) -> str | None:
    """The default-parameters softmax row: not a tuned one, and only if it has finished runs to compare with."""
    candidates = [label for label, entries in by_label.items()
                  if all(s.variant == BASELINE and not s.extra.get("tuning") for s in entries)]
    candidates.sort(key=lambda label: (label != BASELINE, label))
    for label in candidates:
        if rows[label]["n"]:
            return label
    return None


def _row(label: str, entries, records: Mapping[str, Record], classes: list[str], metrics: list[dict[str, Any]],
         executions: Mapping[str, list[Record]]) -> dict[str, Any]:
    entries = sorted(entries, key=lambda s: (s.seed, s.key))
    here = [(s, records[s.key]) for s in entries if s.key in records]
    ok = [(s, r) for s, r in here if r.status is Status.OK]
    cost_by_class = {}
    for hardware in classes:
        # each execution of a key costs what it cost on its own class; quality above counts the key once
        runs = [(s, copy) for s, r in here for copy in executions.get(s.key) or [r] if cost_class(copy) == hardware]
        if runs:
            cost_by_class[hardware] = {**_cost(runs, [(s, r) for s, r in runs if r.status is Status.OK]), "runs": len(runs)}
    row: dict[str, Any] = {
        "variant": label,
        "rank": None,
        "planned": len(entries),
        "n": len(ok),
        "failed": sum(1 for _, r in here if r.status is Status.FAILED),
        "pruned": sum(1 for _, r in here if r.status is Status.PRUNED),
        "missing": sum(1 for s in entries if s.key not in records),
        # (an unreadable record counts as missing in its row; the board's header counts and names it apart)
        "errors": sorted({r.error.split("\n")[0][:120] for _, r in here if r.status is Status.FAILED and r.error}),
        "metrics": {},
        # A board with one class shows its cost in the table; with several, per class below it (renderers).
        "cost": cost_by_class[classes[0]] if len(classes) == 1 and cost_by_class else _cost([], []) if len(classes) <= 1 else None,
        "cost_by_class": cost_by_class,
    }
    curves = _mean_curves([r.history for _, r in ok if r.history])
    if curves:
        row["history"] = curves  # only when some record has one, so boards of older records are unchanged
    for metric in metrics:
        pairs = [(s.seed, r.metrics[metric["name"]]["value"]) for s, r in ok if metric["name"] in (r.metrics or {})]
        pairs = [(seed, float(v)) for seed, v in pairs if v is not None and math.isfinite(float(v))]
        summary = summarize([v for _, v in pairs])
        summary["ci_low"], summary["ci_high"], clipped = clip_interval(summary["ci_low"], summary["ci_high"], metric_range(metric["name"]))
        row["metrics"][metric["name"]] = {"values": [v for _, v in pairs], "seeds": [seed for seed, _ in pairs],
                                          **summary, "ci_clipped": clipped, "vs_baseline": None}
    return row


def _mean_curves(histories: list[Mapping[str, Any]]) -> dict[str, list] | None:
    """The seeds' learning curves averaged point by point on their common epoch axis (seeds that stopped
    early simply end sooner): {"epoch": [...], <series>: [mean or None]}."""
    if not histories:
        return None
    epochs = sorted({e for h in histories for e in h.get("epoch", [])})
    names = sorted({name for h in histories for name in h if name != "epoch"})
    at = [dict(zip(h.get("epoch", []), range(len(h.get("epoch", []))))) for h in histories]
    curves: dict[str, list] = {"epoch": epochs}
    for name in names:
        series = []
        for epoch in epochs:
            values = [h[name][index[epoch]] for h, index in zip(histories, at)
                      if epoch in index and name in h and index[epoch] < len(h[name]) and h[name][index[epoch]] is not None]
            series.append(statistics.fmean(values) if values else None)
        curves[name] = series
    return curves


@dataclass(frozen=True)
class Comparison(Mapping):
    """One row of a table against the baseline on one metric: the mean paired difference and its spread over the
    seeds both finished, the paired t-test's p, that p Holm-corrected over the table's family (`family` rows
    compared), and the board's mark ("better" / "worse" / None). Reads like the dict boards stored before it
    (`comparison["p_holm"]`); `family` is an attribute, not one of those keys."""

    diff: float
    spread: float
    n_pairs: int
    p: float
    p_holm: float | None = None
    mark: str | None = None
    family: int = 0

    _KEYS = ("diff", "spread", "n_pairs", "p", "p_holm", "mark")

    def __getitem__(self, name: str) -> Any:
        if name not in self._KEYS and name != "family":
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


def paired_comparisons(by_label: Mapping[str, Mapping[int, float]], baseline: str) -> dict[str, Comparison]:
    """Every row of a table against `baseline` on one metric: per label its Comparison, the paired t-test over the
    seeds both finished, Holm-corrected over every row compared (the table's family). The one definition of a
    table's family: the boards mark rows by it and the claims page reads its verdicts from it."""
    base = by_label.get(baseline, {})
    found: dict[str, Comparison] = {}
    for label, values in by_label.items():
        if label == baseline:
            continue
        diffs = [v - base[seed] for seed, v in values.items() if seed in base]
        if len(diffs) < 2:
            continue
        found[label] = Comparison(statistics.fmean(diffs), statistics.stdev(diffs), len(diffs), paired_p(diffs))
    corrected = holm({label: comparison.p for label, comparison in found.items()})
    return {label: dataclasses.replace(comparison, p_holm=corrected[label], family=len(found)) for label, comparison in found.items()}


def _compare(rows: dict[str, dict[str, Any]], baseline: str | None, metric: dict[str, Any]) -> None:
    if baseline is None:
        return
    name = metric["name"]
    by_label = {label: dict(zip(row["metrics"][name]["seeds"], row["metrics"][name]["values"])) for label, row in rows.items()}
    for label, comparison in paired_comparisons(by_label, baseline).items():
        if comparison.p_holm < ALPHA and comparison.diff != 0 and comparison.n_pairs >= MIN_SEEDS_TO_RANK:
            comparison = dataclasses.replace(comparison, mark="better" if (comparison.diff > 0) == metric["higher_is_better"] else "worse")
        rows[label]["metrics"][name]["vs_baseline"] = comparison


TIERS = {"better": 0, None: 1, "worse": 2}
"""A row's tier by its primary metric's mark against softmax: the order ranks may claim."""


def _rank(rows: list[dict[str, Any]], primary: str, higher: bool) -> list[dict[str, Any]]:
    def tier(row: dict[str, Any]) -> int:
        return TIERS[(row["metrics"][primary]["vs_baseline"] or {}).get("mark")]

    ranked = [r for r in rows if r["metrics"][primary]["n"] >= MIN_SEEDS_TO_RANK]
    ranked.sort(key=lambda r: (tier(r), -r["metrics"][primary]["mean"] if higher else r["metrics"][primary]["mean"], r["variant"]))
    for position, row in enumerate(ranked, 1):
        previous = ranked[position - 2] if position > 1 else None
        row["rank"] = previous["rank"] if previous is not None and tier(previous) == tier(row) else position
    unranked = sorted((r for r in rows if r["metrics"][primary]["n"] < MIN_SEEDS_TO_RANK), key=lambda r: (not r["metrics"][primary]["n"], r["variant"]))
    return ranked + unranked


def _cost(here: list[tuple[Any, Record]], ok: list[tuple[Any, Record]]) -> dict[str, Any]:
    def mean_of(field: str) -> float | None:
        values = [float(getattr(r, field)) for _, r in ok if getattr(r, field) is not None]
        return statistics.fmean(values) if values else None

    totals = [float(r.fit_time_s or r.wall_time_s) for _, r in ok if r.fit_time_s or r.wall_time_s]
    memory = [float(r.peak_memory_mb) for _, r in ok if r.peak_memory_mb]
    parameters = [r.parameters for _, r in ok if r.parameters]
    # which implementation the time and memory measured: records list the attention paths their
    # kernels took (kernel.attention_paths); a record without the list ran every call eager, or predates the list
    paths = sorted({path for _, r in ok for path in (r.execution or {}).get("attention_paths", ())})
    # What the row cost on the accelerator, failed runs included: every run held its GPUs for its wall time.
    gpu_seconds = [float(r.wall_time_s or 0.0) * int((r.hardware or {}).get("device_count") or 1)  # at least the one it ran on
                   for _, r in here if (r.hardware or {}).get("accelerator") == "gpu"]
    return {
        "epochs": mean_of("epochs"),
        "time_per_epoch_s": mean_of("time_per_epoch_s"),
        "total_time_s": statistics.fmean(totals) if totals else None,
        "gpu_hours": sum(gpu_seconds) / 3600 if gpu_seconds else None,
        "peak_memory_mb": max(memory) if memory else None,
        "parameters": parameters[0] if parameters else None,
        "attention_paths": paths,
    }


def _overall(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean rank over the tasks where a variant has a ranked row: a variant that skipped a task is neither
    helped nor hurt by it, which is why `tasks_covered` sits next to the mean rank."""
    labels = sorted({row["variant"] for table in tables for row in table["rows"]})
    overall = []
    for label in labels:
        ranks, better, worse = [], 0, 0
        for table in tables:
            for row in table["rows"]:
                if row["variant"] != label:
                    continue
                if row["rank"] is not None:
                    ranks.append(row["rank"])
                mark = (row["metrics"][table["primary"]]["vs_baseline"] or {}).get("mark")
                better += mark == "better"
                worse += mark == "worse"
        overall.append({"variant": label, "mean_rank": statistics.fmean(ranks) if ranks else None,
                        "tasks_covered": len(ranks), "tasks_total": len(tables), "better": better, "worse": worse})
    # mean_rank is None exactly when tasks_covered is 0, so None never meets a number here
    overall.sort(key=lambda o: (-o["tasks_covered"], o["mean_rank"] or 0, o["variant"]))
    return overall


def _tuned_values(tuned, task_specs) -> dict[str, Any]:
    """What tuning chose: the attention options and task parameters in which a "(tuned)" row differs from the same
    variant's default row, so that a reader sees the configuration a tuned row ran (temperature 0.852), not only
    that it was tuned."""
    default = next((s for s in task_specs if s.variant == tuned.variant and not s.extra.get("tuning") and s.seed == tuned.seed), None)
    if default is None:
        return {}
    options = {f"attention.{k}": v for k, v in tuned.attention.items() if default.attention.get(k) != v}
    params = {k: v for k, v in tuned.params.items() if default.params.get(k) != v}
    return _plain({**options, **params})


def _plain(value: Any) -> Any:
    """Tuning info comes from YAML: keep it JSON-serialisable and in a fixed key order."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda item: str(item[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---- the per-run table (the CSV) -------------------------------------------------------------------------

CSV_FIELDS = ["key", "suite", "task", "variant", "label", "version", "seed", "status", "error", "epochs", "best_epoch", "time_per_epoch_s",
              "fit_time_s", "wall_time_s", "peak_memory_mb", "parameters", "hardware", "accelerator", "device", "device_count",
              "threads", "torch", "python", "lightning", "commit", "finished"]
HARDWARE_FIELDS = ("accelerator", "device", "device_count", "threads")
VERSION_FIELDS = ("torch", "python", "lightning")
TRIVIAL = "trivial"
SUPERSEDED = "superseded"
"""The status of a record whose variant or task has a newer version among the records (board.current_versions)."""


def csv_rows(suite, the_plan: Plan, records: Mapping[str, Record], unreadable: Mapping[str, str] | None = None) -> dict[str, list]:
    """The CSV's header and rows, computed with the board (board.build_board stores them as `board["csv"]`): one row
    per planned run, missing ones included, the per-seed data behind the board's statistics; then a row per task for
    its trivial baseline. A run whose record file does not load has status "unreadable" and the reason in `error`."""
    unreadable = unreadable or {}
    metric_names = sorted({name for s in the_plan.specs if s.key in records for name in records[s.key].metrics or {}})
    rows = []
    specs = sorted(the_plan.specs, key=lambda s: (s.task, s.display, s.seed, s.key))
    counted = {id(s) for s in current_versions(specs, records)[0]}
    for task in sorted({s.task for s in specs}):
        for spec in (s for s in specs if s.task == task):
            row = _run_row(suite, spec, records.get(spec.key), unreadable, metric_names)
            if id(spec) not in counted:  # as the board counts it: another version's record is no seed of this one
                row[CSV_FIELDS.index("status")] = SUPERSEDED
            rows.append(row)
        # As on the Markdown board: the task's input-blind baseline after its runs (status "trivial", no run
        # key; what it predicts in the attention column, where a run names its model).
        trivial = trivial_baseline(the_plan, task)
        if trivial is not None:
            row = ["", suite.name, task, TRIVIAL, TRIVIAL, "", "", TRIVIAL] + [""] * (len(CSV_FIELDS) - 8)
            rows.append(row + [_num(trivial["metrics"].get(m)) for m in metric_names] + [f"predictor={trivial['predictor']}", ""])
    return {"header": CSV_FIELDS + metric_names + ["attention", "params"], "rows": rows}


def _run_row(suite, spec, record: Record | None, unreadable: Mapping[str, str], metric_names: list[str]) -> list[Any]:
    if record is None:
        if spec.key in unreadable:
            row = [spec.key, suite.name, spec.task, spec.variant, spec.display, spec.variant_version, spec.seed, "unreadable",
                   unreadable[spec.key]]
        else:
            row = [spec.key, suite.name, spec.task, spec.variant, spec.display, spec.variant_version, spec.seed, "missing"]
        row += [""] * (len(CSV_FIELDS) - len(row))
        return row + [""] * len(metric_names) + [_compact(spec.attention), _compact(spec.params)]
    r = record.to_dict()
    hardware, versions = r.get("hardware") or {}, r.get("versions") or {}
    values = {
        "key": spec.key, "suite": suite.name, "task": spec.task, "variant": spec.variant, "label": spec.display,
        "version": spec.variant_version, "seed": spec.seed, "status": r.get("status"), "error": (r.get("error") or "").split("\n")[0],
        "hardware": hardware.get("label", ""),
        **{f: _num(hardware.get(f)) for f in HARDWARE_FIELDS},
        **{f: versions.get(f, "") for f in VERSION_FIELDS},
    }
    row = [values[f] if f in values else _num(r.get(f)) for f in CSV_FIELDS]
    row += [_num(r.get("metrics", {}).get(m, {}).get("value")) for m in metric_names]
    return row + [_compact(spec.attention), _compact(spec.params)]


def _num(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value


def _compact(mapping) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(dict(mapping).items()))
