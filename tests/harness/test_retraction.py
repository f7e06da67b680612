"""Retracting executions that a fix showed wrong (issue 38): the store's rule when results change under an unchanged key."""

from __future__ import annotations

import pytest

from harness.plan.spec import make_spec
from harness.results.record import Record
from harness.results.store import RecordStore


def execution(value, finished, label="CPU AMD EPYC (1 thread/run)"):
    spec = make_spec("cora", "align-ct", 0, {"max_epochs": 2})
    return Record.ok(spec, {"test/acc": {"value": value, "higher_is_better": True}}, finished=finished, hardware={"label": label})


def test_a_retracted_record_leaves_the_board_and_the_key_runs_again(tmp_path):
    store = RecordStore(tmp_path)
    old = execution(0.823, "2026-11-24T10:00:00+00:00")
    store.write(old)
    assert store.finished(old.key)
    assert store.retract(old.key, "made by the seed batch before 1742054") is None
    assert not store.finished(old.key)  # bench runs it again
    (entry,) = store.retracted()
    assert entry["reason"] == "made by the seed batch before 1742054" and Record.from_dict(entry["record"]) == old
    assert store.import_record(old) == "retracted"  # an old export cannot bring it back
    assert not store.finished(old.key)
    fresh = execution(0.824, "2026-11-26T10:00:00+00:00", "CPU Intel Xeon (1 thread/run)")
    assert store.import_record(fresh) == "added"
    assert store.load([old.key]).records[old.key] == fresh


def test_the_earliest_remaining_execution_takes_a_retracted_records_place(tmp_path):
    """Without the retraction the store's "earliest finished" rule would keep showing the wrong, older number."""
    store = RecordStore(tmp_path)
    old, later, latest = (execution(v, f"2026-11-2{d}T10:00:00+00:00") for v, d in ((0.823, 4), (0.824, 6), (0.825, 7)))
    store.write(old)
    assert store.import_record(later) == "execution" and store.import_record(latest) == "execution"
    assert store.load([old.key]).records[old.key] == old
    assert store.retract(old.key, "defect fixed in 1742054") == later
    loaded = store.load([old.key])
    assert loaded.records[old.key] == later and loaded.executions[old.key] == [later, latest]
    assert store.import_record(old) == "retracted"


def test_retracting_a_key_without_a_record_says_so(tmp_path):
    with pytest.raises(KeyError, match="no record"):
        RecordStore(tmp_path).retract("0" * 20, "nothing there")


def test_the_command_retracts_a_suites_seed_batched_records_made_at_a_commit(tmp_path, capsys):
    from harness.cli import main

    store = RecordStore(tmp_path)
    keep, wrong = execution(0.82, "2026-11-24T10:00:00+00:00"), execution(0.83, "2026-11-24T11:00:00+00:00")
    spec = make_spec("cora", "softmax", 1, {"max_epochs": 2}, extra={"suite": "quick"})
    wrong = Record.ok(spec, {"test/acc": {"value": 0.83, "higher_is_better": True}}, commit="9be3fb955697",
                      execution={"seed_batch": 3, "seeds": [0, 1, 2]})
    store.write(keep)
    store.write(wrong)
    argv = ["results", "retract", "--runs-dir", str(tmp_path), "--because", "seed batch before 1742054"]
    assert main([*argv, "--made-at", "9be3fb9", "--suite", "quick", "--seed-batched", "--dry-run"]) == 0
    assert f"would retract {wrong.key}" in capsys.readouterr().out and store.finished(wrong.key)
    assert main([*argv, "--made-at", "9be3fb9", "--suite", "quick", "--seed-batched"]) == 0
    assert not store.finished(wrong.key) and store.finished(keep.key)
    assert main([*argv, "--made-at", "9be3fb9"]) == 2  # nothing left to select: refused, not silently done
    assert "matches the selection" in capsys.readouterr().err
    assert main([*argv, "0" * 20]) == 2
    assert main(["results", "import", str(tmp_path), "--into", str(tmp_path / "other")]) == 0
    assert RecordStore(tmp_path / "other").read(wrong.key) is None  # a retracted record is never exported
