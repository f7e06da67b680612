import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results.store import RecordStore, UnreadableRecord

REPO = Path(__file__).resolve().parents[2]


def test_records_are_written_atomically_and_tmp_files_are_never_read(tmp_path):
    store = RecordStore(tmp_path)
    store.write({"key": "abc", "status": "ok", "metrics": {}})
    # a half-written temp file left by a killed writer
    (store.root / ".def.123.tmp").write_text('{"key": "def", "stat')
    assert [r["key"] for r in store] == ["abc"]
    assert store.finished("abc") and not store.finished("def")
    assert store.load(["abc", "def"]).records.keys() == {"abc"} and not store.load(["def"]).unreadable


def test_writing_a_key_s_record_removes_the_temp_file_a_killed_writer_of_it_left(tmp_path):
    """A process SIGKILLed between its temp file and the rename leaves `.<key>.<host>~<pid>.*.tmp`; the key's next
    write removes it. A live writer's temp and other keys' temps stay."""
    from harness.results.store import temp_owner

    store = RecordStore(tmp_path)
    host = temp_owner().split("~")[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        killed = store.root / f".k.{host}~{dead.pid}.a1b2c3d4.tmp"
        saving = store.root / f".k.{host}~{live.pid}.e5f6g7h8.tmp"
        other = store.root / f".j.{host}~{dead.pid}.i9j0k1l2.tmp"
        for path in (killed, saving, other):
            path.write_text('{"key": "k", "stat')
        store.write({"key": "k", "status": "ok"})
        assert not killed.exists() and saving.exists() and other.exists()
        assert [r["key"] for r in store] == ["k"]
    finally:
        live.kill()
        live.wait()


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


# Durability: a record appears only whole, through a rename of a synced temporary file in the same folder.


def test_a_write_syncs_the_temp_file_then_renames_it_then_syncs_the_folder(tmp_path, monkeypatch):
    store = RecordStore(tmp_path)
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file", fd))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", (Path(src), Path(dst))))
        # the renamed file is complete and synced already
        assert json.loads(Path(src).read_text()) == {"key": "abc", "status": "ok"}
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store.write({"key": "abc", "status": "ok"})
    assert [name for name, _ in events] == ["fsync file", "replace", "fsync dir"]
    src, dst = events[1][1]
    assert dst == store.path("abc") and src.parent == store.root and src != dst
    assert src.suffix != ".json"  # a half-written temp file never looks like a record
    assert not src.exists() and sorted(p.name for p in store.root.iterdir()) == ["abc.json"]


def test_a_failing_rename_leaves_the_old_record_intact_and_no_temp_file(tmp_path, monkeypatch):
    store = RecordStore(tmp_path)
    store.write({"key": "k", "status": "failed", "error": "first"})
    before = store.path("k").read_bytes()

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        store.write({"key": "k", "status": "ok", "metrics": {"test/acc": {"value": 0.9, "higher_is_better": True}}})
    assert store.path("k").read_bytes() == before
    assert sorted(p.name for p in store.root.iterdir()) == ["k.json"]
    assert store.read("k")["error"] == "first"


def test_an_interrupt_before_the_rename_leaves_no_record_and_no_temp_file(tmp_path, monkeypatch):
    store = RecordStore(tmp_path)

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.write({"key": "new", "status": "ok"})
    assert list(store.root.iterdir()) == []
    assert not store.finished("new") and store.read("new") is None


KILLED_BEFORE_RENAME = """
import os, signal, sys
from harness.results.store import RecordStore
store = RecordStore(sys.argv[1])
store.write({"key": "old", "status": "ok"})
os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)  # the machine dies between write and rename
store.write({"key": "new", "status": "ok"})
store.write({"key": "old", "status": "failed", "error": "never lands"})
"""


def test_a_process_killed_between_write_and_rename_leaves_no_finished_record(tmp_path):
    done = subprocess.run([sys.executable, "-c", KILLED_BEFORE_RENAME, str(tmp_path)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    store = RecordStore(tmp_path)
    leftovers = [p for p in store.root.iterdir() if p.name != "old.json"]
    assert len(leftovers) == 1 and leftovers[0].suffix != ".json"  # the killed writer's temp file, complete but not renamed
    assert not store.finished("new") and store.read("new") is None
    assert [r.key for r in store] == ["old"] and store.read("old")["status"] == "ok"
    loaded = store.load(["old", "new"])
    assert list(loaded.records) == ["old"] and loaded.unreadable == {}


@pytest.mark.parametrize("content", [b'{"key": "bad", "stat', b"", b'{"key": "bad", "status": "exploded"}', b"\xff\xfe", b"[1, 2]"])
def test_a_corrupt_record_is_not_finished_and_is_reported_not_dropped(tmp_path, content, capsys):
    store = RecordStore(tmp_path)
    store.write({"key": "good", "status": "ok"})
    store.path("bad").write_bytes(content)
    with pytest.raises(UnreadableRecord) as caught:
        store.read_checked("bad")
    assert caught.value.path == store.path("bad")
    loaded = store.load(["good", "bad"])
    assert list(loaded.records) == ["good"] and list(loaded.unreadable) == ["bad"]
    assert loaded.unreadable["bad"].startswith("records/bad.json: ")
    capsys.readouterr()
    assert not store.finished("bad")  # so the next bench runs it again, and says why
    assert [r.key for r in store] == ["good"]
    err = capsys.readouterr().err
    assert err.count("unreadable record") == 2 and err.count(str(store.path("bad"))) == 2


# The file format and names are part of the store's contract: committed records must stay byte-stable (they
# are diffed and merged in git), and a conflicting copy is named by a digest that must not change between
# versions, or importing the same copy twice would store it twice.


def test_a_record_file_is_sorted_json_indented_by_one_and_paths_become_strings(tmp_path, monkeypatch):
    import hashlib

    from harness.results.record import Record
    from harness.results.store import record_digest

    store = RecordStore(tmp_path)
    names = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (names.append(Path(src).name), real_replace(src, dst)))
    record = Record.from_dict({"status": "ok", "key": "k1", "metrics": {"b": {"value": 1.0}, "a": {"value": 2.0}},
                               "spec": {"extra": {"tuned_from": tmp_path / "p.yaml"}}})
    store.write(record)
    expected = json.dumps(record.to_dict(), indent=1, sort_keys=True, default=str)
    assert store.path("k1").read_text() == expected and f'"tuned_from": "{tmp_path / "p.yaml"}"' in expected
    assert len(names) == 1 and names[0].startswith(".k1.") and names[0].endswith(".tmp")
    compact = json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
    assert record_digest(record) == hashlib.sha256(compact.encode()).hexdigest()[:12]
    reordered = Record.from_dict({**record.to_dict(), "metrics": {"a": {"value": 2.0}, "b": {"value": 1.0}}})
    assert record_digest(reordered) == record_digest(record)


def test_unreadable_records_are_named_with_their_cause_whatever_their_order(tmp_path):
    store = RecordStore(tmp_path)
    store.write({"key": "good", "status": "ok"})
    store.path("bad").write_text("{")
    with pytest.raises(UnreadableRecord) as caught:
        store.read_checked("bad")
    assert str(caught.value).startswith(f"{store.path('bad')}: JSONDecodeError: ")
    loaded = store.load(["bad", "good"])
    assert list(loaded.records) == ["good"]
    assert loaded.unreadable["bad"].startswith("records/bad.json: JSONDecodeError: Expecting property name")
    assert store.read_many(["bad", "good", "missing"]) == {"good": store.read("good")}


def test_import_adds_new_keys_recognises_the_same_record_and_never_overwrites(tmp_path):
    from harness.results.record import Record
    from harness.results.store import record_digest

    store = RecordStore(tmp_path)
    first = Record.from_dict({"key": "k", "status": "ok", "commit": "aaa", "spec": {"seed": 0}})
    other = Record.from_dict({"key": "k", "status": "ok", "commit": "aaa", "spec": {"seed": 1}})  # another spec under the key
    assert store.import_record(first) == "added" and store.read("k") == first
    assert store.import_record(first) == "same"
    assert store.import_record(other) == "conflict" and store.read("k") == first
    assert [p.name for p in store.conflicting_copies("k")] == [f"k.{record_digest(other)}.json"]
    loaded = store.load(["k", "missing"])
    assert loaded.records == {"k": first} and loaded.conflicts == {"k": [f"records/conflicts/k.{record_digest(other)}.json"]}
    assert store.load(["missing"]).conflicts == {}
    # a corrupt file under a key is kept for repair, and the arriving record kept beside it
    store.path("c").write_text("{")
    arriving = Record.from_dict({"key": "c", "status": "ok"})
    assert store.import_record(arriving) == "conflict"
    assert store.path("c").read_text() == "{" and len(store.conflicting_copies("c")) == 1


def test_the_same_experiment_run_elsewhere_is_another_execution_and_the_earliest_finished_is_shown(tmp_path):
    from harness.results.record import Record

    store = RecordStore(tmp_path)
    spec = {"seed": 0, "label": "softmax"}
    mine = Record.from_dict({"key": "k", "status": "ok", "spec": spec, "commit": "aaa", "finished": "2026-02-01T00:00:00+00:00"})
    # another machine, an earlier finish, another row label (a tuned row whose best parameters are the defaults)
    theirs = Record.from_dict({"key": "k", "status": "ok", "spec": {**spec, "label": "softmax (tuned)"}, "commit": "bbb",
                               "finished": "2026-01-01T00:00:00+00:00", "hardware": {"label": "1x NVIDIA H100"}})
    store.write(mine)
    assert store.import_record(theirs) == "execution" and store.import_record(theirs) == "same"
    assert store.read("k") == mine and store.finished("k") and store.other_executions("k") == [theirs]
    loaded = store.load(["k"])
    assert loaded.records == {"k": theirs} and loaded.executions == {"k": [mine, theirs]} and not loaded.conflicts
    # a died copy is no outcome: against a finished one it is a conflict, as is a failed one
    died = Record.from_dict({"key": "k", "status": "failed", "spec": spec, "retryable": True})
    failed = Record.from_dict({"key": "k", "status": "failed", "spec": spec, "error": "RuntimeError: x"})
    assert store.import_record(died) == "conflict" and store.import_record(failed) == "conflict"
    assert len(store.conflicting_copies("k")) == 2 and len(store.other_executions("k")) == 1


def test_a_record_is_a_typed_value_that_reads_like_its_stored_mapping():
    import re

    from harness.plan.spec import make_spec
    from harness.results.record import SUMMARY_FIELDS, Record, Status, utc_now

    spec = make_spec("cora", "softmax", 0)
    ok = Record.ok(spec, {"test/acc": {"value": 0.8, "higher_is_better": True}}, epochs=3, commit="abc",
                   hardware={"label": "CPU x"})
    assert ok.to_dict() == {"key": spec.key, "status": "ok", "spec": spec.to_dict(), "epochs": 3, "commit": "abc",
                            "metrics": {"test/acc": {"value": 0.8, "higher_is_better": True}}, "hardware": {"label": "CPU x"}}
    assert ok["status"] == "ok" and ok.get("error") is None and len(ok) == 7 and set(ok) == set(ok.to_dict())
    assert hash(ok) == hash(spec.key) and ok != ok.to_dict() and ok == Record.from_dict(ok.to_dict())
    assert ok.hardware_label == "CPU x" and Record(key="k", status="ok").hardware_label is None
    assert ok.summary() == {name: ok.get(name) for name in SUMMARY_FIELDS} and list(ok.summary()) == list(SUMMARY_FIELDS)
    failed = Record.failed(spec, "RuntimeError: x", wall_time_s=1.5)
    assert (failed.status, failed.error, failed.metrics, failed.wall_time_s, failed.retryable) == (Status.FAILED, "RuntimeError: x", {}, 1.5, False)
    assert failed.spec == spec.to_dict() and failed.key == spec.key  # a failed run still says what ran
    assert "retryable" not in failed.to_dict() and "dirty" not in failed.to_dict()
    died = Record.died("k", {"seed": 1}, "WorkerDied: gone", commit="abc-dirty", wall_time_s=2.0)
    assert died.to_dict()["retryable"] is True and died.dirty and died.to_dict()["dirty"] is True and died.wall_time_s == 2.0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", died.finished) and re.fullmatch(r".*T\d\d:\d\d:\d\d\+00:00", utc_now())
    with_unknown = Record.from_dict({"key": "u", "status": "pruned", "future_field": [1, 2]})
    assert with_unknown.status is Status.PRUNED and with_unknown.unknown == {"future_field": [1, 2]}
    assert with_unknown.to_dict() == {"future_field": [1, 2], "key": "u", "status": "pruned"}
    # even a stored field that happens to be called "unknown" is kept as one, not taken for the bag of them
    named_unknown = {"key": "u", "status": "ok", "unknown": [3]}
    assert Record.from_dict(named_unknown).to_dict() == named_unknown
    with pytest.raises(TypeError, match="^a record is a JSON object, got list$"):
        Record.from_dict([1, 2])


@pytest.mark.parametrize("data, message", [({"key": "", "status": "ok"}, "non-empty string key, got ''"),
                                           ({"key": 5, "status": "ok"}, "non-empty string key, got 5"),
                                           ({"key": "k", "status": "done"}, "record k: unknown status 'done'; one of ok, failed, pruned$")])
def test_a_record_without_a_key_or_with_an_unknown_status_is_refused(data, message):
    from harness.results.record import Record

    with pytest.raises(ValueError, match=message):
        Record.from_dict(data)


def test_the_runs_folder_is_explicit_else_attnbench_runs_else_runs_and_records_live_in_records(tmp_path, monkeypatch):
    from harness.results.store import runs_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATTNBENCH_RUNS", raising=False)
    assert runs_dir() == tmp_path / "runs"
    monkeypatch.setenv("ATTNBENCH_RUNS", str(tmp_path / "env"))
    assert runs_dir() == tmp_path / "env" and runs_dir(tmp_path / "x") == tmp_path / "x"
    assert RecordStore().root == tmp_path / "env" / "records" and (tmp_path / "env" / "records").is_dir()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert runs_dir("~/r") == tmp_path / "r"


def test_a_store_whose_runs_folder_was_removed_meanwhile_still_writes_its_records(tmp_path):
    """A bench that outlives a cleaned-up runs folder keeps the runs it finishes: the write makes the
    folders again."""
    import shutil

    from harness.results.record import Record

    store = RecordStore(tmp_path / "runs")
    shutil.rmtree(tmp_path / "runs")
    assert store.write({"key": "k", "status": "ok"}) == tmp_path / "runs" / "records" / "k.json"
    assert store.read("k") == Record.from_dict({"key": "k", "status": "ok"})
