"""What a board says: every sentence, line and legend the Markdown and HTML boards print, built from the board
model (harness/report/board.py) and nothing else, so that both renderings say the same words about the same
numbers. The model holds numbers and marks; this module holds the words about them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Mapping

from harness.report.board import Board, GroupFinding, Table, as_board
from harness.report.stats import ALPHA, BASELINE, CONFIDENCE, MIN_SEEDS_TO_RANK, metric_range
from harness.timing import format_duration


def _backticks(text: str) -> str:
    return f"`{text}`"


# ---- the legend: what the cells, marks and columns mean, printed after the tables --------------------------

TEST_DESCRIPTION = "paired t-test over seeds vs softmax, Holm-corrected across the variants of a task"
CHANCE_DESCRIPTION = ("one-sided test that the primary metric beats the task's trivial baseline: a one-sample t-test over the "
                      "seeds (2 or more), an exact binomial test of the correct count on the test examples (one seed, accuracies); "
                      "correlations (MCC, Pearson, Spearman) are tested against 0, no association, which is what any input-blind "
                      "predictor has (one seed: MCC·√n standard normal, Pearson and Spearman by Student's t with n−2 degrees of "
                      "freedom); other metrics have no one-seed test (a table's footnote says why); p Holm-corrected across the "
                      "table's variants, as the Δ tests are (one family per table), and a row is at chance when its Holm p >= α")
RESOLUTION_DESCRIPTION = ("the smallest true difference from softmax in the primary metric that a two-sided paired t-test at α "
                          "(before Holm) detects with 80% power at the table's seed count (the median of its variants' paired seeds), "
                          "given the paired spread the table shows "
                          "(the median over its variants; a variant that varies more than 1.5 times that is named with its own)")
RANKING_DESCRIPTION = ("a rank never orders rows the table cannot tell apart: the rows significantly better than softmax "
                       "in the primary metric (▲) share rank 1, the rows not significantly different from softmax (softmax "
                       "included) share the next rank, the ▼ rows the one after it (competition ranking: a rank is 1 + the "
                       "rows in better tiers, e.g. 1, 1, 3, 3, 3, 6); within a rank rows are listed by mean; rows with fewer "
                       f"than {MIN_SEEDS_TO_RANK} finished seeds are not ranked")
OVERALL_DESCRIPTION = ("mean over the tasks a variant has a ranked row on of its rank there (the shared ranks above, so a task "
                       "whose rows the tests cannot tell apart gives every variant rank 1); ▲ / ▼ count the tasks whose "
                       "primary metric is significantly better / worse than softmax")
CI_CLIP_DESCRIPTION = ("confidence intervals are clipped to the values the metric can take (percentages [0, 100], "
                       "correlations [-1, 1], losses, NLL and CIDEr-D >= 0) and marked † where clipped")


UNDER_TRAINED_DESCRIPTION = ("under a table, the finished runs that trained to their epoch cap, i.e. whose stopping rule never "
                             "fired (they may still have been improving), and those whose kept epoch lay within 5% of the cap")
ENTROPY_DESCRIPTION = ("per variant and attention layer, the mean entropy of each query's weights at the evaluated weights "
                       "(the test pass, mean over the finished seeds, nats), against the entropy uniform weights over the same "
                       "keys have (H_uniform, the mean log of the number of keys): H = H_uniform is uniform attention, which no "
                       "variant's weighting can change much; \"not recorded\" where the records predate the uniform reference")


def legend(board: Board | Mapping[str, Any]) -> list[tuple[str, str]]:
    """(term, what it means) for every mark and column of a suite board, printed after its tables (the HTML page
    folds it behind a link), in Markdown's inline code marks (renderers convert them)."""
    board = as_board(board)
    items = [
        ("Cells", f"mean ± std [{board.confidence:.0%} CI] over the seeds that finished (Student t; a single seed shows "
                  f"its value; {CI_CLIP_DESCRIPTION})"),
        ("▲ / ▼", f"significantly better / worse than `{BASELINE}` of the same table: {TEST_DESCRIPTION} (one family per "
                  f"metric), Holm p < {board.alpha:g}"),
        ("Δ", f"mean paired difference from `{BASELINE}` on the primary metric, with its Holm p"),
        ("Ranks", f"{RANKING_DESCRIPTION}; quality ranks use every finished record whatever machine made it, cost columns are "
                  "per hardware class (the hardware label) and never mixed across classes"),
        ("Overall", OVERALL_DESCRIPTION),
        ("*trivial* and vs trivial", f"the task's input-blind baseline on the same test data; vs trivial: {CHANCE_DESCRIPTION}"),
        ("Resolution", RESOLUTION_DESCRIPTION),
        ("Under-trained?", UNDER_TRAINED_DESCRIPTION),
        ("Attention entropy", ENTROPY_DESCRIPTION),
        ("Times", "seconds to 3 significant digits up to 10 minutes, then minutes, then hours; time/epoch and total time are "
                  "the mean over a row's finished runs of their training time (seed batches: each seed's share)"),
    ]
    return items


def board_finding(board: Board | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str:
    """The line a suite board opens with, under its title: what its tests found over every task (the overall
    finding; each table then opens with its own)."""
    board = as_board(board)
    groups = board.groups or ()
    if not groups or not groups[0].finding:
        return "No run records yet: nothing is measured, so nothing is significant."
    return overall_finding_sentence(groups[0].finding, code)


def run_time_sentence(board: Board | Mapping[str, Any]) -> str | None:
    """"Run time, from the records: 72 runs took 1.52 h of worker time on CPU ... (24 seed batches, each timed
    once)"; None without timed records. What the board's description and the README quote about a suite's time
    comes from here, the records themselves."""
    board = as_board(board)
    found = board.run_time
    if not found:
        return None
    parts = []
    for entry in found:
        batches = f"; {entry['batches']} seed batches, each timed once" if entry["batches"] else ""
        runs = f"{entry['runs']} run{'s' if entry['runs'] != 1 else ''}"
        parts.append(f"{runs} took {format_duration(entry['worker_s'])} of worker time on {entry['class']}{batches}")
    return ("Run time, from the records (each lone run's wall time and each seed batch's, summed; W workers share it): "
            + "; ".join(parts) + ".")


def entropy_caption(table: Table | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str | None:
    """The line over a table's attention-entropy table; None when its records carry no entropy."""
    table = Table.from_dict(table)
    found = table.attention_entropy
    if not found:
        return None
    uniform = "" if found["uniform_recorded"] else " The uniform reference is not recorded in these records (they predate it)."
    return ("Attention entropy at the evaluated weights, H / H_uniform per layer (nats; test pass, mean over the finished "
            f"seeds): H = H_uniform is uniform attention over each query's keys.{uniform}")


def entropy_cell(cell: Mapping[str, Any] | None) -> str:
    """"1.912 / 1.915", or "1.912 / not recorded" where the records have no uniform reference; "—" without either."""
    if not cell or cell.get("entropy") is None:
        return "—"
    uniform = cell.get("uniform")
    return f"{cell['entropy']:.3f} / {'not recorded' if uniform is None else f'{uniform:.3f}'}"


def versions_sentence(table: Table | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str | None:
    """The keyed versions a table's rows count (a plugin's as `version+source.<hash>`, as `attnbench describe`
    shows it); None for a board made before tables had versions."""
    table = Table.from_dict(table)
    found = table.versions
    if not found:
        return None
    variants = ", ".join(f"{code(name)} {' and '.join(versions)}" for name, versions in found["variants"].items())
    return (f"Versions (each row counts only records of its variant's version): task {' and '.join(found['task'])}; "
            f"{variants}.")


def superseded_lines(board: Board | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> list[str]:
    """"3 records of an earlier version of `tempered` (...), not counted", one line per superseded version."""
    board = as_board(board)
    return [f"{s['records']} record{'s' if s['records'] != 1 else ''} of an earlier version of "
            f"{'the task' if s['of'] == 'task' else code(s['name'])}, not counted (table {s['table']}: version "
            f"{code(s['version'])}; the table counts version {code(s['current'])})"
            for s in board.superseded or []]


def reproducibility_line(board: Board | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str | None:
    """"37 keys ran on 2 executions: test/acc identical in 35, max |Δ| 0.2 points; ..."; None without such keys."""
    board = as_board(board)
    found = board.reproducibility
    if not found:
        return None
    counts = sorted(found["executions"])
    executions = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    parts = []
    for m in found["metrics"]:
        scale, unit = (100.0, " points") if m["percent"] else (1.0, "")
        parts.append(f"{m['metric']} identical in {m['identical']} of {m['keys']}, max |Δ| {m['max_abs_diff'] * scale:.3g}{unit}")
    classes = ", ".join(f"{label}: {n}" for label, n in found["classes"].items())
    line = (f"Reproducibility: {found['keys']} key{'s' if found['keys'] != 1 else ''} ran on {executions} executions "
            f"({classes}; the board shows the earliest finished): {'; '.join(parts) or 'no shared metric'}")
    differing = found.get("differing_rows")
    if differing:
        across = "across hardware classes: last-bit rounding that these rows' training amplifies" if len(found["classes"]) > 1 else \
            "on one hardware class: not deterministic"
        line += (". Keys whose executions differ, by row (" + across + "): "
                 + ", ".join(f"{code(r['variant'])} {r['differ']} of {r['keys']}" for r in differing) + "; every other row identical")
    elif parts:
        line += ". Every row identical"
    return line


def mechanism_sentence(table: Table | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str | None:
    """"Mechanism diagnostics (...): `align-ct` qk_distance 0.497 (20 of 20 seeds); ..."; None without them."""
    table = Table.from_dict(table)
    found = table.mechanism
    if not found:
        return None

    def cell(name: str, value: Any) -> str:
        if not isinstance(value, Mapping):  # a board model written before the seed counts
            return f"{name} {value:.3g}"
        return f"{name} {value['mean']:.3g} ({value['seeds']} of {value['of']} seeds)"

    rows = "; ".join(f"{code(label)} " + ", ".join(cell(name, value) for name, value in values.items()) for label, values in found.items())
    return ("Mechanism diagnostics (each variant's evidence that its idea was at work, at the evaluated weights only: the "
            "mean over the seeds whose records measured it there, of the row's finished seeds; what each means and "
            f"when it counts as active: `attnbench describe <variant>` and modules/attention/mechanism.py): {rows}.")


def _names(labels: list[str], code: Callable[[str], str]) -> str:
    quoted = [code(label) for label in labels]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def _are(labels: list[str]) -> str:
    return "is" if len(labels) == 1 else "are"


def finding_sentence(table: Table | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str:
    """The sentence a table opens with: which rows its tests found better or worse than the baseline (Holm p
    below α), per metric, with the table's resolution, the rows too few seeds left untested, and the rows at
    chance. Built from the marks the table shows, so sentence and cells cannot disagree."""
    table = Table.from_dict(table)
    found = table.finding
    primary = table.metrics[0]
    if not found or found.baseline is None:
        return f"Nothing in this table is significant: it has no finished {code(BASELINE)} runs to compare with."
    baseline = code(found.baseline)
    if not found.tested:
        return (f"Nothing in this table is significant: no variant has {MIN_SEEDS_TO_RANK} seeds paired with {baseline}, "
                "the fewest the board tests.")
    resolution = table.resolution
    if resolution is not None and resolution.difference is not None:
        scale, digits, unit = (100.0, 2, " points") if primary.percent else (1.0, 4, "")
        detail = f" (Holm p < {ALPHA:g}; resolution {resolution.difference * scale:.{digits}f}{unit})"
    else:
        detail = f" (Holm p < {ALPHA:g})"
    first = found.marks[0]
    metric = code(primary.name)
    if first["better"] and first["worse"]:
        clauses = [f"{_names(first['better'], code)} {_are(first['better'])} significantly better than {baseline} in {metric}{detail}",
                   f"{_names(first['worse'], code)} {_are(first['worse'])} significantly worse"]
    elif first["better"]:
        clauses = [f"{_names(first['better'], code)} {_are(first['better'])} significantly better than {baseline} in {metric}{detail}",
                   "no variant is significantly worse"]
    elif first["worse"]:
        clauses = [f"No variant is significantly better than {baseline} in {metric}{detail}",
                   f"{_names(first['worse'], code)} {_are(first['worse'])} significantly worse"]
    else:
        clauses = [f"No variant is significantly better or worse than {baseline} in {metric}{detail}"]
    for other in found.marks[1:]:
        parts = [f"{_names(other[kind], code)} {_are(other[kind])} significantly {kind}" for kind in ("better", "worse") if other[kind]]
        if parts:
            clauses.append(f"in {code(other['metric'])}: {', while '.join(parts)}")
    if found.untested:
        clauses.append(f"{_names(found.untested, code)} {'has' if len(found.untested) == 1 else 'have'} fewer than "
                       f"{MIN_SEEDS_TO_RANK} seeds paired with it and {_are(found.untested)} not tested")
    if found.at_chance:
        everyone = len(found.at_chance) == found.chance_tested
        clauses.append("no variant is significantly above the trivial baseline" if everyone else
                       f"{_names(found.at_chance, code)} {_are(found.at_chance)} not significantly above the trivial baseline")
    return "; ".join(clauses) + "."


def overall_finding_sentence(finding: GroupFinding | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str:
    """The board's opening line (`board_finding`): each variant significantly better or worse than softmax on some
    task's primary metric, with those tasks."""
    finding = GroupFinding.from_dict(finding)
    tasks = finding.tasks
    if not finding.tested_tasks:
        where = "its one task" if tasks == 1 else f"any of the {tasks} tasks"
        return (f"Nothing is significant on {where}: no table has a variant with {MIN_SEEDS_TO_RANK} seeds paired with "
                f"{code(finding.baseline)}.")

    def listed(by_variant: Mapping[str, list[str]]) -> str:
        groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for label, on in by_variant.items():
            groups[tuple(on)].append(label)
        ordered = sorted(groups.items(), key=lambda item: (-len(item[0]), item[1]))
        return ", ".join(f"{_names(labels, code)} on {_names(list(on), code)}" for on, labels in ordered)

    scope = "On the task's primary metric" if tasks == 1 else f"Over the {tasks} tasks' primary metrics"
    better = (f"significantly better than {code(BASELINE)}: {listed(finding.better)}" if finding.better
              else f"no variant is significantly better than {code(BASELINE)} on any task")
    worse = f"significantly worse: {listed(finding.worse)}" if finding.worse else "none is significantly worse on any"
    return f"{scope}, {better}; {worse}."


CLIPPED = "†"
"""Marks an interval clipped to its metric's range, in every rendering."""


def clipped_sentence(table: Table | Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str | None:
    """The note under a table some of whose intervals were clipped: which metrics, to what range; None when none was."""
    table = Table.from_dict(table)
    clipped = [m for m in table.metrics if any((row.metrics.get(m.name) or {}).get("ci_clipped") for row in table.rows)]
    if not clipped:
        return None
    ranges = []
    for m in clipped:
        scale = 100.0 if m.percent else 1.0
        low, high = metric_range(m.name)
        if low is not None and high is not None:
            ranges.append(f"{code(m.name)} to [{low * scale:g}, {high * scale:g}]")
        else:
            ranges.append(f"{code(m.name)} to " + (f">= {low * scale:g}" if low is not None else f"<= {high * scale:g}"))
    return (f"{CLIPPED}: this {CONFIDENCE:.0%} Student-t interval reaches past the values the metric can take and is clipped "
            f"({'; '.join(ranges)}); with so few seeds or so large a spread the interval says little beyond that.")


def row_settings_sentence(row: Mapping[str, Any], code: Callable[[str], str] = _backticks) -> str:
    """`code` marks up a name (Markdown backticks; the HTML page passes its escaped <code>)."""
    options = ", ".join(f"{code(key)} = {code(str(value))}" for key, value in row["options"].items())
    return f"{code(row['variant'])} with {options} (every other option at its default)."


def epoch_cap_sentence(table: Table | Mapping[str, Any]) -> str | None:
    """The under-training warning every rendering prints under a table: how many finished runs trained to the epoch
    cap (their stopping rule never fired), and how many kept an epoch within the margin of the cap; None when
    neither happened. A table of records from before runs counted their epochs says only the second."""
    table = Table.from_dict(table)
    found = table.epoch_cap
    if not found or not (found["hits"] or found.get("at_cap")):
        return None
    caps = ", ".join(map(str, found["caps"]))
    kept = f"the epoch their rule kept lay within {found['margin']:.0%} of the cap in {found['hits']} of {found['runs']}"
    if found.get("at_cap") is None:
        return f"Under-trained? Of {found['runs']} runs (cap {caps} epochs), {kept}: those runs may still have been improving."
    return (f"Under-trained? {found['at_cap']} of {found['runs']} runs trained to the epoch cap ({caps} epochs): their "
            f"stopping rule never fired, so they may still have been improving when the cap stopped them; {kept}.")


def untested_reason(metric: str) -> str:
    """Why a one-seed row of `metric` has no test against the trivial baseline (the table's footnote)."""
    if metric.endswith("f1"):
        return (f"{metric} of a single seed is not tested against the trivial baseline: how far F1 strays by chance depends "
                "on the counts of true and false positives and false negatives, which n and the F1 value (all a record "
                "keeps) do not determine, and a permutation or bootstrap test needs the predictions; with 2 or more seeds "
                "it is a t-test over seeds")
    return (f"{metric} of a single seed is not tested against the trivial baseline: it is neither a fraction of correct "
            "predictions nor a correlation, whose chance spread follows from n alone; with 2 or more seeds it is a "
            "t-test over seeds")


def _format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def tuned_values_text(values: Mapping[str, Any]) -> str:
    """"attention.kl_weight=0.1317, attention.prior=fixed", or "the defaults" when tuning kept them."""
    return ", ".join(f"{k}={_format_value(v)}" for k, v in values.items()) or "the defaults"


def problem_lines(board: Board | Mapping[str, Any]) -> list[str]:
    """One line per unreadable record file and per run with conflicting records; none on a board without them."""
    board = as_board(board)
    lines = [f"Unreadable record (not counted as missing; repair the file or delete it and re-run): {why}"
             for why in (board.unreadable or {}).values()]
    lines += superseded_lines(board)
    lines += [f"Conflict: run {key} has a different record in {', '.join(copies)}; the board shows the store's "
              "own record until the wrong copy is deleted" for key, copies in (board.conflicts or {}).items()]
    return lines
