import json

from harness.results.store import RecordStore


def test_records_are_written_atomically_and_tmp_files_are_never_read(tmp_path):
    store = RecordStore(tmp_path)
    store.write({"key": "abc", "status": "ok", "metrics": {}})
    # a half-written temp file left by a killed writer
    (store.root / ".def.123.tmp").write_text('{"key": "def", "stat')
    assert [r["key"] for r in store] == ["abc"]
    assert store.finished("abc") and not store.finished("def")
    assert not list(store.root.glob("*.tmp"))[0].name.endswith(".json")


def test_failed_records_count_as_finished_unless_retrying(tmp_path):
    store = RecordStore(tmp_path)
    store.write({"key": "f", "status": "failed", "error": "x"})
    store.write({"key": "w", "status": "failed", "error": "WorkerDied", "retryable": True})
    assert store.finished("f") and not store.finished("f", retry_failed=True)
    assert not store.finished("w")


def test_overwrite_replaces_whole_record(tmp_path):
    store = RecordStore(tmp_path)
    store.write({"key": "k", "status": "failed", "error": "x" * 10000})
    store.write({"key": "k", "status": "ok"})
    assert json.loads(store.path("k").read_text()) == {"key": "k", "status": "ok"}
