"""Plan + record store -> leaderboards/<suite>.md, .csv and .html.

The Markdown and HTML are renderings of one board (board.py), so they cannot disagree; the CSV lists every
planned run's record, flattened. Generated, never hand-edited: the same records give byte-identical files
(no clock, everything sorted, fixed float formats)."""

from __future__ import annotations

from pathlib import Path

from harness.plan.planner import Plan, plan
from harness.plan.suite import load_suite
from harness.report.board import build_board
from harness.report.csv_table import render_csv
from harness.report.html_page import render_html
from harness.report.markdown import render_markdown
from harness.results.store import RecordStore


def write_leaderboard(suite_name: str, *, runs: str | None = None, out_dir: str | Path = "leaderboards", data_root: str | None = None,
                      tuned_params_dir: str | Path | None = None) -> list[Path]:
    """`attnbench leaderboard`: plan the suite and write its boards from the records in `runs`. With
    `tuned_params_dir`, tuned rows ("<variant> (tuned)") are listed next to the defaults."""
    return write_boards(plan(load_suite(suite_name), data_root, tuned_dir=tuned_params_dir), RecordStore(runs), out_dir)


def write_boards(the_plan: Plan, store: RecordStore, out_dir: str | Path = "leaderboards") -> list[Path]:
    """The boards of a plan already made (`bench` hands over the plan it ran) from the store's records."""
    suite = the_plan.suite
    records = store.read_many(s.key for s in the_plan.specs)
    board = build_board(suite, the_plan, records)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{suite.name}.md"
    md.write_text(render_markdown(board))
    table = out / f"{suite.name}.csv"
    table.write_text(render_csv(suite, the_plan, records))
    page = out / f"{suite.name}.html"
    page.write_text(render_html(board))
    return [md, table, page]
