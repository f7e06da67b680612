"""Lightning callbacks the runner attaches to every run."""

from __future__ import annotations

import math
import sys
import time

import lightning as L
from lightning.pytorch.callbacks import Callback

from modules.tasks import Metric
from modules.tasks.stopping import StoppingRule


class KeepBestAndStop(Callback):
    """A task's stopping rule (modules/tasks/stopping.py) in a lone run: after each validation it feeds the
    epoch's metrics to the rule, keeps the weights of the epochs the rule saves, asks the Trainer to stop when
    the rule says, and loads the kept weights when fitting ends. With a MonitorRule it decides as Lightning's
    EarlyStopping (min_delta 0, check_finite) did together with the in-memory best-weights keeper it replaces.

    The weights are kept in memory rather than with ModelCheckpoint because ModelCheckpoint serialises to disk
    on every improvement, which costs more than a whole epoch of these small full-batch models (measured on
    Cora: ~9 ms of a ~50 ms epoch); the state here is a few hundred kB copied in memory."""

    def __init__(self, rule: StoppingRule, monitor: Metric):
        self.rule, self.monitor = rule, monitor.name
        self.best_value: float | None = None
        """The monitor's value at the kept epoch."""
        self.best_epoch: int | None = None
        self.best_metrics: dict[str, float] = {}
        """Every validation metric logged at the kept epoch (e.g. val/acc when the monitor is val/loss)."""
        self._state = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/") and v.numel() == 1}
        if self.monitor not in logged:
            raise KeyError(f"the monitored metric {self.monitor!r} was not logged; logged metrics: {sorted(trainer.callback_metrics)}")
        try:
            decision = self.rule.update(logged)
        except KeyError as missing:
            raise KeyError(f"the stopping rule ({self.rule.description}) needs {missing} but it was not logged; "
                           f"logged metrics: {sorted(trainer.callback_metrics)}") from None
        if decision.save:
            self.best_value, self.best_epoch, self.best_metrics = logged[self.monitor], trainer.current_epoch, logged
            self._state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        # As EarlyStopping: data-parallel ranks see the same synced metrics, and any rank's stop stops all.
        if trainer.strategy.reduce_boolean_decision(decision.stop, all=False):
            trainer.should_stop = True

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._state is not None:
            pl_module.load_state_dict(self._state)


class EpochTimer(Callback):
    """Wall time of fitting and of each training epoch (its validation included)."""

    def __init__(self) -> None:
        self.epochs = 0
        self.total_s = 0.0
        self._fit_start = 0.0

    def on_fit_start(self, trainer, pl_module) -> None:
        self._fit_start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs += 1

    def on_fit_end(self, trainer, pl_module) -> None:
        self.total_s = time.perf_counter() - self._fit_start

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.total_s = time.perf_counter() - self._fit_start

    @property
    def mean_epoch_s(self) -> float | None:
        return self.total_s / self.epochs if self.epochs else None


class EpochLog(Callback):
    """One plain line per epoch (epoch, mean training loss, the monitored validation metric, seconds) for
    `attnbench run`, so that a long run shows progress in a SLURM log or a pipe, where a progress bar would
    write a carriage-return stream nobody reads. `write` prints the line (tqdm.write beside a tqdm bar)."""

    def __init__(self, monitor: str, write=print):
        self.monitor = monitor
        self.write = write
        self._start = 0.0
        self._loss_sum = 0.0
        self._batches = 0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()
        self._loss_sum, self._batches = 0.0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            # summed on the device, read once per epoch: a float() here would sync the GPU every step
            self._loss_sum = self._loss_sum + loss.detach()
            self._batches += 1

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        value = trainer.callback_metrics.get(self.monitor)
        shown = f"{float(value):.4f}" if value is not None else "?"
        loss = f"train/loss={float(self._loss_sum) / self._batches:.4f} " if self._batches else ""
        self.write(f"  epoch {trainer.current_epoch}: {loss}{self.monitor}={shown} ({time.perf_counter() - self._start:.1f} s)")
        sys.stdout.flush()


def live_progress(monitor: str, stream=None) -> list[Callback]:
    """What `attnbench run` shows while it trains. On a terminal: Lightning's progress bar within each epoch
    (rich when installed, else tqdm, which Lightning itself requires), with the training loss and the
    monitored metric on it, and a line per epoch above it. Elsewhere (a SLURM log, a pipe): the lines alone.
    The Trainer must be built with enable_progress_bar when a ProgressBar is returned."""
    if not (stream or sys.stdout).isatty():
        return [EpochLog(monitor)]
    try:
        import rich  # noqa: F401 - RichProgressBar imports it only when the bar starts
        from lightning.pytorch.callbacks import RichProgressBar as Bar

        write = print  # rich's live display prints lines above the bar
    except ImportError:
        from lightning.pytorch.callbacks import TQDMProgressBar as Bar
        from tqdm import tqdm

        write = tqdm.write

    class RunProgressBar(Bar):
        def get_metrics(self, trainer, pl_module):
            # The modules log the loss without prog_bar (bench workers show no bar); show it here.
            shown = super().get_metrics(trainer, pl_module)
            for name in ("train/loss", monitor):
                value = trainer.callback_metrics.get(name)
                if value is not None and value.numel() == 1:
                    shown[name] = float(value)
            return shown

    return [RunProgressBar(), EpochLog(monitor, write=write)]


class FollowRankZeroPruning(Callback):
    """The other ranks' half of optuna-integration's pruning callback in DDP: that callback, on rank 0,
    broadcasts its prune decision after every validation, and each rank must take part in that broadcast
    at the same point, without a trial of its own (only rank 0 holds the Optuna trial)."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        should_stop = trainer.strategy.broadcast(False)
        trainer.should_stop = trainer.should_stop or should_stop


MAX_HISTORY_POINTS = 60
"""Points per learning curve in a record. Longer fits are averaged in blocks of consecutive epochs, the block
size fixed by max_epochs so that every seed of a task has the same blocks; 60 points draw a curve faithfully
and keep a 300-epoch record near 4 KB (per-epoch series made Cora records ~15 KB)."""


class History(Callback):
    """Per-epoch learning curves for the record: train loss, aux losses and mechanism diagnostics (`diag/<name>`,
    modules/attention/kernel.py MechanismDiagnostic) as means over the epoch's batches, every validation metric
    (`val/diag/<name>` among them), and the epoch's wall time (its validation included)."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []
        self._train: dict[str, list] = {}
        self._val: dict[str, float] = {}
        self._start = 0.0
        self._max_epochs: int | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self._max_epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()
        self._train, self._val = {}, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for name, value in trainer.callback_metrics.items():
            if (name == "train/loss" or name.startswith(("aux/", "diag/"))) and value.numel() == 1:
                # kept as tensors until the epoch ends: a float() per step would sync the GPU every step
                self._train.setdefault(name, []).append(value.detach())

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        self._val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/") and v.numel() == 1}

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        row = {name: float(sum(values)) / len(values) for name, values in self._train.items()}
        row.update(self._val)
        row["epoch_s"] = time.perf_counter() - self._start
        self.epochs.append(row)

    def final_diagnostics(self) -> dict[str, float]:
        """The last epoch's value of each mechanism diagnostic curve, for `Record.diagnostics`."""
        return final_diagnostics(self.epochs)

    def compact(self) -> dict[str, list] | None:
        """{"epoch": [last epoch of each block, 1-based], <series>: [block means, None where never logged]},
        floats to 4 significant digits; None before the first epoch ended."""
        if not self.epochs:
            return None
        block = max(1, math.ceil((self._max_epochs or len(self.epochs)) / MAX_HISTORY_POINTS))
        names = sorted({name for row in self.epochs for name in row})
        history: dict[str, list] = {"epoch": []}
        for name in names:
            history[name] = []
        for first in range(0, len(self.epochs), block):
            rows = self.epochs[first:first + block]
            history["epoch"].append(first + len(rows))
            for name in names:
                values = [row[name] for row in rows if name in row and math.isfinite(row[name])]
                history[name].append(float(f"{sum(values) / len(values):.4g}") if values else None)
        return history


def final_diagnostics(rows: list[dict[str, float]]) -> dict[str, float]:
    """{"diag/<name>": last finite train value, "val/diag/<name>": last finite validation value} over per-epoch
    history rows (a lone run's History or a seed batch's rows)."""
    final: dict[str, float] = {}
    for row in rows:
        for name, value in row.items():
            if name.startswith(("diag/", "val/diag/")) and math.isfinite(value):
                final[name] = float(value)
    return final
