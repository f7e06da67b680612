"""Results from many machines feed one board: export a store as JSON lines, import (merge) into another,
identical records deduplicated, another finished execution of a key kept beside it (one ranking, a
reproducibility line), genuine conflicts (another spec, finished vs failed) kept as conflicts and shown on the
board; `results compare` says how far two stores agree."""

import json

import pytest

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
    assert "6 added, 0 already there, 0 other execution(s), 0 conflict(s)" in capsys.readouterr().out
    assert len(list((tmp_path / "other" / "records").glob("*.json"))) == len(the_plan.specs)


def test_a_conflicting_record_is_kept_beside_and_shown_on_the_board(tmp_path, capsys):
    suite, the_plan, store = store_with_records(tmp_path)
    spec = next(s for s in the_plan.specs if s.display == "gmm" and s.seed == 0)
    original = store.read(spec.key)
    other = original.to_dict()
    # a different spec under the same key (say, a planner bug): not the same experiment, so a genuine conflict
    other["spec"] = {**other["spec"], "params": {**other["spec"].get("params", {}), "max_epochs": 7}}
    other["metrics"] = {**other["metrics"], "test/acc": {"value": 0.123, "higher_is_better": True}}
    incoming = tmp_path / "other.jsonl"
    incoming.write_text(json.dumps(other) + "\n")

    capsys.readouterr()
    assert main(["results", "import", str(incoming), "--into", str(tmp_path / "runs")]) == 0
    assert "0 added, 0 already there, 0 other execution(s), 1 conflict(s)" in capsys.readouterr().out
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


def _other_execution(record: Record, **changes) -> dict:
    """The same experiment run elsewhere: another machine, another time, maybe another value."""
    data = record.to_dict()
    data["hardware"] = {**data["hardware"], "threads": 2, "label": "CPU AMD EPYC (2 threads/run)"}
    data["time_per_epoch_s"] = 0.5
    return {**data, **changes}


def test_a_key_run_on_two_machines_is_two_executions_not_a_conflict(tmp_path, capsys):
    suite, the_plan, store = store_with_records(tmp_path)
    specs = sorted(the_plan.specs, key=lambda s: s.key)
    # an earlier finished copy with another value (is shown), a later identical one, a later different one
    earlier, same, later = specs[0], specs[1], specs[2]
    copies = [_other_execution(store.read(earlier.key), finished="2026-01-01T09:00:00+00:00",
                               metrics={"test/acc": {"value": 0.5, "higher_is_better": True}}),
              _other_execution(store.read(same.key), finished="2026-01-03T09:00:00+00:00"),
              _other_execution(store.read(later.key), finished="2026-01-03T09:00:00+00:00",
                               metrics={"test/acc": {"value": store.read(later.key).metrics["test/acc"]["value"] + 0.002, "higher_is_better": True}})]
    incoming = tmp_path / "cluster.jsonl"
    incoming.write_text("".join(json.dumps(c) + "\n" for c in copies))
    originals = {s.key: store.read(s.key) for s in specs}
    capsys.readouterr()
    assert main(["results", "import", str(incoming), "--into", str(tmp_path / "runs")]) == 0
    assert "0 added, 0 already there, 3 other execution(s), 0 conflict(s)" in capsys.readouterr().out
    assert main(["results", "import", str(incoming), "--into", str(tmp_path / "runs")]) == 0
    assert "0 added, 3 already there, 0 other execution(s)" in capsys.readouterr().out  # stored once
    # the store keeps both, the original where resume looks for it
    assert {s.key: store.read(s.key) for s in specs} == originals
    assert all(store.finished(s.key) for s in specs)
    assert len(list(store.root.glob("*.json"))) == 6 and len(list(store.executions_dir.glob("*.json"))) == 3
    assert not store.conflicts_dir.exists()
    loaded = store.load(s.key for s in specs)
    assert sorted(loaded.executions) == sorted(c["key"] for c in copies) and not loaded.conflicts
    assert loaded.records[earlier.key].metrics["test/acc"]["value"] == 0.5  # the earliest finished is shown
    assert loaded.records[later.key] == originals[later.key]

    out = tmp_path / "boards"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    md = (out / "safety.md").read_text()
    assert "conflict" not in md
    delta = abs(0.5 - originals[earlier.key].metrics["test/acc"]["value"]) * 100
    assert (f"- Reproducibility: 3 keys ran on 2 executions (CPU AMD EPYC (1 thread/run): 3, CPU AMD EPYC (2 threads/run): 3; "
            "the board shows the earliest finished): "
            f"test/acc identical in 1 of 3, max |Δ| {delta:.3g} points") in md
    # the rows whose executions differ are named, so a reader sees which variants do not reproduce bit for bit
    differing = sorted({earlier.display, later.display})
    counts = {name: sum(1 for s in (earlier, same, later) if s.display == name) for name in {s.display for s in (earlier, same, later)}}
    named = ", ".join(f"`{name}` {sum(1 for s in (earlier, later) if s.display == name)} of {counts[name]}" for name in differing)
    assert (f"Keys whose executions differ, by row (across hardware classes: last-bit rounding that these rows' training "
            f"amplifies): {named}") in md
    assert "Reproducibility: 3 keys" in (out / "safety.html").read_text()
    # the other executions' machine is a hardware class of its own: listed, with its cost apart from the original's
    assert "- Hardware: CPU AMD EPYC (1 thread/run): 6 records; CPU AMD EPYC (2 threads/run): 3 records" in md
    cost_lines = [line.split(" | ") for line in md.splitlines() if line.startswith("| `") and " | CPU AMD EPYC (2 threads/run) | " in line]
    assert sum(int(cells[2]) for cells in cost_lines) == 3

    # the copies travel with an export, and a store made from it shows the same board
    exported = tmp_path / "all.jsonl"
    assert main(["results", "export", str(exported), "--runs-dir", str(tmp_path / "runs")]) == 0
    assert len(exported.read_text().splitlines()) == 9
    assert "exported 6 record(s), 3 other execution(s) of their keys" in capsys.readouterr().out
    assert main(["results", "import", str(exported), "--into", str(tmp_path / "elsewhere")]) == 0
    again = tmp_path / "again"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "elsewhere"), "--out", str(again)]) == 0
    assert board_files(again) == board_files(out)
    # and so do they when the runs folder itself is imported
    assert main(["results", "import", str(tmp_path / "runs"), "--into", str(tmp_path / "folder-copy")]) == 0
    from_folder = tmp_path / "from-folder"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "folder-copy"), "--out", str(from_folder)]) == 0
    assert board_files(from_folder) == board_files(out)


def test_a_finished_copy_against_a_failed_one_is_still_a_conflict(tmp_path, capsys):
    suite, the_plan, store = store_with_records(tmp_path)
    spec = the_plan.specs[0]
    failed = _other_execution(store.read(spec.key), status="failed", error="RuntimeError: CUDA error", metrics={})
    incoming = tmp_path / "failed.jsonl"
    incoming.write_text(json.dumps(failed) + "\n")
    capsys.readouterr()
    assert main(["results", "import", str(incoming), "--into", str(tmp_path / "runs")]) == 0
    assert "0 other execution(s), 1 conflict(s)" in capsys.readouterr().out
    assert len(store.conflicting_copies(spec.key)) == 1 and not store.executions_dir.exists()
    out = tmp_path / "boards"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    md = (out / "safety.md").read_text()
    assert "conflict 1)" in md and "Reproducibility" not in md


def test_import_takes_several_sources_and_job_array_folders(tmp_path, capsys):
    _, the_plan, store = store_with_records(tmp_path)
    specs = sorted(the_plan.specs, key=lambda s: s.key)
    # a job array's output: one runs dir per array task below one folder, and a loose export file
    array = tmp_path / "array-output"
    for position, spec in enumerate(specs[:4]):
        RecordStore(array / f"task{position % 2}").write(store.read(spec.key))
    loose = RecordStore(tmp_path / "laptop")
    for spec in specs[4:]:
        loose.write(store.read(spec.key))
    assert main(["results", "export", str(tmp_path / "laptop.jsonl"), "--runs-dir", str(tmp_path / "laptop")]) == 0
    capsys.readouterr()
    assert main(["results", "import", str(array), str(tmp_path / "laptop.jsonl"), "--into", str(tmp_path / "merged")]) == 0
    assert "6 added, 0 already there" in capsys.readouterr().out
    merged = RecordStore(tmp_path / "merged")
    assert {s.key: merged.read(s.key) for s in specs} == {s.key: store.read(s.key) for s in specs}
    # a source that is not there: named, and nothing imported from the others
    assert main(["results", "import", str(array), str(tmp_path / "typo"), "--into", str(tmp_path / "none")]) == 2
    assert "typo does not exist" in capsys.readouterr().err
    assert not list((tmp_path / "none" / "records").glob("*.json"))


def test_compare_counts_shared_keys_that_agree_and_the_largest_difference(tmp_path, capsys):
    _, the_plan, store = store_with_records(tmp_path)
    specs = sorted(the_plan.specs, key=lambda s: s.key)
    other = RecordStore(tmp_path / "fresh")
    for spec in specs[:5]:  # the fresh clone ran 5 of the 6 runs
        other.write(store.read(spec.key))
    capsys.readouterr()
    assert main(["results", "compare", str(tmp_path / "runs"), str(tmp_path / "fresh")]) == 0
    out = capsys.readouterr().out
    assert "5 key(s) finished in both; 1 only in" in out
    assert [line.split() for line in out.splitlines() if line.startswith("cora ") and "test/acc" in line] == [["cora", "test/acc", "5", "5", "0"]]

    changed = store.read(specs[1].key).to_dict()
    changed["metrics"] = {**changed["metrics"], "test/acc": {"value": changed["metrics"]["test/acc"]["value"] + 0.25, "higher_is_better": True}}
    other.write(changed)
    assert main(["results", "export", str(tmp_path / "fresh.jsonl"), "--runs-dir", str(tmp_path / "fresh")]) == 0
    capsys.readouterr()
    assert main(["results", "compare", str(tmp_path / "runs"), str(tmp_path / "fresh.jsonl")]) == 3
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("cora ") and "test/acc" in line]
    assert rows[0][:4] == ["cora", "test/acc", "5", "4"] and float(rows[0][4]) == pytest.approx(0.25)
    assert main(["results", "compare", str(tmp_path / "runs"), str(tmp_path / "empty")]) == 2  # not there: an error
    (tmp_path / "empty" / "records").mkdir(parents=True)
    assert main(["results", "compare", str(tmp_path / "runs"), str(tmp_path / "empty")]) == 4
