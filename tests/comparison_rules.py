"""The suite's two rules for comparisons that hold on one machine only (issue 50), as a scanner over test sources.
tests/test_comparison_rules.py applies it to every file under tests/.

1. Stored floats are compared with a tolerance. A fixture made on one CPU (an Intel Xeon) and read on another (an
   AMD EPYC) went through other BLAS kernels, whose float32 summation order differs: MiniLM's hidden states moved by
   up to 3.3e-6, and an `atol=1e-6, rtol=0` comparison failed on every AMD run. So a comparison against data a test
   loaded from a file is flagged when it is bit for bit (`torch.equal`, `np.array_equal`, `assert_array_equal`, an
   `==` on a loaded tensor or array) or has `rtol=0`, unless the line (or the line above it) carries

       # exact by construction: <why both sides come from the same code on this machine>

   Comparisons against stored floats go through `tests.stored.assert_close_to_stored`, which states the tolerance.
2. No timed value decides a test. Profiler milliseconds and wall times round to zero, or grow, when the machine is
   busy: `cpu_ms > 0` of a profiled `aten::addmm` failed under load. An assert whose test reads a value named as a
   time (`*_ms`, `*_s` of a clock, `elapsed`, `duration`, `wall_time*`, ...) or computed from `time.perf_counter()`
   and its kin is flagged, unless marked

       # timing is not asserted: <why the value cannot decide the outcome by its size>

   (e.g. a field that must merely be present).

What counts as loaded: a name bound to `torch.load`, `np.load`/`loadtxt`/`fromfile`, `pickle.load`, safetensors'
`load_file`, `json.load(s)`, `pd.read_csv`, `Path.read_bytes`/`read_text`, and names bound to subscripts, attributes
or method calls of such a name (`pair["x"].view(...)`). A value computed by passing loaded data to a function is
not loaded: it was computed on this machine. Tensor and array loads are float fixtures for `==` as well;
JSON and text loads only for the float comparison functions.

Why an AST scan and not a review checklist: the same class of failure came back within days of issue 38's fix."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

EXACT_MARK = "# exact by construction:"
TIMING_MARK = "# timing is not asserted:"

ARRAY_LOADS = {"torch.load", "np.load", "numpy.load", "np.loadtxt", "numpy.loadtxt", "np.fromfile", "numpy.fromfile",
               "pickle.load", "pickle.loads", "load_file", "safetensors.torch.load_file"}
"""Calls whose result is a stored tensor or array: any exact comparison with it is a float comparison."""
OTHER_LOADS = {"json.load", "json.loads", "pd.read_csv", "pandas.read_csv", "read_bytes", "read_text"}
"""Calls whose result may hold stored floats among other things: flagged in the float comparison functions only."""
EXACT_FUNCTIONS = {"equal", "array_equal", "assert_array_equal", "assert_equal"}
TOLERANCE_FUNCTIONS = {"assert_close", "assert_allclose", "allclose", "isclose", "assert_array_almost_equal"}
CLOCKS = {"time.perf_counter", "time.time", "time.monotonic", "time.process_time", "perf_counter", "monotonic",
          "time.perf_counter_ns", "time.monotonic_ns"}
TIMED_NAME = re.compile(r"(^|_)(ms|us|ns|elapsed|duration|seconds|secs|wall|walltime|wall_time|latency)($|_)|"
                        r"(^|_)(time|wall|fit|epoch|cpu|run|step|render|startup)_(s|ms)$|^(seconds|elapsed|duration)")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.text}"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    return ""


def _call_name(call: ast.Call) -> str:
    """`torch.testing.assert_close` -> 'torch.testing.assert_close'; `path.read_text()` -> 'read_text'."""
    name = _dotted(call.func)
    if not name and isinstance(call.func, ast.Attribute):
        return call.func.attr
    return name


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _root(node: ast.AST) -> ast.AST:
    """The value a chain of subscripts, attributes and method calls starts from: `a["x"].view(1).double()` -> a."""
    while True:
        if isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return node


def _load_kind(node: ast.AST) -> str | None:
    """'array' or 'other' where `node` is a load call or a chain over one (`torch.load(p)["x"].view(1)`), else None."""
    while True:
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in ARRAY_LOADS or _short(name) == "load_file":
                return "array"
            if name in OTHER_LOADS or _short(name) in {"read_bytes", "read_text"}:
                return "other"
            if not isinstance(node.func, ast.Attribute):
                return None
            node = node.func.value
        elif isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
            node = node.value
        else:
            return None


def _targets(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _targets(element)]
    return []


class _Scope(ast.NodeVisitor):
    """One function's (or the module's) loaded and clock-derived names, then its flagged comparisons."""

    def __init__(self, path: str, lines: list[str], inherited: dict[str, str], clocks: set[str]):
        self.path, self.lines = path, lines
        self.loaded: dict[str, str] = dict(inherited)
        self.clocks: set[str] = set(clocks)
        self.findings: list[Finding] = []

    # --- what is loaded -------------------------------------------------------------------------------------
    def _kind_of(self, value: ast.AST) -> str | None:
        kind = _load_kind(value)
        if kind:
            return kind
        root = _root(value)
        if isinstance(root, ast.Name) and root.id in self.loaded and not isinstance(value, ast.Name) or (
                isinstance(value, ast.Name) and value.id in self.loaded):
            return self.loaded[root.id]
        return None

    def _bind(self, targets: list[str], value: ast.AST) -> None:
        kind = self._kind_of(value)
        timed = any(isinstance(sub, ast.Call) and _call_name(sub) in CLOCKS for sub in ast.walk(value)) or any(
            isinstance(sub, ast.Name) and sub.id in self.clocks for sub in ast.walk(value))
        for name in targets:
            if kind:
                self.loaded[name] = kind
            else:
                self.loaded.pop(name, None)
            (self.clocks.add if timed else self.clocks.discard)(name)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        self._bind([n for t in node.targets for n in _targets(t)], node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        if node.value is not None:
            self._bind(_targets(node.target), node.value)

    def visit_With(self, node: ast.With) -> None:
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        kind = self._kind_of(node.iter)
        if kind:
            for name in _targets(node.target):
                self.loaded[name] = kind
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        # a nested function sees its enclosing scope's names (closures over a loaded fixture)
        inner = _Scope(self.path, self.lines, self.loaded, self.clocks)
        for statement in node.body:
            inner.visit(statement)
        self.findings += inner.findings

    visit_AsyncFunctionDef = visit_FunctionDef

    # --- what is compared -----------------------------------------------------------------------------------
    def _marked(self, node: ast.AST, mark: str) -> bool:
        first, last = node.lineno, getattr(node, "end_lineno", node.lineno)
        for number in range(max(first - 1, 1), last + 1):
            text = self.lines[number - 1]
            if mark in text and len(text.split(mark, 1)[1].strip()) >= 10:
                return True
        return False

    def _loaded_operand(self, node: ast.AST, kinds: set[str]) -> bool:
        return self._kind_of(node) in kinds

    def _flag(self, node: ast.AST, rule: str) -> None:
        text = ast.get_source_segment("\n".join(self.lines), node) or ""
        self.findings.append(Finding(self.path, node.lineno, rule, " ".join(text.split())[:160]))

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        short = _short(_call_name(node))
        exact = short in EXACT_FUNCTIONS
        zero_rtol = short in TOLERANCE_FUNCTIONS and any(
            k.arg == "rtol" and isinstance(k.value, ast.Constant) and k.value.value == 0 for k in node.keywords)
        if not (exact or zero_rtol):
            return
        operands = list(node.args[:2]) + [k.value for k in node.keywords if k.arg in ("actual", "expected", "desired")]
        if any(self._loaded_operand(arg, {"array", "other"}) for arg in operands) and not self._marked(node, EXACT_MARK):
            self._flag(node, "bit-for-bit comparison against loaded data (use tests.stored.assert_close_to_stored, "
                             f"or mark it '{EXACT_MARK} <reason>')")

    def visit_Assert(self, node: ast.Assert) -> None:
        self.generic_visit(node)
        test = node.test
        for compare in (sub for sub in ast.walk(test) if isinstance(sub, ast.Compare)):
            sides = [compare.left, *compare.comparators]
            if any(isinstance(op, (ast.Eq, ast.NotEq)) for op in compare.ops) and any(
                    self._loaded_operand(side, {"array"}) for side in sides) and not self._marked(node, EXACT_MARK):
                self._flag(node, f"'==' on a loaded tensor or array (use tests.stored.assert_close_to_stored, or mark "
                                 f"it '{EXACT_MARK} <reason>')")
        if self._decides_by_size(test) and self._timed(test) and not self._marked(node, TIMING_MARK):
            self._flag(node, f"a timed value decides this assert (assert counts instead, or mark it "
                             f"'{TIMING_MARK} <reason>')")

    @staticmethod
    def _decides_by_size(test: ast.AST) -> bool:
        """An ordering, or an approximate equality with a stated tolerance: where a time's size can flip the outcome.
        An exact `==` of a time is a test's own constant coming back (a synthetic record's `wall_time_s`)."""
        for sub in ast.walk(test):
            if isinstance(sub, ast.Compare) and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in sub.ops):
                return True
            if isinstance(sub, ast.Call) and _short(_call_name(sub)) == "approx" and any(k.arg in ("rel", "abs") for k in sub.keywords):
                return True
        return False

    def _timed(self, test: ast.AST) -> bool:
        for sub in ast.walk(test):
            if isinstance(sub, ast.Call) and _call_name(sub) in CLOCKS:
                return True
            if isinstance(sub, ast.Name) and (sub.id in self.clocks or TIMED_NAME.search(sub.id)):
                return True
            if isinstance(sub, ast.Attribute) and TIMED_NAME.search(sub.attr):
                return True
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and TIMED_NAME.search(sub.value.rsplit("/", 1)[-1]):
                parent_is_key = any(isinstance(s, ast.Subscript) and s.slice is sub for s in ast.walk(test))
                if parent_is_key:
                    return True
        return False


def scan_source(source: str, path: str = "<source>") -> list[Finding]:
    """Every comparison in `source` that breaks one of the two rules."""
    tree = ast.parse(source)
    scope = _Scope(path, source.splitlines(), {}, set())
    for statement in tree.body:
        scope.visit(statement)
    return scope.findings


def scan_tree(root: Path, skip: tuple[str, ...] = ()) -> list[Finding]:
    found: list[Finding] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).as_posix()
        if relative in skip:
            continue
        found += scan_source(path.read_text(), relative)
    return found
