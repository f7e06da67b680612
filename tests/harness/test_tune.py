"""attnbench tune: studies, the defaults as trial 0, resuming a study's budget, export and tuned suite rows."""

import optuna
import pytest
import yaml

from harness.plan.tuned import load_tuned
from harness.studies import tune as tuning
from harness.cli import main
from harness.plan.planner import plan
from harness.plan.suite import load_suite
from modules.tasks import Metric, get_task

FAST = {"max_epochs": 4, "patience": 4}


def _storage(tmp_path):
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def test_study_names_are_deterministic_and_follow_params():
    a = tuning.study_name("cora", "bam-weibull", {"lr": 0.005}, False)
    assert a == tuning.study_name("cora", "bam-weibull", {"lr": 0.005}, False)
    assert a != tuning.study_name("cora", "bam-weibull", {"lr": 0.01}, False)
    assert a != tuning.study_name("cora", "bam-weibull", {"lr": 0.005}, True)
    assert a.startswith("cora/bam-weibull/")


def test_tune_runs_defaults_first_resumes_its_budget_and_exports(shared_data, tmp_path):
    storage = _storage(tmp_path)
    kwargs = dict(params=FAST, storage=storage, data_root=str(shared_data), log=lambda *_: None)
    result = tuning.tune("cora", "fenchel", trials=3, **kwargs)
    study = optuna.load_study(study_name=result.study, storage=storage)
    assert len(study.trials) == 3
    first = study.trials[0]
    assert first.user_attrs["defaults"] is True and first.params == {}
    assert {"alpha", "prior"} <= set(study.trials[1].params)
    assert result.default_value == pytest.approx(first.value)
    # The monitor is val/loss (lower is better): the best trial is no worse than the defaults.
    assert result.best_value <= result.default_value + 1e-12
    assert result.trials["complete"] + result.trials["pruned"] == 3
    # Every validation metric of the best epoch comes along: cora monitors val/loss, people read val/acc.
    assert set(result.default_metrics) >= {"val/loss", "val/acc"}
    assert result.default_metrics["val/loss"] == pytest.approx(result.default_value)

    # Same budget again: nothing to do. One more trial of budget: exactly one more trial runs.
    tuning.tune("cora", "fenchel", trials=3, **kwargs)
    assert len(optuna.load_study(study_name=result.study, storage=storage).trials) == 3
    tuning.tune("cora", "fenchel", trials=4, **kwargs)
    assert len(optuna.load_study(study_name=result.study, storage=storage).trials) == 4

    path = tuning.export(result, tmp_path / "params")
    assert path == tmp_path / "params" / "cora" / "fenchel.yaml"
    data = load_tuned("cora", "fenchel", tmp_path / "params")
    assert data["attention"]["name"] == "fenchel" and data["validation"]["metric"] == "val/loss"
    assert data["tuning"]["trials"]["complete"] >= 1


def test_the_defaults_enqueued_twice_by_racing_processes_train_once(shared_data, tmp_path):
    """Processes that open an empty shared study at the same moment each enqueue the defaults trial: the later copy
    ends untrained (failed, marked surplus, outside the budget) and the budget goes to configurations of their own."""
    storage = _storage(tmp_path)
    kwargs = dict(params=FAST, storage=storage, data_root=str(shared_data), log=lambda *_: None)
    result = tuning.tune("cora", "fenchel", trials=1, **kwargs)
    study = optuna.load_study(study_name=result.study, storage=storage)
    study.enqueue_trial({}, user_attrs={tuning.DEFAULTS_ATTR: True})  # the racing process's copy
    tuning.tune("cora", "fenchel", trials=2, **kwargs)
    trials = optuna.load_study(study_name=result.study, storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[1].user_attrs[tuning.SURPLUS_ATTR] is True and trials[1].user_attrs[tuning.DEFAULTS_ATTR] is True
    assert trials[2].params and not trials[2].user_attrs.get(tuning.DEFAULTS_ATTR)


def test_a_monitor_that_is_never_logged_fails_loudly(shared_data, monkeypatch):
    from harness.run.runner import fit_for_validation
    from harness.plan.spec import make_spec

    task_cls = type(get_task("cora"))
    monkeypatch.setattr(task_cls, "monitor", Metric("val/not_logged"))
    spec = make_spec("cora", "softmax", 0, {"max_epochs": 1})
    with pytest.raises(KeyError, match="val/not_logged.*logged metrics"):
        fit_for_validation(spec, data_root=str(shared_data))


def test_tuned_parameters_add_their_own_rows_to_a_suite(tmp_path, shared_data):
    params_dir = tmp_path / "params"
    (params_dir / "cora").mkdir(parents=True)
    (params_dir / "cora" / "bam-weibull.yaml").write_text(yaml.safe_dump({
        "task": "cora", "variant": "bam-weibull", "attention": {"name": "bam-weibull", "k": 123.0, "kl_weight": 0.5},
        "params": {"lr": 0.004}, "tuning": {"trials": {"complete": 20}, "seconds": 300.0},
    }))
    suite = load_suite("quick")
    the_plan = plan(suite, str(shared_data), variant_filter="softmax,bam-weibull", tuned_dir=params_dir)
    tuned = [s for s in the_plan.specs if s.label == "bam-weibull (tuned)"]
    assert len(tuned) == len(suite.seeds)
    assert all(s.task == "cora" and s.attention["k"] == 123.0 and s.params["lr"] == 0.004 for s in tuned)
    assert "citeseer x bam-weibull" in the_plan.untuned
    # softmax has nothing to tune (`tune` refuses it): bench must not tell the user to run `attnbench tune` for it
    assert not any("softmax" in pair for pair in the_plan.untuned)
    defaults = [s for s in the_plan.specs if s.label == "bam-weibull" and s.task == "cora"]
    assert len(defaults) == len(suite.seeds) and {s.key for s in defaults}.isdisjoint(s.key for s in tuned)
    # a board row is re-run by its label: the tuned row alone, or the default row alone
    only_tuned = plan(suite, str(shared_data), variant_filter="bam-weibull (tuned)", tuned_dir=params_dir).specs
    assert [s.key for s in only_tuned] == [s.key for s in tuned]
    only_default = plan(suite, str(shared_data), variant_filter="bam-weibull", tuned_dir=params_dir).specs
    assert {s.label for s in only_default} == {"bam-weibull", "bam-weibull (tuned)"}  # the variant's name keeps both
    assert plan(suite, str(shared_data), variant_filter="*(tuned)", tuned_dir=params_dir).specs == only_tuned


def test_a_malformed_tuned_file_is_named(tmp_path):
    path = tmp_path / "cora" / "fenchel.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("variant: softmax\n")
    with pytest.raises(ValueError, match="fenchel.yaml"):
        load_tuned("cora", "fenchel", tmp_path)


def test_cli_tune_needs_a_pair_or_a_suite(capsys):
    assert main(["tune", "cora"]) == 2
    assert "TASK and a VARIANT" in capsys.readouterr().err
    assert main(["tune", "cora", "bam-weibul"]) == 2
    assert "bam-weibull" in capsys.readouterr().err


def test_a_killed_tuning_trial_is_failed_and_retried(shared_data, tmp_path):
    """SIGKILL a `tune` process in the middle of a trial: the next `tune` marks that trial failed (its
    heartbeat stopped) and runs it again, so the study still reaches its budget."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    storage = _storage(tmp_path)
    env = {**os.environ, "ATTNBENCH_TUNE_HEARTBEAT_S": "1", "ATTNBENCH_TUNE_GRACE_S": "2", "OMP_NUM_THREADS": "1",
           "ATTNBENCH_DATA": str(shared_data), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "harness.cli", "tune", "cora", "fenchel", "--trials", "1", "--storage", storage,
               "--set", "max_epochs=150", "--set", "patience=150", "--runs-dir", str(tmp_path / "runs"),
               "--params-dir", str(tmp_path / "params")]
    # The schema first: two processes creating it at once (this poll and the victim) can collide on
    # alembic_version's primary key, as once seen in CI.
    optuna.storages.RDBStorage(storage)
    log = tmp_path / "victim.log"
    victim = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    # Generous: starting Python, torch and Lightning took over 90 s once while other jobs held both cores.
    deadline = time.monotonic() + 300
    running = False
    while time.monotonic() < deadline and victim.poll() is None:
        names = optuna.get_all_study_names(storage)
        if names and any(t.state.name == "RUNNING" for t in optuna.load_study(study_name=names[0], storage=storage).trials):
            running = True
            break
        time.sleep(0.2)
    assert running, f"the tune process never started a trial (exit code {victim.poll()}): {log.read_text()[-2000:]}"
    time.sleep(1.5)  # at least one heartbeat recorded
    # 150 epochs take several seconds even on an idle machine: the trial must still be running here.
    assert victim.poll() is None, "the trial finished before it could be killed; make it longer"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    time.sleep(2.5)  # past the grace period
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE", "FAIL"]
    retried = next(t for t in study.trials if t.state.name == "COMPLETE")
    assert retried.user_attrs.get("defaults") is True  # the killed trial's configuration ran again
    assert (tmp_path / "runs" / "params" / "cora" / "fenchel.yaml").is_file()  # beside the study; not promoted


def test_processes_opening_a_fresh_storage_at_once_all_get_it(tmp_path):
    """Several `tune` processes started together on a new SQLite file race to create its schema."""
    import threading

    url = _storage(tmp_path)
    errors = []

    def open_it():
        try:
            tuning.open_storage(url)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(repr(exc))

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert optuna.get_all_study_names(url) == []


def test_tune_in_a_clone_leaves_the_committed_params_unchanged_and_promotes_only_when_asked(shared_data, tmp_path, monkeypatch, capsys):
    """A 1-trial, 2-epoch tune must not replace the committed 20-trial result: tune writes beside its study, and
    --promote refuses to replace a larger budget unless forced."""
    import shutil
    from pathlib import Path

    clone = tmp_path / "clone"
    shutil.copytree(Path(__file__).parents[2] / "leaderboards" / "params", clone / "leaderboards" / "params")
    committed = clone / "leaderboards" / "params" / "cora" / "bam-weibull.yaml"
    before = committed.read_bytes()
    monkeypatch.chdir(clone)
    runs = tmp_path / "runs"
    argv = ["tune", "cora", "bam-weibull", "--trials", "1", "--set", "max_epochs=2", "--set", "patience=2",
            "--runs-dir", str(runs), "--data-root", str(shared_data)]

    assert main(argv) == 0
    out = capsys.readouterr().out
    assert committed.read_bytes() == before
    written = runs / "params" / "cora" / "bam-weibull.yaml"
    assert f"best parameters written to {written}" in out
    assert f"optuna-dashboard sqlite:///{runs / 'optuna.db'}" in out
    data = load_tuned("cora", "bam-weibull", runs / "params")
    assert data["budget"] == {"trials": 1, "max_epochs": 2, "patience": 2}

    assert main([*argv, "--promote"]) == 2
    err = capsys.readouterr().err
    assert "larger budget" in err and "trials: 20 > 1" in err and "--force" in err
    assert committed.read_bytes() == before

    assert main([*argv, "--promote", "--force"]) == 0
    assert f"promoted to {Path('leaderboards/params/cora/bam-weibull.yaml')}" in capsys.readouterr().out
    assert committed.read_bytes() == written.read_bytes()


def test_promote_replaces_a_smaller_budget_and_refuses_a_larger_one(tmp_path):
    from harness.plan.tuned import PromotionRefused, promote

    def write(root, trials, epochs):
        path = root / "cora" / "fenchel.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"variant": "fenchel", "attention": {"name": "fenchel", "alpha": trials},
                                        "budget": {"trials": trials, "max_epochs": epochs}}))

    write(tmp_path / "runs", 5, 300)
    write(tmp_path / "committed", 5, 100)
    promote("cora", "fenchel", tmp_path / "runs", tmp_path / "committed")  # same trials, more epochs: fine
    assert load_tuned("cora", "fenchel", tmp_path / "committed")["budget"]["max_epochs"] == 300
    write(tmp_path / "runs", 20, 50)
    with pytest.raises(PromotionRefused, match="max_epochs: 300 > 50"):
        promote("cora", "fenchel", tmp_path / "runs", tmp_path / "committed")


def test_bench_with_tuned_params_names_a_budget_other_than_the_suite_s(tmp_path, shared_data):
    params_dir = tmp_path / "params"
    (params_dir / "cora").mkdir(parents=True)
    for variant, budget in (("fenchel", {"trials": 3, "max_epochs": 2, "patience": 2}), ("gmm", {"trials": 3, "max_epochs": 300, "patience": 100}),
                            ("bam-weibull", None)):
        body = {"task": "cora", "variant": variant, "attention": {"name": variant}, "params": {"lr": 0.004}}
        (params_dir / "cora" / f"{variant}.yaml").write_text(yaml.safe_dump({**body, **({"budget": budget} if budget else {})}))
    the_plan = plan(load_suite("quick"), str(shared_data), variant_filter="fenchel,gmm,bam-weibull", tuned_dir=params_dir)
    assert sorted(the_plan.tuned_budget) == [
        "cora x bam-weibull: tuned before budgets were recorded (its epochs are unknown)",
        "cora x fenchel: tuned with max_epochs=2 (the suite: 300), patience=2 (the suite: 100)",
    ]


def test_tuned_parameters_equal_to_the_defaults_add_no_row(tmp_path, shared_data):
    """A "(tuned)" row of the default configuration would be the same runs twice, and count twice in comparisons."""
    params_dir = tmp_path / "params"
    (params_dir / "cora").mkdir(parents=True)
    for variant, attention in (("entmax15", {"name": "entmax15"}), ("fenchel", {"name": "fenchel", "alpha": 0.5})):
        (params_dir / "cora" / f"{variant}.yaml").write_text(yaml.safe_dump(
            {"task": "cora", "variant": variant, "attention": attention, "params": {}}))
    suite = load_suite("quick")
    the_plan = plan(suite, str(shared_data), variant_filter="entmax15,fenchel", tuned_dir=params_dir)
    labels = [s.label for s in the_plan.specs if s.task == "cora"]
    assert "entmax15 (tuned)" not in labels and labels.count("fenchel (tuned)") == len(suite.seeds)
    assert the_plan.tuned_as_defaults == ["cora x entmax15"]
    assert len({s.key for s in the_plan.specs}) == len(the_plan.specs)


def test_tuning_a_variant_without_options_is_refused(capsys, tmp_path):
    assert tuning.variant_knobs("softmax") == []
    assert {"alpha", "prior"} <= set(tuning.variant_knobs("fenchel"))
    for extra in ([], ["--dry-run"]):
        assert main(["tune", "cora", "softmax", "--runs-dir", str(tmp_path / "runs"), *extra]) == 2
        assert "'softmax' has no options of its own to tune" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main(["tune", "cora", "softmax", "--tune-optimizer", "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0


def test_tuning_a_suite_leaves_out_its_variants_without_options(capsys, tmp_path, shared_data):
    assert main(["tune", "--suite", "quick", "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--data-root", str(shared_data)]) == 0
    out = capsys.readouterr().out
    assert "not tuning entmax15, softmax, sparsemax: no options of their own to search" in out
    studies = [line for line in out.splitlines() if "trials)" in line]
    assert studies and not any(" softmax (" in line or " entmax15 (" in line for line in studies)
    assert any(" fenchel (" in line for line in studies)
