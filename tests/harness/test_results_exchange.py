"""Results from many machines feed one board: export a store as JSON lines, import (merge) into another,
identical records deduplicated, different ones under a known key kept as conflicts and shown on the board."""

import json

from harness.cli import main
from harness.results.record import Record
from harness.results.store import RecordStore

from .test_board_safety import board_files, store_with_records


def test_export_is_sorted_compact_json_lines(tmp_path):
    _, the_plan, store = store_with_records(tmp_path)
    out = tmp_path / "all.jsonl"
    assert main(["results", "export", str(out), "--runs-dir", str(tmp_path / "runs")]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 6
    keys = [json.loads(line)["key"] for line in lines]
    assert keys == sorted(s.key for s in the_plan.specs)
    assert all(line == json.dumps(json.loads(line), sort_keys=True, separators=(",", ":")) for line in lines)
    assert Record.from_dict(json.loads(lines[0])) == store.read(keys[0])


def test_shards_exported_and_imported_give_the_same_board(tmp_path):
    suite, the_plan, store = store_with_records(tmp_path)
    whole = tmp_path / "whole"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(whole)]) == 0

    # two machines, each with half the runs
    halves = [RecordStore(tmp_path / f"machine{i}") for i in (0, 1)]
    for position, spec in enumerate(the_plan.specs):
        halves[position % 2].write(store.read(spec.key))
    for i, half in enumerate(halves):
        assert main(["results", "export", str(tmp_path / f"m{i}.jsonl"), "--runs-dir", str(half.root.parent)]) == 0
    merged = tmp_path / "merged"
    assert main(["results", "import", str(tmp_path / "m0.jsonl"), "--into", str(merged)]) == 0
    assert main(["results", "import", str(tmp_path / "m1.jsonl"), "--into", str(merged)]) == 0
    assert main(["results", "import", str(tmp_path / "m1.jsonl"), "--into", str(merged)]) == 0  # again: deduplicated
    assert sorted(p.name for p in (merged / "records").glob("*.json")) == sorted(f"{s.key}.json" for s in the_plan.specs)
    assert not (merged / "records" / "conflicts").exists()

    board = tmp_path / "board"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(merged), "--out", str(board)]) == 0
    assert board_files(board) == board_files(whole)


def test_a_runs_folder_imports_like_its_export(tmp_path, capsys):
    _, the_plan, _ = store_with_records(tmp_path)
    assert main(["results", "import", str(tmp_path / "runs"), "--into", str(tmp_path / "other")]) == 0
    assert "6 added, 0 already there, 0 conflict(s)" in capsys.readouterr().out
    assert len(list((tmp_path / "other" / "records").glob("*.json"))) == len(the_plan.specs)


def test_a_conflicting_record_is_kept_beside_and_shown_on_the_board(tmp_path, capsys):
    suite, the_plan, store = store_with_records(tmp_path)
    spec = next(s for s in the_plan.specs if s.display == "gmm" and s.seed == 0)
    original = store.read(spec.key)
    other = original.to_dict()
    other["metrics"] = {**other["metrics"], "test/acc": {"value": 0.123, "higher_is_better": True}}
    incoming = tmp_path / "other.jsonl"
    incoming.write_text(json.dumps(other) + "\n")

    capsys.readouterr()
    assert main(["results", "import", str(incoming), "--into", str(tmp_path / "runs")]) == 0
    assert "0 added, 0 already there, 1 conflict(s)" in capsys.readouterr().out
    assert store.read(spec.key) == original  # never overwritten
    copies = store.conflicting_copies(spec.key)
    assert len(copies) == 1 and Record.from_dict(json.loads(copies[0].read_text())) == Record.from_dict(other)
    assert main(["results", "import", str(incoming), "--into", str(tmp_path / "runs")]) == 0
    assert len(store.conflicting_copies(spec.key)) == 1  # the same conflicting copy is stored once
    assert len(list(store.root.glob("*.json"))) == 6  # still one file per key

    out = tmp_path / "boards"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    md = (out / "safety.md").read_text()
    assert "(ok 6, failed 0, pruned 0, missing 0, conflict 1)" in md
    assert f"Conflict: run {spec.key} has a different record in records/conflicts/{copies[0].name}" in md
    assert "1 conflict" in (out / "safety.html").read_text()

    # the conflict travels: an export carries both copies, and importing it elsewhere shows the same conflict
    exported = tmp_path / "with-conflict.jsonl"
    assert main(["results", "export", str(exported), "--runs-dir", str(tmp_path / "runs")]) == 0
    assert [json.loads(line)["key"] for line in exported.read_text().splitlines()].count(spec.key) == 2
    assert main(["results", "import", str(exported), "--into", str(tmp_path / "elsewhere")]) == 0
    assert RecordStore(tmp_path / "elsewhere").read(spec.key) == original


def test_an_unreadable_line_is_named_and_the_rest_imported(tmp_path, capsys):
    _, the_plan, _ = store_with_records(tmp_path)
    exported = tmp_path / "all.jsonl"
    assert main(["results", "export", str(exported), "--runs-dir", str(tmp_path / "runs")]) == 0
    lines = exported.read_text().splitlines()
    exported.write_text("\n".join([*lines[:-1], lines[-1][:40]]) + "\n")
    capsys.readouterr()
    assert main(["results", "import", str(exported), "--into", str(tmp_path / "other")]) == 1
    captured = capsys.readouterr()
    assert "5 added" in captured.out and f"{exported}:6: JSONDecodeError" in captured.err
