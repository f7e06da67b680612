import json

import pytest

from harness.cli import main


def test_list_shows_variants_tasks_and_suites(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "cora" in out and "quick" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "cora", "sofmax"], "Did you mean 'softmax'"),
        (["run", "coraa", "softmax"], "Did you mean 'cora'"),
        (["bench", "--suite", "quik"], "Did you mean 'quick'"),
        (["run", "cora", "softmax", "--set", "nonsense"], "write key=value"),
        (["run", "cora", "softmax", "--set", "learning_rate=1"], "has no parameter"),
        (["run", "cora", "softmax", "--plugin", "/nonexistent/plugin.py"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys, tmp_path):
    assert main([*argv, "--runs-dir", str(tmp_path)] if argv[0] != "bench" else [*argv, "--runs-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_data_names_the_file_and_the_fix(shared_data, capsys, tmp_path):
    assert main(["run", "pubmed", "softmax", "--data-root", str(shared_data), "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "ind.pubmed.allx" in err and "ATTNBENCH_DATA" in err


def test_run_records_and_reuses_a_finished_run(shared_data, capsys, tmp_path):
    argv = ["run", "cora", "softmax", "--seed", "1", "--set", "max_epochs=3", "--data-root", str(shared_data), "--runs-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("  epoch ") == 3  # one progress line per epoch, then the record summary
    first = json.loads(out[out.index("\n{") :])
    assert first["status"] == "ok" and first["epochs"] == 3
    assert main(argv) == 0
    assert "already finished" in capsys.readouterr().out


def test_set_values_parse_as_yaml_and_exponents_as_numbers():
    from harness.cli import parse_sets
    from modules.tasks import get_task

    params, attention = parse_sets(["lr=5e-5", "backbone=minilm", "max_train_examples=null", "attention.alpha=2"])
    assert params == {"lr": "5e-5", "backbone": "minilm", "max_train_examples": None}  # YAML 1.1 reads 5e-5 as a string
    assert attention == {"alpha": 2}
    assert get_task("glue-rte").params(params).lr == 5e-5  # the field's type makes it a float


def test_bench_devices_and_workers_must_agree(capsys):
    assert main(["bench", "--suite", "quick", "--workers", "1", "--devices", "2"]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert main(["bench", "--suite", "quick", "--devices", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_run_checks_the_data_its_params_point_to(shared_data, tmp_path, capsys):
    assert main(["run", "vqa", "softmax", "--set", "vqa_dir=no-such-vqa", "--data-root", str(shared_data),
                 "--runs-dir", str(tmp_path)]) == 2
    assert "no-such-vqa" in capsys.readouterr().err
