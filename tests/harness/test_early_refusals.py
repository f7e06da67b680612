"""Mistakes answered at once: a malformed suite file and a task's missing data files are refused with exit 2
before the command imports torch (counted: `torch` never enters sys.modules on those paths), with the message the
full check gives."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from harness.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "lightning": "lightning" in sys.modules}))
"""


def answer(argv, tmp_path, env_data=None):
    """Exit code, whether torch or Lightning was imported, and stderr, of `attnbench ARGV` in a fresh process."""
    import os

    env = {**os.environ, "ATTNBENCH_CACHE": str(tmp_path / "cache")}  # no catalogue: the slow path unless refused early
    if env_data is not None:
        env["ATTNBENCH_DATA"] = str(env_data)
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["code"], result["torch"] or result["lightning"], done.stderr


@pytest.mark.parametrize("text, words", [
    ("name: bad\ntasks: [cora\nvariants: all\n", "is not valid YAML"),
    ("tasks: [cora]\nvariants: all\nseeds: 3\nparms: {max_epochs: 3}\n", "unknown key(s) ['parms']"),
    ("tasks: [{name: cora, seed: 3}]\nvariants: all\nseeds: 3\n", "unknown key(s) ['seed']"),
    ("tasks: [cora]\nvariants: all\n", "missing 'seeds'"),
])
def test_a_malformed_suite_file_is_refused_before_torch(tmp_path, text, words):
    suite = tmp_path / "bad.yaml"
    suite.write_text(text)
    code, heavy, stderr = answer(["bench", "--suite", str(suite), "--runs-dir", str(tmp_path / "runs")], tmp_path)
    assert code == 2 and words in stderr and str(suite) in stderr
    assert not heavy, "the refusal imported torch or Lightning"


def test_missing_data_files_are_refused_before_torch(tmp_path):
    root = tmp_path / "data"
    (root / "glue" / "RTE").mkdir(parents=True)
    (root / "glue" / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n")
    code, heavy, stderr = answer(["run", "glue-rte", "softmax", "--runs-dir", str(tmp_path / "runs")], tmp_path, env_data=root)
    assert code == 2 and f"{root}/glue/RTE/dev.tsv" in stderr and "train.tsv," not in stderr.split("missing")[1].split(";")[0]
    assert not heavy
    (root / "planetoid" / "Cora" / "raw").mkdir(parents=True)
    code, heavy, stderr = answer(["tune", "cora", "fenchel", "--trials", "1", "--runs-dir", str(tmp_path / "runs")], tmp_path, env_data=root)
    assert code == 2 and "ind.cora.x" in stderr and not heavy
    code, heavy, stderr = answer(["run", "shift-books-dvd", "softmax", "--runs-dir", str(tmp_path / "runs")], tmp_path, env_data=root)
    assert code == 2 and "domain-shift data missing" in stderr and not heavy
    suite = tmp_path / "needs-rte.yaml"
    suite.write_text("tasks: [glue-rte, {name: glue-mnli, optional: true}]\nvariants: [softmax]\nseeds: 1\n")
    code, heavy, stderr = answer(["bench", "--suite", str(suite), "--runs-dir", str(tmp_path / "runs")], tmp_path, env_data=root)
    assert code == 2 and "GLUE RTE is missing" in stderr and "MNLI" not in stderr and not heavy  # optional: skipped, not refused


def test_the_early_message_is_the_full_checks():
    """The same words whichever check answers: the early one calls the loaders' own data_problem."""
    from datamodules import glue, planetoid
    from harness.commands import arguments

    assert arguments.PLANETOID_FOLDERS == planetoid.NAMES and arguments.PLANETOID_PARTS == planetoid.RAW_PARTS
    assert arguments.early_data_problem("glue-mnli", "/nonexistent") == glue.data_problem("mnli", "/nonexistent")
    assert arguments.early_data_problem("glue-rte", None) is None  # no data root: the loaders may download
    assert arguments.early_data_problem("my-plugin-task", "/nonexistent") is None


def test_a_good_suite_file_still_passes_the_early_check(tmp_path):
    from harness.plan.suite import list_suites, read_suite_file, suite_path

    for name in list_suites():  # `make leaderboard` passes every built-in suite through the early check
        assert read_suite_file(suite_path(name))["tasks"]
