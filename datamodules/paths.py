"""Where data is read from and where caches are written.

The data root is read-only to us (it may be a shared, write-protected folder); anything a loader
writes (PyG's processed/, tokenised sets) goes under the cache dir.
"""

from __future__ import annotations

import functools
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


CHECKOUT = Path(__file__).resolve().parents[1]
SHARED_DATA = CHECKOUT.parent / "shared" / "data"
"""`../shared/data` beside the checkout: where the Makefile looks when $ATTNBENCH_DATA is not set."""


def default_data_root() -> str | None:
    """The data root a command uses when none is given, found the way the Makefile finds it, so that
    `.venv/bin/attnbench ...` and `make ...` read the same data: $ATTNBENCH_DATA when it is set (empty: download),
    else ../shared/data beside the checkout when it holds planetoid/, else None (download when online)."""
    if DATA_ENV in os.environ:
        return os.environ[DATA_ENV] or None
    return str(SHARED_DATA) if (SHARED_DATA / "planetoid").is_dir() else None


DOWNLOAD_CHECK_TIMEOUT_S = 5.0


@functools.lru_cache(maxsize=None)
def host_unreachable(host: str, port: int = 443, timeout_s: float = DOWNLOAD_CHECK_TIMEOUT_S) -> str | None:
    """Why `host` cannot be reached (no name resolution, no route, no answer within `timeout_s`), or None; asked
    once per process (a plan checks each task). The name lookup runs in a thread: getaddrinfo has no timeout of
    its own and can hang on an offline machine."""
    import socket
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as Late

    def connect() -> None:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(connect).result(timeout=timeout_s)
    except Late:
        return f"{host} did not answer within {timeout_s:.0f} s"
    except OSError as exc:
        return f"cannot reach {host}: {exc}"
    finally:
        pool.shutdown(wait=False)
    return None


def download_problem(what: str, host: str, local_layout: str) -> str | None:
    """None when `what` can be downloaded from `host` now; else a message naming the local alternative. Asked by
    the tasks' data checks when no data root is set, so that an offline machine is refused before anything runs
    instead of recording every run as failed."""
    why = host_unreachable(host)
    if why is None:
        return None
    return (f"{what}: no data root is set ($ATTNBENCH_DATA, --data-root, or ../shared/data beside the checkout) and the "
            f"download would fail ({why}). Set ATTNBENCH_DATA (or --data-root) to a folder holding {local_layout}")


ENVIRONMENT_FAULT_TYPES = ("MissingDataError", "CacheLockTimeout", "URLError", "ConnectionError", "ClientConnectorError",
                           "ClientConnectorDNSError", "gaierror", "OfflineModeIsEnabled", "LocalEntryNotFoundError")
"""Exception type names of failures that belong to the machine (data, weights or files absent, no network), not to the
run's configuration: such a run is retried by the next `bench`, and records of them from older versions are too."""


def is_environment_fault(exc: BaseException) -> bool:
    """A missing file or an unreachable download anywhere in the exception's chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, FileNotFoundError) or type(exc).__name__ in ENVIRONMENT_FAULT_TYPES:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def is_environment_fault_message(error: str | None) -> bool:
    """The same, for a record's error line ("TypeName: message"), which is all an older record kept."""
    return bool(error) and error.split(":", 1)[0].strip() in (*ENVIRONMENT_FAULT_TYPES, "FileNotFoundError")


def data_root_problem(root: str | os.PathLike | None, given_by: str) -> str | None:
    """Why `root` cannot be a data root (None when it can): a folder that is not there is a typo in the path, and
    a task's own check would instead list every file it misses in it and suggest what the path's source can do."""
    if root is None:
        return None
    path = Path(root).expanduser()
    if path.is_dir():
        return None
    what = "is a file, not a folder" if path.exists() else "folder does not exist"
    return f"data root {path} ({given_by}): {what}; point {given_by} at the folder that holds planetoid/, glue/, ..."


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
