"""Every committed suite's board, rendered from a fixed set of records, must come out byte for byte as the
harness rendered it before it was reorganised into stage packages (tests/fixtures/boards/expected, written
by the flat harness/ of commit 37ff872 with tests/fixtures/render_pre_move.py). Records, suites and tuned parameters are all fixed here, so any difference
is a change in planning, record reading, statistics or rendering."""

import json
import os
from pathlib import Path

import pytest

from harness.plan.suite import list_suites

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "boards"
EXPECTED = FIXTURES / "expected"
DATA_PLACEHOLDER = "$ATTNBENCH_DATA"
"""Skipped-task messages name the data root; the expected files hold this in its place."""


def render_all(out: Path, runs: Path, data_root: Path) -> list[Path]:
    from harness.report.leaderboard import write_leaderboard

    paths = []
    for suite in list_suites():
        paths += write_leaderboard(suite, runs=str(runs), out_dir=out, data_root=str(data_root))
    paths += write_leaderboard("quick", runs=str(runs), out_dir=out / "tuned", data_root=str(data_root),
                               tuned_params_dir=FIXTURES / "params")
    # Loaders may name the data root as given or resolved (through a symlinked ../shared, say): both spellings,
    # the longer first, become the placeholder.
    spellings = sorted({str(data_root), str(Path(data_root).resolve())}, key=len, reverse=True)
    for path in paths:
        text = path.read_text()
        for spelling in spellings:
            text = text.replace(spelling, DATA_PLACEHOLDER)
        path.write_text(text)
    return paths


def load_records(runs: Path) -> None:
    from harness.results.store import RecordStore

    store = RecordStore(runs)
    for line in (FIXTURES / "records.jsonl").read_text().splitlines():
        store.write(json.loads(line))


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
        pytest.skip(f"no local data at {root}: which optional tasks a suite skips depends on it")
    return root


EXPECTED_FILES = sorted(p.relative_to(EXPECTED).as_posix() for p in EXPECTED.rglob("*") if p.is_file())


def test_every_committed_suite_has_expected_boards():
    for suite in list_suites():
        for ext in ("md", "csv", "html"):
            assert f"{suite}.{ext}" in EXPECTED_FILES
    assert {"tuned/quick.md", "tuned/quick.csv", "tuned/quick.html"} <= set(EXPECTED_FILES)


@pytest.mark.parametrize("name", EXPECTED_FILES)
def test_board_bytes_unchanged(rendered, name):
    assert (rendered / name).read_bytes() == (EXPECTED / name).read_bytes(), f"{name} differs from the board rendered before the move"


if __name__ == "__main__":  # writes the expected files: only with the code they are meant to pin down
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.conftest import SHARED_DATA

    with tempfile.TemporaryDirectory() as tmp:
        load_records(Path(tmp) / "runs")
        render_all(EXPECTED, Path(tmp) / "runs", SHARED_DATA)
