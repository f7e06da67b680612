"""Was a variant's mechanism at work in a run? The rule the claims board applies before any negative verdict
(issue 35): where the mechanism was inactive, a "not reproduced" would report a no-op, not the paper's idea.

Each variant declares its diagnostics and their thresholds (`AttentionKernel.mechanism`, MechanismDiagnostic says
how a rule reads a curve, each declaration says why its threshold); the run's record keeps them as curves
(`history["diag/<name>"]` per training epoch or block of epochs, `history["val/diag/<name>"]` for validation)
and final values (`diagnostics["diag/<name>"]`, `diagnostics["val/diag/<name>"]`, and the test pass's
`diagnostics["test/attn/<name>"]`). `mechanism_active(record, baseline)` reads them:

- (True, evidence): the rule holds (any ruled diagnostic, or all of them where the variant says 'all');
- (False, evidence): it does not: the board's verdict is "inconclusive: mechanism inactive";
- (None, reason): nothing to decide: a variant without ruled diagnostics (softmax), a record from before the
  diagnostics existed, or a 'below-baseline' rule without the baseline's record at the same task and seed.
"""

from __future__ import annotations

from typing import Any, Mapping

from .kernel import MechanismDiagnostic


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _variant(record: Any) -> str | None:
    spec = _field(record, "spec") or {}
    return spec.get("variant")


def _curve(record: Any, key: str) -> list[float]:
    history = _field(record, "history") or {}
    return [v for v in (history.get(key) or []) if v is not None]


def _final(record: Any, key: str) -> float | None:
    """The last value of a curve: the record's final diagnostic, else the curve's last point."""
    value = (_field(record, "diagnostics") or {}).get(key)
    if value is not None:
        return float(value)
    curve = _curve(record, key)
    return curve[-1] if curve else None


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def diagnostic_active(declared: MechanismDiagnostic, record: Any, baseline: Any = None) -> tuple[bool | None, str]:
    """One declared diagnostic's rule on a record: (active, evidence)."""
    name, rule, threshold = declared.name, declared.rule, declared.threshold
    key = f"diag/{name}"
    if rule is None:
        return None, f"{name}: shown, no rule"
    if rule == "max>":
        curve = _curve(record, key)
        if not curve:
            return None, f"{name}: not recorded"
        peak = max(curve)
        return peak > threshold, f"{name} max {_fmt(peak)} {'>' if peak > threshold else '<='} {_fmt(threshold)}"
    if rule in ("final>", "final<"):
        value = _final(record, key)
        if value is None:
            return None, f"{name}: not recorded"
        active = value > threshold if rule == "final>" else value < threshold
        sign = (">" if active else "<=") if rule == "final>" else ("<" if active else ">=")
        return active, f"{name} final {_fmt(value)} {sign} {_fmt(threshold)}"
    if rule == "moved":
        curve, value = _curve(record, key), _final(record, key)
        if not curve or value is None:
            return None, f"{name}: not recorded"
        start = curve[0]
        moved = abs(value - start) / max(abs(start), 1e-12)
        return moved > threshold, f"{name} {_fmt(start)} -> {_fmt(value)} ({moved:.1%} {'>' if moved > threshold else '<='} {threshold:.0%})"
    if rule == "below-baseline":
        value = _final(record, f"val/{key}")
        if value is None:
            return None, f"{name}: not recorded"
        if baseline is None:
            return None, f"{name} {_fmt(value)}: no {declared.baseline} record at this seed to compare with"
        reference = _final(baseline, f"val/{key}")
        if reference is None:
            return None, f"{name} {_fmt(value)}: the {declared.baseline} record has no {name}"
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
    evidence = "; ".join(text for _, _, text in outcomes)
    decided = [active for _, active, _ in outcomes if active is not None]
    if combine == "all":
        if any(active is False for active in decided):
            return False, evidence
        return (True, evidence) if len(decided) == len(outcomes) else (None, evidence)
    if any(decided):
        return True, evidence
    return (False, evidence) if len(decided) == len(outcomes) else (None, evidence)
