"""Learning curves: a short real run records its per-epoch history, the HTML board draws it, and --logger
writes Lightning's own log files."""

import csv
import importlib.util
import math
import textwrap

import pytest

from harness.plan.planner import plan
from harness.plan.suite import load_suite
from harness.report.board import build_board
from harness.report.html_page import render_html
from harness.run.callbacks import MAX_HISTORY_POINTS, History
from harness.run.runner import LOG_DIR_ENV, LOGGER_ENV, execute, use_logger


@pytest.fixture
def csv_logging(tmp_path, monkeypatch):
    # through monkeypatch first, so that teardown removes what use_logger sets
    monkeypatch.setenv(LOGGER_ENV, "")
    monkeypatch.setenv(LOG_DIR_ENV, "")
    use_logger("csv", tmp_path / "logs")
    return tmp_path / "logs"


def test_a_short_cora_run_records_its_curves_draws_them_and_logs_csv(tmp_path, shared_data, csv_logging):
    suite_file = tmp_path / "curves.yaml"
    suite_file.write_text(textwrap.dedent("""
        name: curves
        tasks: [cora]
        variants: [softmax]
        seeds: 1
        params: {max_epochs: 3, patience: 10}
    """))
    suite = load_suite(str(suite_file))
    the_plan = plan(suite, str(shared_data))
    spec = the_plan.specs[0]
    record = execute(spec, data_root=str(shared_data))
    assert record.status.value == "ok", record.error

    history = record.history
    assert history["epoch"] == [1, 2, 3]
    for name in ("train/loss", "val/loss", "val/acc", "val/macro_f1", "epoch_s"):
        assert len(history[name]) == 3 and all(math.isfinite(v) for v in history[name]), name
    assert all(0.0 <= v <= 1.0 for v in history["val/acc"])
    # timing is not asserted: each epoch's clock difference is filled in (a whole epoch never measures 0 s)
    assert all(v > 0 for v in history["epoch_s"])
    # the best epoch's validation loss is the record's best monitor value, to the 4 digits the curve keeps
    assert history["val/loss"][record.best_epoch] == pytest.approx(record.best_monitor["value"], rel=1e-3)

    # Lightning's CSVLogger wrote the same validation curve
    metrics_csv = csv_logging / "cora" / "softmax" / f"seed0-{spec.key}" / "metrics.csv"
    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("val/acc")]
    assert [float(r["val/acc"]) for r in rows] == pytest.approx(history["val/acc"], rel=1e-3)

    page = render_html(build_board(suite, the_plan, {spec.key: record}))
    curves = page.split("Learning curves")[0].rsplit("<figure>", 1)[1]
    assert ">train/loss<" in curves and ">val/acc<" in curves and "<path" in curves


def test_history_averages_blocks_of_epochs_on_long_fits():
    history = History()
    history.epochs = [{"train/loss": float(e), "epoch_s": 0.1} for e in range(2 * MAX_HISTORY_POINTS - 3)]  # stopped early
    history.epochs[4]["val/acc"] = 0.5
    compact = history.compact()
    assert len(compact["epoch"]) == MAX_HISTORY_POINTS - 1
    assert compact["epoch"][:3] == [2, 4, 6] and compact["epoch"][-1] == 2 * MAX_HISTORY_POINTS - 3
    assert compact["train/loss"][:2] == [0.5, 2.5] and compact["train/loss"][-1] == 2 * MAX_HISTORY_POINTS - 4
    assert compact["val/acc"][:3] == [None, None, 0.5]
    assert History().compact() is None


@pytest.mark.parametrize("epochs, block", [(1, 1), (MAX_HISTORY_POINTS, 1), (MAX_HISTORY_POINTS + 1, 2), (500, 16), (5000, 128)])
def test_history_blocks_follow_the_epochs_run_not_the_cap(epochs, block):
    # paper-gat caps fits at 100,000 epochs and stops them by patience after a few hundred: blocks sized from
    # the cap made those curves one point each
    history = History()
    history.epochs = [{"train/loss": float(e)} for e in range(epochs)]
    compact = history.compact()
    assert len(compact["epoch"]) <= MAX_HISTORY_POINTS and compact["epoch"][-1] == epochs
    assert compact["epoch"][0] == min(block, epochs)
    if epochs > 2 * MAX_HISTORY_POINTS:
        assert len(compact["epoch"]) > MAX_HISTORY_POINTS // 2  # a halving too many would waste the points


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None or importlib.util.find_spec("tensorboardX") is not None,
                    reason="tensorboard is installed")
def test_tensorboard_logger_without_tensorboard_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.delenv(LOGGER_ENV, raising=False)
    with pytest.raises(ValueError, match=r"attnbench\[tensorboard\]"):
        use_logger("tensorboard", tmp_path)
    import os

    assert LOGGER_ENV not in os.environ


def test_run_with_logger_csv_writes_metrics_under_the_runs_dir(tmp_path, shared_data, monkeypatch):
    from harness.cli import main

    monkeypatch.setenv(LOGGER_ENV, "")
    monkeypatch.setenv(LOG_DIR_ENV, "")
    runs = tmp_path / "runs"
    assert main(["run", "cora", "softmax", "--set", "max_epochs=2", "--runs-dir", str(runs), "--data-root", str(shared_data),
                 "--logger", "csv"]) == 0
    (metrics_csv,) = (runs / "logs" / "cora" / "softmax").glob("seed0-*/metrics.csv")
    assert sum(1 for r in csv.DictReader(metrics_csv.open()) if r.get("val/acc")) == 2


def test_an_epoch_of_one_step_sums_its_values_as_sum_did():
    """History hands a one-step epoch's value itself (no add on the device) and adds 0 on the host: sum()'s result,
    -0.0 turned into 0.0 included."""
    import math

    import torch

    from harness.run.callbacks import _as_summed, _epoch_sum

    for values in ([torch.tensor(-0.0)], [torch.tensor(0.25)], [torch.tensor(float("nan"))], [torch.tensor(1.5), torch.tensor(-0.0)],
                   [torch.tensor(3, dtype=torch.long)]):
        expected, got = float(sum(values)), _as_summed(float(_epoch_sum(values)))
        assert (math.isnan(expected) and math.isnan(got)) or (expected == got and math.copysign(1, expected) == math.copysign(1, got))
