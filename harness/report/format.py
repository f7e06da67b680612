"""How every rendering shows a time or a p-value: the one place these formats are defined."""

from __future__ import annotations


def format_duration(seconds: float | None) -> str:
    """How every rendering of a board shows a time."""
    if not seconds:
        return "—"
    if seconds < 10:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.1f} s" if seconds < 600 else f"{seconds / 60:.1f} min"


def format_p(p: float | None) -> str:
    """How every rendering of a board shows a p-value."""
    if p is None:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"
