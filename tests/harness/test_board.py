"""The board's statistics on synthetic records: marks, Holm, confidence intervals, ranks, hardware groups."""

import json
import math
import statistics
import textwrap

import numpy as np
import pytest
from scipy import stats

from harness.report.board import build_board
from harness.report.sentences import finding_sentence, overall_finding_sentence
from harness.report.html_page import render_html
from harness.report.markdown import render_markdown
from harness.report.stats import clip_interval, holm, metric_range, paired_p
from harness.plan.planner import plan
from harness.plan.suite import load_suite
from modules.tasks import get_task

CPU = {"accelerator": "cpu", "device": "AMD EPYC", "device_count": 0, "cpu": "AMD EPYC", "threads": 1, "label": "CPU AMD EPYC (1 thread/run)"}
GPU = {"accelerator": "gpu", "device": "NVIDIA H100", "device_count": 1, "cpu": "Intel Xeon", "label": "1x NVIDIA H100"}
BASE = [0.801, 0.815, 0.808, 0.822, 0.797]
"""Softmax's test accuracy on seeds 0..4; other variants are built as BASE + chosen differences."""


def suite_and_plan(tmp_path, variants, tasks=("cora",), seeds=5):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""
        name: synthetic
        description: made up records
        tasks: [{', '.join(tasks)}]
        variants: [{', '.join(variants)}]
        seeds: {seeds}
    """))
    suite = load_suite(str(path))
    return suite, plan(suite)


def record(spec, values, status="ok", hardware=CPU, finished="2026-01-02T10:00:00+00:00", commit="abc123", **fields):
    """`values`: metric name -> value; undeclared metrics of the task get 0.5 so every record is complete."""
    task = get_task(spec.task)
    metrics = {m.name: {"value": float(values.get(m.name, 0.5)), "higher_is_better": m.higher_is_better} for m in task.metrics}
    return {
        "key": spec.key, "spec": spec.to_dict(), "status": status, "error": "RuntimeError: boom\nmore" if status == "failed" else None,
        "metrics": metrics if status == "ok" else {}, "commit": commit, "finished": finished, "hardware": dict(hardware),
        "versions": {"python": "3.11.7", "torch": "2.14.1", "lightning": "2.6.6"},
        "epochs": 100, "time_per_epoch_s": 0.05, "fit_time_s": 5.0, "wall_time_s": 6.0, "peak_memory_mb": 900.0, "parameters": 1234,
        **fields,
    }


def records_for(the_plan, accuracy_by_variant, task="cora", **kwargs):
    """accuracy_by_variant: label -> list of test/acc per seed (None = no record for that seed)."""
    found = {}
    for spec in the_plan.specs:
        values = accuracy_by_variant.get(spec.display)
        if spec.task != task or values is None or values[spec.seed] is None:
            continue
        found[spec.key] = record(spec, {"test/acc": values[spec.seed]}, **kwargs)
    return found


def table(board, task="cora", group=0):
    return next(t for t in board["groups"][group]["tasks"] if t["task"] == task)


def row(tbl, variant):
    return next(r for r in tbl["rows"] if r["variant"] == variant)


def shifted(diffs):
    return [b + d for b, d in zip(BASE, diffs)]


def test_better_tie_and_worse_are_marked_by_a_paired_test(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax"])
    accuracies = {
        "softmax": BASE,
        "gmm": shifted([0.020, 0.022, 0.018, 0.021, 0.019]),
        "fenchel": shifted([0.004, -0.003, 0.002, -0.004, 0.002]),  # noise around softmax
        "sparsemax": shifted([-0.020, -0.017, -0.023, -0.019, -0.021]),
    }
    board = build_board(suite, the_plan, records_for(the_plan, accuracies))
    cora = table(board)
    assert cora["baseline"] == "softmax"
    marks = {r["variant"]: (r["metrics"]["test/acc"]["vs_baseline"] or {}).get("mark") for r in cora["rows"]}
    assert marks == {"gmm": "better", "fenchel": None, "sparsemax": "worse", "softmax": None}
    assert row(cora, "softmax")["metrics"]["test/acc"]["vs_baseline"] is None
    gmm = row(cora, "gmm")["metrics"]["test/acc"]["vs_baseline"]
    assert gmm["p"] == pytest.approx(stats.ttest_rel(accuracies["gmm"], BASE).pvalue)
    assert gmm["diff"] == pytest.approx(0.02) and gmm["n_pairs"] == 5
    assert [r["variant"] for r in cora["rows"]] == ["gmm", "fenchel", "softmax", "sparsemax"]
    assert [r["rank"] for r in cora["rows"]] == [1, 2, 2, 4]  # fenchel is noise around softmax: no rank between them
    overall = {o["variant"]: o for o in board["groups"][0]["overall"]}
    assert (overall["gmm"]["better"], overall["gmm"]["worse"]) == (1, 0)
    assert (overall["sparsemax"]["better"], overall["sparsemax"]["worse"]) == (0, 1)


def test_a_lower_is_better_metric_flips_the_direction(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], tasks=("easy-vqa",))
    found = {}
    for spec in the_plan.specs:
        shift = 1 if spec.variant == "gmm" else 0
        ece = BASE[spec.seed] / 10 - shift * (0.01 + 0.001 * spec.seed)  # gmm: lower calibration error
        found[spec.key] = record(spec, {"test/vqa_acc": BASE[spec.seed] - shift * 0.03, "test/ece": ece})
    vqa = table(build_board(suite, the_plan, found), task="easy-vqa")
    assert vqa["primary"] == "test/vqa_acc" and vqa["higher_is_better"]
    assert {m["name"]: m["higher_is_better"] for m in vqa["metrics"]}["test/ece"] is False
    gmm = row(vqa, "gmm")["metrics"]
    assert gmm["test/ece"]["vs_baseline"]["diff"] < 0 and gmm["test/ece"]["vs_baseline"]["mark"] == "better"
    assert gmm["test/vqa_acc"]["vs_baseline"]["mark"] == "worse"


def test_a_lower_is_better_primary_metric_ranks_the_lowest_mean_first_with_competition_ties(tmp_path):
    """The records say the primary metric is lower-is-better (an error rate, a loss): rank ascending."""
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax", "entmax15"])
    errors = {
        "softmax": BASE,
        "gmm": shifted([-0.050, -0.052, -0.049, -0.051, -0.048]),  # clearly lower error: better, rank 1
        "fenchel": shifted([-0.050, -0.052, -0.049, -0.051, -0.048]),  # the same values: shares rank 1
        "sparsemax": shifted([0.030, 0.031, 0.029, 0.032, 0.028]),  # higher error: worse, last
        "entmax15": [None] * 5,  # nothing ran: unranked, after every ranked row
    }
    found = records_for(the_plan, errors)
    for rec in found.values():
        rec["metrics"]["test/acc"]["higher_is_better"] = False
    cora = table(build_board(suite, the_plan, found))
    assert cora["primary"] == "test/acc" and cora["higher_is_better"] is False
    assert [(r["variant"], r["rank"]) for r in cora["rows"]] == [
        ("fenchel", 1), ("gmm", 1), ("softmax", 3), ("sparsemax", 4), ("entmax15", None)]
    assert row(cora, "gmm")["metrics"]["test/acc"]["mean"] == pytest.approx(statistics.fmean(BASE) - 0.05)
    marks = {r["variant"]: (r["metrics"]["test/acc"]["vs_baseline"] or {}).get("mark") for r in cora["rows"]}
    assert marks == {"fenchel": "better", "gmm": "better", "softmax": None, "sparsemax": "worse", "entmax15": None}
    overall = {o["variant"]: (o["mean_rank"], o["better"], o["worse"]) for o in build_board(suite, the_plan, found)["groups"][0]["overall"]}
    assert overall == {"fenchel": (1.0, 1, 0), "gmm": (1.0, 1, 0), "softmax": (3.0, 0, 0), "sparsemax": (4.0, 0, 1), "entmax15": (None, 0, 0)}


def test_within_a_tier_a_lower_is_better_metric_lists_the_lowest_mean_first(tmp_path):
    """Rows the tests cannot tell apart share a rank and are listed by mean: ascending for a lower-is-better metric
    (an error rate, a loss), and the finding names them in that order too. A flipped sort direction failed no test."""
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax"])
    errors = {
        "softmax": BASE,
        "gmm": shifted([0.004, -0.003, 0.002, -0.004, 0.005]),  # noise around softmax, mean +0.0008: after it
        "fenchel": shifted([-0.006, 0.001, -0.004, 0.002, -0.005]),  # mean -0.0024: the lowest, first
        "sparsemax": shifted([0.009, 0.002, 0.006, 0.001, 0.007]),  # mean +0.005: last of the tier
    }
    found = records_for(the_plan, errors)
    for rec in found.values():
        rec["metrics"]["test/acc"]["higher_is_better"] = False
    cora = table(build_board(suite, the_plan, found))
    assert {(r["metrics"]["test/acc"]["vs_baseline"] or {}).get("mark") for r in cora["rows"]} == {None}  # one tier
    means = [r["metrics"]["test/acc"]["mean"] for r in cora["rows"]]
    assert [r["variant"] for r in cora["rows"]] == ["fenchel", "softmax", "gmm", "sparsemax"] and means == sorted(means)
    assert [r["rank"] for r in cora["rows"]] == [1, 1, 1, 1]


def test_holm_adjusts_like_the_hand_computation():
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.02, "d": 0.5})
    # sorted 0.01, 0.02, 0.04, 0.5 -> 4*0.01, max(0.04, 3*0.02), max(0.06, 2*0.04), max(0.08, 1*0.5)
    assert adjusted == pytest.approx({"a": 0.04, "c": 0.06, "b": 0.08, "d": 0.5})
    assert holm({"a": 0.3, "b": 0.9}) == pytest.approx({"a": 0.6, "b": 0.9})  # 2 * 0.3, then max(0.6, 1 * 0.9)
    assert holm({"a": 0.4, "b": 0.45, "c": 0.9}) == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})  # 3 * 0.4 capped at 1
    assert holm({}) == {}


def diffs_with_p(p, n=5, width=0.004):
    """Paired differences whose two-sided t-test has exactly p: spread fixed, mean solved for."""
    spread = np.linspace(-width, width, n)
    t = stats.t.isf(p / 2, n - 1)
    return list(spread + t * spread.std(ddof=1) / math.sqrt(n))


def test_holm_unmarks_a_borderline_difference(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax"])
    wanted = {"gmm": 0.02, "fenchel": 0.03, "sparsemax": 0.04}
    accuracies = {"softmax": BASE, **{name: shifted(diffs_with_p(p)) for name, p in wanted.items()}}
    cora = table(build_board(suite, the_plan, records_for(the_plan, accuracies)))
    comparisons = {name: row(cora, name)["metrics"]["test/acc"]["vs_baseline"] for name in wanted}
    for name, p in wanted.items():
        assert comparisons[name]["p"] == pytest.approx(p, rel=1e-6)
        assert comparisons[name]["p"] < 0.05
    # Holm by hand: 3 * 0.02 = 0.06; max(0.06, 2 * 0.03) = 0.06; max(0.06, 0.04) = 0.06.
    assert {n: c["p_holm"] for n, c in comparisons.items()} == pytest.approx({"gmm": 0.06, "fenchel": 0.06, "sparsemax": 0.06}, rel=1e-6)
    assert all(c["mark"] is None for c in comparisons.values())

    # The same gmm alone against softmax is one test: no correction, and it is marked.
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"])
    alone = row(table(build_board(suite, the_plan, records_for(the_plan, accuracies))), "gmm")["metrics"]["test/acc"]["vs_baseline"]
    assert alone["p_holm"] == pytest.approx(0.02, rel=1e-6) and alone["mark"] == "better"


def test_mean_std_and_confidence_interval_match_scipy(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax"])
    cell = row(table(build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE}))), "softmax")["metrics"]["test/acc"]
    mean, std = np.mean(BASE), np.std(BASE, ddof=1)
    low, high = stats.t.interval(0.95, len(BASE) - 1, loc=mean, scale=stats.sem(BASE))
    assert cell["values"] == BASE and cell["seeds"] == [0, 1, 2, 3, 4] and cell["n"] == 5
    assert (cell["mean"], cell["std"], cell["ci_low"], cell["ci_high"]) == pytest.approx((mean, std, low, high))
    assert high - low == pytest.approx(2 * 2.776445 * std / math.sqrt(5), rel=1e-6)  # t(0.975, 4) from the tables


def test_one_seed_has_a_mean_but_no_spread_and_no_test(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=2)
    found = records_for(the_plan, {"softmax": BASE[:2], "gmm": [None, 0.9]})
    gmm = row(table(build_board(suite, the_plan, found)), "gmm")
    cell = gmm["metrics"]["test/acc"]
    assert (cell["n"], cell["mean"], cell["std"], cell["ci_low"], cell["ci_high"]) == (1, 0.9, None, None, None)
    assert cell["vs_baseline"] is None  # one paired seed is not a test
    assert gmm["missing"] == 1


def test_zero_variance_differences_give_p_1_or_0_never_nan(tmp_path):
    assert paired_p([0.0, 0.0, 0.0]) == 1.0
    assert paired_p([0.01, 0.01, 0.01]) == 0.0
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax"])
    accuracies = {"softmax": BASE, "gmm": list(BASE), "fenchel": shifted([0.01] * 5), "sparsemax": shifted([-0.01] * 5)}
    board = build_board(suite, the_plan, records_for(the_plan, accuracies))
    json.dumps(board, allow_nan=False, default=dict)  # raises on NaN or inf anywhere (typed parts, Comparison, as the mappings they read as)
    cora = table(board)
    same, up, down = (row(cora, n)["metrics"]["test/acc"]["vs_baseline"] for n in ("gmm", "fenchel", "sparsemax"))
    assert (same["p"], same["p_holm"], same["mark"]) == (1.0, 1.0, None)
    assert (up["p"], up["p_holm"], up["mark"]) == (0.0, 0.0, "better")
    assert (down["p"], down["mark"]) == (0.0, "worse")
    # The tied means share a rank and the next rank is skipped (competition ranking).
    assert [(r["variant"], r["rank"]) for r in cora["rows"]] == [("fenchel", 1), ("gmm", 2), ("softmax", 2), ("sparsemax", 4)]


def test_pairs_use_only_seeds_ok_in_both(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"])
    found = records_for(the_plan, {"softmax": [*BASE[:4], None], "gmm": [None, *shifted([0.01, 0.012, 0.009, 0.011, 0.010])[1:]]})
    comparison = row(table(build_board(suite, the_plan, found)), "gmm")["metrics"]["test/acc"]["vs_baseline"]
    assert comparison["n_pairs"] == 3 and comparison["diff"] == pytest.approx(statistics.fmean([0.012, 0.009, 0.011]))


def test_seeds_on_two_hardware_classes_rank_in_one_table_with_cost_per_class(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=6)
    found = {}
    for spec in the_plan.specs:
        on_gpu = spec.seed >= 3
        value = (0.95 if spec.variant == "gmm" else 0.80) if on_gpu else (0.70 if spec.variant == "gmm" else 0.80)
        found[spec.key] = record(spec, {"test/acc": value + 0.001 * spec.seed}, hardware=GPU if on_gpu else CPU,
                                 time_per_epoch_s=0.01 if on_gpu else 0.5)
    board = build_board(suite, the_plan, found)
    (group,) = board["groups"]
    assert [(c["label"], c["records"]) for c in board["hardware_classes"]] == [(GPU["label"], 6), (CPU["label"], 6)]
    cora = table(board)
    # every seed, whatever machine ran it, is in the one ranking: gmm's mean is (0.70*3 + 0.95*3)/6 + seeds, ahead
    # of softmax but not significantly (-0.10 on three seeds, +0.15 on three), so the two share rank 1
    assert [(r["variant"], r["rank"], r["n"]) for r in cora["rows"]] == [("gmm", 1, 6), ("softmax", 1, 6)]
    assert row(cora, "gmm")["metrics"]["test/acc"]["seeds"] == [0, 1, 2, 3, 4, 5]
    assert row(cora, "gmm")["metrics"]["test/acc"]["mean"] == pytest.approx(statistics.fmean([0.825 + 0.001 * s for s in range(6)]))
    # cost is never mixed across classes: one cost per class, none for the row as a whole
    gmm = row(cora, "gmm")
    assert gmm["cost"] is None
    assert {label: (c["runs"], c["time_per_epoch_s"]) for label, c in gmm["cost_by_class"].items()} == {
        CPU["label"]: (3, pytest.approx(0.5)), GPU["label"]: (3, pytest.approx(0.01))}
    assert gmm["cost_by_class"][CPU["label"]]["gpu_hours"] is None
    assert gmm["cost_by_class"][GPU["label"]]["gpu_hours"] == pytest.approx(3 * 6.0 / 3600)
    text = render_markdown(board)
    assert text.count("### cora") == 1 and "Cost per hardware class" in text
    assert f"| `gmm` | {CPU['label']} | 3 |" in text and f"| `gmm` | {GPU['label']} | 3 |" in text
    assert "time/epoch" not in text.split("### cora")[1].split("Cost per hardware class")[0]  # no mixed cost column in the ranking
    # the page names both classes where it said "Accelerator: unknown, device: unknown"
    page = render_html(board)
    assert "Accelerator: unknown" not in page
    assert f"<p>Hardware classes: {GPU['label']} (6 records); {CPU['label']} (6 records);" in page


def test_seed_batched_records_are_costed_apart_from_lone_runs_on_the_same_hardware(tmp_path):
    """A batch's time per seed is not a lone run's (paper-gat's tuned BAM rows: 66 s per seed in batches of 20, 29 s
    lone, on one Xeon): the two are never averaged into one cost."""
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=4)
    found = {spec.key: record(spec, {"test/acc": 0.8}, **({"execution": {"seed_batch": 2}, "time_per_epoch_s": 0.2}
                                                         if spec.seed >= 2 else {"time_per_epoch_s": 0.05}))
             for spec in the_plan.specs}
    board = build_board(suite, the_plan, found)
    assert board["cost_classes"] == [CPU["label"], f"{CPU['label']}, seed batches of 2"]
    gmm = row(table(board), "gmm")
    assert gmm["cost"] is None
    assert {label: (c["runs"], c["time_per_epoch_s"]) for label, c in gmm["cost_by_class"].items()} == {
        CPU["label"]: (2, pytest.approx(0.05)), f"{CPU['label']}, seed batches of 2": (2, pytest.approx(0.2))}
    text = render_markdown(board)
    assert f"| `gmm` | {CPU['label']}, seed batches of 2 | 2 |" in text and f"| `gmm` | {CPU['label']} | 2 |" in text


def test_one_hardware_class_keeps_cost_in_the_table(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"])
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": BASE}))
    gmm = row(table(board), "gmm")
    assert gmm["cost"] == {k: v for k, v in gmm["cost_by_class"][CPU["label"]].items()}
    assert "Cost per hardware class" not in render_markdown(board)


def test_overall_mean_rank_and_coverage(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel"], tasks=("cora", "citeseer"))
    found = {
        # cora: gmm 1 (clearly better), softmax and fenchel (noise around it) share 2
        **records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.05, 0.051, 0.049, 0.052, 0.048]),
                                 "fenchel": shifted([-0.001, 0.002, -0.003, 0.001, -0.004])}, task="cora"),
        # citeseer: softmax and gmm (not significantly apart) share 1, fenchel never ran
        **records_for(the_plan, {"softmax": BASE, "gmm": shifted([-0.01, 0.002, -0.003, 0.001, -0.004])}, task="citeseer"),
    }
    group = build_board(suite, the_plan, found)["groups"][0]
    assert [t["task"] for t in group["tasks"]] == ["cora", "citeseer"]
    assert group["overall"] == [
        {"variant": "gmm", "mean_rank": 1.0, "tasks_covered": 2, "tasks_total": 2, "better": 1, "worse": 0},
        {"variant": "softmax", "mean_rank": 1.5, "tasks_covered": 2, "tasks_total": 2, "better": 0, "worse": 0},
        {"variant": "fenchel", "mean_rank": 2.0, "tasks_covered": 1, "tasks_total": 2, "better": 0, "worse": 0},
    ]
    citeseer = group["tasks"][1]
    assert row(citeseer, "fenchel")["rank"] is None and row(citeseer, "fenchel")["missing"] == 5
    assert citeseer["rows"][-1]["variant"] == "fenchel"


def test_status_counts_and_no_baseline_without_softmax_runs(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=3)
    found = {}
    for spec in the_plan.specs:
        if spec.variant == "softmax":
            found[spec.key] = record(spec, {}, status="failed" if spec.seed < 2 else "pruned")
        elif spec.seed < 2:
            found[spec.key] = record(spec, {"test/acc": 0.8})
    board = build_board(suite, the_plan, found)
    assert board["status_counts"] == {"ok": 2, "failed": 2, "pruned": 1, "missing": 1}
    assert (board["planned"], board["recorded"]) == (6, 5)
    cora = table(board)
    assert cora["baseline"] is None
    softmax = row(cora, "softmax")
    assert (softmax["n"], softmax["failed"], softmax["pruned"], softmax["rank"]) == (0, 2, 1, None)
    assert softmax["errors"] == ["RuntimeError: boom"]


def test_no_records_yet_still_shows_every_planned_row_as_missing(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=2)
    board = build_board(suite, the_plan, {})
    assert board["status_counts"] == {"ok": 0, "failed": 0, "pruned": 0, "missing": 4} and board["finished_range"] == [None, None]
    (group,) = board["groups"]
    assert group["hardware"] == "no records yet" and group["records"] == 0
    assert [(r["variant"], r["rank"], r["missing"]) for r in group["tasks"][0]["rows"]] == [("gmm", None, 2), ("softmax", None, 2)]
    assert [(o["variant"], o["mean_rank"], o["tasks_covered"]) for o in group["overall"]] == [("gmm", None, 0), ("softmax", None, 0)]


def test_paired_p_treats_spread_within_1e_12_of_the_scale_as_float_noise():
    """The tolerance is 1e-12 x max(1, |diff|), inclusive: at 1000 a spread of 2e-10 is noise (a constant shift,
    p = 0); at scale 1 a spread of 1.5e-12 is not (a t-test runs); a spread of exactly 1e-12 around 0 is no
    difference (p = 1)."""
    assert paired_p([1000.0 + 1e-10, 1000.0, 1000.0 - 1e-10]) == 0.0
    p = paired_p([1.5e-12, 0.0, 0.7e-12])
    assert p == pytest.approx(stats.ttest_rel([1.5e-12, 0.0, 0.7e-12], [0.0] * 3).pvalue) and 0 < p < 1
    assert paired_p([1e-12, 0.0]) == 1.0


def test_summaries_of_no_one_and_two_values():
    from harness.report.stats import summarize

    assert summarize([]) == {"n": 0, "mean": None, "std": None, "ci_low": None, "ci_high": None}
    assert summarize([0.5]) == {"n": 1, "mean": 0.5, "std": None, "ci_low": None, "ci_high": None}
    two = summarize([1.0, 3.0])
    half = stats.t.ppf(0.975, 1) * math.sqrt(2) / math.sqrt(2)
    assert two == {"n": 2, "mean": 2.0, "std": pytest.approx(math.sqrt(2)), "ci_low": pytest.approx(2.0 - half), "ci_high": pytest.approx(2.0 + half)}


def test_overall_counts_every_task_a_variant_is_significantly_worse_on(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], tasks=("cora", "citeseer"))
    worse = shifted([-0.05, -0.051, -0.049, -0.052, -0.048])
    found = {**records_for(the_plan, {"softmax": BASE, "gmm": worse}, task="cora"),
             **records_for(the_plan, {"softmax": BASE, "gmm": worse}, task="citeseer")}
    overall = build_board(suite, the_plan, found)["groups"][0]["overall"]
    assert [(o["variant"], o["better"], o["worse"]) for o in overall] == [("softmax", 0, 0), ("gmm", 0, 2)]


def test_two_seeds_give_a_resolution_but_no_ranks_and_unranked_rows_list_those_with_runs_first(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax"], seeds=2)
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.01, 0.03]), "fenchel": [0.8, None]}))
    cora = table(board)
    assert cora["resolution"]["pairs"] == 2 and cora["resolution"]["variants"] == 1  # gmm's two pairs; fenchel has one
    assert cora["resolution"]["spread"] == pytest.approx(statistics.stdev([0.01, 0.03]))
    # no rank below 3 seeds; rows with runs first (by name), then the one that has none
    assert [(r["variant"], r["rank"], r["n"]) for r in cora["rows"]] == [("fenchel", None, 1), ("gmm", None, 2), ("softmax", None, 2),
                                                                         ("sparsemax", None, 0)]


def test_one_unstable_variant_does_not_set_the_tables_resolution_but_is_named_with_its_own(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax", "bam-weibull"])
    diffs = {"gmm": [0.004, -0.003, 0.002, -0.004, 0.002], "fenchel": [0.003, -0.004, 0.001, -0.002, 0.004],
             "sparsemax": [-0.002, 0.005, -0.003, 0.001, -0.003], "bam-weibull": [-0.06, 0.01, -0.09, 0.02, -0.04]}
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, **{v: shifted(d) for v, d in diffs.items()}}))
    resolution = table(board)["resolution"]
    spreads = {v: statistics.stdev(d) for v, d in diffs.items()}
    assert resolution["spread"] == pytest.approx(statistics.median(spreads.values()))
    assert resolution["variants"] == 4 and resolution["pairs"] == 5
    assert [w["label"] for w in resolution["wider"]] == ["bam-weibull"]
    assert resolution["wider"][0]["difference"] > 5 * resolution["difference"]
    sentence = render_markdown(board)
    assert "`bam-weibull` varies more (spread " in sentence and "median paired spread" in sentence


def test_gpu_hours_count_the_gpus_each_run_held_and_at_least_one(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax"], seeds=2)
    two_gpus = {**GPU, "device_count": 2}
    unknown_count = {k: v for k, v in GPU.items() if k != "device_count"}
    found = {}
    for spec, hardware in zip(the_plan.specs, (two_gpus, unknown_count)):
        found[spec.key] = record(spec, {"test/acc": 0.8}, hardware={**hardware, "label": "GPU"}, wall_time_s=3600.0)
    cost = row(table(build_board(suite, the_plan, found)), "softmax")["cost"]
    assert cost["gpu_hours"] == pytest.approx(3.0)  # 2 GPUs x 1 h + (count unknown: 1) x 1 h
    assert (cost["epochs"], cost["time_per_epoch_s"], cost["peak_memory_mb"], cost["parameters"]) == (100, 0.05, 900.0, 1234)


def test_each_group_names_its_software_versions_and_which_metrics_are_percentages(tmp_path):
    from harness.report.board import is_fraction_metric

    suite, the_plan = suite_and_plan(tmp_path, ["softmax"], seeds=2)
    group = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE}))["groups"][0]
    assert group["versions"] == {"python": ["3.11.7"], "torch": ["2.14.1"], "lightning": ["2.6.6"]}
    assert {k: group[k] for k in ("accelerator", "device", "device_count", "cpu", "threads")} == {k: CPU[k] for k in (
        "accelerator", "device", "device_count", "cpu", "threads")}
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE}, commit=None))
    assert board["description"] == "made up records" and board["groups"][0]["commits"] == ["unknown"]
    assert [is_fraction_metric(m) for m in ("test/acc", "val/accuracy", "test/f1", "test/macro_f1", "test/nll", "test/mcc")] == [
        True, True, True, True, False, False]


def test_problem_lines_name_each_unreadable_file_and_each_conflict_with_its_copies():
    from harness.report.sentences import problem_lines

    board = {"unreadable": {"k1": "records/k1.json: Expecting value: line 1 column 1 (char 0)"},
             "conflicts": {"k2": ["records/conflicts/k2.aaa.json", "records/conflicts/k2.bbb.json"]}}
    assert problem_lines(board) == [
        "Unreadable record (not counted as missing; repair the file or delete it and re-run): records/k1.json: Expecting value: line 1 column 1 (char 0)",
        "Conflict: run k2 has a different record in records/conflicts/k2.aaa.json, records/conflicts/k2.bbb.json; the board shows the store's "
        "own record until the wrong copy is deleted",
    ]
    assert problem_lines({}) == []


def test_mean_curves_average_each_epoch_over_the_seeds_that_reached_it_and_skip_missing_points():
    from harness.report.board import _mean_curves

    histories = [{"epoch": [0, 1, 2], "train/loss": [1.0, 0.5, 0.25], "val/acc": [0.5, None, 0.7]},
                 {"epoch": [0, 1], "train/loss": [3.0, 1.5], "val/acc": [0.7, 0.8]},  # stopped early
                 {"epoch": [1, 2], "train/loss": [2.0]},  # a curve shorter than its epoch axis, no val/acc
                 {"train/loss": [9.0]}]  # no epoch axis: nothing to place
    assert _mean_curves(histories) == {"epoch": [0, 1, 2], "train/loss": [2.0, pytest.approx(4 / 3), 0.25],
                                       "val/acc": [pytest.approx(0.6), 0.8, 0.7]}
    assert _mean_curves([]) is None


def test_one_seed_correlations_are_tested_against_zero_and_a_value_outside_minus_one_to_one_is_not():
    from harness.report.board import _chance

    trivial = {"metrics": {"test/mcc": 0.0256}, "test_sizes": {"test/mcc": 100}}
    assert _chance([0.3], trivial, "test/mcc", True) == {"p": pytest.approx(stats.norm.sf(3.0), rel=1e-12), "test": "correlation", "at_chance": False}
    assert _chance([1.5], trivial, "test/mcc", True) is None
    assert _chance([0.3], None, "test/mcc", True) is None


def test_a_comparison_with_the_baseline_holds_exactly_its_documented_fields(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"])
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.01, 0.03, 0.02, 0.0, 0.01])}))
    compared = row(table(board), "gmm")["metrics"]["test/acc"]["vs_baseline"]
    assert set(compared) == {"diff", "spread", "n_pairs", "p", "p_holm", "mark"} and compared["p_holm"] == pytest.approx(compared["p"])


def test_a_labelled_row_says_what_it_runs(tmp_path, shared_data):
    from harness.report.html_page import render_html

    path = tmp_path / "labelled.yaml"
    path.write_text("name: labelled\ntasks: [cora]\nvariants: [softmax, {name: entmax, label: entmax-a1.2, attention.alpha: 1.2}, entmax]\nseeds: 1\n")
    suite = load_suite(str(path))
    board = build_board(suite, plan(suite), {})
    assert board["row_settings"] == {"entmax-a1.2": {"variant": "entmax", "options": {"attention.alpha": 1.2}}}
    assert "> `entmax-a1.2`: `entmax` with `attention.alpha` = `1.2` (every other option at its default)." in render_markdown(board)
    assert "<code>entmax-a1.2</code>: <code>entmax</code> with <code>attention.alpha</code> = <code>1.2</code>" in render_html(board)
    plain, _ = suite_and_plan(tmp_path, ["softmax", "entmax"])
    assert "row_settings" not in build_board(plain, plan(plain), {})  # boards without such rows read as before


def test_rows_within_the_tables_resolution_share_a_rank_and_a_tier_never_splits(tmp_path):
    """Before, ranks followed the means (align-gan #1 on paper-gat's Cora at +0.01, Holm p 1.000): noise won."""
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "entmax15", "sparsemax", "entmax"])
    accuracies = {
        "softmax": BASE,
        "gmm": shifted([0.002, -0.001, 0.003, -0.002, 0.001]),  # noise around softmax, ahead by a hair
        "fenchel": shifted([-0.001, 0.002, -0.002, 0.001, -0.003]),  # noise, behind by a hair
        "entmax15": shifted([0.030, 0.031, 0.029, 0.032, 0.030]),  # clearly better
        "sparsemax": shifted([-0.030, -0.031, -0.029, -0.032, -0.030]),  # clearly worse
        "entmax": shifted([-0.060, -0.061, -0.059, -0.062, -0.060]),  # worse still, but only tested against softmax
    }
    cora = table(build_board(suite, the_plan, records_for(the_plan, accuracies)))
    assert [(r["variant"], r["rank"]) for r in cora["rows"]] == [
        ("entmax15", 1), ("gmm", 2), ("softmax", 2), ("fenchel", 2), ("sparsemax", 5), ("entmax", 5)]
    resolution = cora["resolution"]["difference"]
    for name in ("gmm", "fenchel"):
        assert abs(row(cora, name)["metrics"]["test/acc"]["vs_baseline"]["diff"]) < resolution
    # the rule the ranks follow is on the page
    text = render_markdown(build_board(suite, the_plan, records_for(the_plan, accuracies)))
    assert "a rank never orders rows the table cannot tell apart" in text


def test_each_table_and_the_overall_table_open_with_what_is_significant(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm", "fenchel", "sparsemax", "entmax"], tasks=("cora", "citeseer"))
    noise = [0.004, -0.003, 0.002, -0.004, 0.002]
    found = {
        **records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.020, 0.022, 0.018, 0.021, 0.019]), "fenchel": shifted(noise),
                                 "sparsemax": shifted([-0.020, -0.017, -0.023, -0.019, -0.021]),
                                 "entmax": shifted([-0.030, -0.027, -0.033, -0.029, -0.031])}, task="cora"),
        **records_for(the_plan, {"softmax": BASE, "gmm": shifted(noise), "fenchel": shifted(noise), "sparsemax": shifted(noise),
                                 "entmax": shifted([-0.020, -0.017, -0.023, -0.019, -0.021])}, task="citeseer"),
    }
    board = build_board(suite, the_plan, found)
    cora, citeseer = board["groups"][0]["tasks"]
    points = f"{cora['resolution']['difference'] * 100:.2f}"
    assert finding_sentence(cora) == (f"`gmm` is significantly better than `softmax` in `test/acc` (Holm p < 0.05; resolution {points} points); "
                                      "`sparsemax` and `entmax` are significantly worse.")
    assert finding_sentence(citeseer).startswith("No variant is significantly better than `softmax` in `test/acc` (Holm p < 0.05; resolution ")
    assert finding_sentence(citeseer).endswith("; `entmax` is significantly worse.")
    overall = overall_finding_sentence(board["groups"][0]["finding"])
    assert overall == ("Over the 2 tasks' primary metrics, significantly better than `softmax`: `gmm` on `cora`; "
                       "significantly worse: `entmax` on `cora` and `citeseer`, `sparsemax` on `cora`.")
    # the sentence is the first thing under each heading, in Markdown and HTML: the board's under its title, each table's under its own
    text = render_markdown(board)
    for heading, sentence in (("# Leaderboard: `synthetic`", overall), ("### cora", finding_sentence(cora)),
                              ("### citeseer", finding_sentence(citeseer))):
        assert text.split(heading + "\n\n", 1)[1].split("\n", 1)[0] == sentence
    page = render_html(board)
    assert ('<h1>Leaderboard: <code>synthetic</code></h1>\n<p class="finding">Over the 2 tasks\' primary metrics, significantly better '
            'than <code>softmax</code>: <code>gmm</code> on <code>cora</code>;') in page
    assert '<h3 id="g1-cora">cora</h3>\n<p class="finding"><code>gmm</code> is significantly better' in page
    # and the legend comes after every table (on the page behind a fold, linked from the top)
    assert text.index("## Reading this board") > text.rindex("| `")
    assert page.index('<details class="legend" id="legend">') > page.rindex("</table>") and 'href="#legend"' in page


def test_a_table_without_enough_paired_seeds_says_nothing_is_significant(tmp_path):
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=2)
    cora = table(build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.05] * 5)})))
    assert finding_sentence(cora) == ("Nothing in this table is significant: no variant has 3 seeds paired with `softmax`, "
                                      "the fewest the board tests.")
    suite, the_plan = suite_and_plan(tmp_path, ["gmm", "fenchel"])
    cora = table(build_board(suite, the_plan, records_for(the_plan, {"gmm": BASE, "fenchel": BASE})))
    assert finding_sentence(cora).startswith("Nothing in this table is significant: it has no finished `softmax` runs")
    assert [r["rank"] for r in cora["rows"]] == [1, 1]


def test_two_seed_intervals_are_clipped_to_the_metrics_range_and_the_table_says_so(tmp_path):
    """Two seeds of an accuracy printed `34.4 ± 18.5 [-131.5, 200.2]`."""
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=2)
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": [0.213, 0.475, 0, 0, 0], "gmm": [0.30, 0.31, 0, 0, 0]}))
    cell = row(table(board), "softmax")["metrics"]["test/acc"]
    assert (cell["ci_low"], cell["ci_high"], cell["ci_clipped"]) == (0.0, 1.0, True)
    gmm = row(table(board), "gmm")["metrics"]["test/acc"]
    assert gmm["ci_clipped"] is False and 0.0 < gmm["ci_low"] < gmm["ci_high"] < 1.0
    text = render_markdown(board)
    assert "34.4 ± 18.5 [0.0, 100.0]†" in text
    assert "†: this 95% Student-t interval reaches past the values the metric can take and is clipped (`test/acc` to [0, 100])" in text
    assert "-131.5" not in text and "200.2" not in text


@pytest.mark.parametrize("name, bounds", [("test/acc", (0.0, 1.0)), ("test/macro_f1", (0.0, 1.0)), ("test/mcc", (-1.0, 1.0)),
                                          ("test/mm_pearson", (-1.0, 1.0)), ("test/nll", (0.0, None)), ("val/loss", (0.0, None)),
                                          ("test/cider", (0.0, None)), ("test/ece", (0.0, 1.0)), ("test/something", (None, None))])
def test_each_metric_has_the_range_its_intervals_are_clipped_to(name, bounds):
    assert metric_range(name) == bounds
    assert clip_interval(-5.0, 5.0, bounds) == (bounds[0] if bounds[0] is not None else -5.0, bounds[1] if bounds[1] is not None else 5.0,
                                                bounds != (None, None))


def test_times_read_in_one_style_seconds_to_three_digits_then_minutes_then_hours():
    """A cost column once read "9407.5 ms" beside "13.7 s": every time a board or progress line prints is seconds to
    3 significant digits below 10 minutes."""
    from harness.timing import format_duration

    cases = {0.2564: "0.256 s", 9.4075: "9.41 s", 9.996: "10.0 s", 13.7: "13.7 s", 15.0: "15.0 s", 369.3: "369 s",
             5400: "90.0 min", 9000: "2.50 h", None: "—", 0.0: "—"}
    assert {seconds: format_duration(seconds) for seconds in cases} == cases


def test_each_table_says_per_variant_and_layer_how_far_its_evaluated_attention_is_from_uniform(tmp_path):
    """H / H_uniform per layer from the test pass (mean over seeds); records without the uniform reference (written
    before it) show "not recorded" for it, never an estimate."""
    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=3)
    found = {}
    for spec in the_plan.specs:
        if spec.seed > 2:
            continue
        diagnostics = {"test/attn/l0/entropy": 1.90 + 0.01 * spec.seed, "test/attn/l1/entropy": 1.50 - 0.01 * spec.seed}
        if spec.variant == "softmax":  # a new record: with the reference
            diagnostics.update({"test/attn/l0/uniform_entropy": 1.92, "test/attn/l1/uniform_entropy": 1.92, "test/attn/entropy": 1.7})
        found[spec.key] = record(spec, {"test/acc": BASE[spec.seed]}, diagnostics=diagnostics)
    cora = table(build_board(suite, the_plan, found))
    entropy = cora["attention_entropy"]
    assert entropy["layers"] == ["l0", "l1"] and entropy["uniform_recorded"]
    assert entropy["rows"]["softmax"]["l0"] == {"entropy": pytest.approx(1.91), "uniform": pytest.approx(1.92)}
    assert entropy["rows"]["gmm"]["l1"] == {"entropy": pytest.approx(1.49), "uniform": None}
    md = render_markdown(build_board(suite, the_plan, found))
    assert "| variant | l0: H / H_uniform | l1: H / H_uniform |" in md
    assert "| `softmax` | 1.910 / 1.920 | 1.490 / 1.920 |" in md and "| `gmm` | 1.910 / not recorded | 1.490 / not recorded |" in md
    assert "1.910 / 1.920" in render_html(build_board(suite, the_plan, found))
    # a table whose records carry no entropy has no such table
    plain = {key: {**rec, "diagnostics": {}} for key, rec in found.items()}
    assert "attention_entropy" not in table(build_board(suite, the_plan, plain))


def test_the_few_seeds_warning_suggests_seeds_that_have_no_record_yet(tmp_path, capsys):
    """Seeds 0 and 1 ran: the warning suggests seed 2 (it suggested --seed 1, which had run)."""
    from harness.report.leaderboard import warn_unranked

    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"], seeds=2)
    warn_unranked(build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.01] * 5)})))
    err = capsys.readouterr().err
    assert "at most 2 finished seed(s) per row" in err and "e.g. --seed 2, or --seeds 2)" in err and "--seed 1" not in err


def test_above_trivial_is_holm_corrected_over_the_tables_rows():
    """glue-mrpc marked 2 of its 11 rows above trivial at p ~ 0.03, uncorrected: one family per table, as the Δ tests."""
    from harness.report.board import _correct_chance

    ps = {"a": 0.03, "b": 0.031, **{f"r{i}": 0.0001 for i in range(9)}}
    rows = {label: {"chance": {"p": p, "test": "t", "at_chance": p >= 0.05}} for label, p in ps.items()}
    _correct_chance(rows)
    assert rows["a"]["chance"]["at_chance"] and rows["b"]["chance"]["at_chance"]
    assert rows["a"]["chance"]["p_holm"] == pytest.approx(2 * 0.03) and rows["a"]["chance"]["p"] == 0.03
    assert not any(rows[f"r{i}"]["chance"]["at_chance"] for i in range(9))
