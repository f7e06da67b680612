"""One data-parallel run started by SLURM, in the README's form (an sbatch script whose `srun` starts every rank, Lightning
reading SLURM's variables for the process group): 2 CPU tasks over gloo write one record, from rank 0, equal to the
same run's 2 processes started by Lightning itself without SLURM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.slurm.test_job_arrays import same_experiment

pytestmark = pytest.mark.timeout(360)  # a hung rank fails within minutes, not at the suite's 900 s
RUN = ["run", "cora", "softmax", "--strategy", "ddp", "--devices", "2", "--num-nodes", "1", "--set", "max_epochs=3", "--set", "patience=3"]
RANK_UMASK = {0: "022", 1: "027"}
"""Each rank's umask. A record is written with open()'s mode (0666 less the umask: harness/results/store.py), so the
record's mode names the rank that wrote it: 0644 from rank 0, 0640 from rank 1."""


def records(runs: Path) -> list[Path]:
    return sorted((runs / "records").glob("*.json"))


def two_cpus():
    """The local run's ranks get the threads srun's 1-CPU tasks get (1 each): the thread count changes a CPU run's sums."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])


def test_srun_over_two_cpu_tasks_writes_one_record_from_rank_zero_equal_to_lightnings_own_two_processes(slurm, shared_data, tmp_path):
    env = {**slurm.env, "ATTNBENCH_DATA": str(shared_data), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    runs, local = tmp_path / "slurm", tmp_path / "local"
    # Started first and waited for last: it does not depend on the cluster, and its imports overlap the job's.
    without_slurm = subprocess.Popen([sys.executable, "-m", "harness.cli", *RUN, "--runs-dir", str(local)], cwd=REPO,
                                     env={k: v for k, v in env.items() if k != "SLURM_CONF"}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, preexec_fn=two_cpus)
    script = tmp_path / "ddp.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --job-name=attnbench-ddp --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=10
        #SBATCH --output={tmp_path}/job.out
        cd {REPO}
        # --kill-on-bad-exit: a rank that fails ends the others, which would wait for it in the process group
        srun --kill-on-bad-exit=1 --output={tmp_path}/rank%t.out \\
            bash -c 'if [ "$SLURM_PROCID" = 0 ]; then umask {RANK_UMASK[0]}; else umask {RANK_UMASK[1]}; fi; exec "$@"' rank \\
            {sys.executable} -m harness.cli {' '.join(RUN)} --runs-dir {runs}
        """))
    job = slurm.sbatch(script, env)

    def explain() -> str:
        return "\n".join(f"--- {name}:\n{(tmp_path / name).read_text()[-3000:] if (tmp_path / name).exists() else '(none)'}"
                         for name in ("job.out", "rank0.out", "rank1.out"))

    try:
        states = slurm.wait_until_ended(job, timeout=240)
    except AssertionError as exc:
        without_slurm.kill()
        raise AssertionError(f"{exc}\n{explain()}") from None
    assert states == {job: "COMPLETED"}, explain()
    out, _ = without_slurm.communicate(timeout=300)
    assert without_slurm.returncode == 0, out[-3000:]

    (written,) = records(runs)
    record = json.loads(written.read_text())
    assert record["status"] == "ok" and record["epochs"] == 3
    assert record["distributed"] == {"strategy": "ddp", "devices": 2, "num_nodes": 1, "world_size": 2}
    # Rank 0 wrote it, and only rank 0 printed its summary.
    assert oct(written.stat().st_mode & 0o777) == oct(0o666 & ~int(RANK_UMASK[0], 8)), f"written by another rank\n{explain()}"
    printed = {r: (tmp_path / f"rank{r}.out").read_text() for r in (0, 1)}
    assert f'"key": "{record["key"]}"' in printed[0] and record["key"] not in printed[1], explain()
    (reference,) = records(local)
    assert same_experiment(record) == same_experiment(json.loads(reference.read_text()))
