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
from harness.report.stats import ALPHA, CONFIDENCE, POWER, detectable_difference, summarize
from harness.report.verdicts import (INCONCLUSIVE, NEGATIVE, NOT_JUDGED, NOT_REPRODUCED, NOT_RUN_HERE, NOT_RUN_YET,  # noqa: F401
                                     OPPOSITE, REPRODUCED, paper_delta, verdict_for)
from harness.results.record import Record, Status
from harness.report.claims_model import ClaimRow, ClaimsBoard
from harness.report.mechanism_test import (ALTERNATIVES, MechanismTest, NullRate, corrected, log_ratios, median_ratio, null_rate,
                                           wilcoxon_of_ratios)

BASELINE = "softmax"
VERDICT_RULE = (
    f"Our Δ is the mean paired difference of the variant from `softmax` over the seeds both finished, with its "
    f"{CONFIDENCE:.0%} CI (paired t). A significant effect must also survive the multiplicity of its family: the Holm "
    "correction over every variant compared with `softmax` on the same task and metric, as the suite's leaderboard applies it "
    f"(corrected p < {ALPHA:g}). **reproduced**: the effect has the paper's sign and is significant after correction. "
    "**opposite effect**: the effect has the other sign and is significant after correction. **not reproduced**: the CI "
    "excludes the paper's Δ on the side of a smaller effect. **inconclusive**: neither; the resolution says how large a "
    "difference these seeds could have seen. The claim is judged as stated, by the same rules for either sign: a "
    "mechanism that did not act is a failure of the claim at that setting, not a reason to withhold the verdict. Beside "
    "each verdict the mechanism is reported, read at the evaluated weights only (those the stopping rule kept, which gave "
    "the test numbers): the declared paired test where the variant's rule compares with `softmax` (below), else the "
    "kernel's threshold rule over the seeds whose records carry the evidence (modules/attention/mechanism.py), with the "
    "commit that declared each threshold, *post hoc* where that came after the runs it judges had finished. A row tuned "
    "on validation data is compared with a `softmax` that was not, and says so beside its verdict. A paper figure that "
    "could not be checked against the paper here is marked *untraced*, and its verdict with it. **not judged**: "
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


def build_claims_board(claims: Mapping[str, Any], runs: str | Path | None, data_root: str | None) -> ClaimsBoard:
    """Plan each suite a claim names once, load its records from the store `runs`, and measure every claim. A suite's
    tuned rows are the ones it lists (`tuned`), from the committed tuned parameters."""
    from harness.report.loading import load_suite_records, open_store

    store = open_store(runs)
    plans, records, evidence = {}, {}, {}
    measured = {c["measured_by"]["suite"] for c in claims["claims"] if "measured_by" in c}
    for suite in sorted(measured | set(_cost_suites(claims))):
        loaded = load_suite_records(suite, store, data_root)
        plans[suite], records[suite], evidence[suite] = loaded.plan, loaded.records, loaded.evidence
    board = measure_claims(_with_measured_costs(claims, plans, records), {s: plans[s] for s in measured},
                           {s: records[s] for s in measured}, {s: evidence[s] for s in measured})
    from harness.report.board import without_data_root  # a reason names files under this machine's data root

    rows = []
    for row in board.rows:
        suite = (row.claim.get("measured_by") or {}).get("suite")
        if row.reason and suite in plans:
            row = row.replace(reason=without_data_root(row.reason, plans[suite].data_root))
        rows.append(row)
    return board.replace(rows=tuple(rows), host_attention=tuple(host_attention(plans, records, evidence)),
                         seed_history={suite: lines for suite in sorted(measured)
                                       if (lines := seed_history_lines(plans[suite].suite, plans[suite].specs, records[suite]))})


COST_PLACEHOLDER = re.compile(r"\{cost:([a-z0-9-]+)\}")
"""`{cost:<suite>}` in a claim's `not_here`: replaced by the measured time per run of that suite's committed records,
where cost, not a missing file, is why the claim is not run here (a page that says "hours" where MiniLM on RTE
took a median 23.9 minutes misleads)."""


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
    executions the mechanism evidence comes from), where its records carry the uniform reference (runs that measured it)."""
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
                   evidence: Mapping[str, Mapping[str, Record]] | None = None) -> ClaimsBoard:
    """The claims board (claims_model.ClaimsBoard, frozen): per claim its paper's numbers, our measurement, the verdict
    and the mechanism beside it. `evidence`: per suite, the record to read mechanism evidence from where a key ran
    more than once (evidence.evidence_record); the metrics always come from `records`."""
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
            row.update(_measure(claim, plans[measured["suite"]], suite_records, diagnosed, claims))
            if paper.get("setting") and row.get("attention"):
                setting = paper["setting"]
                row["setting"] = {"name": setting["name"], "paper": setting["paper"], "ours": row["attention"].get(setting["name"])}
        if claims["papers"][claim["paper"]].get("untraced") and claim["kind"] in ("baseline", "gain"):
            row["untraced"] = claims["papers"][claim["paper"]]["untraced"]
        rows.append(row)
    tests = corrected((row["claim"]["id"], row["mechanism_test"]) for row in rows if row.get("mechanism_test"))
    for row in rows:
        if row.get("mechanism_test"):
            row["mechanism_test"] = tests[row["claim"]["id"]]
    spec = _get(claims, "mechanism_test")
    return ClaimsBoard(claims["papers"], tuple(ClaimRow.of(row) for row in rows), CONFIDENCE, VERDICT_RULE, RESOLUTION_RULE,
                       mechanism_test=spec, mechanism_null=tuple(mechanism_null(spec, plans, records, evidence)) if spec else (),
                       mechanism_family=len([t for t in tests.values() if t.n > 0]))


def _get(claims: Mapping[str, Any], name: str) -> Any:
    return claims.get(name) if isinstance(claims, Mapping) else getattr(claims, name, None)


def mechanism_null(spec, plans, records, evidence) -> list[NullRate]:
    """The declared test's false-active rate under softmax against softmax, per suite and task a mechanism test reads:
    softmax's evaluated diagnostic per seed (the evidence records), split in halves `spec.null.draws` times."""
    from modules.attention.mechanism import evaluated

    found = []
    for suite, the_plan in sorted(plans.items()):
        read = {**records[suite], **(evidence or {}).get(suite, {})}
        for task in sorted({s.task for s in the_plan.specs}):
            values = {s.seed: evaluated(read[s.key], "qk_distance") for s in _specs(the_plan, task, BASELINE) if s.key in read
                      and read[s.key].status is Status.OK}
            values = {seed: v for seed, v in values.items() if v is not None}
            if len(values) < 2:
                continue
            rejected, pairs = null_rate(values, "less", spec.alpha, spec.null.draws, spec.null.rng_seed)
            found.append(NullRate(suite, task, len(values), pairs, spec.null.draws, rejected, spec.null.max_false_active))
    return found


def _measure(claim: Mapping[str, Any], the_plan, records: Mapping[str, Record], diagnosed: Mapping[str, Record] | None = None,
             claims: Mapping[str, Any] | None = None) -> dict[str, Any]:
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
    thresholds = _get(claims, "thresholds") if claims is not None else None
    mechanism = _mechanism(own[0].variant, [diagnosed.get(s.key) for s in own], [diagnosed.get(s.key) for s in base],
                           thresholds) if claim["kind"] != "baseline" else None
    if mechanism is not None:  # shown on every measured row, a not-judged one too: the evidence is the records'
        result["mechanism"] = {"active": mechanism[0], "evidence": mechanism[1], "post_hoc": mechanism[2]}
        test_spec = _get(claims, "mechanism_test") if claims is not None else None
        if test_spec is not None:
            test = _mechanism_test(own[0].variant, own, base, diagnosed, test_spec)
            if test is not None:
                result["mechanism_test"] = test
    if source == "tuned":
        result["tuning_asymmetry"] = True  # the tuned row is compared with a softmax that had no tuning budget
    if source == "default":
        result.update(verdict=NOT_JUDGED, reason="attnbench's default configuration, neither the paper's nor tuned on validation data")
        return result
    family = _family(the_plan, records, task, measured["metric"])
    result.update(verdict_for(claim, result["measure"], family.get(own[0].display), result.get("baselines_differ", False)), reason=None)
    if len(recorded) < len(seeds):
        # a task with more seeds than the suite's common ones adds them to resolve more: the seeds it has are the
        # first ones, chosen by number, not by outcome, so their verdict stands meanwhile
        result["interim"] = progress
    first = _first_declared_seeds(the_plan.suite, task)
    if claim["kind"] != "baseline" and first and set(first) < set(recorded):
        subset = sorted(set(first) & set(ours) & set(softmax))
        measure = summarize([ours[seed] - softmax[seed] for seed in subset])
        family_first = _family(the_plan, records, task, measured["metric"], seeds=set(first))
        on_first = verdict_for(claim, measure, family_first.get(own[0].display), result.get("baselines_differ", False))
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
    """Per row of the task's table: its comparison with `softmax` in the table's Holm family, computed by the boards'
    own function (board.paired_comparisons: the family the suite's leaderboard marks rows by), over the seeds both
    finished, within `seeds` when the verdict on the first declared seeds is asked."""
    from harness.report.board import paired_comparisons

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
    return paired_comparisons(by_row, BASELINE)


def _judged_finish(records: list[Record]) -> list[str | None]:
    """When the runs a rule judges finished: each shown record's finish time (the run existed, with its training-time
    diagnostics, from then on, whatever execution later re-measured it)."""
    return [r.finished for r in records]


def _post_hoc(declared, records: list[Record]) -> dict[str, Any] | None:
    """{commit, at, before, of}: how many of the judged runs had finished when the rule was declared; None when none had."""
    finished = _judged_finish(records)
    before = sum(1 for f in finished if declared.after(f))
    return {"commit": declared.commit, "at": declared.at, "before": before, "of": len(finished), "post_hoc": before > 0}


def _mechanism(variant: str, own: list[Record | None], base: list[Record | None],
               thresholds=None) -> tuple[bool | None, str, list[dict[str, Any]]] | None:
    """The variant's kernel rule (modules/attention/mechanism.py), read at each run's evaluated weights, seed by seed
    against softmax's record of the same seed: active when it was in at least half the seeds that carry the evidence,
    counted over those seeds only (the seeds without it are named apart); None (no evidence) when no record carries
    it; None overall for a variant that declares no ruled diagnostic. The evidence names each ruled figure's median
    beside its rule, and each threshold's declaring commit from claims.yaml (`thresholds`), marked post hoc where it
    came after runs it judges had finished. Reported beside the verdict, never deciding it."""
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
    dated = []
    for d in ruled:
        entry = next((t for t in thresholds or () if t.variant == variant and t.diagnostic == d.name), None)
        judged = [r for r, b in pairs if ruled_figure(d, r, b) is not None]
        if entry is None:
            dated.append({"diagnostic": d.name, "rule": describe_rule(d), "commit": None})
        elif judged:
            dated.append({"diagnostic": d.name, "rule": describe_rule(d), **_post_hoc(entry.declared, judged),
                          **({"note": entry.note} if entry.note else {})})
    shown = [v for v in verdicts if v[0] is not None]
    if not shown:
        return None, f"{NO_EVIDENCE} in any of {len(verdicts)} records (made before runs measured it: re-run them); e.g. {verdicts[0][1]}", dated
    active = sum(1 for v in shown if v[0])
    figures = []
    for d in ruled:
        values = sorted(f for f in (ruled_figure(d, r, b) for r, b in pairs) if f is not None)
        if values:
            figures.append(f"median {figure_name(d)} {statistics.median(values):.3g} (range {values[0]:.4g}–{values[-1]:.4g}) over "
                           f"{len(values)} seeds (rule: {describe_rule(d)})")
    example = next((v[1] for v in shown if v[0] == (2 * active >= len(shown))), shown[0][1])
    return 2 * active >= len(shown), (f"active at the evaluated weights in {active} of {len(shown)} seeds with evidence"
                                      + (f" ({len(verdicts) - len(shown)} without evidence)" if len(shown) < len(verdicts) else "")
                                      + f"; {'; '.join(figures)}; e.g. {example}"), dated


def _mechanism_test(variant: str, own_specs, base_specs, diagnosed: Mapping[str, Record], spec) -> MechanismTest | None:
    """The declared paired test for a variant whose kernel compares a diagnostic with the baseline's ('below-baseline'):
    log(own / baseline) per seed where both records carry it at their evaluated weights; None for other rules."""
    from modules.attention.mechanism import declared_mechanism, evaluated

    declared, _ = declared_mechanism(variant)
    rule = next((d for d in declared if d.rule in ALTERNATIVES and d.baseline == BASELINE), None)
    if rule is None:
        return None
    own = {s.seed: diagnosed.get(s.key) for s in own_specs}
    own = {seed: r for seed, r in own.items() if r is not None and r.status is Status.OK}
    base = {s.seed: diagnosed.get(s.key) for s in base_specs}
    base = {seed: r for seed, r in base.items() if r is not None and r.status is Status.OK}
    ratios = log_ratios({seed: evaluated(r, rule.name) for seed, r in own.items()},
                        {seed: evaluated(r, rule.name) for seed, r in base.items()})
    alternative = ALTERNATIVES[rule.rule]
    p, _ = wilcoxon_of_ratios(ratios, alternative)
    n = len(ratios)  # seeds paired (Wilcoxon drops zero ratios from its own count)
    judged = [own[seed] for seed in ratios]
    post_hoc = bool(judged) and any(spec.declared.after(r.finished) for r in judged)
    return MechanismTest(rule.name, BASELINE, alternative, n, len(own) - len(ratios), median_ratio(ratios), p, spec.alpha,
                         spec.declared.commit, post_hoc)


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
