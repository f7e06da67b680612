"""RepeatLog (modules/lit/repeat_log.py): what a Trainer and its callbacks see is what `self.log` gives them, bit for
bit, while Lightning's own `log` runs only at a name's first call in each result collection."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from modules.lit.example_mean import ExampleMean
from modules.lit.repeat_log import RepeatLog


class Toy(L.LightningModule):
    """Logs, per training step and per validation batch, every kind the graph host logs: an on-step tensor, epoch means
    with and without a batch size, a sum, a torchmetrics Metric, a log_dict."""

    def __init__(self, repeat: bool):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)
        self.val_loss = ExampleMean()
        self.logs = RepeatLog() if repeat else None
        self.lightning_calls = 0

    def log(self, *args, **kwargs):
        self.lightning_calls += 1
        return super().log(*args, **kwargs)

    def _log(self, name, value, **kwargs):
        if self.logs is None:
            self.log(name, value, **kwargs)
        else:
            self.logs.log(self, name, value, **kwargs)

    def _log_dict(self, values, **kwargs):
        if self.logs is None:
            self.log_dict(values, **kwargs)
        else:
            self.logs.log_dict(self, values, **kwargs)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.layer(x), y)
        self._log("train/loss", loss, batch_size=len(x), enable_graph=True)
        self._log_dict({"train/a": loss * 2, "train/b": loss.detach() + 1}, batch_size=1)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.layer(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.val_loss.update(loss, len(x))
        self._log("val/loss", self.val_loss, enable_graph=True)
        self._log("val/mean", loss, batch_size=len(x), enable_graph=True)
        self._log("val/found_batch", loss * 3)  # Lightning finds its batch size in the batch: never repeated
        self._log_dict({"val/acc": (logits.argmax(1) == y).float().mean(), "val/int": torch.tensor(len(x))},
                       batch_size=1, reduce_fx="sum", enable_graph=True)
        self._log("val/max", loss, reduce_fx="max", batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)


class Seen(L.Callback):
    """Every value the callbacks could read, after each training batch and each validation."""

    def __init__(self):
        self.rows = []

    def _keep(self, trainer, when):
        self.rows.append((when, {k: v.clone() for k, v in trainer.callback_metrics.items()},
                          {k: v.clone() for k, v in trainer.logged_metrics.items()},
                          {k: v.clone() for k, v in trainer.progress_bar_metrics.items()}))

    def on_train_batch_end(self, trainer, *args):
        self._keep(trainer, "train batch")

    def on_validation_end(self, trainer, *args):
        self._keep(trainer, "validation")


def _fit(repeat: bool, fits: int = 1, epochs: int = 3):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(10, 3), torch.randint(0, 2, (10,)))  # two batches of 5
    loader = DataLoader(data, batch_size=5)
    module = Toy(repeat)
    seen = []
    for _ in range(fits):  # a later fit: new loops, new result collections
        callback = Seen()
        trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0, callbacks=[callback], accelerator="cpu")
        trainer.fit(module, loader, loader)
        tested = trainer.validate(module, loader, verbose=False)
        seen.append((callback.rows, tested))
    return module, seen


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.filterwarnings("ignore")
def test_the_values_every_callback_sees_are_self_logs_bit_for_bit_over_several_fits():
    plain, plain_seen = _fit(repeat=False, fits=2)
    repeated, repeated_seen = _fit(repeat=True, fits=2)
    assert _same(plain_seen, repeated_seen)
    assert set().union(*(row[1] for row in plain_seen[0][0])) >= {"train/loss", "train/a", "val/loss", "val/mean", "val/acc",
                                                                  "val/int", "val/max", "val/found_batch"}
    # per fit: 3 epochs x (2 training batches x 3 names + 2 validation batches x 6 names), then a validation pass
    assert plain.lightning_calls == 2 * (3 * (2 * 3 + 2 * 6) + 2 * 6)
    # through RepeatLog, Lightning's own log runs at each name's first call in each result collection, and at every
    # call of the name whose batch size Lightning finds in the batch
    fit = 3 + 5 + 3 * 2
    validate = 5 + 2  # trainer.validate: a collection of its own
    assert repeated.lightning_calls == 2 * (fit + validate)


@pytest.mark.filterwarnings("ignore")
def test_a_call_with_other_arguments_goes_through_lightning_which_refuses_it():
    class Changing(Toy):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self._log("train/changing", loss, batch_size=1, prog_bar=self.global_step > 0)
            return loss

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(12, 3), torch.randint(0, 2, (12,))), batch_size=5)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu")
    with pytest.raises(Exception, match="twice in `training_step` with different arguments"):
        trainer.fit(Changing(repeat=True), loader, loader)


@pytest.mark.filterwarnings("ignore")
def test_a_lone_cora_run_logs_through_lightning_only_at_its_first_epoch(shared_data, monkeypatch):
    from harness.plan.spec import make_spec
    from harness.run.runner import execute
    from modules.lit.node_classification import NodeClassificationModule

    calls = []
    lightning_log = NodeClassificationModule.log

    def counted(self, name, *args, **kwargs):
        calls.append((self.current_epoch, self._current_fx_name, name))
        return lightning_log(self, name, *args, **kwargs)

    monkeypatch.setattr(NodeClassificationModule, "log", counted)
    record = execute(make_spec("cora", "softmax", 0, {"max_epochs": 12, "patience": 13}), data_root=str(shared_data))
    assert not record.error
    fitting = [(epoch, name) for epoch, fx, name in calls if fx != "test_step"]
    # epochs 0-7 measure the validation diagnostics, epoch 8 not: each name's first call goes through Lightning
    assert {epoch for epoch, _ in fitting} == {0}, fitting
    assert {"train/loss", "val/loss", "val/acc", "val/macro_f1"} <= {name for _, name in fitting}
