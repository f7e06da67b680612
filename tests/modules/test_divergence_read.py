"""A graph run's divergence check rides on the validation read (harness/run/callbacks._validation_scalars): a
diverged epoch still stops in that epoch, with the error the check before validation raised, before any callback
uses a value; without those callbacks the epoch's end checks it."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from harness.run.callbacks import History, KeepBestAndStop
from modules.lit.attention_terms import DivergedError
from modules.tasks import Metric
from modules.tasks.stopping import MonitorRule
from tests.modules.host_syncs import HostSyncs
from tests.modules.test_host_syncs import gat_host


class OneBatch:
    def __init__(self, graph):
        self.graph = graph

    def __iter__(self):
        yield self.graph

    def __len__(self):
        return 1


class Poison(L.Callback):
    """NaN weights from the start of epoch `epoch`: that epoch's training loss is NaN."""

    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            with torch.no_grad():
                pl_module.model.layers[0].bias.fill_(math.nan)


class Recorder(L.Callback):
    """Every on_validation_end it sees after the two harness callbacks (none when they raise first)."""

    def __init__(self):
        self.epochs = []

    def on_validation_end(self, trainer, pl_module):
        self.epochs.append(trainer.current_epoch)


def _fit(poison_at: int | None, callbacks: bool, epochs: int = 3, recorder: Recorder | None = None):
    torch.manual_seed(0)
    module, graph = gat_host("softmax")
    recorder = recorder or Recorder()
    extra = [KeepBestAndStop(MonitorRule("val/loss", False, patience=10), Metric("val/loss", False)), History()] if callbacks else []
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[*extra, recorder, *([Poison(poison_at)] if poison_at is not None else [])])
    trainer.fit(module, train_dataloaders=OneBatch(graph), val_dataloaders=OneBatch(graph))
    return module, recorder, extra


@pytest.mark.parametrize("callbacks", [True, False])
def test_a_diverged_epoch_stops_in_that_epoch_with_the_same_error(callbacks):
    with pytest.raises(DivergedError, match=r"^training loss became non-finite \(nan on this process\) at epoch 1; the run diverged$"):
        _fit(poison_at=1, callbacks=callbacks)


def test_the_check_is_in_the_validation_read_and_before_any_callback_uses_it():
    recorder = Recorder()
    with pytest.raises(DivergedError):
        _fit(poison_at=1, callbacks=True, recorder=recorder)
    # the validation read raised in the first harness callback: epoch 1's values reached no later callback
    assert recorder.epochs == [0]
    module, recorder, (best, history) = _fit(poison_at=None, callbacks=True, epochs=2)
    assert recorder.epochs == [0, 1] and len(history.epochs) == 2
    assert module.divergence_watch.take() is None  # each epoch's loss was taken by its validation read


def test_a_finite_fit_reads_the_divergence_loss_with_the_validation_values():
    """One host transfer at the validation's end carries the check: none before the validation pass."""
    module, graph = gat_host("softmax")
    reads = []
    before = module.on_validation_start

    def counted():
        with HostSyncs() as syncs:
            before()
        reads.append(syncs.count)

    module.on_validation_start = counted
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[KeepBestAndStop(MonitorRule("val/loss", False, patience=10), Metric("val/loss", False)), History()])
    trainer.fit(module, train_dataloaders=OneBatch(graph), val_dataloaders=OneBatch(graph))
    assert reads == [0, 0]
