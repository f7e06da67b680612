"""The claims file, harness/claims.yaml, read and validated field by field: a bad one raises ClaimsError naming the
claim, the field and the fix, before anything is measured or written."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

CLAIMS_FILE = Path(__file__).resolve().parents[1] / "claims.yaml"
KINDS = ("baseline", "gain", "direction", "structural")
CONFIG_SOURCES = ("paper", "tuned", "default")
"""Where a claim's configuration comes from: the paper's stated hyperparameters, Optuna on validation data with the
same budget for every variant, or attnbench's default (shown, never the basis of a verdict)."""

_FIELDS = {
    "common": {"id": str, "paper": str, "kind": str},
    "baseline": {"table": str, "task": str, "host": str, "metric": str, "value": dict, "measured_by": dict},
    "gain": {"table": str, "task": str, "host": str, "metric": str, "baseline": dict, "method": dict, "measured_by": dict},
    "direction": {"table": str, "task": str, "host": str, "metric": str, "sign": int, "claim": str},
    "structural": {"claim": str, "evidence": list},
}
_OPTIONAL = {"note": str, "not_here": str, "measured_by": dict, "config": dict, "proxy": dict}
_PROXY_FIELDS = {"suite": str, "host": str}
_PROXY_OPTIONAL = {"not_here": str}
_VALUE_FIELDS = {"name": str, "mean": float}
_VALUE_OPTIONAL = {"sd": float, "runs": int, "from": str}
"""`from`: the id of the paper (under `papers`) whose number this is, when it is not the claim's own paper's run: the
paper's Δ then compares its method with another paper's published number."""
_CONFIG_FIELDS = {"source": str}
_CONFIG_OPTIONAL = {"note": str}
_MEASURED_FIELDS = {"suite": str, "task": str, "variant": str, "metric": str, "scale": float}
_PAPER_FIELDS = {"title": str, "source": str}
_PAPER_OPTIONAL = {"authors": str, "venue": str, "note": str, "setting": dict, "untraced": str}
"""`untraced`: why the paper's figures could not be checked against the paper here; the page marks them, and the
verdicts resting on them, so."""
_DECLARED_FIELDS = {"commit": str, "at": str}
_MECHANISM_TEST_FIELDS = {"test": str, "statistic": str, "alternative": str, "alpha": float, "correction": str, "null": dict, "declared": dict}
_NULL_FIELDS = {"draws": int, "rng_seed": int, "max_false_active": float, "how": str}
_DOSE_FIELDS = {"suite": str, "baseline": str, "diagnostic": str, "metric": str, "alpha": float, "rows": dict, "declared": dict}
_THRESHOLD_FIELDS = {"variant": str, "diagnostic": str, "rule": str, "threshold": float, "declared": dict}
_THRESHOLD_OPTIONAL = {"note": str}
_SETTING_FIELDS = {"name": str, "paper": float, "note": str}


class ClaimsError(ValueError):
    """The claims file is malformed: the message names the claim, the field and the fix."""


@dataclass(frozen=True)
class Declared:
    """When a test or threshold was fixed: the commit that declared it and that commit's time (ISO 8601)."""

    commit: str
    at: str

    def after(self, finished: str | None) -> bool:
        """Whether this declaration came after a record that finished at `finished` (ISO 8601): a rule declared once
        the record existed could have been fitted to it (post hoc). A record without a finish time counts as before."""
        if not finished:
            return True
        return datetime.fromisoformat(self.at) > datetime.fromisoformat(finished)


@dataclass(frozen=True)
class NullDraws:
    draws: int
    rng_seed: int
    max_false_active: float
    how: str


@dataclass(frozen=True)
class MechanismTestSpec:
    """The declared mechanism test (claims.yaml `mechanism_test`): a paired one-sided Wilcoxon signed-rank test on the
    log ratio of a variant's evaluated diagnostic to the baseline's at the same task and seed, Holm over the page."""

    test: str
    statistic: str
    alternative: str
    alpha: float
    correction: str
    null: NullDraws
    declared: Declared


@dataclass(frozen=True)
class DoseResponseSpec:
    """The declared λ dose-response (claims.yaml `dose_response`): rows label -> λ per variant, and what they are judged by."""

    suite: str
    baseline: str
    diagnostic: str
    metric: str
    alpha: float
    rows: Mapping[str, Mapping[str, float]]
    declared: Declared


@dataclass(frozen=True)
class Threshold:
    """The judged copy of a kernel's threshold rule, with the commit that declared its threshold."""

    variant: str
    diagnostic: str
    rule: str
    threshold: float
    declared: Declared
    note: str | None = None


@dataclass(frozen=True)
class ClaimsFile(Mapping):
    """The validated claims file. Reads like the mapping it was ({"papers": ..., "claims": [...]}), which is how the
    measuring code and the tests look at claims; the declarations are typed."""

    papers: Mapping[str, Mapping[str, Any]]
    claims: tuple[Mapping[str, Any], ...]
    mechanism_test: MechanismTestSpec | None = None
    dose_response: DoseResponseSpec | None = None
    thresholds: tuple[Threshold, ...] = field(default_factory=tuple)

    def __getitem__(self, name: str) -> Any:
        if name not in self._names():
            raise KeyError(name)
        value = getattr(self, name)
        return list(value) if name == "claims" else value

    def _names(self) -> tuple[str, ...]:
        return ("papers", "claims", "mechanism_test", "dose_response", "thresholds")

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def threshold(self, variant: str, diagnostic: str) -> Threshold | None:
        return next((t for t in self.thresholds if t.variant == variant and t.diagnostic == diagnostic), None)


def _declared(value: Any, label: str) -> Declared:
    _check(value, _DECLARED_FIELDS, {}, f"{label}: field `declared`")
    try:
        datetime.fromisoformat(value["at"])
    except ValueError:
        raise ClaimsError(f"{label}: field `declared.at` must be an ISO time (git show -s --format=%cI <commit>), got {value['at']!r}") from None
    return Declared(str(value["commit"]), value["at"])


def _declarations(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if "mechanism_test" in data:
        # YAML reads the bare key `null` as None: the declaration's `null:` is the test's null distribution
        spec = {("null" if key is None else key): value for key, value in (data["mechanism_test"] or {}).items()}
        label = f"{where}: `mechanism_test`"
        _check(spec, _MECHANISM_TEST_FIELDS, {}, label)
        _check(spec["null"], _NULL_FIELDS, {}, f"{label}: field `null`")
        found["mechanism_test"] = MechanismTestSpec(spec["test"], spec["statistic"], spec["alternative"], float(spec["alpha"]),
                                                    spec["correction"], NullDraws(**spec["null"]), _declared(spec["declared"], label))
    if "dose_response" in data:
        spec = data["dose_response"]
        label = f"{where}: `dose_response`"
        _check(spec, _DOSE_FIELDS, {}, label)
        rows = {}
        for variant, levels in spec["rows"].items():
            if not isinstance(levels, dict) or not all(_is_a(v, float) for v in levels.values()):
                raise ClaimsError(f"{label}: field `rows.{variant}` must map row labels to λ values")
            rows[str(variant)] = {str(k): float(v) for k, v in levels.items()}
        found["dose_response"] = DoseResponseSpec(spec["suite"], spec["baseline"], spec["diagnostic"], spec["metric"],
                                                  float(spec["alpha"]), rows, _declared(spec["declared"], label))
    thresholds = []
    for index, item in enumerate(data.get("thresholds") or []):
        label = f"{where}: `thresholds` #{index + 1}"
        _check(item, _THRESHOLD_FIELDS, _THRESHOLD_OPTIONAL, label)
        thresholds.append(Threshold(item["variant"], item["diagnostic"], item["rule"], float(item["threshold"]),
                                    _declared(item["declared"], label), item.get("note")))
    found["thresholds"] = tuple(thresholds)
    return found


def load_claims(path: str | Path = CLAIMS_FILE, repo: str | Path | None = None) -> ClaimsFile:
    """The validated claims file: {"papers": {id: paper}, "claims": [claim, ...]}. `repo` (default: the
    repository holding this file) is where a structural claim's evidence files must exist.
    Written by hand, not with a schema library: the project's errors name the field and the fix in one line,
    and the checks that matter (known suites, evidence that exists, a unique id) are not schema checks."""
    path = Path(path)
    repo = Path(repo) if repo is not None else CLAIMS_FILE.parents[1]
    where = f"claims file {path}"
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ClaimsError(f"{where} cannot be read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ClaimsError(f"{where} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("papers"), dict) or not isinstance(data.get("claims"), list):
        raise ClaimsError(f"{where} must be a mapping with `papers` (id -> paper) and `claims` (a list); see the comments at the top of harness/claims.yaml")
    papers = {}
    for paper_id, paper in data["papers"].items():
        _check(paper, _PAPER_FIELDS, _PAPER_OPTIONAL, f"{where}: paper {paper_id!r}")
        if "setting" in paper:
            _check(paper["setting"], _SETTING_FIELDS, {}, f"{where}: paper {paper_id!r}: field `setting`")
        papers[str(paper_id)] = paper
    seen: set[str] = set()
    suites = _suite_names()
    for index, claim in enumerate(data["claims"]):
        label = f"{where}: claim {claim.get('id')!r}" if isinstance(claim, dict) and claim.get("id") else f"{where}: claim #{index + 1}"
        if not isinstance(claim, dict):
            raise ClaimsError(f"{label} must be a mapping of fields (id, paper, kind, ...)")
        kind = claim.get("kind")
        if kind not in KINDS:
            raise ClaimsError(f"{label}: field `kind` must be one of {', '.join(KINDS)}, got {kind!r}")
        _check(claim, {**_FIELDS["common"], **_FIELDS[kind]}, _OPTIONAL, label)
        if claim["id"] in seen:
            raise ClaimsError(f"{label}: field `id` is used twice; give each claim its own id")
        seen.add(claim["id"])
        if claim["paper"] not in papers:
            raise ClaimsError(f"{label}: field `paper` names {claim['paper']!r}, which is not under `papers` "
                              f"(known: {', '.join(sorted(papers))}); add the paper or fix the id")
        for name in ("value", "baseline", "method"):
            if name in claim:
                _check(claim[name], _VALUE_FIELDS, _VALUE_OPTIONAL, f"{label}: field `{name}`")
                if claim[name].get("from", claim["paper"]) not in papers:
                    raise ClaimsError(f"{label}: field `{name}.from` names {claim[name]['from']!r}, not a paper under `papers`; "
                                      "name the paper whose published number it is")
        if kind == "direction" and claim["sign"] not in (-1, 1):
            raise ClaimsError(f"{label}: field `sign` must be 1 (improves) or -1 (hurts), got {claim['sign']!r}")
        if kind == "structural":
            for item in claim["evidence"]:
                _check_evidence(item, repo, label)
        elif "measured_by" in claim:
            measured = claim["measured_by"]
            _check(measured, _MEASURED_FIELDS, {}, f"{label}: field `measured_by`")
            if "config" not in claim:
                raise ClaimsError(f"{label}: field `config` is missing; say where the measured configuration comes from: "
                                  f"{{source: paper | tuned | default, note: ...}}")
            _check(claim["config"], _CONFIG_FIELDS, _CONFIG_OPTIONAL, f"{label}: field `config`")
            if claim["config"]["source"] not in CONFIG_SOURCES:
                raise ClaimsError(f"{label}: field `config.source` must be one of {', '.join(CONFIG_SOURCES)}, got {claim['config']['source']!r}")
            if measured["suite"] not in suites:
                raise ClaimsError(f"{label}: field `measured_by.suite` names {measured['suite']!r}, not a built-in suite "
                                  f"({', '.join(suites)}); name the suite that measures the claim")
        elif "not_here" not in claim:
            raise ClaimsError(f"{label}: neither `measured_by` (suite, task, variant, metric, scale) nor `not_here` (why no "
                              "suite can measure it here); give one")
        if "proxy" in claim:
            _check(claim["proxy"], _PROXY_FIELDS, _PROXY_OPTIONAL, f"{label}: field `proxy`")
            if "measured_by" not in claim or claim["proxy"]["suite"] not in suites:
                raise ClaimsError(f"{label}: field `proxy` needs the claim's `measured_by` and a built-in suite, got {claim['proxy']['suite']!r}")
    return ClaimsFile(papers, tuple(row for claim in data["claims"] for row in (claim, *_proxy_rows(claim))), **_declarations(data, where))


def _proxy_rows(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A claim measured again on another setup (the papers' GLUE claims on MiniLM-L6 instead of ALBERT-base) gets its
    own row, `<id>-proxy`, judged on its own records: a proxy is never pooled with the paper's setup."""
    proxy = claim.get("proxy")
    if not proxy:
        return []
    row = {k: v for k, v in claim.items() if k not in ("proxy", "note", "not_here")}
    row.update(id=f"{claim['id']}-proxy", host=proxy["host"], proxy_of=claim["id"],
               measured_by={**claim["measured_by"], "suite": proxy["suite"]},
               note=f"A proxy for `{claim['id']}` on another backbone ({proxy['host']}, suite `{proxy['suite']}`): not the paper's setup, never pooled with it.")
    if proxy.get("not_here"):
        row["not_here"] = proxy["not_here"]
    return [row]


def _check(mapping: Any, required: Mapping[str, type], optional: Mapping[str, type], label: str) -> None:
    if not isinstance(mapping, dict):
        raise ClaimsError(f"{label} must be a mapping, got {type(mapping).__name__}")
    for name, kind in required.items():
        if name not in mapping:
            raise ClaimsError(f"{label}: field `{name}` is missing; add it ({kind.__name__})")
    for name, value in mapping.items():
        kind = required.get(name) or optional.get(name)
        if kind is None:
            known = ", ".join([*required, *optional])
            raise ClaimsError(f"{label}: unknown field `{name}`; the fields are {known}")
        if not _is_a(value, kind):
            raise ClaimsError(f"{label}: field `{name}` must be {_KIND_WORDS[kind]}, got {value!r}")


_KIND_WORDS = {str: "a non-empty string", float: "a finite number", int: "an integer", dict: "a mapping", list: "a non-empty list"}


def _is_a(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in (str, list):
        return isinstance(value, kind) and len(value) > 0
    return isinstance(value, kind)


def _check_evidence(item: Any, repo: Path, label: str) -> None:
    """`path` or `path::test_name`: the file must exist and define the test, so the page never cites evidence
    that was renamed or deleted."""
    if not isinstance(item, str) or not item:
        raise ClaimsError(f"{label}: field `evidence` must list file paths or file::test names, got {item!r}")
    path, _, test = item.partition("::")
    if not (repo / path).is_file():
        raise ClaimsError(f"{label}: evidence {item!r}: no file {path} in the repository; fix the path")
    if test and f"def {test}(" not in (repo / path).read_text():
        raise ClaimsError(f"{label}: evidence {item!r}: {path} defines no test {test}; fix the name")


def _suite_names() -> list[str]:
    from harness.plan.suite import list_suites

    return list_suites()
