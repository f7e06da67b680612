"""What a table can conclude: trivial baselines against hand counts, at-chance marks, the resolution of a table,
and no ranks or marks below three seeds."""

import math

import numpy as np
import pytest
from scipy import stats

from datamodules.vqa import VQAExample, VQASplits
from harness.report.board import build_board
from harness.report.html_page import render_html
from harness.report.markdown import render_markdown
from harness.report.stats import above_chance_p, detectable_difference
from modules.tasks import get_task
from tests.harness.test_board import BASE, records_for, row, shifted, suite_and_plan, table

CORA_TEST_CLASS0 = 130
"""Test nodes of class 0 in Cora's public split (class sizes 130, 91, 144, 319, 149, 103, 64 of 1000)."""


def write_rte(root, train_labels, dev_labels):
    folder = root / "glue" / "RTE"
    folder.mkdir(parents=True)
    for name, labels in (("train", train_labels), ("dev", dev_labels)):
        lines = ["index\tsentence1\tsentence2\tlabel"] + [f"{i}\tpremise {i}\thypothesis {i}\t{label}" for i, label in enumerate(labels)]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n")


def test_text_baseline_is_the_train_prior_scored_on_dev_by_hand(tmp_path):
    write_rte(tmp_path, ["entailment"] * 24 + ["not_entailment"] * 6, ["entailment"] * 7 + ["not_entailment"] * 3)
    task = get_task("glue-rte")
    params = task.params({})
    baseline = task.trivial_baseline(params, str(tmp_path))

    train = task.splits(params, str(tmp_path)).train  # what the models train on: train minus the held-out part
    prior = [sum(e.label == c for e in train) / len(train) for c in (0, 1)]
    assert prior[0] > 0.5
    assert baseline.metrics["test/acc"] == pytest.approx(0.7)
    assert baseline.metrics["test/nll"] == pytest.approx(-(7 * math.log(prior[0]) + 3 * math.log(prior[1])) / 10, rel=1e-5)
    assert baseline.metrics["test/ece"] == pytest.approx(abs(0.7 - prior[0]), abs=1e-6)  # one confidence: one bin
    assert baseline.test_sizes == {"test/acc": 10}
    assert "always class 0" in baseline.predictor


def test_regression_baseline_says_correlation_is_undefined(shared_data):
    task = get_task("glue-stsb")
    baseline = task.trivial_baseline(task.params({}), str(shared_data))
    assert baseline.metrics == {"test/pearson": None, "test/spearman": None}
    assert "undefined" in baseline.note and "mean of the train labels" in baseline.predictor


def test_cora_baseline_is_class_zero_of_the_tied_public_split(shared_data):
    task = get_task("cora")
    baseline = task.trivial_baseline(task.params({}), str(shared_data))
    accuracy = CORA_TEST_CLASS0 / 1000
    assert baseline.metrics["test/acc"] == pytest.approx(accuracy)
    # class 0: precision 0.13, recall 1; the six classes never predicted score 0
    assert baseline.metrics["test/macro_f1"] == pytest.approx(2 * accuracy / (1 + accuracy) / 7)
    assert baseline.test_sizes == {"test/acc": 1000} and "tied" in baseline.predictor


def vqa_example(i, answers):
    """answers: answer -> number of humans who gave it (10 in all)."""
    ranked = sorted(answers.items(), key=lambda item: -item[1])
    return VQAExample(i, f"img{i}.png", "q?", tuple((a, min(n / 3, 1.0)) for a, n in ranked), tuple(n for _, n in ranked))


def test_vqa_baseline_answers_the_most_frequent_training_answer(monkeypatch):
    train = [vqa_example(0, {"yes": 10}), vqa_example(1, {"yes": 6, "no": 4}), vqa_example(2, {"two": 10})]
    test = [vqa_example(3, {"yes": 2, "no": 8}), vqa_example(4, {"no": 10}), vqa_example(5, {"yes": 10})]
    task = get_task("vqa")
    monkeypatch.setattr(task, "splits", lambda params, data_root: VQASplits(train, [], test))
    baseline = task.trivial_baseline(task.params({}), None)
    prior = {"yes": 16 / 30, "no": 4 / 30, "two": 10 / 30}
    assert baseline.metrics["test/vqa_acc"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    # reference answers: no, no, yes
    assert baseline.metrics["test/nll"] == pytest.approx(-(2 * math.log(prior["no"]) + math.log(prior["yes"])) / 3)
    assert baseline.metrics["test/ece"] == pytest.approx(abs(1 / 3 - prior["yes"]))
    # the prior's entropy (0.97 nats) is above the 0.5 threshold: uncertain everywhere, so PAvPU counts the inaccurate
    assert baseline.metrics["test/pavpu"] == pytest.approx(1 / 3)
    assert "'yes'" in baseline.predictor
    assert baseline.test_sizes == {}  # soft scores (2/3): not a count of correct answers, no binomial test

    one_answer = [vqa_example(i, {"yes": 10}) for i in range(3)] + [vqa_example(3, {"no": 10})]
    monkeypatch.setattr(task, "splits", lambda params, data_root: VQASplits(train, [], one_answer))
    assert task.trivial_baseline(task.params({}), None).test_sizes == {"test/vqa_acc": 4}


def test_rows_not_above_the_trivial_baseline_are_at_chance(tmp_path, shared_data):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=3)
    chance = CORA_TEST_CLASS0 / 1000
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": [chance + 0.002, chance - 0.003, chance + 0.001, None, None]}))
    cora = table(board)
    assert cora["trivial"]["metrics"]["test/acc"] == pytest.approx(chance)
    softmax_p = stats.ttest_1samp(BASE[:3], chance, alternative="greater").pvalue
    assert row(cora, "softmax")["chance"] == {"p": pytest.approx(softmax_p), "p_holm": pytest.approx(2 * softmax_p),  # Holm over 2 rows
                                                "test": "t", "at_chance": False}
    gmm = row(cora, "gmm")["chance"]
    assert gmm["at_chance"] and gmm["p"] == pytest.approx(stats.ttest_1samp([0.002, -0.003, 0.001], 0.0, alternative="greater").pvalue, abs=1e-9)
    md = render_markdown(board)
    gmm_line = next(line for line in md.split("### cora")[1].splitlines() if line.startswith("| ") and "`gmm`" in line)
    assert "at chance (" in gmm_line
    assert "| — | *trivial* | 13.0 | 3.3 |" in md and "tied with 6 other classes" in md
    page = render_html(board)
    assert '<tr class="trivial">' in page and "at chance (" in page


def test_one_seed_is_tested_against_chance_with_an_exact_binomial_test():
    # 140 of 1000 against a rate of 0.13: p = P(X >= 140), X ~ Binomial(1000, 0.13), summed here by hand
    by_hand = sum(math.comb(1000, k) * 0.13 ** k * 0.87 ** (1000 - k) for k in range(140, 1001))
    p, test = above_chance_p([0.14], 0.13, True, 1000)
    assert test == "binomial" and p == pytest.approx(by_hand, rel=1e-9) and p > 0.05
    assert above_chance_p([0.16], 0.13, True, 1000)[0] < 0.01
    assert above_chance_p([0.5], 0.13, True, None) is None  # not an accuracy: no test with one seed
    assert above_chance_p([0.12, 0.12, 0.12], 0.13, False) == (0.0, "t")  # lower is better, constant and below


def test_detectable_difference_matches_the_power_of_a_simulated_paired_t_test():
    # G*Power's paired t-test (two-sided, alpha 0.05, power 0.8) needs d = 0.9965 at n = 10
    assert detectable_difference(1.0, 10) == pytest.approx(0.9965, abs=5e-4)
    assert detectable_difference(2.0, 10) == pytest.approx(2 * detectable_difference(1.0, 10))
    effect = detectable_difference(1.0, 3)
    rng = np.random.default_rng(0)
    diffs = rng.normal(effect, 1.0, size=(200_000, 3))
    t = diffs.mean(axis=1) / (diffs.std(axis=1, ddof=1) / math.sqrt(3))
    power = np.mean(np.abs(t) > stats.t.ppf(0.975, 2))
    assert power == pytest.approx(0.8, abs=0.005)
    assert detectable_difference(1.0, 1) is None


def test_table_resolution_is_the_median_paired_spread_of_its_variants(tmp_path, shared_data):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel"], seeds=3)
    gmm_diffs, fenchel_diffs = [0.01, 0.03, 0.02], [0.0, -0.04, 0.01]
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted(gmm_diffs + [0, 0])[:3] + [None, None],
                                                                "fenchel": shifted(fenchel_diffs + [0, 0])[:3] + [None, None]}))
    resolution = table(board)["resolution"]
    # the median of two spreads is their mean (of the sds, not of the variances a pooled spread averages)
    median = (np.std(gmm_diffs, ddof=1) + np.std(fenchel_diffs, ddof=1)) / 2
    assert resolution["pairs"] == 3 and resolution["variants"] == 2
    assert resolution["spread"] == pytest.approx(median)
    assert resolution["difference"] == pytest.approx(detectable_difference(median, 3))
    assert f"{resolution['difference'] * 100:.2f} points in `test/acc`" in render_markdown(board)


def test_a_row_ahead_on_seeds_does_not_lend_the_table_its_resolution(tmp_path, shared_data):
    """While a table fills in, one row with all 5 seeds and two with 3: the resolution is for 3 paired seeds."""
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax"], seeds=5)
    diffs = [0.01, 0.03, 0.02, -0.01, 0.0]
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted(diffs),
                                                                "fenchel": shifted(diffs)[:3] + [None, None],
                                                                "sparsemax": shifted(diffs)[:3] + [None, None]}))
    resolution = table(board)["resolution"]
    assert resolution["pairs"] == 3
    assert resolution["difference"] == pytest.approx(detectable_difference(resolution["spread"], 3))


def test_tables_below_three_seeds_show_values_but_no_ranks_and_no_marks(tmp_path, shared_data):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "sparsemax"], seeds=2)
    # gmm is 5 points ahead on both seeds: a paired test would call that a constant shift (p = 0)
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.05] * 5), "sparsemax": shifted([-0.05] * 5)}))
    cora = table(board)
    assert [r["rank"] for r in cora["rows"]] == [None, None, None]
    assert [r["variant"] for r in cora["rows"]] == ["gmm", "softmax", "sparsemax"]  # by name, not by value
    gmm = row(cora, "gmm")["metrics"]["test/acc"]
    assert gmm["mean"] == pytest.approx(statistics_mean(BASE[:2]) + 0.05) and gmm["vs_baseline"]["mark"] is None
    assert board["groups"][0]["overall"][0]["mean_rank"] is None
    md = render_markdown(board)
    tables = md.split("### cora")[1].split("## Reading this board")[0]  # the legend after the tables explains ▲ / ▼
    assert "▲" not in tables and "▼" not in tables
    rows = [line.split(" | ") for line in tables.splitlines() if line.startswith("| ") and line.split(" | ")[1].startswith("`")]
    assert len(rows) == 3 and all(cells[0] == "| —" for cells in rows)
    # with a third seed the same shift is ranked and marked
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "sparsemax"], seeds=3)
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.05] * 5), "sparsemax": shifted([-0.05] * 5)}))
    assert [(r["variant"], r["rank"]) for r in table(board)["rows"]] == [("gmm", 1), ("softmax", 2), ("sparsemax", 3)]
    assert row(table(board), "gmm")["metrics"]["test/acc"]["vs_baseline"]["mark"] == "better"


def statistics_mean(values):
    return sum(values) / len(values)
