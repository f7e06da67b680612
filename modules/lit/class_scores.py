"""A node-classification split's accuracy and macro-F1 from one confusion table, nothing read on the host.

torchmetrics' MulticlassF1Score counts its confusion matrix with a bincount, whose output size is the largest
index (a GPU run waits for the device to learn it), and masks absent classes out of the macro mean by boolean
indexing (another wait); with its accuracy it also spends about 90 ops an epoch on a 7-class graph. Here the table
has a fixed size, so a GPU never stops for it, and the scores are torchmetrics' own float operations on the same
counts: the same values bit for bit (tests/modules/test_class_scores.py compares them on random predictions, with
classes absent from a split)."""

from __future__ import annotations

import torch
from torch import Tensor


def confusion_counts(logits: Tensor, target: Tensor, num_classes: int, rows: tuple[Tensor, ...] | None = None) -> Tensor:
    """[C, C] int64 counts of (true class, predicted class), the prediction being the argmax of `logits` [n, C]:
    the ones added at (target, prediction), three ops. `rows`: `confusion_rows(target, num_classes)` where the caller
    keeps it across calls for the same targets (a graph's split: its ones made once)."""
    ones = rows[0] if rows is not None else torch.ones_like(target)
    counts = torch.zeros(num_classes, num_classes, dtype=torch.long, device=logits.device)
    return counts.index_put_((target, logits.argmax(dim=1)), ones, accumulate=True)


def confusion_rows(target: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """What a confusion table needs of the targets alone: the ones `confusion_counts` adds, and the table's row sums
    (each class's true examples, `class_scores`' `true_counts`)."""
    ones = torch.ones_like(target)
    return ones, torch.zeros(num_classes, dtype=torch.long, device=target.device).index_add_(0, target, ones)


def class_scores(counts: Tensor, examples: int | None = None, total: Tensor | None = None,
                 true_counts: Tensor | None = None) -> dict[str, Tensor]:
    """{"acc": micro accuracy, "macro_f1": F1 averaged over the classes present} of a confusion table [C, C],
    as torchmetrics' MulticlassAccuracy(average="micro") and MulticlassF1Score(average="macro") compute them:

    - accuracy: correct / examples in float32, 0 without examples;
    - class c's F1: 2·tp / (2·tp + fp + fn) in float32, where 2·tp + fp + fn is the column plus the row sum of c,
      0 where that is 0 (a class neither true nor predicted);
    - the macro mean: each class's F1 divided by the number of classes present, then summed (torchmetrics divides
      before it sums), a class present when 2·tp + fp + fn > 0, i.e. tp + fp + fn > 0.

    Every count is an integer below 2^24, exact in float32, so the quotients are torchmetrics' to the bit; the
    zero guards clamp a zero denominator to 1 under a zero numerator instead of selecting, which gives the same 0.
    `examples`: the number of examples the table counts, where the caller knows it on the host; some example then
    makes both the table's sum and the number of classes present at least 1, and their guards are skipped (the
    same values: two ops fewer). `total`: the table's sum, counts.sum(), where the caller keeps it (a split's size as a
    0-dim int64 tensor on the table's device): the same quotient, one op fewer. `true_counts`: the table's row sums,
    counts.sum(1), where the caller keeps them (`confusion_rows`: a split's targets do not change): one op fewer."""
    some = examples is not None and examples > 0
    tp = counts.diagonal()
    spread = counts.sum(0) + (counts.sum(1) if true_counts is None else true_counts)  # 2·tp + fp + fn per class
    f1 = (2 * tp) / spread.clamp(min=1)
    present = (spread != 0).sum(-1, keepdim=True)
    macro_f1 = (f1 / (present if some else present.clamp(min=1))).sum(-1)
    if total is None:
        total = counts.sum()
    accuracy = tp.sum() / (total if some else total.clamp(min=1))
    return {"acc": accuracy, "macro_f1": macro_f1}
