"""Data, weights or files the machine lacks are refused before anything runs, never recorded as results, and
records of such faults from older versions are retried; the CLI finds the data root the way `make` does."""

import pytest

from datamodules import paths
from harness.cli import main
from harness.plan.spec import make_spec
from harness.results.record import Record


@pytest.fixture
def offline_without_data(tmp_path, monkeypatch):
    """No data root anywhere (no $ATTNBENCH_DATA, no ../shared/data), an empty cache and no network."""
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    monkeypatch.setattr(paths, "SHARED_DATA", tmp_path / "no-shared-data")
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(paths, "host_unreachable", lambda host, *a, **k: f"cannot reach {host}: [Errno -2] Name or service not known")


def test_a_missing_data_root_is_refused_before_any_record_is_written(offline_without_data, tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text("tasks: [cora]\nvariants: [softmax]\nseeds: 2\nparams: {max_epochs: 1}\n")
    runs = tmp_path / "runs"
    for argv in (["bench", "--suite", str(suite), "--workers", "1", "--leaderboard-dir", str(tmp_path / "boards")],
                 ["run", "cora", "softmax", "--set", "max_epochs=1"], ["tune", "cora", "fenchel", "--trials", "1"]):
        assert main([*argv, "--runs-dir", str(runs)]) == 2, argv
        err = capsys.readouterr().err
        assert "Cora (Planetoid): no data root is set" in err and "cannot reach github.com" in err
        assert "ATTNBENCH_DATA" in err and "planetoid/Cora/raw" in err
    assert not list(runs.rglob("*.json")) and not (tmp_path / "boards").exists()


def test_planetoid_files_already_in_the_cache_need_no_network(offline_without_data, shared_data):
    from datamodules.planetoid import data_available, raw_file_names

    assert "no data root is set" in data_available("cora")
    cached = paths.cache_dir() / "planetoid" / "Cora" / "raw"
    cached.mkdir(parents=True)
    for name in raw_file_names("cora"):
        (cached / name).write_bytes((shared_data / "planetoid" / "Cora" / "raw" / name).read_bytes())
    assert data_available("cora") is None


def test_the_cli_finds_the_data_root_as_make_does(tmp_path, monkeypatch):
    assert paths.SHARED_DATA == paths.CHECKOUT.parent / "shared" / "data"  # the Makefile's $(abspath ../shared/data)
    shared = tmp_path / "shared" / "data"
    monkeypatch.setattr(paths, "SHARED_DATA", shared)
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    assert paths.default_data_root() is None  # nothing beside the checkout: download
    (shared / "planetoid").mkdir(parents=True)
    assert paths.default_data_root() == str(shared)
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "mine"))
    assert paths.default_data_root() == str(tmp_path / "mine")  # $ATTNBENCH_DATA wins, as in the Makefile
    monkeypatch.setenv(paths.DATA_ENV, "")
    assert paths.default_data_root() is None  # set but empty: download, as `make ATTNBENCH_DATA=` does


def test_an_environment_fault_is_retryable_and_an_old_record_of_one_is_retried():
    spec = make_spec("cora", "softmax", 0)
    old = Record.failed(spec, "MissingDataError: Cora: could not load Planetoid data into /x (ClientConnectorDNSError: ...)")
    assert not old.is_final() and not old.is_final(retry_failed=True)
    own = Record.failed(spec, "FloatingPointError: test metrics ['test/acc'] are not finite")
    assert own.is_final() and not own.is_final(retry_failed=True)

    try:
        try:
            raise paths.MissingDataError("Cora: missing ind.cora.x")
        except paths.MissingDataError as inner:
            raise RuntimeError("while building the datamodule") from inner
    except RuntimeError as exc:
        assert paths.is_environment_fault(exc)
    assert not paths.is_environment_fault(ValueError("bad config"))


def test_a_run_that_meets_missing_data_anyway_is_recorded_retryable(tmp_path, monkeypatch):
    """A fault that only shows while running (a file removed mid-suite) is not final: the next bench retries it."""
    from harness.run.runner import execute

    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    record = execute(make_spec("cora", "softmax", 0, {"max_epochs": 1}), data_root=str(tmp_path / "empty-root"))
    assert record.error.startswith("MissingDataError:") and record.retryable and not record.is_final()


def test_a_board_names_a_skipped_tasks_files_without_this_machines_data_root(tmp_path, shared_data, monkeypatch):
    """CI regenerates the committed boards from a clone elsewhere: a skipped task's reason must read the same
    whichever folder the data root is in (paper-gat's PubMed line once named /work/shared/data and failed CI)."""
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.report.board import build_board

    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    suite = load_suite("paper-gat")
    reasons = []
    for place in ("here", "elsewhere"):
        root = tmp_path / place / "data"
        for name in ("Cora", "CiteSeer"):  # PubMed is left out, so it is skipped
            (root / "planetoid" / name).mkdir(parents=True)
            (root / "planetoid" / name / "raw").symlink_to(shared_data / "planetoid" / name / "raw")
        board = build_board(suite, plan(suite, str(root), "softmax"), {})
        reasons.append(board["skipped_tasks"])
    assert set(reasons[0]) == {"pubmed"} and reasons[0] == reasons[1]
    assert "in the data root's planetoid/PubMed/raw" in reasons[0]["pubmed"] and str(tmp_path) not in reasons[0]["pubmed"]
