"""`attnbench tune` as a SLURM job array on one shared study: two array tasks on the PostgreSQL server the storage test
starts (tests/harness/test_postgres.py), one of them requeued (`scontrol requeue`, as a preemption) while it trains a
trial. The study ends with exactly the trials asked for, and the killed trial is failed and retried once, by the
requeued task when it starts again (the trial's owner process is gone: harness/studies/tune.py _fail_dead_trials)."""

from __future__ import annotations

import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from harness.studies.tune import OWNER_ATTR, SURPLUS_ATTR
from tests.conftest import REPO
from tests.harness.test_postgres import fresh_study_storage, postgres_url  # noqa: F401 - the fixtures, reused

optuna = pytest.importorskip("optuna")

BUDGET = 4
pytestmark = [pytest.mark.timeout(420),  # a hung array fails within minutes, not at the suite's 900 s
              pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")]  # retried_trial_number


def running_trial_of(storage: str, pids: dict[int, int]):
    """(array task index, trial) of a trial that started within the last second in one of the tasks' processes, else None.
    A fresh one: the requeue must land while it trains, not as it ends."""
    names = optuna.get_all_study_names(storage)
    if not names:
        return None
    for trial in optuna.load_study(study_name=names[0], storage=storage).get_trials(states=(optuna.trial.TrialState.RUNNING,)):
        pid = str(trial.user_attrs.get(OWNER_ATTR, "")).rpartition(":")[2]
        if pid.isdigit() and int(pid) in pids and datetime.now() - trial.datetime_start < timedelta(seconds=1):
            return pids[int(pid)], trial
    return None


def task_pids(folder: Path) -> dict[int, int]:
    """{pid: array task index} from the pid files the tasks write (the script execs tune, so its pid is tune's)."""
    found = {}
    for path in folder.glob("pid_*"):
        text = path.read_text().strip()
        if text.isdigit():
            found[int(text)] = int(path.name.removeprefix("pid_"))
    return found


def test_two_array_tasks_share_a_study_and_a_requeued_trial_is_retried(slurm, shared_data, fresh_study_storage, tmp_path):  # noqa: F811
    storage = fresh_study_storage
    optuna.storages.RDBStorage(storage)  # the schema once, before the two tasks race for it
    env = {**slurm.env, "ATTNBENCH_DATA": str(shared_data), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    script = tmp_path / "tune.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --job-name=attnbench-tune --array=0-1 --cpus-per-task=1 --time=10
        #SBATCH --output={tmp_path}/tune_%a.out --open-mode=append
        cd {REPO}
        echo $$ > {tmp_path}/pid_$SLURM_ARRAY_TASK_ID
        exec {sys.executable} -m harness.cli tune cora fenchel --trials {BUDGET} --set max_epochs=40 --set patience=40 \\
            --storage {storage} --runs-dir {tmp_path}/runs
        """))
    array = slurm.sbatch(script, env)
    index, killed = slurm.wait_for(lambda: running_trial_of(storage, task_pids(tmp_path)), "a trial to start in an array task",
                                   timeout=240, every=0.2)
    slurm.requeue(f"{array}_{index}")
    states = slurm.wait_until_ended(array, timeout=300)
    logs = {i: (tmp_path / f"tune_{i}.out").read_text() for i in (0, 1)}
    assert states == {f"{array}_0": "COMPLETED", f"{array}_1": "COMPLETED"}, f"{states}\n{logs[0][-3000:]}\n{logs[1][-3000:]}\n{slurm.logs()}"

    (name,) = optuna.get_all_study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).trials
    finished = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    # A surplus trial is one a task asked for just as the other took the budget's last place: failed untrained, by design.
    surplus = [t for t in trials if t.user_attrs.get(SURPLUS_ATTR)]
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL and t not in surplus]
    # The budget exactly: no trial lost to the requeue and none run twice, the killed one failed, the rest finished.
    shown = "\n".join([str((t.number, t.state.name, t.params, t.user_attrs)) for t in trials] +
                      [f"--- task {i}:\n{logs[i][-2000:]}" for i in (0, 1)])
    assert len(finished) == BUDGET, shown
    assert [t.number for t in failed] == [killed.number] and len(trials) == BUDGET + 1 + len(surplus), shown
    assert all(t.state == optuna.trial.TrialState.FAIL for t in surplus), shown
    # `killed` was read as it started, perhaps before it stored its sampled parameters: compare with the stored trial
    (failed,) = failed
    (retry,) = [t for t in finished if optuna.storages.RetryFailedTrialCallback.retried_trial_number(t) == killed.number]
    assert retry.params == failed.params and retry.user_attrs.get("defaults") == failed.user_attrs.get("defaults"), shown
    assert len({tuple(sorted(t.params.items())) for t in finished}) == BUDGET, shown  # each configuration trained once
    # either task may find the killed trial's process gone and retry it (both share the study): the requeued one on
    # its restart, or the other at its next trial, whichever asks first
    noticed = [i for i in (0, 1) if f"trial {killed.number} was running in process" in logs[i]]
    assert noticed and all("retried once with the same parameters" in logs[i] for i in noticed), shown
    assert (tmp_path / "runs" / "params" / "cora" / "fenchel.yaml").is_file()  # the last task to finish wrote the best
