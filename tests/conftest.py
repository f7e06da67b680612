import os
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()


def pytest_configure(config):
    warnings.filterwarnings("ignore", module="lightning")
    # Every test process shares one cache of processed data, outside the read-only data root.
    os.environ.setdefault("ATTNBENCH_CACHE", str(REPO / "tests" / "artifacts" / "cache"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = Path(os.environ.get("ATTNBENCH_DATA") or SHARED_DATA)
    if not (root / "planetoid").is_dir():
        pytest.skip(f"no local data at {root}; set ATTNBENCH_DATA to a folder with planetoid/")
    return root


@pytest.fixture
def runs(tmp_path) -> Path:
    return tmp_path / "runs"
