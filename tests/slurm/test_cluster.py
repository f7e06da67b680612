"""The cluster fixture says why it cannot run, and how to fix it, rather than failing (tests/slurm/cluster.py)."""

import os

from tests.slurm import cluster


def test_without_the_programs_or_without_root_the_reason_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no SLURM client on it (the daemons' /usr/sbin is looked at too)
    reason = cluster.unavailable()
    assert reason and "sbatch" in reason and "`make slurm` installs" in reason
    monkeypatch.undo()
    if cluster.unavailable() is None:  # installed here: then only root is missing
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        assert "must run as root" in cluster.unavailable()
