"""Lightning callbacks the runner attaches to every run."""

from __future__ import annotations

import math
import sys
import time
import weakref
from typing import Mapping

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from modules.tasks import Metric
from modules.tasks.stopping import StoppingRule


def host_floats(values: Mapping[str, Tensor]) -> dict[str, float]:
    """{name: float(value)} of scalar tensors, read in one transfer per device and dtype: a float() each makes the
    host wait for the device once per value, ~10 waits per epoch of a graph run on a GPU. `tolist` gives the
    Python float that float() gives (an integer or bool value too, as float() casts it)."""
    out: dict[str, float] = {}
    groups: dict[tuple[torch.device, torch.dtype], list[str]] = {}
    for name, value in values.items():
        groups.setdefault((value.device, value.dtype), []).append(name)
    for names in groups.values():
        read = torch.stack([values[name] if values[name].dim() == 0 else values[name].reshape(()) for name in names]).tolist()
        out.update((name, float(value)) for name, value in zip(names, read))
    return {name: out[name] for name in values}


_validation_reads: "weakref.WeakKeyDictionary[L.Trainer, tuple]" = weakref.WeakKeyDictionary()
"""Per trainer: the last validation pass's read ((epoch, step), its metric tensors, their floats)."""


def _validation_scalars(trainer: L.Trainer) -> dict[str, float]:
    """The validation pass's scalar metrics as floats, read from the device once per pass for every callback that
    asks (KeepBestAndStop and History each asked: two transfers of the same values), together with History's
    sums of the epoch's training values (its own transfer at the epoch's end otherwise) and, where the module
    leaves it to this read, its divergence check's loss (its own read before validation otherwise): one transfer
    per device and dtype per epoch instead of four."""
    metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/") and v.numel() == 1}
    point = (trainer.current_epoch, trainer.global_step)
    cached = _validation_reads.get(trainer)
    # the same pass: Lightning hands each callback new tensor objects over the same storage
    if (cached is not None and cached[0] == point and cached[1].keys() == metrics.keys()
            and all(cached[1][k].data_ptr() == v.data_ptr() for k, v in metrics.items())):
        return dict(cached[2])
    history = next((c for c in trainer.callbacks if isinstance(c, History)), None)
    sums = history.pending_sums() if history is not None else {}
    # the training losses' divergence check, where the module leaves it to this read: checked before any value
    # reaches a callback, so a diverged epoch stops with the error the check before validation raised
    watch = getattr(trainer.lightning_module, "divergence_watch", None)
    pending = watch.take() if watch is not None and watch.read_with_validation else None
    divergence = {("divergence", "loss"): pending} if pending is not None else {}
    read = host_floats({**{("train", k): v for k, v in sums.items()}, **metrics, **divergence})
    if pending is not None:
        watch.check_read(read[("divergence", "loss")], pending, trainer.lightning_module)
    if history is not None:
        history.take_sums({k: read[("train", k)] for k in sums})
    values = {k: read[k] for k in metrics}
    _validation_reads[trainer] = (point, metrics, values)
    return dict(values)


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
        self.best_step: int | None = None
        """The last optimiser step of the kept epoch (0-based), whose loss weights the test pass's loss shares use."""
        self.best_metrics: dict[str, float] = {}
        """Every validation metric logged at the kept epoch (e.g. val/acc when the monitor is val/loss)."""
        self._state = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        logged = _validation_scalars(trainer)
        if self.monitor not in logged:
            raise KeyError(f"the monitored metric {self.monitor!r} was not logged; logged metrics: {sorted(trainer.callback_metrics)}")
        try:
            decision = self.rule.update(logged)
        except KeyError as missing:
            raise KeyError(f"the stopping rule ({self.rule.description}) needs {missing} but it was not logged; "
                           f"logged metrics: {sorted(trainer.callback_metrics)}") from None
        if decision.save:
            self.best_value, self.best_epoch, self.best_metrics = logged[self.monitor], trainer.current_epoch, logged
            self.best_step = max(trainer.global_step - 1, 0)
            self._keep(pl_module)
        # As EarlyStopping: data-parallel ranks see the same synced metrics, and any rank's stop stops all.
        if trainer.strategy.reduce_boolean_decision(decision.stop, all=False):
            trainer.should_stop = True

    def _keep(self, pl_module: L.LightningModule) -> None:
        """A copy of the module's weights. Into the tensors of the last copy where they match (every later save of a
        fit): one foreach copy, where a copy of each state_dict() entry was a detach and a clone per tensor, two ops
        each (16 per save of a GAT). Without autograd, the live parameters themselves (keep_vars) are read: no
        detach, and the copies need no gradient."""
        live = pl_module.state_dict(keep_vars=True)
        kept = self._state
        with torch.no_grad():
            if (kept is not None and kept.keys() == live.keys()
                    and all(isinstance(v, Tensor) and isinstance(kept[k], Tensor) and kept[k].shape == v.shape
                            and kept[k].dtype == v.dtype and kept[k].device == v.device for k, v in live.items())):
                torch._foreach_copy_(list(kept.values()), list(live.values()))
            else:
                self._state = {k: v.clone() if isinstance(v, Tensor) else v for k, v in live.items()}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._state is not None:
            pl_module.load_state_dict(self._state)

    # Lightning keeps a callback's state_dict in its checkpoint and hands it back on `fit(ckpt_path=...)`. Saved here,
    # not by Lightning, because nothing of Lightning's holds it: the rule's counters and bests (our own rule, not
    # EarlyStopping) and the kept weights (in memory, not a ModelCheckpoint file: see the class docstring).
    def state_dict(self) -> dict:
        return {"rule": self.rule.state_dict(), "best_value": self.best_value, "best_epoch": self.best_epoch,
                "best_step": self.best_step, "best_metrics": dict(self.best_metrics), "weights": self._state}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rule.load_state_dict(state_dict["rule"])
        self.best_value, self.best_epoch = state_dict["best_value"], state_dict["best_epoch"]
        self.best_step = state_dict.get("best_step", self.best_epoch)  # checkpoints before it: a graph's one step per epoch
        self.best_metrics, self._state = dict(state_dict["best_metrics"]), state_dict["weights"]


class EpochTimer(Callback):
    """Wall time of fitting and of each training epoch (its validation included)."""

    def __init__(self) -> None:
        self.epochs = 0
        self.total_s = 0.0
        self._fit_start = 0.0
        self._before_s = 0.0
        """Fitting time of the epochs a resumed run's checkpoint holds (its earlier process's)."""

    def on_fit_start(self, trainer, pl_module) -> None:
        self._fit_start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs += 1

    def on_fit_end(self, trainer, pl_module) -> None:
        self.total_s = self._before_s + time.perf_counter() - self._fit_start

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.total_s = self._before_s + time.perf_counter() - self._fit_start

    # In the checkpoint (Lightning keeps callback states): a resumed run's record counts every epoch it trained,
    # not only those since the resume.
    def state_dict(self) -> dict:
        return {"epochs": self.epochs, "fit_s": self._before_s + time.perf_counter() - self._fit_start}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epochs, self._before_s = int(state_dict["epochs"]), float(state_dict["fit_s"])

    @property
    def this_process_s(self) -> float:
        """The part of total_s this process fitted: all of it, less what a resumed run's checkpoint held."""
        return self.total_s - self._before_s

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
"""Most points per learning curve in a record. Longer fits are averaged in blocks of consecutive epochs, the
block size the smallest power of two that brings the epochs run within this many points. 60 points draw a curve
faithfully and keep a 300-epoch record near 4 KB (per-epoch series made Cora records ~15 KB).

Why from the epochs run, not max_epochs: an early-stopped fit under a huge cap (paper-gat:
100,000 epochs, GAT's patience rule) got blocks of 1,667 epochs, so its curves were one point. Powers of two
nest, so two seeds' curves still share block edges: the finer one merges pairwise into the coarser one's blocks."""


def _epoch_sum(values: list[Tensor]) -> Tensor:
    """sum(values) on the device, where an epoch of one step (a graph's) needs no op: its one value, which the host
    then adds to 0 (`_as_summed`) as sum() would have on the device."""
    return values[0] if len(values) == 1 else sum(values)


def _as_summed(value: float) -> float:
    """A read `_epoch_sum` as sum() gives it: 0 + v, which only turns -0.0 into 0.0 (a sum of several values already is)."""
    return 0.0 + value


class History(Callback):
    """Per-epoch learning curves for the record: train loss, aux losses and mechanism diagnostics (`diag/<name>`,
    modules/attention/kernel.py MechanismDiagnostic) as means over the epoch's batches, every validation metric
    (`val/diag/<name>` among them), and the epoch's wall time (its validation included)."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []
        self._train: dict[str, list] = {}
        self._val: dict[str, float] = {}
        self._sums: tuple[dict[str, float], dict[str, int]] | None = None
        """The epoch's training sums as read with its validation metrics, and the counts they summed."""
        self._start = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()
        self._train, self._val, self._sums = {}, {}, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for name, value in trainer.callback_metrics.items():
            if (name == "train/loss" or name.startswith(("aux/", "diag/"))) and value.numel() == 1:
                # kept as tensors until the epoch ends: a float() per step would sync the GPU every step
                # (Lightning hands them detached unless logged with enable_graph)
                self._train.setdefault(name, []).append(value.detach() if value.requires_grad else value)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        self._val = _validation_scalars(trainer)
        if not getattr(pl_module, "validation_measured", True):  # stale values of an earlier pass: not this epoch's
            self._val = {k: v for k, v in self._val.items() if not k.startswith("val/diag/")}

    def pending_sums(self) -> dict[str, Tensor]:
        """The sums of the epoch's training values so far, on the device (read with the validation metrics when a
        validation pass runs: `_validation_scalars`)."""
        return {name: _epoch_sum(values) for name, values in self._train.items()}

    def take_sums(self, sums: dict[str, float]) -> None:
        self._sums = ({name: _as_summed(value) for name, value in sums.items()}, {name: len(values) for name, values in self._train.items()})

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        read, self._sums = self._sums, None
        if read is not None and read[1] == {name: len(values) for name, values in self._train.items()}:
            sums = read[0]
        else:  # no validation pass this epoch (or batches since it): a transfer of its own
            sums = {name: _as_summed(value) for name, value in host_floats({name: _epoch_sum(values) for name, values in self._train.items()}).items()}
        row = {name: sums[name] / len(values) for name, values in self._train.items()}
        row.update(self._val)
        row["epoch_s"] = time.perf_counter() - self._start
        self.epochs.append(row)

    def final_diagnostics(self) -> dict[str, float]:
        """The last epoch's value of each mechanism diagnostic curve, for `Record.diagnostics`."""
        return final_diagnostics(self.epochs)

    # In the checkpoint: Lightning logs nothing without a logger, so these rows exist only here.
    def state_dict(self) -> dict:
        return {"epochs": [dict(row) for row in self.epochs]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epochs = [dict(row) for row in state_dict["epochs"]]

    def compact(self) -> dict[str, list] | None:
        """{"epoch": [last epoch of each block, 1-based], <series>: [block means, None where never logged]},
        floats to 4 significant digits; None before the first epoch ended."""
        if not self.epochs:
            return None
        block = history_block(len(self.epochs))
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


def history_block(epochs: int) -> int:
    """Epochs per point of a record's curves: the smallest power of two giving at most MAX_HISTORY_POINTS points."""
    block = 1
    while math.ceil(epochs / block) > MAX_HISTORY_POINTS:
        block *= 2
    return block


def final_diagnostics(rows: list[dict[str, float]]) -> dict[str, float]:
    """{"diag/<name>": last finite train value, "val/diag/<name>": last finite validation value} over per-epoch
    history rows (a lone run's History or a seed batch's rows)."""
    final: dict[str, float] = {}
    for row in rows:
        for name, value in row.items():
            if name.startswith(("diag/", "val/diag/")) and math.isfinite(value):
                final[name] = float(value)
    return final


def global_rng_state() -> dict:
    """The process-wide generators (torch CPU and CUDA, numpy, Python) as plain tensors, lists and numbers, so that a
    checkpoint holding them loads with torch.load(weights_only=True)."""
    import random

    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, mt, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "state": [int(x) for x in mt], "gauss": gauss},
    }


def set_global_rng_state(state: dict) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def noise_streams(module) -> dict:
    """Every run-own noise stream (modules/hosts/gat.py NoiseStream) in `module`, by the name of the module holding it."""
    from modules.hosts.gat import NoiseStream

    return {name: m.noise for name, m in module.named_modules() if isinstance(getattr(m, "noise", None), NoiseStream)}


class ResumableRun(Callback):
    """A lone run's mid-run checkpoints (harness/results/checkpoints.py): after an epoch, when the interval is due,
    `trainer.save_checkpoint` writes Lightning's checkpoint (model, optimisers, schedulers, loops, and every
    callback's state_dict: KeepBestAndStop's rule and kept weights, History's rows, EpochTimer's counts) through
    `AtomicCheckpointIO`. What Lightning itself keeps of neither is this callback's own state: the global RNGs
    (Lightning saves none) and each model's NoiseStream generator (a plain attribute, not a buffer, so not in the
    state_dict). It is restored in on_train_start, after Lightning's restore and just before the first resumed
    epoch, where the unkilled run's generators stood after the saved epoch.

    Attach it after History and EpochTimer: Lightning calls callbacks' on_train_epoch_end in list order, and the
    saved state must include the epoch's history row.

    Data-parallel, saving is a collective (Lightning gathers the state on every rank, rank 0 writes), so rank 0's
    clock decides when it is due, and the state holds every rank's generators ("ranks"): a rank's draws follow its
    own shard of the data, so they need not match rank 0's."""

    def __init__(self, path, interval, meta) -> None:
        self.path, self.interval, self.meta = path, interval, meta
        self.resumed_from: int | None = None
        """Epochs the checkpoint a resumed run started from held (it resumed at this 0-based epoch)."""
        self.resumes = 0
        self._pending: dict | None = None
        self._epochs_since, self._since = 0, time.perf_counter()

    def state_dict(self) -> dict:
        trainer = self._trainer
        mine = {"rng": global_rng_state(),
                "noise": {name: stream.state_dict() for name, stream in noise_streams(trainer.lightning_module).items()}}
        state = {"epoch": trainer.current_epoch + 1, "resumes": self.resumes, **mine}
        if trainer.world_size > 1:
            import torch.distributed as dist

            ranks: list = [None] * trainer.world_size
            dist.all_gather_object(ranks, mine)
            state["ranks"] = ranks
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        self._pending = state_dict
        self.resumed_from, self.resumes = int(state_dict["epoch"]), int(state_dict["resumes"]) + 1

    def setup(self, trainer, pl_module, stage) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer, pl_module) -> None:
        self._since = time.perf_counter()
        if self._pending is None:
            return
        # a checkpoint holds "ranks" only when written on as many processes as this run has (checkpoints.stale)
        mine = self._pending["ranks"][trainer.global_rank] if "ranks" in self._pending else self._pending
        streams = noise_streams(pl_module)
        for name, state in mine["noise"].items():
            streams[name].load_state_dict(state)
        set_global_rng_state(mine["rng"])
        self._pending = None

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._epochs_since += 1
        last = trainer.max_epochs is not None and trainer.current_epoch + 1 >= trainer.max_epochs
        # Not at the epoch that ends fitting: nothing would resume from it (Lightning keeps no should_stop either).
        if trainer.should_stop or last:
            return
        due = self.interval.due(self._epochs_since, time.perf_counter() - self._since)
        if trainer.world_size > 1:
            due = trainer.strategy.broadcast(due, src=0)  # a rank that saved alone would wait in its barrier for ever
        if not due:
            return
        trainer.save_checkpoint(self.path)
        self._epochs_since, self._since = 0, time.perf_counter()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["attnbench"] = self.meta(trainer.current_epoch + 1, self.resumes)


class AtomicCheckpointIO:
    """Lightning's checkpoint I/O for mid-run checkpoints: written as the record store writes (temp file, fsync,
    rename), read with torch.load(weights_only=True) only."""

    @staticmethod
    def make():
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

        class _IO(TorchCheckpointIO):
            def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
                from pathlib import Path

                from harness.results.checkpoints import save_atomically

                save_atomically(checkpoint, Path(path))

            def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None):
                import torch

                return torch.load(path, map_location=map_location, weights_only=True)

        return _IO()
