"""Counts and storage URLs are checked against what this machine and the URL can give, before anything runs:
exit code 2, one line with the counts or the reason, nothing written under the runs folder, the params folder
or the leaderboards. The machine is pinned (monkeypatched) so that the messages do not depend on the host."""

import socket

import pytest

from harness.cli import main
from harness.plan import machine
from harness.plan.machine import Machine


def _folders(tmp_path):
    return ["--runs-dir", str(tmp_path / "runs")]


def _written(tmp_path):
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


def _bench(*flags):
    return ["bench", "--suite", "quick", *flags]


def _tune(*flags):
    return ["tune", "cora", "fenchel", *flags]  # softmax has no options: tune refuses it


@pytest.fixture
def two_cores_no_gpu(monkeypatch):
    monkeypatch.setattr(Machine, "here", classmethod(lambda cls: Machine(cores=2, gpus=0)))


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(Machine, "here", classmethod(lambda cls: Machine(cores=32, gpus=4)))


CPU_ONLY = [
    (_bench("--workers", "64"), "--workers 64: this machine has 2 CPU cores and no GPU; at most 2 CPU workers (one per core)"),
    (_bench("--workers", "0"), "--workers 0: expected an integer >= 1"),
    (_bench("--devices", "2"), "bench --devices N is now --workers N"),
    (["scaling", "--workers", "1,2,4"], "--workers 4: this machine has 2 CPU cores and no GPU; at most 2 CPU workers"),
    (["scaling", "--workers", "1,two"], "--workers takes comma-separated integers, e.g. 1,2; got '1,two'"),
    (["scaling", "--seeds", "1,twenty"], "--seeds takes comma-separated integers, e.g. 1,20; got '1,twenty'"),
    (["scaling", "--seeds", "0,20"], "--seeds 0,20: every seed count must be at least 1"),
    (["run", "cora", "softmax", "--strategy", "ddp", "--devices", "3"],
     "--devices 3: this machine has 2 CPU cores and no GPU; DDP on CPU runs one process per device, so at most --devices 2"),
    (_tune("--strategy", "ddp", "--devices", "16"), "so at most --devices 2 (one per core)"),
    (["run", "cora", "softmax", "--seed", "-1"], "--seed -1: expected an integer >= 0 (from the command line)"),
    (["perf", "--threads", "0"], "--threads 0: expected an integer >= 1"),
]


@pytest.mark.parametrize("argv, line", CPU_ONLY)
def test_counts_beyond_a_gpu_less_two_core_machine_are_refused(argv, line, two_cores_no_gpu, capsys, tmp_path):
    extra = ["--leaderboard-dir", str(tmp_path / "leaderboards")] if argv[0] == "bench" else []
    extra += ["--params-dir", str(tmp_path / "params")] if argv[0] == "tune" else []
    assert main([*argv, *extra, *_folders(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnbench: error: ")
    assert line in err
    assert _written(tmp_path) == []


@pytest.mark.parametrize(
    "argv, line",
    [
        (_bench("--workers", "5", "--workers-per-gpu", "1"),
         "--workers 5: this machine has 32 CPU cores and 4 GPUs; at most 4 workers (one per GPU)"),
        # without --workers-per-gpu no share beyond the cores per GPU could allow it: refused before torch loads
        (_bench("--workers", "33"), "--workers 33: this machine has 32 CPU cores and 4 GPUs; at most 32 workers x 8 per GPU"),
        # within the cores, but beyond the share quick's graph tasks declare (4 per GPU): refused once the plan is read
        (_bench("--workers", "17"), "at most 16 workers x 4 per GPU (4 per GPU: the fewest runs per GPU among the plan's tasks "
                                    "(citeseer 4, cora 4); --workers-per-gpu K overrides)"),
        (["run", "cora", "softmax", "--strategy", "ddp", "--devices", "8"],
         "--devices 8: this machine has 32 CPU cores and 4 GPUs; DDP runs one process per GPU, so at most --devices 4"),
    ],
)
def test_counts_beyond_the_gpus_are_refused_with_the_gpu_count(argv, line, four_gpus, capsys, tmp_path):
    assert main([*argv, *_folders(tmp_path)]) == 2
    assert line in capsys.readouterr().err
    assert _written(tmp_path) == []


def test_counts_within_the_machine_pass():
    cpu, gpu = Machine(cores=2, gpus=0), Machine(cores=32, gpus=4)
    assert cpu.worker_problem(2) is None and cpu.ddp_problem(2, "ddp") is None
    assert gpu.worker_problem(4) is None and gpu.ddp_problem(4, "ddp") is None
    assert gpu.worker_problem(8, workers_per_gpu=2) is None
    assert "at most 8 workers x 2 per GPU" in gpu.worker_problem(9, workers_per_gpu=2)
    assert cpu.ddp_problem(5, "auto") is None  # one device without ddp: harness/run/distributed.py words that refusal


def test_workers_per_gpu_follow_the_tasks_that_fill_a_gpu_most_within_the_cores():
    launch_bound, fills_a_gpu = {"cora": 4, "citeseer": 4}, {"cora": 4, "glue-rte": 1}
    assert machine.workers_per_gpu_rule(launch_bound, Machine(cores=16, gpus=1))[0] == 4
    assert machine.workers_per_gpu_rule(fills_a_gpu, Machine(cores=16, gpus=1)) == (
        1, "1 per GPU: the fewest runs per GPU among the plan's tasks (cora 4, glue-rte 1); --workers-per-gpu K overrides")
    share, rule = machine.workers_per_gpu_rule(launch_bound, Machine(cores=8, gpus=4))
    assert share == 2 and "capped at the 2 CPU core(s) per GPU" in rule
    assert machine.workers_per_gpu_rule(launch_bound, Machine(cores=2, gpus=0)) == (1, "no GPU: one worker per CPU core")


@pytest.mark.parametrize("suite, share", [("quick", 4), ("glue-quick", 1)])
def test_bench_dry_run_states_the_workers_per_gpu_rule(suite, share, monkeypatch, capsys, tmp_path):
    from harness.run import worker_pool

    monkeypatch.setattr(Machine, "here", classmethod(lambda cls: Machine(cores=16, gpus=1)))
    monkeypatch.setattr(worker_pool, "visible_gpus", lambda: ["0"])
    assert main(["bench", "--suite", suite, "--dry-run", *_folders(tmp_path)]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"; workers: {share} ({share} per GPU: the fewest runs per GPU among the plan's tasks (" in summary
    assert main(["bench", "--suite", suite, "--dry-run", "--workers-per-gpu", "3", *_folders(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("; workers: 3 (3 per GPU (--workers-per-gpu))")


def test_gpus_are_counted_from_cuda_visible_devices_as_cuda_reads_it(monkeypatch):
    for visible, count in [("0,1,2", 3), ("", 0), ("-1", 0), ("1,-1,2", 1), ("GPU-3f2a,GPU-77b1", 2)]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert machine.gpu_count() == count, visible


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "storage, line",
    [
        ("notaurl://x", "--storage 'notaurl://x': unknown scheme 'notaurl'; use sqlite:///path/optuna.db"),
        ("optuna.db", "--storage 'optuna.db': not a storage URL"),
        ("journal:/missing/dir/j.log", "--storage 'journal:/missing/dir/j.log': the folder /missing/dir does not exist"),
        ("journal:", "name the journal file"),
        ("sqlite:////missing/dir/optuna.db", "--storage sqlite:////missing/dir/optuna.db: the folder /missing/dir does not exist"),
        ("postgresql://bench:secret@127.0.0.1:{port}/optuna",
         "--storage postgresql://bench:***@127.0.0.1:{port}/optuna: cannot connect ("),
    ],
)
def test_a_storage_that_cannot_work_is_refused_before_any_trial(storage, line, capsys, tmp_path):
    port = _closed_port()
    storage, line = storage.format(port=port), line.format(port=port)
    assert main([*_tune("--storage", storage, "--trials", "1", "--params-dir", str(tmp_path / "params")), *_folders(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err
    assert "secret" not in err  # the password never reaches a log
    assert _written(tmp_path) == []


def test_a_journal_in_an_existing_folder_and_a_dry_run_pass_the_check(shared_data, capsys, tmp_path):
    argv = [*_tune("--storage", f"journal:{tmp_path / 'j.log'}", "--dry-run", "--params-dir", str(tmp_path / "params")),
            "--data-root", str(shared_data), *_folders(tmp_path)]
    assert main(argv) == 0
    assert "cora" in capsys.readouterr().out
    assert _written(tmp_path) == []  # a dry run creates neither the journal nor the runs folder
