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

from typing import TYPE_CHECKING

from harness.report.board import Board, as_board, build_board
from harness.report.claims import CLAIMS_FILE, build_claims_board, load_claims, render_claims_markdown
from harness.report.csv_table import render_csv
from harness.report.html_page import render_claims_html, render_html
from harness.report.markdown import render_markdown
from harness.report.stats import MIN_SEEDS_TO_RANK
from harness.results.record import Status
from harness.results.store import RecordStore, write_text_atomically

if TYPE_CHECKING:
    from harness.plan.planner import Plan

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


class WrittenBoards(list):
    """The paths written (a list, as callers have always had it) and the unreadable record files the boards
    counted, so that the CLI can exit 1 for them as `results export` does, after writing."""

    def __init__(self, paths=(), unreadable: dict[str, str] | None = None):
        super().__init__(paths)
        self.unreadable = dict(unreadable or {})


class NothingRecorded(ValueError):
    """The store holds no record of the suite asked for: most often a wrong --runs-dir (exit 2), not an empty board."""


def write_leaderboard(suite_name: str, *, runs: str | None = None, out_dir: str | Path = "leaderboards", data_root: str | None = None,
                      tuned_params_dir: str | Path | None = None, force: bool = False, skip_unrecorded: bool = False,
                      allow_empty: bool = False, snapshot: bool = True) -> list[Path]:
    """`attnbench leaderboard`: plan the suite (from its snapshot where one matches, see `suite_plan`) and write its boards from the records in `runs`. With
    `tuned_params_dir`, tuned rows ("<variant> (tuned)") are listed next to the defaults. A suite of which
    `runs` holds no record at all is refused (NothingRecorded), left as it is with `skip_unrecorded`
    (returns []), or written all missing with `allow_empty`."""
    the_plan = suite_plan(suite_name, data_root, tuned_params_dir, snapshot=snapshot)
    store = RecordStore(runs)
    if not allow_empty and not any(store.path(s.key).exists() for s in the_plan.specs):
        if skip_unrecorded:
            return []
        raise NothingRecorded(
            f"{store.root} holds no record of suite {the_plan.suite.name}'s {len(the_plan.specs)} planned runs; no board written. "
            f"Point --runs-dir at the folder its runs went to (the committed records: --runs-dir leaderboards), leave out "
            f"--suite to render whatever that folder holds, or pass --allow-empty to write a board of missing runs")
    return write_boards(the_plan, store, out_dir, force=force)


def suite_plan(suite_name: str, data_root: str | None, tuned_params_dir: str | Path | None, *, snapshot: bool = True):
    """The suite's plan, read from its snapshot (harness/plan/catalogue.py) when the sources, the suite file,
    the tuned parameters and the data root are those it was made from, so that a board renders without
    importing torch; else planned and its snapshot written. `snapshot=False` (plugins loaded, whose sources
    the snapshot's key does not cover): always planned."""
    from harness.plan import catalogue
    from harness.plan.suite import suite_path

    path = catalogue.plan_snapshot_file(suite_path(suite_name), data_root, tuned_params_dir) if snapshot else None
    found = catalogue.load_plan(path) if path else None
    if found is not None:
        return found
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    the_plan = plan(load_suite(suite_name), data_root, tuned_dir=tuned_params_dir)
    if path:
        catalogue.save_plan(the_plan, path)
    return the_plan


RECORDS_BOARD = "leaderboard"
"""The name of the board of whatever a runs folder holds (no suite): <out>/leaderboard.{md,csv,html}."""


def write_records_board(*, runs: str | None = None, out_dir: str | Path | None = None, data_root: str | None = None,
                        force: bool = False) -> list[Path]:
    """`attnbench leaderboard --runs-dir DIR` without --suite: every record DIR holds, one table per task and
    parameter set (harness/report/records_plan.py), written to `out_dir` (default: DIR itself)."""
    from harness.report.records_plan import plan_from_records

    store = RecordStore(runs)
    the_plan, unreadable = plan_from_records(store, RECORDS_BOARD, data_root)
    if not the_plan.specs and not unreadable:
        raise NothingRecorded(f"{store.root} holds no record; no board written. Point --runs-dir at a folder with records/ "
                              f"(the committed records: --runs-dir leaderboards)")
    return write_boards(the_plan, store, out_dir if out_dir is not None else store.root.parent, force=force,
                        unplaced=unreadable)


def write_boards(the_plan: Plan, store: RecordStore, out_dir: str | Path = "leaderboards", *, force: bool = False,
                 unplaced: dict[str, str] | None = None) -> list[Path]:
    """The boards of a plan already made (`bench` hands over the plan it ran) from the store's records.
    `unplaced`: unreadable record files that belong to no planned run (the records board cannot know what
    they were); the board counts them as unreadable all the same."""
    suite = the_plan.suite
    if not the_plan.specs and not unplaced:
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
    for why in (unplaced or {}).values():
        print(f"attnbench: warning: unreadable record in {store.root.parent}: {why}; counted as unreadable on the board", file=sys.stderr)
    board = build_board(suite, the_plan, loaded.records, unreadable=loaded.unreadable, conflicts=loaded.conflicts,
                        executions=loaded.executions)
    if unplaced:
        board = board.replace(status_counts={**board.status_counts, "unreadable": board.status_counts.get("unreadable", 0) + len(unplaced)},
                              unreadable=dict(sorted({**(board.unreadable or {}), **unplaced}.items())))
    warn_unranked(board)
    out.mkdir(parents=True, exist_ok=True)
    # each file atomically (harness/results/store.py): a kill mid-write leaves the previous board or the new one,
    # never a truncated one (whose table would also undercount finished_on_board's guard)
    md = write_text_atomically(render_markdown(board), out / f"{suite.name}.md")
    write_text_atomically(render_csv(board), table)
    page = write_text_atomically(render_html(board), out / f"{suite.name}.html")
    return WrittenBoards([md, table, page], {**loaded.unreadable, **(unplaced or {})})


def warn_unranked(board: Board) -> None:
    """A table none of whose rows has MIN_SEEDS_TO_RANK finished seeds shows numbers but no ranks and no significance
    marks, which is easy to miss on a board of one's own few runs: say so on stderr, suggesting seeds that have no
    record in the table yet (suggesting one that has would re-run nothing)."""
    board = as_board(board)
    for group in board.groups:
        for table in group.tasks:
            counts = [len(row.metrics[table.primary]["values"]) for row in table.rows]
            if any(counts) and max(counts) < MIN_SEEDS_TO_RANK:
                used = {seed for row in table.rows for metric in row.metrics.values() for seed in metric.get("seeds", ())}
                free = [seed for seed in range(len(used) + MIN_SEEDS_TO_RANK) if seed not in used][: MIN_SEEDS_TO_RANK - max(counts)]
                print(f"attnbench: warning: {board.suite}: table {table.task} ({group.hardware}) has at most {max(counts)} "
                      f"finished seed(s) per row, fewer than the {MIN_SEEDS_TO_RANK} a rank needs: no ranks and no significance "
                      f"marks; run more seeds (e.g. {', '.join(f'--seed {seed}' for seed in free)}, or --seeds "
                      f"{','.join(map(str, free))})", file=sys.stderr)


def write_claims_board(runs: str | None, out_dir: str | Path = "leaderboards", data_root: str | None = None,
                       claims_file: str | Path = CLAIMS_FILE) -> list[Path]:
    """`attnbench leaderboard --claims`: <out_dir>/claims.md and claims.html from harness/claims.yaml and the
    records in `runs`. Always written, with or without records: a claim without records says "not run yet"
    or "not run here", so a fresh clone regenerates the page byte for byte."""
    claims = load_claims(claims_file)
    board = build_claims_board(claims, runs, data_root)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dose = None
    if claims.dose_response is not None:
        from harness.report.dose_response import PAGE, dose_board_from_store, finding_sentence, render_dose_markdown

        dose = dose_board_from_store(claims.dose_response, runs, data_root, claims.mechanism_test)
        board = board.replace(dose_finding=finding_sentence(dose, lead=False))
    md = write_text_atomically(render_claims_markdown(board), out / "claims.md")
    page = write_text_atomically(render_claims_html(board), out / "claims.html")
    written = [md, page]
    if dose is not None:
        written.append(write_text_atomically(render_dose_markdown(dose), out / PAGE))
    return written
