"""How attnbench writes a duration, on the harness's lowest floor so that a run's progress lines (harness/run) and
the boards (harness/report) say times the same way without the run layer importing the report layer."""

from __future__ import annotations

import math


def format_duration(seconds: float | None) -> str:
    """How every rendering of a board, and every progress line, shows a time: seconds to 3 significant digits up to
    10 minutes ("0.256 s", "9.41 s", "369 s"), then minutes up to 100 ("61.5 min"), then hours ("2.5 h"). One unit
    for the short times a table compares (a column of epoch times once mixed "9407.5 ms" with "13.7 s")."""
    if not seconds:
        return "—"
    if seconds < 600:
        return f"{_significant(seconds)} s"
    if seconds < 6000:
        return f"{_significant(seconds / 60)} min"
    return f"{_significant(seconds / 3600)} h"


def _significant(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, keeping trailing zeros ("15.0", "0.250") and never a bare point."""
    rounded = float(f"{value:.{digits}g}")  # first, so that 9.996 reads "10.0", not "10.00"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:.{decimals}f}"
