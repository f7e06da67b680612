"""A run specification and its content-hash key."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from harness.plan import PRECISIONS

RECORD_SCHEMA = 1
"""Bump when the meaning of a record changes; it is part of every key."""



@dataclass(frozen=True)
class RunSpec:
    task: str
    variant: str
    """Registered attention name."""
    attention: Mapping[str, Any]
    """The variant's full config (every field, defaults resolved), so a changed default changes the key."""
    params: Mapping[str, Any]
    """The task's full parameters, defaults resolved."""
    seed: int
    task_version: str
    variant_version: str
    label: str = ""
    """How the leaderboard names this configuration (defaults to the variant name)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Not part of the key: where the spec came from (suite name, tuned-params file, ...)."""
    precision: str = "32"
    """The Lightning Trainer's precision. Part of the key only when it is not "32", so that the keys of
    records written before runs had a precision (all fp32) stay what they were."""

    @property
    def key(self) -> str:
        """The experiment's identity, never how it ran (docs/design/identity-and-execution.md): task and
        its version, variant, its version and full config, task parameters, seed, and precision (bf16 and fp32
        are different experiments). Hardware, threads, workers, world size, seed batching and commit are
        metadata (`Record.hardware`, `Record.execution`, `Record.commit`): the same key run on two machines is
        two executions of one experiment (RecordStore keeps both; the board ranks one and reports how they agree)."""
        identity = {
            "schema": RECORD_SCHEMA,
            "task": self.task,
            "task_version": self.task_version,
            "variant": self.variant,
            "variant_version": self.variant_version,
            "attention": dict(self.attention),
            "params": dict(self.params),
            "seed": self.seed,
        }
        if self.precision != "32":
            identity["precision"] = self.precision
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    @property
    def display(self) -> str:
        return self.label or self.variant

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "attention": dict(self.attention), "params": dict(self.params), "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunSpec":
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclass(frozen=True)
class ResolvedAttention:
    """A variant's name, full config (every field, defaults filled in) and version: resolved once per
    suite entry or command line, then shared by every task and seed that runs it."""

    name: str
    config: Mapping[str, Any]
    version: str


def resolve_attention(attention: str | Mapping[str, Any]) -> ResolvedAttention:
    """Name and config checked against the Config's declared types and ranges first (ConfigError names the
    key), then resolved by the registry."""
    # Imported here, not at the top: a RunSpec and its key are plain data, which the boards read without
    # importing the registries (and so torch; harness/plan/catalogue.py's plan snapshots).
    from modules.attention import attention_entry, resolve_config
    from modules.validation import validate_fields

    if isinstance(attention, Mapping) and "name" in attention:
        options = {k: v for k, v in attention.items() if k != "name" and v is not None}
        checked = validate_fields(attention_entry(attention["name"]).cls.Config, options,
                                  owner=f"attention {attention['name']!r}", noun="option")
        attention = {**attention, **checked}
    name, config = resolve_config(attention)
    return ResolvedAttention(name, {"name": name, **config.to_dict()}, attention_entry(name).version)


def make_spec(
    task: str,
    attention: str | Mapping[str, Any] | ResolvedAttention,
    seed: int,
    params: Mapping[str, Any] | None = None,
    label: str = "",
    extra: Mapping[str, Any] | None = None,
    precision: str = "32",
) -> RunSpec:
    """Resolve names and defaults now, so that a typo fails before anything runs."""
    from modules.registry import keyed_version
    from modules.tasks import Task, get_task

    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    task_def = get_task(task)
    resolved_params = dataclasses.asdict(task_def.params(params))
    if not isinstance(attention, ResolvedAttention):
        attention = resolve_attention(attention)
    return RunSpec(
        task=task,
        variant=attention.name,
        attention=dict(attention.config),
        params=resolved_params,
        seed=int(seed),
        task_version=keyed_version(type(task_def), Task),
        variant_version=attention.version,
        label=label or attention.name,
        extra=dict(extra or {}),
        precision=precision,
    )
