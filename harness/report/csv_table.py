"""The board's per-run table -> leaderboards/<suite>.csv: one row per planned run, flattened, missing runs included,
and each task's trivial baseline after its runs, as on the Markdown board. The rows are computed when the board is
built (board.csv_rows, from the plan and records the board reads); `render_csv` writes them from the board alone."""

from __future__ import annotations

import csv
import io
from typing import Any, Mapping

from harness.report.board import CSV_FIELDS, HARDWARE_FIELDS, SUPERSEDED, TRIVIAL, VERSION_FIELDS, Board, as_board  # noqa: F401


def render_csv(board: Board | Mapping[str, Any]) -> str:
    """leaderboards/<suite>.csv from the board alone (its `csv` part)."""
    board = as_board(board)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(board.csv["header"])
    writer.writerows(board.csv["rows"])
    return out.getvalue()
