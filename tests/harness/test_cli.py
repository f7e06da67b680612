import json

import pytest

from harness.cli import main


def test_list_shows_variants_tasks_and_suites(capsys):
    from harness.plan.suite import list_suites, load_suite
    from modules.attention import list_attentions
    from modules.tasks import get_task, list_tasks

    assert main(["list"]) == 0
    sections, current, columns = {}, None, {}
    for line in capsys.readouterr().out.splitlines():
        if not line.startswith(" "):
            title = line.rstrip(":")
            current = sections.setdefault(title, {})
        elif not line.startswith("   "):
            name, _, rest = line.strip().partition(" ")
            current[name] = rest.strip()
            columns.setdefault(title, set()).add(len(line) - len(rest.lstrip()))
        else:  # a wrapped text goes on under its own column
            columns[title].add(len(line) - len(line.lstrip()))
            current[name] += " " + line.strip()
    # one text column per section, as wide as its longest name needs (shift-electronics-kitchen included)
    assert all(len(found) == 1 for found in columns.values()), columns
    assert columns["tasks"] == {2 + max(map(len, list_tasks())) + 2}
    assert list(sections) == ["variants", "tasks", "suites"]
    assert list(sections["variants"]) == list_attentions()
    assert sections["variants"]["softmax"].startswith("Softmax over scaled dot products")
    assert sections["variants"]["sparsemax"].endswith("[alpha=2.0, learn_alpha=False]")
    # a summary whose first sentence runs onto a second docstring line is listed whole, not cut mid-sentence
    assert sections["variants"]["fenchel-exact"].endswith("rather than returning the weights of an unconverged solve.")
    assert sections["tasks"] == {name: "metrics: " + ", ".join(m.name for m in get_task(name).metrics) for name in list_tasks()}
    assert sections["tasks"]["cora"] == "metrics: test/acc, test/macro_f1"
    assert list(sections["suites"]) == list_suites()
    quick = load_suite("quick")
    assert sections["suites"]["quick"] == f"{len(quick.tasks)} tasks x {len(quick.variants)} variants x {len(quick.seeds)} seeds"


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


def test_bench_devices_is_refused_with_its_new_spelling(capsys, tmp_path):
    """One meaning per flag: --devices is one DDP run's device count everywhere; bench's workers are --workers."""
    assert main(["bench", "--suite", "quick", "--devices", "2", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench --devices N is now --workers N" in err and "--strategy ddp --devices N" in err
    assert main(["bench", "--suite", "quick", "--workers", "0", "--runs-dir", str(tmp_path)]) == 2
    assert "--workers 0: expected an integer >= 1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_run_checks_the_data_its_params_point_to(shared_data, tmp_path, capsys):
    assert main(["run", "vqa", "softmax", "--set", "vqa_dir=no-such-vqa", "--data-root", str(shared_data),
                 "--runs-dir", str(tmp_path)]) == 2
    assert "no-such-vqa" in capsys.readouterr().err


def test_version_names_attnbench_torch_lightning_and_the_commit(capsys):
    import importlib.metadata

    from harness.provenance import git_commit

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert f"torch {importlib.metadata.version('torch')}" in out
    assert f"lightning {importlib.metadata.version('lightning')}" in out
    assert f"commit {git_commit()}" in out and out.startswith("attnbench ")


def test_bench_dry_run_prints_every_planned_run_and_writes_nothing(shared_data, capsys, tmp_path):
    argv = ["bench", "--suite", "quick", "--dry-run", "--data-root", str(shared_data), "--runs-dir", str(tmp_path / "runs"),
            "--leaderboard-dir", str(tmp_path / "leaderboards")]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["task", "variant", "seed", "key", "status", "estimate"]
    rows, summary = lines[1:-1], lines[-1]
    assert len(rows) == 72  # 2 tasks x 12 variants x 3 seeds
    assert all(row.split()[4] == "pending" and row.split()[5] == "?" for row in rows)
    assert summary.startswith("72 runs: 0 finished, 0 failed, 72 pending (time unknown)")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "leaderboards").exists()


def test_dry_run_reads_finished_failed_and_estimates_from_records_on_this_device(shared_data, capsys, tmp_path):
    from harness.plan.planner import plan
    from harness.report.preview import this_device
    from harness.plan.suite import load_suite
    from harness.results.record import Record
    from harness.results.store import RecordStore

    specs = {(s.task, s.display, s.seed): s for s in plan(load_suite("quick"), str(shared_data)).specs}
    store = RecordStore(tmp_path / "runs")
    here = {"device": this_device(), "label": "here"}
    metrics = {"test/acc": {"value": 0.8, "higher_is_better": True}}
    store.write(Record.ok(specs["cora", "softmax", 0], metrics, wall_time_s=10.0, hardware=here))
    store.write(Record.ok(specs["cora", "softmax", 1], metrics, wall_time_s=30.0, hardware=here))
    store.write(Record.failed(specs["cora", "entmax", 0], "RuntimeError: boom", wall_time_s=5.0, hardware=here))
    store.write(Record.ok(specs["citeseer", "softmax", 0], metrics, wall_time_s=99.0, hardware={"device": "another GPU"}))
    before = sorted(p.name for p in (tmp_path / "runs").rglob("*"))

    assert main(["bench", "--suite", "quick", "--dry-run", "--workers", "2", "--data-root", str(shared_data),
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {(r.split()[0], r.split()[1], int(r.split()[2])): r.split()[4:] for r in lines[1:-1]}
    assert rows["cora", "softmax", 0] == ["finished"]
    assert rows["cora", "entmax", 0] == ["failed"]
    assert rows["cora", "softmax", 2] == ["pending", "20.0", "s"]  # the mean of seeds 0 and 1 here
    assert rows["citeseer", "softmax", 1] == ["pending", "?"]  # a record on other hardware says nothing
    assert lines[-1].startswith("72 runs: 3 finished, 1 failed, 68 pending (about 10.0 s on 2 worker(s); 67 without")
    assert sorted(p.name for p in (tmp_path / "runs").rglob("*")) == before


def test_tune_dry_run_shows_each_study_without_creating_its_storage(shared_data, capsys, tmp_path):
    assert main(["tune", "cora", "entmax", "--dry-run", "--trials", "7", "--data-root", str(shared_data),
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].split()[:4] == ["cora", "entmax", "(0/7", "trials)"] and "cora/entmax/" in lines[1]
    assert lines[-1].startswith("1 studies: 0 finished, 0 failed, 1 pending")
    assert not (tmp_path / "runs").exists()


def test_bf16_mixed_runs_on_cpu_with_its_own_key_and_hardware_group(shared_data, capsys, tmp_path):
    from harness.plan.spec import make_spec
    from harness.results.store import RecordStore

    argv = ["run", "cora", "softmax", "--set", "max_epochs=2", "--precision", "bf16-mixed", "--data-root", str(shared_data),
            "--runs-dir", str(tmp_path / "runs")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    record = json.loads(out[out.index("\n{"):])
    assert record["status"] == "ok" and record["epochs"] == 2
    fp32, bf16 = make_spec("cora", "softmax", 0, {"max_epochs": 2}), make_spec("cora", "softmax", 0, {"max_epochs": 2}, precision="bf16-mixed")
    assert record["key"] == bf16.key != fp32.key
    stored = RecordStore(tmp_path / "runs").read(bf16.key)
    assert stored.spec["precision"] == "bf16-mixed" and stored.hardware["precision"] == "bf16-mixed"
    assert stored.hardware_label.endswith(", bf16-mixed)")


def test_precision_is_refused_outside_its_choices(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "cora", "softmax", "--precision", "bf16"])
    assert stop.value.code == 2
    assert "invalid choice: 'bf16'" in capsys.readouterr().err


def test_describe_a_variant_lists_types_ranges_per_host_defaults_and_sources(capsys):
    from modules.attention.registry import describe_defaults

    assert main(["describe", "bam-weibull"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("variant bam-weibull: ")
    per_site = describe_defaults("bam-weibull")
    graph_k, text_k = per_site["graph self"]["k"], per_site["text self"]["k"]
    assert graph_k != text_k  # the test needs a knob whose default differs by host
    k_block = out[out.index("\n  attention.k "):out.index("\n  attention.alpha ")]
    assert "float or None, > 0; default per host:" in k_block
    assert f"graph self: {graph_k!r}" in k_block and f"text self, " in k_block and f": {text_k!r}" in k_block
    assert "Weibull shape" in k_block  # the field's docstring, read from the source
    assert "attention.mc_samples       int, >= 1; default 1\n" in out
    assert "--set attention.KEY=VALUE" in out  # every name above is the exact `--set` form


def test_describe_a_task_shows_the_name_s_preset_as_the_default(capsys):
    assert main(["describe", "pubmed"]) == 0
    out = capsys.readouterr().out
    assert "lr               float, > 0; default 0.01\n" in out  # pubmed's preset, not GATParams' 0.005
    assert "out_heads        int, >= 1; default 8\n" in out
    assert "fixed by the task name (pubmed)" in out


@pytest.mark.parametrize("argv, hint", [
    (["run", "cora", "entmax", "--set", "alpha=1.2"], "Did you mean --set attention.alpha=1.2?"),
    (["run", "cora", "entmax", "--set", "attention.max_epochs=3"], "Did you mean --set max_epochs=3? (max_epochs is a task parameter)"),
    (["run", "cora", "softmax", "--set", "max_epoch=3"], "Did you mean --set max_epochs=3?"),
    (["tune", "cora", "gmm", "--set", "patiense=9"], "Did you mean --set patience=9?"),
])
def test_a_set_key_of_the_other_owner_or_misspelt_points_to_the_right_spelling(argv, hint, capsys, tmp_path, monkeypatch):
    from harness.plan import catalogue

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    for _ in ("full path", "cached catalogue"):
        assert main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 2
        assert hint in capsys.readouterr().err
        catalogue.refresh()
    assert not (tmp_path / "runs" / "records").exists()


def test_field_docs_come_from_the_source_of_the_most_derived_class():
    from harness.plan.describe import field_docs
    from modules.attention import attention_entry

    docs = field_docs(attention_entry("entmax").cls.Config)
    assert docs["alpha"].startswith("Tsallis α in (1, 2]")
    assert "learn_alpha" in docs and "alpha" not in field_docs(attention_entry("softmax").cls.Config)


def test_describe_an_unknown_name_suggests_tasks_and_variants(capsys):
    assert main(["describe", "bam-weibul"]) == 2
    assert "Did you mean 'bam-weibull'?" in capsys.readouterr().err
    assert main(["describe", "coraa"]) == 2
    assert "Did you mean 'cora'?" in capsys.readouterr().err


def test_the_cached_catalogue_answers_as_the_full_path_does(capsys, tmp_path, monkeypatch):
    from harness.plan import catalogue

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    commands = [["list"], ["list", "variants"], ["describe", "bam-lognormal"], ["describe", "glue-rte"], ["describe", "bam-lognorm"],
                ["run", "cora", "softmx"], ["run", "cora", "softmax", "--set", "max_epochs=abc"],
                ["run", "cora", "gmm", "--set", "attention.beta=-1"], ["tune", "cora", "softmax", "--set", "patience=x"]]
    full = []
    for argv in commands:
        if catalogue.cache_file().exists():
            catalogue.cache_file().unlink()
        code = main([*argv, *(["--runs-dir", str(tmp_path / "runs")] if argv[0] in ("run", "tune") else [])])
        full.append((code, capsys.readouterr()))
    catalogue.refresh()
    assert catalogue.load() is not None

    def full_path(*args, **kwargs):
        raise AssertionError("the cached catalogue should have answered")

    import harness.commands.run_and_tune
    import harness.plan.describe
    import harness.plan.planner

    monkeypatch.setattr(harness.plan.describe, "print_list", full_path)
    monkeypatch.setattr(harness.plan.describe, "describe", full_path)
    monkeypatch.setattr(harness.plan.planner, "plan_runs", full_path)
    monkeypatch.setattr(harness.commands.run_and_tune, "plan_command_line_runs", full_path)
    for argv, (code, captured) in zip(commands, full):
        assert main([*argv, *(["--runs-dir", str(tmp_path / "runs")] if argv[0] in ("run", "tune") else [])]) == code, argv
        fast = capsys.readouterr()
        assert (fast.out, fast.err) == (captured.out, captured.err), argv
    assert not (tmp_path / "runs").exists()


def test_run_dry_run_prints_the_resolved_configuration_and_writes_nothing(tmp_path, capsys, shared_data):
    import yaml
    from pathlib import Path

    from harness.plan.spec import make_spec
    from modules.attention.registry import describe_defaults

    runs = tmp_path / "runs"
    argv = ["run", "cora", "bam-weibull", "--set", "attention.kl_weight=0.5", "--set", "lr=0.01", "--data-root", str(shared_data)]
    assert main([*argv, "--dry-run", "--runs-dir", str(runs)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert not runs.exists()
    spec = make_spec("cora", {"name": "bam-weibull", "kl_weight": 0.5}, 0, {"lr": 0.01})
    assert shown["key"] == spec.key and shown["status"].startswith("not run yet")
    assert shown["task parameters"] == dict(spec.params) and shown["task parameters"]["lr"] == 0.01
    sites = shown["attention at each site of the task (per-host defaults filled in)"]
    assert sites == {"graph self": describe_defaults({"name": "bam-weibull", "kl_weight": 0.5})["graph self"]}
    assert sites["graph self"]["kl_weight"] == 0.5 and sites["graph self"]["k"] is not None  # a per-host default, filled in
    assert shown["attention (as configured; None = the host decides)"]["k"] is None

    committed = Path(__file__).parents[2] / "leaderboards"  # the quick suite's cora x softmax, seed 0, is recorded there
    assert main(["run", "cora", "softmax", "--set", "max_epochs=300", "--print-config", "--runs-dir", str(committed),
                 "--data-root", str(shared_data)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["status"].startswith("finished (")


@pytest.mark.parametrize("argv", [["describe", "fenchel-exact"], ["list"]])
def test_output_into_a_closed_pipe_ends_without_a_traceback(argv):
    """`attnbench describe ... | head -1`: the reader is gone before the command writes (closed at once here,
    so that the write always meets a closed pipe)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    for _ in range(2):  # the first may build the CLI catalogue, the second answers from it
        writer = subprocess.Popen([sys.executable, "-m", "harness.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  cwd=repo, env=env)
        writer.stdout.close()
        stderr = writer.stderr.read().decode()
        writer.wait()
        assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
        assert writer.returncode in (0, 141)


def test_python_dash_m_harness_is_the_attnbench_command():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "harness", "--version"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("attnbench "), done.stderr
    wrong = subprocess.run([sys.executable, "-m", "harness", "no-such-verb"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr
