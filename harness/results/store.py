"""The record store: one immutable JSON file per run, written atomically, named by the run key.

Because the file name is the key and a record only appears through an atomic rename, a killed
process can never leave a half-written record that a reader sees, and a re-run can never duplicate
one: at most one file per key exists.

Records from other machines arrive through `import_record` (`attnbench results import`). The copy already in
the store always stays `records/<key>.json`, so resume and skip logic (`finished`) still read one file per key;
an arriving copy with different content is kept beside it, named by a digest of its content so that importing
it twice stores it once:
- `records/executions/<key>.<digest>.json`: another execution of the same experiment (same spec, both final
  with the same status), e.g. the same run on another machine. Not a conflict: a key is the experiment, and
  how it ran (hardware, threads, commit, timings) is metadata (docs/design/identity-and-execution.md).
  The board uses the earliest finished copy (`chosen_execution`) and reports how well the copies agree.
- `records/conflicts/<key>.<digest>.json`: a genuine conflict (a different spec under the key, a finished copy
  against a failed or died one). The board counts the run as a conflict until someone deletes the wrong copy.
- `records/retracted/<key>.<digest>.json`: an execution shown wrong by a later fix of the code path that made it
  (`retract`), kept with the reason but no longer a result: the key is run again (or another execution of it takes
  its place), and importing the same copy again is refused ("retracted"). docs/design/identity-and-execution.md: "When a fix
  changes results under an unchanged key".
Each copy is written atomically like a record, so a killed import leaves either the copy or nothing."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import socket
import sys
import tempfile
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from harness.results.record import Record, utc_now


def runs_dir(explicit: str | os.PathLike | None = None) -> Path:
    value = explicit or os.environ.get("ATTNBENCH_RUNS") or "runs"
    return Path(value).expanduser().resolve()


class UnreadableRecord(ValueError):
    """A record file exists but does not load: truncated or corrupt JSON (a disk that filled up, a bad copy,
    a hand edit). Reported by name, never taken for a run that has not happened."""

    def __init__(self, path: Path, cause: Exception):
        super().__init__(f"{path}: {type(cause).__name__}: {cause}")
        self.path, self.cause = path, cause


def record_digest(record: Record) -> str:
    """A digest of a record's content, independent of how its file was indented."""
    return hashlib.sha256(json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()[:12]


_UNREADABLE = object()
"""What import_record finds under a key whose file does not load: neither "no record" (it is never overwritten)
nor a record (the arriving one is kept beside it as a conflicting copy)."""

_NUMBER_LIST = re.compile(r"\[\s*((?:-?[0-9][0-9.eE+-]*|null|NaN|-?Infinity)(?:,\s*(?:-?[0-9][0-9.eE+-]*|null|NaN|-?Infinity))*)\s*\]")


def _file_mode() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()
"""What open() would give a new file here (0666 less the umask), read once at import."""


def temp_owner() -> str:
    """`<host>~<pid>` of this process, as write_atomically names its temp files."""
    return f"{socket.gethostname().replace('.', '_')}~{os.getpid()}"


def writer_gone(tmp: Path) -> bool:
    """Whether the process that wrote temp file `tmp` (`.<stem>.<host>~<pid>.<random>.tmp`, write_atomically) is
    gone: it ran on this host and that pid is dead. A process killed between its temp file and the rename leaves
    one. Another host's temp, or one named otherwise, is not known gone (checkpoints.prune ages those out)."""
    owner = re.search(r"\.([^.~]+)~(\d+)\.[^.]*\.tmp$", tmp.name)
    if owner is None or owner.group(1) != temp_owner().split("~")[0]:
        return False
    try:
        os.kill(int(owner.group(2)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def remove_stray_temps(target: Path) -> list[Path]:
    """Remove the temp files of `target` whose writer is gone (`writer_gone`); a save in progress keeps its own."""
    gone = [tmp for tmp in target.parent.glob(f".{glob.escape(target.stem)}.*.tmp") if writer_gone(tmp)]
    for tmp in gone:
        tmp.unlink(missing_ok=True)
    return gone


def write_atomically(target: Path, write: Callable[[Any], Any]) -> Path:
    """`write(binary file)` into a temp file beside `target`, fsync, rename over it, fsync of the folder: a reader
    (or a process killed meanwhile) sees the old file or the new one, never half of one, and the rename survives a
    power cut. The one place the store's records and the runs' checkpoints are written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # the writer's host and pid in the name: a temp file a killed writer left can be told from a save in progress
    # (`remove_stray_temps`)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.{temp_owner()}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp's 0600 would hide records and boards from the group a cluster shares them with
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    return target


def write_text_atomically(text: str, target: Path) -> Path:
    """`text` as UTF-8 through `write_atomically`."""
    return write_atomically(target, lambda fh: fh.write(text.encode()))


def record_json(record: Record) -> str:
    """A record as its file holds it: one field per line, but a list of numbers (a learning curve) on one
    line, which keeps a record with 60-point curves near 4 KB instead of one number per line."""
    text = json.dumps(record.to_dict(), indent=1, sort_keys=True, default=str)
    return _NUMBER_LIST.sub(lambda m: "[" + ",".join(part.strip() for part in m.group(1).split(",")) + "]", text)


@dataclass
class Loaded:
    """What a store holds for a set of keys: the records that load, the files that do not (key -> error), and
    the keys that have a conflicting copy from an import (key -> the copies' paths)."""

    records: dict[str, Record] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)
    conflicts: dict[str, list[str]] = field(default_factory=dict)
    """Key -> its conflicting copies as `records/conflicts/<file>` (relative, for the same reason)."""
    executions: dict[str, list[Record]] = field(default_factory=dict)
    """Key -> every finished execution of it (the store's own record first), for keys with two or more;
    `records[key]` is then the chosen one (`chosen_execution`)."""


class RecordStore:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = runs_dir(root) / "records"
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def conflicts_dir(self) -> Path:
        return self.root / "conflicts"

    @property
    def executions_dir(self) -> Path:
        return self.root / "executions"

    @property
    def retracted_dir(self) -> Path:
        return self.root / "retracted"

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def write(self, record: Record | Mapping[str, Any]) -> Path:
        """A mapping is validated as a Record first: nothing reaches the disk that would not load back."""
        if not isinstance(record, Record):
            record = Record.from_dict(record)
        path = self._write_atomically(record, self.path(record.key))
        remove_stray_temps(path)  # a process killed inside an earlier write of this key left one
        return path

    def _write_atomically(self, record: Record, target: Path) -> Path:
        return self._write_text_atomically(record_json(record), target)

    def _write_text_atomically(self, text: str, target: Path) -> Path:
        return write_atomically(target, lambda fh: fh.write(text.encode()))

    def read_checked(self, key: str) -> Record | None:
        """The record of `key`, None when there is none; raises UnreadableRecord when its file does not load."""
        path = self.path(key)
        try:
            with open(path) as fh:
                return Record.from_dict(json.load(fh))
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
            raise UnreadableRecord(path, exc) from exc

    def read(self, key: str) -> Record | None:
        try:
            return self.read_checked(key)
        except UnreadableRecord as exc:
            print(f"attnbench: warning: ignoring unreadable record {exc}", file=sys.stderr)
            return None

    def load(self, keys: Iterable[str]) -> Loaded:
        """Like `read_many`, but says which files did not load and which keys have conflicting copies."""
        loaded = Loaded()
        for key in keys:
            try:
                record = self.read_checked(key)
            except UnreadableRecord as exc:
                # named relative to the runs dir: boards render it, and must not depend on where the store sits
                loaded.unreadable[key] = f"records/{exc.path.name}: {type(exc.cause).__name__}: {exc.cause}"
                continue
            if record is not None:
                loaded.records[key] = record
                others = self.other_executions(key)
                if others:
                    loaded.executions[key] = [record, *others]
                    loaded.records[key] = chosen_execution(loaded.executions[key])
            copies = self.conflicting_copies(key)
            if copies:
                loaded.conflicts[key] = [f"records/conflicts/{copy.name}" for copy in copies]
        return loaded

    def conflicting_copies(self, key: str) -> list[Path]:
        return sorted(self.conflicts_dir.glob(f"{key}.*.json"))  # a folder not made yet globs to nothing

    def other_executions(self, key: str) -> list[Record]:
        """The key's other executions (not its own record), in file order; a copy that does not load is skipped
        with a warning, as `read` does."""
        found = []
        for path in sorted(self.executions_dir.glob(f"{key}.*.json")):
            try:
                found.append(Record.from_dict(json.loads(path.read_text())))
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
                print(f"attnbench: warning: ignoring unreadable execution copy {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return found

    def is_retracted(self, record: Record) -> bool:
        return (self.retracted_dir / f"{record.key}.{record_digest(record)}.json").exists()

    def retracted(self) -> list[dict[str, Any]]:
        """Every retracted execution: {"reason", "retracted" (when), "record"}, in file order."""
        return [json.loads(path.read_text()) for path in sorted(self.retracted_dir.glob("*.json"))]

    def retract(self, key: str, reason: str) -> Record | None:
        """Move the key's record aside as retracted, with `reason`, and put the earliest finished of its other
        executions (if any) in its place; returns that successor, or None when the key is now unrun (so `bench`
        runs it again). Why a fix retracts instead of deleting: the wrong number stays on file with why it was
        wrong, and an old export of it cannot come back through an import."""
        record = self.read_checked(key)
        if record is None:
            raise KeyError(f"no record of {key} in {self.root}")
        entry = {"reason": reason, "retracted": utc_now(), "record": record.to_dict()}
        self._write_text_atomically(json.dumps(entry, indent=1, sort_keys=True, default=str), self.retracted_dir / f"{key}.{record_digest(record)}.json")
        others = [(path, Record.from_dict(json.loads(path.read_text()))) for path in sorted(self.executions_dir.glob(f"{key}.*.json"))]
        if not others:
            self.path(key).unlink()
            return None
        successor = chosen_execution([r for _, r in others])
        self.write(successor)  # replaces the retracted record in one rename: the key is never seen unrun meanwhile
        next(path for path, r in others if r is successor).unlink()
        return successor

    def import_record(self, record: Record) -> str:
        """Merge one record from another store: "added" (a new key), "same" (an identical record, or the same
        execution copy, is already here), "execution" (another execution of the same experiment, kept beside the
        store's record) or "conflict" (kept as a conflicting copy); see the module docstring. An unreadable file
        under the key is never overwritten either: what arrives for it is a conflict."""
        if self.is_retracted(record):
            return "retracted"
        try:
            present = self.read_checked(record.key)
        except UnreadableRecord:
            present = _UNREADABLE
        if present is None:
            self.write(record)
            return "added"
        if present == record:
            return "same"
        outcome = "execution" if present is not _UNREADABLE and same_experiment(present, record) else "conflict"
        folder = self.executions_dir if outcome == "execution" else self.conflicts_dir
        copy = folder / f"{record.key}.{record_digest(record)}.json"
        if copy.exists():
            return "same"
        self._write_atomically(record, copy)
        return outcome

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


_NOT_IDENTITY = ("label", "extra")
"""Spec fields outside the key (RunSpec.key): how a board names a row and where the spec came from, so that a
tuned row whose best parameters are the defaults, run on another machine, is still the same experiment."""


def same_experiment(a: Record, b: Record) -> bool:
    """Two records of one key that are two executions of one experiment rather than a conflict: the same spec
    (the fields the key is made of, precision included), both final (a died run is retried, so it is no outcome
    to compare), with the same status."""
    def identity(record: Record) -> dict[str, Any]:
        return {k: v for k, v in (record.spec or {}).items() if k not in _NOT_IDENTITY}

    return identity(a) == identity(b) and a.status == b.status and a.is_final() and b.is_final()


def chosen_execution(copies: Iterable[Record]) -> Record:
    """The execution a board shows for a key run more than once: the earliest finished (ties and copies without a
    finish time by content digest), so that the board does not depend on which store imported which."""
    return min(copies, key=lambda r: (r.finished is None, r.finished or "", record_digest(r)))


def has_evaluated_diagnostics(record: Record) -> bool:
    """Whether a record carries mechanism diagnostics at its evaluated weights (`test/diag/<name>`, runs since issue
    51; modules/attention/mechanism.py reads them)."""
    return any(name.startswith("test/diag/") for name in record.diagnostics or {})


def same_evaluated_weights(a: Record, b: Record) -> bool:
    """Whether two executions of a key evaluated the same weights, as far as records tell: the same kept epoch, the
    same monitored value there and the same test metrics, bit for bit (a re-run on the same hardware class gives
    that; another class often takes another trajectory, docs/design/identity-and-execution.md, "Reproducibility across CPUs")."""
    def values(record: Record) -> dict:
        return {name: m.get("value") for name, m in (record.metrics or {}).items()}

    return (a.best_epoch == b.best_epoch and (a.best_monitor or {}).get("value") == (b.best_monitor or {}).get("value")
            and values(a) == values(b) and a.best_epoch is not None)


def diagnosed_execution(copies: list[Record]) -> Record:
    """The execution of a key to read its mechanism diagnostics from: the copy the boards show (`chosen_execution`)
    where it carries them at its evaluated weights; else the earliest other execution that evaluated the same
    weights (`same_evaluated_weights`: a key re-run so that its record carries the evidence); else the
    chosen copy, whose missing evidence the rules then report. An execution on another trajectory is never read:
    its evaluated weights are not the ones behind the numbers the boards show."""
    chosen = chosen_execution(copies)
    if has_evaluated_diagnostics(chosen):
        return chosen
    same = [r for r in copies if r is not chosen and has_evaluated_diagnostics(r) and same_evaluated_weights(r, chosen)]
    return chosen_execution(same) if same else chosen
