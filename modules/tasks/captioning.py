"""coco-captions: caption images from frozen timm grid features with a transformer decoder whose every
attention (decoder self- and cross-attention, optional grid encoder) is the variant.

Reports CIDEr-D (primary), BLEU-4 and ROUGE-L of beam-search captions on the test images, after selecting
the epoch on greedy CIDEr-D on the validation images. METEOR is logged as `test/meteor` where Java runs,
but not declared: a leaderboard must not depend on which machines had Java.

The defaults are sized for the 239-image subset shipped offline (a smoke test: about 1-2 minutes on one CPU
thread); on the full Karpathy split, raise width, depth and epochs and use `image_weights=pretrained`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt, Interval

from datamodules import coco
from datamodules.image_features import WEIGHTS, ImageEncoderSpec, pretrained_weights_problem

from ..hosts.captioner import Captioner
from ..lit.captioning import CaptioningModule
from .base import Metric, Task, TrainParams, register_task, resolve_kernel_lr_scale


@dataclass(frozen=True)
class CaptionParams(TrainParams):
    backbone: str = "resnet18"
    """timm model giving the frozen image grid (resnet18 at 224 px: 7x7 cells of 512 channels)."""
    image_weights: str = "random"
    """"random" (fixed seed, offline) or "pretrained" (timm's ImageNet weights; needs them downloaded)."""
    image_size: Annotated[int, Ge(1)] = 224
    width: Annotated[int, Ge(1)] = 128
    heads: Annotated[int, Ge(1)] = 4
    depth: Annotated[int, Ge(1)] = 2
    """Decoder layers."""
    encoder_depth: Annotated[int, Ge(0)] = 0
    """Self-attention layers over the image grid before the decoder (0 = the projected features directly)."""
    dropout: Annotated[float, Interval(ge=0, lt=1)] = 0.1
    max_caption_words: Annotated[int, Ge(1)] = 16
    """Training captions are cut to this many words (Karpathy's preprocessing), and decoding stops after it."""
    min_word_count: Annotated[int, Ge(1)] = 2
    """Training-caption words seen fewer times become <unk> (5 on the full COCO training set is usual)."""
    max_vocab_size: Annotated[int | None, Ge(1)] = None
    batch_size: Annotated[int, Ge(1)] = 32
    lr: Annotated[float, Gt(0)] = 5e-4
    weight_decay: Annotated[float, Ge(0)] = 0.01
    warmup_ratio: Annotated[float, Interval(ge=0, le=1)] = 0.1
    label_smoothing: Annotated[float, Interval(ge=0, lt=1)] = 0.1
    beam_size: Annotated[int, Ge(1)] = 3
    """Beam width of the test captions; 1 = greedy."""
    length_penalty: Annotated[float, Ge(0)] = 0.0
    """Beam scores are log p / length**length_penalty (0 = plain log-probability)."""
    meteor: bool = True
    """Also log test/meteor when Java is available (its JVM start adds about 10 s to the test)."""
    karpathy_split: str | None = None
    """Path of Karpathy's dataset_coco.json (relative paths are tried under the data root first); None = a
    fixed random split of the images (SPLIT_SEED in datamodules/coco.py) with the two fractions below."""
    val_fraction: Annotated[float, Interval(gt=0, lt=1)] = 0.1
    test_fraction: Annotated[float, Interval(gt=0, lt=1)] = 0.1
    max_epochs: Annotated[int, Ge(1)] = 15
    patience: Annotated[int, Ge(0)] = 5
    kernel_lr_scale: Annotated[float | None, Gt(0)] = None
    """Learning-rate multiplier of the attention kernels' scalar knobs (their own parameter group; kernel
    sub-networks train with the host); None = KERNEL_LR / lr, i.e. the knobs train at 1e-2 whatever the
    host's rate (modules/lit/optimization.py says why)."""

    def __post_init__(self):
        resolve_kernel_lr_scale(self)
        if self.image_weights not in WEIGHTS:
            raise ValueError(f"image_weights must be one of {WEIGHTS}, got {self.image_weights!r}")
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if self.max_caption_words < 1 or self.min_word_count < 1:
            raise ValueError("max_caption_words and min_word_count must be >= 1")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


@register_task("coco-captions")
class CocoCaptionsTask(Task):
    Params = CaptionParams
    version = "1"
    metrics = (Metric("test/cider"), Metric("test/bleu4"), Metric("test/rouge_l"))
    monitor = Metric("val/cider")

    def data_problem(self, data_root, params=None):
        problem = coco.data_problem(data_root)
        if problem is None and params is not None and params.karpathy_split:
            try:
                coco.karpathy_split(coco.read_captions(data_root), params.karpathy_split, data_root)
            except coco.MissingDataError as exc:
                return str(exc)
        return problem

    def checkpoint_problem(self, params: CaptionParams | None = None) -> str | None:
        # Apart from data_problem: missing encoder weights block the runs, they do not make the data missing.
        return pretrained_weights_problem(params.backbone, params.image_weights) if params is not None else None

    def splits(self, params: CaptionParams, data_root) -> coco.CaptionSplits:
        items = coco.read_captions(data_root)
        if params.karpathy_split:
            return coco.karpathy_split(items, params.karpathy_split, data_root)
        return coco.random_split(items, params.val_fraction, params.test_fraction)

    def build(self, params: CaptionParams, attention, *, data_root, cache_dir):
        splits = self.splits(params, data_root)
        vocab = coco.build_vocabulary(splits.train, min_count=params.min_word_count, max_size=params.max_vocab_size)
        image_spec = ImageEncoderSpec(params.backbone, params.image_weights, params.image_size)
        datamodule = coco.CocoCaptionDataModule(
            splits, vocab, image_spec, max_words=params.max_caption_words, batch_size=params.batch_size, cache_dir=cache_dir
        )
        _, feature_dim = datamodule.feature_shape()
        model = Captioner(
            len(vocab), feature_dim, attention, pad_id=vocab.pad_id, bos_id=vocab.bos_id, eos_id=vocab.eos_id,
            width=params.width, heads=params.heads, depth=params.depth, encoder_depth=params.encoder_depth, dropout=params.dropout,
        )
        module = CaptioningModule(
            model, vocab, lr=params.lr, weight_decay=params.weight_decay, warmup_ratio=params.warmup_ratio,
            label_smoothing=params.label_smoothing, beam_size=params.beam_size, max_decode_words=params.max_caption_words,
            length_penalty=params.length_penalty, meteor=params.meteor,
        )
        module.kernel_lr_scale = params.kernel_lr_scale
        return datamodule, module
