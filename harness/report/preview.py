"""`--dry-run`: a Plan's runs as a table (task, variant, seed, key, status, estimated time), read from the
records already there and written nowhere.

The estimate of a run comes from earlier records on this machine's device: the run's own record (a failed
or died attempt that will be run again) or else the mean wall time of the same task, variant and parameters
on other seeds; "?" where there is none."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from harness.plan.spec import RunSpec
from harness.results.record import Record, Status


@dataclass(frozen=True)
class PreviewRow:
    task: str
    variant: str
    seed: int | str
    key: str
    status: str
    """finished, failed (kept; --retry-failed runs it again), pending, or NO_CHECKPOINT (would run, but the
    pretrained checkpoint it starts from is not available here; a real run refuses it)."""
    estimate_s: float | None
    """Expected seconds for a run that will run; None when unknown or nothing will run."""


NO_CHECKPOINT = "no checkpoint"
WAITING = ("pending", NO_CHECKPOINT)
"""The statuses of runs that have still to run."""


def read_records(runs_root: Path) -> list[Record]:
    """Every record under `runs_root`, without creating it (RecordStore makes the folder)."""
    if not runs_root.is_dir():
        return []
    from harness.results.store import RecordStore

    return list(RecordStore(runs_root))


def _same_configuration(spec: RunSpec) -> str:
    """What a run's key hashes, less its seed (the store writes mappings with sorted keys, so compare JSON)."""
    identity = {k: v for k, v in spec.to_dict().items() if k not in ("seed", "extra", "label")}
    return json.dumps(identity, sort_keys=True, default=str)


def preview_runs(specs: Sequence[RunSpec], records: Iterable[Record], device: str, retry_failed: bool = False,
                 missing_checkpoints: Mapping[str, str] | None = None) -> list[PreviewRow]:
    """`missing_checkpoints`: run key -> why its checkpoint is not available (Plan.missing_checkpoints); those
    runs that would run are marked NO_CHECKPOINT, still with their estimate."""
    by_key = {r.key: r for r in records}
    here = [r for r in by_key.values() if (r.hardware or {}).get("device") == device and r.wall_time_s]
    times_by_configuration: dict[str, list[float]] = {}
    for record in here:
        if record.status is Status.OK and record.spec:
            spec = RunSpec.from_dict(record.spec)
            times_by_configuration.setdefault(_same_configuration(spec), []).append(float(record.wall_time_s))
    rows = []
    for spec in specs:
        record = by_key.get(spec.key)
        if record is not None and record.is_final(retry_failed):
            status = "finished" if record.status is Status.OK else "failed"
            rows.append(PreviewRow(spec.task, spec.display, spec.seed, spec.key, status, None))
            continue
        own = record.wall_time_s if record is not None and (record.hardware or {}).get("device") == device else None
        others = times_by_configuration.get(_same_configuration(spec))
        estimate = own or (statistics.fmean(others) if others else None)
        status = NO_CHECKPOINT if spec.key in (missing_checkpoints or {}) else "pending"
        rows.append(PreviewRow(spec.task, spec.display, spec.seed, spec.key, status, estimate))
    return rows


def format_table(rows: Sequence[PreviewRow], workers: int = 1, noun: str = "runs") -> str:
    """The rows as an aligned text table and a last line with the counts and the expected time to run
    the pending ones on `workers` workers (the known estimates divided among them; unknown ones say so)."""
    from harness.report.format import format_duration

    header = ("task", "variant", "seed", "key", "status", "estimate")
    cells = [header] + [(r.task, r.variant, str(r.seed), r.key, r.status,
                         format_duration(r.estimate_s) if r.estimate_s is not None else ("?" if r.status in WAITING else ""))
                        for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    pending = [r for r in rows if r.status in WAITING]
    known = [r.estimate_s for r in pending if r.estimate_s is not None]
    counts = {status: sum(1 for r in rows if r.status == status) for status in ("finished", "failed", *WAITING)}
    blocked = f", {counts[NO_CHECKPOINT]} of them {NO_CHECKPOINT}" if counts[NO_CHECKPOINT] else ""
    total = f"about {format_duration(sum(known) / max(1, workers))} on {workers} worker(s)" if known else "time unknown"
    unknown = len(pending) - len(known)
    lines.append(f"{len(rows)} {noun}: {counts['finished']} finished, {counts['failed']} failed, {len(pending)} pending{blocked} "
                 f"({total}{f'; {unknown} without an earlier record on this device' if known and unknown else ''})")
    return "\n".join(lines)


def this_device() -> str:
    """What records name as their device (harness/run/runner.hardware): the GPU's name, or the CPU model."""
    import torch

    from harness.run.runner import cpu_model

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu_model()
