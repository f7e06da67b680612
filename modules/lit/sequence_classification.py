"""Sentence(-pair) classification and regression on a BERT-style encoder whose attention is a variant.

Besides each task's official metrics, every classification task reports calibration (ECE, NLL), on each
of its evaluation sets. Stochastic variants (BAM) can average `mc_samples` predictive distributions at
evaluation, each drawn with the attention kernels, and nothing else, in sampling (training) mode.
"""

from __future__ import annotations

from typing import Sequence

import lightning as L
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import (
    BinaryF1Score,
    MulticlassAccuracy,
    MulticlassCalibrationError,
    MulticlassMatthewsCorrCoef,
)
from torchmetrics.regression import PearsonCorrCoef, SpearmanCorrCoef

from ..hosts.text_encoder import encode, kernels_of, mean_pool
from .attention_terms import DivergenceWatch, ValidationMechanism, diagnostics, mechanism_logs, sampling_kernels, test_logs, trace_aux_loss
from .example_mean import ExampleMean
from .optimization import WarmupAdamW

ECE_BINS = 15
"""Bins of the expected calibration error (Guo et al. 2017 use 15)."""


class NegativeLogLikelihood(MeanMetric):
    """Mean -log p(y | x) of predicted probabilities (torchmetrics has no classification NLL metric)."""

    def update(self, probs: Tensor, target: Tensor) -> None:  # type: ignore[override]
        picked = probs.gather(1, target.view(-1, 1)).squeeze(1)
        super().update(-picked.clamp_min(1e-12).log())


def task_metrics(names: Sequence[str], num_labels: int) -> MetricCollection:
    """The metrics a task reports, by short name; classification metrics take probabilities [B, C]."""
    factories = {
        "acc": lambda: MulticlassAccuracy(num_labels, average="micro"),
        "f1": BinaryF1Score,  # GLUE's F1 (MRPC, QQP) is the positive class's
        "mcc": lambda: MulticlassMatthewsCorrCoef(num_labels),
        "ece": lambda: MulticlassCalibrationError(num_labels, n_bins=ECE_BINS, norm="l1"),
        "nll": NegativeLogLikelihood,
        "pearson": PearsonCorrCoef,
        "spearman": SpearmanCorrCoef,
    }
    unknown = set(names) - set(factories)
    if unknown:
        raise ValueError(f"unknown text metric(s) {sorted(unknown)}; known: {sorted(factories)}")
    return MetricCollection({name: factories[name]() for name in names})


def update_metrics(metrics: MetricCollection, prediction: Tensor, labels: Tensor) -> None:
    for metric in metrics.values():
        if isinstance(metric, BinaryF1Score):
            metric.update(prediction[:, 1], labels)
        else:
            metric.update(prediction, labels)


class SequenceClassifier(nn.Module):
    """Encoder -> mean over real tokens -> dropout -> linear head (one output for regression).

    Mean pooling is how all-MiniLM-L6-v2 was trained; [CLS] pooling scored the same on RTE (58.8% dev
    both, 256 tokens, seed 0), so there is one pooling and no knob.
    """

    def __init__(self, encoder: nn.Module, num_labels: int, dropout: float):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.config.hidden_size, num_labels)

    def forward(self, batch: dict[str, Tensor], *, need_weights: bool = False):
        hidden, trace = encode(self.encoder, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], need_weights=need_weights)
        return self.head(self.dropout(mean_pool(hidden, batch["attention_mask"]))), trace

    def kernels(self):
        return kernels_of(self.encoder)


class SequenceClassificationModule(WarmupAdamW, L.LightningModule):
    def __init__(
        self,
        model: SequenceClassifier,
        *,
        num_labels: int,
        metric_names: Sequence[str],
        test_names: Sequence[str],
        lr: float,
        weight_decay: float,
        warmup_ratio: float,
        mc_samples: int = 1,
    ):
        super().__init__()
        self._divergence = DivergenceWatch()
        self.model = model
        self.num_labels = num_labels
        self.regression = num_labels == 1
        self.lr, self.weight_decay, self.warmup_ratio = lr, weight_decay, warmup_ratio
        self.mc_samples = mc_samples if any(k.stochastic for k in model.kernels()) else 1
        self.val_metrics = task_metrics(metric_names, max(num_labels, 2)).clone(prefix="val/")
        self.val_loss = ExampleMean()
        self.val_mechanism = ValidationMechanism()
        # The first evaluation set is the primary one: test/acc; the others test/<name>_acc.
        self.test_prefixes = ["test/"] + [f"test/{name}_" for name in list(test_names)[1:]]
        self.test_metrics = nn.ModuleList(task_metrics(metric_names, max(num_labels, 2)).clone(prefix=p) for p in self.test_prefixes)

    def _loss(self, output: Tensor, labels: Tensor) -> Tensor:
        if self.regression:
            return F.mse_loss(output.squeeze(-1), labels)
        return F.cross_entropy(output, labels)

    def training_step(self, batch, batch_idx):
        output, trace = self.model(batch)
        task_loss = self._loss(output, batch["labels"])
        aux, aux_logs = trace_aux_loss(trace, self.global_step, self.current_epoch)
        loss = task_loss if aux is None else task_loss + aux
        self._divergence.update(loss, self, batch_idx)
        batch_size = len(batch["labels"])
        self.log("train/loss", loss, batch_size=batch_size)
        self.log_dict({**aux_logs, **diagnostics(trace), **mechanism_logs(trace, task_loss, self.global_step, self.current_epoch)},
                      batch_size=batch_size)
        return loss

    def predict_batch(self, batch, *, need_weights: bool = False) -> tuple[Tensor, Tensor, list]:
        """(prediction, loss, attention trace): class probabilities [B, C], averaged over `mc_samples`
        sampled forward passes for stochastic variants, or the regression output [B]. `need_weights` makes
        fused kernels form the weights, for their diagnostics."""
        output, trace = self.model(batch, need_weights=need_weights)
        if self.regression:
            prediction = output.squeeze(-1)
            return prediction, F.mse_loss(prediction, batch["labels"]), trace
        probs = output.softmax(-1)
        if self.mc_samples > 1:
            with sampling_kernels(self.model.kernels()):
                for _ in range(self.mc_samples - 1):
                    probs = probs + self.model(batch)[0].softmax(-1)
            probs = probs / self.mc_samples
        return probs, F.nll_loss(probs.clamp_min(1e-12).log(), batch["labels"]), trace

    def on_validation_start(self):
        # the training epoch's divergence check, before its validation (DivergenceWatch: not in a training step;
        # nothing to read outside a fit)
        self._divergence.epoch_end(self)

    def on_train_epoch_end(self):
        self._divergence.epoch_end(self)

    def validation_step(self, batch, batch_idx):
        prediction, loss, trace = self.predict_batch(batch)
        update_metrics(self.val_metrics, prediction, batch["labels"])
        self.val_loss.update(loss, len(batch["labels"]))
        self.val_mechanism.update(self, trace, loss, len(batch["labels"]))

    def on_validation_epoch_end(self):
        self.log_dict({"val/loss": self.val_loss.compute(), **self.val_mechanism.compute_and_reset(), **self.val_metrics.compute()})
        self.val_loss.reset()
        self.val_metrics.reset()

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        prediction, loss, trace = self.predict_batch(batch, need_weights=dataloader_idx == 0)
        update_metrics(self.test_metrics[dataloader_idx], prediction, batch["labels"])
        batch_size = len(batch["labels"])
        prefix = self.test_prefixes[dataloader_idx]
        self.log(f"{prefix}loss", loss, batch_size=batch_size, add_dataloader_idx=False, sync_dist=True)
        if dataloader_idx == 0:
            self.log_dict(test_logs(self, trace, loss), batch_size=batch_size, add_dataloader_idx=False)

    def on_test_epoch_end(self):
        for metrics in self.test_metrics:
            self.log_dict(metrics.compute(), add_dataloader_idx=False)
            metrics.reset()
