"""How attnbench writes a duration, on the harness's lowest floor so that a run's progress lines (harness/run) and
the boards (harness/report) say times the same way without the run layer importing the report layer."""

from __future__ import annotations


def format_duration(seconds: float | None) -> str:
    """How every rendering of a board, and every progress line, shows a time."""
    if not seconds:
        return "—"
    if seconds < 10:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.1f} s" if seconds < 600 else f"{seconds / 60:.1f} min"
