"""Where data is read from and where caches are written.

The data root is read-only to us (it may be a shared, write-protected folder); anything a loader
writes (PyG's processed/, tokenised sets) goes under the cache dir.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

from platformdirs import user_cache_dir

DATA_ENV = "ATTNBENCH_DATA"
CACHE_ENV = "ATTNBENCH_CACHE"


class MissingDataError(FileNotFoundError):
    """Data files that a task needs are absent or corrupt; the message names them and the fix."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else super().__str__()


def data_root(explicit: str | os.PathLike | None = None) -> Path | None:
    """The local data root: an explicit setting, else $ATTNBENCH_DATA, else None (download when online)."""
    value = explicit if explicit is not None else os.environ.get(DATA_ENV)
    return Path(value).expanduser().resolve() if value else None


def cache_dir(explicit: str | os.PathLike | None = None) -> Path:
    value = explicit if explicit is not None else os.environ.get(CACHE_ENV)
    path = Path(value).expanduser() if value else Path(user_cache_dir("attnbench"))
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_or_build(path: Path, build: Callable[[], Any]) -> Any:
    """torch.load(path), or build() once and save it there by atomic rename. Parallel workers asking for
    the same file wait on a lock for the one that builds it, and nobody ever reads a half-written file.
    `build` returns what torch.save can store under weights_only loading (tensors, dicts, lists)."""
    import torch
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            return torch.load(path, weights_only=True)
        value = build()
        tmp = path.with_suffix(".tmp")
        torch.save(value, tmp)
        tmp.replace(path)
        return value
