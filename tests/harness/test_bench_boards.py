"""Where `bench` writes its board (issue 38): beside the records it is made of, never over the committed boards, and
what it prints about the committed records of the same keys."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

from harness.bench import compare_with_committed, run_suite
from harness.plan.spec import make_spec
from harness.results.record import Record
from harness.results.store import RecordStore

REPO = Path(__file__).resolve().parents[2]


def committed_boards_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted((REPO / "leaderboards").glob("*.*")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def test_bench_writes_its_board_into_the_runs_folder_and_leaves_the_committed_boards_alone(tmp_path, shared_data, capsys):
    suite = tmp_path / "quick.yaml"  # named like the committed suite on purpose: its board must still not land there
    suite.write_text("name: quick\ntasks: [cora]\nvariants: [softmax]\nseeds: 1\nparams: {max_epochs: 2}\n")
    before = committed_boards_digest()
    outcome = run_suite(str(suite), workers=1, runs=str(tmp_path / "runs"), data_root=str(shared_data))
    assert outcome["failed_in_selection"] == 0
    assert (tmp_path / "runs" / "leaderboard" / "quick.md").is_file()
    assert committed_boards_digest() == before


def record(variant, seed, value, label):
    spec = make_spec("cora", variant, seed, {"max_epochs": 2})
    return Record.ok(spec, {"test/acc": {"value": value, "higher_is_better": True}}, hardware={"label": label})


def test_bench_reports_per_variant_how_its_records_compare_with_the_committed_ones(tmp_path):
    mine, committed = RecordStore(tmp_path / "runs"), RecordStore(tmp_path / "committed")
    for r in (record("softmax", 0, 0.8, "CPU Intel"), record("softmax", 1, 0.81, "CPU Intel"), record("align-ct", 0, 0.824, "CPU Intel")):
        mine.write(r)
    for r in (record("softmax", 0, 0.8, "CPU AMD"), record("softmax", 1, 0.81, "CPU AMD"), record("align-ct", 0, 0.823, "CPU AMD")):
        committed.write(r)
    the_plan = SimpleNamespace(specs=[make_spec("cora", v, s, {"max_epochs": 2}) for v, s in (("softmax", 0), ("softmax", 1), ("align-ct", 0), ("gmm", 0))])
    text = compare_with_committed(the_plan, mine, tmp_path / "committed")
    lines = {line.split()[0]: line for line in text.splitlines()[1:-1]}
    assert set(lines) == {"softmax", "align-ct"}  # gmm has no record on either side
    assert "identical in 2 of 2, max |Δ| 0 points" in lines["softmax"]
    assert "identical in 0 of 1, max |Δ| 0.1 points" in lines["align-ct"]
    assert "yours: CPU Intel; committed: CPU AMD" in lines["align-ct"]
    assert compare_with_committed(the_plan, committed, tmp_path / "committed") is None  # the committed store against itself
    assert compare_with_committed(the_plan, mine, tmp_path / "nowhere") is None
    assert not (tmp_path / "nowhere").exists()


def test_a_bench_of_one_row_keeps_the_other_recorded_rows_on_its_board(tmp_path, shared_data):
    """Re-running a board's rows a few at a time into one runs folder: the second bench (--variants fenchel) finishes
    with a board of every recorded row. It used to build a board of its selection alone, which write_boards refused
    (fewer finished records than the board there), so a bench whose every run had finished exited with an error."""
    suite = tmp_path / "rows.yaml"
    suite.write_text("name: rows\ntasks: [cora]\nvariants: [softmax, gmm, fenchel, sparsemax]\nseeds: 1\nparams: {max_epochs: 2}\n")
    runs = str(tmp_path / "runs")
    run_suite(str(suite), workers=1, runs=runs, data_root=str(shared_data), variant_filter="softmax,gmm")
    outcome = run_suite(str(suite), workers=1, runs=runs, data_root=str(shared_data), variant_filter="fenchel")
    assert outcome["ran"] == 1 and outcome["failed_in_selection"] == 0
    board = (tmp_path / "runs" / "leaderboard" / "rows.md").read_text()
    assert all(f"`{row}`" in board for row in ("softmax", "gmm", "fenchel"))
    assert "`sparsemax`" not in board  # a row that has no record in this folder is not planned onto the board
