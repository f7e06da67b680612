"""Transductive node classification: one full-graph step per epoch, masks pick the nodes that count."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from ..hosts.gat import GAT, graph_groups
from .attention_terms import check_finite, diagnostics, trace_aux_loss
from .optimization import parameter_groups


class NodeClassificationModule(L.LightningModule):
    kernel_lr_scale: float = 1.0
    """Learning-rate multiplier of the attention kernels' parameters (set by the task; lit/optimization.py)."""

    def __init__(self, model: GAT, num_classes: int, *, lr: float, weight_decay: float):
        super().__init__()
        self.model = model
        self.lr, self.weight_decay = lr, weight_decay
        metrics = MetricCollection(
            {"acc": MulticlassAccuracy(num_classes, average="micro"), "macro_f1": MulticlassF1Score(num_classes, average="macro")}
        )
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self._groups = None

    def _forward(self, graph):
        """Class logits and the model's attention trace."""
        if self._groups is None or self._groups.num_nodes != graph.num_nodes:
            self._groups = graph_groups(graph.edge_index, graph.num_nodes)
        trace = []
        return self.model(graph.x, self._groups, trace), trace

    def training_step(self, graph, batch_idx):
        logits, trace = self._forward(graph)
        loss = F.cross_entropy(logits[graph.train_mask], graph.y[graph.train_mask])
        aux, aux_logs = trace_aux_loss(trace, self.global_step, self.current_epoch)
        if aux is not None:
            loss = loss + aux
        check_finite(loss, self.current_epoch)
        self.log("train/loss", loss, batch_size=1)
        self.log_dict({**aux_logs, **diagnostics(trace)}, batch_size=1)
        return loss

    def _evaluate(self, graph, mask, metrics, prefix: str):
        logits, trace = self._forward(graph)
        loss = F.cross_entropy(logits[mask], graph.y[mask])
        metrics.update(logits[mask], graph.y[mask])
        self.log(f"{prefix}/loss", loss, batch_size=1, sync_dist=True)
        self.log_dict(metrics, batch_size=1)
        return trace

    def validation_step(self, graph, batch_idx):
        self._evaluate(graph, graph.val_mask, self.val_metrics, "val")

    def test_step(self, graph, batch_idx):
        trace = self._evaluate(graph, graph.test_mask, self.test_metrics, "test")
        self.log_dict({f"test/{k}": v for k, v in diagnostics(trace).items()}, batch_size=1)

    def configure_optimizers(self):
        # GAT's recipe (Adam with L2 on every host parameter); the kernels get their own group (optimization.py).
        groups = parameter_groups(
            self, lr=self.lr, weight_decay=self.weight_decay, kernel_lr_scale=self.kernel_lr_scale, decay_vectors=True
        )
        return torch.optim.Adam(groups, lr=self.lr)
