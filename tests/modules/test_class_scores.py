"""The node-classification scores equal torchmetrics' (the values the committed Cora records were logged with)."""

from __future__ import annotations

import torch
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from modules.lit.class_scores import class_scores, confusion_counts


def _torchmetrics(logits, target, num_classes):
    acc = MulticlassAccuracy(num_classes, average="micro")
    f1 = MulticlassF1Score(num_classes, average="macro")
    acc.update(logits, target)
    f1.update(logits, target)
    return acc.compute(), f1.compute()


def test_scores_equal_torchmetrics_bit_for_bit_on_random_predictions():
    generator = torch.Generator().manual_seed(0)
    for trial in range(300):
        num_classes = int(torch.randint(2, 12, (), generator=generator))
        n = int(torch.randint(1, 400, (), generator=generator))
        # a few classes only, some trials: classes absent from the split's targets, or never predicted, or both
        used = int(torch.randint(1, num_classes + 1, (), generator=generator))
        target = torch.randint(0, used, (n,), generator=generator)
        logits = torch.randn(n, num_classes, generator=generator)
        if trial % 3 == 0:
            logits[:, used:] -= 100.0  # the absent classes are never predicted either
        scores = class_scores(confusion_counts(logits, target, num_classes))
        acc, f1 = _torchmetrics(logits, target, num_classes)
        assert scores["acc"].dtype == acc.dtype and scores["macro_f1"].dtype == f1.dtype
        assert scores["acc"].shape == acc.shape and scores["macro_f1"].shape == f1.shape
        assert torch.equal(scores["acc"], acc), (trial, scores["acc"], acc)
        assert torch.equal(scores["macro_f1"], f1), (trial, scores["macro_f1"], f1)


def test_empty_split_scores_zero():
    """torchmetrics refuses an empty batch (its argmax); its reductions give 0 on all-zero counts, and so does this."""
    scores = class_scores(confusion_counts(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 4))
    assert float(scores["acc"]) == 0.0 and float(scores["macro_f1"]) == 0.0


def test_counts_are_the_confusion_matrix():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 4.0]])
    target = torch.tensor([0, 1, 2, 2])
    counts = confusion_counts(logits, target, 3)
    assert counts.tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]


def test_no_host_read():
    """What torchmetrics read on the host (its bincount, the boolean index over absent classes) is not read here."""
    from tests.modules.host_syncs import HostSyncs

    logits, target = torch.randn(50, 7), torch.randint(0, 5, (50,))
    with HostSyncs() as syncs:
        class_scores(confusion_counts(logits, target, 7))
    assert syncs.count == 0, syncs.where


def test_known_example_counts_and_kept_target_rows_give_the_same_scores():
    """The graph host's form (the split's size known on the host, its targets' rows kept across passes): bit for bit."""
    from modules.lit.class_scores import confusion_rows

    generator = torch.Generator().manual_seed(5)
    for n, num_classes in ((1, 3), (37, 7), (200, 5)):
        logits, target = torch.randn(n, num_classes, generator=generator), torch.randint(0, num_classes, (n,), generator=generator)
        counts = confusion_counts(logits, target, num_classes)
        assert torch.equal(confusion_counts(logits, target, num_classes, confusion_rows(target, num_classes)), counts)
        plain = class_scores(counts)
        rows = confusion_rows(target, num_classes)
        for known in (class_scores(counts, n), class_scores(counts, n, torch.tensor(n)), class_scores(counts, n, torch.tensor(n), rows[1])):
            assert all(torch.equal(plain[k], known[k]) and plain[k].dtype == known[k].dtype for k in plain)
    empty = class_scores(confusion_counts(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 4), 0)
    assert float(empty["acc"]) == 0.0 and float(empty["macro_f1"]) == 0.0
