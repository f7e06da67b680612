"""COCO-format image captions: splits, a training-only vocabulary, cached token ids and image grid features.

Expected layout under the data root::

    coco/captions.json   COCO caption annotations (info, images[].{id, file_name}, annotations[].{image_id, caption})
    coco/images/*.jpg    every images[].file_name of captions.json

Splits are Karpathy's (`dataset_coco.json`: images[].{cocoid, filename, split}, restval joining train)
when a split file is given, otherwise a fixed random split of the image ids (SPLIT_SEED, independent of the
run seed, so every variant and seed sees the same images). Training items are (image, caption) pairs;
evaluation items are images with all their reference captions, which is what caption metrics score against.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.image_features import ImageEncoderSpec, cached_grid_features

from .evaluation import unrepeated
from .paths import MissingDataError
from .paths import cache_dir as resolve_cache_dir
from .paths import load_or_build
from .paths import data_root as resolve_data_root
from .vocab import Vocabulary, pad_sequences

FOLDER = "coco"
ANNOTATIONS = "captions.json"
IMAGES = "images"
SPLIT_SEED = 20240229
"""Seed of the random image split when no Karpathy split is given; fixed, not the run seed."""
KARPATHY_TRAIN = ("train", "restval")
LAYOUT = (
    f"expected {FOLDER}/{ANNOTATIONS} (COCO caption format: images[].{{id, file_name}}, annotations[].{{image_id, caption}}) "
    f"and {FOLDER}/{IMAGES}/ holding every images[].file_name, under the data root (--data-root or $ATTNBENCH_DATA)"
)


@dataclass(frozen=True)
class CaptionedImage:
    image_id: int
    path: Path
    captions: tuple[str, ...]


@dataclass
class CaptionSplits:
    train: list[CaptionedImage]
    val: list[CaptionedImage]
    test: list[CaptionedImage]

    def __iter__(self):
        return iter((("train", self.train), ("val", self.val), ("test", self.test)))


def coco_folder(root: str | Path | None) -> Path:
    resolved = resolve_data_root(root)
    if resolved is None:
        raise MissingDataError(f"no data root is set for COCO captions (they are never downloaded); {LAYOUT}")
    return resolved / FOLDER


def data_problem(root: str | Path | None) -> str | None:
    """None when the caption folder can be read; otherwise what is missing and the layout to provide."""
    try:
        read_captions(root)
    except MissingDataError as exc:
        return str(exc)
    return None


def read_captions(root: str | Path | None) -> list[CaptionedImage]:
    """Every captioned image of `<root>/coco`, ordered by image id; MissingDataError naming what is absent."""
    folder = coco_folder(root)
    annotations, images = folder / ANNOTATIONS, folder / IMAGES
    if not annotations.is_file():
        raise MissingDataError(f"missing {annotations}; {LAYOUT}")
    if not images.is_dir():
        raise MissingDataError(f"missing image folder {images}; {LAYOUT}")
    from pycocotools.coco import COCO

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
            coco = COCO(str(annotations))
    except (AssertionError, ValueError, KeyError, TypeError) as exc:  # pycocotools asserts on a non-dict file
        raise MissingDataError(f"{annotations} is not a COCO caption file ({type(exc).__name__}: {exc}); {LAYOUT}") from exc
    items = []
    for image_id in sorted(coco.imgs):
        captions = tuple(a["caption"] for a in coco.imgToAnns.get(image_id, []))
        if captions:
            items.append(CaptionedImage(int(image_id), images / coco.imgs[image_id]["file_name"], captions))
    if not items:
        raise MissingDataError(f"{annotations} has no captioned images; {LAYOUT}")
    missing = [str(item.path) for item in items if not item.path.is_file()]
    if missing:
        raise MissingDataError(f"{len(missing)} image(s) listed in {annotations} are missing, e.g. {missing[:3]}; {LAYOUT}")
    return items


def random_split(items: Sequence[CaptionedImage], val_fraction: float, test_fraction: float) -> CaptionSplits:
    """A fixed random split of the images (seeded with SPLIT_SEED whatever the run seed)."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(f"val_fraction and test_fraction must be in (0, 1) with a sum below 1, got {val_fraction} and {test_fraction}")
    order = list(range(len(items)))
    random.Random(SPLIT_SEED).shuffle(order)
    n_val, n_test = max(1, round(val_fraction * len(items))), max(1, round(test_fraction * len(items)))
    if n_val + n_test >= len(items):
        raise ValueError(f"{len(items)} images are too few for a train/val/test split")
    val, test = set(order[:n_val]), set(order[n_val : n_val + n_test])
    return CaptionSplits(
        train=[x for i, x in enumerate(items) if i not in val and i not in test],
        val=[x for i, x in enumerate(items) if i in val],
        test=[x for i, x in enumerate(items) if i in test],
    )


def karpathy_split(items: Sequence[CaptionedImage], split_file: str | Path, root: str | Path | None = None) -> CaptionSplits:
    """Splits from a Karpathy `dataset_coco.json` (restval joins train). A relative path is looked up under
    the data root first. Images of the caption folder that the file does not list are left out."""
    path = Path(split_file).expanduser()
    resolved_root = resolve_data_root(root)
    if not path.is_absolute() and resolved_root is not None and (resolved_root / path).is_file():
        path = resolved_root / path
    if not path.is_file():
        raise MissingDataError(f"missing Karpathy split file {path}; give the path of dataset_coco.json "
                               "(images[].{cocoid, filename, split}) with --set karpathy_split=PATH, or leave it unset for a random split")
    try:
        entries = json.loads(path.read_text())["images"]
        by_id = {int(e["cocoid"]): e["split"] for e in entries if "cocoid" in e}
        by_name = {Path(e["filename"]).name: e["split"] for e in entries if "filename" in e}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise MissingDataError(f"{path} is not a Karpathy split file ({type(exc).__name__}: {exc}); "
                               "expected images[].{cocoid, filename, split} as in dataset_coco.json") from exc
    splits = CaptionSplits([], [], [])
    for item in items:
        split = by_id.get(item.image_id, by_name.get(item.path.name))
        if split in KARPATHY_TRAIN:
            splits.train.append(item)
        elif split in ("val", "test"):
            getattr(splits, split).append(item)
    empty = [name for name, part in splits if not part]
    if empty:
        raise MissingDataError(f"the Karpathy split {path} leaves no images of the caption folder in {empty}; "
                               "is it the split file of this COCO release?")
    return splits


def build_vocabulary(train: Sequence[CaptionedImage], *, min_count: int, max_size: int | None = None) -> Vocabulary:
    """Words of the training captions only, so that nothing about val/test text leaks into the model."""
    return Vocabulary.build((c for item in train for c in item.captions), min_count=min_count, max_size=max_size)


@dataclass
class EncodedCaptions:
    """Token ids (<bos> words <eos>) of every caption of a split, flat with offsets; caption c belongs to
    image row `owner[c]` of the split."""

    ids: Tensor
    offsets: Tensor
    owner: Tensor

    def caption(self, c: int) -> Tensor:
        return self.ids[self.offsets[c] : self.offsets[c + 1]]

    def of_image(self, row: int) -> list[Tensor]:
        # Captions are stored image by image, so `owner` is sorted and an image's captions are one range.
        first, end = (int(torch.searchsorted(self.owner, row, right=right)) for right in (False, True))
        return [self.caption(c) for c in range(first, end)]

    def __len__(self) -> int:
        return len(self.owner)

    @classmethod
    def build(cls, items: Sequence[CaptionedImage], vocab: Vocabulary, max_words: int) -> "EncodedCaptions":
        rows = [(row, vocab.encode(c, max_words=max_words, bos_eos=True)) for row, item in enumerate(items) for c in item.captions]
        lengths = torch.tensor([len(ids) for _, ids in rows], dtype=torch.long)
        offsets = torch.zeros(len(rows) + 1, dtype=torch.long)
        offsets[1:] = lengths.cumsum(0)
        ids = torch.tensor([t for _, seq in rows for t in seq], dtype=torch.int32)
        return cls(ids, offsets, torch.tensor([row for row, _ in rows], dtype=torch.long))


def _caption_fingerprint(items: Sequence[CaptionedImage], vocab: Vocabulary, max_words: int) -> str:
    digest = hashlib.sha256(f"{max_words}|".encode())
    digest.update("\n".join(vocab.tokens).encode())
    for item in items:
        digest.update(f"\x01{item.image_id}\x00".encode() + "\x00".join(item.captions).encode())
    return digest.hexdigest()[:24]


def encode_cached(items: Sequence[CaptionedImage], vocab: Vocabulary, max_words: int, cache_root: Path) -> EncodedCaptions:
    """EncodedCaptions from the cache dir, keyed by the captions, the vocabulary and the length cut."""
    path = cache_root / "coco_captions" / f"{_caption_fingerprint(items, vocab, max_words)}.pt"

    def build() -> dict:
        encoded = EncodedCaptions.build(items, vocab, max_words)
        return {"ids": encoded.ids, "offsets": encoded.offsets, "owner": encoded.owner}

    return EncodedCaptions(**load_or_build(path, build))


class CaptionPairs(Dataset):
    """Training items: one per (image, caption) pair."""

    def __init__(self, features: Tensor, captions: EncodedCaptions):
        self.features, self.captions = features, captions

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, c: int) -> tuple[Tensor, Tensor]:
        return self.features[self.captions.owner[c]], self.captions.caption(c)


class CaptionedImages(Dataset):
    """Evaluation items: one per image, with its image id, its encoded captions (for the teacher-forced
    loss) and its raw reference captions (for the caption metrics)."""

    def __init__(self, items: Sequence[CaptionedImage], features: Tensor, captions: EncodedCaptions):
        self.items, self.features, self.captions = list(items), features, captions

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, row: int):
        item = self.items[row]
        return self.features[row], self.captions.of_image(row), item.image_id, item.captions


def collate_pairs(batch: list[tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    features, captions = zip(*batch)
    return {"features": torch.stack(features).float(), "captions": pad_sequences([c.tolist() for c in captions])}


def collate_images(batch) -> dict:
    features, encoded, image_ids, references = zip(*batch)
    owner = [row for row, captions in enumerate(encoded) for _ in captions]
    return {
        "features": torch.stack(features).float(),
        "captions": pad_sequences([c.tolist() for captions in encoded for c in captions]),
        "caption_owner": torch.tensor(owner, dtype=torch.long),
        "image_ids": list(image_ids),
        "references": [list(r) for r in references],
    }


class CocoCaptionDataModule(L.LightningDataModule):
    """Frozen grid features of each split's images (cached under the cache dir) with encoded captions.
    Features sit in memory as float16: about 50 kB per image for a 7x7x512 grid."""

    def __init__(self, splits: CaptionSplits, vocab: Vocabulary, image_spec: ImageEncoderSpec, *, max_words: int,
                 batch_size: int, eval_batch_size: int | None = None, cache_dir: str | None = None):
        super().__init__()
        self.splits, self.vocab, self.image_spec = splits, vocab, image_spec
        self.max_words = max_words
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.cache_root = resolve_cache_dir(cache_dir)
        self.sets: dict[str, Dataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.sets:
            return
        for name, items in self.splits:
            features = cached_grid_features([item.path for item in items], self.image_spec, self.cache_root)
            captions = encode_cached(items, self.vocab, self.max_words, self.cache_root)
            self.sets[name] = CaptionPairs(features, captions) if name == "train" else CaptionedImages(items, features, captions)

    def feature_shape(self) -> tuple[int, int]:
        """(grid tokens, channels) of the image features."""
        self.setup()
        return tuple(self.sets["train"].features.shape[1:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.sets["train"], batch_size=self.batch_size, shuffle=True, collate_fn=collate_pairs)

    def val_dataloader(self) -> DataLoader:
        return self._evaluation_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._evaluation_loader("test")

    def _evaluation_loader(self, split: str) -> DataLoader:
        data = self.sets[split]
        sampler = unrepeated(torch.utils.data.SequentialSampler(data), self.trainer)
        return DataLoader(data, batch_size=self.eval_batch_size, sampler=sampler, collate_fn=collate_images)
