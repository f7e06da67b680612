"""Plan + record store -> leaderboards/<suite>.md, .csv and .html.

The Markdown and HTML are renderings of one board (board.py), so they cannot disagree; the CSV lists every
planned run's record, flattened. Generated, never hand-edited: the same records give byte-identical files
(no clock, everything sorted, fixed float formats).

A board is never lost by accident: writing one with fewer finished records than the board already on disk
(a wrong --runs-dir, a fresh clone without the records, a narrow --variants) is refused unless forced. The
count on disk is read from the board's CSV, which lists every planned run with its status, so no other file
has to be kept in step with the board."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from harness.plan.planner import Plan, plan
from harness.plan.suite import load_suite
from harness.report.board import build_board
from harness.report.claims import CLAIMS_FILE, build_claims_board, load_claims, render_claims_markdown
from harness.report.csv_table import render_csv
from harness.report.html_page import render_claims_html, render_html
from harness.report.markdown import render_markdown
from harness.results.record import Status
from harness.results.store import RecordStore

FINISHED = frozenset(map(str, Status))
"""CSV statuses that count as a finished record (ok, failed, pruned); not missing, not unreadable."""


class BoardWouldShrink(ValueError):
    """Writing the board would replace finished records by fewer (exit 2 through the CLI's error path)."""


class EmptySelection(ValueError):
    """The plan has no run at all (a --variants glob that matches nothing): an error, never an empty board."""


def finished_on_board(csv_path: Path) -> int:
    """Finished records on an existing board, from its CSV; 0 when there is no board yet."""
    if not csv_path.exists():
        return 0
    with open(csv_path, newline="") as fh:
        # by key: a tuned row whose parameters are the defaults lists the default row's runs again
        return len({row["key"] for row in csv.DictReader(fh) if row.get("status") in FINISHED})


def write_leaderboard(suite_name: str, *, runs: str | None = None, out_dir: str | Path = "leaderboards", data_root: str | None = None,
                      tuned_params_dir: str | Path | None = None, force: bool = False, skip_unrecorded: bool = False) -> list[Path]:
    """`attnbench leaderboard`: plan the suite and write its boards from the records in `runs`. With
    `tuned_params_dir`, tuned rows ("<variant> (tuned)") are listed next to the defaults. With
    `skip_unrecorded`, a suite of which `runs` holds no record at all is left as it is (returns [])."""
    the_plan = plan(load_suite(suite_name), data_root, tuned_dir=tuned_params_dir)
    store = RecordStore(runs)
    if skip_unrecorded and not any(store.path(s.key).exists() for s in the_plan.specs):
        return []
    return write_boards(the_plan, store, out_dir, force=force)


def write_boards(the_plan: Plan, store: RecordStore, out_dir: str | Path = "leaderboards", *, force: bool = False) -> list[Path]:
    """The boards of a plan already made (`bench` hands over the plan it ran) from the store's records."""
    suite = the_plan.suite
    if not the_plan.specs:
        raise EmptySelection(f"suite {suite.name}: the selection has no run (check --variants and the suite's tasks); no board written")
    loaded = store.load(s.key for s in the_plan.specs)
    out = Path(out_dir)
    table = out / f"{suite.name}.csv"
    before = finished_on_board(table)
    after = sum(1 for key in {s.key for s in the_plan.specs} if key in loaded.records)
    if after < before and not force:
        raise BoardWouldShrink(
            f"not overwriting {table}: it has {before} finished records, the records in {store.root} give only {after} "
            f"of {len(the_plan.specs)} planned runs. Point --runs-dir at the store that has them (the committed records: "
            f"--runs-dir leaderboards), merge them in with `attnbench results import`, or pass --force to overwrite")
    for why in loaded.unreadable.values():
        print(f"attnbench: warning: unreadable record in {store.root.parent}: {why}; counted as unreadable on the board", file=sys.stderr)
    board = build_board(suite, the_plan, loaded.records, unreadable=loaded.unreadable, conflicts=loaded.conflicts,
                        executions=loaded.executions)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{suite.name}.md"
    md.write_text(render_markdown(board))
    table.write_text(render_csv(suite, the_plan, loaded.records, loaded.unreadable))
    page = out / f"{suite.name}.html"
    page.write_text(render_html(board))
    return [md, table, page]


def write_claims_board(runs: str | None, out_dir: str | Path = "leaderboards", data_root: str | None = None,
                       claims_file: str | Path = CLAIMS_FILE) -> list[Path]:
    """`attnbench leaderboard --claims`: <out_dir>/claims.md and claims.html from harness/claims.yaml and the
    records in `runs`. Always written, with or without records: a claim without records says "not run yet"
    or "not run here", so a fresh clone regenerates the page byte for byte."""
    board = build_claims_board(load_claims(claims_file), runs, data_root)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, page = out / "claims.md", out / "claims.html"
    md.write_text(render_claims_markdown(board))
    page.write_text(render_claims_html(board))
    return [md, page]
