"""The local worker pool when a worker dies: the run it held is recorded failed and retryable, a record the run
wrote just before the death is kept, the pool replaces the worker and finishes the rest, and the store says
which keys the next bench (with or without --retry-failed) runs again.

In-process and fast: workers are forked with a stand-in RunWorker (the real one trains a model), so the
executor's own bookkeeping is what is tested; test_bench.py checks the same through the real command."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import threading

import pytest

from harness.plan.spec import make_spec
from harness.results.record import Record, Status
from harness.results.store import RecordStore
from harness.run import worker_pool
from harness.run.job_array import Shard, record_dead_shard
from harness.run.worker_pool import LocalExecutor, WorkerOptions

SPECS = [make_spec("cora", "softmax", seed, {"max_epochs": 1}) for seed in range(5)]
DIES, FAILS, WRITES_THEN_DIES, OK, EXITS = SPECS


def checkpoints_off(settings):
    """A RunWorker's checkpoint store, turned off: the stand-ins below save nothing mid-run (run_item asks for it)."""
    from harness.results.checkpoints import Checkpoints, Interval

    return Checkpoints(settings.runs_dir, Interval(0, 0))


class StandInWorker:
    """What each seed does: 0 dies by SIGKILL mid-run, 1 fails normally, 2 writes its ok record then dies,
    3 finishes ok, 4 exits with status 3 mid-run."""

    def __init__(self, settings):
        self.store, self.checkpoints = RecordStore(settings.runs_dir), checkpoints_off(settings)

    def run(self, spec_dict):
        seed = spec_dict["seed"]
        if seed == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        if seed == 4:
            os._exit(3)
        spec = next(s for s in SPECS if s.seed == seed)
        if seed == 1:
            record = Record.failed(spec, "RuntimeError: an ordinary failure")
        else:
            record = Record.ok(spec, {"test/acc": {"value": 0.5 + seed / 10, "higher_is_better": True}})
        self.store.write(record)
        if seed == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return record


@pytest.fixture
def executed(tmp_path, monkeypatch):
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("needs the fork start method")
    monkeypatch.setattr(worker_pool, "RunWorker", StandInWorker)
    executor = LocalExecutor(WorkerOptions(runs_dir=str(tmp_path), data_root=None, cache_dir=None, commit="abc123", workers=2), gpus=[])
    executor.ctx = mp.get_context("fork")  # the stand-in is patched in this process: forked workers inherit it
    results = {}
    executor.run(SPECS, lambda spec, summary: results.__setitem__(spec.seed, summary))
    return executor.store, results


def test_every_run_reports_once_even_when_workers_die(executed):
    _, results = executed
    assert sorted(results) == [0, 1, 2, 3, 4]
    assert {seed: str(s["status"]) for seed, s in results.items()} == {0: "failed", 1: "failed", 2: "ok", 3: "ok", 4: "failed"}


def test_a_died_run_is_recorded_failed_and_retryable_with_the_cause(executed):
    store, results = executed
    for spec, how in ((DIES, "killed by signal 9"), (EXITS, "exit code 3")):
        record = store.read(spec.key)
        assert record.status is Status.FAILED and record.retryable is True
        assert record.error.startswith("WorkerDied: ") and how in record.error
        assert record.commit == "abc123" and record.spec == spec.to_dict()
        # timing is not asserted: a day's bound tells the run's own duration from a clock reading (~1.8e9 s), at any speed
        assert 0 <= record.wall_time_s < 86400
        assert results[spec.seed]["error"] == record.error
        assert not store.finished(spec.key) and not store.finished(spec.key, retry_failed=True)


def test_a_record_written_before_the_worker_died_is_kept(executed):
    store, results = executed
    record = store.read(WRITES_THEN_DIES.key)
    assert record.status is Status.OK and not record.retryable and record.metrics["test/acc"]["value"] == 0.7
    assert results[2]["metrics"]["test/acc"]["value"] == 0.7
    assert store.finished(WRITES_THEN_DIES.key)


def test_the_next_bench_reruns_died_runs_and_retry_failed_also_ordinary_failures(executed):
    store, _ = executed
    again = [s.seed for s in SPECS if not store.finished(s.key)]
    assert again == [0, 4]
    assert [s.seed for s in SPECS if not store.finished(s.key, retry_failed=True)] == [0, 1, 4]


def test_is_final_truth_table():
    spec = SPECS[0]
    ok = Record.ok(spec, {})
    failed = Record.failed(spec, "E: x")
    died = Record.died(spec.key, spec.to_dict(), "WorkerDied: x", commit=None)
    pruned = Record(key=spec.key, status="pruned")
    assert [r.is_final() for r in (ok, failed, died, pruned)] == [True, True, False, True]
    assert [r.is_final(retry_failed=True) for r in (ok, failed, died, pruned)] == [True, False, False, True]
    assert died.retryable and died.status is Status.FAILED and died.metrics == {} and died.finished


def test_a_dead_shard_skips_finished_runs_and_blames_the_next(tmp_path):
    store = RecordStore(tmp_path)
    store.write(Record.ok(SPECS[0], {}))
    store.write(Record.failed(SPECS[1], "E: kept"))
    shard = Shard(index=0, specs=tuple(s.to_dict() for s in SPECS[:3]), runs_dir=str(tmp_path), data_root=None, cache_dir=None, commit="c0ffee")
    assert record_dead_shard(shard, "job 9 ended") == SPECS[2].key
    blamed = store.read(SPECS[2].key)
    assert blamed.retryable and blamed.commit == "c0ffee" and blamed.error == "ArrayTaskDied: job 9 ended; this is the run it was on (or about to start)"
    assert store.read(SPECS[1].key).error == "E: kept"
    # every run recorded: nothing to blame
    store.write(Record.ok(SPECS[2], {}))
    assert record_dead_shard(shard, "job 10 ended") is None


def test_gpus_come_from_cuda_visible_devices_and_workers_split_the_threads(monkeypatch, tmp_path):
    from harness.run.threads import threads_per_worker

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2,")
    assert worker_pool.visible_gpus() == ["0", "2"] and worker_pool.default_workers() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert worker_pool.visible_gpus() == [] and worker_pool.default_workers() == max(1, os.cpu_count() or 1)
    options = WorkerOptions(runs_dir=str(tmp_path), data_root="/data", cache_dir="/cache", plugin_files=["p.py"], commit="c", workers=2,
                            env={"A": "1"})
    on_gpu, on_cpu = options.settings("1"), options.settings(None)
    # GPU workers share the host's cores too (#18: 8 GPU workers with every core each oversubscribe a node)
    assert (on_gpu.gpu, on_gpu.threads) == ("1", threads_per_worker(2))
    assert (on_cpu.gpu, on_cpu.threads) == (None, threads_per_worker(2))
    assert (on_cpu.runs_dir, on_cpu.data_root, on_cpu.cache_dir, on_cpu.plugin_files, on_cpu.commit, dict(on_cpu.env)) == (
        str(tmp_path), "/data", "/cache", ("p.py",), "c", {"A": "1"})
    with pytest.raises(ValueError, match="3 workers but only 2 GPU"):
        LocalExecutor(dataclasses.replace(options, workers=3), gpus=["0", "1"])
    assert LocalExecutor(options, gpus=["5", "6", "7"]).slots == ["5", "6"]
    assert LocalExecutor(options, gpus=[]).slots == [None, None]


class ScriptedWorker:
    """serve()'s RunWorker: seed 1's run fails retryably (a device failure), every other run is ok."""

    made: list = []

    def __init__(self, settings):
        ScriptedWorker.made.append(settings)
        self.checkpoints = checkpoints_off(settings)

    def run(self, spec_dict):
        spec = next(s for s in SPECS if s.seed == spec_dict["seed"])
        if spec.seed == 1:
            return Record.died(spec.key, spec.to_dict(), "CUDA error: out of memory", commit=None)
        return Record.ok(spec, {"test/acc": {"value": 0.5, "higher_is_better": True}})


SERVE_WAIT_S = 30
"""How long serve() may take to return here, where each item is a scripted answer: a worker that does not retire,
or does not stop when told, waits on its pipe for ever, and without a bound only pytest's 15-minute timeout ended
the test."""


def serve_bounded(conn, settings, what: str) -> None:
    """serve() in a daemon thread, failing the test, and releasing the thread by closing its pipe, when it has not
    returned within SERVE_WAIT_S."""
    thread = threading.Thread(target=worker_pool.serve, args=(conn, settings), daemon=True)
    thread.start()
    thread.join(SERVE_WAIT_S)
    if thread.is_alive():
        conn.close()  # its recv() ends with an error, in its thread
        pytest.fail(f"serve() did not return within {SERVE_WAIT_S} s: {what}")


def test_a_worker_serves_runs_until_told_to_stop_and_retires_after_a_retryable_failure(monkeypatch, tmp_path):
    """serve() in this process (the pool's tests run it in forked workers, where nothing records which lines ran),
    each call bounded (serve_bounded)."""
    monkeypatch.setattr(worker_pool, "RunWorker", ScriptedWorker)
    settings = WorkerOptions(runs_dir=str(tmp_path), data_root=None, cache_dir=None).settings(None)

    coordinator, worker = mp.Pipe()
    for message in ([SPECS[3].to_dict()], [SPECS[2].to_dict()], None, [SPECS[0].to_dict()]):
        coordinator.send(message)
    ScriptedWorker.made = []
    serve_bounded(worker, settings, "it did not stop at the shutdown message")  # two work items, then the shutdown message
    assert ScriptedWorker.made == [settings]  # one RunWorker per process, with the process's settings
    answers = [coordinator.recv() for _ in range(4)]  # per item: each run's record, then "done"
    assert [(kind, payload["key"], payload["status"]) if kind == "record" else (kind, payload) for kind, payload in answers] == [
        ("record", SPECS[3].key, "ok"), ("done", False), ("record", SPECS[2].key, "ok"), ("done", False)]
    assert not coordinator.poll() and worker.poll()  # nothing more answered; the spec after the shutdown is left unread

    coordinator, worker = mp.Pipe()
    for message in ([SPECS[1].to_dict()], [SPECS[3].to_dict()]):
        coordinator.send(message)
    serve_bounded(worker, settings, "it did not retire after a device failure")  # retires before the next run
    (kind, summary), done = coordinator.recv(), coordinator.recv()
    assert (kind, summary["key"], summary["status"], done) == ("record", SPECS[1].key, "failed", ("done", True))
    assert not coordinator.poll() and worker.poll()

    coordinator, worker = mp.Pipe()
    coordinator.close()
    serve_bounded(worker, settings, "it did not end with its coordinator")  # returns instead of raising EOFError


class GpuStandIn:
    """Seed 0 fails with a device error (its worker retires), seed 1's worker exits cleanly mid-run (exit code 0),
    the rest are ok. Every record names the GPU its worker was given."""

    def __init__(self, settings):
        self.settings, self.store, self.checkpoints = settings, RecordStore(settings.runs_dir), checkpoints_off(settings)

    def run(self, spec_dict):
        spec = next(s for s in SPECS if s.seed == spec_dict["seed"])
        if spec.seed == 0:
            return Record.died(spec.key, spec.to_dict(), f"CUDA error: out of memory on gpu {self.settings.gpu}", commit=None)
        if spec.seed == 1:
            os._exit(0)
        record = Record.ok(spec, {"test/acc": {"value": 0.5, "higher_is_better": True}}, hardware={"gpu": self.settings.gpu})
        self.store.write(record)
        return record


def forked_executor(tmp_path, monkeypatch, gpus, workers, stand_in=GpuStandIn):
    """A pool whose forked workers run `stand_in` (patched here, inherited by fork), and the GPUs it started workers on."""
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("needs the fork start method")
    monkeypatch.setattr(worker_pool, "RunWorker", stand_in)
    executor = LocalExecutor(WorkerOptions(runs_dir=str(tmp_path), data_root=None, cache_dir=None, commit="c", workers=workers), gpus=gpus)
    executor.ctx = mp.get_context("fork")
    started = []
    start = executor._start
    monkeypatch.setattr(executor, "_start", lambda gpu: started.append(gpu) or start(gpu))
    return executor, started


def test_workers_keep_their_gpus_when_replaced_and_a_clean_exit_mid_run_is_a_death(tmp_path, monkeypatch):
    executor, started = forked_executor(tmp_path, monkeypatch, ["5", "6"], workers=2)
    results = {}
    executor.run(SPECS[:4], lambda spec, summary: results.__setitem__(spec.seed, summary))
    # two workers on the two GPUs; seed 0's retires after its device failure and seed 1's exits: each is
    # replaced by a worker on the same GPU
    assert started[:2] == ["5", "6"] and len(started) == 4 and set(started) == {"5", "6"}
    assert sorted(started) == ["5", "5", "6", "6"]
    assert results[0]["status"] == "failed" and "out of memory on gpu 5" in results[0]["error"]
    died = executor.store.read(SPECS[1].key)
    assert died.retryable and "(exit code 0)" in died.error
    for seed in (2, 3):
        assert executor.store.read(SPECS[seed].key).hardware["gpu"] in ("5", "6")


def test_no_more_workers_start_than_there_are_runs(tmp_path, monkeypatch):
    executor, started = forked_executor(tmp_path, monkeypatch, [], workers=2)
    executor.run(SPECS[3:4], lambda spec, summary: None)
    assert started == [None]


def test_cuda_devices_are_counted_when_cuda_visible_devices_is_unset_and_gpu_workers_multiply(monkeypatch):
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(worker_pool, "require_usable_gpus", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert worker_pool.visible_gpus() == ["0", "1", "2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert worker_pool.default_workers(3) == 6 and worker_pool.default_workers(0) == 2


def test_progress_lines_reach_a_piped_log_while_the_bench_still_runs(capsys):
    """bench's output is usually a file or a pipe (nohup, SLURM), where print buffers: each line is flushed."""
    import subprocess
    import sys

    worker_pool.log("[0/9] starting")
    assert capsys.readouterr().out == "[0/9] starting\n"

    code = "from harness.run.worker_pool import log; log('[1/9] ok'); import time; time.sleep(60)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a batch job's Python would run
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env,
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        ready, _, _ = __import__("select").select([process.stdout], [], [], 30)
        assert ready and process.stdout.readline() == "[1/9] ok\n"
    finally:
        process.kill()
        process.wait()


class SlowStandIn:
    """Seed 3 takes 2.5 s; the others finish at once, so the other worker answers while seed 3 still runs."""

    def __init__(self, settings):
        self.store, self.checkpoints = RecordStore(settings.runs_dir), checkpoints_off(settings)

    def run(self, spec_dict):
        import time

        spec = next(s for s in SPECS if s.seed == spec_dict["seed"])
        if spec.seed == 3:
            time.sleep(2.5)  # longer than the 1 s a dead worker is given to finish writing
        record = Record.ok(spec, {"test/acc": {"value": 0.5, "higher_is_better": True}})
        self.store.write(record)
        return record


def test_a_busy_worker_is_not_taken_for_dead_while_another_answers(tmp_path, monkeypatch):
    executor, _ = forked_executor(tmp_path, monkeypatch, [], workers=2, stand_in=SlowStandIn)
    results = {}
    executor.run([SPECS[3], SPECS[1], SPECS[2]], lambda spec, summary: results.__setitem__(spec.seed, summary["status"]))
    assert results == {3: "ok", 1: "ok", 2: "ok"}


def test_workers_are_spawned_and_the_gpus_default_to_the_visible_ones(tmp_path, monkeypatch):
    """spawn, not fork: a forked child of a process that has touched CUDA cannot use it."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    executor = LocalExecutor(WorkerOptions(runs_dir=str(tmp_path), data_root=None, cache_dir=None, workers=2))
    assert executor.ctx.get_start_method() == "spawn" and executor.slots == [None, None]
