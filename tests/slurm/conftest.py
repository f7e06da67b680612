"""The SLURM cluster of tests/slurm/ (tests/slurm/cluster.py): started by the first test that needs it, stopped by its
process ids after the last test of this folder; skipped, with the reason, where it cannot run here."""

import pytest

from tests.slurm import cluster as slurm_cluster


@pytest.fixture(scope="package")
def slurm():
    reason = slurm_cluster.unavailable()
    if reason:
        pytest.skip(reason)
    running = slurm_cluster.start()
    try:
        yield running
    finally:
        running.stop()
