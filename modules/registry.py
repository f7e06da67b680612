"""Name -> object registries shared by attention variants and tasks.

Both need the same things: duplicate names rejected, a "did you mean" on typos, and out-of-tree plugins
found through an entry-point group or a plugin file, so that adding a variant or a task never means
editing harness code.
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import functools
import hashlib
import importlib.util
import inspect
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """An unknown variant or task name; the message suggests the closest registered names."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


class DuplicateNameError(ValueError):
    pass


class PluginError(RuntimeError):
    pass


_loaded_plugin_files: set[Path] = set()

BUILTIN_ROOT = Path(__file__).resolve().parent
"""attnbench's own modules: a class defined under it is built in and keys runs by its explicit `version`."""


class _WithoutDocstrings(ast.NodeTransformer):
    """Drops string statements (docstrings, field docstrings): they do not change what a run computes."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and all(isinstance(n, ast.stmt) for n in body):
            kept = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str))]
            node.body = kept or [ast.Pass()]
        return node


def source_files(cls: type, stop: type) -> list[Path]:
    """The files defining `cls` and each base class of it below `stop` (the interface every variant or task
    implements), in MRO order: the code that makes the class what it is."""
    files: list[Path] = []
    for klass in cls.__mro__:
        if klass is stop or klass is object:
            break
        try:
            found = inspect.getsourcefile(klass)
        except TypeError:  # built at run time or in a C extension: no file to read
            continue
        if found and Path(found).resolve() not in files:
            files.append(Path(found).resolve())
    return files


@functools.lru_cache(maxsize=None)
def source_digest(cls: type, stop: type) -> str | None:
    """A hash of the code in `source_files(cls, stop)`, normalised through the AST so that comments, blank
    lines, formatting and docstrings do not count; None when no source file can be found (a class made in an
    interactive session)."""
    files = source_files(cls, stop)
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        text = file.read_text()
        try:
            # unparse rather than dump: its text is the same across Python versions, whose AST fields differ
            normal = ast.unparse(_WithoutDocstrings().visit(ast.parse(text)))
        except SyntaxError:
            normal = text
        digest.update(normal.encode())
    return digest.hexdigest()[:12]


def is_builtin(cls: type) -> bool:
    try:
        found = inspect.getsourcefile(cls)
    except TypeError:
        return False
    return found is not None and Path(found).resolve().is_relative_to(BUILTIN_ROOT)


def keyed_version(cls: type, stop: type) -> str:
    """The version that goes into run keys (and study names). A built-in's explicit `version`: bumping it is
    part of changing its code, which tests/attention/test_versions.py holds every built-in variant to. A
    plugin's `version` plus a hash of its source, because plugin authors edit and re-run without bumping, and
    an edited plugin must never be answered with "already finished" from its old code's records: the edit
    gives new keys, so its runs run again (a comment or docstring edit does not)."""
    if is_builtin(cls):
        return cls.version  # as it is: the keys of committed records hash it
    digest = source_digest(cls, stop)
    return f"{cls.version}+source.{digest}" if digest else str(cls.version)


def load_plugin_file(path: str | Path) -> None:
    """Import a plugin file once; its @register_* decorators register what it defines."""
    file = Path(path).expanduser().resolve()
    if file in _loaded_plugin_files:
        return
    if not file.is_file():
        raise PluginError(f"plugin file {file} does not exist; pass --plugin with the path to a .py file")
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:8]
    module_name = f"attnbench_plugin_{file.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise PluginError(f"cannot import plugin file {file}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    _loaded_plugin_files.add(file)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        _loaded_plugin_files.discard(file)
        sys.modules.pop(module_name, None)
        raise PluginError(f"plugin file {file} failed to import: {type(exc).__name__}: {exc}") from exc


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._items: dict[str, T] = {}
        self._entry_points_loaded = False

    def register(self, name: str, item: T) -> T:
        if name in self._items:
            raise DuplicateNameError(
                f"{self.kind} name {name!r} is already registered (by {_origin(self._items[name])}); "
                "pick another name for the new one"
            )
        self._items[name] = item
        return item

    def _load_entry_points(self) -> None:
        # Lazy: entry points are only imported when a name is asked for or listed, so a broken
        # third-party plugin cannot slow down or break commands that never use it.
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            try:
                ep.load()
            except Exception as exc:
                raise PluginError(
                    f"{self.kind} plugin {ep.name!r} ({ep.value}) from entry-point group "
                    f"{self.entry_point_group!r} failed to import: {type(exc).__name__}: {exc}"
                ) from exc

    def get(self, name: str) -> T:
        if name not in self._items:
            self._load_entry_points()
        if name not in self._items:
            raise UnknownNameError(unknown_name_message(self.kind, name, self._items))
        return self._items[name]

    def names(self, pattern: str | None = None) -> list[str]:
        self._load_entry_points()
        names = sorted(self._items)
        return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]

    def __contains__(self, name: str) -> bool:
        self._load_entry_points()
        return name in self._items

    def unregister(self, name: str) -> None:
        """For tests that register throw-away items."""
        self._items.pop(name, None)


def _origin(item: object) -> str:
    target = getattr(item, "cls", item)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def unknown_name_message(kind: str, name: str, known) -> str:
    """The one wording of an unknown name, also used by the CLI's cached catalogue (harness/plan/catalogue.py)."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return (f"unknown {kind} {name!r}.{hint} Known: {', '.join(sorted(known))}. "
            f"(`attnbench list` shows them; plugins load with --plugin FILE.py.)")
