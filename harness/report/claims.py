"""The papers' claims (harness/claims.yaml) against our records -> leaderboards/claims.{md,html}.

A claim names the suite, task and variant that measure it. Our measurement of a gain is the mean paired
difference of the variant from `softmax` over the seeds both finished, with its paired-t confidence interval
(stats.summarize of the differences) and its resolution (stats.detectable_difference: the smallest true
difference these pairs detect with 80% power, the boards' notion, here for the one pair of rows the claim
compares). The verdict follows VERDICT_RULE, printed on the page. Everything is in a fixed order and format,
so the same records give byte-identical pages (CI re-renders them with `make leaderboard`).

The claims file's schema is harness.report.claims_schema, the verdict rules harness.report.verdicts and the page's
text harness.report.claims_page; this module measures (plans and records in, the claims board out) and keeps their
names importable from here."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any, Mapping

from harness.report.claims_page import (COLUMNS, NEAR_UNIFORM, config_text, finding_line, host_attention_line, paper_cell,  # noqa: F401
                                        render_claims_markdown, row_cells, row_notes, summary_lines, table_notes, verdict_text)
from harness.report.claims_schema import CLAIMS_FILE, CONFIG_SOURCES, KINDS, ClaimsError, load_claims  # noqa: F401
from harness.report.seed_history import seed_history_lines
from harness.report.stats import ALPHA, CONFIDENCE, POWER, detectable_difference, holm, paired_p, summarize
from harness.report.verdicts import (INCONCLUSIVE, NEGATIVE, NOT_JUDGED, NOT_REPRODUCED, NOT_RUN_HERE, NOT_RUN_YET,  # noqa: F401
                                     OPPOSITE, REPRODUCED, paper_delta, verdict_for)
from harness.results.record import Record, Status
from harness.results.store import diagnosed_execution

BASELINE = "softmax"
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
