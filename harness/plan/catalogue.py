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


def cache_file() -> Path:
    from platformdirs import user_cache_dir

    root = Path(os.environ.get("ATTNBENCH_CACHE") or user_cache_dir("attnbench"))
    return root / f"cli-catalogue-{fingerprint()}.json"


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
