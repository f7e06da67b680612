"""The registered tasks and variants as plain data (names, parameter annotations, the `list` and `describe`
texts), cached on disk, so that `attnbench list`, `describe` and a mistyped name or value answer without
importing torch, PyG and Lightning (about 10 s on a 2-core machine, against well under a second).

The cache is keyed by a fingerprint of every source file the registrations and their texts come from
(path, size, modification time) and of the installed plugin entry points; any change rebuilds it on the
next command that imports the registries anyway. Commands with --plugin files never use it."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import sys
import typing
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("modules", "datamodules", "harness/plan", "harness/suites")
ENTRY_POINT_GROUPS = ("attnbench.attention", "attnbench.tasks")
FORMAT = 1


def fingerprint() -> str:
    digest = hashlib.sha256(f"{FORMAT} {sys.version}".encode())
    for source in SOURCES:
        for path in sorted((REPO / source).rglob("*")):
            if path.suffix in (".py", ".yaml") and path.is_file():
                stat = path.stat()
                digest.update(f"{path.relative_to(REPO)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    from importlib.metadata import entry_points

    for group in ENTRY_POINT_GROUPS:
        digest.update(repr(sorted((ep.name, ep.value) for ep in entry_points(group=group))).encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    from platformdirs import user_cache_dir

    return Path(os.environ.get("ATTNBENCH_CACHE") or user_cache_dir("attnbench"))


def cache_file() -> Path:
    return cache_root() / f"cli-catalogue-{fingerprint()}.json"


def load() -> dict[str, Any] | None:
    """The cached catalogue, or None where the sources changed since it was written (or it never was)."""
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return None


def _annotation_sources(cls: type) -> dict[str, str] | None:
    """Field -> its annotation as written, when every one can be rebuilt from ANNOTATION_NAMES (else None:
    a plugin with other names in its annotations is checked the slow way)."""
    sources = {f.name: f.type if isinstance(f.type, str) else _source_of(f.type) for f in dataclasses.fields(cls)}
    try:
        for text in sources.values():
            evaluate(text)
    except Exception:  # noqa: BLE001 - any name we cannot rebuild means: no fast check for this class
        return None
    return sources


def _source_of(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)


def evaluate(annotation_source: str) -> Any:
    import annotated_types

    names = {"Annotated": typing.Annotated, "Any": Any, "Optional": typing.Optional, "None": None,
             **{name: getattr(annotated_types, name) for name in ("Ge", "Gt", "Le", "Lt", "Interval")}}
    return eval(annotation_source, names)  # noqa: S307 - our own dataclass annotations, as written in the source


def build() -> dict[str, Any]:
    """Import the registries and write down what the fast paths need."""
    from modules.attention import attention_entry, list_attentions
    from modules.tasks import get_task, list_tasks

    from harness.plan.describe import describe, print_list

    listed = {}
    for what in ("variants", "tasks", "suites"):
        out = io.StringIO()
        with redirect_stdout(out):
            print_list(what)
        listed[what] = out.getvalue()
    tasks, variants = list_tasks(), list_attentions()
    return {
        "tasks": {name: {"preset": get_task(name).preset, "fields": _annotation_sources(get_task(name).Params)} for name in tasks},
        "variants": {name: {"preset": attention_entry(name).preset, "fields": _annotation_sources(attention_entry(name).cls.Config)}
                     for name in variants},
        "list": listed,
        "describe": {name: describe(name) for name in tasks + variants},
    }


def refresh() -> None:
    """Write the catalogue if the current one is missing or stale; called by commands that import the
    registries anyway, so that the next `list`, `describe` or mistyped command is fast."""
    path = cache_file()
    if path.is_file():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(build(), default=str))
        temporary.replace(path)
        for old in path.parent.glob("cli-catalogue-*.json"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:  # a read-only cache folder only costs speed
        pass


def check_run(catalogue: dict[str, Any], task: str, variant: str, params: dict, attention: dict) -> str | None:
    """The one-line problem with `run`/`tune` TASK VARIANT --set ..., as the full planning would word it,
    or None (then planning runs and checks everything else)."""
    from modules.registry import unknown_name_message
    from modules.validation import ConfigError, validate_values

    if task not in catalogue["tasks"]:
        return unknown_name_message("task", task, catalogue["tasks"])
    if variant not in catalogue["variants"]:
        return unknown_name_message("attention variant", variant, catalogue["variants"])
    for owner, noun, entry, values, flag in (
        (f"task {task!r}", "parameter", catalogue["tasks"][task], params, ""),
        (f"attention {variant!r}", "option", catalogue["variants"][variant], attention, "attention."),
    ):
        if entry["fields"] is None:
            continue
        try:
            validate_values({k: evaluate(v) for k, v in entry["fields"].items()},
                            {k: v for k, v in values.items() if v is not None}, owner, noun)
        except ConfigError as exc:
            hint = ""
            if exc.known:
                from harness.plan.describe import set_key_hint

                hint = set_key_hint(exc.key, exc.value, is_attention=bool(flag), task_fields=list(catalogue["tasks"][task]["fields"] or ()),
                                    variant_fields=list(catalogue["variants"][variant]["fields"] or ()))
            return str(exc.at(f"from --set {flag}{exc.key}")) + hint
    return None


# ---- plan snapshots: a suite's plan as data, so that rendering its board needs no torch ----------------------
# Planning a suite resolves every task's parameters and every variant's config through the registries (torch,
# Lightning, PyG: most of the 10 s `attnbench leaderboard` used to take), and the trivial baselines load the
# data. None of it changes unless the sources, the suite file, the tuned parameters or the data root do, so the
# plan's specs, metrics and baselines are written down once, keyed by all of these, and read back as data.

PLAN_FORMAT = 3


@dataclasses.dataclass(frozen=True)
class SnapshotMetric:
    name: str
    higher_is_better: bool = True


@dataclasses.dataclass(frozen=True)
class SnapshotBaseline:
    predictor: str
    metrics: dict
    test_sizes: dict
    note: str


@dataclasses.dataclass
class PlanSnapshot:
    """What the board renderers read from a Plan (harness/report/board.py, csv_table.py), read back from disk."""

    suite: Any
    specs: list
    skipped_tasks: dict
    missing_data: dict
    metrics: dict
    baselines: dict
    data_root: str | None = None

    def trivial_baseline(self, task: str):
        found = self.baselines.get(task)
        return None if found is None else SnapshotBaseline(**found)


def _stat_line(path: Path) -> str:
    stat = path.stat()
    return f"{path} {stat.st_size} {stat.st_mtime_ns}\n"


COMMITTED_PARAMS_DIR = Path(__file__).resolve().parents[2] / "leaderboards" / "params"
"""What planner.COMMITTED_PARAMS names (harness/plan/tuned.py DEFAULT_ROOT in this checkout), without importing the
planner: a suite's `tuned` rows read it when no other folder is given."""


def plan_snapshot_file(suite_file: Path, data_root: str | None, tuned_dir: str | Path | None) -> Path:
    digest = hashlib.sha256(f"{PLAN_FORMAT} {fingerprint()} {data_root}\n".encode())
    digest.update(suite_file.read_bytes())
    if data_root and Path(data_root).is_dir():
        # which data is present decides the skipped optional tasks and the baselines: adding or replacing a
        # data set's folder changes its own or its parent's modification time
        root = Path(data_root)
        for path in [root, *sorted(root.iterdir())]:
            digest.update(_stat_line(path).encode())
    # the tuned parameters decide the "(tuned)" rows: those of --params-dir, or else the committed ones, which a
    # suite's `tuned` list reads (a snapshot keyed without them kept planning no CiteSeer row after its promote)
    digest.update(b"tuned\n" if tuned_dir is not None else b"committed\n")
    for path in sorted(Path(tuned_dir if tuned_dir is not None else COMMITTED_PARAMS_DIR).rglob("*.yaml")):
        digest.update(_stat_line(path).encode())
    return cache_root() / "plans" / f"{suite_file.stem}-{digest.hexdigest()[:20]}.json"


def _task_entry(data: dict):
    from harness.plan.suite import TaskEntry

    seeds = data.get("seeds")
    return TaskEntry(**{**data, "seeds": None if seeds is None else tuple(seeds)})


def load_plan(path: Path) -> PlanSnapshot | None:
    """The snapshot at `path`, or None where there is none (or it does not parse: it is then rebuilt)."""
    from harness.plan.spec import RunSpec
    from harness.plan.suite import Suite, VariantEntry

    try:
        data = json.loads(path.read_text())
        # the variant entries as written (name, label, options: what a board says of a labelled row), not resolved
        variants = tuple(VariantEntry(v["name"], v["config"], v["label"]) for v in data["suite"]["variants"])
        suite = Suite(**{**data["suite"], "path": Path(data["suite"]["path"]), "tasks": tuple(_task_entry(t) for t in data["suite"]["tasks"]),
                         "variants": variants, "seeds": tuple(data["suite"]["seeds"])})
        return PlanSnapshot(suite, [RunSpec.from_dict(s) for s in data["specs"]], data["skipped_tasks"], data["missing_data"],
                            {task: tuple(SnapshotMetric(**m) for m in metrics) for task, metrics in data["metrics"].items()},
                            data["baselines"], data.get("data_root"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_plan(the_plan, path: Path) -> None:
    """Write `the_plan` (harness.plan.planner.Plan) with its trivial baselines computed now; nothing when a
    baseline's data does not load."""
    from datamodules.paths import MissingDataError

    baselines = {}
    for task in the_plan.metrics:
        try:
            if task in the_plan.missing_data:  # the same case as a baseline that does not load: it may load next time
                raise MissingDataError(the_plan.missing_data[task])
            found = the_plan.trivial_baseline(task)
        except MissingDataError:
            # data that could not be loaded now (offline, no data root) may load next time: a snapshot
            # without its baseline would hide it from every later board, so none is kept (one written
            # earlier for this plan, e.g. while planning, is removed too)
            path.unlink(missing_ok=True)
            return
        baselines[task] = None if found is None else {"predictor": found.predictor, "metrics": dict(found.metrics),
                                                      "test_sizes": dict(found.test_sizes), "note": found.note}
    suite = the_plan.suite
    data = {
        "suite": {"name": suite.name, "path": str(suite.path), "description": suite.description, "params": dict(suite.params),
                  "seeds": list(suite.seeds), "tasks": [dataclasses.asdict(t) for t in suite.tasks],
                  "variants": [{"name": v.name, "config": dict(v.config), "label": v.label} for v in suite.variants]},
        "specs": [s.to_dict() for s in the_plan.specs],
        "skipped_tasks": dict(the_plan.skipped_tasks),
        "missing_data": dict(the_plan.missing_data),
        "metrics": {task: [{"name": m.name, "higher_is_better": m.higher_is_better} for m in metrics] for task, metrics in the_plan.metrics.items()},
        "baselines": baselines,
        "data_root": the_plan.data_root,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(data, default=str))
        temporary.replace(path)
    except OSError:  # a read-only cache folder only costs speed
        pass


# ---- run keys of command lines: a finished `run` answers without planning ----------------------------------
# `attnbench run TASK VARIANT --set ...` resolves its spec through the registries (torch) only to find, for a
# run already recorded, that there is nothing to do. The key each command line resolved to is written down,
# keyed like the catalogue by the sources (any change plans afresh), so that a re-run reads its record at once.

def _command_line_ident(task: str, variant: str, seed: int, params: dict, attention: dict, precision: str) -> str:
    blob = json.dumps([fingerprint(), task, variant, seed, params, attention, precision], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _run_keys_file() -> Path:
    return cache_root() / "run-keys.json"


def known_run_key(task: str, variant: str, seed: int, params: dict, attention: dict, precision: str) -> str | None:
    """The run key this command line resolved to when it was last planned with these sources, or None."""
    try:
        known = json.loads(_run_keys_file().read_text())
    except (OSError, ValueError):
        return None
    found = known.get(_command_line_ident(task, variant, seed, params, attention, precision)) if isinstance(known, dict) else None
    return found if isinstance(found, str) else None


def remember_run_key(task: str, variant: str, seed: int, params: dict, attention: dict, precision: str, key: str) -> None:
    try:
        known = json.loads(_run_keys_file().read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    known[_command_line_ident(task, variant, seed, params, attention, precision)] = key
    try:
        path = _run_keys_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(dict(list(known.items())[-10_000:])))  # the newest 10,000 command lines
        temporary.replace(path)
    except OSError:  # a read-only cache folder only costs speed
        pass
