"""Provenance: a record from a work tree with uncommitted changes says so, and nothing committed is dirty."""

import json
from pathlib import Path

import pytest

from harness.results.record import Record, Status
from harness.results.store import RecordStore

REPO = Path(__file__).resolve().parents[2]
BOARDS = REPO / "leaderboards"


def test_a_dirty_commit_marks_the_record_dirty_and_the_file_says_so(tmp_path):
    dirty = Record(key="k1", status=Status.OK, metrics={}, commit="0123456789ab-dirty")
    clean = Record(key="k2", status=Status.OK, metrics={}, commit="0123456789ab")
    assert dirty.dirty and not clean.dirty
    store = RecordStore(tmp_path)
    on_disk = json.loads(store.write(dirty).read_text())
    assert on_disk["dirty"] is True and on_disk["commit"].endswith("-dirty")
    assert "dirty" not in json.loads(store.write(clean).read_text())  # clean records read exactly as before
    assert store.read("k1") == dirty and store.read("k2") == clean


def test_no_committed_record_is_dirty():
    records = [Record.from_dict(json.loads(path.read_text())) for path in sorted((BOARDS / "records").glob("*.json"))]
    assert records, "leaderboards/records/ holds the committed records"
    assert [r.key for r in records if r.dirty or not r.commit or r.commit == "unknown"] == []
    assert not list((BOARDS / "records").glob("conflicts/*.json")), "committed records have unresolved conflicts"


@pytest.mark.parametrize("board", sorted(BOARDS.glob("*.md")) + sorted(BOARDS.glob("*.csv")) + sorted(BOARDS.glob("*.html")),
                         ids=lambda path: path.name)
def test_no_committed_board_names_a_dirty_commit(board):
    assert "-dirty" not in board.read_text()


SUITE_NAMES = {path.stem for path in (BOARDS.parent / "harness" / "suites").glob("*.yaml")}
"""Only a CSV named after a suite is a board of runs; leaderboards/ also holds pages such as gpu-cost.csv (counts)."""


@pytest.mark.parametrize("table", sorted(p for p in BOARDS.glob("*.csv") if p.stem in SUITE_NAMES), ids=lambda path: path.name)
def test_every_run_a_committed_board_shows_has_its_record_committed(table):
    """A board is data: `make leaderboard` on a fresh clone must rebuild it from leaderboards/records/ (a board
    whose records were lost cannot be, and is not committed)."""
    import csv

    with table.open() as fh:
        keys = [row["key"] for row in csv.DictReader(fh) if row.get("status") in ("ok", "failed", "pruned")]
    assert keys, f"{table.name} lists no runs"
    assert [key for key in keys if not (BOARDS / "records" / f"{key}.json").exists()] == []
