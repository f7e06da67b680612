"""Moving records between stores: `attnbench results export` and `attnbench results import`.

Runs of one suite may happen on many machines (SLURM shards, other clusters, other users); each keeps its
own store, and their records meet in one store (for the committed boards, leaderboards/records/) through a
JSON-lines file: one compact record per line, sorted by key, so that two exports of the same records are
the same bytes and a diff of two exports shows what changed. Merging never overwrites: see
RecordStore.import_record."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from harness.results.record import Record
from harness.results.store import RecordStore, UnreadableRecord, record_digest


@dataclass
class Transfer:
    """What an export or import did: counts by outcome, and each file or line that could not be read."""

    counts: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


def _line(record: Record) -> str:
    return json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":"), default=str)


def export_records(store: RecordStore, out: str | os.PathLike) -> Transfer:
    """Every record of the store, then its conflicting copies, one line each, sorted by (key, copy). An
    unreadable record is left out and named in `problems`."""
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
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text("".join(line + "\n" for _, _, line in sorted(lines)))
    os.replace(tmp, target)  # a reader never sees half an export
    return transfer


def _records_in(source: Path, transfer: Transfer) -> Iterator[Record]:
    """A .jsonl file, or a folder: a runs dir (with records/), a records/ folder, or a folder of .jsonl files."""
    if source.is_dir():
        folder = source / "records" if (source / "records").is_dir() else source
        for path in sorted(folder.glob("*.jsonl")):
            yield from _records_in(path, transfer)
        for path in [*sorted(folder.glob("*.json")), *sorted((folder / "conflicts").glob("*.json"))]:
            try:
                yield Record.from_dict(json.loads(path.read_text()))
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
                transfer.problems.append(f"{path}: {type(exc).__name__}: {exc}")
        return
    with open(source) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield Record.from_dict(json.loads(line))
            except (json.JSONDecodeError, ValueError, TypeError) as exc:
                transfer.problems.append(f"{source}:{number}: {type(exc).__name__}: {exc}")


def import_records(source: str | os.PathLike, store: RecordStore) -> Transfer:
    path = Path(source)
    if not path.exists():
        raise ValueError(f"results import: {path} does not exist (a .jsonl file from `attnbench results export`, or a runs folder)")
    transfer = Transfer()
    for record in _records_in(path, transfer):
        transfer.counts[store.import_record(record)] += 1
    return transfer
