"""Boards show each variant's mechanism diagnostics beside its metrics (issue 35), from the records alone."""

from __future__ import annotations

from harness.report.board import build_board, mechanism_sentence
from harness.results.record import Record
from tests.fixtures.make_fixtures import claim_records


def test_a_table_lists_the_final_diagnostics_of_each_row_that_records_them(shared_data):
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    the_plan = plan(load_suite("paper-gat"), str(shared_data))
    records = {r["key"]: Record.from_dict(r) for r in claim_records(the_plan)}
    board = build_board(the_plan.suite, the_plan, records)
    cora = next(t for g in board["groups"] for t in g["tasks"] if t["task"] == "cora")
    assert cora["mechanism"]["align-gan"] == {"disc_acc": 0.7, "qk_distance": 0.5}
    assert cora["mechanism"]["softmax"] == {"qk_distance": 1.0}  # the baseline the align-* distances are read against
    assert "sparsemax" not in cora["mechanism"]  # its records carry none: no entry rather than a made-up zero
    sentence = mechanism_sentence(cora)
    assert "`align-gan` disc_acc 0.7, qk_distance 0.5" in sentence and "`softmax` qk_distance 1" in sentence
    for record in records.values():
        object.__setattr__(record, "diagnostics", None)
    board = build_board(the_plan.suite, the_plan, records)
    assert all(mechanism_sentence(t) is None for g in board["groups"] for t in g["tasks"])  # records from before them
