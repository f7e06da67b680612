"""COCO caption metrics (CIDEr-D, BLEU-4, ROUGE-L, METEOR) as a torchmetrics Metric over pycocoevalcap.

The Metric only collects (image id, generated caption, reference captions); `compute` tokenises them and
hands the whole corpus to pycocoevalcap, the reference implementation of the COCO caption evaluation
(CIDEr-D's document frequencies come from all the references at once, so it cannot be accumulated per
batch). Its states are Python lists of strings, which torchmetrics cannot all-reduce: evaluation must run
on one process (compute raises if it finds several).

Tokenisation is pycocoevalcap's PTBTokenizer (Stanford CoreNLP, Java) when Java works; without Java it
falls back to `datamodules.vocab.words` (lower-cased words, punctuation dropped), which agrees with the
PTB tokens except that PTB splits clitics ("dog's" -> "dog 's"), so scores can differ slightly. METEOR
needs Java too: without it, it is skipped with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import warnings
from typing import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric

from datamodules.vocab import words

SCORERS = ("cider", "bleu4", "rouge_l", "meteor")
TOKENIZERS = ("auto", "ptb", "python")
_TEXT_STATES = ("image_ids", "hypotheses", "references")


@functools.lru_cache(maxsize=1)
def java_available() -> bool:
    """Whether a working `java` is on the PATH (pycocoevalcap's PTB tokenizer and METEOR run on it)."""
    java = shutil.which("java")
    if java is None:
        return False
    try:
        return subprocess.run([java, "-version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def python_tokenize(captions: dict[int, list[str]]) -> dict[int, list[str]]:
    return {key: [" ".join(words(c)) for c in texts] for key, texts in captions.items()}


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 for a while: the Java PTBTokenizer inherits it and reports its speed on it
    after every call, which would drown the per-epoch progress lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def ptb_tokenize(captions: dict[int, list[str]]) -> dict[int, list[str]]:
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    with _quiet_stderr():
        tokenized = PTBTokenizer().tokenize({key: [{"caption": c} for c in texts] for key, texts in captions.items()})
    # PTBTokenizer pairs output lines with inputs by position; a caption it dropped would shift the rest.
    if any(len(tokenized.get(key, [])) != len(texts) for key, texts in captions.items()):
        raise RuntimeError("PTBTokenizer returned a different number of captions than it was given")
    return tokenized


class CaptionScores(Metric):
    """Corpus-level caption scores of generated captions against all reference captions of each image.

    update(image_ids, hypotheses, references): one generated caption and the list of reference captions
    per image. compute() -> {"cider", "bleu4", "rouge_l", "meteor"} (those asked for; METEOR only with Java).
    CIDEr is pycocoevalcap's `Cider`, which is CIDEr-D (clipped counts, length penalty, sigma 6)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, scorers: Sequence[str] = ("cider", "bleu4", "rouge_l"), *, tokenizer: str = "auto", **kwargs):
        super().__init__(sync_on_compute=False, **kwargs)
        unknown = set(scorers) - set(SCORERS)
        if unknown:
            raise ValueError(f"unknown caption scorer(s) {sorted(unknown)}; choose from {SCORERS}")
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
        self.scorers = tuple(scorers)
        self.tokenizer = tokenizer
        for name in _TEXT_STATES:
            self.add_state(name, default=[], dist_reduce_fx=None)

    def _apply(self, fn, exclude_state=()):
        # Strings cannot move between devices or dtypes; torchmetrics would apply `fn` to every list item.
        return super()._apply(fn, exclude_state=(*exclude_state, *_TEXT_STATES))

    def update(self, image_ids: Iterable[int] | Tensor, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        image_ids = image_ids.tolist() if isinstance(image_ids, Tensor) else [int(i) for i in image_ids]
        if not len(image_ids) == len(hypotheses) == len(references):
            raise ValueError(f"got {len(image_ids)} image ids, {len(hypotheses)} hypotheses and {len(references)} reference lists")
        if any(len(refs) == 0 for refs in references):
            raise ValueError("every image needs at least one reference caption")
        self.image_ids.extend(image_ids)
        self.hypotheses.extend(str(h) for h in hypotheses)
        # Tuples, not lists: torchmetrics flattens list-of-list states when it syncs them.
        self.references.extend(tuple(str(r) for r in refs) for refs in references)

    def _tokenize(self, captions: dict[int, list[str]]) -> dict[int, list[str]]:
        if self.tokenizer == "python" or (self.tokenizer == "auto" and not java_available()):
            return python_tokenize(captions)
        try:
            return ptb_tokenize(captions)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            if self.tokenizer == "ptb":
                raise
            warnings.warn(f"PTBTokenizer failed ({type(exc).__name__}: {exc}); tokenising captions in Python instead", stacklevel=2)
            return python_tokenize(captions)

    def compute(self) -> dict[str, Tensor]:
        image_ids, hypotheses, references = self.image_ids, self.hypotheses, self.references
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Strings are not tensors, so torchmetrics cannot gather them; every rank scores the union of
            # all ranks' captions (an image a DistributedSampler padded in twice is scored once, below).
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, (list(image_ids), list(hypotheses), list(references)))
            image_ids = [i for ids, _, _ in gathered for i in ids]
            hypotheses = [h for _, hyps, _ in gathered for h in hyps]
            references = [r for _, _, refs in gathered for r in refs]
        if not image_ids:
            raise ValueError("CaptionScores.compute() before any update: no captions to score")
        # Scored per image: if an image was passed twice, its last caption counts.
        hypotheses = {i: [h] for i, h in zip(image_ids, hypotheses)}
        references = {i: list(r) for i, r in zip(image_ids, references)}
        # One tokenizer call for both (each PTB call starts a JVM): the hypothesis goes last in each list.
        tokenized = self._tokenize({k: references[k] + hypotheses[k] for k in sorted(hypotheses)})
        hypotheses = {k: texts[-1:] for k, texts in tokenized.items()}
        references = {k: texts[:-1] for k, texts in tokenized.items()}
        return {name: torch.tensor(float(score), dtype=torch.float64) for name, score in score_captions(references, hypotheses, self.scorers).items()}


def score_captions(references: dict[int, list[str]], hypotheses: dict[int, list[str]], scorers: Sequence[str]) -> dict[str, float]:
    """pycocoevalcap scores of tokenised captions ({image: [caption]} and {image: [reference, ...]})."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    scores: dict[str, float] = {}
    if "cider" in scorers:
        scores["cider"] = Cider().compute_score(references, hypotheses)[0]
    if "bleu4" in scorers:
        scores["bleu4"] = Bleu(4).compute_score(references, hypotheses, verbose=0)[0][3]
    if "rouge_l" in scorers:
        scores["rouge_l"] = Rouge().compute_score(references, hypotheses)[0]
    if "meteor" in scorers:
        if java_available():
            from pycocoevalcap.meteor.meteor import Meteor

            meteor = Meteor()
            try:
                scores["meteor"] = meteor.compute_score(references, hypotheses)[0]
            finally:
                del meteor  # its __del__ ends the Java process
        else:
            warnings.warn("METEOR needs Java (pycocoevalcap runs meteor-1.5.jar); `java` was not found, so METEOR is skipped", stacklevel=2)
    return scores
