"""The COCO caption reader on the real 239-image subset: splits, training-only vocabulary, cached token ids,
batches, and the errors for missing or malformed files."""

import json
import shutil

import pytest
import torch

from datamodules import coco
from datamodules.paths import MissingDataError
from datamodules.vocab import BOS, EOS, words
from datamodules.image_features import ImageEncoderSpec


@pytest.fixture(scope="module")
def items(shared_data):
    return coco.read_captions(shared_data)


def test_reads_every_image_with_its_five_captions(items):
    assert len(items) == 239 and sum(len(x.captions) for x in items) == 1195
    assert all(x.path.is_file() and len(x.captions) == 5 for x in items)
    first = next(x for x in items if x.image_id == 139)
    assert first.path.name == "000000000139.jpg"
    assert "A woman stands in the dining area at the table." in first.captions


def test_random_split_is_fixed_disjoint_and_complete(items):
    splits = coco.random_split(items, 0.1, 0.1)
    ids = {name: {x.image_id for x in part} for name, part in splits}
    assert [len(ids[n]) for n in ("train", "val", "test")] == [191, 24, 24]
    assert not ids["train"] & ids["val"] and not ids["train"] & ids["test"] and not ids["val"] & ids["test"]
    assert ids["train"] | ids["val"] | ids["test"] == {x.image_id for x in items}
    again = coco.random_split(items, 0.1, 0.1)
    assert [x.image_id for x in again.test] == [x.image_id for x in splits.test]
    with pytest.raises(ValueError, match="sum below 1"):
        coco.random_split(items, 0.5, 0.5)


def test_karpathy_split_puts_restval_in_train_and_drops_unlisted_images(items, tmp_path):
    listed = items[:6]
    entries = [
        {"cocoid": listed[0].image_id, "filename": listed[0].path.name, "split": "train"},
        {"cocoid": listed[1].image_id, "filename": listed[1].path.name, "split": "restval"},
        {"filepath": "val2014", "filename": listed[2].path.name, "split": "val"},  # matched by file name
        {"cocoid": listed[3].image_id, "filename": listed[3].path.name, "split": "test"},
        {"cocoid": listed[4].image_id, "filename": listed[4].path.name, "split": "test"},
        {"cocoid": 999999999, "filename": "absent.jpg", "split": "train"},  # not in this caption folder
    ]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": entries, "dataset": "coco"}))
    splits = coco.karpathy_split(items, path)
    assert [x.image_id for x in splits.train] == [listed[0].image_id, listed[1].image_id]
    assert [x.image_id for x in splits.val] == [listed[2].image_id]
    assert [x.image_id for x in splits.test] == [listed[3].image_id, listed[4].image_id]


def test_karpathy_split_errors_name_the_file(items, tmp_path):
    with pytest.raises(MissingDataError, match="missing Karpathy split file .*nowhere.json"):
        coco.karpathy_split(items, tmp_path / "nowhere.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"annotations": []}')
    with pytest.raises(MissingDataError, match="not a Karpathy split file"):
        coco.karpathy_split(items, bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"images": [{"cocoid": 1, "filename": "x.jpg", "split": "train"}]}))
    with pytest.raises(MissingDataError, match="leaves no images"):
        coco.karpathy_split(items, other)


def test_vocabulary_comes_from_training_captions_only(items):
    splits = coco.random_split(items, 0.1, 0.1)
    vocab = coco.build_vocabulary(splits.train, min_count=1)
    train_words = {w for x in splits.train for c in x.captions for w in words(c)}
    held_out = {w for x in splits.val + splits.test for c in x.captions for w in words(c)}
    unseen = held_out - train_words
    assert unseen  # the check below is not vacuous
    assert set(vocab.tokens[4:]) == train_words and not unseen & set(vocab.tokens)
    rare = coco.build_vocabulary(splits.train, min_count=3)
    assert len(rare) < len(vocab)


def test_encoded_captions_are_truncated_framed_and_cached(items, tmp_path):
    splits = coco.random_split(items, 0.1, 0.1)
    vocab = coco.build_vocabulary(splits.train, min_count=1)
    encoded = coco.encode_cached(splits.val, vocab, 5, tmp_path)
    assert len(encoded) == 5 * len(splits.val)
    first = encoded.caption(0).tolist()
    assert first[0] == vocab.index[BOS] and first[-1] == vocab.index[EOS] and len(first) <= 7
    assert [len(c) for c in encoded.of_image(1)] == [len(encoded.caption(i)) for i in range(5, 10)]
    (cached,) = list((tmp_path / "coco_captions").glob("*.pt"))
    again = coco.encode_cached(splits.val, vocab, 5, tmp_path)
    assert torch.equal(again.ids, encoded.ids) and list((tmp_path / "coco_captions").glob("*.pt")) == [cached]
    coco.encode_cached(splits.val, vocab, 6, tmp_path)  # another length cut is another cache entry
    assert len(list((tmp_path / "coco_captions").glob("*.pt"))) == 2


def test_datamodule_batches_pair_features_with_captions(items, tmp_path):
    splits = coco.CaptionSplits(items[:6], items[6:9], items[9:11])
    vocab = coco.build_vocabulary(splits.train, min_count=1)
    dm = coco.CocoCaptionDataModule(splits, vocab, ImageEncoderSpec(image_size=64), max_words=8, batch_size=4, cache_dir=str(tmp_path))
    assert dm.feature_shape() == (4, 512)  # a 2x2 grid of resnet18's 512 channels at 64 px
    train = next(iter(dm.train_dataloader()))
    assert train["features"].shape == (4, 4, 512) and train["features"].dtype == torch.float32
    assert train["captions"].shape[0] == 4 and (train["captions"][:, 0] == vocab.bos_id).all()
    val = next(iter(dm.val_dataloader()))
    assert val["image_ids"] == [x.image_id for x in items[6:9]]
    assert val["references"] == [list(x.captions) for x in items[6:9]]
    assert val["caption_owner"].tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert val["captions"].shape[0] == 15


def test_missing_files_name_the_path_and_the_layout(shared_data, tmp_path):
    assert coco.data_problem(shared_data) is None
    problem = coco.data_problem(tmp_path)
    assert problem and str(tmp_path / "coco" / "captions.json") in problem and "coco/images/" in problem
    folder = tmp_path / "coco"
    folder.mkdir()
    shutil.copyfile(shared_data / "coco" / "captions.json", folder / "captions.json")
    with pytest.raises(MissingDataError, match="missing image folder .*coco/images"):
        coco.read_captions(tmp_path)
    (folder / "images").mkdir()
    shutil.copyfile(shared_data / "coco" / "images" / "000000000139.jpg", folder / "images" / "000000000139.jpg")
    with pytest.raises(MissingDataError, match=r"238 image\(s\) listed in .*captions.json are missing"):
        coco.read_captions(tmp_path)
    (folder / "captions.json").write_text('{"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": []}')
    with pytest.raises(MissingDataError, match="has no captioned images"):
        coco.read_captions(tmp_path)
    (folder / "captions.json").write_text("[1, 2]")
    with pytest.raises(MissingDataError, match="not a COCO caption file"):
        coco.read_captions(tmp_path)
