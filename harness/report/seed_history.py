"""A suite's declared seed history checked against its records' finish times.

A suite that grows a task's seed count says when and why in `seed_history` (harness/plan/suite.py); the claims
board then also judges on the first declared seeds. A reader can only trust that split if the growth happened when
the suite says it did, relative to the runs: paper-gat's history said CiteSeer grew to 36 seeds "after every row's
first 20 CiteSeer seeds had finished", while at that commit 5 of its 12 rows had no CiteSeer record at all. So
each growth is printed with what the records show at its time: per row of the task, how many of its first seeds had
finished. An entry that asserts the first seeds were all finished (`after_first_seeds: true`) is flagged where the
records say otherwise.

When a growth happened: the entry's `at` (an ISO time, e.g. the commit's), else the end of its `declared` day (UTC),
the latest moment the date allows. Only the records a board counts are read (the planned keys' chosen executions),
so a row re-run since (a version bump) shows its current records' times."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from typing import Any, Mapping


@dataclass(frozen=True)
class Growth:
    task: str | None
    """None: the suite's common seeds."""
    before: int
    after: int
    at: datetime
    label: str
    """How the page names the moment: the entry's commit and time, or its date."""
    after_first_seeds: bool
    """The entry asserts that every row's first `before` seeds had finished when the count grew."""


def _moment(entry: Mapping[str, Any]) -> datetime:
    if entry.get("at"):
        value = entry["at"]
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    day = entry["declared"] if isinstance(entry["declared"], date) else date.fromisoformat(str(entry["declared"]))
    return datetime.combine(day, time(23, 59, 59), tzinfo=timezone.utc)


def growths(suite) -> list[Growth]:
    """Every declared growth of a seed count, per task (or the suite's common seeds), oldest first."""
    history = list(getattr(suite, "seed_history", None) or [])
    found = []
    for task in sorted({entry.get("task") for entry in history}, key=lambda t: (t is not None, t or "")):
        entries = [entry for entry in history if entry.get("task") == task]
        if task is not None:  # a task's own count grows from the suite's common count when it has no earlier entry
            common = [entry for entry in history if entry.get("task") is None]
            entries = common[:1] + entries
        for previous, entry in zip(entries, entries[1:]):
            if entry["seeds"] > previous["seeds"]:
                moment = _moment(entry)
                label = (f"{entry['commit']}, {moment:%Y-%m-%d %H:%M} UTC" if entry.get("commit") and entry.get("at")
                         else f"{entry.get('commit') + ', ' if entry.get('commit') else ''}declared {entry['declared']}")
                found.append(Growth(task, previous["seeds"], entry["seeds"], moment, label, bool(entry.get("after_first_seeds"))))
    return found


def _finished(record) -> datetime | None:
    stamp = getattr(record, "finished", None)
    if not stamp:
        return None
    moment = datetime.fromisoformat(stamp)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def what_records_show(growth: Growth, specs, records: Mapping[str, Any]) -> dict[str, Any]:
    """Per row of the growth's task: how many of its first `before` seeds had finished by the growth's moment."""
    rows: dict[str, int] = {}
    for spec in specs:
        if growth.task is not None and spec.task != growth.task:
            continue
        rows.setdefault(spec.display, 0)
        record = records.get(spec.key)
        moment = _finished(record) if record is not None else None
        if spec.seed < growth.before and moment is not None and moment <= growth.at:
            rows[spec.display] += 1
    complete = sorted(label for label, n in rows.items() if n >= growth.before)
    none = sorted(label for label, n in rows.items() if n == 0)
    partial = sorted(label for label, n in rows.items() if 0 < n < growth.before)
    return {"rows": len(rows), "complete": complete, "none": none, "partial": {label: rows[label] for label in partial}}


def contradicted(growth: Growth, shown: Mapping[str, Any]) -> bool:
    """The entry asserts every row's first seeds had finished, and some row's had not."""
    return growth.after_first_seeds and len(shown["complete"]) < shown["rows"]


def seed_history_lines(suite, specs, records: Mapping[str, Any], code=lambda text: f"`{text}`") -> list[str]:
    """One line per growth: what it declared, what the records show at its time, and a flag where they disagree."""
    lines = []
    for growth in growths(suite):
        shown = what_records_show(growth, specs, records)
        where = code(growth.task) if growth.task else "the suite"
        text = (f"{where} grew from {growth.before} to {growth.after} seeds ({growth.label}); the records show that by then "
                f"{len(shown['complete'])} of the {shown['rows']} rows planned now had all {growth.before} first seeds finished")
        if shown["partial"]:
            text += "; " + ", ".join(f"{code(label)} {n}" for label, n in shown["partial"].items()) + " of them"
        if shown["none"]:
            text += (f"; {len(shown['none'])} had none ({', '.join(code(label) for label in shown['none'])}: their counted records "
                     f"finished later, not run yet, added to the suite later or re-run since at a new version)")
        if contradicted(growth, shown):
            text += (f". **The declaration says the count grew after every row's first {growth.before} seeds had finished; "
                     f"the records contradict it**: the rows short of them ran those seeds after the growth")
        lines.append(text + ".")
    return lines
