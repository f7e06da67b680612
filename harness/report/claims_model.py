"""The claims page's model: a ClaimRow per claim and the ClaimsBoard that holds them, frozen once measured
(harness.report.claims builds them; claims_page, html_page and the dose-response page render them and nothing else).

Both read like the mappings they replaced (`row["verdict"]`, `row.get("mechanism")`), as harness/results/record.py's
Record does: a field that is None reads as None and is left out of iteration, so code and tests written against the
dicts read the same values."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping


class _ReadsLikeAMapping(Mapping):
    """Mapping access to a frozen dataclass's fields; unknown names raise KeyError, None fields read as None."""

    def __getitem__(self, name: str) -> Any:
        if name not in self._field_names():
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        value = getattr(self, name, None) if name in self._field_names() else None
        return default if value is None else value

    def __iter__(self) -> Iterator[str]:
        return iter(name for name in self._field_names() if getattr(self, name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._field_names() and getattr(self, name) is not None

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def of(cls, values: Mapping[str, Any]):
        """From the measured dict; a key the model does not know is a programming error, named."""
        unknown = set(values) - set(cls._field_names())
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {', '.join(sorted(unknown))}")
        return cls(**values)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ClaimRow(_ReadsLikeAMapping):
    """One claim measured: its verdict on the claim as stated, what it rests on, and the mechanism beside it."""

    claim: Mapping[str, Any]
    verdict: str
    detail: str | None = None
    label: str | None = None
    reason: str | None = None
    in_this_setup: bool | None = None
    config: str | None = None
    setting: Mapping[str, Any] | None = None
    attention: Mapping[str, Any] | None = None
    planned: int | None = None
    recorded: int | None = None
    failed: int | None = None
    softmax: Mapping[str, Any] | None = None
    measure: Mapping[str, Any] | None = None
    resolution: float | None = None
    tuning: Mapping[str, Any] | None = None
    tuning_asymmetry: bool | None = None
    baselines_differ: bool | None = None
    baseline_note: str | None = None
    interim: str | None = None
    first_seeds: Mapping[str, Any] | None = None
    rests_on_added_seeds: bool | None = None
    mechanism: Mapping[str, Any] | None = None
    """The kernel's threshold rule over the seeds with evidence: {active, evidence, post_hoc: [dated thresholds]}."""
    mechanism_test: Any = None
    """The declared paired test (mechanism_test.MechanismTest), Holm-corrected over the page."""
    untraced: str | None = None
    """Why the paper's figure could not be checked against the paper here."""


@dataclass(frozen=True)
class ClaimsBoard(_ReadsLikeAMapping):
    papers: Mapping[str, Mapping[str, Any]]
    rows: tuple[ClaimRow, ...]
    confidence: float
    rule: str
    resolution_rule: str
    mechanism_test: Any = None
    mechanism_null: tuple = field(default_factory=tuple)
    mechanism_family: int = 0
    host_attention: tuple = field(default_factory=tuple)
    seed_history: Mapping[str, Any] = field(default_factory=dict)
    dose_finding: str | None = None
    """The λ dose-response page's finding sentence (dose_response.finding_sentence), shown in the summary."""
