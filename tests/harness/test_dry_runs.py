"""`--dry-run` / `--print-config` never train and never write, on every command and path that has them."""

import pytest

from harness.cli import main

PATHS = {
    "lone run": ["run", "cora", "softmax", "--set", "max_epochs=2", "--dry-run"],
    "lone run, --print-config": ["run", "cora", "softmax", "--set", "max_epochs=2", "--print-config"],
    "seed batch": ["run", "cora", "softmax", "--seeds", "5-6", "--set", "max_epochs=2", "--dry-run"],
    "seed batch, --print-config": ["run", "cora", "softmax", "--seeds", "5-6", "--set", "max_epochs=2", "--print-config"],
    "seeds one by one": ["run", "cora", "softmax", "--seeds", "5-6", "--no-seed-batch", "--set", "max_epochs=2", "--dry-run"],
    "bench": ["bench", "--suite", "quick", "--variants", "softmax", "--dry-run"],
    "tune": ["tune", "cora", "entmax", "--trials", "2", "--dry-run"],
}


@pytest.fixture
def no_training(monkeypatch):
    import lightning

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run trained")

    monkeypatch.setattr(lightning.Trainer, "fit", refuse)
    monkeypatch.setattr("harness.run.seed_batch.execute_batch", refuse)
    monkeypatch.setattr("harness.run.runner.execute", refuse)


@pytest.mark.parametrize("argv", PATHS.values(), ids=PATHS.keys())
def test_a_dry_run_trains_nothing_and_writes_nothing(argv, shared_data, tmp_path, capsys, no_training):
    runs, boards = tmp_path / "runs", tmp_path / "boards"
    extra = ["--leaderboard-dir", str(boards)] if argv[0] == "bench" else []
    assert main([*argv, "--data-root", str(shared_data), "--runs-dir", str(runs), *extra]) == 0
    assert capsys.readouterr().out.strip()
    assert not runs.exists() and not boards.exists()
    assert not any(tmp_path.iterdir())


def test_a_seed_batch_dry_run_names_each_seed_key_and_what_would_run(shared_data, tmp_path, capsys, no_training):
    import yaml

    from harness.plan.spec import make_spec

    assert main(["run", "cora", "softmax", "--seeds", "5-6", "--set", "max_epochs=2", "--dry-run",
                 "--data-root", str(shared_data), "--runs-dir", str(tmp_path / "runs")]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["seeds"] == {seed: {"key": make_spec("cora", "softmax", seed, {"max_epochs": 2}).key, "status": "to run"}
                              for seed in (5, 6)}
    assert shown["would run"] == "2 of 2 seeds as one seed batch"
    assert shown["task parameters"]["max_epochs"] == 2
