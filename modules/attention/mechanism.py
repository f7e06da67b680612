"""Was a variant's mechanism at work in a run? The kernels' threshold rules, which the claims page reports beside
each verdict (never instead of it: the claim as stated is judged whatever its mechanism did), together with the
declared paired test of harness/report/mechanism_test.py.

Each variant declares its diagnostics and their thresholds (`AttentionKernel.mechanism`, MechanismDiagnostic says
how a rule reads a value, each declaration says what its threshold measures and why). The rules read the value at
the evaluated weights: the test pass's `diagnostics["test/diag/<name>"]`, computed with the weights that gave the
run's test numbers (the epoch the stopping rule kept). GAT's rule keeps an epoch a median 443 epochs
before the last, and read at the last epoch align-ct looked active in 12 of 20 Cora seeds where at the kept weights
it was in 5-6. A record without that value has "no evidence at the evaluated weights": nothing falls back to the
training curves. `mechanism_active(record, baseline)`:

- (True, evidence): the rule holds (any ruled diagnostic, or all of them where the variant says 'all');
- (False, evidence): it does not;
- (None, reason): nothing to decide: a variant without ruled diagnostics (softmax), a record without evidence at
  the evaluated weights (made before runs measured it), or a 'below-baseline' rule without the baseline's record at the
  same task and seed.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .kernel import MechanismDiagnostic

EVALUATED = "test/diag/"
"""Where a record keeps its diagnostics at the evaluated weights."""
EVALUATED_ATTENTION = "test/attn/"
"""Where the test pass's attention statistics go (the kernel's diagnostics averaged over the test pass's calls, at the
same evaluated weights): records made before `test/diag/` existed carry a declared diagnostic there only, equal to
its `test/diag/` value wherever a record holds both. Per-layer keys (`test/attn/l0/...`) are not read."""
EVALUATED_KEYS = (EVALUATED, EVALUATED_ATTENTION)
"""Every key a value at the evaluated weights is read from, in order. Training-time curves and validation values
(`diag/<name>`, `val/diag/<name>`) are never read: they come from other weights than the test numbers'."""
NO_EVIDENCE = "no evidence at the evaluated weights"


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _variant(record: Any) -> str | None:
    spec = _field(record, "spec") or {}
    return spec.get("variant")


def _curve(record: Any, key: str) -> list[float]:
    history = _field(record, "history") or {}
    return [v for v in (history.get(key) or []) if v is not None]


def evaluated(record: Any, name: str) -> float | None:
    """A diagnostic's value at the record's evaluated weights (`test/diag/<name>`, else `test/attn/<name>`), or None
    where the record carries neither."""
    values = _field(record, "diagnostics") or {}
    for prefix in EVALUATED_KEYS:
        value = values.get(prefix + name)
        if value is not None and math.isfinite(float(value)):
            return float(value)
    return None


def has_evaluated_evidence(record: Any, names: Any = None) -> bool:
    """Whether the record carries a diagnostic at its evaluated weights (`names`: any of these; default any at all)."""
    if names is not None:
        return any(evaluated(record, name) is not None for name in names)
    return any(name.startswith(EVALUATED) for name in (_field(record, "diagnostics") or {}))


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def ruled_figure(declared: MechanismDiagnostic, record: Any, baseline: Any = None) -> float | None:
    """The number a declared rule compares with its threshold, at the evaluated weights: the value ('above',
    'below'), its relative move from the first epoch ('moved'), or its ratio to the baseline's ('below-baseline');
    None where the record (or the baseline's) lacks it."""
    value = evaluated(record, declared.name)
    if value is None or declared.rule is None:
        return None
    if declared.rule == "moved":
        curve = _curve(record, f"diag/{declared.name}")
        return abs(value - curve[0]) / max(abs(curve[0]), 1e-12) if curve else None
    if declared.rule == "below-baseline":
        reference = evaluated(baseline, declared.name) if baseline is not None else None
        return None if reference is None else value / max(reference, 1e-12)
    return value


def figure_name(declared: MechanismDiagnostic) -> str:
    """What `ruled_figure` is, in words: 'sample_tv', 'alpha's relative move', 'qk_distance ratio to softmax's'."""
    return {"moved": f"{declared.name}'s relative move",
            "below-baseline": f"{declared.name} ratio to {declared.baseline}'s"}.get(declared.rule or "", declared.name)


def describe_rule(declared: MechanismDiagnostic) -> str:
    """'qk_distance ratio to softmax's < 0.8', 'sample_tv > 0.01', ...: a rule in words, for a page's figures."""
    sign = {"above": ">", "below": "<", "moved": ">", "below-baseline": "<"}.get(declared.rule or "")
    return f"{figure_name(declared)} {sign} {_fmt(declared.threshold)}" if sign and declared.threshold is not None else declared.name


def diagnostic_active(declared: MechanismDiagnostic, record: Any, baseline: Any = None) -> tuple[bool | None, str]:
    """One declared diagnostic's rule on a record, at its evaluated weights: (active, evidence)."""
    name, rule, threshold = declared.name, declared.rule, declared.threshold
    if rule is None:
        value = evaluated(record, name)
        return None, f"{name} {_fmt(value)}: shown, no rule" if value is not None else f"{name}: shown, no rule"
    value = evaluated(record, name)
    if value is None:
        return None, f"{name}: {NO_EVIDENCE}"
    if rule in ("above", "below"):
        active = value > threshold if rule == "above" else value < threshold
        sign = (">" if active else "<=") if rule == "above" else ("<" if active else ">=")
        return active, f"{name} {_fmt(value)} {sign} {_fmt(threshold)}"
    if rule == "moved":
        curve = _curve(record, f"diag/{name}")
        if not curve:
            return None, f"{name}: no training curve to start from"
        start = curve[0]
        moved = abs(value - start) / max(abs(start), 1e-12)
        return moved > threshold, f"{name} {_fmt(start)} -> {_fmt(value)} ({moved:.1%} {'>' if moved > threshold else '<='} {threshold:.0%})"
    if rule == "below-baseline":
        if baseline is None:
            return None, f"{name} {_fmt(value)}: no {declared.baseline} record at this seed to compare with"
        reference = evaluated(baseline, name)
        if reference is None:
            return None, f"{name} {_fmt(value)}: the {declared.baseline} record has {NO_EVIDENCE}"
        ratio = value / max(reference, 1e-12)
        return ratio < threshold, (f"{name} {_fmt(value)} vs {declared.baseline}'s {_fmt(reference)} "
                                   f"(x{ratio:.2f} {'<' if ratio < threshold else '>='} x{threshold:g})")
    raise ValueError(f"unknown mechanism rule {rule!r}")


def declared_mechanism(variant: str) -> tuple[tuple[MechanismDiagnostic, ...], str]:
    """A registered variant's declared diagnostics and how they combine ('any' / 'all')."""
    from .registry import attention_entry

    cls = attention_entry(variant).cls
    return tuple(cls.mechanism), cls.mechanism_rule


def baseline_variant(variant: str) -> str | None:
    """The variant whose record at the same task and seed `mechanism_active` needs as `baseline` (or None)."""
    declared, _ = declared_mechanism(variant)
    return next((d.baseline for d in declared if d.rule == "below-baseline"), None)


def mechanism_active(record: Any, baseline: Any = None) -> tuple[bool | None, str]:
    """(active, evidence) for a run's record (a Record or its dict); `baseline`: the record of
    `baseline_variant(variant)` at the same task and seed, where the variant's rule compares with it."""
    variant = _variant(record)
    if variant is None:
        return None, "the record names no variant"
    try:
        declared, combine = declared_mechanism(variant)
    except (KeyError, ValueError):
        return None, f"{variant} is not registered here"
    ruled = [d for d in declared if d.rule is not None]
    if not ruled:
        return None, f"{variant} declares no mechanism rule"
    outcomes = [(d, *diagnostic_active(d, record, baseline)) for d in ruled]
    shown = [diagnostic_active(d, record)[1] for d in declared if d.rule is None and evaluated(record, d.name) is not None]
    evidence = "; ".join([text for _, _, text in outcomes] + shown)
    decided = [active for _, active, _ in outcomes if active is not None]
    if combine == "all":
        if any(active is False for active in decided):
            return False, evidence
        return (True, evidence) if len(decided) == len(outcomes) else (None, evidence)
    if any(decided):
        return True, evidence
    return (False, evidence) if len(decided) == len(outcomes) else (None, evidence)
