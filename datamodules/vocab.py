"""A word vocabulary built from training text (captions, questions), as the captioning and VQA papers do.

Written here rather than taken from a tokenizer library: captioning needs whole words to decode into
(and to score with CIDEr/BLEU), with its own <bos>/<eos>, built only from the training split; a
WordPiece model would split words and mix in vocabulary from elsewhere.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import Tensor

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """Lower-cased words without punctuation (close to the PTB tokenisation COCO evaluation uses)."""
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Vocabulary:
    tokens: tuple[str, ...]
    """Index -> word; the four specials come first, so <pad> = 0."""

    @classmethod
    def build(cls, texts: Iterable[str], *, min_count: int = 1, max_size: int | None = None) -> "Vocabulary":
        counts = Counter(w for text in texts for w in words(text))
        # Ties broken alphabetically so that the same texts always give the same ids.
        ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        return cls(SPECIALS + tuple(ranked))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def index(self) -> dict[str, int]:
        cached = self.__dict__.get("_index")
        if cached is None:
            cached = {w: i for i, w in enumerate(self.tokens)}
            object.__setattr__(self, "_index", cached)
        return cached

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return self.index[BOS]

    @property
    def eos_id(self) -> int:
        return self.index[EOS]

    @property
    def unk_id(self) -> int:
        return self.index[UNK]

    def encode(self, text: str, *, max_words: int | None = None, bos_eos: bool = False) -> list[int]:
        ids = [self.index.get(w, self.unk_id) for w in words(text)][:max_words]
        return [self.bos_id, *ids, self.eos_id] if bos_eos else ids

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """Words up to the first <eos>, specials dropped."""
        out = []
        for i in (ids.tolist() if isinstance(ids, Tensor) else ids):
            if i == self.eos_id:
                break
            if i >= len(SPECIALS) or i == self.unk_id:
                out.append(self.tokens[i])
        return " ".join(out)


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> Tensor:
    longest = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), max(1, longest)), pad_id, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out
