"""Mid-run checkpoints: a killed run (or seed batch) resumes from its last saved epoch instead of epoch 0.

Where: `<runs>/checkpoints/`, beside `<runs>/records/`:
- `<key>.pt`: a lone run's Lightning checkpoint (harness/run/runner.py), with attnbench's own states in its
  callbacks' entries (harness/run/callbacks.py says which and why);
- `batch-<digest>.pt` + `batch-<digest>.keys`: a seed batch's state, per seed (harness/run/seed_batch.py); the
  digest is of the batch's sorted keys, and the `.keys` file (written once, before the first save) lists them, so
  that a later batch of some of those seeds finds it without loading it.

Every file is written as the store writes records (temp file, fsync, rename, fsync of the folder): a kill leaves
the previous checkpoint or the new one, never half of one. Every load is `torch.load(weights_only=True)`: a
checkpoint holds plain tensors, numbers, strings, lists and dicts, never pickled objects. A checkpoint that does
not load, or one written by another code version (attnbench commit, torch, Lightning, Python) or on another number
of data-parallel processes, is not trusted: it is discarded with a one-line message and the run starts afresh.
Data-parallel, rank 0 alone writes (Lightning's strategy) and reads it, and tells the other ranks whether to resume.

A checkpoint is removed once its run's record is written; `orphans`/`prune` find those a killed-for-good run
left (its key finished by another execution, or older than N days). Checkpoints are never results: exports
and imports (exchange.py) read `records/` only.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from harness.results.store import RecordStore, remove_stray_temps, runs_dir, write_atomically, write_text_atomically, writer_gone

FORMAT = 1
"""Bump when what a checkpoint holds changes meaning: older ones are then discarded as stale."""

ENV = "ATTNBENCH_CHECKPOINT_EVERY"
"""The interval, for this process and the workers and array tasks it starts: "25" (epochs), "10m" (minutes),
"25,10m" (whichever comes first), "0" (off)."""

DEFAULT_EVERY_EPOCHS = 25
DEFAULT_EVERY_MINUTES = 10.0
"""Measured on Cora (docs/design/records.md, "What survives a kill"; 1 thread, a loaded 2-core EPYC): one checkpoint costs 17 ms for a
lone run (epoch 370 ms there; ~50 ms unloaded) and 31 ms for a seed batch of 4 (1.3 s/epoch), so saving every epoch
would cost up to ~35% of an unloaded run and every 25 epochs under 2%, losing at most 25 epochs (~1 s) to a kill.
Long epochs (a GLUE fine-tune) are saved at least every 10 minutes, at the end of an epoch."""


@dataclass(frozen=True)
class Interval:
    epochs: int = DEFAULT_EVERY_EPOCHS
    minutes: float = DEFAULT_EVERY_MINUTES

    @property
    def off(self) -> bool:
        return self.epochs <= 0 and self.minutes <= 0

    def due(self, epochs_since: int, seconds_since: float) -> bool:
        """Whether a checkpoint is due after an epoch: `epochs_since` epochs and `seconds_since` seconds since the last
        save (or the start)."""
        if self.off:
            return False
        return (self.epochs > 0 and epochs_since >= self.epochs) or (self.minutes > 0 and seconds_since >= 60 * self.minutes)

    @classmethod
    def parse(cls, text: str) -> "Interval":
        """"25" -> every 25 epochs (minutes off), "10m" -> every 10 minutes, "25,10m" -> both, "0" -> off."""
        epochs, minutes = 0, 0.0
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
        if not parts:
            raise ValueError(f"{ENV}={text!r}: expected epochs (25), minutes (10m), both (25,10m) or 0 (off)")
        for part in parts:
            m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(m|min|minutes?)?", part)
            if not m:
                raise ValueError(f"{ENV}={text!r}: expected epochs (25), minutes (10m), both (25,10m) or 0 (off)")
            if m.group(2):
                minutes = float(m.group(1))
            else:
                epochs = int(float(m.group(1)))
        return cls(epochs, minutes)

    @classmethod
    def from_env(cls) -> "Interval":
        text = os.environ.get(ENV)
        return cls() if text is None or text.strip() == "" else cls.parse(text)

    def describe(self) -> str:
        if self.off:
            return "off"
        return " or ".join(([f"{self.epochs} epochs"] if self.epochs > 0 else []) + ([f"{self.minutes:g} minutes"] if self.minutes > 0 else []))


def batch_digest(keys: Iterable[str]) -> str:
    return hashlib.sha256(",".join(sorted(keys)).encode()).hexdigest()[:20]


def code_identity(commit: str | None) -> dict[str, str]:
    """What a checkpoint must have been written by to be trusted: the code (commit) and the versions that make a
    run's numbers (a torch or Lightning upgrade can change kernels or the checkpoint layout)."""
    import platform

    from harness.provenance import installed_version

    return {
        "format": str(FORMAT),
        "commit": str(commit or "unknown"),
        "attnbench": installed_version("attnbench"),
        "torch": installed_version("torch"),
        "lightning": installed_version("lightning"),
        "python": platform.python_version(),
    }


def say(message: str) -> None:
    print(f"attnbench: {message}", file=sys.stderr, flush=True)


def save_atomically(payload: Mapping[str, Any], target: Path) -> Path:
    """torch.save through the store's atomic write (temp file, fsync, rename, fsync of the folder)."""
    import torch

    return write_atomically(target, lambda fh: torch.save(dict(payload), fh))


def load_trusted(path: Path, *, keys: Sequence[str], commit: str | None, kind: str, world_size: int = 1) -> dict[str, Any] | None:
    """The checkpoint at `path` when it loads (weights_only) and was written for `keys` (all of them among its
    keys) by this code, on `world_size` processes; otherwise None, and a file that exists but is not trusted is
    discarded with one line."""
    import torch

    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        meta = payload["attnbench"]
    except Exception as exc:  # noqa: BLE001 - any failure to load: not trusted
        discard(path, f"does not load ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})")
        return None
    why = stale(meta, keys=keys, commit=commit, kind=kind, world_size=world_size)
    if why:
        discard(path, why)
        return None
    stopped = [key for key in keys if key not in set(meta.get("active") or [])]
    if stopped or (kind == "seed_batch" and set(keys) - set(payload.get("seeds") or {})):
        # Sound, but not for these runs: a batch checkpoint in which some of them had already stopped (their
        # records then exist, unless retried since); left for the runs it holds, or for `prune`.
        stopped = stopped or sorted(set(keys) - set(payload.get("seeds") or {}))
        say(f"not resuming from checkpoint {path.name}: it holds no state for {len(stopped)} of these {len(keys)} runs "
            f"({', '.join(stopped[:3])}{', ...' if len(stopped) > 3 else ''}), which had stopped training in it or were not "
            f"in it; these runs start afresh, and the checkpoint is left for the runs it holds")
        return None
    return payload


def stale(meta: Mapping[str, Any], *, keys: Sequence[str], commit: str | None, kind: str, world_size: int = 1) -> str | None:
    """Why a checkpoint's metadata makes it untrustworthy for `keys` on `world_size` processes, or None."""
    if not isinstance(meta, Mapping) or meta.get("kind") != kind:
        return f"is not a {kind} checkpoint"
    theirs, ours = meta.get("code") or {}, code_identity(commit)
    changed = [f"{name} {theirs.get(name)} -> {ours[name]}" for name in ours if theirs.get(name) != ours[name]]
    if changed:
        return "was written by another code version (" + ", ".join(changed) + ")"
    if kind == "run" and list(meta.get("keys") or []) != list(keys):
        return "was written for another run"
    if kind == "seed_batch" and set(keys) - set(meta.get("keys") or []):
        # found by the batch's .keys file, whose .pt says it holds other seeds: not this batch's file
        return f"was written for other seeds ({', '.join(sorted(set(keys) - set(meta.get('keys') or []))[:3])} not among them)"
    theirs_world = int(meta.get("world_size", 1))
    if theirs_world != world_size:
        # the key is the same on any number of DDP processes, but the data each rank saw and its generators are not
        return f"was written by a run on {theirs_world} process(es), not {world_size}"
    return None


def discard(path: Path, why: str) -> None:
    say(f"discarding checkpoint {path.name}: it {why}; the run starts afresh")
    path.unlink(missing_ok=True)


def metadata(kind: str, keys: Sequence[str], commit: str | None, epoch: int, resumes: int, active: Sequence[str] | None = None,
             world_size: int = 1) -> dict[str, Any]:
    return {"kind": kind, "keys": list(keys), "active": list(active if active is not None else keys), "epoch": int(epoch),
            "resumes": int(resumes), "saved": time.time(), "code": code_identity(commit), "world_size": int(world_size)}


class Checkpoints:
    """The checkpoints folder of a runs dir, and the interval its runs save at (None: the environment's)."""

    def __init__(self, runs: str | os.PathLike | None = None, interval: Interval | None = None):
        self.root = runs_dir(runs) / "checkpoints"
        self.interval = interval if interval is not None else Interval.from_env()

    @property
    def off(self) -> bool:
        return self.interval.off

    def run_path(self, key: str) -> Path:
        return self.root / f"{key}.pt"

    def batch_path(self, keys: Iterable[str]) -> Path:
        return self.root / f"batch-{batch_digest(keys)}.pt"

    def announce_batch(self, keys: Sequence[str]) -> Path:
        """Write the batch's `.keys` file (once): what a later batch of some of its seeds looks it up by."""
        path = self.batch_path(keys).with_suffix(".keys")
        if not path.exists():
            write_text_atomically("".join(f"{k}\n" for k in sorted(keys)), path)
        return path

    def batch_keys(self) -> dict[Path, list[str]]:
        """Every batch checkpoint here (its `.pt`) -> the keys it was named for."""
        found = {}
        for keys_file in sorted(self.root.glob("batch-*.keys")):
            try:
                found[keys_file.with_suffix(".pt")] = keys_file.read_text().split()
            except OSError:
                continue
        return found

    def batch_covering(self, keys: Sequence[str]) -> list[Path]:
        """Batch checkpoints whose seeds include every one of `keys` (newest first): a batch of these seeds may
        resume from one; which of them holds all still-training seeds is known only once loaded."""
        wanted = set(keys)
        paths = [pt for pt, named in self.batch_keys().items() if wanted <= set(named) and pt.is_file()]
        return sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)

    def remove_run(self, key: str) -> None:
        self.run_path(key).unlink(missing_ok=True)
        remove_stray_temps(self.run_path(key))

    def remove_batch(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        path.with_suffix(".keys").unlink(missing_ok=True)
        remove_stray_temps(path)  # the .keys file's temps share its stem

    def remove_finished_batches(self, keys: Iterable[str], finished: Callable[[str], bool]) -> list[Path]:
        """Remove every batch checkpoint holding any of `keys` whose seeds all have a final record (`finished`); returns
        what went."""
        keys = set(keys)
        gone = [pt for pt, named in self.batch_keys().items() if keys & set(named) and all(finished(k) for k in named)]
        for pt in gone:
            self.remove_batch(pt)
        return gone

    def resumable(self, keys: Iterable[str]) -> dict[str, Path]:
        """Of `keys`, those with a checkpoint here (lone or in a batch) -> its file; no file is loaded."""
        keys = list(keys)
        found = {k: self.run_path(k) for k in keys if self.run_path(k).is_file()}
        for pt, named in self.batch_keys().items():
            if pt.is_file():
                for k in set(named) & set(keys):
                    found.setdefault(k, pt)
        return found


@dataclass
class Entry:
    path: Path
    keys: list[str]
    size: int
    age_days: float
    finished: list[str]
    """Its keys that already have a final record."""

    @property
    def orphaned_by_records(self) -> bool:
        return bool(self.keys) and len(self.finished) == len(self.keys)


def entries(runs: str | os.PathLike | None = None) -> list[Entry]:
    """Every checkpoint in a runs dir with its keys, size, age and which of its keys have finished records."""
    cps = Checkpoints(runs, Interval(0, 0))
    if not cps.root.is_dir():
        return []
    store = RecordStore.__new__(RecordStore)  # read-only: RecordStore() would make the folder
    store.root = runs_dir(runs) / "records"
    batches = cps.batch_keys()
    now = time.time()
    found = []
    for path in sorted(cps.root.glob("*.pt")):
        keys = batches.get(path) if path.name.startswith("batch-") else [path.stem]
        keys = keys or []
        stat = path.stat()
        found.append(Entry(path, keys, stat.st_size, (now - stat.st_mtime) / 86400,
                           [k for k in keys if store.root.is_dir() and store.finished(k)]))
    return found


def orphans(runs: str | os.PathLike | None = None, older_than_days: float | None = None) -> list[Entry]:
    """Checkpoints nothing will resume from: every key they hold has a finished record, or (with
    `older_than_days`) they were last written longer ago than that."""
    return [e for e in entries(runs) if e.orphaned_by_records or (older_than_days is not None and e.age_days > older_than_days)]


def prune(runs: str | os.PathLike | None = None, older_than_days: float | None = None) -> list[Entry]:
    """Delete `orphans` (a batch's `.keys` file with its `.pt`) and stray temp files of killed saves; returns what went."""
    gone = orphans(runs, older_than_days)
    cps = Checkpoints(runs, Interval(0, 0))
    for entry in gone:
        cps.remove_batch(entry.path) if entry.path.name.startswith("batch-") else entry.path.unlink(missing_ok=True)
    if cps.root.is_dir():
        for tmp in cps.root.glob(".*.tmp"):
            # a save in progress is younger than an hour, and its writer alive
            if writer_gone(tmp) or time.time() - tmp.stat().st_mtime > 3600:
                tmp.unlink(missing_ok=True)
        for keys_file in cps.root.glob("batch-*.keys"):  # a batch killed before its first save
            if not keys_file.with_suffix(".pt").exists() and time.time() - keys_file.stat().st_mtime > 86400 * (older_than_days or 1):
                keys_file.unlink(missing_ok=True)
    return gone


def describe(runs: str | os.PathLike | None = None, older_than_days: float | None = None, do_prune: bool = False) -> str:
    """`attnbench results checkpoints [--prune] [--older-than DAYS]`: one line per checkpoint, then what was pruned."""
    listed = entries(runs)
    root = runs_dir(runs) / "checkpoints"
    if not listed:
        return f"attnbench: no checkpoints in {root}"
    lines = [f"attnbench: {len(listed)} checkpoint(s) in {root}:"]
    for e in listed:
        state = ("orphaned: every run has a finished record" if e.orphaned_by_records else
                 f"old: {e.age_days:.1f} days" if older_than_days is not None and e.age_days > older_than_days else
                 f"{len(e.keys) - len(e.finished)} of {len(e.keys)} run(s) unfinished")
        lines.append(f"  {e.path.name:<30} {e.size / 2**20:7.2f} MB  {e.age_days:6.1f} days  {state}")
    if do_prune:
        gone = prune(runs, older_than_days)
        lines.append(f"attnbench: pruned {len(gone)} checkpoint(s), {sum(e.size for e in gone) / 2**20:.2f} MB")
    else:
        n = len(orphans(runs, older_than_days))
        if n:
            lines.append(f"attnbench: {n} orphaned; --prune deletes them")
    return "\n".join(lines)
