"""Traps in the daily loop (issue 39): each answer says what is wrong and what the command accepts."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_a_data_root_that_does_not_exist_says_so_and_not_to_unset_the_environment(tmp_path, capsys):
    assert main(["run", "cora", "softmax", "--data-root", str(tmp_path / "nope"), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"data root {tmp_path / 'nope'} (--data-root): folder does not exist" in err
    assert "ATTNBENCH_DATA" not in err and "missing ind.cora" not in err
    assert not (tmp_path / "runs").exists()


def test_a_refused_leaderboard_leaves_no_store_behind_and_compare_then_says_it_does_not_exist(tmp_path, capsys):
    runz = tmp_path / "runz"
    assert main(["leaderboard", "--runs-dir", str(runz)]) == 2
    assert main(["leaderboard", "--suite", "quick", "--runs-dir", str(runz), "--out", str(tmp_path / "boards")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not runz.exists() and not (tmp_path / "boards").exists()
    assert main(["results", "compare", str(runz), str(REPO / "leaderboards")]) == 2


def test_a_missing_suite_file_is_named_as_a_file(tmp_path, capsys):
    assert main(["bench", "--suite", str(tmp_path / "x.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"no suite file {tmp_path / 'x.yaml'}" in err and "unknown suite" not in err


@pytest.mark.parametrize("body, hint", [
    ("tasks: [cora]\nvarients: [softmax]\nseeds: 3", "Did you mean 'variants'?"),
    ("tasks: [{name: cora, parms: {max_epochs: 2}}]\nvariants: [softmax]\nseeds: 3", "Did you mean 'params'?"),
    ("tasks: [cora]\nvariants: [{name: entmax, attention.alpah: 1.2}]\nseeds: 3", "Did you mean 'alpha'?"),
    ("tasks: [cora]\nvariants: [softmax]\nparams: {max_epoch: 3}\nseeds: 3", "Did you mean 'max_epochs'?"),
    ("tasks: [{name: cora, params: {max_epoch: 3}}]\nvariants: [softmax]\nseeds: 3", "Did you mean 'max_epochs'?"),
    ("tasks: [cora]\nvariants: all\nexclude_variants: [fenchel-exat]\nseeds: 3", "Did you mean 'fenchel-exact'"),
    ("tasks: [cra]\nvariants: [softmax]\nseeds: 3", "Did you mean 'cora'?"),
    ("tasks: [cora]\nvariants: [softmx]\nseeds: 3", "Did you mean 'softmax'"),
])
def test_typos_inside_a_suite_file_get_a_did_you_mean(body, hint, tmp_path):
    from harness.plan.suite import SuiteError, load_suite

    path = tmp_path / "mine.yaml"
    path.write_text(body + "\n")
    with pytest.raises(SuiteError) as caught:
        load_suite(str(path))
    assert hint in str(caught.value) and str(path) in str(caught.value)


def test_a_backwards_seed_range_is_refused_before_torch_is_imported():
    code = textwrap.dedent("""
        import sys
        from harness.cli import main
        code = main(["run", "cora", "softmax", "--seeds", "3-1"])
        assert "torch" not in sys.modules, "refused only after importing torch"
        sys.exit(code)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--seeds '3-1': the range 3-1 ends before it starts; write 1-3" in done.stderr


def test_run_takes_tuned_parameters_as_bench_does(shared_data, tmp_path, capsys):
    params_dir = tmp_path / "params"
    (params_dir / "cora").mkdir(parents=True)
    (params_dir / "cora" / "entmax.yaml").write_text(yaml.safe_dump({
        "task": "cora", "variant": "entmax", "attention": {"name": "entmax", "alpha": 1.37}, "params": {"lr": 0.004}}))
    argv = ["--params-dir", str(params_dir), "--data-root", str(shared_data), "--runs-dir", str(tmp_path / "runs"), "--dry-run"]
    assert main(["run", "cora", "entmax", "--params", "tuned", "--set", "lr=0.006", *argv]) == 0
    shown = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])
    assert shown["attention (as configured; None = the host decides)"]["alpha"] == 1.37
    assert shown["task parameters"]["lr"] == 0.006  # --set still wins
    assert main(["run", "cora", "fenchel", "--params", "tuned", *argv]) == 2
    assert "run `attnbench tune cora fenchel`" in capsys.readouterr().err
    # softmax has nothing to tune, and `tune` refuses it: the answer must not send the user there
    assert main(["run", "cora", "softmax", "--params", "tuned", *argv]) == 2
    err = capsys.readouterr().err
    assert "softmax has no options of its own" in err and "attnbench tune" not in err


def test_trial_lines_show_enough_digits_to_tell_different_values_apart():
    from harness.studies.tune import distinct

    assert distinct(1.94481, []) == "1.9448"
    assert distinct(1.94483, [1.94481]) == "1.94483"
    assert distinct(1.94481, [1.94481, 2.0]) == "1.9448"  # the same value reads the same


def test_a_seed_batch_prints_each_epoch_and_names_the_seed_of_each_record(shared_data, tmp_path, capsys):
    assert main(["run", "cora", "softmax", "--seeds", "0-1", "--set", "max_epochs=2", "--data-root", str(shared_data),
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.splitlines()
    epochs = [line for line in lines if line.startswith("attnbench: seed batch epoch")]
    assert epochs[0].startswith("attnbench: seed batch epoch 1/2: 2 of 2 seeds still training; best val/loss by seed 0:")
    assert " 1:" in epochs[0] and "/epoch, at most" in epochs[0]
    assert epochs[-1].startswith("attnbench: seed batch epoch 2/2: 0 of 2 seeds still training") and epochs[-1].endswith("done")
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert sorted(r["seed"] for r in records) == [0, 1]
