"""Early-stopping rules as plain state machines over per-epoch validation metrics.

One rule object per trained model: the lone runner wraps it in a Lightning callback, and a seed-batched
loop keeps one per seed, so both stop and keep their best epoch by the same decisions. They are written
here rather than taken from Lightning's EarlyStopping because GAT's rule watches two metrics at once
(below), which EarlyStopping cannot express, and because a batched loop needs the decision per seed
without a Trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Protocol


@dataclass(frozen=True)
class Decision:
    save: bool
    """This epoch's weights become the best ones (restored when training ends)."""
    stop: bool
    """Training ends after this epoch."""


class StoppingRule(Protocol):
    patience: int
    description: str
    """In words, for records and boards: which metrics decide and with what patience."""

    def update(self, metrics: Mapping[str, float]) -> Decision:
        """Feed one epoch's validation metrics; returns what to do with this epoch."""
        ...


class MonitorRule:
    """One monitored metric, Lightning's EarlyStopping semantics with min_delta 0: an epoch improves when it is
    strictly better than the best so far; `patience` epochs in a row without improvement stop training; a
    non-finite value never improves and stops at once (EarlyStopping's check_finite)."""

    def __init__(self, metric: str, higher_is_better: bool, patience: int):
        self.metric, self.higher_is_better, self.patience = metric, higher_is_better, patience
        self.best: float | None = None
        self.wait = 0

    @property
    def description(self) -> str:
        return f"best {self.metric} ({'highest' if self.higher_is_better else 'lowest'}), patience {self.patience}"

    def update(self, metrics: Mapping[str, float]) -> Decision:
        value = float(metrics[self.metric])
        if not math.isfinite(value):
            return Decision(save=False, stop=True)
        if self.best is None or (value > self.best if self.higher_is_better else value < self.best):
            self.best, self.wait = value, 0
            return Decision(save=True, stop=False)
        self.wait += 1
        return Decision(save=False, stop=self.wait >= self.patience)

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the rule (harness/results/checkpoints.py): plain numbers only."""
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: Mapping) -> None:
        self.best, self.wait = state["best"], int(state["wait"])


class GATRule:
    """GAT's own rule (Veličković et al. 2018, execute_cora.py of github.com/PetarV-/GAT): patience counts
    epochs in which neither validation accuracy rose to its best nor validation loss fell to its best
    (ties count as reaching it); the weights kept are those of the last epoch at which both were at their
    best at once. A non-finite loss never counts as reaching the best."""

    def __init__(self, patience: int, loss: str = "val/loss", accuracy: str = "val/acc"):
        self.patience, self.loss_name, self.accuracy_name = patience, loss, accuracy
        self.best_accuracy = 0.0
        self.best_loss = math.inf
        self.wait = 0

    @property
    def description(self) -> str:
        return (f"GAT's rule: patience {self.patience} on {self.loss_name} and {self.accuracy_name} together; "
                f"keeps the last epoch at which both were at their best")

    def update(self, metrics: Mapping[str, float]) -> Decision:
        loss, accuracy = float(metrics[self.loss_name]), float(metrics[self.accuracy_name])
        finite = math.isfinite(loss) and math.isfinite(accuracy)
        accuracy_best = finite and accuracy >= self.best_accuracy
        loss_best = finite and loss <= self.best_loss
        if accuracy_best or loss_best:
            save = accuracy_best and loss_best
            if finite:
                self.best_accuracy = max(accuracy, self.best_accuracy)
                self.best_loss = min(loss, self.best_loss)
            self.wait = 0
            return Decision(save=save, stop=False)
        self.wait += 1
        return Decision(save=False, stop=self.wait >= self.patience)

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the rule (harness/results/checkpoints.py): plain numbers only."""
        return {"best_accuracy": self.best_accuracy, "best_loss": self.best_loss, "wait": self.wait}

    def load_state_dict(self, state: Mapping) -> None:
        self.best_accuracy, self.best_loss, self.wait = float(state["best_accuracy"]), float(state["best_loss"]), int(state["wait"])
