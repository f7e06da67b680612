"""The record store: one immutable JSON file per run, written atomically, named by the run key.

Because the file name is the key and a record only appears through an atomic rename, a killed
process can never leave a half-written record that a reader sees, and a re-run can never duplicate
one: at most one file per key exists."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from harness.results.record import Record


def runs_dir(explicit: str | os.PathLike | None = None) -> Path:
    value = explicit or os.environ.get("ATTNBENCH_RUNS") or "runs"
    return Path(value).expanduser().resolve()


class RecordStore:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = runs_dir(root) / "records"
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def write(self, record: Record | Mapping[str, Any]) -> Path:
        """A mapping is validated as a Record first: nothing reaches the disk that would not load back."""
        if not isinstance(record, Record):
            record = Record.from_dict(record)
        target = self.path(record.key)
        fd, tmp = tempfile.mkstemp(prefix=f".{record.key}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(record.to_dict(), fh, indent=1, sort_keys=True, default=str)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
        return target

    def read(self, key: str) -> Record | None:
        try:
            with open(self.path(key)) as fh:
                return Record.from_dict(json.load(fh))
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, ValueError, TypeError) as exc:  # only possible if someone edited the file by hand
            print(f"attnbench: warning: ignoring unreadable record {self.path(key)}: {exc}", file=sys.stderr)
            return None

    def read_many(self, keys: Iterable[str]) -> dict[str, Record]:
        found = {}
        for key in keys:
            record = self.read(key)
            if record is not None:
                found[key] = record
        return found

    def __iter__(self) -> Iterator[Record]:
        for path in sorted(self.root.glob("*.json")):
            record = self.read(path.stem)
            if record is not None:
                yield record

    def finished(self, key: str, retry_failed: bool = False) -> bool:
        record = self.read(key)
        return record is not None and record.is_final(retry_failed)
