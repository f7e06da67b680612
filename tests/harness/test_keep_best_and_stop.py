"""The lone runner's stopping callback: a Trainer stops at the epoch the task's rule says and ends with the
weights of the epoch the rule kept (a stub module logs a scripted sequence of validation metrics)."""

import lightning as L
import pytest
import torch

from harness.run.callbacks import KeepBestAndStop
from modules.tasks import Metric, get_task
from modules.tasks.stopping import GATRule, MonitorRule

# (val/loss, val/acc) per epoch. GAT's rule with patience 2: epoch 0 saves (both best); 1 loss best only;
# 2 accuracy best only; 3 both tie their bests: saves; 4, 5 neither: stops after epoch 5, keeps epoch 3.
# The val/loss-only rule would keep epoch 1 (its lowest loss) and stop after epoch 3.
SCRIPT = [(1.0, 0.5), (0.8, 0.4), (0.9, 0.6), (0.8, 0.6), (0.85, 0.55), (0.9, 0.5), (0.7, 0.9), (0.6, 0.9)]


class Scripted(L.LightningModule):
    def __init__(self, script=SCRIPT):
        super().__init__()
        self.script = script
        self.epoch_stamp = torch.nn.Parameter(torch.zeros(()))

    def training_step(self, batch, batch_idx):
        with torch.no_grad():  # the weights say which epoch they are from
            self.epoch_stamp.fill_(self.current_epoch)
        return (self.epoch_stamp * 0).sum() + batch.sum() * 0

    def validation_step(self, batch, batch_idx):
        loss, acc = self.script[self.current_epoch]
        self.log_dict({"val/loss": loss, "val/acc": acc}, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(rule, script=SCRIPT, callbacks=None):
    data = torch.utils.data.DataLoader(torch.zeros(1, 1), batch_size=1)
    keeper = KeepBestAndStop(rule, Metric("val/loss", higher_is_better=False)) if rule is not None else None
    module = Scripted(script)
    trainer = L.Trainer(max_epochs=len(script), logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=callbacks or [keeper])
    trainer.fit(module, data, data)
    return trainer, keeper, module


def test_gat_rule_stops_where_it_says_and_restores_the_epoch_it_saved():
    trainer, keeper, module = fit(GATRule(patience=2))
    assert trainer.current_epoch == 6  # epochs 0..5 ran
    assert keeper.best_epoch == 3 and module.epoch_stamp.item() == 3.0
    assert keeper.best_value == pytest.approx(0.8) and keeper.best_metrics["val/acc"] == pytest.approx(0.6)


def test_monitor_rule_keeps_the_lowest_loss_as_early_stopping_did():
    trainer, keeper, module = fit(MonitorRule("val/loss", higher_is_better=False, patience=2))
    assert trainer.current_epoch == 4  # epochs 0..3 ran
    assert keeper.best_epoch == 1 and module.epoch_stamp.item() == 1.0


def test_planetoid_tasks_stop_by_gats_rule_and_others_by_their_monitor():
    cora = get_task("cora")
    assert isinstance(cora.stopping_rule(cora.params({"patience": 7})), GATRule)
    assert cora.stopping_rule(cora.params({"patience": 7})).patience == 7
    sst2 = get_task("glue-sst2")
    rule = sst2.stopping_rule(sst2.params({"patience": 3}))
    assert isinstance(rule, MonitorRule) and rule.metric == sst2.monitor.name and rule.patience == 3


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("patience", [1, 3])
def test_monitor_rule_stops_at_the_epoch_lightnings_early_stopping_did(seed, patience):
    """Tasks other than the graph ones keep their old behaviour, so that their committed records stay valid:
    on random validation-loss sequences with ties and a NaN, the callback stops at the same epoch as the
    EarlyStopping it replaced, and keeps the epoch of the strictly lowest finite loss before it."""
    from lightning.pytorch.callbacks import EarlyStopping

    g = torch.Generator().manual_seed(seed)
    losses = (torch.randint(0, 6, (30,), generator=g).float() / 4).tolist()  # coarse values: ties happen
    if seed % 2:
        losses[int(torch.randint(5, 30, (1,), generator=g))] = float("nan")
    script = [(loss, 0.5) for loss in losses]
    lightning, _, _ = fit(None, script, [EarlyStopping("val/loss", patience=patience, mode="min", check_finite=True)])
    ours, keeper, module = fit(MonitorRule("val/loss", higher_is_better=False, patience=patience), script)
    assert ours.current_epoch == lightning.current_epoch
    ran = losses[:ours.current_epoch]
    finite = [(loss, epoch) for epoch, loss in enumerate(ran) if loss == loss]
    best = min(finite, key=lambda pair: pair[0])  # min keeps the first of equal values: strict improvement
    assert keeper.best_epoch == best[1] and module.epoch_stamp.item() == best[1]
