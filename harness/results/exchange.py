"""Moving records between stores: `attnbench results export` and `attnbench results import`.

Runs of one suite may happen on many machines (SLURM shards, other clusters, other users); each keeps its
own store, and their records meet in one store (for the committed boards, leaderboards/records/) through a
JSON-lines file: one compact record per line, sorted by key, so that two exports of the same records are
the same bytes and a diff of two exports shows what changed. Merging never overwrites: see
RecordStore.import_record. `compare_sources` says how far two stores (or exports) agree on the keys they share:
whether a new machine reproduces the committed boards."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from harness.results.record import Record, Status
from harness.results.store import RecordStore, UnreadableRecord, record_digest


@dataclass
class Transfer:
    """What an export or import did: counts by outcome, and each file or line that could not be read."""

    counts: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


def _line(record: Record) -> str:
    return json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":"), default=str)


def export_records(store: RecordStore, out: str | os.PathLike) -> Transfer:
    """Every record of the store, then its conflicting copies and other executions, one line each, sorted by
    (key, copy): a key's own record first, so an importing store keeps the same one. An unreadable record is
    left out and named in `problems`."""
    transfer = Transfer()
    lines: list[tuple[str, str, str]] = []
    for path in sorted(store.root.glob("*.json")):
        try:
            record = store.read_checked(path.stem)
        except UnreadableRecord as exc:
            transfer.problems.append(str(exc))
            continue
        if record is not None:
            lines.append((record.key, "", _line(record)))
            transfer.counts["record"] += 1
        for copy in store.conflicting_copies(path.stem):
            try:
                conflicting = Record.from_dict(json.loads(copy.read_text()))
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
                transfer.problems.append(f"{copy}: {type(exc).__name__}: {exc}")
                continue
            lines.append((conflicting.key, record_digest(conflicting), _line(conflicting)))
            transfer.counts["conflicting copy"] += 1
        for execution in store.other_executions(path.stem):
            lines.append((execution.key, record_digest(execution), _line(execution)))
            transfer.counts["other execution"] += 1
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text("".join(line + "\n" for _, _, line in sorted(lines)))
    os.replace(tmp, target)  # a reader never sees half an export
    return transfer


def _record_folders(source: Path) -> list[Path]:
    """The record folders under `source`: its records/ (a runs dir), itself when it holds record files, else every
    runs dir below it, e.g. a SLURM job array's output with one runs dir per node or array task."""
    if (source / "records").is_dir():
        return [source / "records"]
    if any(source.glob("*.json")) or any(source.glob("*.jsonl")) or source.name == "records":
        return [source]
    return sorted(path for path in source.rglob("records") if path.is_dir() and path.parent.name not in ("records",))


def _records_in(source: Path, transfer: Transfer) -> Iterator[Record]:
    """A .jsonl file, or a folder: a runs dir (with records/), a records/ folder, a folder of .jsonl files, or a
    folder with runs dirs below it (see `_record_folders`)."""
    if source.is_dir():
        for folder in _record_folders(source):
            yield from _folder_records(folder, transfer)
        return
    with open(source) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield Record.from_dict(json.loads(line))
            except (json.JSONDecodeError, ValueError, TypeError) as exc:
                transfer.problems.append(f"{source}:{number}: {type(exc).__name__}: {exc}")


def _folder_records(folder: Path, transfer: Transfer) -> Iterator[Record]:
    for path in sorted(folder.glob("*.jsonl")):
        yield from _records_in(path, transfer)
    for path in [*sorted(folder.glob("*.json")), *sorted((folder / "executions").glob("*.json")), *sorted((folder / "conflicts").glob("*.json"))]:
        try:
            yield Record.from_dict(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
            transfer.problems.append(f"{path}: {type(exc).__name__}: {exc}")


def _existing(sources: Iterable[str | os.PathLike], verb: str) -> list[Path]:
    paths = [Path(source) for source in sources]
    absent = [str(path) for path in paths if not path.exists()]
    if absent:  # checked before anything is read, so a typo in the third source imports nothing
        raise ValueError(f"results {verb}: {', '.join(absent)} does not exist (a .jsonl file from `attnbench results export`, "
                         "or a runs folder, or a folder of them such as a SLURM job array's output)")
    return paths


def import_records(sources: str | os.PathLike | Iterable[str | os.PathLike], store: RecordStore) -> Transfer:
    """Every record of every source into `store`, source by source in the order given."""
    paths = _existing([sources] if isinstance(sources, (str, os.PathLike)) else sources, "import")
    transfer = Transfer()
    for path in paths:
        for record in _records_in(path, transfer):
            transfer.counts[store.import_record(record)] += 1
    return transfer


@dataclass
class Agreement:
    """How two sources agree on one (task, metric) over the keys both finished: `shared` keys with a value on
    both sides, `identical` of them bit for bit, and the largest absolute difference."""

    task: str
    metric: str
    shared: int = 0
    identical: int = 0
    max_abs_diff: float = 0.0


def _first_copies(source: Path, transfer: Transfer) -> dict[str, Record]:
    """One record per key of a source: its own record when it is a store (an export lists it before the copies
    of its key), so that a compare reads what that source's board would rank."""
    found: dict[str, Record] = {}
    for record in _records_in(source, transfer):
        found.setdefault(record.key, record)
    return found


def compare_sources(a: str | os.PathLike, b: str | os.PathLike) -> tuple[list[Agreement], dict[str, int], Transfer]:
    """Per (task, metric), the agreement of two stores or exports on the keys both hold as ok records; and the
    key counts: only in a, only in b, shared (ok on both sides)."""
    path_a, path_b = _existing([a, b], "compare")
    transfer = Transfer()
    left, right = _first_copies(path_a, transfer), _first_copies(path_b, transfer)
    agreements: dict[tuple[str, str], Agreement] = {}
    shared = 0
    for key in sorted(left.keys() & right.keys()):
        x, y = left[key], right[key]
        if x.status is not Status.OK or y.status is not Status.OK:
            continue
        shared += 1
        task = str((x.spec or {}).get("task", "?"))
        for metric in sorted((x.metrics or {}).keys() & (y.metrics or {}).keys()):
            u, v = x.metrics[metric].get("value"), y.metrics[metric].get("value")
            if u is None or v is None:
                continue
            agreement = agreements.setdefault((task, metric), Agreement(task, metric))
            agreement.shared += 1
            if float(u) == float(v) or (math.isnan(float(u)) and math.isnan(float(v))):
                agreement.identical += 1
            else:
                agreement.max_abs_diff = max(agreement.max_abs_diff, abs(float(u) - float(v)))
    counts = {"only_a": len(left.keys() - right.keys()), "only_b": len(right.keys() - left.keys()), "shared_ok": shared}
    return [agreements[k] for k in sorted(agreements)], counts, transfer
