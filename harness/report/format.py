"""How every rendering shows a time, a p-value or a table's resolution: the one place these formats are defined."""

from __future__ import annotations

from typing import Callable
from harness.timing import format_duration  # noqa: F401  (re-exported: the boards' name for it)


def format_p(p: float | None) -> str:
    """How every rendering of a board shows a p-value."""
    if p is None:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def resolution_sentence(table, quote: Callable[[str], str] = str) -> str:
    """The sentence under a task's heading saying the smallest difference from the baseline its seeds can see.
    `table` is a board.Table (or its dict form, read into one)."""
    from harness.report.board import Table  # here, not at the top: `bench` imports this module for format_duration alone

    table = Table.from_dict(table)
    resolution = table.resolution
    primary = table.metrics[0]
    if resolution is None or resolution.difference is None:
        return (f"Resolution: none (no variant has 2 seeds paired with {quote(table.baseline or 'softmax')}, "
                "so there is no paired spread to judge a difference by).")
    scale, digits, unit = (100.0, 2, " points") if primary.percent else (1.0, 4, "")
    variants = resolution.variants
    wider = "".join(f"; {quote(row['label'])} varies more (spread {row['spread'] * scale:.{digits}f}{unit}) and resolves "
                    f"{row['difference'] * scale:.{digits}f}{unit}" for row in resolution.wider or () if row["difference"] is not None)
    return (f"Resolution: with {resolution.pairs} paired seeds, a difference from {quote(table.baseline)} of "
            f"{resolution.difference * scale:.{digits}f}{unit} in {quote(primary.name)} is detected with 80% power "
            f"(median paired spread {resolution.spread * scale:.{digits}f}{unit} over {variants} variant{'s' if variants != 1 else ''}{wider}); "
            "smaller differences are invisible here.")


def path_note(cost) -> str:
    """" (eager+sdpa)": the attention paths the time was measured on (a board.Cost), where the records name any fused one."""
    paths = cost.attention_paths or []
    return f" ({'+'.join(paths)})" if paths else ""
