"""What `attnbench run` prints while it trains: plain per-epoch lines when stdout is not a terminal (a SLURM
log, a pipe), Lightning's progress bar within epochs (and the same lines) when it is."""

import re
import sys

from lightning.pytorch.callbacks import ProgressBar

from harness.cli import main
from harness.run.callbacks import EpochLog, live_progress

EPOCH_LINE = re.compile(r"^  epoch (\d+): train/loss=(\d+\.\d{4}) val/\w+=(\d+\.\d{4}) \((\d+\.\d) s\)$", re.M)


class _Terminal:
    def isatty(self):
        return True


class _Pipe:
    def isatty(self):
        return False


def test_a_pipe_gets_lines_and_a_terminal_gets_a_bar_too():
    plain = live_progress("val/acc", stream=_Pipe())
    assert [type(c) for c in plain] == [EpochLog]
    live = live_progress("val/acc", stream=_Terminal())
    assert isinstance(live[0], ProgressBar) and isinstance(live[1], EpochLog)


def _run(shared_data, tmp_path, seed):
    return main(["run", "cora", "softmax", "--seed", str(seed), "--set", "max_epochs=3", "--data-root", str(shared_data),
                 "--runs-dir", str(tmp_path)])


def test_lines_name_the_epoch_its_mean_training_loss_the_monitor_and_seconds(shared_data, capsys, tmp_path):
    assert _run(shared_data, tmp_path, 2) == 0
    lines = EPOCH_LINE.findall(capsys.readouterr().out)
    assert [int(epoch) for epoch, *_ in lines] == [0, 1, 2]
    losses = [float(loss) for _, loss, _, _ in lines]
    assert all(0 < loss < 10 for loss in losses) and losses[-1] < losses[0]  # Cora's loss falls from ln(7) ~ 1.95


def test_on_a_terminal_the_run_trains_under_lightning_s_progress_bar(shared_data, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert _run(shared_data, tmp_path, 3) == 0
    out = capsys.readouterr().out
    # Above the live bar each line starts with the terminal's erase-line code, hence no anchor here.
    assert len(re.findall(EPOCH_LINE.pattern.strip("^$"), out)) == 3
    assert "Epoch 2" in out  # the bar's own description, as Lightning writes it


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_bench_eta_after_a_batchs_first_seed_counts_batches_left_not_runs(monkeypatch):
    """72 runs as 24 seed batches of 3 on 2 workers, each batch 100 s: when the first batch's first seed ends, 22
    batches have not started and the running one is about done, so about 11 batch times are left (a per-run rate
    said 71)."""
    from harness import bench
    from harness.plan.spec import make_spec

    clock = _Clock()
    monkeypatch.setattr(bench.time, "perf_counter", clock)
    monkeypatch.setattr(bench, "log", lambda line: None)
    items = [[make_spec("cora", "softmax", seed, {"max_epochs": 3 + batch}) for seed in range(3)] for batch in range(24)]
    progress = bench.Progress(72, 2, items)
    progress.started(items[0])
    progress.started(items[1])
    ok = {"status": "ok", "metrics": {"test/acc": {"value": 0.8}}, "epochs": 300, "wall_time_s": 100.0}
    clock.now = 100.0
    progress(items[0][0], ok)
    assert 1000 <= progress.eta(clock.now) <= 1200
    for seed, now in ((1, 100.5), (2, 101.0)):
        clock.now = now
        progress(items[0][seed], ok)
    progress.started(items[2])
    clock.now = 102.0
    for spec in items[1]:
        progress(spec, ok)
    progress.started(items[3])
    # 20 batches to start, two just started: 22 batches of 100 s on 2 workers
    assert 1000 <= progress.eta(clock.now) <= 1200


def test_a_seed_batch_in_a_bench_worker_prints_its_progress_at_most_every_so_often(monkeypatch):
    """bench's workers (every_s > 0): a line names its batch and comes at most every `every_s` seconds, and the last
    ("done") always comes; `run --seeds` (every_s 0) prints every epoch."""
    from harness.plan.spec import make_spec
    from harness.run import seed_batch
    from modules.tasks import get_task

    clock = _Clock()
    monkeypatch.setattr(seed_batch.time, "perf_counter", clock)
    specs = [make_spec("cora", "softmax", seed, {"max_epochs": 10}) for seed in (0, 1)]
    monitor = get_task("cora").monitor
    for every_s, expected in ((30.0, [3, 6, 9, 10]), (0.0, list(range(1, 11)))):
        lines = []
        progress = seed_batch._Progress(specs, monitor, 10, lines.append, every_s=every_s)
        for epoch in range(10):
            clock.now += 10.0  # 10 s an epoch
            for index in (0, 1):
                progress.updated(index, {monitor.name: 0.5 + epoch / 100}, stop=False)
        assert [int(line.split("epoch ")[1].split("/")[0]) for line in lines] == expected, lines
        assert lines[-1].endswith("done")
        assert all(("cora x softmax seeds 0,1 epoch" in line) == bool(every_s) for line in lines)
