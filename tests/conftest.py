import os
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = Path(os.environ.get("ATTNBENCH_DATA", SHARED_DATA))
    if not (root / "planetoid").is_dir():
        pytest.skip(f"no local data at {root}; set ATTNBENCH_DATA")
    return root


def pytest_configure(config):
    warnings.filterwarnings("ignore", module="lightning")
