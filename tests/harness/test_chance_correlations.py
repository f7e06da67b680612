"""One-seed "at chance" tests for correlations (issue #16): MCC, Pearson and Spearman against 0 from n, checked
against scipy's own tests; F1 left untested with the reason in the table's footnote; and the trivial baseline
as a row of the CSV export, as on the Markdown board."""

import csv
import io
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from harness.report.board import _chance
from harness.report.sentences import untested_reason
from harness.report.stats import correlation_above_zero_p, metric_kind

BOARDS = Path(__file__).resolve().parents[2] / "leaderboards"


def test_pearson_and_spearman_match_scipys_one_sided_tests():
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    y = 0.25 * x + rng.normal(size=60)
    r = stats.pearsonr(x, y)
    assert correlation_above_zero_p(r.statistic, 60, "test/pearson") == pytest.approx(stats.pearsonr(x, y, alternative="greater").pvalue, rel=1e-9)
    rho = stats.spearmanr(x, y)
    assert correlation_above_zero_p(rho.statistic, 60, "test/spearman") == pytest.approx(
        stats.spearmanr(x, y, alternative="greater").pvalue, rel=1e-9)


def test_mcc_is_the_chi_square_test_of_independence_made_one_sided():
    """Two classes: n·MCC² is the chi-square statistic of the 2x2 table (no continuity correction)."""
    table = np.array([[420, 300], [180, 143]])  # rows: label 0/1, columns: prediction 0/1
    n = table.sum()
    tn, fp, fn, tp = table.ravel()
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    two_sided = stats.chi2_contingency(table, correction=False).pvalue
    assert mcc > 0 and correlation_above_zero_p(mcc, n, "test/mcc") == pytest.approx(two_sided / 2, rel=1e-9)
    assert correlation_above_zero_p(-mcc, n, "test/mcc") == pytest.approx(1 - two_sided / 2, rel=1e-9)
    assert correlation_above_zero_p(0.5, 2, "test/pearson") is None and correlation_above_zero_p(1.5, 100, "test/mcc") is None


def test_metric_kinds_by_name():
    assert [metric_kind(n) for n in ("test/mcc", "test/mm_pearson", "test/spearman", "test/f1", "test/acc", "test/macro_f1")] == [
        "correlation", "correlation", "correlation", "other", "other", "other"]


TRIVIAL_TEXT = {"predictor": "majority", "metrics": {"test/mcc": 0.0256, "test/f1": 0.812, "test/acc": 0.684},
                "test_sizes": {"test/mcc": 1043, "test/acc": 408}, "note": ""}


def test_one_seed_correlations_are_tested_against_zero_and_f1_is_not_tested():
    above = _chance([0.0836], TRIVIAL_TEXT, "test/mcc", True)
    assert above == {"p": pytest.approx(stats.norm.sf(0.0836 * math.sqrt(1043))), "test": "correlation", "at_chance": False}
    # 0.05 is above the trivial row's 0.0256 (what torchmetrics returns for a constant prediction) but not
    # significantly above 0 on 1043 examples
    assert _chance([0.05], TRIVIAL_TEXT, "test/mcc", True)["at_chance"] is True
    # several seeds: a t-test over them, against 0 as well
    several = _chance([0.03, 0.04, 0.05], TRIVIAL_TEXT, "test/mcc", True)
    assert several["test"] == "t" and several["p"] == pytest.approx(stats.ttest_1samp([0.03, 0.04, 0.05], 0.0, alternative="greater").pvalue)
    # a regression task's baseline has no correlation value (undefined for a constant), yet 0 is the null
    stsb = {"predictor": "mean", "metrics": {"test/pearson": None}, "test_sizes": {"test/pearson": 1500}, "note": ""}
    assert _chance([0.1], stsb, "test/pearson", True)["p"] == pytest.approx(stats.t.sf(0.1 * math.sqrt(1498 / 0.99), 1498))
    assert _chance([0.818], TRIVIAL_TEXT, "test/f1", True) is None
    assert "F1" in untested_reason("test/f1") and "t-test over seeds" in untested_reason("test/f1")
    assert _chance([0.70], TRIVIAL_TEXT, "test/acc", True)["test"] == "binomial"  # accuracies as before


def test_committed_glue_quick_tests_every_row_against_its_trivial_baseline():
    """Three seeds per row: correlations, accuracies and F1 alike get the one-sided t-test over seeds."""
    md = (BOARDS / "glue-quick.md").read_text()
    sections = [s for s in md.split("\n### ") if s.startswith("glue-")]
    assert sorted(s.split("\n", 1)[0] for s in sections) == ["glue-cola", "glue-mrpc", "glue-rte", "glue-sst2", "glue-stsb"]
    for section in sections:
        rows = [line for line in section.splitlines() if re.match(r"\| (\d+|—) \| `", line)]
        assert len(rows) == 11, section.split("\n", 1)[0]
        # rows of variants whose version moved since the board's runs have no records yet ("0/3", missing)
        finished = [line for line in rows if "| 3/3 |" in line]
        assert finished and all("above (" in line or "at chance (" in line for line in finished)
        assert all("| 0/3 |" in line and "| 3 |" in line for line in rows if line not in finished)
    assert "is not tested against the trivial baseline" not in md


def test_csv_export_has_the_trivial_row_of_each_task_as_the_markdown_board():
    rows = list(csv.DictReader(io.StringIO((BOARDS / "glue-quick.csv").read_text())))
    trivial = {r["task"]: r for r in rows if r["status"] == "trivial"}
    assert sorted(trivial) == ["glue-cola", "glue-mrpc", "glue-rte", "glue-sst2", "glue-stsb"]
    assert float(trivial["glue-mrpc"]["test/f1"]) == pytest.approx(0.812, abs=5e-4)  # the .md shows 81.2
    assert trivial["glue-stsb"]["test/pearson"] == ""  # undefined, as the .md says
    assert trivial["glue-cola"]["attention"].startswith("predictor=the train labels' class prior")
    md = (BOARDS / "glue-quick.md").read_text()
    finished = int(re.search(r"Records: \d+ of \d+ planned runs \(ok (\d+),", md).group(1))
    assert all(r["key"] == "" for r in trivial.values()) and sum(r["status"] == "ok" for r in rows) == finished > 0
