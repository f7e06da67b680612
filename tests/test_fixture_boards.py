"""Golden boards: every committed suite's board, rendered from a fixed set of records, must come out byte for
byte as tests/fixtures/boards/expected holds it. Records, suites and tuned parameters are all fixed here, so
any difference is a change in planning, record reading, statistics or rendering: intended ones are accepted
by re-rendering the expected files with tests/fixtures/render_boards.py (its docstring says when) and
reviewing their diff in the same commit.

(Until the results-as-data work of issue #16 the expected files were the boards of the flat pre-move harness,
which proved that moving the harness into its stage packages changed nothing; that job is done, and they are
now the current renderer's own output.)"""

import os
from pathlib import Path

import pytest

from harness.plan.suite import list_suites
from tests.fixtures.render_boards import EXPECTED, load_records, render_all


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, shared_data_root) -> Path:
    root = tmp_path_factory.mktemp("boards")
    load_records(root / "runs")
    render_all(root / "out", root / "runs", shared_data_root)
    return root / "out"


@pytest.fixture(scope="module")
def shared_data_root() -> Path:
    from tests.conftest import SHARED_DATA

    root = Path(os.environ.get("ATTNBENCH_DATA") or SHARED_DATA)
    if not (root / "planetoid").is_dir():
        pytest.skip(f"no local data at {root}: which optional tasks a suite skips, and every trivial baseline, depend on it")
    return root


EXPECTED_FILES = sorted(p.relative_to(EXPECTED).as_posix() for p in EXPECTED.rglob("*") if p.is_file())


def test_every_committed_suite_has_expected_boards():
    for suite in list_suites():
        for ext in ("md", "csv", "html"):
            assert f"{suite}.{ext}" in EXPECTED_FILES
    assert {"tuned/quick.md", "tuned/quick.csv", "tuned/quick.html"} <= set(EXPECTED_FILES)


@pytest.mark.parametrize("name", EXPECTED_FILES)
def test_board_bytes_unchanged(rendered, name):
    assert (rendered / name).read_bytes() == (EXPECTED / name).read_bytes(), (
        f"{name} differs from the golden board; if the change is intended, run tests/fixtures/render_boards.py and review the diff")
