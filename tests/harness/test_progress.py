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
