"""What a suite declares beyond its runs (issue 35): its seed counts with their history, and the variants it also runs
at their committed tuned parameters."""

from __future__ import annotations

import pytest
import yaml

from harness.plan.planner import plan
from harness.plan.suite import SuiteError, load_suite


def suite_file(tmp_path, **extra):
    data = {"name": "mine", "tasks": ["cora", {"name": "citeseer", "seeds": 5}], "variants": ["softmax", "bam-weibull"],
            "seeds": 3, "params": {"max_epochs": 2}, **extra}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_seed_history_is_part_of_the_suite_and_must_end_at_the_counts_it_runs(tmp_path):
    history = [{"seeds": 3, "declared": "2026-11-01", "why": "first"},
               {"task": "citeseer", "seeds": 5, "declared": "2026-11-02", "why": "its spread"}]
    suite = load_suite(suite_file(tmp_path, seed_history=history))
    assert [dict(e) for e in suite.seed_history] == history
    with pytest.raises(SuiteError, match="last count declared for citeseer is 4, but it runs 5 seeds"):
        load_suite(suite_file(tmp_path, seed_history=[history[0], {**history[1], "seeds": 4}]))
    with pytest.raises(SuiteError, match="task 'citesear' is not one of the suite's tasks. Did you mean 'citeseer'"):
        load_suite(suite_file(tmp_path, seed_history=[history[0], {**history[1], "task": "citesear"}]))
    with pytest.raises(SuiteError, match="must be a mapping with seeds, declared"):
        load_suite(suite_file(tmp_path, seed_history=[{"seeds": 3}]))


def test_the_committed_paper_gat_declares_citeseers_growth_with_its_reason():
    suite = load_suite("paper-gat")
    first, grown = suite.seed_history
    assert first["seeds"] == 20 and "task" not in first
    assert grown["task"] == "citeseer" and grown["seeds"] == 36 and "resolution" in grown["why"] and "not from the effects" in grown["why"]


def test_a_suites_tuned_variants_get_rows_from_the_committed_parameters(tmp_path, monkeypatch):
    from harness.plan import planner

    params = tmp_path / "params" / "cora"
    params.mkdir(parents=True)
    (params / "bam-weibull.yaml").write_text(yaml.safe_dump({
        "task": "cora", "variant": "bam-weibull", "attention": {"name": "bam-weibull", "kl_weight": 0.1}, "params": {},
        "budget": {"trials": 20, "max_epochs": 2}, "tuning": {"trials": {"complete": 20}}}))
    monkeypatch.setattr(planner, "COMMITTED_PARAMS", tmp_path / "params")
    rows = {s.display for s in plan(load_suite(suite_file(tmp_path, tuned=["bam-weibull"]))).specs}
    assert rows == {"softmax", "bam-weibull", "bam-weibull (tuned)"}
    assert {s.display for s in plan(load_suite(suite_file(tmp_path))).specs} == {"softmax", "bam-weibull"}
    with pytest.raises(SuiteError, match="'bam-weibul' is not one of the suite's variants. Did you mean 'bam-weibull'"):
        load_suite(suite_file(tmp_path, tuned=["bam-weibul"]))


def test_a_tuned_row_shows_the_values_tuning_chose(tmp_path, monkeypatch):
    """Issue 39: the (tuned) row said it was tuned, not what it ran (temperature 0.852)."""
    from harness.plan import planner
    from harness.report.board import build_board
    from harness.report.markdown import render_markdown

    params = tmp_path / "params" / "cora"
    params.mkdir(parents=True)
    (params / "bam-weibull.yaml").write_text(yaml.safe_dump({
        "task": "cora", "variant": "bam-weibull", "attention": {"name": "bam-weibull", "kl_weight": 0.1317, "prior": "fixed"},
        "params": {}, "budget": {"trials": 20, "max_epochs": 2}, "tuning": {"trials": {"complete": 20}, "seconds": 60.0}}))
    monkeypatch.setattr(planner, "COMMITTED_PARAMS", tmp_path / "params")
    the_plan = plan(load_suite(suite_file(tmp_path, tuned=["bam-weibull"])))
    board = build_board(the_plan.suite, the_plan, {})
    cora = next(t for g in board["groups"] for t in g["tasks"] if t["task"] == "cora")
    assert cora["tuning"]["bam-weibull (tuned)"]["values"] == {"attention.kl_weight": 0.1317, "attention.prior": "fixed"}
    assert "- `bam-weibull (tuned)`: attention.kl_weight=0.1317, attention.prior=fixed; 20 trials" in render_markdown(board)
