"""Tokenised text classification / regression data for the BERT-style hosts.

Every split is tokenised once with the backbone's own tokenizer and cached under the cache dir
(never the data root), keyed by the text itself, the vocabulary and the maximum length, so a changed
file or tokenizer never reuses a stale cache. Batches are padded to their longest member.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from .evaluation import unrepeated
from .glue import Example
from .paths import cache_dir as resolve_cache_dir
from .paths import load_or_build

SPLIT_SEED = 20240229
"""Held-out and subsampled parts are drawn with this fixed seed, not the run seed, so every variant and
seed is trained, selected and tested on the same examples."""


def holdout(examples: Sequence[Example], fraction: float, *, max_size: int | None = None) -> tuple[list[Example], list[Example]]:
    """Split off a fixed random part of `examples` (e.g. for model selection): (rest, held_out)."""
    order = list(range(len(examples)))
    random.Random(SPLIT_SEED).shuffle(order)
    size = max(1, round(fraction * len(examples)))
    if max_size is not None:
        size = min(size, max_size)
    held = set(order[:size])
    return [e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held]


def subsample(examples: Sequence[Example], limit: int | None) -> list[Example]:
    """At most `limit` examples, drawn with the fixed split seed (all of them when limit is None)."""
    if limit is None or limit >= len(examples):
        return list(examples)
    order = sorted(random.Random(SPLIT_SEED + 1).sample(range(len(examples)), limit))
    return [examples[i] for i in order]


@dataclass
class TextSplits:
    train: list[Example]
    val: list[Example]
    tests: dict[str, list[Example]] = field(default_factory=dict)
    """Reported evaluation sets in order; the first is the primary one (its metrics are `test/<metric>`,
    the others `test/<name>_<metric>`)."""


class TokenizedSet(Dataset):
    """Variable-length token ids stored flat with offsets (compact to cache and to load)."""

    def __init__(self, ids: Tensor, types: Tensor, offsets: Tensor, labels: Tensor):
        self.ids, self.types, self.offsets, self.labels = ids, types, offsets, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, Tensor]:
        start, end = self.offsets[i], self.offsets[i + 1]
        return self.ids[start:end], self.types[start:end], self.labels[i]

    def lengths(self) -> Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @classmethod
    def build(cls, examples: Sequence[Example], tokenizer, max_length: int) -> "TokenizedSet":
        pairs = any(e.text_b is not None for e in examples)
        text_a = [e.text_a for e in examples]
        text_b = [e.text_b or "" for e in examples] if pairs else None
        encoded = tokenizer(text_a, text_b, truncation=True, max_length=max_length, return_token_type_ids=True)
        lengths = torch.tensor([len(ids) for ids in encoded["input_ids"]], dtype=torch.long)
        offsets = torch.zeros(len(examples) + 1, dtype=torch.long)
        offsets[1:] = lengths.cumsum(0)
        ids = torch.tensor([t for row in encoded["input_ids"] for t in row], dtype=torch.int32)
        types = torch.tensor([t for row in encoded["token_type_ids"] for t in row], dtype=torch.int8)
        dtype = torch.float32 if isinstance(examples[0].label, float) else torch.long
        labels = torch.tensor([e.label for e in examples], dtype=dtype)
        return cls(ids, types, offsets, labels)

    def state(self) -> dict[str, Tensor]:
        return {"ids": self.ids, "types": self.types, "offsets": self.offsets, "labels": self.labels}


@lru_cache(maxsize=4)
def _vocabulary_digest(tokenizer) -> bytes:
    # Once per tokenizer: every split of a run is keyed by the same 30k-token vocabulary.
    return hashlib.sha256("\n".join(sorted(tokenizer.get_vocab())).encode()).digest()


def _fingerprint(examples: Sequence[Example], tokenizer, max_length: int) -> str:
    digest = hashlib.sha256()
    digest.update(f"{type(tokenizer).__name__}|{tokenizer.vocab_size}|{max_length}|".encode())
    digest.update(_vocabulary_digest(tokenizer))
    for e in examples:
        digest.update(f"{e.text_a}\x00{e.text_b}\x00{e.label}\x01".encode())
    return digest.hexdigest()[:24]


def tokenize_cached(examples: Sequence[Example], tokenizer, max_length: int, cache_root: Path) -> TokenizedSet:
    if not examples:
        raise ValueError("cannot tokenise an empty split")
    path = cache_root / "text" / f"{_fingerprint(examples, tokenizer, max_length)}.pt"
    return TokenizedSet(**load_or_build(path, lambda: TokenizedSet.build(examples, tokenizer, max_length).state()))


def pad_batch(items: list[tuple[Tensor, Tensor, Tensor]], pad_id: int = 0) -> dict[str, Tensor]:
    longest = max(len(ids) for ids, _, _ in items)
    input_ids = torch.full((len(items), longest), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(items), longest), dtype=torch.long)
    attention_mask = torch.zeros((len(items), longest), dtype=torch.long)
    for row, (ids, types, _) in enumerate(items):
        input_ids[row, : len(ids)] = ids
        token_type_ids[row, : len(ids)] = types
        attention_mask[row, : len(ids)] = 1
    labels = torch.stack([label for _, _, label in items])
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask, "labels": labels}


class BucketBatchSampler(torch.utils.data.BatchSampler):
    """Random batches of similar lengths: shuffle, sort within windows of `window` batches, shuffle the
    batches. Padding every batch to its longest member then wastes little compute (on RTE about half of
    the tokens of a plain random batch are padding), while each epoch's batches stay random.

    A BatchSampler that takes `sampler` so that Lightning's DDP can re-create it around a
    DistributedSampler. Then every rank builds the same global bucket plan (from the DistributedSampler's
    shared seed and epoch, not from its own shard): windows of the whole data set sorted by length, cut into
    global batches of batch_size x world_size, and rank r takes every world_size-th example of each. So at
    every step all ranks hold examples of about the same length: bucketing each rank's own shard gave ranks
    different sequence lengths at a step (stragglers, and an OOM on one rank while the others hang in
    all-reduce). The data set is padded to a multiple of world_size by repeating its first examples, as the
    DistributedSampler does, so that every rank takes the same number of equal-sized batches. On one process
    the batches come from the sampler's size and the run's seed alone, so that they do not depend on the
    global RNG."""

    def __init__(self, sampler, batch_size: int, drop_last: bool = False, *, lengths: Tensor, window: int = 50):
        if drop_last:
            raise ValueError("BucketBatchSampler keeps every example: drop_last=True is not supported")
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = lengths
        self.window = window
        self.epoch = 0

    def _bucketed(self, order: Tensor, size: int, generator: torch.Generator) -> list[Tensor]:
        """`order` cut into batches of `size` sorted by length within windows of `window` batches, shuffled."""
        span = size * self.window
        batches = []
        for start in range(0, len(order), span):
            chunk = order[start : start + span]
            chunk = chunk[torch.argsort(self.lengths[chunk], stable=True)]
            batches.extend(chunk[i : i + size] for i in range(0, len(chunk), size))
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]

    def __iter__(self):
        sampler = self.sampler
        if isinstance(sampler, torch.utils.data.DistributedSampler):
            world, rank = sampler.num_replicas, sampler.rank
            generator = torch.Generator().manual_seed(sampler.seed + sampler.epoch)  # the same on every rank
            count = len(self.lengths)
            order = torch.randperm(count, generator=generator) if sampler.shuffle else torch.arange(count)
            padded = -(-count // world) * world
            order = torch.cat([order, order[: padded - count]])
            for global_batch in self._bucketed(order, self.batch_size * world, generator):
                yield global_batch[rank::world].tolist()
            return
        generator = torch.Generator().manual_seed(int(torch.initial_seed()) + self.epoch)
        self.epoch += 1
        order = torch.randperm(len(self.lengths), generator=generator)
        for batch in self._bucketed(order, self.batch_size, generator):
            yield batch.tolist()

    def __len__(self) -> int:
        if isinstance(self.sampler, torch.utils.data.DistributedSampler):
            world = self.sampler.num_replicas
            return -(-(-(-len(self.lengths) // world) * world) // (self.batch_size * world))
        return -(-len(self.sampler) // self.batch_size)


class LengthSortedSampler(torch.utils.data.Sampler):
    """Evaluation order by length, so that each padded batch wastes little compute (order is irrelevant
    to the metrics)."""

    def __init__(self, lengths: Tensor):
        self.order = torch.argsort(lengths, stable=True).tolist()

    def __iter__(self):
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


class TextDataModule(L.LightningDataModule):
    def __init__(self, splits: TextSplits, tokenizer, *, max_length: int, batch_size: int, eval_batch_size: int | None = None,
                 cache_dir: str | None = None):
        super().__init__()
        self.splits = splits
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or 2 * batch_size
        self.cache_root = resolve_cache_dir(cache_dir)
        self.test_names = list(splits.tests)
        # Padding is masked out, but RoBERTa-likes also derive position ids from where the pad token is.
        self.collate = functools.partial(pad_batch, pad_id=getattr(tokenizer, "pad_token_id", None) or 0)
        self._sets: dict[str, TokenizedSet] = {}

    def setup(self, stage: str | None = None) -> None:
        if self._sets:
            return
        named = {"train": self.splits.train, "val": self.splits.val, **{f"test:{k}": v for k, v in self.splits.tests.items()}}
        self._sets = {name: tokenize_cached(examples, self.tokenizer, self.max_length, self.cache_root) for name, examples in named.items()}

    def _loader(self, name: str, *, train: bool) -> DataLoader:
        data = self._sets[name]
        if train:
            # A RandomSampler inside tells Lightning the batches are shuffled, so that under DDP it shards with a
            # shuffling DistributedSampler; on one process only its length is used.
            sampler = BucketBatchSampler(torch.utils.data.RandomSampler(data), self.batch_size, lengths=data.lengths())
            return DataLoader(data, batch_sampler=sampler, collate_fn=self.collate)
        sampler = unrepeated(LengthSortedSampler(data.lengths()), self.trainer)
        return DataLoader(data, batch_size=self.eval_batch_size, sampler=sampler, collate_fn=self.collate)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(f"test:{name}", train=False) for name in self.test_names]
