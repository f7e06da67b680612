"""Amazon multi-domain sentiment reviews (Blitzer et al. 2007) for domain shift.

Layout: <root>/domain_shift/amazon_blitzer/<domain>/{train,dev,test-labeled}.tsv, header `sentence<TAB>label`,
the review text CSV-quoted (it holds newlines and tabs). A domain's test-labeled.tsv is all of its labelled
reviews, train and dev included, so it serves only as the out-of-domain test set of other domains; the
in-domain test set is a fixed held-out part of the source's train.tsv (see modules/tasks/shift.py).
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

from .glue import Example
from .paths import MissingDataError, data_root

DOMAINS = ("books", "dvd", "electronics", "kitchen")
SPLITS = ("train", "dev", "test-labeled")


def domain_dir(root: Path, domain: str) -> Path:
    return root / "domain_shift" / "amazon_blitzer" / domain


def data_problem(source: str, target: str, explicit_root: str | os.PathLike | None) -> str | None:
    root = data_root(explicit_root)
    if root is None:
        return (
            "the Amazon multi-domain reviews are read from local files only; set ATTNBENCH_DATA (or --data-root) to a folder "
            "holding domain_shift/amazon_blitzer/<domain>/{train,dev,test-labeled}.tsv (see ../shared/data/MANIFEST.md for the source)"
        )
    needed = [domain_dir(root, source) / "train.tsv", domain_dir(root, source) / "dev.tsv", domain_dir(root, target) / "test-labeled.tsv"]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        return f"domain-shift data missing: {', '.join(missing)}; copy the Blitzer reviews into that layout (sentence<TAB>label, CSV-quoted)"
    return None


def read_reviews(domain: str, split: str, explicit_root: str | os.PathLike | None = None) -> list[Example]:
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; the domains are {DOMAINS}")
    root = data_root(explicit_root)
    path = domain_dir(root, domain) / f"{split}.tsv" if root is not None else None
    if path is None or not path.is_file():
        raise MissingDataError(f"{path or 'domain_shift/amazon_blitzer/' + domain + '/' + split + '.tsv'} is missing; set ATTNBENCH_DATA to the data root")
    # Reviews can exceed csv's default 128 kB field limit.
    csv.field_size_limit(sys.maxsize)
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    if rows[0] != ["sentence", "label"]:
        raise MissingDataError(f"{path} should start with the header 'sentence<TAB>label', found {rows[0]}")
    examples = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 2 or row[1] not in ("0", "1"):
            raise MissingDataError(f"{path}:{line} is not a (review, 0/1 label) row; read the folder's README for the format")
        examples.append(Example(row[0], None, int(row[1])))
    return examples
