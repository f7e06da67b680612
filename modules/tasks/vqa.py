"""vqa and easy-vqa: visual question answering with an MCAN co-attention host whose every attention is the variant.

Images are read through a frozen timm encoder (fixed random weights offline, ImageNet weights with
`image_weights=pretrained`), so every variant sees the same cached image features. The epoch is chosen
on a validation split, the test split is reported; see datamodules/vqa.py for the data layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from datamodules.image_features import ImageEncoderSpec, pretrained_weights_problem
from datamodules.vqa import (
    VQADataModule,
    VQASplits,
    answer_vocabulary,
    easy_vqa_problem,
    read_easy_vqa,
    read_vqa,
    subsample,
    vqa_problem,
)

from ..hosts.mcan import MCAN
from ..lit.vqa import VQAModule
from .base import Metric, Task, TrainParams, TrivialBaseline, register_task, resolve_kernel_lr_scale

DATASETS = ("vqa-v2", "easy-vqa")


@dataclass(frozen=True)
class VQAParams(TrainParams):
    dataset: str = "vqa-v2"
    """Which reader: VQA v2 JSON files under the data root, or the easy-vqa package."""
    vqa_dir: str = "vqa"
    """VQA v2 folder relative to the data root (subset or official layout, datamodules/vqa.py)."""
    backbone: str = "resnet18"
    """timm model of the frozen image encoder."""
    image_weights: str = "random"
    """random (fixed seed, offline) or pretrained (timm's ImageNet weights)."""
    image_size: Annotated[int, Ge(1)] = 224
    stage: int = -1
    """Encoder stage whose grid is the image tokens (-1 = the last, stride 32)."""
    width: Annotated[int, Ge(1)] = 128
    heads: Annotated[int, Ge(1)] = 4
    depth: Annotated[int, Ge(1)] = 2
    """SA layers on the question and as many SGA layers on the image."""
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.1
    lr: Annotated[float, Gt(0)] = 1e-3
    weight_decay: Annotated[float, Ge(0)] = 0.01
    warmup_ratio: Annotated[float, Interval(ge=0, le=1)] = 0.1
    batch_size: Annotated[int, Ge(1)] = 64
    max_question_words: Annotated[int, Ge(1)] = 14
    """Words kept per question (MCAN keeps 14)."""
    top_k_answers: Annotated[int, Ge(1)] = 3129
    """Answer vocabulary: the most frequent training answers (3129 is MCAN's VQA v2 vocabulary size)."""
    val_fraction: Annotated[float, Interval(gt=0, lt=1)] = 0.1
    """Part of the training images held out for model selection where the data has no validation split."""
    max_train_examples: Annotated[int | None, Ge(1)] = None
    """Train on a fixed random subset of this many questions (None = all), for budgets that fit a CPU."""
    max_eval_examples: Annotated[int | None, Ge(1)] = None
    """Validate and test on fixed random subsets of this many questions (None = all)."""
    mc_samples: Annotated[int, Ge(1)] = 1
    """Predictions averaged at evaluation for stochastic variants (BAM); 1 = one deterministic pass."""
    pavpu_threshold: Annotated[float, Interval(ge=0, le=1)] = 0.5
    """PAvPU calls a prediction certain when its predictive entropy is below this many nats (0.5: about an
    80/20 split between two answers; a 50/50 split, 0.69 nats, is uncertain)."""
    max_epochs: Annotated[int, Ge(1)] = 13
    """MCAN trains 13 epochs."""
    patience: Annotated[int, Ge(0)] = 3
    kernel_lr_scale: Annotated[float | None, Gt(0)] = None
    """Learning-rate multiplier of the attention kernels' scalar knobs (their own parameter group; kernel
    sub-networks train with the host); None = KERNEL_LR / lr, i.e. the knobs train at 1e-2 whatever the
    host's rate (modules/lit/optimization.py says why)."""

    def __post_init__(self):
        resolve_kernel_lr_scale(self)
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {self.dataset!r}")
        if self.mc_samples < 1:
            raise ValueError(f"mc_samples must be >= 1, got {self.mc_samples}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.top_k_answers < 2:
            raise ValueError(f"top_k_answers must be at least 2, got {self.top_k_answers}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")


@register_task("vqa", dataset="vqa-v2")
@register_task(
    "easy-vqa", dataset="easy-vqa", image_size=64, stage=2, width=64, depth=1, max_train_examples=12000,
    max_epochs=4, patience=2, lr=2e-3,
)
class VQATask(Task):
    """VQA v2 (`vqa`) or easy-vqa (`easy-vqa`: defaults sized for a CPU suite; frozen random resnet18
    features of the stride-8 stage (8x8x128) at 64x64 px keep colour and shape: softmax reached 78.3% test
    accuracy in 118 s on one AMD EPYC thread, features cached, 4 epochs of ~26 s)."""

    Params = VQAParams
    version = "1"
    metrics = (Metric("test/vqa_acc"), Metric("test/ece", higher_is_better=False), Metric("test/nll", higher_is_better=False),
               Metric("test/pavpu"))
    monitor = Metric("val/vqa_acc")

    def data_problem(self, data_root, params=None):
        if self.preset["dataset"] == "easy-vqa":
            return easy_vqa_problem()
        vqa_dir = params.vqa_dir if params is not None else self.preset.get("vqa_dir", VQAParams.vqa_dir)
        return vqa_problem(data_root, vqa_dir)

    def checkpoint_problem(self, params: VQAParams | None = None) -> str | None:
        # Apart from data_problem: missing encoder weights block the runs, they do not make the data missing
        # (a dry run still lists the runs, and boards keep the trivial baseline the data gives).
        return pretrained_weights_problem(params.backbone, params.image_weights) if params is not None else None

    def splits(self, params: VQAParams, data_root) -> VQASplits:
        if params.dataset == "easy-vqa":
            splits = read_easy_vqa(val_fraction=params.val_fraction)
        else:
            splits = read_vqa(data_root, params.vqa_dir, val_fraction=params.val_fraction)
        splits.train = subsample(splits.train, params.max_train_examples)
        splits.val = subsample(splits.val, params.max_eval_examples, salt=2)
        splits.test = subsample(splits.test, params.max_eval_examples, salt=3)
        return splits

    def trivial_baseline(self, params: VQAParams, data_root) -> TrivialBaseline:
        """The answer prior of the training questions (human answers counted, over the answer vocabulary),
        predicted for every test question: always the most frequent answer. Each metric as modules/lit/vqa.py
        defines it; written out here because a constant prediction makes them one-liners (ECE has one bin)."""
        splits = self.splits(params, data_root)
        vocabulary = answer_vocabulary(splits.train, params.top_k_answers)
        counts = dict.fromkeys(vocabulary, 0)
        for e in splits.train:
            for (answer, _), humans in zip(e.scores, e.humans):
                if answer in counts:
                    counts[answer] += humans
        total = sum(counts.values())
        prior = {a: c / total for a, c in counts.items()}
        guess = vocabulary[0]
        index = {a: i for i, a in enumerate(vocabulary)}
        scores = [dict(e.scores).get(guess, 0.0) for e in splits.test]
        # the reference answer of ECE and NLL: the best-scored in-vocabulary answer, ties to the lower vocabulary id
        tops = [min((a for a, _ in e.scores if a in index), key=lambda a: (-dict(e.scores)[a], index[a]), default=None) for e in splits.test]
        known = [t for t in tops if t is not None]
        entropy = -sum(p * math.log(p) for p in prior.values() if p > 0)
        accurate = [score >= 0.5 for score in scores]  # modules/lit/vqa.py ACCURATE_SCORE
        certain = entropy < params.pavpu_threshold
        values = {
            "test/vqa_acc": sum(scores) / len(scores),
            "test/ece": abs(sum(t == guess for t in known) / len(known) - prior[guess]) if known else None,
            "test/nll": sum(-math.log(max(prior[t], 1e-12)) for t in known) / len(known) if known else None,
            "test/pavpu": sum(a == certain for a in accurate) / len(accurate),
        }
        # Where every test answer scores 0 or 1 (easy-vqa: one answer per question), VQA accuracy is a fraction of
        # correct answers, and one seed can be tested against it with a binomial test.
        binary = all(score in (0.0, 1.0) for e in splits.test for _, score in e.scores)
        return TrivialBaseline(f"the most frequent training answer for every question ({guess!r}, {prior[guess]:.1%} of training answers)",
                               values, {"test/vqa_acc": len(splits.test)} if binary else {})

    def build(self, params: VQAParams, attention, *, data_root, cache_dir):
        splits = self.splits(params, data_root)
        spec = ImageEncoderSpec(params.backbone, params.image_weights, params.image_size, params.stage)
        datamodule = VQADataModule(splits, spec, top_k_answers=params.top_k_answers, max_question_words=params.max_question_words,
                                   batch_size=params.batch_size, cache_dir=cache_dir)
        features = datamodule.features()
        side = round(features.shape[1] ** 0.5)
        if side * side != features.shape[1]:
            raise ValueError(f"image grid of {features.shape[1]} tokens is not square; use a square image_size")
        model = MCAN(
            attention, vocab_size=len(datamodule.vocab), image_channels=features.shape[2], grid_size=(side, side),
            num_answers=datamodule.num_answers, width=params.width, heads=params.heads, depth=params.depth, dropout=params.dropout,
        )
        module = VQAModule(model, num_answers=datamodule.num_answers, lr=params.lr, weight_decay=params.weight_decay,
                           warmup_ratio=params.warmup_ratio, mc_samples=params.mc_samples, pavpu_threshold=params.pavpu_threshold)
        module.kernel_lr_scale = params.kernel_lr_scale
        return datamodule, module
