"""Visual question answering data: VQA v2 (JSON format) and easy-vqa.

VQA v2, under `<data root>/<vqa_dir>` (default `vqa/`), in one of two layouts:

* the local subset (`../shared/data/vqa`): `questions.json` + `annotations.json` in the official
  structure plus a per-entry `split` key (train/valid/test), images at `images/<image_id as 12 digits>.jpg`;
* the official download (https://visualqa.org/download.html): put
  `v2_OpenEnded_mscoco_train2014_questions.json`, `v2_mscoco_train2014_annotations.json`,
  `v2_OpenEnded_mscoco_val2014_questions.json`, `v2_mscoco_val2014_annotations.json` in that folder and
  the COCO images at `train2014/COCO_train2014_<12 digits>.jpg`, `val2014/COCO_val2014_<12 digits>.jpg`.
  The test-dev answers are not public, so val2014 is the test set and a fixed part of train2014 (by
  image) selects the epoch.

Answers are normalised as the official VQA evaluation does; each question's target over the top-K
training answers is the soft VQA score min(#humans who gave the answer / 3, 1) (the form MCAN and BAM
train on; the official metric additionally averages it over the ten 9-of-10 subsets of the humans).

easy-vqa comes from the `easy_vqa` PyPI package (64x64 PNG shapes, 13 answers, one answer per question,
so its soft target is one-hot and VQA accuracy equals accuracy). A fixed part of its train split, held
out by image, selects the epoch; its test split is the test set.

Images become grid features of a frozen timm encoder, computed once and cached under the cache dir.
"""

from __future__ import annotations

import functools

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from datamodules.image_features import ImageEncoderSpec, cached_grid_features

from .evaluation import unrepeated
from .paths import MissingDataError
from .paths import cache_dir as resolve_cache_dir
from .paths import data_root as resolve_data_root
from .vocab import Vocabulary

SPLIT_SEED = 20240229
"""Held-out and subsampled parts are drawn with this fixed seed, not the run seed, so every variant and
seed is trained, selected and tested on the same questions."""

HUMANS_FOR_FULL_SCORE = 3

SUBSET_FILES = ("questions.json", "annotations.json")
OFFICIAL_SETS = ("train2014", "val2014")


def official_files(subset: str) -> tuple[str, str]:
    return f"v2_OpenEnded_mscoco_{subset}_questions.json", f"v2_mscoco_{subset}_annotations.json"


# ---- answer normalisation ----------------------------------------------------------------------
# Written here because no PyPI package ships the official VQA evaluation (github.com/GT-Vision-Lab/VQA,
# vqaEval.py); these tables and the two steps below are copied from it, quirks included (the period
# regex's "(?!<=\d)" is a typo for "(?<!\d)" there, kept so that scores match the official ones).
_CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't", "dont": "don't",
    "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't", "havent": "haven't",
    "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd", "howll": "how'll",
    "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've", "isnt": "isn't", "itd": "it'd",
    "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's", "maam": "ma'am", "mightnt": "mightn't",
    "mightnt've": "mightn't've", "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't",
    "mustve": "must've", "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've",
    "she'dve": "she'd've", "she's": "she's", "shouldve": "should've", "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've", "somebodyll": "somebody'll",
    "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd", "somethingd've": "something'd've",
    "something'dve": "something'd've", "somethingll": "something'll", "thats": "that's", "thered": "there'd",
    "thered've": "there'd've", "there'dve": "there'd've", "therere": "there're", "theres": "there's", "theyd": "they'd",
    "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've",
    "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't",
    "whatll": "what'll", "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's",
    "whered": "where'd", "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've",
    "who'dve": "who'd've", "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're",
    "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll",
    "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd",
    "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}
_NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                 "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = {"a", "an", "the"}
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_PUNCTUATION = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]


def _process_punctuation(text: str) -> str:
    out = text
    for p in _PUNCTUATION:
        if (p + " " in text or " " + p in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out)


def _process_digits_and_articles(text: str) -> str:
    kept = [_NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    kept = [w for w in kept if w not in _ARTICLES]
    return " ".join(_CONTRACTIONS.get(w, w) for w in kept)


def normalize_answer(answer: str) -> str:
    """The official VQA answer normalisation: whitespace, punctuation, lower case, number words to
    digits, articles dropped, contractions restored ("Two dogs." -> "2 dogs", "isnt" -> "isn't")."""
    text = answer.replace("\n", " ").replace("\t", " ").strip()
    return _process_digits_and_articles(_process_punctuation(text))


def answer_scores(answers: Sequence[str]) -> dict[str, float]:
    """Soft VQA score of every answer the humans gave: min(#humans who gave it / 3, 1)."""
    return {a: min(c / HUMANS_FOR_FULL_SCORE, 1.0) for a, c in Counter(answers).items()}


# ---- examples and readers ----------------------------------------------------------------------
@dataclass(frozen=True)
class VQAExample:
    question_id: int
    image: Path
    question: str
    scores: tuple[tuple[str, float], ...]
    """(normalised answer, soft score) for every answer the annotators gave, best first."""
    humans: tuple[int, ...]
    """How many annotators gave each of those answers (same order)."""

    @property
    def best_answer(self) -> str:
        return self.scores[0][0]


@dataclass
class VQASplits:
    train: list[VQAExample]
    val: list[VQAExample]
    test: list[VQAExample]


def _example(question: dict, answers: list[str], image: Path) -> VQAExample:
    counts = Counter(answers)
    scores = answer_scores(answers)
    ranked = sorted(counts, key=lambda a: (-counts[a], a))
    return VQAExample(int(question["question_id"]), image, question["question"], tuple((a, scores[a]) for a in ranked), tuple(counts[a] for a in ranked))


def vqa_layout(folder: Path) -> str | None:
    """'subset' or 'official' when that layout's question and annotation files are all there."""
    if all((folder / name).is_file() for name in SUBSET_FILES):
        return "subset"
    if all((folder / name).is_file() for subset in OFFICIAL_SETS for name in official_files(subset)):
        return "official"
    return None


def vqa_problem(explicit_root, vqa_dir: str = "vqa") -> str | None:
    """None if VQA v2 data can be read; otherwise what is missing and where to put it."""
    root = resolve_data_root(explicit_root)
    if root is None:
        return f"VQA v2 needs local files: set ATTNBENCH_DATA (or --data-root) to a folder holding {vqa_dir}/ (see datamodules/vqa.py)"
    folder = root / vqa_dir
    if vqa_layout(folder) is not None:
        return None
    wanted = [folder / n for n in SUBSET_FILES]
    if any((folder / n).is_file() for s in OFFICIAL_SETS for n in official_files(s)):
        wanted = [folder / n for s in OFFICIAL_SETS for n in official_files(s)]
    missing = [str(p) for p in wanted if not p.is_file()]
    return (
        f"VQA v2 is missing {', '.join(missing)}; put either the subset layout ({vqa_dir}/questions.json, annotations.json, "
        f"images/<image_id as 12 digits>.jpg) or the official files ({vqa_dir}/v2_OpenEnded_mscoco_{{train2014,val2014}}_questions.json, "
        f"v2_mscoco_{{train2014,val2014}}_annotations.json, {{train2014,val2014}}/COCO_{{train2014,val2014}}_<12 digits>.jpg) there"
    )


def _load_list(path: Path, key: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise MissingDataError(f"{path} is not valid JSON ({exc}); download it again") from exc
    if not isinstance(data, dict) or key not in data:
        raise MissingDataError(f"{path} has no top-level {key!r} list; expected the VQA v2 format {{\"{key}\": [...]}}")
    return data[key]


def _join(questions: list[dict], annotations: list[dict], image_of, path: Path) -> list[tuple[dict, VQAExample]]:
    by_id = {int(a["question_id"]): a for a in annotations}
    joined = []
    for q in questions:
        annotation = by_id.get(int(q["question_id"]))
        if annotation is None:
            raise MissingDataError(f"question {q['question_id']} has no annotation in {path}; the two files do not belong together")
        answers = [normalize_answer(a["answer"]) for a in annotation["answers"]]
        joined.append((q, _example(q, answers, image_of(int(q["image_id"])))))
    return joined


def read_vqa(explicit_root, vqa_dir: str = "vqa", *, val_fraction: float = 0.1) -> VQASplits:
    root = resolve_data_root(explicit_root)
    problem = vqa_problem(explicit_root, vqa_dir)
    if problem:
        raise MissingDataError(problem)
    folder = root / vqa_dir
    if vqa_layout(folder) == "subset":
        questions = _load_list(folder / "questions.json", "questions")
        annotations = _load_list(folder / "annotations.json", "annotations")
        joined = _join(questions, annotations, lambda i: folder / "images" / f"{i:012d}.jpg", folder / "annotations.json")
        by_split: dict[str, list[VQAExample]] = {"train": [], "valid": [], "test": []}
        for q, example in joined:
            if q.get("split") not in by_split:
                raise MissingDataError(f"question {q['question_id']} in {folder / 'questions.json'} has split {q.get('split')!r}; expected train, valid or test")
            by_split[q["split"]].append(example)
        return VQASplits(by_split["train"], by_split["valid"], by_split["test"])
    sets = {}
    for subset in OFFICIAL_SETS:
        q_file, a_file = official_files(subset)
        sets[subset] = [e for _, e in _join(
            _load_list(folder / q_file, "questions"), _load_list(folder / a_file, "annotations"),
            lambda i, s=subset: folder / s / f"COCO_{s}_{i:012d}.jpg", folder / a_file,
        )]
    train, val = holdout_by_image(sets["train2014"], val_fraction)
    return VQASplits(train, val, sets["val2014"])


def easy_vqa_problem() -> str | None:
    try:
        import easy_vqa  # noqa: F401
    except ImportError:
        return "easy-vqa needs the `easy-vqa` package (its data ships inside it): pip install easy-vqa"
    return None


def read_easy_vqa(*, val_fraction: float = 0.1) -> VQASplits:
    problem = easy_vqa_problem()
    if problem:
        raise MissingDataError(problem)
    import easy_vqa

    def read(questions, images) -> list[VQAExample]:
        texts, answers, image_ids = questions
        examples = []
        for i, (text, answer, image_id) in enumerate(zip(texts, answers, image_ids)):
            if image_id not in images:
                raise MissingDataError(f"easy-vqa image {image_id} is missing from the installed package; reinstall easy-vqa")
            # Question ids are made up (the package has none): position in the package's list.
            examples.append(VQAExample(i, Path(images[image_id]), text, ((normalize_answer(answer), 1.0),), (1,)))
        return examples

    train = read(easy_vqa.get_train_questions(), easy_vqa.get_train_image_paths())
    test = read(easy_vqa.get_test_questions(), easy_vqa.get_test_image_paths())
    train, val = holdout_by_image(train, val_fraction)
    return VQASplits(train, val, test)


def holdout_by_image(examples: Sequence[VQAExample], fraction: float) -> tuple[list[VQAExample], list[VQAExample]]:
    """(rest, held out): a fixed random `fraction` of the images with all their questions, so that no
    held-out image was seen in training."""
    images = sorted({e.image for e in examples})
    random.Random(SPLIT_SEED).shuffle(images)
    held = set(images[: max(1, round(fraction * len(images)))])
    return [e for e in examples if e.image not in held], [e for e in examples if e.image in held]


def subsample(examples: Sequence[VQAExample], limit: int | None, *, salt: int = 1) -> list[VQAExample]:
    """At most `limit` examples drawn with the fixed split seed, in their original order."""
    if limit is None or limit >= len(examples):
        return list(examples)
    keep = sorted(random.Random(SPLIT_SEED + salt).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


def answer_vocabulary(train: Sequence[VQAExample], top_k: int) -> tuple[str, ...]:
    """The `top_k` answers humans gave most often to training questions (each human answer counts;
    ties alphabetically, so the same data always gives the same ids)."""
    counts: Counter[str] = Counter()
    for e in train:
        for (answer, _), humans in zip(e.scores, e.humans):
            counts[answer] += humans
    return tuple(sorted(counts, key=lambda a: (-counts[a], a))[:top_k])


# ---- tensors and batches -----------------------------------------------------------------------
@dataclass
class EncodedSplit:
    """A split as tensors: questions padded to the longest, image index, sparse soft targets."""

    questions: Tensor  # [N, L] long, 0 = padding
    lengths: Tensor  # [N]
    image_index: Tensor  # [N] into the datamodule's image features
    target_rows: Tensor  # [M] example index of each (answer, score) entry
    target_answers: Tensor  # [M]
    target_scores: Tensor  # [M]

    def __len__(self) -> int:
        return len(self.questions)

    def targets(self, rows: Tensor, num_answers: int) -> Tensor:
        """Dense soft targets [len(rows), num_answers] of the examples `rows`."""
        position = torch.full((len(self),), -1, dtype=torch.long)
        position[rows] = torch.arange(len(rows))
        picked = position[self.target_rows]
        keep = picked >= 0
        dense = torch.zeros(len(rows), num_answers)
        dense[picked[keep], self.target_answers[keep]] = self.target_scores[keep]
        return dense


def encode_split(examples: Sequence[VQAExample], vocab: Vocabulary, answers: dict[str, int], image_index: dict[Path, int],
                 max_words: int) -> EncodedSplit:
    ids = [vocab.encode(e.question, max_words=max_words) or [vocab.unk_id] for e in examples]
    questions = torch.zeros(len(ids), max(len(q) for q in ids), dtype=torch.long)
    for row, q in enumerate(ids):
        questions[row, : len(q)] = torch.tensor(q)
    rows, answer_ids, scores = [], [], []
    for row, e in enumerate(examples):
        for answer, score in e.scores:
            if answer in answers:  # answers outside the vocabulary cannot be predicted: their score is lost
                rows.append(row)
                answer_ids.append(answers[answer])
                scores.append(score)
    return EncodedSplit(
        questions, torch.tensor([len(q) for q in ids]), torch.tensor([image_index[e.image] for e in examples]),
        torch.tensor(rows, dtype=torch.long), torch.tensor(answer_ids, dtype=torch.long), torch.tensor(scores, dtype=torch.float32),
    )


class VQADataModule(L.LightningDataModule):
    """Batches of {"question" [B, L], "question_valid" [B, L], "image" [B, h*w, C], "target" [B, A]}."""

    def __init__(self, splits: VQASplits, image_spec: ImageEncoderSpec, *, top_k_answers: int, max_question_words: int,
                 batch_size: int, eval_batch_size: int | None = None, cache_dir: str | None = None):
        super().__init__()
        for name in ("train", "val", "test"):
            if not getattr(splits, name):
                raise MissingDataError(f"the VQA {name} split is empty; the data folder holds no {name} questions")
        self.splits = splits
        self.image_spec = image_spec
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or 4 * batch_size
        self.cache_root = resolve_cache_dir(cache_dir)
        self.vocab = Vocabulary.build(e.question for e in splits.train)
        self.answers = answer_vocabulary(splits.train, top_k_answers)
        self.max_question_words = max_question_words
        self.images = sorted({e.image for split in (splits.train, splits.val, splits.test) for e in split})
        self._features: Tensor | None = None
        self._encoded: dict[str, EncodedSplit] = {}

    @property
    def num_answers(self) -> int:
        return len(self.answers)

    def features(self) -> Tensor:
        """[num images, h*w, C] float16 grid features (computed once, then read from the cache)."""
        if self._features is None:
            self._features = cached_grid_features(self.images, self.image_spec, self.cache_root)
        return self._features

    def setup(self, stage: str | None = None) -> None:
        if self._encoded:
            return
        self.features()
        answer_ids = {a: i for i, a in enumerate(self.answers)}
        image_index = {p: i for i, p in enumerate(self.images)}
        for name in ("train", "val", "test"):
            self._encoded[name] = encode_split(getattr(self.splits, name), self.vocab, answer_ids, image_index, self.max_question_words)

    def encoded(self, name: str) -> EncodedSplit:
        self.setup()
        return self._encoded[name]

    def batch(self, name: str, rows: Sequence[int] | Tensor) -> dict[str, Tensor]:
        split = self.encoded(name)
        rows = torch.as_tensor(rows, dtype=torch.long)
        longest = int(split.lengths[rows].max())
        questions = split.questions[rows, :longest]
        return {
            "question": questions,
            "question_valid": questions != self.vocab.pad_id,
            "image": self.features()[split.image_index[rows]].float(),
            "target": split.targets(rows, self.num_answers),
        }

    def _loader(self, name: str, *, shuffle: bool) -> DataLoader:
        # The loader only draws row indices; each batch is one gather from the whole-split tensors. A partial,
        # not a lambda: loader worker processes (num_workers > 0, spawn) need a picklable collate function.
        rows = range(len(self.encoded(name)))
        collate = functools.partial(self.batch, name)
        if shuffle:
            return DataLoader(rows, batch_size=self.batch_size, shuffle=True, collate_fn=collate)
        sampler = unrepeated(torch.utils.data.SequentialSampler(rows), self.trainer)
        return DataLoader(rows, batch_size=self.eval_batch_size, sampler=sampler, collate_fn=collate)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
