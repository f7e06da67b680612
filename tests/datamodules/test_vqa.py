"""VQA v2 (the real local subset, and the official layout rebuilt from it) and easy-vqa readers: answer
normalisation, soft targets, the answer vocabulary, batches and masks, and the missing-file messages."""

import json
import random
import shutil

import pytest
import torch

from datamodules.paths import MissingDataError
from datamodules.vqa import (
    VQADataModule,
    answer_vocabulary,
    holdout_by_image,
    normalize_answer,
    read_easy_vqa,
    read_vqa,
    vqa_problem,
)
from datamodules.image_features import ImageEncoderSpec

SMALL_IMAGES = ImageEncoderSpec("resnet18", "random", image_size=64, stage=2)


@pytest.fixture(scope="module")
def subset(shared_data):
    return read_vqa(shared_data)


@pytest.fixture(scope="module")
def easy():
    pytest.importorskip("easy_vqa")
    return read_easy_vqa()


def by_id(examples):
    return {e.question_id: e for e in examples}


@pytest.mark.parametrize("raw, expected", [
    ("Two dogs.", "2 dogs"),
    ("The Cat", "cat"),
    ("an apple", "apple"),
    ("none", "0"),
    ("isnt", "isn't"),
    ("yes!", "yes"),
    ("tennis-racket", "tennis racket"),
    ("3,000", "3000"),
    ("3.5", "3.5"),
    ("11:43", "11:43"),
    ("  left\n", "left"),
])
def test_answers_are_normalised_as_the_official_evaluation_does(raw, expected):
    assert normalize_answer(raw) == expected


def test_subset_splits_and_images(subset, shared_data):
    assert (len(subset.train), len(subset.val), len(subset.test)) == (31, 7, 1)
    example = by_id(subset.test)[538113001]
    assert example.question == "Is he hitting the ball?"
    assert example.image == (shared_data / "vqa" / "images" / "000000538113.jpg").resolve() and example.image.is_file()


def test_soft_scores_from_the_ten_human_answers(subset):
    train, val = by_id(subset.train), by_id(subset.val)
    # 6 x "2", 4 x "3": both reach the three humans needed for full credit.
    assert dict(train[63217001].scores) == {"2": 1.0, "3": 1.0}
    # 4 x "4", 3 x "5", 2 x "3", 1 x "6".
    assert dict(train[70133003].scores) == pytest.approx({"4": 1.0, "5": 1.0, "3": 2 / 3, "6": 1 / 3})
    assert train[70133003].best_answer == "4"
    # 6 x "no", 3 x "yes", 1 x "maybe".
    assert dict(val[489520000].scores) == pytest.approx({"no": 1.0, "yes": 1.0, "maybe": 1 / 3})


def test_answer_vocabulary_counts_training_answers_only(subset):
    # Human answers over the 31 training questions: "no" 58, "1" 57, "yes" 31 (counted by hand).
    assert answer_vocabulary(subset.train, 3) == ("no", "1", "yes")
    full = answer_vocabulary(subset.train, 10_000)
    assert "sailboat" in full
    assert "empty" not in full and "picture" not in full  # answers of validation questions only


def test_batches_carry_masks_soft_targets_and_features(subset):
    dm = VQADataModule(subset, SMALL_IMAGES, top_k_answers=10_000, max_question_words=14, batch_size=4)
    dm.setup()
    rows = [i for i, e in enumerate(subset.train) if e.question_id in (70133003, 37666002)]
    batch = dm.batch("train", rows)
    lengths = [len(dm.vocab.encode(subset.train[i].question)) for i in rows]
    assert batch["question_valid"].sum(1).tolist() == lengths
    assert batch["question_valid"].shape[1] == max(lengths)
    assert (batch["question"][~batch["question_valid"]] == dm.vocab.pad_id).all()
    assert batch["image"].shape == (2, 8 * 8, 128) and batch["image"].dtype == torch.float32
    scissors = batch["target"][[subset.train[i].question_id for i in rows].index(70133003)]
    answer = {a: i for i, a in enumerate(dm.answers)}
    assert scissors[answer["4"]] == 1 and scissors[answer["3"]] == pytest.approx(2 / 3) and scissors[answer["6"]] == pytest.approx(1 / 3)
    assert scissors.sum() == pytest.approx(1 + 1 + 2 / 3 + 1 / 3)
    # A validation answer never given in training is outside the vocabulary: its score is lost.
    val_rows = [i for i, e in enumerate(subset.val) if e.question_id == 212679001]  # "empty" x 10
    assert dm.batch("val", val_rows)["target"].sum() == 0


def test_question_words_are_capped(subset):
    dm = VQADataModule(subset, SMALL_IMAGES, top_k_answers=100, max_question_words=3, batch_size=4)
    assert dm.batch("train", range(8))["question"].shape[1] == 3


def test_official_layout_is_read(subset, shared_data, tmp_path):
    folder = tmp_path / "vqa"
    source = json.loads((shared_data / "vqa" / "questions.json").read_text())["questions"]
    annotations = json.loads((shared_data / "vqa" / "annotations.json").read_text())["annotations"]
    for name, split in (("train2014", "train"), ("val2014", "valid")):
        qs = [q for q in source if q["split"] == split]
        ids = {q["question_id"] for q in qs}
        (folder / name).mkdir(parents=True)
        (folder / f"v2_OpenEnded_mscoco_{name}_questions.json").write_text(json.dumps({"questions": qs}))
        (folder / f"v2_mscoco_{name}_annotations.json").write_text(json.dumps({"annotations": [a for a in annotations if a["question_id"] in ids]}))
        for image_id in {q["image_id"] for q in qs}:
            shutil.copy(shared_data / "vqa" / "images" / f"{image_id:012d}.jpg", folder / name / f"COCO_{name}_{image_id:012d}.jpg")
    assert vqa_problem(tmp_path) is None
    splits = read_vqa(tmp_path, val_fraction=0.25)
    assert len(splits.train) + len(splits.val) == 31 and len(splits.test) == 7
    assert not {e.image for e in splits.train} & {e.image for e in splits.val}
    assert all(e.image.name.startswith("COCO_val2014_") and e.image.is_file() for e in splits.test)
    assert dict(by_id(splits.test)[489520000].scores) == pytest.approx({"no": 1.0, "yes": 1.0, "maybe": 1 / 3})


def test_missing_files_are_named(tmp_path):
    problem = vqa_problem(tmp_path)
    assert str(tmp_path / "vqa" / "questions.json") in problem and "v2_OpenEnded_mscoco_" in problem
    (tmp_path / "vqa").mkdir()
    (tmp_path / "vqa" / "v2_OpenEnded_mscoco_train2014_questions.json").write_text('{"questions": []}')
    problem = vqa_problem(tmp_path)
    missing = problem.split(";")[0]  # once some official files are there, the others are what is missing
    assert str(tmp_path / "vqa" / "v2_mscoco_val2014_annotations.json") in missing
    assert str(tmp_path / "vqa" / "questions.json") not in missing and "train2014_questions.json" not in missing
    with pytest.raises(MissingDataError, match="v2_mscoco_train2014_annotations.json"):
        read_vqa(tmp_path)


def test_missing_images_are_named(shared_data, tmp_path):
    folder = tmp_path / "vqa"
    folder.mkdir()
    for name in ("questions.json", "annotations.json"):
        shutil.copy(shared_data / "vqa" / name, folder / name)
    splits = read_vqa(tmp_path)
    with pytest.raises(MissingDataError, match="000000790.jpg"):
        VQADataModule(splits, SMALL_IMAGES, top_k_answers=10, max_question_words=14, batch_size=4, cache_dir=str(tmp_path / "cache")).setup()


def test_easy_vqa_splits(easy):
    assert len(easy.train) + len(easy.val) == 38_575 and len(easy.test) == 9_673
    train_images, val_images = {e.image for e in easy.train}, {e.image for e in easy.val}
    assert not train_images & val_images
    assert len(val_images) == 400  # 10% of the 4,000 training images
    assert {e.best_answer for e in easy.train} == {"yes", "no", "circle", "rectangle", "triangle", "red", "green", "blue",
                                                   "black", "gray", "teal", "brown", "yellow"}
    assert all(e.scores[0][1] == 1.0 and len(e.scores) == 1 for e in easy.test)  # one answer: a one-hot target


def test_easy_vqa_holdout_ignores_the_run_seed(easy):
    torch.manual_seed(123)
    random.seed(123)
    again = read_easy_vqa()
    assert [e.question_id for e in again.val] == [e.question_id for e in easy.val]
    rest, held = holdout_by_image(easy.train, 0.5)
    assert not {e.image for e in rest} & {e.image for e in held}


def test_collate_function_pickles_for_loader_worker_processes(subset):
    """DataLoader(num_workers > 0) under spawn pickles collate_fn; a lambda cannot be pickled (issue #18)."""
    import pickle

    dm = VQADataModule(subset, SMALL_IMAGES, top_k_answers=10_000, max_question_words=14, batch_size=4)
    dm.setup()
    collate = pickle.loads(pickle.dumps(dm.train_dataloader().collate_fn))
    expected = dm.batch("train", [0, 1])
    got = collate([0, 1])
    assert torch.equal(got["question"], expected["question"]) and torch.equal(got["target"], expected["target"])
