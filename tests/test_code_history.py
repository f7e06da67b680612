"""The code says what a thing does and why, never which issue changed it: the git log and the records' source
versions (docs/CHANGELOG.md) already say when and why. This scans every comment and string in the project's
packages for an issue reference ("issue 51", "issue #18", "issues 35 and 51")."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "modules", "datamodules")
ISSUE_REFERENCE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)
"""'issue 51', 'Issue 51', 'issue #18', 'issues 35': an issue named by its number."""


def issue_references(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line of `text` that names an issue by number."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if ISSUE_REFERENCE.search(line)]


def test_no_issue_references_in_the_packages():
    found = [f"{path.relative_to(REPO)}:{n}: {line}"
             for package in PACKAGES for path in sorted((REPO / package).rglob("*"))
             if path.suffix in (".py", ".yaml", ".json") and path.is_file()
             for n, line in issue_references(path.read_text(encoding="utf-8"))]
    assert not found, ("the code names issues (say what and why instead; git log says when):\n" + "\n".join(found))


@pytest.mark.parametrize("line, named", [
    ("# the rule was 0.1% until issue 51", True),
    ('"""What issue #18 measured."""', True),
    ("(Issues 35 and 51)", True),
    ("# a tissue 5 cells thick", False),
    ("# the issue is that the mask drops queries", False),
])
def test_the_scan_finds_issue_numbers_and_nothing_else(line, named):
    assert bool(issue_references(line)) is named
