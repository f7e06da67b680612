"""Board model (harness/report/board.py) -> one self-contained HTML page.

The page loads nothing: CSS, JS and the matplotlib SVG plots are inline, so it can be opened from disk,
attached to an issue or archived. The same board gives byte-identical HTML (no clock, fixed SVG ids),
so regenerated pages diff cleanly."""

from __future__ import annotations

import html
import io
import math
import re
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from harness.report.board import Board, Cost, Group, MetricCell, MetricSpec, Table, as_board
from harness.report.format import format_duration, format_p, path_note, resolution_sentence
from harness.report.sentences import (CLIPPED, board_finding, clipped_sentence, entropy_caption, entropy_cell, epoch_cap_sentence,
                                      finding_sentence, legend, mechanism_sentence, problem_lines, reproducibility_line,
                                      row_settings_sentence, run_time_sentence, tuned_values_text, untested_reason, versions_sentence)
from harness.report.stats import metric_range

MARKS = {"better": "▲", "worse": "▼"}
CHANCE_TESTS = {"binomial": "binomial test of the correct count against the trivial baseline",
                "t": "t-test over seeds against the trivial baseline",
                "correlation": "test of no association (a correlation of 0) from the number of test examples"}
BAR_COLOR = "#9db4cf"
BASELINE_COLOR = "#d9822b"

# Fixed hash salt: matplotlib otherwise salts its SVG ids with a random uuid per process.
# parse_math off: a variant label with "$" must be drawn as typed, not parsed as TeX.
_SVG_RC = {
    "svg.hashsalt": "attnbench",
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#1d1d1f}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:2em;border-bottom:2px solid #ccc}h3{margin-top:1.6em}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.92em}
.meta{margin:.2em 0;padding-left:1.2em}.meta li{margin:.1em 0}.generated{color:#666;font-style:italic}
.skipped{border-left:4px solid #d9822b;padding:.2em .8em;background:#fdf4ea}
.table-wrap{overflow-x:auto}
table{border-collapse:collapse;margin:.6em 0;font-variant-numeric:tabular-nums}
th,td{padding:.25em .55em;border-bottom:1px solid #e3e3e3;text-align:right;white-space:nowrap}
th{background:#f3f4f6;cursor:pointer;user-select:none;position:relative}
th.text,td.text{text-align:left}
th[aria-sort=ascending]::after{content:" \\2191"}th[aria-sort=descending]::after{content:" \\2193"}
tr.baseline td{background:#fdf4ea}tr.chance td{color:#888}tr.trivial td{background:#f6f6f6;font-style:italic}
.ci{display:block;color:#777;font-size:.82em}
.mark{font-weight:bold;cursor:help}.mark.better{color:#1a7f37}.mark.worse{color:#c62828}
.bad{color:#c62828}.none{color:#aaa}
.plots{display:flex;flex-wrap:wrap;gap:1em}
.plots figure{margin:0}.plots svg{max-width:100%;height:auto}
figcaption{color:#555;font-size:.9em}
.finding{font-weight:600;border-left:4px solid #3b6ea5;padding:.2em .8em;background:#f1f5fa}
"""

# Hand-written because the page must not load a library; data-sort holds the raw number so that
# "83.1 ± 0.2" or "1,024 MB" sort by value; an empty data-sort (nothing to show) stays last both ways.
_JS = """
(function () {
  function sortTable(table, header, column) {
    var descending = header.getAttribute("aria-sort") === "ascending";
    var textual = header.classList.contains("text");
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", descending ? "descending" : "ascending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[column].getAttribute("data-sort"), y = b.cells[column].getAttribute("data-sort");
      if (x === "" || y === "") { return (x === "") - (y === ""); }
      var order = textual ? x.localeCompare(y) : Number(x) - Number(y);
      return descending ? -order : order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (header, column) {
      header.tabIndex = 0;
      header.addEventListener("click", function () { sortTable(table, header, column); });
      header.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sortTable(table, header, column); }
      });
    });
  });
})();
"""


def render_html(board: Board | dict[str, Any]) -> str:
    """The whole page for `board`: the model harness.report.board.build_board makes, or its dict form, read into one."""
    board = as_board(board)
    out = io.StringIO()
    title = f"Leaderboard: {board.suite}"
    out.write("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
    out.write("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n")
    out.write("<meta name=\"generator\" content=\"attnbench leaderboard\">\n")
    out.write(f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n")
    out.write(f"<!-- generated by attnbench leaderboard, do not edit -->\n<h1>Leaderboard: <code>{_e(board.suite)}</code></h1>\n")
    out.write(f"<p class=\"finding\">{board_finding(board, _code)}</p>\n")
    out.write(_header(board))
    plot_ids = iter(range(1, 1_000_000))
    for group_index, group in enumerate(board.groups, 1):
        out.write(_group(board, group, group_index, plot_ids))
    if not board.groups:
        out.write("<p>No run records yet.</p>\n")
    out.write(_legend(board))
    out.write(f"<script>{_JS}</script>\n</body>\n</html>\n")
    return out.getvalue()


def _header(board: Board) -> str:
    counts = board.status_counts
    status = ", ".join(f"{_e(str(counts[k]))} {_e(k)}" for k in ("ok", "failed", "pruned", "missing") if k in counts)
    status_extra = ", ".join(f"{_e(str(v))} {_e(k)}" for k, v in sorted(counts.items()) if k not in ("ok", "failed", "pruned", "missing"))
    status = ", ".join(s for s in (status, status_extra) if s)
    parts = []
    if board.description:
        parts.append(f"<p>{_e(' '.join(board.description.split()))}</p>\n")
    parts.append("<ul class=\"meta\">\n")
    parts.append(f"<li>Records: {board.recorded} of {board.planned} planned runs ({status}); "
                 f"seeds {_e(', '.join(map(str, board.seeds)))}</li>\n")
    parts.extend(f"<li class=\"problem\">{_e(line)}</li>\n" for line in problem_lines(board))
    classes = [f"{c['label']}: {c['records']} record{'s' if c['records'] != 1 else ''}" for c in board.hardware_classes]
    if len(classes) > 1:  # one class is named in the group's heading already
        parts.append(f"<li>Hardware classes (one ranking; cost per class): {_e('; '.join(classes))}</li>\n")
    line = run_time_sentence(board)
    if line:
        parts.append(f"<li>{_e(line)}</li>\n")
    line = reproducibility_line(board, code=str)  # escaped as a whole below: names plain, not in backticks
    if line:
        parts.append(f"<li>{_e(line)}</li>\n")
    parts.append(f"<li>Commit(s): {_codes(board.commits)}; runs finished {_range(board.finished_range)}</li>\n")
    parts.append("</ul>\n")
    for task, why in sorted(board.skipped_tasks.items()):
        parts.append(f"<p class=\"skipped\"><code>{_e(task)}</code> skipped: {_e(why)}</p>\n")
    for label, row in (board.row_settings or {}).items():
        parts.append(f"<p><code>{_e(label)}</code>: {row_settings_sentence(row, lambda text: f'<code>{_e(text)}</code>')}</p>\n")
    parts.append("<p class=\"generated\">Generated by <code>attnbench leaderboard</code> from the run records; do not edit. "
                 "What the cells, marks and columns mean: <a href=\"#legend\">Reading this board</a>, after the tables.</p>\n")
    return "".join(parts)


def _legend(board: Board) -> str:
    """sentences.legend, folded: the page opens with its finding and tables, and this is one click away."""
    items = "".join(f"<li><strong>{_inline(term)}</strong>: {_inline(meaning)}.</li>\n" for term, meaning in legend(board))
    return (f"<details class=\"legend\" id=\"legend\"><summary>Reading this board</summary>\n<ul>\n{items}</ul>\n"
            f"<p>Hover a marked cell for its p-values.</p>\n</details>\n")


def _group(board: Board, group: Group, group_index: int, plot_ids) -> str:
    torch = ", ".join(group.torch) or "unknown"
    parts = [f"<section class=\"group\" id=\"group-{group_index}\">\n"
             f"<h2>{_e(group.hardware)} <small>(torch {_e(torch)})</small></h2>\n"]
    classes = board.hardware_classes or []
    if len(classes) > 1:  # one group, one ranking, several machines: each named, its cost under each table
        hardware = "Hardware classes: " + _e("; ".join(f"{c['label']} ({c['records']} record{'s' if c['records'] != 1 else ''})" for c in classes))
    else:
        devices = f"{group.device_count} × " if group.device_count else ""
        hardware = f"Accelerator: {_e(group.accelerator or 'unknown')}, device: {_e(devices)}{_e(group.device or 'unknown')}"
    parts.append(f"<p>{hardware}; "
                 f"commit(s) {_codes(group.commits)}; runs finished {_range(group.finished_range)}"
                 + (f"; {_e(group.seed_batched)}" if group.seed_batched else "") + ".</p>\n")
    parts.append("<h3>Overall</h3>\n")
    parts.append(_overall_table(group))
    for task in group.tasks:
        parts.append(_task(board, task, group_index, plot_ids))
    parts.append("</section>\n")
    return "".join(parts)


def _overall_table(group: Group) -> str:
    header = [("variant", True), ("mean rank", False), ("tasks", False), (MARKS["better"] + " better", False), (MARKS["worse"] + " worse", False)]
    rows = []
    for row in group.overall:
        cells = [
            _cell(f"<code>{_e(row.variant)}</code>", row.variant, text=True),
            _cell(_e(_fixed(row.mean_rank, 2)), row.mean_rank),
            _cell(f"{row.tasks_covered}/{row.tasks_total}", row.tasks_covered),
            _cell(str(row.better), row.better),
            _cell(str(row.worse), row.worse),
        ]
        rows.append(f"<tr>{''.join(cells)}</tr>\n")
    return _table(header, rows, "overall")


_COST_COLUMNS = ("epochs", "time/epoch", "total time", "peak mem", "params")


def _cost_cells(cost: dict[str, Any]) -> list[str]:
    return [
        _cell(_e(_fixed(cost.epochs, 0)), cost.epochs),
        _cell(_e(format_duration(cost.time_per_epoch_s) + path_note(cost)), cost.time_per_epoch_s),
        _cell(_e(format_duration(cost.total_time_s)), cost.total_time_s),
        _cell(_e(_unit(cost.peak_memory_mb, "MB")), cost.peak_memory_mb),
        _cell(_e(f"{cost.parameters:,}" if cost.parameters else "—"), cost.parameters),
    ]


def _costs_by_class(task: Table) -> str:
    """A variant's cost on each hardware class apart: times from two machines are never averaged."""
    header = [("variant", True), ("hardware class", True), ("runs", False), *[(name, False) for name in _COST_COLUMNS], ("GPU-hours", False)]
    body = []
    for row in task.rows:
        for label, cost in (row.cost_by_class or {}).items():
            gpu_hours = cost.gpu_hours
            cells = [_cell(f"<code>{_e(row.variant)}</code>", row.variant, text=True), _cell(_e(label), label, text=True),
                     _cell(str(cost.runs), cost.runs), *_cost_cells(cost),
                     _cell(_e(_fixed(gpu_hours, 3)) if gpu_hours is not None else _NONE, gpu_hours)]
            body.append(f"<tr>{''.join(cells)}</tr>\n")
    return ("<p>Cost per hardware class (the ranking above uses every class; costs are never mixed across classes, nor lone runs with seed batches):</p>\n"
            + _table(header, body, "cost"))


def _task(board: Board, task: Table, group_index: int, plot_ids) -> str:
    primary = task.primary
    baseline = task.baseline
    metrics = task.metrics
    arrow = "higher is better" if task.higher_is_better else "lower is better"
    parts = [f"<h3 id=\"g{group_index}-{_e(_slug(task.task))}\">{_e(task.task)}</h3>\n"]
    if task.finding is not None:  # boards from before findings (a hand-made one, say) have none to state
        parts.append(f"<p class=\"finding\">{finding_sentence(task, _code)}</p>\n")
    percent = [m.name for m in metrics if m.percent]
    parts.append(f"<p>Ranked by <code>{_e(primary)}</code> ({arrow}); "
                 f"{'metrics ' + ', '.join(f'<code>{_e(n)}</code>' for n in percent) + ' in %; ' if percent else ''}"
                 f"commit(s) {_codes(task.commits)}; runs finished {_range(task.finished_range)}. "
                 + (f"Marks compare with <code>{_e(baseline)}</code>.</p>\n" if baseline else "No baseline with ok runs here, so no marks.</p>\n"))
    parts.append(f"<p class=\"resolution\">{_e(resolution_sentence(task))}</p>\n")
    if epoch_cap_sentence(task):
        parts.append(f"<p class=\"skipped\">{_e(epoch_cap_sentence(task))}</p>\n")
    header = [("#", False), ("variant", True)]
    header += [(m.name + (" (%)" if m.percent else ""), False) for m in metrics]
    # Several hardware classes: the ranking holds every class, and cost goes to a table per class below it.
    several_classes = len(board.cost_classes if board.cost_classes is not None else board.hardware_classes or ()) > 1
    header += [("vs trivial (Holm p)", False), ("n", False), ("failed", False), ("pruned", False), ("missing", False)]
    header += [] if several_classes else [(name, False) for name in _COST_COLUMNS]
    body = []
    for row in task.rows:
        cost = row.cost or Cost()
        cells = [_cell(str(row.rank) if row.rank is not None else _NONE, row.rank),
                 _cell(f"<code>{_e(row.variant)}</code>", row.variant, text=True)]
        cells += [_metric_cell(row.metrics.get(m.name), m, baseline) for m in metrics]
        chance = row.chance
        p_holm = chance.decisive_p if chance else None
        cells.append(_cell(_e(f"{'at chance' if chance.at_chance else 'above'} ({format_p(p_holm)})") if chance else _NONE,
                           p_holm,
                           title=f"{CHANCE_TESTS[chance.test]}, one-sided: p = {format_p(chance.p)}, Holm-corrected over the "
                                 f"table's rows p = {format_p(p_holm)}" if chance else ""))
        cells += [
            _cell(f"{row.n}/{row.planned}", row.n),
            _cell(_count(row.failed), row.failed),
            _cell(_count(row.pruned), row.pruned),
            _cell(_count(row.missing), row.missing),
        ]
        cells += [] if several_classes else _cost_cells(cost)
        css = " class=\"baseline\"" if baseline is not None and row.variant == baseline else ""
        css = css or (" class=\"chance\"" if chance and chance.at_chance else "")
        body.append(f"<tr{css}>{''.join(cells)}</tr>\n")
    trivial = task.trivial
    if trivial:
        cells = [_cell(_NONE, None), _cell("<em>trivial</em>", "~trivial", text=True, title=trivial["predictor"])]
        for m in metrics:
            value = trivial["metrics"].get(m.name)
            scale, digits = (100.0, 1) if m.percent else (1.0, 4)
            cells.append(_cell(_e(_fixed(value * scale, digits)) if value is not None else "<span class=\"none\">undefined</span>", value))
        cells += [_cell(_NONE, None)] * (len(header) - len(cells))
        body.append(f"<tr class=\"trivial\">{''.join(cells)}</tr>\n")
    parts.append(_table(header, body, "task"))
    clipped = clipped_sentence(task, _code)
    if clipped:
        parts.append(f"<p class=\"clipped\">{clipped}</p>\n")
    if several_classes:
        parts.append(_costs_by_class(task))
    if trivial:
        parts.append(f"<p><em>trivial</em>: {_e(trivial['predictor'])}." + (f" {_e(trivial['note'])}." if trivial["note"] else "")
                     + (f" {_e(untested_reason(primary))}." if task.chance_untested else "") + "</p>\n")
    failures = [(row.variant, error) for row in task.rows for error in row.errors or []]
    if failures:
        parts.append("<p>Failures:</p>\n<ul>\n")
        parts.extend(f"<li><code>{_e(variant)}</code>: <span class=\"bad\">{_e(error)}</span></li>\n" for variant, error in failures)
        parts.append("</ul>\n")
    if task.tuning:
        parts.append("<p>Tuning cost (<code>attnbench tune</code>, validation only, one seed; rows marked (tuned) re-ran the best trial on the suite's seeds):</p>\n<ul>\n")
        for label, tuning in sorted(task.tuning.items()):
            trials = tuning.get("trials", {})
            detail = ", ".join(f"{v} {k}" for k, v in sorted(trials.items()))
            parts.append(f"<li><code>{_e(label)}</code>: {_e(tuned_values_text(tuning.get('values') or {}))}; {sum(trials.values())} trials ({_e(detail)}), "
                         f"{_e(format_duration(tuning.get('seconds')))} of training</li>\n")
        parts.append("</ul>\n")
    mechanism = mechanism_sentence(task, lambda text: f"<code>{_e(text)}</code>")
    if mechanism:
        parts.append(f"<p class=\"mechanism\">{mechanism}</p>\n")
    parts.append(_entropy(task))
    versions = versions_sentence(task, lambda text: f"<code>{_e(text)}</code>")
    if versions:
        parts.append(f"<p class=\"generated\">{versions}</p>\n")
    parts.append(_plots(task, board.alpha, plot_ids))
    return "".join(parts)


def _entropy(task: Table) -> str:
    """How far each row's evaluated attention is from uniform, per layer (sentences.entropy_caption)."""
    caption = entropy_caption(task)
    if caption is None:
        return ""
    found = task.attention_entropy
    header = [("variant", True), *[(f"{layer}: H / H_uniform", False) for layer in found["layers"]]]
    body = []
    for row in task.rows:
        cells = found["rows"].get(row.variant)
        if cells:
            tds = [_cell(f"<code>{_e(row.variant)}</code>", row.variant, text=True)]
            tds += [_cell(_e(entropy_cell(cells.get(layer))), (cells.get(layer) or {}).get("entropy")) for layer in found["layers"]]
            body.append(f"<tr>{''.join(tds)}</tr>\n")
    return f"<p class=\"entropy\">{_e(caption)}</p>\n" + _table(header, body, "entropy")


def _metric_cell(metric: MetricCell | None, spec: dict[str, Any], baseline: str | None) -> str:
    if not metric or metric.mean is None:
        return _cell(_NONE, None)
    scale, digits = (100.0, 1) if spec.percent else (1.0, 4)
    text = _e(_fixed(metric.mean * scale, digits))
    if metric.std is not None:
        text += f" ± {_e(_fixed(metric.std * scale, digits))}"
    title = ""
    versus = metric.vs_baseline
    if versus:
        unit = " pts" if spec.percent else ""
        title = (f"vs {baseline}: diff {_signed(versus.diff * scale, digits)}{unit} over {versus.n_pairs} paired seeds, "
                 f"p = {format_p(versus.p)}, Holm p = {format_p(versus.p_holm)}")
        if versus.mark in MARKS:
            text += (f" <span class=\"mark {versus.mark}\" title=\"{_e(versus.mark)} than {_e(baseline or '')}: "
                     f"Holm p = {_e(format_p(versus.p_holm))}\">{MARKS[versus.mark]}</span>")
    if metric.ci_low is not None and metric.ci_high is not None:
        clipped = (f"<span title=\"clipped to the values {_e(spec.name)} can take\">{CLIPPED}</span>"
                   if metric.ci_clipped else "")
        text += f"<span class=\"ci\">[{_e(_fixed(metric.ci_low * scale, digits))}, {_e(_fixed(metric.ci_high * scale, digits))}]{clipped}</span>"
    return _cell(text, metric.mean, title=title)


_NONE = "<span class=\"none\">—</span>"



def _cell(content: str, sort_value: Any, *, text: bool = False, title: str = "") -> str:
    """`content` is already-escaped HTML; `sort_value` the raw value the column sorts by."""
    if sort_value is None or (isinstance(sort_value, float) and math.isnan(sort_value)):
        key = ""
    elif isinstance(sort_value, str):
        key = sort_value
    else:
        key = repr(float(sort_value))
    attrs = f" data-sort=\"{_e(key)}\""
    if text:
        attrs += " class=\"text\""
    if title:
        attrs += f" title=\"{_e(title)}\""
    return f"<td{attrs}>{content}</td>"


def _table(header: list[tuple[str, bool]], rows: list[str], kind: str) -> str:
    text_class = " class=\"text\""
    head = "".join(f"<th scope=\"col\"{text_class if text else ''}>{_e(name)}</th>" for name, text in header)
    return (f"<div class=\"table-wrap\"><table class=\"sortable {kind}\">\n<thead><tr>{head}</tr></thead>\n"
            f"<tbody>\n{''.join(rows)}</tbody>\n</table></div>\n")


def _plots(task: Table, alpha: float, plot_ids) -> str:
    primary = next((m for m in task.metrics if m["name"] == task.primary), MetricSpec(name=task.primary))
    scale = 100.0 if primary.percent else 1.0
    points = [(row, row.metrics[task.primary]) for row in task.rows
              if row.metrics.get(task.primary, {}).get("mean") is not None]
    if not points:
        return "<p class=\"none\">No ok runs to plot.</p>\n"
    unit = " (%)" if primary.percent else ""
    label = f"{task.primary}{unit}"
    bounds = tuple(None if bound is None else bound * scale for bound in metric_range(task.primary))
    min_span = _min_span(task, [metric.mean * scale for _, metric in points], scale)
    spans = (f"the axis spans at least {_e(f'{min_span:.2f}')}{' points' if scale == 100.0 else ''}, twice the table's resolution"
             if (task.resolution or {}).get("difference") else
             f"the axis spans at least {_e(_num(round(min_span, 4)))}{' points' if scale == 100.0 else ''} (no resolution: too few paired seeds)")
    bar, bar_axis = _bar_plot(points, task, scale, label, min_span, bounds)
    figures = [(bar, bar_axis, "x", f"{task.primary} per variant, mean with 95% CI (clipped to the metric's range); "
                f"{MARKS['better']}/{MARKS['worse']}: Holm p &lt; {_e(_num(alpha))} vs {_e(task.baseline or 'baseline')}; "
                f"{spans}.")]
    timed = [(row, metric) for row, metric in points if (row.cost or Cost()).time_per_epoch_s]
    if timed:
        cost, cost_axis = _cost_plot(timed, task, scale, label, min_span, bounds)
        figures.append((cost, cost_axis, "y", f"{task.primary} against time per epoch (log scale); {spans}."))
    curves = [(row.variant, row.history) for row in task.rows if row.history]
    panels = _curve_panels(task, curves) if curves else []
    if panels:
        figures.append((_curve_plot(curves, panels, task), None, None, "Learning curves, mean over the seeds at each epoch: "
                        + " and ".join(_e(name) for name in panels) + "; the dot marks the best epoch of the validation curve."))
    parts = ["<div class=\"plots\">\n"]
    for svg, axis, which, caption in figures:
        # the value axis's limits, in the cells' units, for readers and tests that check them against the intervals
        attrs = (f" data-metric=\"{_e(task.primary)}\" data-value-axis=\"{which}\" data-value-min=\"{axis[0]:.6g}\" "
                 f"data-value-max=\"{axis[1]:.6g}\"" if axis else "")
        parts.append(f"<figure{attrs}>{_inline_svg(svg, next(plot_ids))}<figcaption>{caption}</figcaption></figure>\n")
    parts.append("</div>\n")
    return "".join(parts)


MIN_SPAN_POINTS = 1.0
"""The least a percent axis spans when the table has no resolution (fewer than two paired seeds): one point."""
MIN_SPAN_SHARE = 0.01
"""The same for other metrics, as a share of the largest |value| plotted."""


def _min_span(task: Table, values: list[float], scale: float) -> float:
    """The narrowest value axis: twice the table's resolution, so that a gap the seeds cannot resolve never fills
    more than half the plot (a 0.05-point gap once filled a whole axis); a fixed span without a resolution."""
    resolution = (task.resolution or {}).get("difference")
    if resolution:
        return 2.0 * resolution * scale
    if scale == 100.0:
        return MIN_SPAN_POINTS
    return MIN_SPAN_SHARE * max((abs(v) for v in values), default=0.0) or 1e-3


def _value_axis(lows: list[float], highs: list[float], min_span: float, bounds: tuple[float | None, float | None],
                pad: float = 0.12) -> tuple[float, float]:
    """Limits that hold every interval, span at least `min_span` around them and never pass the metric's range."""
    low, high = min(lows), max(highs)
    span = max(high - low, min_span)
    middle = (low + high) / 2.0
    start, end = middle - span / 2.0 - pad * span, middle + span / 2.0 + pad * span
    lowest, highest = bounds
    if lowest is not None and start < lowest:
        end, start = end + (lowest - start), lowest
    if highest is not None and end > highest:
        start, end = start - (end - highest), highest
    if lowest is not None:
        start = max(start, lowest)
    return start, end


def _bar_plot(points, task: Table, scale: float, label: str, min_span: float,
              bounds: tuple[float | None, float | None]) -> tuple[str, tuple[float, float]]:
    with matplotlib.rc_context(_SVG_RC):
        # Figure without pyplot: no global figure registry to leak into or clean up; saving to SVG needs no GUI backend.
        fig = Figure(figsize=(6.4, 0.9 + 0.28 * len(points)))
        ax = fig.add_subplot()
        names = [row.variant for row, _ in points]
        means = [metric.mean * scale for _, metric in points]
        lows = [(metric.mean - metric.ci_low) * scale if metric.ci_low is not None else 0.0 for _, metric in points]
        highs = [(metric.ci_high - metric.mean) * scale if metric.ci_high is not None else 0.0 for _, metric in points]
        colors = [BASELINE_COLOR if name == task.baseline else BAR_COLOR for name in names]
        positions = list(range(len(points)))
        ax.barh(positions, means, xerr=[lows, highs], color=colors, error_kw={"ecolor": "#333", "capsize": 2, "elinewidth": 0.8})
        ax.set_yticks(positions, names)
        ax.invert_yaxis()  # rank 1 at the top, as in the table
        # Zoomed to the data: differences between variants are often a fraction of a point, invisible on an axis from 0.
        axis = _value_axis([m - lo for m, lo in zip(means, lows)], [m + hi for m, hi in zip(means, highs)], min_span, bounds)
        ax.set_xlim(*axis)
        span = axis[1] - axis[0]
        chance = ((task.trivial or {}).get("metrics") or {}).get(task.primary)
        if chance is not None and axis[0] <= chance * scale <= axis[1]:
            ax.axvline(chance * scale, color="#888", linestyle="--", linewidth=0.8)
            ax.text(chance * scale, -0.6, " trivial", color="#666", fontsize=7, va="bottom")
        for position, (row, metric), mean, hi in zip(positions, points, means, highs):
            mark = metric.mark
            if mark in MARKS:
                ax.text(min(mean + hi + 0.02 * span, axis[1]), position, MARKS[mark], va="center", fontsize=9,
                        color="#1a7f37" if mark == "better" else "#c62828")
        ax.set_xlabel(f"{label}, {'higher' if task.higher_is_better else 'lower'} is better (axis not from 0)")
        ax.set_title(task.task, loc="left")
        fig.tight_layout()
        return _svg(fig), axis


def _cost_plot(points, task: Table, scale: float, label: str, min_span: float,
               bounds: tuple[float | None, float | None]) -> tuple[str, tuple[float, float]]:
    with matplotlib.rc_context(_SVG_RC):
        fig = Figure(figsize=(5.2, 3.8))
        ax = fig.add_subplot()
        for row, metric in points:
            x = row.cost.time_per_epoch_s * 1000.0
            y = metric.mean * scale
            is_baseline = row.variant == task.baseline
            ax.scatter([x], [y], s=28, color=BASELINE_COLOR if is_baseline else "#3b6ea5", zorder=3)
            ax.annotate(row.variant, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7)
        ax.set_xscale("log")
        # Plain numbers: the default log labels are TeX ("$10^{2}$"), which parse_math=False would print verbatim.
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.margins(x=0.12)
        means = [metric.mean * scale for _, metric in points]
        axis = _value_axis(means, means, min_span, bounds, pad=0.08)
        ax.set_ylim(*axis)
        ax.set_xlabel("time per epoch (ms, log scale)")
        ax.set_ylabel(label)
        ax.set_title(task.task, loc="left")
        ax.grid(True, which="both", alpha=0.25)
        fig.tight_layout()
        return _svg(fig), axis


def _curve_panels(task: Table, curves) -> list[str]:
    """Train loss and the validation counterpart of the primary metric (val/acc for test/acc), else val/loss."""
    present = {name for _, history in curves for name in history}
    validation = "val/" + task.primary.split("/", 1)[-1]
    return [name for name in ("train/loss", validation if validation in present else "val/loss") if name in present]


def _curve_plot(curves, panels: list[str], task: Table) -> str:
    higher = task.higher_is_better if panels and panels[-1] != "val/loss" else False
    with matplotlib.rc_context(_SVG_RC):
        fig = Figure(figsize=(4.0 * len(panels) + 1.6, 3.4))
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        palette = matplotlib.colormaps["tab20"]
        for index, (name, history) in enumerate(curves):
            color = BASELINE_COLOR if name == task.baseline else palette(index % 20)
            for ax, panel in zip(axes, panels):
                points = [(e, v) for e, v in zip(history["epoch"], history.get(panel, [])) if v is not None]
                if not points:
                    continue
                ax.plot([e for e, _ in points], [v for _, v in points], color=color, linewidth=1.1 if name == task.baseline else 0.8,
                        label=name if ax is axes[0] else None)
                if panel.startswith("val/"):
                    best = (max if higher else min)(points, key=lambda point: point[1])
                    ax.plot([best[0]], [best[1]], "o", color=color, markersize=2.5)
        for ax, panel in zip(axes, panels):
            ax.set_xlabel("epoch")
            ax.set_title(panel, loc="left")
            ax.grid(True, alpha=0.25)
        fig.legend(loc="center right", fontsize=7, frameon=False)
        fig.suptitle(task.task, x=0.01, ha="left")
        fig.tight_layout(rect=(0, 0, 1 - 1.4 / (4.0 * len(panels) + 1.6), 1))
        return _svg(fig)


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


_PROLOG = re.compile(r"<\?xml[^>]*\?>\s*|<!DOCTYPE[^>]*>\s*|<metadata>.*?</metadata>\s*", re.S)
_ID = re.compile(r'\bid="([^"]+)"')


def _inline_svg(svg: str, plot_id: int) -> str:
    """Strips what only a standalone file needs and prefixes the ids: every matplotlib SVG names its groups
    `figure_1`, `axes_1`, ... and the page holds several, so unprefixed ids would collide."""
    svg = _PROLOG.sub("", svg)
    prefix = f"plot{plot_id}-"
    ids = set(_ID.findall(svg))
    svg = _ID.sub(lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r"#([A-Za-z_][\w.-]*)", lambda m: f"#{prefix}{m.group(1)}" if m.group(1) in ids else m.group(0), svg)
    return svg.replace("<svg ", "<svg class=\"plot\" role=\"img\" ", 1).strip()


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _code(text: str) -> str:
    return f"<code>{_e(text)}</code>"


def _codes(values: list[str]) -> str:
    return ", ".join(f"<code>{_e(v)}</code>" for v in values) or "—"


def _range(dates: list[str | None]) -> str:
    first, last = (dates or [None, None])[:2]
    return f"{_e(first or '—')} to {_e(last or '—')}"


def _count(value: int) -> str:
    return f"<span class=\"bad\">{value}</span>" if value else "0"


def _fixed(value: float | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def _signed(value: float, digits: int) -> str:
    return f"{value:+.{digits}f}"




def _num(value: float) -> str:
    return f"{value:g}"


def _unit(value: float | None, unit: str) -> str:
    return f"{value:,.0f} {unit}" if value else "—"




def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "task"


# ---- the claims page (harness/report/claims.py builds its board) --------------------------------------------


_CLAIMS_CSS = """
.verdict-reproduced{color:#1a7f37}.verdict-contradicted,.verdict-not-reproduced,.verdict-opposite-effect{color:#c62828}
table.claims{width:100%}
table.claims th,table.claims td{white-space:normal;vertical-align:top}
table.claims td.col-claim{white-space:nowrap}
table.claims td.col-measured_by,table.claims td.col-verdict{min-width:11em}
ul.summary{margin-top:0}
details.not-run{margin:.4em 0 1em}details.not-run summary{cursor:pointer;color:#555}
"""


def render_claims_html(board: dict[str, Any]) -> str:
    """leaderboards/claims.html: the same cells, notes and verdict counts as claims.md (harness.report.claims),
    with each paper's "not run here" claims folded under it, so that the measured ones come first."""
    from harness.report import claims as claims_page
    from harness.report.claims import COLUMNS, NOT_RUN_HERE, row_cells, table_notes

    out = io.StringIO()
    out.write("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n")
    out.write("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n")
    out.write("<meta name=\"generator\" content=\"attnbench leaderboard --claims\">\n")
    out.write(f"<title>The papers' claims, measured here</title>\n<style>{_CSS}{_CLAIMS_CSS}</style>\n</head>\n<body>\n")
    out.write("<!-- generated by attnbench leaderboard --claims, do not edit -->\n<h1>The papers' claims, measured here</h1>\n")
    # The Markdown page's opening lines, whichever claims.py writes them: the summary, else the verdict counts.
    summary = getattr(claims_page, "summary_lines", None)
    lines = summary(board) if summary else ["Verdicts: " + ", ".join(f"{name} {n}" for name, n in claims_page._verdict_counts(board).items()) + "."]
    bullets = [line[2:] for line in lines if line.startswith("- ")]
    for line in lines:
        if not line.startswith("- "):
            out.write(f"<p class=\"finding summary\">{_inline(line)}</p>\n")
    if bullets:
        out.write("<ul class=\"summary\">\n" + "".join(f"<li>{_inline(line)}</li>\n" for line in bullets) + "</ul>\n")
    out.write(f"<p>{_inline(board['rule'])} {_inline(board['resolution_rule'])} Values are in the paper's units (points).</p>\n")
    from harness.report.claims_page import mechanism_rule_text

    if mechanism_rule_text(board):
        out.write(f"<p>{_inline(mechanism_rule_text(board))}</p>\n")
    out.write("<p class=\"generated\">Generated from <code>harness/claims.yaml</code> and the run records; do not edit. "
              "To add a claim, see docs/guides/reading-boards.md, “Adding a claim”.</p>\n")

    def claims_table(rows: list[dict[str, Any]]) -> str:
        body = []
        for row in rows:
            cells = row_cells(row)
            tds = []
            for name, _ in COLUMNS:
                content = _inline(cells[name])
                if name == "verdict":
                    content = f"<span class=\"verdict-{_e(_slug(row['verdict']))}\">{content}</span>"
                tds.append(_cell(content, cells[name].replace("`", ""), text=True).replace(" class=\"text\"", f" class=\"text col-{name}\"", 1))
            body.append(f"<tr>{''.join(tds)}</tr>\n")
        text = _table([(title, True) for _, title in COLUMNS], body, "claims")
        notes = table_notes(rows)
        if notes:
            text += ("<ul>\n" + "".join(f"<li>{', '.join(f'<code>{_e(claim_id)}</code>' for claim_id in ids)}: {_inline(note)}</li>\n"
                                        for ids, note in notes) + "</ul>\n")
        return text

    for paper_id, paper in board["papers"].items():
        rows = [row for row in board["rows"] if row["claim"]["paper"] == paper_id]
        if not rows:
            continue
        out.write(f"<section id=\"paper-{_e(_slug(paper_id))}\">\n<h2>{_e(paper['title'])}</h2>\n<p>")
        out.write(_e(", ".join(part for part in (paper.get("authors"), paper.get("venue"), paper["source"]) if part)) + ".")
        for extra in (paper.get("note"), (paper.get("setting") or {}).get("note"),
                      f"**Figures untraced**: {paper['untraced']}." if paper.get("untraced") else None):
            if extra:
                out.write(f" {_inline(extra)}")
        out.write("</p>\n")
        measured = [row for row in rows if row["claim"]["kind"] != "structural" and row["verdict"] != NOT_RUN_HERE]
        elsewhere = [row for row in rows if row["claim"]["kind"] != "structural" and row["verdict"] == NOT_RUN_HERE]
        if measured:
            out.write(claims_table(measured))
        if elsewhere:
            out.write(f"<details class=\"not-run\"><summary>{len(elsewhere)} claim{'s' if len(elsewhere) != 1 else ''} "
                      f"not run here{' (none of this paper runs here)' if not measured else ''}: show</summary>\n"
                      f"{claims_table(elsewhere)}</details>\n")
        structural = [row["claim"] for row in rows if row["claim"]["kind"] == "structural"]
        if structural:
            out.write("<ul>\n")
            for claim in structural:
                evidence = ", ".join(f"<code>{_e(item)}</code>" for item in claim["evidence"])
                out.write(f"<li><code>{_e(claim['id'])}</code>: {_inline(claim['claim'])}. Checked by: {evidence}.</li>\n")
            out.write("</ul>\n")
        out.write("</section>\n")
    out.write(f"<script>{_JS}</script>\n</body>\n</html>\n")
    return out.getvalue()


def _inline(text: str) -> str:
    """Escaped text with the Markdown the claims cells use (`code`, **bold**) as HTML."""
    escaped = _e(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    escaped = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", escaped)
