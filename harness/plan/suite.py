"""Suite files: the YAML a user writes -> a validated `Suite` (planner.py turns it into RunSpecs).

```yaml
name: quick
description: every variant on Cora and CiteSeer
tasks:                      # names, or {name, params, optional, seeds}
  - cora
  - {name: citeseer, seeds: 32}      # this task's own seeds (a count or a list) instead of the suite's
  - {name: pubmed, optional: true}   # skipped (and reported) when its data is absent
variants: all               # or a list: names, or {name, label, attention: {<option>: value}}, or `all` among them
                            #   (`attention.<option>: value` is the same; `attnbench describe VARIANT` lists them)
seeds: 3                    # or an explicit list [0, 1, 2]
params: {max_epochs: 300}   # task parameters for every task (per-task params override them)
tuned: [bam-weibull]        # these variants also run as "<name> (tuned)" rows, from the committed tuned parameters
seed_history:               # the seed counts as declared, oldest first: when a count grew and why (the claims board
  - {seeds: 3, declared: 2026-11-22, why: "..."}                   # judges on the first declared seeds too)
  - {task: citeseer, seeds: 32, declared: 2026-11-24, at: "2026-11-24T20:24:01+00:00", why: "..."}
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from modules.registry import UnknownNameError, unknown_name_message

if TYPE_CHECKING:
    from harness.plan.spec import ResolvedAttention

# The registries (modules.attention, modules.tasks, harness.plan.spec) import torch: they are imported in
# load_suite, so that `suite_path` answers a mistyped suite name at once (`attnbench bench --suite quik`).

BUILTIN_SUITES = Path(__file__).parents[1] / "suites"
TOP_LEVEL_KEYS = {"name", "description", "tasks", "variants", "exclude_variants", "seeds", "params", "tuned", "seed_history"}
SEED_HISTORY_KEYS = {"seeds", "task", "declared", "commit", "why", "at", "after_first_seeds"}
"""`at`: the moment of the declaration (an ISO time, e.g. its commit's), which harness/report/seed_history.py checks
the records' finish times against (else the end of the `declared` day); `after_first_seeds: true`: the entry asserts
that every row's first seeds of the previous count had finished, which that check flags where the records disagree."""


class SuiteError(ValueError):
    """A malformed suite file: the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class TaskEntry:
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    optional: bool = False
    seeds: tuple[int, ...] | None = None
    """This task's seeds where they differ from the suite's: a noisier task needs more to resolve the same gap."""


@dataclass(frozen=True)
class VariantEntry:
    name: str
    config: Mapping[str, Any] = field(default_factory=dict)
    """As written in the suite."""
    label: str = ""
    resolved: ResolvedAttention | None = None
    """The full config, resolved once when the suite is loaded (None only for entries built by hand)."""


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    description: str
    tasks: tuple[TaskEntry, ...]
    variants: tuple[VariantEntry, ...]
    seeds: tuple[int, ...]
    params: Mapping[str, Any]
    tuned: tuple[str, ...] = ()
    """Variants that also run with their committed tuned parameters (leaderboards/params), as "<name> (tuned)" rows:
    the suite, not a command-line flag, says which rows its board and its claims stand on."""
    seed_history: tuple[Mapping[str, Any], ...] = ()
    """The seed counts as they were declared, oldest first ({seeds, task?, declared, commit?, why}); the last entry
    of the suite and of each task is what the suite runs now."""

    def seeds_of(self, task: TaskEntry) -> tuple[int, ...]:
        return task.seeds if task.seeds is not None else self.seeds

    def all_seeds(self) -> tuple[int, ...]:
        return tuple(sorted({seed for task in self.tasks for seed in self.seeds_of(task)} or self.seeds))

    def seed_counts(self) -> str:
        """'20 seeds', or '20 seeds (citeseer 32)' where a task has its own."""
        own = ", ".join(f"{t.name} {len(t.seeds)}" for t in self.tasks if t.seeds is not None and t.seeds != self.seeds)
        return f"{len(self.seeds)} seeds{f' ({own})' if own else ''}"


def did_you_mean(word: Any, choices) -> str:
    """" Did you mean 'x'?" for a misspelt key or name in a suite file; "" when nothing is close."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=2, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _keys_hint(unknown, allowed) -> str:
    return "".join(did_you_mean(key, allowed) for key in sorted(map(str, unknown)))


def _value_error(exc: ValueError) -> str:
    """A misspelt option or parameter key (modules.validation.ConfigError lists the known ones) with the closest."""
    known = getattr(exc, "known", ())
    return f"{exc}.{did_you_mean(exc.key, known)}" if known and did_you_mean(exc.key, known) else str(exc)


def list_suites() -> list[str]:
    return sorted(p.stem for p in BUILTIN_SUITES.glob("*.yaml"))


def suite_path(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate.resolve()
    builtin = BUILTIN_SUITES / f"{name_or_path}.yaml"
    if builtin.is_file():
        return builtin
    if candidate.suffix in (".yaml", ".yml") or len(candidate.parts) > 1:
        # a path, not a name: the built-in names are no help, where the file was looked for is
        where = candidate.expanduser().resolve()
        raise SuiteError(f"no suite file {where}" + (" (it is a folder)" if where.is_dir() else "")
                         + f"; built-in suites: {', '.join(list_suites())}")
    import difflib

    close = difflib.get_close_matches(name_or_path, list_suites(), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise SuiteError(
        f"unknown suite {name_or_path!r}.{hint} Built-in suites: {', '.join(list_suites())}; "
        "or pass the path of a .yaml suite file."
    )


TASK_ENTRY_KEYS = ("name", "params", "optional", "seeds")


def read_suite_file(path: Path) -> dict[str, Any]:
    """The suite file's YAML, checked for what needs no registry: valid YAML, a mapping, known and required keys,
    task entries' keys, the seeds, `params` a mapping. It imports neither torch nor the registries, so that a
    malformed file is answered before they load (the command line checks it first, harness/commands/arguments.py
    early_problem); load_suite then checks names and values against the registries."""
    where = f"suite file {path}"
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SuiteError(f"{where} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SuiteError(f"{where} must be a mapping with keys tasks, variants, seeds (see harness/plan/suite.py)")
    unknown = set(data) - TOP_LEVEL_KEYS
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {sorted(map(str, unknown))}; allowed keys are {sorted(TOP_LEVEL_KEYS)}."
                         f"{_keys_hint(unknown, TOP_LEVEL_KEYS)}")
    for required in ("tasks", "variants", "seeds"):
        if required not in data:
            raise SuiteError(f"{where}: missing {required!r}")
    for i, item in enumerate(_as_list(data["tasks"], f"{where}: tasks")):
        _task_entry_shape(item, f"{where}: tasks[{i}]")
    if data["variants"] != "all":
        for i, item in enumerate(_as_list(data["variants"], f"{where}: variants")):
            if item != "all" and not (isinstance(item, str) or (isinstance(item, dict) and "name" in item)):
                raise SuiteError(f"{where}: variants[{i}] must be a variant name or a mapping with 'name' (plus 'label' and config fields)")
    _seeds(data["seeds"], f"{where}: seeds")
    if not isinstance(data.get("params") or {}, dict):
        raise SuiteError(f"{where}: params must be a mapping of task parameter -> value")
    return data


def load_suite(name_or_path: str) -> Suite:
    from modules.attention import list_attentions

    from harness.plan.spec import resolve_attention

    path = suite_path(name_or_path)
    where = f"suite file {path}"
    data = read_suite_file(path)

    tasks = tuple(_task_entry(t, f"{where}: tasks[{i}]") for i, t in enumerate(_as_list(data["tasks"], f"{where}: tasks")))
    excluded = set(_as_list(data.get("exclude_variants", []), f"{where}: exclude_variants"))
    registered = list_attentions()
    for name in sorted(excluded - set(registered), key=str):
        # a misspelt exclusion would otherwise silently keep the variant it meant
        raise SuiteError(f"{where}: exclude_variants: {unknown_name_message('attention variant', name, registered)}")
    # "all" (alone, or as an item of the list) is every registered variant at its defaults, plugins included;
    # other items add rows, e.g. one variant again at a paper's setting under its own label.
    entries = ["all"] if data["variants"] == "all" else _as_list(data["variants"], f"{where}: variants")
    variants: list[VariantEntry] = []
    for i, item in enumerate(entries):
        if item == "all":
            variants += [VariantEntry(n, resolved=resolve_attention(n)) for n in list_attentions() if n not in excluded]
        else:
            variants.append(_variant_entry(item, f"{where}: variants[{i}]"))
    variants = tuple(variants)
    seeds = _seeds(data["seeds"], f"{where}: seeds")
    params = data.get("params") or {}
    if not isinstance(params, dict):
        raise SuiteError(f"{where}: params must be a mapping of task parameter -> value")
    from modules.tasks import get_task

    for task in tasks:
        try:
            get_task(task.name).params({**params, **task.params})
        except ValueError as exc:
            raise SuiteError(f"{where}: params (for task {task.name}): {_value_error(exc)}") from exc
    labels = [v.label or v.name for v in variants]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise SuiteError(f"{where}: variants {duplicates} appear more than once; give each configuration its own `label`")
    tuned = tuple(_as_list(data.get("tuned", []), f"{where}: tuned"))
    for name in tuned:
        if name not in {v.name for v in variants}:
            raise SuiteError(f"{where}: tuned: {name!r} is not one of the suite's variants.{did_you_mean(name, [v.name for v in variants])}")
    history = _seed_history(data.get("seed_history", []), where, seeds, tasks)
    return Suite(
        name=str(data.get("name") or path.stem),
        path=path,
        description=str(data.get("description", "")),
        tasks=tasks,
        variants=variants,
        seeds=seeds,
        params=params,
        tuned=tuned,
        seed_history=history,
    )


def _seed_history(value: Any, where: str, seeds: tuple[int, ...], tasks: tuple[TaskEntry, ...]) -> tuple[Mapping[str, Any], ...]:
    """The declared seed counts, checked against what the suite runs: a history whose last count is not the running
    one would date a verdict's seeds wrongly."""
    entries = _as_list(value, f"{where}: seed_history")
    names = {t.name: t for t in tasks}
    for i, entry in enumerate(entries):
        at = f"{where}: seed_history[{i}]"
        if not isinstance(entry, dict) or not {"seeds", "declared", "why"} <= set(entry):
            raise SuiteError(f"{at} must be a mapping with seeds, declared (a date) and why (and optional task, commit)")
        unknown = set(entry) - SEED_HISTORY_KEYS
        if unknown:
            raise SuiteError(f"{at}: unknown key(s) {sorted(unknown)}; allowed: {sorted(SEED_HISTORY_KEYS)}.{_keys_hint(unknown, SEED_HISTORY_KEYS)}")
        if not isinstance(entry["seeds"], int) or isinstance(entry["seeds"], bool) or entry["seeds"] < 1:
            raise SuiteError(f"{at}: seeds must be a positive count, got {entry['seeds']!r}")
        if "at" in entry:
            try:
                datetime.fromisoformat(str(entry["at"]))
            except ValueError:
                raise SuiteError(f"{at}: at must be an ISO time such as 2026-11-24T20:24:01+00:00, got {entry['at']!r}") from None
        if "after_first_seeds" in entry and not isinstance(entry["after_first_seeds"], bool):
            raise SuiteError(f"{at}: after_first_seeds must be true or false, got {entry['after_first_seeds']!r}")
        if "task" in entry and entry["task"] not in names:
            raise SuiteError(f"{at}: task {entry['task']!r} is not one of the suite's tasks.{did_you_mean(entry['task'], names)}")
    for task in (None, *names):
        mine = [e["seeds"] for e in entries if e.get("task") == task]
        running = len(seeds) if task is None or names[task].seeds is None else len(names[task].seeds)
        if mine and mine[-1] != running:
            raise SuiteError(f"{where}: seed_history: the last count declared for {task or 'the suite'} is {mine[-1]}, but it runs "
                             f"{running} seeds; add an entry saying when and why the count changed")
    return tuple(dict(entry) for entry in entries)


def _as_list(value: Any, where: str) -> list:
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        return [value]
    raise SuiteError(f"{where} must be a list")


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return tuple(range(value))
    if isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
        return tuple(value)
    raise SuiteError(f"{where} must be a positive integer (a count) or a non-empty list of integers >= 0, got {value!r}")


def _task_entry_shape(item: Any, where: str) -> dict:
    """A task entry as a mapping, its keys and seeds checked (no registry needed)."""
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict) or "name" not in item:
        raise SuiteError(f"{where} must be a task name or a mapping with 'name' (and optional 'params', 'optional', 'seeds')")
    unknown = set(item) - set(TASK_ENTRY_KEYS)
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {sorted(map(str, unknown))}; a task entry has name, params, optional, seeds."
                         f"{_keys_hint(unknown, TASK_ENTRY_KEYS)}")
    if "seeds" in item:
        _seeds(item["seeds"], f"{where}: seeds")
    return item


def _task_entry(item: Any, where: str) -> TaskEntry:
    item = _task_entry_shape(item, where)
    seeds = _seeds(item["seeds"], f"{where}: seeds") if "seeds" in item else None
    from modules.tasks import get_task

    try:
        task = get_task(item["name"])
        task.params({**(item.get("params") or {})})
    except UnknownNameError as exc:
        raise SuiteError(f"{where}: {exc}") from exc
    except ValueError as exc:
        raise SuiteError(f"{where}: {_value_error(exc)}") from exc
    return TaskEntry(item["name"], dict(item.get("params") or {}), bool(item.get("optional", False)), seeds)


def _variant_entry(item: Any, where: str) -> VariantEntry:
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict) or "name" not in item:
        raise SuiteError(f"{where} must be a variant name or a mapping with 'name' (plus 'label' and config fields)")
    from harness.plan.spec import resolve_attention

    item = dict(item)
    name, label = item.pop("name"), str(item.pop("label", "") or "")
    item = _variant_options(item, where)
    try:
        resolved = resolve_attention({"name": name, **item})
    except (UnknownNameError, ValueError, TypeError) as exc:
        raise SuiteError(f"{where}: {_value_error(exc) if isinstance(exc, ValueError) else exc}") from exc
    return VariantEntry(name, item, label, resolved)



def _variant_options(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A variant entry's options spelled as on the command line (`attention.alpha: 1.5`), as a nested
    `attention:` block, or flat (`alpha: 1.5`, the older form the built-in suites use) -> option -> value."""
    options: dict[str, Any] = {}

    def put(key: str, value: Any, spelling: str) -> None:
        if key in options:
            raise SuiteError(f"{where}: option {key!r} is given twice (as {spelling} and before); keep one")
        options[key] = value

    block = item.get("attention")
    if block is not None and not isinstance(block, dict):
        raise SuiteError(f"{where}: `attention:` must be a mapping of option -> value, e.g. attention: {{alpha: 1.5}}")
    for key, value in (block or {}).items():
        put(str(key), value, f"attention: {{{key}: ...}}")
    for key, value in item.items():
        if key == "attention":
            continue
        if isinstance(key, str) and key.startswith("attention."):
            put(key.removeprefix("attention."), value, key)
        else:
            put(key, value, key)
    return options
