"""Runs that survive preemption (issue 40): a real process is killed (SIGKILL) at a chosen epoch, a re-run resumes
from its checkpoint, and the record equals the unkilled run's bit for bit, but for timings and `execution`.

Each test runs Cora for a few epochs in subprocesses (tests/harness/preemption_child.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
CHILD = Path(__file__).with_name("preemption_child.py")

pytestmark = pytest.mark.skipif(not (DATA / "planetoid").exists(), reason="needs the Planetoid data under ../shared/data")

TIMINGS = {"wall_time_s", "fit_time_s", "fit_time_this_process_s", "time_per_epoch_s", "peak_memory_mb", "started", "finished", "execution"}


def child(runs: Path, variant: str, seeds: str, epochs: int, *extra: str, kill_after: int | None = None, every: str = "1"):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EVERY": every, "PYTHONHASHSEED": "0"}
    env.pop("KILL_AFTER", None)
    if kill_after is not None:
        env["KILL_AFTER"] = str(kill_after)
    done = subprocess.run([sys.executable, str(CHILD), str(runs), str(DATA), variant, seeds, str(epochs), *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if kill_after is not None:
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    else:
        assert done.returncode == 0, done.stderr[-2000:]
    return done


def records(runs: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((runs / "records").glob("*.json"))}


def comparable(record: dict) -> dict:
    """A record without what differs between two executions of one run on one machine: timings and `execution`."""
    out = {k: v for k, v in record.items() if k not in TIMINGS}
    if out.get("history"):
        out["history"] = {k: v for k, v in out["history"].items() if k != "epoch_s"}
    return out


def assert_same(resumed: Path, unkilled: Path) -> None:
    a, b = records(resumed), records(unkilled)
    assert sorted(a) == sorted(b) and a
    for key in a:
        assert a[key]["status"] == "ok", a[key].get("error")
        assert comparable(a[key]) == comparable(b[key]), key


def checkpoint_files(runs: Path) -> list[str]:
    return sorted(p.name for p in (runs / "checkpoints").glob("*")) if (runs / "checkpoints").is_dir() else []


@pytest.fixture(scope="module")
def softmax_lone(tmp_path_factory):
    """An unkilled lone softmax run of 20 epochs, and the same run killed after epoch 7's checkpoint."""
    base = tmp_path_factory.mktemp("lone")
    child(base / "unkilled", "softmax", "0", 20)
    child(base / "killed", "softmax", "0", 20, kill_after=7)
    return base


def test_a_killed_lone_run_resumes_to_the_unkilled_record_and_its_checkpoint_goes(softmax_lone, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(softmax_lone / "killed", runs)
    assert records(runs) == {} and len(checkpoint_files(runs)) == 1
    out = child(runs, "softmax", "0", 20)
    assert_same(runs, softmax_lone / "unkilled")
    (record,) = records(runs).values()
    assert record["execution"] == {"resumed_from_epoch": 7, "resumes": 1} and record["epochs"] == 20
    assert checkpoint_files(runs) == []  # the record is written: nothing resumes from it now
    assert "discarding" not in out.stderr


def test_a_corrupt_checkpoint_is_discarded_with_its_message_and_the_run_starts_afresh(softmax_lone, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(softmax_lone / "killed", runs)
    (path,) = (runs / "checkpoints").glob("*.pt")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a torn copy
    out = child(runs, "softmax", "0", 20)
    lines = [line for line in out.stderr.splitlines() if "discarding checkpoint" in line]
    assert len(lines) == 1 and "does not load" in lines[0] and "starts afresh" in lines[0], out.stderr[-2000:]
    assert_same(runs, softmax_lone / "unkilled")
    (record,) = records(runs).values()
    assert "resumed_from_epoch" not in (record.get("execution") or {})


def test_a_checkpoint_from_another_torch_version_is_discarded_and_the_run_starts_afresh(softmax_lone, tmp_path):
    import torch

    runs = tmp_path / "runs"
    shutil.copytree(softmax_lone / "killed", runs)
    (path,) = (runs / "checkpoints").glob("*.pt")
    ckpt = torch.load(path, weights_only=True)
    ckpt["attnbench"]["code"]["torch"] = "1.13.0"
    torch.save(ckpt, path)
    out = child(runs, "softmax", "0", 20)
    lines = [line for line in out.stderr.splitlines() if "discarding checkpoint" in line]
    assert len(lines) == 1 and "another code version (torch 1.13.0 ->" in lines[0], out.stderr[-2000:]
    assert_same(runs, softmax_lone / "unkilled")
    assert "resumed_from_epoch" not in (next(iter(records(runs).values())).get("execution") or {})


def test_a_killed_stochastic_run_resumes_bit_for_bit(tmp_path):
    """bam-weibull draws its weights from the run's noise stream: the stream's position is in the checkpoint."""
    child(tmp_path / "unkilled", "bam-weibull", "0", 20)
    child(tmp_path / "runs", "bam-weibull", "0", 20, kill_after=11)
    child(tmp_path / "runs", "bam-weibull", "0", 20)
    assert_same(tmp_path / "runs", tmp_path / "unkilled")
    assert next(iter(records(tmp_path / "runs").values()))["execution"]["resumed_from_epoch"] == 11
    assert checkpoint_files(tmp_path / "runs") == []


def test_a_killed_seed_batch_resumes_every_unfinished_seed_bit_for_bit(tmp_path):
    """Three seeds, GAT's rule with patience 3 so that seeds stop at their own epochs: killed after epoch 12, when
    some have stopped (records written) and the others train on; the re-run resumes those from the checkpoint."""
    child(tmp_path / "unkilled", "softmax", "0,1,2", 16, "3")
    child(tmp_path / "runs", "softmax", "0,1,2", 16, "3", kill_after=6, every="3")
    written = records(tmp_path / "runs")
    out = child(tmp_path / "runs", "softmax", "0,1,2", 16, "3") if len(written) == 0 else None
    if out is None:  # some seeds finished before the kill: the re-run (as bench) runs only the others
        unfinished = [s for s in ("0", "1", "2") if not any(r["spec"]["seed"] == int(s) for r in written.values())]
        out = child(tmp_path / "runs", "softmax", ",".join(unfinished), 16, "3")
    resumed = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]  # (and the line naming the checkpoint)
    assert resumed and all(r["execution"]["resumed_from_epoch"] == 6 for r in resumed)
    assert_same(tmp_path / "runs", tmp_path / "unkilled")
    assert checkpoint_files(tmp_path / "runs") == []


TUNE_CHILD = """
import os, sys
sys.path.insert(0, os.getcwd())
from harness.studies.tune import tune
tune("cora", "softmax", trials=3, params={"max_epochs": 40}, storage=f"sqlite:///{sys.argv[1]}/optuna.db", tune_optimizer=True,
     runs=sys.argv[1], data_root=sys.argv[2])
"""


def test_a_killed_tune_resumes_its_study_and_retries_the_trial_in_flight_once(tmp_path):
    """kill -9 of the one `tune` process while a trial runs: the re-run (well within the heartbeats' grace period)
    fails that trial at once (its process is gone), retries it once with its parameters, and finishes the budget:
    3 finished trials, the killed one FAIL, never counted twice."""
    import time

    import optuna
    from optuna.trial import TrialState

    from harness.studies.tune import OWNER_ATTR

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-c", TUNE_CHILD, str(tmp_path), str(DATA)]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = tmp_path / "optuna.db"
    # A trial is 40 epochs (seconds) and the poll is 50 ms: with 4 epochs a trial lasted 0.4 s, so a 0.5 s poll could
    # miss trial 1 running altogether and wait out the deadline ("trial 1 never started" on two CIs).
    deadline = time.time() + 300
    storage = None
    try:
        while time.time() < deadline:  # poll the storage for trial 1 running (trial 0, the defaults, finished)
            time.sleep(0.05)
            if proc.poll() is not None:
                pytest.fail(f"the tune process ended (exit {proc.returncode}) before trial 1 was seen running")
            if db.exists():
                try:
                    storage = storage or optuna.storages.RDBStorage(f"sqlite:///{db}")
                    (summary,) = optuna.get_all_study_summaries(storage)
                    trials = storage.get_all_trials(summary._study_id, deepcopy=False)
                except Exception:  # noqa: BLE001 - the schema is being made
                    continue
                # trial 1 running with its configuration drawn (a kill before its first suggestion would leave no
                # parameters to retry with, and its retry would draw a configuration of its own)
                if any(t.number == 1 and t.state == TrialState.RUNNING and OWNER_ATTR in t.user_attrs and t.params for t in trials):
                    break
        else:
            pytest.fail("trial 1 never started")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trial 1 was running in process" in done.stdout + done.stderr
    trials = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}").trials
    states = [t.state for t in trials]
    assert states.count(TrialState.COMPLETE) + states.count(TrialState.PRUNED) == 3
    assert trials[1].state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == trials[1].number]
    assert len(retries) == 1 and retries[0].params == trials[1].params and retries[0].state == TrialState.COMPLETE
    assert states.count(TrialState.RUNNING) == 0
    # the restarted sampler draws new configurations: the killed trial's is trained once more (its retry), not twice
    assert sum(1 for t in trials if t.params == trials[1].params and t.state == TrialState.COMPLETE) == 1


def test_orphaned_checkpoints_are_listed_and_pruned_and_never_exported(tmp_path):
    """No training: checkpoint files beside records. A checkpoint whose every key has a finished record, or one older
    than --older-than days, is orphaned; prune deletes those and nothing else; an export carries records only."""
    import time

    from harness.plan.spec import make_spec
    from harness.results import checkpoints as cp
    from harness.results.exchange import export_records
    from harness.results.record import Record
    from harness.results.store import RecordStore

    specs = [make_spec("cora", "softmax", seed, {"max_epochs": 2}) for seed in range(4)]
    store = RecordStore(tmp_path)
    store.write(Record.ok(specs[0], {"test/acc": {"value": 0.5, "higher_is_better": True}}))
    store.write(Record.ok(specs[1], {"test/acc": {"value": 0.5, "higher_is_better": True}}))
    cps = cp.Checkpoints(tmp_path, cp.Interval(1, 0))
    cps.root.mkdir(parents=True)
    cps.run_path(specs[0].key).write_bytes(b"x")  # its record is written: orphaned
    cps.run_path(specs[2].key).write_bytes(b"x")  # unfinished: kept
    cps.announce_batch([specs[0].key, specs[1].key])
    cps.batch_path([specs[0].key, specs[1].key]).write_bytes(b"x")  # every seed recorded: orphaned
    cps.announce_batch([specs[1].key, specs[3].key])
    cps.batch_path([specs[1].key, specs[3].key]).write_bytes(b"x")  # seed 3 unfinished: kept
    assert sorted(cps.resumable([s.key for s in specs[2:]])) == sorted([specs[2].key, specs[3].key])
    assert sorted(e.path.name for e in cp.orphans(tmp_path)) == sorted([f"{specs[0].key}.pt", cps.batch_path([specs[0].key, specs[1].key]).name])
    listing = cp.describe(tmp_path)
    assert "4 checkpoint(s)" in listing and "2 orphaned; --prune deletes them" in listing
    assert len(cp.prune(tmp_path)) == 2
    assert sorted(p.name for p in cps.root.glob("*.pt")) == sorted([f"{specs[2].key}.pt", cps.batch_path([specs[1].key, specs[3].key]).name])
    old = cps.run_path(specs[2].key)
    os.utime(old, (time.time() - 10 * 86400,) * 2)
    assert [e.path for e in cp.prune(tmp_path, older_than_days=7)] == [old]
    exported = export_records(store, tmp_path / "export.jsonl")
    assert "checkpoint" not in (tmp_path / "export.jsonl").read_text() and exported is not None


def test_a_finished_run_removes_the_temp_file_a_kill_inside_a_save_left_but_not_a_live_save(tmp_path):
    """A writer killed between its temp file and the rename leaves `.<key>.<host>~<pid>.*.tmp`; the resumed run's
    `remove_run` deletes it once the record is written (CI hit it: a kill at every-epoch saves). A live writer's temp
    (another process still saving), and one from another host, stay."""
    from harness.results import checkpoints as cp
    from harness.results.store import temp_owner

    cps = cp.Checkpoints(tmp_path, cp.Interval(1, 0))
    cps.root.mkdir(parents=True)
    host = temp_owner().split("~")[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        key = "k" * 16
        cps.run_path(key).write_bytes(b"x")
        killed = cps.root / f".{key}.{host}~{dead.pid}.abc123.tmp"
        saving = cps.root / f".{key}.{host}~{live.pid}.def456.tmp"
        elsewhere = cps.root / f".{key}.otherhost~{dead.pid}.ghi789.tmp"
        other_key = cps.root / f".{'j' * 16}.{host}~{dead.pid}.jkl012.tmp"
        for path in (killed, saving, elsewhere, other_key):
            path.write_bytes(b"half")
        cps.remove_run(key)
        assert sorted(p.name for p in cps.root.iterdir()) == sorted(p.name for p in (saving, elsewhere, other_key))
        assert [p.name for p in cp.prune(tmp_path)] == [] and not other_key.exists() and saving.exists() and elsewhere.exists()
    finally:
        live.kill()
        live.wait()
    # the name write_atomically gives its temp file is the one these read: this live writer's is not gone
    seen = []
    from harness.results.store import write_atomically, writer_gone
    write_atomically(tmp_path / "x.json", lambda fh: seen.extend(p.name for p in tmp_path.glob(f".x.{host}~{os.getpid()}.*.tmp")))
    assert len(seen) == 1 and not writer_gone(tmp_path / seen[0])


def test_the_interval_reads_epochs_minutes_both_or_off():
    from harness.results.checkpoints import DEFAULT_EVERY_EPOCHS, Interval

    assert Interval.parse("25") == Interval(25, 0) and Interval.parse("10m") == Interval(0, 10.0)
    assert Interval.parse("25,10m") == Interval(25, 10.0) and Interval.parse("0").off
    assert Interval().epochs == DEFAULT_EVERY_EPOCHS and not Interval().off
    assert Interval(25, 10).due(25, 0) and Interval(25, 10).due(1, 600) and not Interval(25, 10).due(24, 599)
    with pytest.raises(ValueError):
        Interval.parse("often")


def test_a_checkpoint_from_another_number_of_ddp_processes_is_not_trusted():
    """The key is the same on 1 or N processes, the data each rank saw is not: such a checkpoint is stale."""
    from harness.results import checkpoints as cp

    meta = cp.metadata("run", ["k"], "c", 4, 0, world_size=2)
    assert cp.stale(meta, keys=["k"], commit="c", kind="run", world_size=2) is None
    assert cp.stale(meta, keys=["k"], commit="c", kind="run") == "was written by a run on 2 process(es), not 1"
    older = {k: v for k, v in cp.metadata("run", ["k"], "c", 4, 0).items() if k != "world_size"}  # before world sizes were kept
    assert cp.stale(older, keys=["k"], commit="c", kind="run") is None
    assert "process(es)" in cp.stale(older, keys=["k"], commit="c", kind="run", world_size=2)


class _Killed(BaseException):
    """Ends a seed batch where a kill would, right after a save: not an Exception, so the batch records nothing."""


def test_a_finished_batch_leaves_no_checkpoint_of_a_chain_of_resumes(tmp_path, monkeypatch):
    """Found by tests/preemption/kill_bench.py: a batch of 3 saved (A) and was killed; seed 0 stopped and was recorded; the
    2 seeds left resumed from A, saved their own (B) and were killed; the next batch of them resumed from B and, once
    recorded, removed B but left A, although each of A's seeds now has its record. In process: the kills are an
    exception out of the save, as a SIGKILL leaves the same files."""
    from harness.plan.spec import make_spec
    from harness.results import checkpoints as cp
    from harness.results.record import Record
    from harness.results.store import RecordStore
    from harness.run.seed_batch import execute_batch

    specs = [make_spec("cora", "softmax", seed, {"max_epochs": 3, "patience": 3}) for seed in range(3)]
    store = RecordStore(tmp_path)
    cps = cp.Checkpoints(tmp_path, cp.Interval(1, 0))
    save = cp.save_atomically

    def killed_after(epoch):
        def saving(payload, target):
            save(payload, target)
            if payload["attnbench"]["epoch"] == epoch:
                raise _Killed

        return saving

    def batch(seeds):
        return execute_batch([specs[s] for s in seeds], data_root=str(DATA), commit="test", on_record=store.write, checkpoints=cps)

    monkeypatch.setattr(cp, "save_atomically", killed_after(1))
    with pytest.raises(_Killed):
        batch([0, 1, 2])
    a = cps.batch_path([s.key for s in specs])
    store.write(Record.ok(specs[0], {"test/acc": {"value": 0.5, "higher_is_better": True}}))  # seed 0 stopped
    monkeypatch.setattr(cp, "save_atomically", killed_after(2))
    with pytest.raises(_Killed):
        batch([1, 2])
    b = cps.batch_path([specs[1].key, specs[2].key])
    assert a.is_file() and b.is_file()
    monkeypatch.setattr(cp, "save_atomically", save)
    records = batch([1, 2])
    assert [r.execution["resumed_from_epoch"] for r in records] == [2, 2]  # from B, the newer
    assert sorted(p.name for p in cps.root.iterdir()) == [], "every seed of A and B is recorded: neither resumes anything now"


def test_data_parallel_ranks_save_when_rank_zero_says_and_resume_their_own_generators(tmp_path):
    """Saving is a collective: a rank whose own clock found the interval due while rank 0's did not (the minutes of
    "25,10m" straddled by two ranks) must not save alone, or it would wait in the save's barrier while the others train.
    And each rank resumes its own generators, which its shard of the data moved on by its own draws."""
    from types import SimpleNamespace

    import torch

    from harness.results.checkpoints import Interval
    from harness.run.callbacks import ResumableRun, global_rng_state, set_global_rng_state

    saved = []
    rank_zero_says = SimpleNamespace(broadcast=lambda due, src=0: False)
    trainer = SimpleNamespace(world_size=2, global_rank=1, should_stop=False, max_epochs=10, current_epoch=3, strategy=rank_zero_says,
                              save_checkpoint=saved.append)
    run = ResumableRun(str(tmp_path / "k.pt"), Interval(0, 1e-9), lambda epoch, resumes: {})  # due on this rank's clock
    run.on_train_epoch_end(trainer, None)
    assert saved == []
    before = global_rng_state()
    try:
        torch.manual_seed(0)
        zero = {"rng": global_rng_state(), "noise": {}}
        torch.manual_seed(1)
        one = {"rng": global_rng_state(), "noise": {}}
        run.load_state_dict({"epoch": 4, "resumes": 0, **zero, "ranks": [zero, one]})
        torch.manual_seed(2)
        run.on_train_start(trainer, torch.nn.Linear(1, 1))
        assert torch.equal(torch.get_rng_state(), one["rng"]["torch"])
    finally:
        set_global_rng_state(before)
