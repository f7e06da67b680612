"""Training and evaluation of a VQA host (MCAN) whose attention is a variant.

Loss: MCAN's, binary cross-entropy with logits against the soft VQA scores of every answer (summed over
answers, averaged over questions). The predictive distribution over answers that the uncertainty
metrics read is the softmax of those logits, averaged over `mc_samples` sampled passes for stochastic
variants (the attention kernels, and nothing else, in sampling mode).

Reported on test: VQA accuracy (primary), exact-match accuracy against the most common human answer,
ECE and NLL of the predictive distribution against that answer, PAvPU, and attention diagnostics.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric, Metric, MetricCollection
from torchmetrics.classification import MulticlassCalibrationError

from ..hosts.mcan import MCAN
from .attention_terms import DivergenceWatch, ValidationMechanism, mechanism_logs, sampling_kernels, test_logs, trace_aux_loss
from .example_mean import ExampleMean
from .optimization import WarmupAdamW

ECE_BINS = 15
"""Bins of the expected calibration error (Guo et al. 2017 use 15)."""
ACCURATE_SCORE = 0.5
"""PAvPU counts a prediction as accurate when its VQA score is at least this: at least two of the ten
humans gave it (2/3), not a single annotator's outlier (1/3)."""
NO_ANSWER = -1
"""Class index of a question none of whose human answers is in the answer vocabulary."""


def top_answer(target: Tensor) -> Tensor:
    """Index of the best-scored human answer of each question [B], NO_ANSWER where all scores are 0."""
    best, index = target.max(dim=1)
    return torch.where(best > 0, index, torch.full_like(index, NO_ANSWER))


class VQAAccuracy(Metric):
    """Mean VQA score of the predicted answers: min(#humans who gave the answer / 3, 1)."""

    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("score", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, prediction: Tensor, target: Tensor) -> None:
        """prediction: answer indices [B] or answer scores [B, A]; target: soft VQA scores [B, A]."""
        answer = prediction.argmax(dim=1) if prediction.dim() == 2 else prediction
        self.score += target.gather(1, answer.long().view(-1, 1)).sum().double()
        self.count += answer.numel()

    def compute(self) -> Tensor:
        return (self.score / self.count.clamp_min(1)).float()


class PAvPU(Metric):
    """Patch accuracy versus patch uncertainty (Mukhoti & Gal 2018) per question, as the BAM paper reports
    for VQA: (n_accurate_certain + n_inaccurate_uncertain) / n. Uncertainty is the predictive entropy;
    a prediction is certain when its entropy is below `threshold` nats, and accurate when its VQA score is
    at least ACCURATE_SCORE. The threshold is absolute rather than a fraction of log(#answers): most
    questions hesitate between a few answers (yes/no: at most log 2 = 0.69 nats) whether the vocabulary
    holds 13 answers or 3129; at half of log 13 nearly every easy-vqa prediction counted as certain and
    PAvPU equalled accuracy (measured)."""

    higher_is_better = True
    full_state_update = False

    def __init__(self, threshold: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        if not threshold > 0:
            raise ValueError(f"the PAvPU entropy threshold is in nats and must be positive, got {threshold}")
        self.threshold = threshold
        for name in ("accurate_certain", "inaccurate_uncertain", "count"):
            self.add_state(name, default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, probs: Tensor, target: Tensor) -> None:
        """probs: predictive distribution [B, A]; target: soft VQA scores [B, A]."""
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=1)
        certain = entropy < self.threshold
        accurate = target.gather(1, probs.argmax(dim=1, keepdim=True)).squeeze(1) >= ACCURATE_SCORE
        self.accurate_certain += (accurate & certain).sum()
        self.inaccurate_uncertain += (~accurate & ~certain).sum()
        self.count += probs.shape[0]

    def compute(self) -> Tensor:
        return (self.accurate_certain + self.inaccurate_uncertain).float() / self.count.clamp_min(1)


class TopAnswerNLL(MeanMetric):
    """Mean -log p(most common human answer) over questions whose answer is in the vocabulary."""

    def update(self, probs: Tensor, target: Tensor) -> None:  # type: ignore[override]
        answer = top_answer(target)
        known = answer != NO_ANSWER
        picked = probs[known].gather(1, answer[known].view(-1, 1)).squeeze(1)
        if picked.numel():
            super().update(-picked.clamp_min(1e-12).log())


class TopAnswerAccuracy(MeanMetric):
    """Exact match of the predicted answer with the most common human answer (0 where it is out of vocabulary)."""

    def update(self, probs: Tensor, target: Tensor) -> None:  # type: ignore[override]
        super().update((probs.argmax(dim=1) == top_answer(target)).float())


class TopAnswerCalibrationError(MulticlassCalibrationError):
    """Multiclass ECE of the predictive distribution against the most common human answer (torchmetrics'
    top-label ECE); questions without an in-vocabulary answer are left out."""

    def __init__(self, num_answers: int):
        super().__init__(num_answers, n_bins=ECE_BINS, norm="l1", ignore_index=NO_ANSWER)

    def update(self, probs: Tensor, target: Tensor) -> None:  # type: ignore[override]
        super().update(probs, top_answer(target))


def vqa_metrics(num_answers: int, pavpu_threshold: float, *, full: bool) -> MetricCollection:
    metrics = {"vqa_acc": VQAAccuracy()}
    if full:
        metrics.update(acc=TopAnswerAccuracy(), ece=TopAnswerCalibrationError(num_answers), nll=TopAnswerNLL(),
                       pavpu=PAvPU(pavpu_threshold))
    return MetricCollection(metrics)


class VQAModule(WarmupAdamW, L.LightningModule):
    def __init__(self, model: MCAN, *, num_answers: int, lr: float, weight_decay: float, warmup_ratio: float,
                 mc_samples: int = 1, pavpu_threshold: float = 0.5):
        super().__init__()
        self._divergence = DivergenceWatch()
        self.model = model
        self.lr, self.weight_decay, self.warmup_ratio = lr, weight_decay, warmup_ratio
        self.mc_samples = mc_samples if any(k.stochastic for k in model.kernels()) else 1
        self.val_metrics = vqa_metrics(num_answers, pavpu_threshold, full=False).clone(prefix="val/")
        self.val_loss = ExampleMean()
        self.val_mechanism = ValidationMechanism()
        self.test_metrics = vqa_metrics(num_answers, pavpu_threshold, full=True).clone(prefix="test/")

    def forward(self, batch: dict[str, Tensor], trace=None, *, need_weights: bool = False) -> Tensor:
        return self.model(batch["question"], batch["question_valid"], batch["image"], trace, need_weights=need_weights)

    @staticmethod
    def loss(logits: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(logits, target, reduction="sum") / len(target)

    def training_step(self, batch, batch_idx):
        trace = []
        task_loss = self.loss(self(batch, trace), batch["target"])
        aux, aux_logs = trace_aux_loss(trace, self.global_step, self.current_epoch)
        loss = task_loss if aux is None else task_loss + aux
        self._divergence.update(loss, self, batch_idx)
        batch_size = len(batch["target"])
        self.log("train/loss", loss, batch_size=batch_size)
        self.log_dict({**aux_logs, **mechanism_logs(trace, task_loss, self.global_step, self.current_epoch)}, batch_size=batch_size)
        return loss

    def predict_batch(self, batch, *, need_weights: bool = False) -> tuple[Tensor, Tensor, list]:
        """(answer distribution [B, A] averaged over `mc_samples` sampled passes, loss of the first pass,
        its attention trace). `need_weights` makes fused kernels form the weights, for their diagnostics."""
        trace = []
        logits = self(batch, trace, need_weights=need_weights)
        probs = logits.softmax(-1)
        if self.mc_samples > 1:
            with sampling_kernels(self.model.kernels()):
                for _ in range(self.mc_samples - 1):
                    probs = probs + self(batch).softmax(-1)
            probs = probs / self.mc_samples
        return probs, self.loss(logits, batch["target"]), trace

    def on_validation_start(self):
        # the training epoch's divergence check, before its validation (DivergenceWatch: not in a training step;
        # nothing to read outside a fit)
        self._divergence.epoch_end(self)

    def on_train_epoch_end(self):
        self._divergence.epoch_end(self)

    def validation_step(self, batch, batch_idx):
        probs, loss, trace = self.predict_batch(batch)
        self.val_metrics.update(probs, batch["target"])
        self.val_loss.update(loss, len(probs))
        self.val_mechanism.update(self, trace, loss, len(probs))

    def on_validation_epoch_end(self):
        self.log_dict({"val/loss": self.val_loss.compute(), **self.val_mechanism.compute_and_reset(), **self.val_metrics.compute()})
        self.val_loss.reset()
        self.val_metrics.reset()

    def test_step(self, batch, batch_idx):
        probs, loss, trace = self.predict_batch(batch, need_weights=True)
        self.test_metrics.update(probs, batch["target"])
        batch_size = len(probs)
        self.log("test/loss", loss, batch_size=batch_size, sync_dist=True)
        self.log_dict(test_logs(self, trace, loss), batch_size=batch_size)

    def on_test_epoch_end(self):
        self.log_dict(self.test_metrics.compute())
        self.test_metrics.reset()
