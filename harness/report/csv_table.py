"""Plan + Records -> leaderboards/<suite>.csv: one row per planned run, flattened, missing runs included, and
each task's trivial baseline after its runs, as on the Markdown board."""

from __future__ import annotations

import csv
import io
import math
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # the boards read a plan as data (a snapshot's too) and never import the planner, nor torch
    from harness.plan.planner import Plan

from harness.report.board import current_versions, trivial_baseline
from harness.results.record import Record


CSV_FIELDS = ["key", "suite", "task", "variant", "label", "version", "seed", "status", "error", "epochs", "best_epoch", "time_per_epoch_s",
              "fit_time_s", "wall_time_s", "peak_memory_mb", "parameters", "hardware", "accelerator", "device", "device_count",
              "threads", "torch", "python", "lightning", "commit", "finished"]
HARDWARE_FIELDS = ("accelerator", "device", "device_count", "threads")
VERSION_FIELDS = ("torch", "python", "lightning")
TRIVIAL = "trivial"
SUPERSEDED = "superseded"
"""The status of a record whose variant or task has a newer version among the records (board.current_versions)."""


def render_csv(suite, the_plan: Plan, records: Mapping[str, Record], unreadable: Mapping[str, str] | None = None) -> str:
    """One row per planned run, missing ones included: the per-seed data behind the board's statistics; then a row per task
    for its trivial baseline. A run
    whose record file does not load has status "unreadable" and the reason in `error`."""
    unreadable = unreadable or {}
    metric_names = sorted({name for s in the_plan.specs if s.key in records for name in records[s.key].metrics or {}})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS + metric_names + ["attention", "params"])
    specs = sorted(the_plan.specs, key=lambda s: (s.task, s.display, s.seed, s.key))
    counted = {id(s) for s in current_versions(specs, records)[0]}
    for task in sorted({s.task for s in specs}):
        for spec in (s for s in specs if s.task == task):
            row = _run_row(suite, spec, records.get(spec.key), unreadable, metric_names)
            if id(spec) not in counted:  # as the board counts it: another version's record is no seed of this one
                row[CSV_FIELDS.index("status")] = SUPERSEDED
            writer.writerow(row)
        # As on the Markdown board: the task's input-blind baseline after its runs (status "trivial", no run
        # key; what it predicts in the attention column, where a run names its model).
        trivial = trivial_baseline(the_plan, task)
        if trivial is not None:
            row = ["", suite.name, task, TRIVIAL, TRIVIAL, "", "", TRIVIAL] + [""] * (len(CSV_FIELDS) - 8)
            writer.writerow(row + [_num(trivial["metrics"].get(m)) for m in metric_names] + [f"predictor={trivial['predictor']}", ""])
    return out.getvalue()


def _run_row(suite, spec, record: Record | None, unreadable: Mapping[str, str], metric_names: list[str]) -> list[Any]:
    if record is None:
        if spec.key in unreadable:
            row = [spec.key, suite.name, spec.task, spec.variant, spec.display, spec.variant_version, spec.seed, "unreadable",
                   unreadable[spec.key]]
        else:
            row = [spec.key, suite.name, spec.task, spec.variant, spec.display, spec.variant_version, spec.seed, "missing"]
        row += [""] * (len(CSV_FIELDS) - len(row))
        return row + [""] * len(metric_names) + [_compact(spec.attention), _compact(spec.params)]
    r = record.to_dict()
    hardware, versions = r.get("hardware") or {}, r.get("versions") or {}
    values = {
        "key": spec.key, "suite": suite.name, "task": spec.task, "variant": spec.variant, "label": spec.display,
        "version": spec.variant_version, "seed": spec.seed, "status": r.get("status"), "error": (r.get("error") or "").split("\n")[0],
        "hardware": hardware.get("label", ""),
        **{f: _num(hardware.get(f)) for f in HARDWARE_FIELDS},
        **{f: versions.get(f, "") for f in VERSION_FIELDS},
    }
    row = [values[f] if f in values else _num(r.get(f)) for f in CSV_FIELDS]
    row += [_num(r.get("metrics", {}).get(m, {}).get("value")) for m in metric_names]
    return row + [_compact(spec.attention), _compact(spec.params)]


def _num(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value


def _compact(mapping) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(dict(mapping).items()))
