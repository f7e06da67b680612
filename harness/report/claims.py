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
import re
import statistics
from pathlib import Path
from typing import Any, Mapping

import yaml

from harness.report.stats import ALPHA, CONFIDENCE, POWER, detectable_difference, holm, paired_p, summarize
from harness.results.record import Record, Status
from harness.report.seed_history import seed_history_lines
from harness.results.store import diagnosed_execution

CLAIMS_FILE = Path(__file__).resolve().parents[1] / "claims.yaml"
BASELINE = "softmax"
KINDS = ("baseline", "gain", "direction", "structural")
REPRODUCED, NOT_REPRODUCED, OPPOSITE, INCONCLUSIVE, NOT_JUDGED, NOT_RUN_HERE, NOT_RUN_YET = (
    "reproduced", "not reproduced", "opposite effect", "inconclusive", "not judged", "not run here", "not run yet")
NEGATIVE = (NOT_REPRODUCED, OPPOSITE)
"""Verdicts that say a paper's claim does not hold here: given only where the variant's mechanism was shown active."""
CONFIG_SOURCES = ("paper", "tuned", "default")
"""Where a claim's configuration comes from: the paper's stated hyperparameters, Optuna on validation data with the
same budget for every variant, or attnbench's default (shown, never the basis of a verdict)."""
VERDICT_RULE = (
    f"Our Δ is the mean paired difference of the variant from `softmax` over the seeds both finished, with its "
    f"{CONFIDENCE:.0%} CI (paired t). A significant effect must also survive the multiplicity of its family: the Holm "
    "correction over every variant compared with `softmax` on the same task and metric, as the suite's leaderboard applies it "
    f"(corrected p < {ALPHA:g}). **reproduced**: the effect has the paper's sign and is significant after correction. "
    "**opposite effect**: the effect has the other sign and is significant after correction. **not reproduced**: the CI "
    "excludes the paper's Δ on the side of a smaller effect. **inconclusive**: neither; the resolution says how large a "
    "difference these seeds could have seen. Both negative verdicts are given only when the variant's mechanism "
    "diagnostics show it was active in these runs, read at the evaluated weights (those the stopping rule kept, which "
    "gave the test numbers; modules/attention/mechanism.py states each rule and what its threshold measures); otherwise "
    "the row is **inconclusive: mechanism inactive** (or: no evidence at the evaluated weights, for records made before "
    "runs measured it), with the median figure over the seeds. **not judged**: "
    "the row runs attnbench's default configuration, neither the paper's stated one nor one tuned on validation data, "
    "so its numbers are shown but carry no verdict. *in this setup*: our `softmax` differs from the paper's baseline by "
    "more than its CI, so the verdict speaks for our baseline. A claim with a sign but no number (*direction*) is "
    "reproduced or an opposite effect by the sign of a corrected-significant effect, else inconclusive. A paper's own "
    "softmax number (*baseline*) is reproduced when our softmax mean's CI holds it, not reproduced when it excludes it. "
    "**not run here**: no record can be made on this machine, for the reason given. **not run yet: k of n seeds**: the "
    "suite runs here but its records are incomplete; once the suite's common seeds are all recorded, a task that plans "
    "more gets its verdict, marked *interim* until the rest are in. Where a task's seed count grew after its first "
    "records existed (the suite's seed history says when and why), the verdict on the first declared seeds is computed "
    "too, and a verdict that differs is marked as resting on the seeds added later.")
RESOLUTION_RULE = (f"Resolution: the smallest true difference a two-sided paired t-test at α = 0.05 detects with "
                   f"{POWER:.0%} power at this n, given the paired spread observed (the boards' notion, for this one pair of rows).")

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
    return {"papers": papers, "claims": [row for claim in data["claims"] for row in (claim, *_proxy_rows(claim))]}


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


# ---- measuring ---------------------------------------------------------------------------------------------


def build_claims_board(claims: Mapping[str, Any], runs: str | Path | None, data_root: str | None) -> dict[str, Any]:
    """Plan each suite a claim names once, load its records from the store `runs`, and measure every claim. A suite's
    tuned rows are the ones it lists (`tuned`), from the committed tuned parameters."""
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.results.store import RecordStore, runs_dir

    # A store that does not exist holds no records; opening one would create its folder, and this only reads.
    store = RecordStore(runs) if (runs_dir(runs) / "records").is_dir() else None
    plans, records, evidence = {}, {}, {}
    measured = {c["measured_by"]["suite"] for c in claims["claims"] if "measured_by" in c}
    for suite in sorted(measured | set(_cost_suites(claims))):
        plans[suite] = plan(load_suite(suite), data_root)
        loaded = store.load(s.key for s in plans[suite].specs) if store else None
        records[suite] = loaded.records if loaded else {}
        evidence[suite] = {key: diagnosed_execution(copies) for key, copies in loaded.executions.items()} if loaded else {}
    board = measure_claims(_with_measured_costs(claims, plans, records), {s: plans[s] for s in measured},
                           {s: records[s] for s in measured}, {s: evidence[s] for s in measured})
    from harness.report.board import without_data_root  # a reason names files under this machine's data root

    for row in board["rows"]:
        suite = (row["claim"].get("measured_by") or {}).get("suite")
        if row.get("reason") and suite in plans:
            row["reason"] = without_data_root(row["reason"], plans[suite].data_root)
    board["host_attention"] = host_attention(plans, records, evidence)
    board["seed_history"] = {suite: lines for suite in sorted(measured)
                             if (lines := seed_history_lines(plans[suite].suite, plans[suite].specs, records[suite]))}
    return board


COST_PLACEHOLDER = re.compile(r"\{cost:([a-z0-9-]+)\}")
"""`{cost:<suite>}` in a claim's `not_here`: replaced by the measured time per run of that suite's committed records,
where cost, not a missing file, is why the claim is not run here (issue 51: the page said "hours" where MiniLM on RTE
took a median 23.9 minutes)."""


def _cost_suites(claims: Mapping[str, Any]) -> list[str]:
    return sorted({name for claim in claims["claims"] for name in COST_PLACEHOLDER.findall(claim.get("not_here") or "")})


def measured_cost(suite: str, the_plan, records: Mapping[str, Record]) -> str:
    """'a median 23.9 min per run of suite `minilm-rte` (4 runs, CPU AMD EPYC (1 thread/run))', from the records."""
    by_class: dict[str, list[float]] = {}
    for spec in the_plan.specs:
        record = records.get(spec.key)
        if record is not None and record.status is Status.OK and record.wall_time_s:
            by_class.setdefault(record.hardware_label or "unknown hardware", []).append(float(record.wall_time_s))
    if not by_class:
        return f"no run of suite `{suite}` recorded to measure the cost by"
    label, times = max(by_class.items(), key=lambda item: (len(item[1]), item[0]))
    return f"a median {statistics.median(times) / 60:.1f} min per run of suite `{suite}` ({len(times)} runs, {label})"


def _with_measured_costs(claims: Mapping[str, Any], plans, records) -> dict[str, Any]:
    def filled(text: str | None) -> str | None:
        if not text:
            return text
        return COST_PLACEHOLDER.sub(lambda m: measured_cost(m.group(1), plans[m.group(1)], records[m.group(1)]), text)

    return {**claims, "claims": [{**claim, "not_here": filled(claim.get("not_here"))} if claim.get("not_here") else claim
                                 for claim in claims["claims"]]}


NEAR_UNIFORM = 0.95
"""Softmax's evaluated attention is called near uniform on a host where its entropy is at least this share of the
uniform distribution's over the same keys: within 5% of the most spread-out attention possible."""


def host_attention(plans, records, evidence) -> list[dict[str, Any]]:
    """Per suite and task the claims measure: softmax's evaluated attention entropy against the uniform
    distribution's over the same keys, per layer (the boards' table, board.attention_entropy, read from the same
    executions the mechanism evidence comes from), where its records carry the uniform reference (runs since issue 51)."""
    from harness.report.board import attention_entropy

    found = []
    for suite, the_plan in sorted(plans.items()):
        read = {**records[suite], **evidence[suite]}
        for task in sorted({s.task for s in the_plan.specs}):
            table = attention_entropy([s for s in the_plan.specs if s.task == task], read).get("attention_entropy") or {}
            cells = (table.get("rows") or {}).get(BASELINE)
            if cells and all(cell["uniform"] for cell in cells.values()):
                found.append({"suite": suite, "task": task, "seeds": table["seeds"][BASELINE],
                              "layers": [cell["entropy"] / cell["uniform"] for cell in cells.values()]})
    return found


def host_attention_line(found: list[dict[str, Any]], code=lambda text: f"`{text}`") -> str | None:
    """The claims page's statement of how far the host's own attention is from uniform, and what that implies."""
    if not found:
        return None
    parts = [f"{code(row['task'])} ({code(row['suite'])}, {row['seeds']} seeds) "
             + ", ".join(f"layer {i + 1} {ratio:.1%}" for i, ratio in enumerate(row["layers"])) for row in found]
    near = [row for row in found if min(row["layers"]) >= NEAR_UNIFORM]
    line = ("- The host's own attention: softmax's attention at the evaluated weights has this share of the uniform "
            "distribution's entropy over the same keys: " + "; ".join(parts) + ".")
    if near:
        line += (f" On {', '.join(code(row['task']) for row in near)} it is near uniform (at least {NEAR_UNIFORM:.0%}): "
                 "every node spreads its attention almost evenly over its neighbours, so a variant that reshapes the "
                 "attention distribution has little to act on there. A negative verdict on that host says the variant "
                 "does not help it; it is not evidence against the variant where attention is sharp (text, vision).")
    return line


def measure_claims(claims: Mapping[str, Any], plans: Mapping[str, Any], records: Mapping[str, Mapping[str, Record]],
                   evidence: Mapping[str, Mapping[str, Record]] | None = None) -> dict[str, Any]:
    """The claims board: per claim its paper's numbers, our measurement and the verdict (JSON-serialisable).
    `evidence`: per suite, the execution to read mechanism diagnostics from where a key ran more than once
    (`diagnosed_execution`); the metrics always come from `records`."""
    rows = []
    for claim in claims["claims"]:
        measured = claim.get("measured_by")
        paper = claims["papers"][claim["paper"]]
        row = {"claim": claim, "setting": None, "config": (claim.get("config") or {}).get("source")}
        if claim["kind"] == "structural":
            row.update(verdict="structural", reason=None)
        elif measured is None:
            row.update(verdict=NOT_RUN_HERE, reason=claim["not_here"])
        else:
            suite_records = records[measured["suite"]]
            diagnosed = {**suite_records, **(evidence or {}).get(measured["suite"], {})}
            row.update(_measure(claim, plans[measured["suite"]], suite_records, diagnosed))
            if paper.get("setting") and row.get("attention"):
                setting = paper["setting"]
                row["setting"] = {"name": setting["name"], "paper": setting["paper"], "ours": row["attention"].get(setting["name"])}
        rows.append(row)
    return {"papers": claims["papers"], "rows": rows, "confidence": CONFIDENCE, "rule": VERDICT_RULE, "resolution_rule": RESOLUTION_RULE}


def _measure(claim: Mapping[str, Any], the_plan, records: Mapping[str, Record], diagnosed: Mapping[str, Record] | None = None) -> dict[str, Any]:
    measured = claim["measured_by"]
    task, variant = measured["task"], measured["variant"]
    source = claim["config"]["source"]
    if task in the_plan.skipped_tasks or task in the_plan.missing_data:
        # what is actually missing, in the loader's words, then what else the claim needs
        missing = the_plan.skipped_tasks.get(task) or the_plan.missing_data.get(task)
        reason = "; ".join(part for part in (f"the suite's task `{task}` was skipped: {missing}", claim.get("not_here")) if part)
        return {"verdict": NOT_RUN_HERE, "reason": reason}
    pair = f"{task} x {variant}"
    kept_defaults = source == "tuned" and pair in the_plan.tuned_as_defaults  # the tuning chose the defaults: one row
    own = _specs(the_plan, task, variant, tuned=source == "tuned" and not kept_defaults)
    base = _specs(the_plan, task, BASELINE)
    if source == "tuned":
        budget = next((entry.split(": ", 1)[1] for entry in the_plan.tuned_budget if entry.startswith(pair + ":")), None)
        if budget or (not own and base):
            why = (f"the committed tuned parameters of `{variant}` on `{task}` were {budget}: not this suite's budget" if budget else
                   f"no tuned parameters of `{variant}` on `{task}` are committed yet")
            return {"verdict": NOT_RUN_YET, "reason": f"{why} (`attnbench tune {task} {variant}` at the suite's budget with --promote, "
                                                      f"then `make bench SUITE={measured['suite']}`)"}
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
    if source == "tuned":
        from harness.plan.planner import COMMITTED_PARAMS
        from harness.plan.tuned import load_tuned

        # the checkout's committed parameters, as the planner read them, whatever the working directory
        tuned = load_tuned(task, variant, COMMITTED_PARAMS) or {}
        trials = (tuned.get("tuning") or {}).get("trials") or {}
        # the budget counts finished trials (complete or pruned), as `tune` does; failed ones (a killed process's
        # trial, retried, or a diverged configuration) are named beside it, not counted in it
        result["tuning"] = {"trials": trials.get("complete", 0) + trials.get("pruned", 0) if isinstance(trials, dict) else trials,
                            "failed": trials.get("fail", 0) if isinstance(trials, dict) else 0,
                            "metric": (tuned.get("validation") or {}).get("metric"), "kept_defaults": kept_defaults}
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
        result["baselines_differ"] = True
        result["baseline_note"] = (f"Baselines: the paper's {paper_base['mean']:.2f} ({paper_base['name']}); ours, `softmax`, "
                                   f"{result['softmax']['mean']:.2f} [{low:.2f}, {high:.2f}], which excludes it: the verdict is for this setup")
    progress = f"{len(recorded)} of {len(seeds)} seeds"
    common = set(the_plan.suite.seeds) & set(seeds) or set(seeds)
    if not common <= set(recorded):
        result.update(verdict=NOT_RUN_YET, reason=progress)
        return result
    diagnosed = records if diagnosed is None else diagnosed
    mechanism = _mechanism(own[0].variant, [diagnosed.get(s.key) for s in own], [diagnosed.get(s.key) for s in base]) if claim["kind"] != "baseline" else None
    if mechanism is not None:  # shown on every measured row, a not-judged one too: the evidence is the records'
        result["mechanism"] = {"active": mechanism[0], "evidence": mechanism[1]}
    if source == "default":
        result.update(verdict=NOT_JUDGED, reason="attnbench's default configuration, neither the paper's nor tuned on validation data")
        return result
    family = _family(the_plan, records, task, measured["metric"])
    result.update(verdict_for(claim, result["measure"], family.get(own[0].display), mechanism, result.get("baselines_differ", False)), reason=None)
    if len(recorded) < len(seeds):
        # a task with more seeds than the suite's common ones adds them to resolve more: the seeds it has are the
        # first ones, chosen by number, not by outcome, so their verdict stands meanwhile
        result["interim"] = progress
    first = _first_declared_seeds(the_plan.suite, task)
    if claim["kind"] != "baseline" and first and set(first) < set(recorded):
        subset = sorted(set(first) & set(ours) & set(softmax))
        measure = summarize([ours[seed] - softmax[seed] for seed in subset])
        family_first = _family(the_plan, records, task, measured["metric"], seeds=set(first))
        # the mechanism gate on the same seeds as the verdict it gates
        mechanism_first = _mechanism(own[0].variant, [diagnosed.get(s.key) for s in own if s.seed in first],
                                     [diagnosed.get(s.key) for s in base if s.seed in first]) if mechanism is not None else None
        on_first = verdict_for(claim, measure, family_first.get(own[0].display), mechanism_first, result.get("baselines_differ", False))
        result["first_seeds"] = {"seeds": len(subset), "measure": measure, **on_first}
        if on_first["verdict"] != result["verdict"]:
            result["rests_on_added_seeds"] = True
    return result


def _first_declared_seeds(suite, task: str) -> list[int] | None:
    """The seeds `task` had when its suite first declared its seed counts, when the count grew since (the suite's
    `seed_history`); None when it never grew."""
    history = getattr(suite, "seed_history", None) or []
    counts = [entry["seeds"] for entry in history if entry.get("task") in (None, task)]
    return list(range(counts[0])) if len(counts) > 1 and counts[0] < counts[-1] else None


def _family(the_plan, records: Mapping[str, Record], task: str, metric: str, seeds: set[int] | None = None) -> dict[str, dict[str, Any]]:
    """Per row of the task's table: its paired p against `softmax` over the seeds both finished (within `seeds`), and
    that p Holm-corrected over every row compared, which is the family the suite's leaderboard corrects (board._compare),
    restricted to other seeds when the verdict on the first declared seeds is asked."""
    by_row: dict[str, dict[int, float]] = {}
    for spec in the_plan.specs:
        if spec.task != task or (seeds is not None and spec.seed not in seeds):
            continue
        record = records.get(spec.key)
        if record is None or record.status is not Status.OK or metric not in (record.metrics or {}):
            continue
        value = record.metrics[metric].get("value")
        if value is not None and math.isfinite(float(value)):
            by_row.setdefault(spec.display, {})[spec.seed] = float(value)
    base = by_row.get(BASELINE, {})
    tests, found = {}, {}
    for label, values in by_row.items():
        diffs = [value - base[seed] for seed, value in values.items() if seed in base]
        if label == BASELINE or len(diffs) < 2:
            continue
        tests[label] = paired_p(diffs)
        found[label] = {"p": tests[label], "family": 0}
    for label, corrected in holm(tests).items():
        found[label].update(p_holm=corrected, family=len(tests))
    return found


def _mechanism(variant: str, own: list[Record | None], base: list[Record | None]) -> tuple[bool | None, str] | None:
    """Whether the variant's mechanism was active in these runs, by the rule its kernel declares
    (modules/attention/mechanism.py), read at each run's evaluated weights, seed by seed against softmax's record of
    the same seed: active when it was in at least half the seeds that carry the evidence; None (no evidence) when no
    record carries it; None overall for a variant that declares no diagnostic (nothing to gate on). The evidence
    names each ruled figure's median over the seeds beside its rule, so a reader sees how far from the threshold
    the runs were, not only on which side."""
    from modules.attention.mechanism import NO_EVIDENCE, declared_mechanism, describe_rule, figure_name, mechanism_active, ruled_figure

    declared, _ = declared_mechanism(variant)
    ruled = [d for d in declared if d.rule]
    if not ruled:
        return None
    baseline = {(r.spec or {}).get("seed"): r for r in base if r is not None}
    pairs = [(r, baseline.get((r.spec or {}).get("seed"))) for r in own if r is not None]
    verdicts = [mechanism_active(r, b) for r, b in pairs]
    if not verdicts:
        return None
    shown = [v for v in verdicts if v[0] is not None]
    if not shown:
        return None, f"{NO_EVIDENCE} in any of {len(verdicts)} records (made before runs measured it: re-run them); e.g. {verdicts[0][1]}"
    active = sum(1 for v in shown if v[0])
    figures = []
    for d in ruled:
        values = sorted(f for f in (ruled_figure(d, r, b) for r, b in pairs) if f is not None)
        if values:
            figures.append(f"median {figure_name(d)} {statistics.median(values):.3g} over {len(values)} seeds (rule: {describe_rule(d)})")
    example = next((v[1] for v in shown if v[0] == (2 * active >= len(shown))), shown[0][1])
    return 2 * active >= len(shown), (f"active at the evaluated weights in {active} of {len(shown)} seeds"
                                      + (f" ({len(verdicts) - len(shown)} without evidence)" if len(shown) < len(verdicts) else "")
                                      + f"; {'; '.join(figures)}; e.g. {example}")


def _specs(the_plan, task: str, label: str, tuned: bool = False) -> list:
    """Row `label` of `task`: its default-parameters runs, or with `tuned` its "(tuned)" row's."""
    return sorted((s for s in the_plan.specs if s.task == task and bool(s.extra.get("tuning")) == tuned
                   and s.display == (f"{label} (tuned)" if tuned else label)), key=lambda s: (s.seed, s.key))


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


def verdict_for(claim: Mapping[str, Any], measure: Mapping[str, Any], family: Mapping[str, Any] | None = None,
                mechanism: tuple[bool | None, str] | None = None, baselines_differ: bool = False) -> dict[str, Any]:
    """{"verdict", "detail"} by VERDICT_RULE from our summary (`summarize` of the paired differences, or of softmax's
    values for a baseline claim), the row's family comparison ({"p", "p_holm", "family"}), and its mechanism evidence
    ((active, evidence) or None when the variant declares no diagnostic). Fewer than 2 pairs leave no CI: inconclusive."""
    low, high = measure["ci_low"], measure["ci_high"]
    if low is None:
        return {"verdict": INCONCLUSIVE, "detail": f"{measure['n']} finished pair(s): no confidence interval"}
    if claim["kind"] == "baseline":
        target = claim["value"]["mean"]
        if low <= target <= high:
            return {"verdict": REPRODUCED, "detail": None}
        return {"verdict": NOT_REPRODUCED, "detail": f"our softmax is {measure['mean'] - target:+.2f} from the paper's {target:.2f}"}
    expected = claim["sign"] if claim["kind"] == "direction" else math.copysign(1.0, paper_delta(claim))
    delta = paper_delta(claim)
    excludes_zero = not low <= 0.0 <= high
    p_holm = (family or {}).get("p_holm")
    corrected = excludes_zero and p_holm is not None and p_holm < ALPHA
    alone = None
    if excludes_zero and not corrected:
        alone = (f"significant alone (p {family['p']:.3f}) but not after Holm over the table's {family['family']} comparisons "
                 f"(p {p_holm:.3f})" if p_holm is not None else "significant alone; no family to correct over")
    verdict, detail = INCONCLUSIVE, alone
    if corrected:
        sign = 1.0 if low > 0 else -1.0
        if sign == expected:
            verdict = REPRODUCED
            if delta is not None and not low <= delta <= high:
                size = "smaller" if abs(high if sign > 0 else low) < abs(delta) else "larger"
                detail = f"the sign only: {size} than the paper's Δ, which the CI excludes"
            else:
                detail = None
            detail = ", ".join(part for part in (detail, f"Holm p {p_holm:.3f}") if part)
        else:
            verdict, detail = OPPOSITE, f"Holm p {p_holm:.3f}"
    elif delta is not None and (high < delta if delta > 0 else low > delta):
        verdict = NOT_REPRODUCED
        detail = "the CI excludes the paper's Δ" + (f"; {alone}" if alone else "")
    if verdict in NEGATIVE and mechanism is not None and mechanism[0] is not True:
        why = "mechanism inactive" if mechanism[0] is False else "no mechanism evidence at the evaluated weights"
        return {"verdict": INCONCLUSIVE, "detail": f"{why}: {mechanism[1]} (else: {verdict})", "withheld": verdict}
    if verdict in NEGATIVE and baselines_differ:
        verdict_text = f"{verdict} in this setup"
        return {"verdict": verdict, "detail": detail, "in_this_setup": True, "label": verdict_text}
    return {"verdict": verdict, "detail": detail}


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
    text = row.get("label") or row["verdict"]
    if row["verdict"] == "structural":
        return "structural: checked by the evidence listed"
    if row["verdict"] == NOT_RUN_HERE:
        return f"{NOT_RUN_HERE} (why: below the table)"
    extra = row.get("reason") or row.get("detail")
    if row["verdict"] == INCONCLUSIVE and row.get("resolution") is not None and not row.get("withheld"):
        extra = f"resolution {row['resolution']:.2f} points" + (f"; {extra}" if extra else "")
    if row.get("interim"):
        extra = (f"{extra}; " if extra else "") + f"interim: {row['interim']}"
    if row.get("rests_on_added_seeds"):
        first = row["first_seeds"]
        extra = (f"{extra}; " if extra else "") + f"rests on seeds added later (on the first {first['seeds']} declared: {first['verdict']})"
    return f"{text}: {extra}" if extra else text


def config_text(row: Mapping[str, Any]) -> str:
    """Where the measured configuration comes from: paper, tuned (trials, metric), or default."""
    source = row.get("config")
    if source is None:
        return "—"
    if source == "tuned" and row.get("tuning"):
        kept = "; the defaults won" if row["tuning"].get("kept_defaults") else ""
        failed = row["tuning"].get("failed") or 0
        failed = f"; {failed} more failed (killed and retried, or diverged)" if failed else ""
        return f"tuned ({row['tuning']['trials']} trials, {row['tuning']['metric']}{kept}{failed})"
    return source


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
        "config": config_text(row),
        "verdict": verdict_text(row),
    }


COLUMNS = (("claim", "claim"), ("task", "task (host)"), ("paper", "paper"), ("paper_delta", "paper Δ"),
           ("measured_by", "measured by (suite / task / variant)"), ("config", "configuration"), ("ours", "ours [95% CI]"),
           ("n", "n"), ("resolution", "resolution"), ("verdict", "verdict"))


def row_notes(row: Mapping[str, Any]) -> list[str]:
    """Notes under a paper's table: the claim's own note, a baseline that differs, a setting that differs."""
    claim = row["claim"]
    notes = []
    if claim.get("note"):
        notes.append(claim["note"])
    if row.get("baseline_note"):
        notes.append(row["baseline_note"])
    for name in ("baseline", "method"):
        value = claim.get(name) or {}
        if value.get("from") and value["from"] != claim["paper"]:
            notes.append(f"The paper's Δ is taken across papers: its {claim['method']['name'] if name == 'baseline' else 'method'} runs against "
                         f"{value['name']} {value['mean']:.2f} as published by paper `{value['from']}`, not a baseline it ran itself")
    if row.get("config") and claim.get("config", {}).get("note"):
        notes.append(f"Configuration ({row['config']}): {claim['config']['note']}")
    if row.get("mechanism"):
        state = {True: "Mechanism active", False: "Mechanism inactive", None: "No mechanism evidence"}[row["mechanism"]["active"]]
        notes.append(f"{state}: {row['mechanism']['evidence']}")
    if row.get("first_seeds"):
        first = row["first_seeds"]
        notes.append(f"On the first {first['seeds']} declared seeds: {_ci(first['measure'], True)}, {first['verdict']}"
                     + (f" ({first['detail']})" if first.get("detail") else "")
                     + ("; the verdict on all seeds rests on the seeds added later" if row.get("rests_on_added_seeds") else "; the same verdict"))
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
    finding, *summary = summary_lines(board)
    out.write(f"{finding}\n\n" + "".join(f"{line}\n" for line in summary) + "\n")
    out.write("Generated by `attnbench leaderboard --claims` (`make leaderboard`) from `harness/claims.yaml` and the run "
              "records; do not edit by hand. To add a claim, see README, \"Claims\".\n\n")
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
    order = (REPRODUCED, NOT_REPRODUCED, OPPOSITE, INCONCLUSIVE, NOT_JUDGED, NOT_RUN_YET, NOT_RUN_HERE, "structural")
    return {name: sum(1 for row in board["rows"] if row["verdict"] == name) for name in order}


def summary_lines(board: Mapping[str, Any], code: Any = lambda text: f"`{text}`") -> list[str]:
    """The page's opening for a reader in a hurry, generated from the rows: the counts, what holds, what does not,
    what is open and why, and the caveats. One bullet per line (Markdown); the HTML page shows the same lines."""
    rows = board["rows"]

    def ids(selected) -> str:
        return ", ".join(code(row["claim"]["id"]) for row in selected)

    def with_delta(row) -> str:
        return f"{code(row['claim']['id'])} ({_ci(row.get('measure'), row['claim']['kind'] != 'baseline')})"

    counts = _verdict_counts(board)
    lines = [finding_line(board, code), "**Summary.** Verdicts: " + ", ".join(f"{name} {n}" for name, n in counts.items()) + "."]
    holds = [r for r in rows if r["verdict"] == REPRODUCED]
    lines.append("- Holds here: " + (", ".join(with_delta(r) for r in holds) if holds else "no measured claim") + ".")
    fails = [r for r in rows if r["verdict"] in NEGATIVE]
    if fails:
        lines.append("- Does not hold here: " + ", ".join(f"{with_delta(r)} {r.get('label') or r['verdict']}" for r in fails) + ".")
    withheld = [r for r in rows if r.get("withheld")]
    unresolved = [r for r in rows if r["verdict"] == INCONCLUSIVE and not r.get("withheld")]
    if withheld or unresolved:
        parts = []
        if withheld:
            parts.append(f"a negative verdict withheld because the mechanism was not shown active at the evaluated weights: {ids(withheld)}")
        if unresolved:
            parts.append(f"within what the seeds resolve, or not significant after Holm: {ids(unresolved)}")
        lines.append("- Open: " + "; ".join(parts) + ".")
    caveats = []
    setup = [r for r in rows if r.get("in_this_setup")]
    if setup:
        caveats.append(f"our `softmax` baseline differs from the paper's beyond its CI, so these verdicts speak for this setup: {ids(setup)}")
    crossed = [r for r in rows if r.get("measure") and any((r["claim"].get(n) or {}).get("from") not in (None, r["claim"]["paper"]) for n in ("baseline", "method"))]
    if crossed:
        caveats.append(f"the paper's Δ is taken across papers (its runs against another paper's published baseline): {ids(crossed)}")
    added = [r for r in rows if r.get("rests_on_added_seeds")]
    if added:
        caveats.append(f"the verdict rests on seeds added after the first declared ones: {ids(added)}")
    unjudged = [r for r in rows if r["verdict"] == NOT_JUDGED]
    if unjudged:
        caveats.append(f"run at attnbench's default configuration, shown but not judged: {ids(unjudged)}")
    pending = [r for r in rows if r["verdict"] == NOT_RUN_YET]
    if pending:
        caveats.append(f"not run yet: {ids(pending)}")
    elsewhere = [r for r in rows if r["verdict"] == NOT_RUN_HERE]
    if elsewhere:
        caveats.append(f"{len(elsewhere)} claims need what this machine lacks (a GPU, ALBERT weights, full VQA or COCO data; each paper's table says which)")
    if caveats:
        lines.append("- Caveats: " + "; ".join(caveats) + ".")
    attention = host_attention_line(board.get("host_attention") or [], code)
    if attention:
        lines.append(attention)
    for suite, history in (board.get("seed_history") or {}).items():
        lines.extend(f"- Seed history of {code(suite)}, checked against its records: {line}" for line in history)
    return lines


def finding_line(board: Mapping[str, Any], code: Any = lambda text: f"`{text}`") -> str:
    """The page's first line: what the measured claims come to, in one sentence (the counts and caveats follow)."""
    rows = board["rows"]
    measured = [r for r in rows if r["verdict"] not in (NOT_RUN_HERE, "structural")]
    holds = [r for r in measured if r["verdict"] == REPRODUCED]
    fails = [r for r in measured if r["verdict"] in NEGATIVE]
    open_ = [r for r in measured if r not in holds and r not in fails]

    def named(selected) -> str:
        return ", ".join(code(r["claim"]["id"]) for r in selected) if selected else "none"

    elsewhere = sum(1 for r in rows if r["verdict"] == NOT_RUN_HERE)
    return (f"**Finding.** Of the {len(measured)} claims this machine can measure, {len(holds)} hold{'s' if len(holds) == 1 else ''} "
            f"({named(holds)}), {len(fails)} do{'es' if len(fails) == 1 else ''} not ({named(fails)}) and {len(open_)} "
            f"{'is' if len(open_) == 1 else 'are'} open; {elsewhere} more need what it lacks.")

