"""Record files written before the typed Record existed (tests/fixtures/records, by `attnbench run`, a dead
local worker and a dead job-array shard at commit 5a34b97) still load through the store, keep every field,
and are judged finished or retryable as they were."""

import json
import shutil
from pathlib import Path

import pytest

from harness.results.record import Record, Status
from harness.results.store import RecordStore

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "records"
FILES = sorted(FIXTURES.glob("*.json"))


@pytest.fixture
def store(tmp_path) -> RecordStore:
    store = RecordStore(tmp_path / "runs")
    for path in FILES:
        shutil.copy(path, store.root / path.name)
    return store


def test_fixtures_cover_every_kind_of_record():
    kinds = {(json.loads(p.read_text())["status"], json.loads(p.read_text()).get("error", "") or "") for p in FILES}
    assert {status for status, _ in kinds} == {"ok", "failed"}
    assert any(error.startswith("WorkerDied") for _, error in kinds)
    assert any(error.startswith("ArrayTaskDied") for _, error in kinds)
    assert any(error.startswith("DivergedError") for _, error in kinds)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_old_record_loads_with_every_field(store, path):
    raw = json.loads(path.read_text())
    record = store.read(path.stem)
    assert isinstance(record, Record) and record.key == raw["key"] == path.stem
    assert record.status is Status(raw["status"])
    # Every non-null field comes back as it was; nulls are simply absent now.
    assert record.to_dict() == {k: v for k, v in raw.items() if v is not None}
    assert record.spec["task"] == raw["spec"]["task"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_old_record_is_finished_exactly_as_before(store, path):
    raw = json.loads(path.read_text())
    # The rule the store applied before the typed record (harness/records.py at 5a34b97).
    before = raw.get("status") in ("ok", "failed", "pruned") and not raw.get("retryable")
    assert store.finished(path.stem) == before
    assert store.finished(path.stem, retry_failed=True) == (before and raw["status"] != "failed")


def test_rewriting_an_old_record_keeps_its_content(store, tmp_path):
    other = RecordStore(tmp_path / "copy")
    for record in store:
        other.write(record)
        assert other.read(record.key) == record


def test_ok_record_metrics_keep_their_direction(store):
    ok = [r for r in store if r.status is Status.OK]
    assert ok and all(set(m) == {"value", "higher_is_better"} for r in ok for m in r.metrics.values())
    assert all(r.summary()["metrics"] == r.metrics for r in ok)


def test_a_record_with_an_unknown_status_is_refused_on_write_and_skipped_on_read(tmp_path, capsys):
    store = RecordStore(tmp_path)
    with pytest.raises(ValueError, match="unknown status 'done'"):
        store.write({"key": "k", "status": "done"})
    (store.root / "k.json").write_text(json.dumps({"key": "k", "status": "done"}))
    assert store.read("k") is None and "ignoring unreadable record" in capsys.readouterr().err


def test_died_record_is_failed_and_retryable():
    record = Record.died("abc", {"task": "cora"}, "WorkerDied: gone", commit="c0ffee", wall_time_s=1.5)
    assert record.status is Status.FAILED and record.retryable and not record.is_final()
    assert record.to_dict()["retryable"] is True and record["error"] == "WorkerDied: gone"


def test_old_records_have_no_history_and_a_new_one_keeps_its_curves_on_one_line(store, tmp_path):
    assert all(record.history is None and "history" not in record.to_dict() for record in store)
    old = next(iter(store))
    curves = {"epoch": [1, 2, 3], "train/loss": [1.9, 1.2, None], "val/acc": [0.31, 0.52, 0.6], "epoch_s": [0.05, 0.04, 0.04]}
    new = Record.from_dict({**old.to_dict(), "history": curves})
    other = RecordStore(tmp_path / "new")
    path = other.write(new)
    assert other.read(new.key) == new and other.read(new.key).history == curves
    text = path.read_text()
    assert '"train/loss": [1.9,1.2,null]' in text and '"epoch": [1,2,3]' in text
