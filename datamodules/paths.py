"""Where data is read from and where caches are written.

The data root is read-only to us (it may be a shared, write-protected folder); anything a loader
writes (PyG's processed/, tokenised sets) goes under the cache dir.
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

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


LOCK_TIMEOUT_ENV = "ATTNBENCH_LOCK_TIMEOUT_S"
DEFAULT_LOCK_TIMEOUT_S = 3 * 3600.0
"""Longer than any cache build we know (COCO features on one CPU: about an hour), short of forever."""


class CacheLockTimeout(TimeoutError):
    """Waited too long for a cache lock; the message names the lock file and how to clear a stale one."""


def lock_timeout_s() -> float:
    value = os.environ.get(LOCK_TIMEOUT_ENV)
    return float(value) if value else DEFAULT_LOCK_TIMEOUT_S


@contextmanager
def cache_lock(lock_path: Path | str, timeout_s: float | None = None) -> Iterator[None]:
    """An inter-process lock on a cache entry, with a timeout: on a shared filesystem without working flock a
    builder that was killed (OOM) leaves its lock behind, and waiting forever would hang every worker."""
    from filelock import FileLock, Timeout

    timeout_s = lock_timeout_s() if timeout_s is None else timeout_s
    try:
        with FileLock(str(lock_path), timeout=timeout_s):
            yield
    except Timeout:
        raise CacheLockTimeout(
            f"waited {timeout_s:.0f} s for the cache lock {lock_path}; another process is building this cache entry, "
            f"or one that was killed left the lock behind. If no attnbench process is running, delete {lock_path} and "
            f"retry (set {LOCK_TIMEOUT_ENV} to wait longer)"
        ) from None


def unique_temp_path(path: Path) -> Path:
    """A temp name next to `path` that no other process, on this node or another sharing the filesystem, uses."""
    return path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def load_or_build(path: Path, build: Callable[[], Any], *, mmap: bool = False) -> Any:
    """torch.load(path), or build() once and save it there by atomic rename. Parallel workers asking for
    the same file wait on a lock for the one that builds it, and nobody ever reads a half-written file.
    `build` returns what torch.save can store under weights_only loading (tensors, dicts, lists).
    `mmap`: map the file instead of reading it (large feature tensors: pages are shared by every worker
    process on the node through the page cache, and only the rows a batch touches are read)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():  # built already: no lock needed, the file appeared by atomic rename
        return torch.load(path, weights_only=True, mmap=mmap)
    with cache_lock(str(path) + ".lock"):
        if path.is_file():
            return torch.load(path, weights_only=True, mmap=mmap)
        value = build()
        tmp = unique_temp_path(path)
        try:
            torch.save(value, tmp)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return torch.load(path, weights_only=True, mmap=True) if mmap else value
