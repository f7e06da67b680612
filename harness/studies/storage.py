"""Optuna storage URLs checked before any trial: a mistyped scheme, a missing folder or an unreachable
database server is one line and exit code 2, not a traceback after the first trial's training.

The scheme is read here before SQLAlchemy is imported (seconds at start-up), so that the commonest mistake
answers at once; the rest (the database driver, the connection) is SQLAlchemy's, which Optuna's RDB storage
uses too, so what passes here is what Optuna will open."""

from __future__ import annotations

import re
from pathlib import Path

CONNECT_TIMEOUT_S = 5
"""How long a database server may take to answer the check: an unreachable host is refused in seconds,
not after the driver's own timeout (minutes for a firewalled port)."""

RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
"""SQLAlchemy dialects Optuna supports for its RDB storage (a driver may follow: postgresql+psycopg)."""

DRIVER_PACKAGES = {"postgresql": "psycopg[binary] (pip install 'psycopg[binary]')", "mysql": "mysqlclient (or PyMySQL, with mysql+pymysql://...)"}


class StorageError(ValueError):
    """A storage URL that cannot work; the message is the whole explanation."""


def check_storage(url: str) -> None:
    """Raise StorageError when `url` names no storage Optuna can open from here; write nothing."""
    if url.startswith("journal:"):
        _check_journal(url.removeprefix("journal:"), url)
        return
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if scheme is None:
        raise StorageError(f"--storage {url!r}: not a storage URL; use sqlite:///path/optuna.db, "
                           f"postgresql://user:password@host:5432/db or journal:/path/file.log")
    dialect = scheme.group(1).split("+")[0]
    if dialect not in RDB_SCHEMES:
        raise StorageError(f"--storage {url!r}: unknown scheme {scheme.group(1)!r}; use sqlite:///path/optuna.db, "
                           f"postgresql://user:password@host:5432/db or journal:/path/file.log")
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    try:
        parsed = make_url(url)
        dialect_class = parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StorageError(f"--storage {url!r}: {exc}") from None
    shown = parsed.render_as_string(hide_password=True)
    try:
        dialect_class.import_dbapi()
    except ImportError as exc:
        package = DRIVER_PACKAGES.get(dialect, "its database driver")
        raise StorageError(f"--storage {shown}: the driver is not installed ({exc}); install {package}") from None
    if dialect == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            folder = Path(parsed.database).expanduser().resolve().parent
            if not folder.is_dir():
                raise StorageError(f"--storage {shown}: the folder {folder} does not exist; create it first")
        return
    engine = create_engine(parsed, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}, poolclass=_null_pool())
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc).splitlines()[0]
        raise StorageError(f"--storage {shown}: cannot connect ({reason}); is the server running and reachable "
                           f"from here (checked with a {CONNECT_TIMEOUT_S} s timeout)?") from None
    finally:
        engine.dispose()


def _check_journal(path: str, url: str) -> None:
    if not path:
        raise StorageError(f"--storage {url!r}: name the journal file, e.g. journal:/shared/optuna.log")
    file = Path(path).expanduser()
    if file.is_dir():
        raise StorageError(f"--storage {url!r}: {file} is a folder; name a file in it, e.g. journal:{file / 'optuna.log'}")
    folder = file.resolve().parent
    if not folder.is_dir():
        raise StorageError(f"--storage {url!r}: the folder {folder} does not exist; create it first")


def _null_pool():
    from sqlalchemy.pool import NullPool

    return NullPool  # one connection for the check, closed at once
