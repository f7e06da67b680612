"""The papers' claims (harness/claims.yaml) against our records -> leaderboards/claims.{md,html}.

A claim names the suite, task and variant that measure it. Our measurement of a gain is the mean paired
difference of the variant from `softmax` over the seeds both finished, with its paired-t confidence interval
(stats.summarize of the differences) and its resolution (stats.detectable_difference: the smallest true
difference these pairs detect with 80% power, the boards' notion, here for the one pair of rows the claim
compares). The verdict follows VERDICT_RULE, printed on the page. Everything is in a fixed order and format,
so the same records give byte-identical pages (CI re-renders them with `make leaderboard`).

The claims file is validated field by field; a bad one raises ClaimsError naming the claim, the field and
the fix, before anything is written."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Mapping

import yaml

from harness.report.stats import ALPHA, CONFIDENCE, POWER, detectable_difference, summarize
from harness.results.record import Record, Status

CLAIMS_FILE = Path(__file__).resolve().parents[1] / "claims.yaml"
BASELINE = "softmax"
KINDS = ("baseline", "gain", "direction", "structural")
REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN_HERE, NOT_RUN_YET = ("reproduced", "contradicted", "inconclusive",
                                                                     "not run here", "not run yet")
VERDICT_RULE = (
    f"Our Δ is the mean paired difference of the variant from `softmax` over the seeds both finished, with its "
    f"{CONFIDENCE:.0%} CI (paired t; per claim, not corrected for the number of claims). **reproduced**: the CI excludes 0, with the paper's sign. **contradicted**: the CI "
    "excludes the paper's Δ, or shows a significant effect of the opposite sign. **inconclusive**: the CI holds both 0 and "
    "the paper's Δ; the resolution says how large a difference these seeds could have seen. **not run here**: no record "
    "can be made on this machine, for the reason given. **not run yet: k of n seeds**: the suite runs here but its "
    "records are incomplete (the numbers shown are interim); once the suite's common seeds (those every task runs) are "
    "all recorded, a task that plans more gets its verdict, marked *interim: k of n seeds* until the rest are in. A claim with a sign but no number (*direction*) has no Δ to "
    "exclude: it is reproduced or contradicted by the sign of a CI that excludes 0, else inconclusive. A paper's own "
    "softmax number (*baseline*) is reproduced when our softmax mean's CI holds it, contradicted when it excludes it.")
RESOLUTION_RULE = (f"Resolution: the smallest true difference a two-sided paired t-test at α = 0.05 detects with "
                   f"{POWER:.0%} power at this n, given the paired spread observed (the boards' notion, for this one pair of rows).")

_FIELDS = {
    "common": {"id": str, "paper": str, "kind": str},
    "baseline": {"table": str, "task": str, "host": str, "metric": str, "value": dict, "measured_by": dict},
    "gain": {"table": str, "task": str, "host": str, "metric": str, "baseline": dict, "method": dict, "measured_by": dict},
    "direction": {"table": str, "task": str, "host": str, "metric": str, "sign": int, "claim": str},
    "structural": {"claim": str, "evidence": list},
}
_OPTIONAL = {"note": str, "not_here": str, "measured_by": dict}
_VALUE_FIELDS = {"name": str, "mean": float}
_VALUE_OPTIONAL = {"sd": float, "runs": int}
_MEASURED_FIELDS = {"suite": str, "task": str, "variant": str, "metric": str, "scale": float}
_PAPER_FIELDS = {"title": str, "source": str}
_PAPER_OPTIONAL = {"authors": str, "venue": str, "note": str, "setting": dict}
_SETTING_FIELDS = {"name": str, "paper": float, "note": str}


class ClaimsError(ValueError):
    """The claims file is malformed: the message names the claim, the field and the fix."""


# ---- the claims file -------------------------------------------------------------------------------------


def load_claims(path: str | Path = CLAIMS_FILE, repo: str | Path | None = None) -> dict[str, Any]:
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
        if kind == "direction" and claim["sign"] not in (-1, 1):
            raise ClaimsError(f"{label}: field `sign` must be 1 (improves) or -1 (hurts), got {claim['sign']!r}")
        if kind == "structural":
            for item in claim["evidence"]:
                _check_evidence(item, repo, label)
        elif "measured_by" in claim:
            measured = claim["measured_by"]
            _check(measured, _MEASURED_FIELDS, {}, f"{label}: field `measured_by`")
            if measured["suite"] not in suites:
                raise ClaimsError(f"{label}: field `measured_by.suite` names {measured['suite']!r}, not a built-in suite "
                                  f"({', '.join(suites)}); name the suite that measures the claim")
        elif "not_here" not in claim:
            raise ClaimsError(f"{label}: neither `measured_by` (suite, task, variant, metric, scale) nor `not_here` (why no "
                              "suite can measure it here); give one")
    return {"papers": papers, "claims": list(data["claims"])}


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


# ---- measuring ---------------------------------------------------------------------------------------------


def build_claims_board(claims: Mapping[str, Any], runs: str | Path | None, data_root: str | None) -> dict[str, Any]:
    """Plan each suite a claim names once, load its records from the store `runs`, and measure every claim."""
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.results.store import RecordStore, runs_dir

    # A store that does not exist holds no records; opening one would create its folder, and this only reads.
    store = RecordStore(runs) if (runs_dir(runs) / "records").is_dir() else None
    plans, records = {}, {}
    for suite in sorted({c["measured_by"]["suite"] for c in claims["claims"] if "measured_by" in c}):
        plans[suite] = plan(load_suite(suite), data_root)
        records[suite] = store.load(s.key for s in plans[suite].specs).records if store else {}
    return measure_claims(claims, plans, records)


def measure_claims(claims: Mapping[str, Any], plans: Mapping[str, Any], records: Mapping[str, Mapping[str, Record]]) -> dict[str, Any]:
    """The claims board: per claim its paper's numbers, our measurement and the verdict (JSON-serialisable)."""
    rows = []
    boards: dict[str, dict[str, Any]] = {}
    for claim in claims["claims"]:
        measured = claim.get("measured_by")
        paper = claims["papers"][claim["paper"]]
        row = {"claim": claim, "setting": None}
        if claim["kind"] == "structural":
            row.update(verdict="structural", reason=None)
        elif measured is None:
            row.update(verdict=NOT_RUN_HERE, reason=claim["not_here"])
        else:
            row.update(_measure(claim, plans[measured["suite"]], records[measured["suite"]]))
            measure = row.get("measure") or {}
            excludes_zero = measure.get("ci_low") is not None and (measure["ci_low"] > 0 or measure["ci_high"] < 0)
            if row["verdict"] in (REPRODUCED, CONTRADICTED) and excludes_zero and claim["kind"] != "baseline":
                if measured["suite"] not in boards:
                    boards[measured["suite"]] = _board_of(plans[measured["suite"]], records[measured["suite"]])
                row.update(_multiplicity(measured, boards[measured["suite"]]))
            if paper.get("setting") and row.get("attention"):
                setting = paper["setting"]
                row["setting"] = {"name": setting["name"], "paper": setting["paper"], "ours": row["attention"].get(setting["name"])}
        rows.append(row)
    return {"papers": claims["papers"], "rows": rows, "confidence": CONFIDENCE, "rule": VERDICT_RULE, "resolution_rule": RESOLUTION_RULE}


def _measure(claim: Mapping[str, Any], the_plan, records: Mapping[str, Record]) -> dict[str, Any]:
    measured = claim["measured_by"]
    task, variant = measured["task"], measured["variant"]
    if task in the_plan.skipped_tasks or task in the_plan.missing_data:
        reason = claim.get("not_here") or f"the suite's task `{task}` was skipped: its data is not in the data root"
        return {"verdict": NOT_RUN_HERE, "reason": reason}
    own = _specs(the_plan, task, variant)
    base = _specs(the_plan, task, BASELINE)
    if not own or not base:
        missing = variant if not own else BASELINE
        return {"verdict": NOT_RUN_HERE, "reason": claim.get("not_here") or f"suite `{measured['suite']}` does not plan `{missing}` on `{task}`"}
    seeds = sorted({s.seed for s in own} | {s.seed for s in base})
    recorded = [seed for seed in seeds if all(s.key in records for s in own + base if s.seed == seed)]
    if not recorded and claim.get("not_here"):
        return {"verdict": NOT_RUN_HERE, "reason": claim["not_here"]}

    scale = measured["scale"]
    ours = _values(own, records, measured["metric"], scale)
    softmax = _values(base, records, measured["metric"], scale)
    result: dict[str, Any] = {"attention": dict(own[0].attention), "planned": len(seeds), "recorded": len(recorded),
                              "failed": sum(1 for s in own + base if s.key in records and records[s.key].status is not Status.OK),
                              "softmax": summarize(list(softmax.values()))}
    if claim["kind"] == "baseline":
        result["measure"] = summarize(list(softmax.values()))
    else:
        shared = sorted(set(ours) & set(softmax))
        diffs = [ours[seed] - softmax[seed] for seed in shared]
        result["measure"] = summarize(diffs)
        spread = result["measure"]["std"]
        result["resolution"] = detectable_difference(spread, len(diffs)) if spread else None
    paper_base = claim.get("baseline") or claim.get("value")
    low, high = result["softmax"]["ci_low"], result["softmax"]["ci_high"]
    if paper_base and claim["kind"] != "baseline" and low is not None and not low <= paper_base["mean"] <= high:
        result["baseline_note"] = (f"Our `softmax` {result['softmax']['mean']:.2f} [{low:.2f}, {high:.2f}] differs from the paper's "
                                   f"baseline {paper_base['mean']:.2f} by more than its CI")
    progress = f"{len(recorded)} of {len(seeds)} seeds"
    common = set(the_plan.suite.seeds) & set(seeds) or set(seeds)
    if not common <= set(recorded):
        result.update(verdict=NOT_RUN_YET, reason=progress)
    else:
        # a task with more seeds than the suite's common ones (paper-gat's CiteSeer) adds them to resolve more:
        # the seeds it has are the first ones, chosen by number, not by outcome, so their verdict stands meanwhile
        result.update(verdict_for(claim, result["measure"]), reason=None)
        if len(recorded) < len(seeds):
            result["interim"] = progress
    return result


def _board_of(the_plan, records: Mapping[str, Record]) -> dict[str, Any]:
    from harness.report.board import build_board

    return build_board(the_plan.suite, the_plan, records)


def _multiplicity(measured: Mapping[str, Any], board: Mapping[str, Any]) -> dict[str, Any]:
    """A verdict that rests on a CI excluding 0 is one test; the suite's board tests every variant of the
    table against softmax and Holm-corrects them. Where the corrected p is not below α the row says so:
    among a table's many comparisons one borderline interval is weak evidence."""
    def comparison(row: Mapping[str, Any]) -> Mapping[str, Any]:
        return row["metrics"].get(measured["metric"], {}).get("vs_baseline") or {}

    for table in (t for group in board["groups"] for t in group["tasks"] if t["task"] == measured["task"]):
        tested = [row for row in table["rows"] if comparison(row).get("p_holm") is not None]
        for row in tested:
            compared = comparison(row)
            if row["variant"] == measured["variant"] and compared["p_holm"] >= ALPHA:
                return {"multiplicity_note": f"{compared['p_holm']:.3f} once the board's {len(tested)} comparisons with `softmax` on this table "
                                             f"are Holm-corrected (uncorrected p {compared['p']:.3f}): weak evidence either way"}
    return {}


def _specs(the_plan, task: str, label: str) -> list:
    """The default-parameters row `label` of `task` (tuned rows re-run other parameters: not the paper's setup)."""
    return sorted((s for s in the_plan.specs if s.task == task and s.display == label and not s.extra.get("tuning")), key=lambda s: (s.seed, s.key))


def _values(specs, records: Mapping[str, Record], metric: str, scale: float) -> dict[int, float]:
    values = {}
    for spec in specs:
        record = records.get(spec.key)
        if record is None or record.status is not Status.OK or metric not in (record.metrics or {}):
            continue
        value = record.metrics[metric]["value"]
        if value is not None and math.isfinite(float(value)):
            values[spec.seed] = float(value) * scale
    return values


def paper_delta(claim: Mapping[str, Any]) -> float | None:
    """The paper's Δ in its own units; None for claims without one (direction, baseline, structural)."""
    if claim["kind"] != "gain":
        return None
    return claim["method"]["mean"] - claim["baseline"]["mean"]


def verdict_for(claim: Mapping[str, Any], measure: Mapping[str, Any]) -> dict[str, Any]:
    """{"verdict", "detail"} by VERDICT_RULE from our summary (`summarize` of the paired differences, or of
    softmax's values for a baseline claim). Fewer than 2 finished pairs leave no CI: inconclusive."""
    low, high = measure["ci_low"], measure["ci_high"]
    if low is None:
        return {"verdict": INCONCLUSIVE, "detail": f"{measure['n']} finished pair(s): no confidence interval"}
    if claim["kind"] == "baseline":
        target = claim["value"]["mean"]
        if low <= target <= high:
            return {"verdict": REPRODUCED, "detail": None}
        return {"verdict": CONTRADICTED, "detail": f"our softmax is {measure['mean'] - target:+.2f} from the paper's {target:.2f}"}
    expected = claim["sign"] if claim["kind"] == "direction" else math.copysign(1.0, paper_delta(claim))
    delta = paper_delta(claim)
    holds_zero = low <= 0.0 <= high
    if not holds_zero:
        sign = 1.0 if low > 0 else -1.0
        if sign != expected:
            return {"verdict": CONTRADICTED, "detail": "significant effect of the opposite sign"}
        if delta is not None and not low <= delta <= high:
            size = "smaller" if abs(high if sign > 0 else low) < abs(delta) else "larger"
            return {"verdict": REPRODUCED, "detail": f"the sign only: {size} than the paper's Δ, which the CI excludes"}
        return {"verdict": REPRODUCED, "detail": None}
    if delta is not None and not low <= delta <= high:
        return {"verdict": CONTRADICTED, "detail": "the CI excludes the paper's Δ"}
    return {"verdict": INCONCLUSIVE, "detail": None}


# ---- rendering -------------------------------------------------------------------------------------------


def _points(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _ci(measure: Mapping[str, Any] | None, signed: bool) -> str:
    if not measure or measure["mean"] is None:
        return "—"
    text = _points(measure["mean"], signed)
    if measure["ci_low"] is not None:
        text += f" [{_points(measure['ci_low'], signed)}, {_points(measure['ci_high'], signed)}]"
    return text


def paper_cell(claim: Mapping[str, Any]) -> str:
    """The paper's numbers as one cell: "83.00 → 83.78 ± 0.2 (5 runs)"."""
    if claim["kind"] == "baseline":
        return _value_text(claim["value"])
    if claim["kind"] == "gain":
        return f"{claim['baseline']['mean']:.2f} → {_value_text(claim['method'])}"
    if claim["kind"] == "direction":
        return f"{'improves' if claim['sign'] > 0 else 'hurts'} (no number read)"
    return "—"


def _value_text(value: Mapping[str, Any]) -> str:
    text = f"{value['mean']:.2f}"
    if "sd" in value:
        text += f" ± {value['sd']:g}"
    if "runs" in value:
        text += f" ({value['runs']} runs)"
    return text


def verdict_text(row: Mapping[str, Any]) -> str:
    """The verdict with its reason or detail, as every rendering shows it."""
    text = row["verdict"]
    if row["verdict"] == "structural":
        return "structural: checked by the evidence listed"
    if row["verdict"] == NOT_RUN_HERE:
        return f"{NOT_RUN_HERE} (why: below the table)"
    extra = row.get("reason") or row.get("detail")
    if row["verdict"] == INCONCLUSIVE and row.get("resolution") is not None:
        extra = f"resolution {row['resolution']:.2f} points" + (f"; {extra}" if extra else "")
    if row.get("interim"):
        extra = (f"{extra}; " if extra else "") + f"interim: {row['interim']}"
    return f"{text}: {extra}" if extra else text


def row_cells(row: Mapping[str, Any]) -> dict[str, str]:
    """The cells of one claim's table row (the Markdown and HTML pages show the same text)."""
    claim = row["claim"]
    measured = claim.get("measured_by") or {}
    measure = row.get("measure")
    where = (f"`{measured['suite']}` / `{measured['task']}` / `{measured['variant']}` (`{measured['metric']}`)"
             if measured else "—")
    delta = paper_delta(claim)
    return {
        "claim": claim["id"],
        "task": f"{claim['task']} ({claim['host']})",
        "paper": paper_cell(claim),
        "paper_delta": _points(delta, True) if delta is not None else ("+" if claim.get("sign", 0) > 0 else "−" if claim.get("sign") else "—"),
        "measured_by": where,
        "ours": _ci(measure, signed=claim["kind"] != "baseline"),
        "n": str(measure["n"]) if measure else "—",
        "resolution": _points(row.get("resolution")) if row.get("resolution") is not None else "—",
        "verdict": verdict_text(row),
    }


COLUMNS = (("claim", "claim"), ("task", "task (host)"), ("paper", "paper"), ("paper_delta", "paper Δ"),
           ("measured_by", "measured by (suite / task / variant)"), ("ours", "ours [95% CI]"), ("n", "n"),
           ("resolution", "resolution"), ("verdict", "verdict"))


def row_notes(row: Mapping[str, Any]) -> list[str]:
    """Notes under a paper's table: the claim's own note, a baseline that differs, a setting that differs."""
    claim = row["claim"]
    notes = []
    if claim.get("note"):
        notes.append(claim["note"])
    if row.get("baseline_note"):
        notes.append(row["baseline_note"])
    if row.get("multiplicity_note"):
        notes.append(f"Significant on its own (the 95% CI excludes 0), but p = {row['multiplicity_note']}")
    setting = row.get("setting")
    if setting and setting["ours"] is not None and setting["ours"] != setting["paper"]:
        notes.append(f"`{claim['measured_by']['variant']}` runs with {setting['name']} = {setting['ours']:g}; the paper's is {setting['paper']:g} (see the paper's note above)")
    return notes


def table_notes(rows: list[Mapping[str, Any]]) -> list[tuple[list[str], str]]:
    """(claim ids, note) under a paper's table: each claim's own notes, then why claims were not run here,
    one line per reason with every claim it covers (24 GLUE claims share one reason)."""
    notes = [([row["claim"]["id"]], note) for row in rows for note in row_notes(row)]
    reasons: dict[str, list[str]] = {}
    for row in rows:
        if row["verdict"] == NOT_RUN_HERE:
            reasons.setdefault(row["reason"], []).append(row["claim"]["id"])
    return notes + [(ids, f"not run here: {reason}") for reason, ids in reasons.items()]


def render_claims_markdown(board: Mapping[str, Any]) -> str:
    out = io.StringIO()
    out.write("# The papers' claims, measured here\n\n")
    out.write("Generated by `attnbench leaderboard --claims` (`make leaderboard`) from `harness/claims.yaml` and the run "
              "records; do not edit by hand. To add a claim, see README, \"Claims\".\n\n")
    counts = _verdict_counts(board)
    out.write("Verdicts: " + ", ".join(f"{name} {n}" for name, n in counts.items()) + ".\n\n")
    out.write(f"{board['rule']} {board['resolution_rule']} Values are in the paper's units (points).\n\n")
    for paper_id, paper in board["papers"].items():
        rows = [row for row in board["rows"] if row["claim"]["paper"] == paper_id]
        if not rows:
            continue
        out.write(f"## {paper['title']}\n\n")
        out.write(", ".join(part for part in (paper.get("authors"), paper.get("venue"), paper["source"]) if part) + ".")
        if paper.get("note"):
            out.write(f" {paper['note']}")
        if paper.get("setting"):
            out.write(f" {paper['setting']['note']}")
        out.write("\n\n")
        measured = [row for row in rows if row["claim"]["kind"] != "structural"]
        if measured:
            out.write("| " + " | ".join(title for _, title in COLUMNS) + " |\n")
            out.write("|" + "|".join("---" if name in ("claim", "task", "measured_by", "verdict") else "---:" for name, _ in COLUMNS) + "|\n")
            for row in measured:
                cells = row_cells(row)
                out.write("| " + " | ".join(cells[name] for name, _ in COLUMNS) + " |\n")
            notes = table_notes(measured)
            if notes:
                out.write("\n")
                for ids, note in notes:
                    out.write(f"- {', '.join(f'`{claim_id}`' for claim_id in ids)}: {note}\n")
            out.write("\n")
        for row in rows:
            if row["claim"]["kind"] == "structural":
                claim = row["claim"]
                out.write(f"- `{claim['id']}`: {claim['claim']}. Checked by: {', '.join(f'`{e}`' for e in claim['evidence'])}.\n")
        if any(row["claim"]["kind"] == "structural" for row in rows):
            out.write("\n")
    return out.getvalue()


def _verdict_counts(board: Mapping[str, Any]) -> dict[str, int]:
    order = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN_YET, NOT_RUN_HERE, "structural")
    return {name: sum(1 for row in board["rows"] if row["verdict"] == name) for name in order}

