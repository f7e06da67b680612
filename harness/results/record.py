"""The record of one run: a typed, immutable value with a status, the only shape a run's outcome takes.

On disk a record is a flat JSON object (store.py writes `to_dict()`); `from_dict` validates one read back.
Fields a record does not have (a failed run has no metrics' values, a dead worker no hardware) are left
out of the file rather than written as null, and fields this code does not know are kept, so records
written by older or newer code load and round-trip. A record also reads like the mapping it is stored as
(`record["status"]`, `record.get("traceback")`), which is how reports and tests look at its fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Iterator

from datamodules.paths import is_environment_fault_message

if TYPE_CHECKING:
    from harness.plan.spec import RunSpec


class Status(StrEnum):
    """What became of a run. A run whose process died is FAILED and `retryable` (see `Record.died`):
    the board counts it with the failures, and the next `bench` runs it again."""

    OK = "ok"
    FAILED = "failed"
    PRUNED = "pruned"
    """Stopped early by a tuning pruner; final, like ok and failed."""


SUMMARY_FIELDS = ("key", "status", "error", "metrics", "epochs", "best_epoch", "time_per_epoch_s", "wall_time_s", "peak_memory_mb")
"""What a worker reports back per run and `attnbench run` prints: the headline of a record."""


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Record(Mapping):
    key: str
    status: Status
    spec: Mapping[str, Any] | None = None
    """The RunSpec as a dict (`RunSpec.to_dict`), so a record says what ran without the code that planned it."""
    error: str | None = None
    """`ExceptionType: message` of a failed run."""
    traceback: str | None = None
    retryable: bool = False
    """The run failed through no fault of its own (its process died): `bench` runs it again."""
    metrics: Mapping[str, Mapping[str, Any]] | None = None
    """Test metric name -> {"value": float, "higher_is_better": bool}."""
    diagnostics: Mapping[str, float] | None = None
    best_epoch: int | None = None
    best_monitor: Mapping[str, Any] | None = None
    parameters: int | None = None
    epochs: int | None = None
    time_per_epoch_s: float | None = None
    """fit_time_s / epochs."""
    fit_time_s: float | None = None
    """Training time of the whole fit (every epoch's training and validation), over every process that trained it:
    a run resumed from a checkpoint counts the epochs its checkpoint held too. A seed batch's record counts the
    seed's share of the batch's epochs (docs/design/seed-batching.md)."""
    fit_time_this_process_s: float | None = None
    """The part of fit_time_s spent in the process that wrote the record; only on a record resumed from a
    checkpoint (`execution["resumed_from_epoch"]`): absent, the whole fit ran in that process."""
    wall_time_s: float | None = None
    """The writing process's wall time for this run, from its start to its record (building, fitting its part of
    the fit, testing): for a resumed run it can be less than fit_time_s, since the fit began in an earlier process."""
    peak_memory_mb: float | None = None
    history: Mapping[str, Any] | None = None
    """Learning curves (harness/run/callbacks.py History): {"epoch": [...], "train/loss": [...], "val/<m>": [...],
    "aux/<term>": [...], "epoch_s": [...]}, one value per epoch or per block of epochs on long fits, None
    where a series was not logged. Records written before it existed have none."""
    started: str | None = None
    finished: str | None = None
    commit: str | None = None
    """`git rev-parse --short=12 HEAD` where it ran, with "-dirty" when the work tree had uncommitted changes."""
    dirty: bool = False
    """The run's code had uncommitted changes, so its commit alone does not say what ran. Derived from the
    commit's "-dirty" suffix when a record does not say it (older records), and stored only when true."""
    versions: Mapping[str, str] | None = None
    hardware: Mapping[str, Any] | None = None
    distributed: Mapping[str, Any] | None = None
    execution: Mapping[str, Any] | None = None
    """How the run was executed, never what it was, so never part of its key (docs/design/identity-and-execution.md: identity
    vs execution): e.g. {"seed_batch": 20} when 20 seeds of one configuration trained as one batched model,
    the worker count, the world size. Records without it ran alone, one seed per process."""
    unknown: Mapping[str, Any] = field(default_factory=dict)
    """Fields written by other versions of the harness, kept as they are."""

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"a record needs a non-empty string key, got {self.key!r}")
        if isinstance(self.commit, str) and self.commit.endswith("-dirty"):
            object.__setattr__(self, "dirty", True)
        try:
            object.__setattr__(self, "status", Status(self.status))
        except ValueError:
            raise ValueError(f"record {self.key}: unknown status {self.status!r}; one of {', '.join(Status)}") from None

    @classmethod
    def ok(cls, spec: "RunSpec", metrics: Mapping[str, Mapping[str, Any]], **measured: Any) -> "Record":
        return cls(key=spec.key, spec=spec.to_dict(), status=Status.OK, metrics=dict(metrics), **measured)

    @classmethod
    def failed(cls, spec: "RunSpec", error: str, **measured: Any) -> "Record":
        return cls(key=spec.key, spec=spec.to_dict(), status=Status.FAILED, error=error, metrics={}, **measured)

    @classmethod
    def died(cls, key: str, spec: Mapping[str, Any], cause: str, *, commit: str | None, wall_time_s: float | None = None) -> "Record":
        """The process running this run died (OOM kill, segfault, a SLURM task past its limit). Not the run's own
        fault as far as anyone can tell, so it is retryable: the next bench of the suite tries it again."""
        return cls(key=key, spec=dict(spec), status=Status.FAILED, error=cause, retryable=True, metrics={}, wall_time_s=wall_time_s,
                   commit=commit, finished=utc_now())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Record":
        if not isinstance(data, Mapping):  # valid JSON that is not an object: the store reports it as unreadable
            raise TypeError(f"a record is a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"unknown"}
        return cls(**{k: v for k, v in data.items() if k in known}, unknown={k: v for k, v in data.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "unknown"}
        data = {k: v for k, v in data.items() if v is not None and not (k in ("retryable", "dirty") and not v)}
        data["status"] = str(self.status)
        return {**self.unknown, **data}

    def summary(self) -> dict[str, Any]:
        return {name: self.get(name) for name in SUMMARY_FIELDS}

    def is_final(self, retry_failed: bool = False) -> bool:
        """Whether `bench` keeps this record instead of running its spec again."""
        if self.retryable:
            return False
        if self.status is Status.FAILED and is_environment_fault_message(self.error):
            return False  # data or network missing when it ran (recorded so by versions before they were retryable)
        return not (retry_failed and self.status is Status.FAILED)

    @property
    def hardware_label(self) -> str | None:
        return (self.hardware or {}).get("label")

    # Mapping: a record reads like its stored form.
    def __getitem__(self, name: str) -> Any:
        return self.to_dict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and self.to_dict() == other.to_dict()
