"""The compact results table `attnbench bench` prints when it ends (as lm-eval prints its results): one row
per variant, one column per task, the task's primary metric as mean ± sd over the seeds that finished.
The leaderboard files hold the rest (every metric, intervals, tests against the baseline, costs)."""

from __future__ import annotations

from typing import Mapping

from harness.plan.planner import Plan
from harness.report.stats import summarize
from harness.results.record import Record, Status


def _cell(values: list[float], planned: int, failed: int) -> str:
    if not values:
        return "failed" if failed else "—"
    summary = summarize(values)
    shown = f"{summary['mean']:.4f}" + (f" ± {summary['std']:.4f}" if summary["std"] is not None else "")
    return shown + (f" ({len(values)}/{planned})" if len(values) < planned else "")


def results_table(the_plan: Plan, records: Mapping[str, Record]) -> str:
    """The table as text; `records` by key (runs with no record show as "—", runs that all failed as "failed")."""
    tasks = list(dict.fromkeys(spec.task for spec in the_plan.specs))
    variants = list(dict.fromkeys(spec.display for spec in the_plan.specs))
    primary = {task: the_plan.metrics[task][0].name for task in tasks}
    cells: dict[tuple[str, str], str] = {}
    groups: set[str] = set()
    for task in tasks:
        for variant in variants:
            specs = [s for s in the_plan.specs if s.task == task and s.display == variant]
            if not specs:
                cells[task, variant] = ""
                continue
            found = [records[s.key] for s in specs if s.key in records]
            ok = [r for r in found if r.status is Status.OK and primary[task] in (r.metrics or {})]
            groups.update(r.hardware_label or "?" for r in ok)
            cells[task, variant] = _cell([float(r.metrics[primary[task]]["value"]) for r in ok], len(specs),
                                         sum(r.status is Status.FAILED for r in found))
    header = ["variant", *(f"{task} {primary[task]}" for task in tasks)]
    rows = [[variant, *(cells[task, variant] for task in tasks)] for variant in variants]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.append("mean ± sd over the seeds that finished; (n/N) where fewer than the planned N did")
    if len(groups) > 1:
        lines.append(f"records from {len(groups)} hardware classes, ranked together (as on the leaderboard, which shows cost per class)")
    return "\n".join(lines)
