"""Transductive node classification: one full-graph step per epoch, masks pick the nodes that count."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from datamodules.evaluation import distributed_kwargs

from ..hosts.gat import GAT, graph_groups
from .attention_terms import (DivergenceWatch, diagnosed_validation, diagnostics, measured_if, mechanism_logs, schedule_point,
                              trace_aux_loss)
from .class_scores import class_scores, confusion_counts, confusion_rows
from .example_mean import ExampleMean
from .optimization import graph_adam, parameter_groups
from .repeat_log import RepeatLog


LOGGED = {"enable_graph": True}
"""How the graph host logs. Lightning's `log` stores a detached clone of every tensor it is given (a Metric's states
here are detached too), so nothing it logs here holds a graph; without enable_graph it detaches each value again
when it is logged and at every read of the logged values (four or five reads an epoch), which costs an op each and
changes nothing: ~20 ops of a ~330-op Cora epoch, each a dispatch on a GPU's host. The values are the same."""

ONE_VALUE = {**LOGGED, "batch_size": 1, "reduce_fx": "sum"}
"""How the graph host logs a tensor: once a training step or pass (the graph is the one batch), as a "sum", which adds
it to 0. A mean adds it times 1 to 0 and divides by 1, the same value, but keeps a count beside it that Lightning
resets with two ops every epoch; a training step's values are logged per step and never reduced at all."""


class NodeClassificationModule(L.LightningModule):
    kernel_lr_scale: float = 1.0
    """Learning-rate multiplier of the attention kernels' parameters (set by the task; lit/optimization.py)."""

    evaluated_at: tuple[int, int] | None = None
    """(step, epoch) of the weights a test pass evaluates (attention_terms.schedule_point)."""
    validation_measured: bool = True
    """Whether the last validation pass measured the mechanism diagnostics (attention_terms.diagnosed_validation):
    where it did not, the Trainer's callback metrics still hold an earlier pass's val/diag values, which History
    must not take for this epoch's."""

    def __init__(self, model: GAT, num_classes: int, *, lr: float, weight_decay: float):
        super().__init__()
        self._divergence = DivergenceWatch(read_with_validation=True)
        self.model = model
        self.lr, self.weight_decay = lr, weight_decay
        self.num_classes = num_classes
        self.val_loss = ExampleMean()
        self._logs = RepeatLog()
        """Every epoch logs the same names with the same arguments: after the first, without Lightning's set-up per call."""
        self._groups = None
        self._mask_nodes: dict[str, Tensor] = {}
        self._split_labels: dict[str, Tensor] = {}
        self._confusion_rows: dict = {}
        """Per split, what its confusion tables need of its targets alone (class_scores.confusion_rows), and under
        (split, "total") the table's sum, the split's size."""

    def __setattr__(self, name: str, value) -> None:
        # Lightning names the hook in progress on the module around every hook call (about 100 assignments a lone
        # Cora epoch); nn.Module's __setattr__ checks each value against Parameter, Module and buffer first (0.9 µs
        # an assignment, 0.1 here), where a string or None can only land in the instance dict, as here.
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def _forward(self, graph):
        """Class logits and the model's attention trace."""
        if self._groups is None or self._groups.num_nodes != graph.num_nodes:
            self._groups = graph_groups(graph.edge_index, graph.num_nodes)
            self._mask_nodes, self._split_labels, self._confusion_rows = {}, {}, {}
        trace = []
        return self.model(graph.x, self._groups, trace), trace

    def training_step(self, graph, batch_idx):
        logits, trace = self._forward(graph)
        nodes = self._nodes("train", graph.train_mask)
        task_loss = F.cross_entropy(logits[nodes], self._labels("train", graph, nodes))
        aux, aux_logs = trace_aux_loss(trace, self.global_step, self.current_epoch)
        loss = task_loss if aux is None else task_loss + aux
        self._divergence.update(loss, self, batch_idx)
        self._logs.log(self, "train/loss", loss, **ONE_VALUE)
        self._logs.log_dict(self, {**aux_logs, **diagnostics(trace), **mechanism_logs(trace, task_loss, self.global_step, self.current_epoch)},
                            **ONE_VALUE)
        return loss

    def _nodes(self, split: str, mask: Tensor) -> Tensor:
        """Indices of a split's nodes, found once per graph: indexing with the boolean mask finds them at every
        step, which on a GPU waits for the device (its output size depends on the data). The same rows in
        the same order, so the loss is bit-identical."""
        if split not in self._mask_nodes:
            self._mask_nodes[split] = mask.nonzero().squeeze(1)
        return self._mask_nodes[split]

    def _labels(self, split: str, graph, nodes: Tensor) -> Tensor:
        """The labels of `nodes` (the split's nodes this process scores), gathered once per graph with them: the
        same labels at every step, so a gather each step was an op for nothing."""
        if split not in self._split_labels:
            self._split_labels[split] = graph.y[nodes]
        return self._split_labels[split]

    def _evaluate(self, graph, split: str):
        # the test pass always measures: its values are the mechanism at the evaluated weights, which the rules read
        measured = split == "test" or diagnosed_validation(self.current_epoch)
        if split == "val":
            self.validation_measured = measured
        with measured_if(measured):
            logits, trace = self._forward(graph)
            nodes = self._own_share(self._nodes(split, getattr(graph, f"{split}_mask")))
            scored, target = logits[nodes], self._labels(split, graph, nodes)
            loss = F.cross_entropy(scored, target)
            logs = mechanism_logs(trace, loss, *schedule_point(self, split))
        if split not in self._confusion_rows:  # the split's targets are the same at every pass: their part once per graph
            self._confusion_rows[split] = confusion_rows(target, self.num_classes)
        counts = self._summed_over_ranks(confusion_counts(scored, target, self.num_classes, self._confusion_rows[split]))
        if split == "val":
            self._log_validation_loss(loss, len(nodes))
        else:  # tests run on one process (harness/run/distributed.py)
            self.log(f"{split}/loss", loss, batch_size=len(nodes), sync_dist=True)
        self._logs.log_dict(self, {f"{split}/{k}": v for k, v in logs.items()}, **ONE_VALUE)
        # One batch a pass (the whole graph), so the pass's value is this batch's: "sum" adds it to 0 and nothing
        # else, where a mean would multiply and divide it by the batch size (not bit-exact in float32).
        # the table counts the whole split's nodes, summed over the ranks' shares (its sum, kept as the rows are)
        examples = len(self._nodes(split, getattr(graph, f"{split}_mask")))
        if (split, "total") not in self._confusion_rows:
            self._confusion_rows[(split, "total")] = torch.tensor(examples, device=counts.device)
        # the row sums kept with the rows are this rank's share's: the summed table's only on one process
        trainer = getattr(self, "_trainer", None)
        true_counts = self._confusion_rows[split][1] if trainer is None or trainer.world_size == 1 else None
        scores = class_scores(counts, examples, self._confusion_rows[(split, "total")], true_counts)
        self._logs.log_dict(self, {f"{split}/{k}": v for k, v in scores.items()}, **ONE_VALUE)
        return trace

    def _log_validation_loss(self, loss: Tensor, examples: int) -> None:
        """val/loss as ExampleMean gives it: loss·n and n in float32, divided. On one process computed here, the same
        two float32 operations (the metric's sums start at 0, and 0 + loss·n is loss·n), and logged as the pass's one
        value: the metric's update, compute and reset cost a lone Cora epoch ~200 Python calls and 4 ops more.
        Data-parallel, the metric, which sums over the ranks' shares."""
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and trainer.world_size > 1:
            self.val_loss.update(loss, examples)
            self._logs.log(self, "val/loss", self.val_loss, **LOGGED)
            return
        count = self._confusion_rows.get(("val", "examples"))
        if count is None or count[0] != examples:  # made once per graph, as the confusion rows are
            count = self._confusion_rows[("val", "examples")] = (examples, torch.tensor(float(examples), device=loss.device))
        self._logs.log(self, "val/loss", (loss.detach().float() * examples) / count[1], **ONE_VALUE)

    def _summed_over_ranks(self, counts: Tensor) -> Tensor:
        """A confusion table over every rank's nodes (`_own_share`): the scores are those of the whole split."""
        trainer = getattr(self, "_trainer", None)
        if trainer is None or trainer.world_size == 1:
            return counts
        return trainer.strategy.reduce(counts, reduce_op="sum")

    def _own_share(self, nodes: Tensor) -> Tensor:
        """The nodes of a split that this process scores. The graph is one batch, so under DDP every rank gets it (its loader,
        datamodules/planetoid.WholeGraph, yields it on every rank) and runs the whole forward pass; each rank then scores every
        world-size-th masked node, so that the metrics synced over ranks count each node once."""
        kwargs = distributed_kwargs(getattr(self, "_trainer", None))
        if kwargs is None:
            return nodes
        return nodes[kwargs["rank"] :: kwargs["num_replicas"]]

    @property
    def divergence_watch(self) -> DivergenceWatch:
        """The training losses' divergence check, which the harness's read of the validation values takes into
        its transfer (DivergenceWatch.read_with_validation)."""
        return self._divergence

    def on_validation_start(self):
        # the training epoch's divergence check, before its validation or in the validation's read
        # (DivergenceWatch: not in a training step; nothing to read outside a fit)
        self._divergence.before_validation(self)

    def on_train_epoch_end(self):
        self._divergence.epoch_end(self)

    def validation_step(self, graph, batch_idx):
        try:
            self._evaluate(graph, "val")
        except Exception:
            # a diverged epoch's weights can make a kernel fail (a solver that does not converge on NaN): the
            # divergence, not the kernel's error, is what ended the run, as when it was checked before this pass
            self._divergence.check(self)
            raise

    def test_step(self, graph, batch_idx):
        trace = self._evaluate(graph, "test")
        self.log_dict({f"test/{k}": v for k, v in diagnostics(trace).items()}, batch_size=1)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        # what optimizer.zero_grad() does (set_to_none, torch's default), without the profiler mark torch's method
        # opens and closes around it: two ops a step, the step being the epoch on a graph
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                parameter.grad = None

    def configure_optimizers(self):
        # GAT's recipe (Adam with L2 on every host parameter); the kernels get their own group (optimization.py).
        groups = parameter_groups(
            self, lr=self.lr, weight_decay=self.weight_decay, kernel_lr_scale=self.kernel_lr_scale, decay_vectors=True
        )
        return graph_adam(groups, self.lr, self.device)
