"""`attnbench describe TASK|VARIANT`: every parameter a task or a variant takes, with its type, declared
range, default (per host where a variant's defaults differ) and source, i.e. the field's docstring.

Python keeps no docstring of a dataclass field at run time, so they are read from the class's source with
`ast` (a string statement right after the field's annotated assignment, the convention of this project)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from modules.validation import field_annotations, split_type


@dataclass(frozen=True)
class ParameterInfo:
    name: str
    type: str
    range: str
    defaults: dict[str, Any]
    """Host (representative site label) -> default; one entry "" when every host has the same."""
    doc: str


@functools.lru_cache(maxsize=None)
def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # a class built at run time has no source to read
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for statement, following in zip(body, body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring, the most derived class's where a subclass documents it again."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        docs.update(_own_field_docs(klass))
    return docs


def _grouped(per_site: dict[str, Any]) -> dict[str, Any]:
    """Sites with equal defaults joined ("graph self, text self": 1.0); one "" entry when all agree."""
    values: dict[str, list[str]] = {}
    for site, value in per_site.items():
        values.setdefault(repr(value), []).append(site)
    if len(values) == 1:
        return {"": next(iter(per_site.values()))}
    return {", ".join(sites): per_site[sites[0]] for sites in values.values()}


def describe_task(name: str) -> tuple[str, list[ParameterInfo]]:
    from modules.tasks import get_task

    task = get_task(name)
    params_cls = task.Params
    docs, annotations = field_docs(params_cls), field_annotations(params_cls)
    rows = []
    for f in dataclasses.fields(params_cls):
        default = task.preset.get(f.name, f.default)
        type_text, range_text = split_type(annotations[f.name])
        doc = docs.get(f.name, "")
        if f.name in task.preset:
            doc = f"fixed by the task name ({name}). " + doc
        rows.append(ParameterInfo(f.name, type_text, range_text, {"": default}, doc))
    metrics = ", ".join(m.name for m in task.metrics)
    batching = ("seeds: several seeds of one configuration train as one seed-batched model (bench, run --seeds; "
                "--no-seed-batch runs each alone)" if task.seed_batching is None else f"seeds: one process per seed ({task.seed_batching})")
    from modules.registry import keyed_version
    from modules.tasks import Task

    # the version run keys record: a plugin task's own plus its source hash, so that an edit shows here
    version = keyed_version(type(task), Task)
    return f"task {name} ({type(task).__name__}, version {version}); metrics: {metrics}\n{batching}", rows


def describe_variant(name: str) -> tuple[str, list[ParameterInfo]]:
    from modules.attention import attention_entry
    from modules.attention.registry import describe_defaults

    entry = attention_entry(name)
    config_cls = entry.cls.Config
    docs, annotations = field_docs(config_cls), field_annotations(config_cls)
    per_site = describe_defaults(name)
    rows = []
    for f in dataclasses.fields(config_cls):
        type_text, range_text = split_type(annotations[f.name])
        doc = docs.get(f.name, "")
        if f.name in entry.preset:
            doc = f"fixed by the variant name ({name}). " + doc
        # Named as `--set` and a suite file spell it, so that what describe shows can be pasted as it is.
        rows.append(ParameterInfo(f"{SET_PREFIX}{f.name}", type_text, range_text,
                                  _grouped({site: c[f.name] for site, c in per_site.items()}), doc))
    return f"variant {name}: {entry.summary} ({entry.cls.__name__}, version {entry.version})", rows


SET_PREFIX = "attention."
"""How a variant's option is named everywhere a user writes one: `--set attention.alpha=2`, a suite's
`attention.alpha: 2` (or an `attention:` block), and the rows of `describe`."""


def set_key_hint(key: str, value: Any, *, is_attention: bool, task_fields, variant_fields) -> str:
    """' Did you mean ...?' for a `--set` key the task (or, with `attention.`, the variant) does not have: the
    other owner's key of that name first (`--set alpha=2` on a variant with `alpha`), else the closest names."""
    import difflib

    shown = value if isinstance(value, str) else yaml_text(value)
    if not is_attention and key in variant_fields:
        return f". Did you mean --set {SET_PREFIX}{key}={shown}?"
    if is_attention and key in task_fields:
        return f". Did you mean --set {key}={shown}? ({key} is a task parameter)"
    own = variant_fields if is_attention else task_fields
    prefix = SET_PREFIX if is_attention else ""
    close = difflib.get_close_matches(key, list(own), n=3, cutoff=0.6)
    return f". Did you mean {' or '.join(f'--set {prefix}{c}={shown}' for c in close)}?" if close else ""


def yaml_text(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def describe(name: str) -> str:
    """The text `attnbench describe NAME` prints; an unknown name raises UnknownNameError with the closest
    task and variant names."""
    from modules.attention import list_attentions
    from modules.registry import UnknownNameError
    from modules.tasks import list_tasks

    tasks, variants = list_tasks(), list_attentions()
    if name in tasks:
        title, rows = describe_task(name)
    elif name in variants:
        title, rows = describe_variant(name)
    else:
        raise UnknownNameError(unknown_task_or_variant(name, tasks + variants))
    return format_parameters(title, rows)


def unknown_task_or_variant(name: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown task or variant {name!r}.{hint} (`attnbench list` shows them.)"


def format_parameters(title: str, rows: list[ParameterInfo]) -> str:
    if not rows:
        return f"{title}\n  (no parameters)"
    width = max(len(r.name) for r in rows)
    variant = rows[0].name.startswith(SET_PREFIX)
    how = ("--set attention.KEY=VALUE on the command line; `attention.KEY: VALUE` in a suite's variant entry" if variant
           else "--set KEY=VALUE on the command line; `KEY: VALUE` under a suite's `params:`")
    lines = [title, f"  ({how})", ""]
    for row in rows:
        kind = row.type + (f", {row.range}" if row.range else "")
        if list(row.defaults) == [""]:
            lines.append(f"  {row.name:<{width}}  {kind}; default {row.defaults['']!r}")
        else:
            lines.append(f"  {row.name:<{width}}  {kind}; default per host:")
            lines += [f"  {'':<{width}}    {site}: {value!r}" for site, value in row.defaults.items()]
        for text in textwrap.wrap(row.doc, 100):
            lines.append(f"  {'':<{width}}    {text}")
    return "\n".join(lines)


TASK_MODULE_HOSTS = {"planetoid": "graph", "text": "text", "vqa": "vision-language", "captioning": "vision-language"}
"""A built-in task's module -> the host domain its model builds (a Task does not declare its sites: its model
does, when built, which would load the data). A plugin task gets every representative site."""


def task_sites(task) -> dict[str, Any]:
    """Label -> AttentionSite of the representative sites a task's model has (modules/attention/registry.py)."""
    from modules.attention.registry import REPRESENTATIVE_SITES

    module = type(task).__module__
    domain = TASK_MODULE_HOSTS.get(module.rsplit(".", 1)[-1]) if module.startswith("modules.tasks.") else None
    return {label: site for label, site in REPRESENTATIVE_SITES.items() if domain is None or site.host == domain}


def print_list(what: str) -> None:
    """`attnbench list`: variants with their summaries and presets, tasks with their metrics, suites with their sizes."""
    from harness.plan.suite import list_suites, load_suite
    from modules.attention import attention_entry, list_attentions
    from modules.tasks import get_task, list_tasks

    if what in ("variants", "all"):
        rows = []
        for name in list_attentions():
            entry = attention_entry(name)
            preset = ", ".join(f"{k}={v}" for k, v in entry.preset.items())
            rows.append((name, f"{entry.summary}{f' [{preset}]' if preset else ''}"))
        print_section("variants", rows)
    if what in ("tasks", "all"):
        print_section("tasks", [(name, f"metrics: {', '.join(m.name for m in get_task(name).metrics)}") for name in list_tasks()])
    if what in ("suites", "all"):
        rows = []
        for name in list_suites():
            suite = load_suite(name)
            rows.append((name, f"{len(suite.tasks)} tasks x {len(suite.variants)} variants x {suite.seed_counts()}"))
        print_section("suites", rows)


LIST_WIDTH = 110
"""`list` wraps at a fixed width, not the terminal's: its text is cached once in the CLI catalogue."""


def print_section(title: str, rows: list[tuple[str, str]]) -> None:
    """Names in a column as wide as the longest, texts wrapped at word boundaries under their own column."""
    print(f"{title}:")
    column = 2 + max((len(name) for name, _ in rows), default=0) + 2
    for name, text in rows:
        print(textwrap.fill(text, LIST_WIDTH, initial_indent=f"  {name}".ljust(column), subsequent_indent=" " * column,
                            break_long_words=False, break_on_hyphens=False))
