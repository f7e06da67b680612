"""GLUE and Amazon-review readers on the real local files, their error messages, and the token cache."""

import pytest
import torch

from datamodules import glue, reviews
from datamodules.paths import MissingDataError
from datamodules.text import TextDataModule, TextSplits, holdout, subsample, tokenize_cached
from modules.hosts.text_encoder import minilm_tokenizer

# (train, dev) row counts of the official GLUE files (MANIFEST.md lists the same numbers).
GLUE_SIZES = {"cola": (8551, 1043), "sst2": (67349, 872), "mrpc": (3668, 408), "stsb": (5749, 1500), "rte": (2490, 277), "wnli": (635, 71)}


@pytest.mark.parametrize("name", sorted(GLUE_SIZES))
def test_glue_reads_official_files(shared_data, name):
    train, dev = glue.read_split(name, "train", shared_data), glue.read_split(name, "dev", shared_data)
    assert (len(train), len(dev)) == GLUE_SIZES[name]
    task = glue.GLUE_TASKS[name]
    labels = {e.label for e in train}
    if task.is_regression:
        assert min(labels) >= 0.0 and max(labels) <= 5.0
    else:
        assert labels == set(range(task.num_labels))
    pairs = {e.text_b is not None for e in dev}
    assert pairs == {len(task.text_columns) == 2}
    assert all(e.text_a.strip() for e in dev)


def test_glue_labels_follow_the_hub_order(shared_data):
    rte = glue.read_split("rte", "dev", shared_data)
    # The first RTE dev pair (Christopher Reeve's widow) is "not_entailment", id 1 in the HF `glue` dataset.
    assert rte[0].text_a.startswith("Dana Reeve") and rte[0].label == 1


@pytest.mark.parametrize("name", ["mnli", "qqp", "qnli"])
def test_absent_glue_task_names_the_missing_files(shared_data, name):
    problem = glue.data_problem(name, shared_data)
    folder = glue.GLUE_TASKS[name].folder
    assert problem and f"glue/{folder}/train.tsv" in problem and "put the official GLUE TSVs there" in problem
    with pytest.raises(MissingDataError, match="train.tsv"):
        glue.read_split(name, "train", shared_data)


def test_glue_wrong_header_and_truncated_row(tmp_path):
    folder = tmp_path / "glue" / "RTE"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("index\tpremise\thypothesis\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(MissingDataError, match="no column"):
        glue.read_split("rte", "train", tmp_path)
    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\n")
    with pytest.raises(MissingDataError, match="truncated"):
        glue.read_split("rte", "train", tmp_path)
    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(MissingDataError, match="label 'maybe'"):
        glue.read_split("rte", "train", tmp_path)


def test_reviews_are_read_with_csv_quoting(shared_data):
    train = reviews.read_reviews("books", "train", shared_data)
    dev = reviews.read_reviews("books", "dev", shared_data)
    test = reviews.read_reviews("kitchen", "test-labeled", shared_data)
    assert (len(train), len(dev), len(test)) == (1700, 300, 2000)
    assert sum(e.label for e in train) == 850 and sum(e.label for e in test) == 1000
    # Title, newline and tab, then the body: a reader without quote handling would split this row.
    assert "\n" in train[0].text_a


def test_reviews_missing_file_and_bad_domain(tmp_path, shared_data):
    problem = reviews.data_problem("books", "dvd", tmp_path)
    assert problem and "books/train.tsv" in problem and "dvd/test-labeled.tsv" in problem
    assert reviews.data_problem("books", "dvd", shared_data) is None
    with pytest.raises(ValueError, match="unknown domain"):
        reviews.read_reviews("toys", "train", shared_data)


def test_holdout_and_subsample_are_fixed_and_disjoint(shared_data):
    train = glue.read_split("rte", "train", shared_data)
    rest, held = holdout(train, 0.1)
    again_rest, again_held = holdout(train, 0.1)
    assert held == again_held and rest == again_rest
    assert len(held) == 249 and len(rest) + len(held) == len(train)
    assert not {id(e) for e in held} & {id(e) for e in rest}
    assert subsample(rest, 100) == subsample(rest, 100) and len(subsample(rest, 100)) == 100


def test_tokenised_sets_are_cached_outside_the_data_root(tmp_path, shared_data):
    tokenizer = minilm_tokenizer()
    examples = glue.read_split("rte", "dev", shared_data)[:40]
    before = sorted(p.name for p in shared_data.rglob("*"))
    first = tokenize_cached(examples, tokenizer, 64, tmp_path)
    files = list((tmp_path / "text").glob("*.pt"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    second = tokenize_cached(examples, tokenizer, 64, tmp_path)
    # timing is not asserted: an unchanged modification stamp shows the cache file was not rewritten
    assert files[0].stat().st_mtime_ns == mtime and torch.equal(first.ids, second.ids)
    tokenize_cached(examples, tokenizer, 32, tmp_path)  # another length is another cache entry
    assert len(list((tmp_path / "text").glob("*.pt"))) == 2
    assert sorted(p.name for p in shared_data.rglob("*")) == before
    ids, types, label = first[0]
    assert len(ids) <= 64 and ids[0] == tokenizer.cls_token_id and int(types.max()) == 1 and label == examples[0].label


def test_batches_pad_to_their_longest_member(tmp_path, shared_data):
    examples = glue.read_split("sst2", "dev", shared_data)[:50]
    dm = TextDataModule(TextSplits(examples, examples, {"dev": examples}), minilm_tokenizer(), max_length=32, batch_size=8, cache_dir=tmp_path)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    assert batch["attention_mask"].sum(1).max() == batch["input_ids"].shape[1]
    assert ((batch["input_ids"] == 0) == (batch["attention_mask"] == 0)).all()
    assert len(dm.test_dataloader()) == 1
