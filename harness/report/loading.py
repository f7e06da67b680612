"""Plans and records for the report pages, loaded in one place: a suite planned once, its records read once from a
store, and the evidence records derived from its executions (report/evidence.py). The claims page and the
dose-response page both read through here, so they see the same records and the same evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from harness.report.evidence import evidence_record
from harness.results.record import Record


@dataclass(frozen=True)
class SuiteRecords:
    """One suite's plan and what a store holds of it: `records` (the shown execution per key, whose numbers the
    boards print) and `evidence` (per key run more than once, the record to read mechanism evidence from)."""

    plan: Any
    records: Mapping[str, Record] = field(default_factory=dict)
    evidence: Mapping[str, Record] = field(default_factory=dict)

    @property
    def read(self) -> dict[str, Record]:
        """Per key, the record mechanism evidence is read from: the evidence record where there is one."""
        return {**self.records, **self.evidence}


def open_store(runs: str | Path | None):
    """The record store at `runs`, or None where it has no records folder: opening one would create it, and the
    pages only read."""
    from harness.results.store import RecordStore, runs_dir

    return RecordStore(runs) if (runs_dir(runs) / "records").is_dir() else None


def load_suite_records(suite: str, store, data_root: str | None, the_plan: Any = None) -> SuiteRecords:
    """Plan `suite` (unless `the_plan` is given) and read its records and evidence from `store` (None: no records)."""
    if the_plan is None:
        from harness.plan.planner import plan
        from harness.plan.suite import load_suite

        the_plan = plan(load_suite(suite), data_root)
    loaded = store.load(s.key for s in the_plan.specs) if store is not None else None
    if loaded is None:
        return SuiteRecords(the_plan)
    return SuiteRecords(the_plan, loaded.records,
                        {key: evidence_record(copies) for key, copies in loaded.executions.items() if copies})
