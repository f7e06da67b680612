"""Which code a run or a command came from: the git commit and the installed versions.

Apart from harness/run/runner.py (which imports torch and Lightning) so that `attnbench --version` answers
without importing either: versions come from the installed metadata, never from importing the package."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The checkout's commit, with "-dirty" when tracked files differ from it; "unknown" outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def installed_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def version_line() -> str:
    """`attnbench --version`: attnbench with its commit, torch, Lightning and Python."""
    return (f"attnbench {installed_version('attnbench')} (commit {git_commit()}), torch {installed_version('torch')}, "
            f"lightning {installed_version('lightning')}, python {sys.version.split()[0]}")
