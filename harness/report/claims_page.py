"""The claims page's text: cells, notes, the opening summary and the Markdown page, from the claims board alone
(harness.report.claims builds it). html_page.render_claims_html shows the same cells and lines."""

from __future__ import annotations

import io
import re
from typing import Any, Mapping

from harness.report.verdicts import (INCONCLUSIVE, NEGATIVE, NOT_JUDGED, NOT_REPRODUCED, NOT_RUN_HERE, NOT_RUN_YET, OPPOSITE,
                                     REPRODUCED, paper_delta)


NEAR_UNIFORM = 0.95
"""Softmax's evaluated attention is called near uniform on a host where its entropy is at least this share of the
uniform distribution's over the same keys: within 5% of the most spread-out attention possible."""


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
    text = f"{text}: {extra}" if extra else text
    beside = [part for part in (mechanism_words(row), tuning_words(row), "the paper's figure is untraced" if row.get("untraced") else None) if part]
    return "; ".join([text, *beside])


def _setting_words(row: Mapping[str, Any]) -> str:
    setting = row.get("setting")
    if not setting or setting.get("ours") is None:
        return ""
    if row.get("config") == "paper":
        return f"at the paper's {'λ' if setting['name'] == 'weight' else setting['name']} = {setting['paper']:g}, "
    return f"at {setting['name']} {setting['ours']:g}, "


def mechanism_words(row: Mapping[str, Any]) -> str | None:
    """The mechanism beside the verdict: the declared paired test where the variant's rule compares with softmax
    ("at the paper's λ = 0.01, queries and keys did not move closer than softmax's (...)"), else the kernel's
    threshold rule over the seeds with evidence, each threshold's post hoc declaration named."""
    late = [entry for entry in (row.get("mechanism") or {}).get("post_hoc") or () if entry.get("post_hoc")]
    thresholds = "".join(f"; its {entry['diagnostic']} threshold is post hoc (declared at {entry['commit']}, after {entry['before']} of "
                         f"{entry['of']} of these runs had finished)" for entry in late)
    test = row.get("mechanism_test")
    if test is not None and test.n > 0:
        if test.diagnostic == "qk_distance":
            what = "queries and keys moved closer than softmax's" if test.moved else "queries and keys did not move closer than softmax's"
            figure = "q/k distance"
        else:
            what = f"{test.diagnostic} {'fell below' if test.moved else 'did not fall below'} softmax's"
            figure = test.diagnostic
        holm = f", Holm p {test.p_holm:.3f}" if test.p_holm is not None else ""
        late_test = f"; test declared at {test.declared}, after these runs: post hoc" if test.post_hoc else ""
        return (f"{_setting_words(row)}{what} ({figure} ÷ softmax's at the same seed, median ×{test.median_ratio:.3f} over {test.n} seeds"
                f"{f', {test.without} without evidence' if test.without else ''}; one-sided Wilcoxon p {test.p:.3f}{holm}{late_test})")
    if test is not None:
        return f"mechanism: {test.diagnostic} has no evidence at the evaluated weights in these records"
    mechanism = row.get("mechanism")
    if not mechanism:
        return None
    state = {True: "active", False: "inactive", None: "no evidence at the evaluated weights"}[mechanism["active"]]
    counted = re.search(r"in (\d+ of \d+ seeds with evidence)", mechanism["evidence"])
    return f"mechanism by the kernel's rule: {state}" + (f" ({counted.group(1)})" if counted else "") + thresholds


def tuning_words(row: Mapping[str, Any]) -> str | None:
    """A tuned row against a `softmax` without a tuning budget: the asymmetry named beside the verdict."""
    if not row.get("tuning_asymmetry"):
        return None
    trials = (row.get("tuning") or {}).get("trials")
    return (f"tuning asymmetry: this row was tuned on validation data ({trials} trials), `softmax` was not"
            if trials else "tuning asymmetry: this row was tuned on validation data, `softmax` was not")


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
        "paper": paper_cell(claim) + (" (untraced)" if row.get("untraced") else ""),
        "table": (claim.get("table") or "—") + (" (untraced)" if row.get("untraced") else ""),
        "paper_delta": _points(delta, True) if delta is not None else ("+" if claim.get("sign", 0) > 0 else "−" if claim.get("sign") else "—"),
        "measured_by": where,
        "ours": _ci(measure, signed=claim["kind"] != "baseline"),
        "n": str(measure["n"]) if measure else "—",
        "resolution": _points(row.get("resolution")) if row.get("resolution") is not None else "—",
        "config": config_text(row),
        "verdict": verdict_text(row),
    }


COLUMNS = (("claim", "claim"), ("task", "task (host)"), ("table", "paper's table"), ("paper", "paper"), ("paper_delta", "paper Δ"),
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
        dated = "; ".join(
            f"threshold of {entry['diagnostic']} declared at {entry['commit']} ({entry['at'][:10]})"
            + (f", after {entry['before']} of {entry['of']} of these runs had finished: *post hoc*" if entry.get("post_hoc") else ", before these runs finished")
            + (f" ({entry['note']})" if entry.get("note") else "")
            if entry.get("commit") else f"threshold of {entry['diagnostic']}: not dated in claims.yaml"
            for entry in row["mechanism"].get("post_hoc") or ())
        notes.append(f"{state} by the kernel's rule (reported, not deciding the verdict): {row['mechanism']['evidence']}"
                     + (f". {dated[0].upper()}{dated[1:]}" if dated else ""))

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
              "records; do not edit by hand. To add a claim, see docs/guides/reading-boards.md, \"Adding a claim\".\n\n")
    out.write(f"{board['rule']} {board['resolution_rule']} Values are in the paper's units (points).\n\n")
    if mechanism_rule_text(board):
        out.write(f"{mechanism_rule_text(board)}\n\n")
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
        if paper.get("untraced"):
            out.write(f" **Figures untraced**: {paper['untraced']}.")
        out.write("\n\n")
        measured = [row for row in rows if row["claim"]["kind"] != "structural"]
        if measured:
            out.write("| " + " | ".join(title for _, title in COLUMNS) + " |\n")
            out.write("|" + "|".join("---" if name in ("claim", "task", "table", "measured_by", "verdict") else "---:" for name, _ in COLUMNS) + "|\n")
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
    unresolved = [r for r in rows if r["verdict"] == INCONCLUSIVE]
    if unresolved:
        lines.append(f"- Open: within what the seeds resolve, or not significant after Holm: {ids(unresolved)}.")
    lines.extend(mechanism_lines(board, code))
    if board.get("dose_finding"):
        lines.append(f"- The λ dose-response of the alignment claims (dose-response.md, suite {code('align-lambda')}): {board['dose_finding']}")
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
    tuned = [r for r in rows if r.get("tuning_asymmetry") and r["verdict"] not in (NOT_RUN_YET, NOT_RUN_HERE)]
    if tuned:
        caveats.append(f"tuned on validation data against a `softmax` given no tuning budget (the comparison favours the tuned row): {ids(tuned)}")
    untraced = [r for r in rows if r.get("untraced") and r["verdict"] not in (NOT_RUN_HERE,)]
    if untraced:
        caveats.append(f"the paper's figure is untraced (no copy of its table could be checked here), and so is the verdict resting on it: {ids(untraced)}")
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


def mechanism_rule_text(board: Mapping[str, Any]) -> str | None:
    """The declared mechanism test in words, from claims.yaml's `mechanism_test`."""
    spec = board.get("mechanism_test")
    if spec is None:
        return None
    return (f"Mechanism test (declared at {spec.declared.commit}, {spec.declared.at[:10]}): per seed, the log of the variant's "
            "q/k distance at its evaluated weights over `softmax`'s at the same task and seed (values at the evaluated "
            "weights only, `test/diag/*` or `test/attn/*`; a seed without them on either side is left out and counted); a "
            f"one-sided exact Wilcoxon signed-rank test (the distance is lower), Holm-corrected over the page's "
            f"{board.get('mechanism_family', 0)} mechanism tests at α = {spec.alpha:g}. It is reported beside the verdict "
            "on the claim as stated, never deciding it. Where it was declared after the runs it judges had finished, it "
            "is marked post hoc; kernel thresholds likewise (claims.yaml `thresholds`).")


def mechanism_lines(board: Mapping[str, Any], code: Any = lambda text: f"`{text}`") -> list[str]:
    """The summary's mechanism bullets: each test's outcome, and the test's false-active rate under its null."""
    rows = [r for r in board["rows"] if r.get("mechanism_test") is not None and r["mechanism_test"].n > 0]
    lines = []
    if rows:
        moved = [r for r in rows if r["mechanism_test"].moved]
        still = [r for r in rows if not r["mechanism_test"].moved]
        parts = []
        if moved:
            parts.append("moved: " + ", ".join(f"{code(r['claim']['id'])} (Holm p {r['mechanism_test'].p_holm:.3f})" for r in moved))
        if still:
            parts.append("did not move: " + ", ".join(f"{code(r['claim']['id'])} (×{r['mechanism_test'].median_ratio:.3f}, p "
                                                      f"{r['mechanism_test'].p:.3f}, Holm {r['mechanism_test'].p_holm:.3f})" for r in still))
        late = [r for r in rows if r["mechanism_test"].post_hoc]
        lines.append("- Mechanism, by the declared paired test (queries and keys closer than under `softmax`): " + "; ".join(parts) + "."
                     + (f" Declared after these runs had finished, so post hoc for {ids_of(late, code)}." if late else ""))
    null = board.get("mechanism_null") or []
    if null:
        spec = board.get("mechanism_test")
        within = all(n.within for n in null)
        lines.append(f"- The mechanism test's false-active rate under its null (`softmax` against `softmax`: {null[0].draws} draws, "
                     f"rng seed {spec.null.rng_seed if spec else 0}, each pairing one half of a task's seeds with the other, "
                     "uncorrected one-sided test at α = 0.05): "
                     + "; ".join(f"{code(n.task)} ({code(n.suite)}) {n.rate:.1%} ({n.rejected} of {n.draws} draws, {n.pairs} pairs)" for n in null)
                     + f"; declared ceiling {null[0].ceiling:.0%}: {'within it' if within else 'ABOVE it: the test calls softmax active against itself too often here'}.")
    return lines


def ids_of(rows, code) -> str:
    return ", ".join(code(row["claim"]["id"]) for row in rows)


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
