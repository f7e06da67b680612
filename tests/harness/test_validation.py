"""Every configuration value is checked against its field's declared type and range before anything runs:
exit code 2, one line naming the key, the value, what was expected and where it came from, nothing written."""

import pytest

from harness.cli import main
from modules.tasks import get_task
from modules.validation import ConfigError, describe_type, field_annotations


def _nothing_written(tmp_path):
    return not (tmp_path / "runs").exists() and not (tmp_path / "leaderboards").exists()


def _folders(tmp_path):
    return ["--runs-dir", str(tmp_path / "runs")]


@pytest.mark.parametrize(
    "argv, line",
    [
        (["run", "cora", "softmax", "--set", "max_epochs=abc"],
         "task 'cora': max_epochs='abc' (from --set max_epochs): expected int >= 1"),
        (["run", "cora", "softmax", "--set", "max_epochs=-5"],
         "task 'cora': max_epochs=-5 (from --set max_epochs): expected int >= 1"),
        (["run", "cora", "softmax", "--set", "lr=-0.1"],
         "task 'cora': lr=-0.1 (from --set lr): expected float > 0"),
        (["run", "cora", "softmax", "--set", "dropout=1.5"],
         "task 'cora': dropout=1.5 (from --set dropout): expected float >= 0 and < 1"),
        (["run", "cora", "entmax", "--set", "attention.alpha=0"],
         "attention 'entmax': alpha=0 (from --set attention.alpha): expected float > 1 and <= 2"),
        (["run", "cora", "bam-weibull", "--set", "attention.k=abc"],
         "attention 'bam-weibull': k='abc' (from --set attention.k): expected float > 0 or None"),
        (["run", "cora", "softmax", "--set", "max_epoch=5"],
         "task 'cora' has no parameter 'max_epoch' (given max_epoch=5, from --set max_epoch); its parameters are attn_dropout,"),
        (["run", "cora", "softmax", "--set", "attention.alpha=2"],
         "attention 'softmax' has no option 'alpha' (given alpha=2, from --set attention.alpha)"),
        (["run", "cora", "softmax", "--seed", "-1"], "--seed -1: expected an integer >= 0 (from the command line)"),
        (["tune", "cora", "entmax", "--set", "max_epochs=0"],
         "task 'cora': max_epochs=0 (from --set max_epochs): expected int >= 1"),
        (["tune", "cora", "entmax", "--trials", "0"], "--trials 0: expected an integer >= 1"),
    ],
)
def test_a_bad_flag_value_is_refused_in_one_line(argv, line, capsys, tmp_path):
    assert main([*argv, *_folders(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnbench: error: ")
    assert line in err
    assert _nothing_written(tmp_path)


@pytest.mark.parametrize(
    "suite, line",
    [
        ("tasks: [cora]\nvariants: [softmax]\nseeds: 1\nparams: {max_epochs: abc}\n",
         ": params (for task cora): task 'cora': max_epochs='abc': expected int >= 1"),
        ("tasks: [{name: cora, params: {max_epochs: -5}}]\nvariants: [softmax]\nseeds: 1\n",
         ": tasks[0]: task 'cora': max_epochs=-5: expected int >= 1"),
        ("tasks: [{name: cora, params: {lr: -0.1}}]\nvariants: [softmax]\nseeds: 1\n",
         ": tasks[0]: task 'cora': lr=-0.1: expected float > 0"),
        ("tasks: [cora]\nvariants: [softmax, {name: entmax, alpha: 0}]\nseeds: 1\n",
         ": variants[1]: attention 'entmax': alpha=0: expected float > 1 and <= 2"),
        ("tasks: [cora]\nvariants: [{name: bam-weibull, mc_samples: 1.5}]\nseeds: 1\n",
         ": variants[0]: attention 'bam-weibull': mc_samples=1.5: expected int >= 1"),
        ("tasks: [{name: cora, params: {max_epoch: 5}}]\nvariants: [softmax]\nseeds: 1\n",
         ": tasks[0]: task 'cora' has no parameter 'max_epoch' (given max_epoch=5)"),
        ("tasks: [cora]\nvariants: [softmax]\nseeds: [0, -1]\n", ": seeds must be a positive integer (a count) or a non-empty list of integers >= 0"),
    ],
)
def test_a_bad_suite_value_is_refused_in_one_line(suite, line, capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(suite)
    argv = ["bench", "--suite", str(path), "--leaderboard-dir", str(tmp_path / "leaderboards"), *_folders(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"suite file {path}{line}" in err
    assert _nothing_written(tmp_path)


def test_exponents_parse_as_floats_and_valid_values_keep_their_type():
    from harness.plan.spec import make_spec

    spec = make_spec("cora", {"name": "entmax", "alpha": "1.25"}, 0, {"lr": "5e-5", "max_epochs": "3", "weight_decay": 0})
    assert spec.params["lr"] == 5e-5 and isinstance(spec.params["lr"], float)
    assert spec.params["max_epochs"] == 3 and isinstance(spec.params["max_epochs"], int)
    # An int given to a float field is kept as given, so that the keys of records written before this check stay.
    assert spec.params["weight_decay"] == 0 and isinstance(spec.params["weight_decay"], int)
    assert spec.attention["alpha"] == 1.25


def test_a_flag_is_not_a_count():
    with pytest.raises(ConfigError, match="max_epochs=True"):
        get_task("cora").params({"max_epochs": True})


def test_ranges_are_declared_next_to_the_fields():
    from modules.attention import attention_entry

    assert describe_type(field_annotations(get_task("cora").Params)["max_epochs"]) == "int >= 1"
    assert describe_type(field_annotations(attention_entry("bam-lognormal").cls.Config)["sigma"]) == "float > 0 or None"
    assert describe_type(field_annotations(get_task("glue-rte").Params)["val_fraction"]) == "float > 0 and < 1"
