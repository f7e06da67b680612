"""GLUE (Wang et al. 2018): the nine tasks read from local GLUE TSV folders, or from the Hugging Face hub.

Local layout (the official GLUE zips, and ../shared/data): <root>/glue/<Folder>/{train,dev,test}.tsv, MNLI with
dev_matched.tsv and dev_mismatched.tsv. Test labels are not public, so the benchmark reports on the dev
sets and selects models on a fixed held-out part of train (see datamodules/text.py).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from .paths import MissingDataError, data_root


@dataclass(frozen=True)
class Example:
    text_a: str
    text_b: str | None
    label: float | int


@dataclass(frozen=True)
class GlueTask:
    name: str
    folder: str
    text_columns: tuple[str, ...]
    label_column: str
    labels: tuple[str, ...] | None
    """Label strings in the Hugging Face `glue` dataset's id order; None for regression (STS-B)."""
    eval_files: tuple[str, ...] = ("dev",)
    """The dev file of each reported evaluation set (MNLI: matched, then mismatched)."""
    hub_eval_splits: tuple[str, ...] = ("validation",)
    hub_text_columns: tuple[str, ...] = ()
    headerless_columns: dict[str, int] | None = None
    """CoLA's train/dev files have no header: column name -> index."""

    @property
    def num_labels(self) -> int:
        return len(self.labels) if self.labels else 1

    @property
    def is_regression(self) -> bool:
        return self.labels is None


GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask("cola", "CoLA", ("sentence",), "label", ("0", "1"), hub_text_columns=("sentence",),
                 headerless_columns={"label": 1, "sentence": 3}),
        GlueTask("sst2", "SST-2", ("sentence",), "label", ("0", "1"), hub_text_columns=("sentence",)),
        GlueTask("mrpc", "MRPC", ("#1 String", "#2 String"), "Quality", ("0", "1"), hub_text_columns=("sentence1", "sentence2")),
        GlueTask("qqp", "QQP", ("question1", "question2"), "is_duplicate", ("0", "1"), hub_text_columns=("question1", "question2")),
        GlueTask("stsb", "STS-B", ("sentence1", "sentence2"), "score", None, hub_text_columns=("sentence1", "sentence2")),
        GlueTask("mnli", "MNLI", ("sentence1", "sentence2"), "gold_label", ("entailment", "neutral", "contradiction"),
                 eval_files=("dev_matched", "dev_mismatched"), hub_eval_splits=("validation_matched", "validation_mismatched"),
                 hub_text_columns=("premise", "hypothesis")),
        GlueTask("qnli", "QNLI", ("question", "sentence"), "label", ("entailment", "not_entailment"), hub_text_columns=("question", "sentence")),
        GlueTask("rte", "RTE", ("sentence1", "sentence2"), "label", ("entailment", "not_entailment"), hub_text_columns=("sentence1", "sentence2")),
        GlueTask("wnli", "WNLI", ("sentence1", "sentence2"), "label", ("0", "1"), hub_text_columns=("sentence1", "sentence2")),
    )
}


def glue_dir(root: Path, task: GlueTask) -> Path:
    return root / "glue" / task.folder


def required_files(task: GlueTask) -> list[str]:
    return ["train", *task.eval_files]


def data_problem(name: str, explicit_root: str | os.PathLike | None) -> str | None:
    """None if the task can be read; otherwise which files are missing and where to put them."""
    task = GLUE_TASKS[name]
    root = data_root(explicit_root)
    if root is None:
        try:
            import datasets  # noqa: F401
        except ImportError:
            return (
                f"GLUE {task.folder}: no local data root is set and the Hugging Face `datasets` package is not installed; "
                f"set ATTNBENCH_DATA (or --data-root) to a folder holding glue/{task.folder}/*.tsv, or pip install 'attnbench[hub]' to download"
            )
        from .paths import download_problem

        return download_problem(f"GLUE {task.folder}", "huggingface.co", f"glue/{task.folder}/*.tsv")
    folder = glue_dir(root, task)
    missing = [f"{folder}/{split}.tsv" for split in required_files(task) if not (folder / f"{split}.tsv").is_file()]
    if missing:
        return (
            f"GLUE {task.folder} is missing {', '.join(missing)}; put the official GLUE TSVs there "
            f"(the layout of the GLUE download script: glue/{task.folder}/train.tsv, {', '.join(f + '.tsv' for f in task.eval_files)})"
        )
    return None


def read_tsv(path: Path, task: GlueTask) -> list[Example]:
    """GLUE TSVs are read without quote handling: some rows hold unbalanced double quotes."""
    with open(path, encoding="utf-8-sig", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    if task.headerless_columns is not None:
        columns = task.headerless_columns
    else:
        columns = {name: i for i, name in enumerate(rows[0])}
        rows = rows[1:]
        needed = [*task.text_columns, task.label_column]
        absent = [c for c in needed if c not in columns]
        if absent:
            raise MissingDataError(f"{path} has no column(s) {absent}; its header is {list(columns)}. Is it the GLUE {task.folder} file?")
    text_idx = [columns[c] for c in task.text_columns]
    label_idx = columns[task.label_column]
    label_ids = {label: i for i, label in enumerate(task.labels)} if task.labels else None
    examples = []
    for line, row in enumerate(rows, start=2):
        if len(row) <= max(*text_idx, label_idx):
            raise MissingDataError(f"{path}:{line} has {len(row)} fields; the file is truncated or not a GLUE {task.folder} TSV")
        raw = row[label_idx]
        if label_ids is None:
            label: float | int = float(raw)
        elif raw in label_ids:
            label = label_ids[raw]
        else:
            raise MissingDataError(f"{path}:{line} has label {raw!r}; GLUE {task.folder} labels are {list(label_ids)}")
        texts = [row[i] for i in text_idx]
        examples.append(Example(texts[0], texts[1] if len(texts) > 1 else None, label))
    return examples


def read_split(name: str, split: str, explicit_root: str | os.PathLike | None = None) -> list[Example]:
    """`split` is "train" or one of the task's eval files ("dev", "dev_matched", ...)."""
    task = GLUE_TASKS[name]
    root = data_root(explicit_root)
    if root is None:
        problem = data_problem(name, None)
        if problem:
            raise MissingDataError(problem)
        return _read_hub(task, split)
    path = glue_dir(root, task) / f"{split}.tsv"
    if not path.is_file():
        raise MissingDataError(
            f"{path} is missing; put the official GLUE {task.folder} TSVs in {path.parent} "
            f"or point --data-root / ATTNBENCH_DATA at a folder holding glue/{task.folder}/{split}.tsv"
        )
    return read_tsv(path, task)


def _read_hub(task: GlueTask, split: str) -> list[Example]:
    """Online path: the `glue` dataset from the Hugging Face hub (labels already use our id order)."""
    import datasets

    hub_split = "train" if split == "train" else task.hub_eval_splits[task.eval_files.index(split)]
    rows = datasets.load_dataset("glue", task.name, split=hub_split)
    columns = task.hub_text_columns
    return [
        Example(row[columns[0]], row[columns[1]] if len(columns) > 1 else None, float(row["label"]) if task.is_regression else int(row["label"]))
        for row in rows
    ]
