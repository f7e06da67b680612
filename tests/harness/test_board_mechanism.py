"""Boards show each variant's mechanism diagnostics beside its metrics (issue 35), from the records alone."""

from __future__ import annotations

from harness.report.board import build_board
from harness.report.sentences import mechanism_sentence
from harness.results.record import Record
from tests.fixtures.make_fixtures import claim_records


def test_a_table_lists_the_final_diagnostics_of_each_row_that_records_them(shared_data):
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    the_plan = plan(load_suite("paper-gat"), str(shared_data))
    records = {r["key"]: Record.from_dict(r) for r in claim_records(the_plan)}
    board = build_board(the_plan.suite, the_plan, records)
    cora = next(t for g in board["groups"] for t in g["tasks"] if t["task"] == "cora")
    assert cora["mechanism"]["align-gan"] == {"disc_acc": {"mean": 0.7, "seeds": 20, "of": 20}, "qk_distance": {"mean": 0.5, "seeds": 20, "of": 20}}
    assert cora["mechanism"]["softmax"] == {"qk_distance": {"mean": 1.0, "seeds": 20, "of": 20}}  # the baseline the align-* distances are read against
    assert "sparsemax" not in cora["mechanism"]  # its records carry none: no entry rather than a made-up zero
    sentence = mechanism_sentence(cora)
    assert "`align-gan` disc_acc 0.7 (20 of 20 seeds), qk_distance 0.5 (20 of 20 seeds)" in sentence and "`softmax` qk_distance 1 (20 of 20 seeds)" in sentence
    for record in records.values():  # training and validation values only: not at the evaluated weights, never shown
        object.__setattr__(record, "diagnostics", {"diag/qk_distance": 0.3, "val/diag/qk_distance": 0.3})
    board = build_board(the_plan.suite, the_plan, records)
    assert all(mechanism_sentence(t) is None for g in board["groups"] for t in g["tasks"])
    for record in records.values():
        object.__setattr__(record, "diagnostics", None)
    board = build_board(the_plan.suite, the_plan, records)
    assert all(mechanism_sentence(t) is None for g in board["groups"] for t in g["tasks"])  # records from before them


def test_a_key_re_run_for_its_diagnostics_shows_them_beside_the_first_executions_numbers(shared_data):
    """Issue 35's re-runs keep their keys: the board shows the earliest execution's numbers and the diagnostics of
    the execution that recorded them."""
    import dataclasses

    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    the_plan = plan(load_suite("paper-gat"), str(shared_data))
    diagnosed = {r["key"]: Record.from_dict(r) for r in claim_records(the_plan)}
    first = {key: dataclasses.replace(r, diagnostics=None, history=None, finished="2000-01-01T00:00:00+00:00") for key, r in diagnosed.items()}
    board = build_board(the_plan.suite, the_plan, first, executions={k: [first[k], diagnosed[k]] for k in first})
    cora = next(t for g in board["groups"] for t in g["tasks"] if t["task"] == "cora")
    assert cora["mechanism"]["align-gan"] == {"disc_acc": {"mean": 0.7, "seeds": 20, "of": 20}, "qk_distance": {"mean": 0.5, "seeds": 20, "of": 20}}
    plain = build_board(the_plan.suite, the_plan, first)
    plain_cora = next(t for g in plain["groups"] for t in g["tasks"] if t["task"] == "cora")
    assert [(r["variant"], r["metrics"]) for r in plain_cora["rows"]] == [(r["variant"], r["metrics"]) for r in cora["rows"]]


def test_cost_columns_name_the_attention_paths_the_time_was_measured_on(shared_data):
    """Issue 37: a record lists the fused paths its kernels took; the row's time says which it measured."""
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.report.markdown import render_markdown

    the_plan = plan(load_suite("paper-gat"), str(shared_data))
    records = {r["key"]: Record.from_dict(r) for r in claim_records(the_plan)}
    specs = {s.key: s for s in the_plan.specs}
    for key, record in records.items():
        if specs[key].variant == "fenchel":
            object.__setattr__(record, "execution", {**(record.execution or {}), "attention_paths": ["eager", "sdpa"]})
    board = build_board(the_plan.suite, the_plan, records)
    cora = next(t for g in board["groups"] for t in g["tasks"] if t["task"] == "cora")
    rows = {row["variant"]: row for row in cora["rows"]}
    assert rows["fenchel"]["cost"]["attention_paths"] == ["eager", "sdpa"]
    assert rows["softmax"]["cost"]["attention_paths"] == []  # no list: all eager (graph runs) or a record from before the list
    text = render_markdown(board)
    assert any("`fenchel`" in line and "(eager+sdpa)" in line for line in text.splitlines())
    assert not any("(eager" in line for line in text.splitlines() if "`softmax`" in line)


def test_the_alignment_study_reads_the_diagnosed_executions_against_softmax_at_the_same_seed(shared_data, tmp_path):
    """harness/studies/alignment_mechanism.py, the README's align-gan figure: ratios are per seed against softmax's."""
    import dataclasses

    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.results.store import RecordStore
    from harness.studies.alignment_mechanism import summary, table

    the_plan = plan(load_suite("paper-gat"), str(shared_data))
    store = RecordStore(tmp_path)
    for raw in claim_records(the_plan):
        record = Record.from_dict(raw)
        store.write(dataclasses.replace(record, diagnostics=None, history=None, finished="2000-01-01T00:00:00+00:00"))
        store.import_record(record)  # the re-execution that recorded the diagnostics
    rows = {(r["task"], r["row"]): r for r in summary(the_plan, store)}
    gan = rows[("cora", "align-gan")]
    assert gan["seeds"] == 20 and set(gan["qk_ratio"]) == {0.5} and set(gan["disc"]) == {0.7} and gan["active"] == 20
    assert rows[("cora", "softmax")]["qk_ratio"] == [] and set(rows[("cora", "softmax")]["uniform"]) == {1.40 / 1.41}
    assert "| cora | align-gan | 20 (0) | 0.700 [0.700, 0.700] | 0.500 [0.500, 0.500] | 0.500 [0.500, 0.500] | 20 of 20 | — | 0.000 |" in table(list(rows.values()))
