"""The λ dose-response page (harness/report/dose_response.py) on synthetic align-lambda records: the declared finding,
partial seeds said so, the post hoc column, and each level's figures."""

import math

import pytest

from harness.report.claims_schema import load_claims
from harness.report.dose_response import MECHANISM_ONLY, NOT_YET, build_dose_board, finding_sentence, render_dose_markdown
from harness.results.record import Record


@pytest.fixture(scope="module")
def the_plan(shared_data):
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    return plan(load_suite("align-lambda"), str(shared_data))


def _record(spec, acc: float, qk: float, finished: str) -> Record:
    return Record(key=spec.key, status="ok", spec=spec.to_dict(), metrics={"test/acc": {"value": acc, "higher_is_better": True}},
                  diagnostics={"test/diag/qk_distance": qk}, finished=finished)


def test_the_finding_follows_the_declared_rules_and_says_when_seeds_are_missing(the_plan):
    claims = load_claims()
    spec = claims.dose_response
    records = {}
    for s in the_plan.specs:
        if s.task != "cora":
            continue
        wobble = 0.001 * math.sin(s.seed + 1)
        if s.display == "softmax":
            records[s.key] = _record(s, 0.80, 1.0, "2026-11-24T00:00:00+00:00")
        elif s.display in ("align-ct-paper-lambda", "align-gan"):  # paper-gat's earlier runs: no move, no gain
            records[s.key] = _record(s, 0.80 + wobble, 1.0 + 0.01 * math.cos(s.seed), "2026-11-24T00:00:00+00:00")
        elif s.display.endswith("x10"):  # closer clouds, same accuracy
            records[s.key] = _record(s, 0.80 + wobble, 0.7 + 0.01 * math.cos(s.seed), "2026-11-29T00:00:00+00:00")
        elif s.display.endswith("x100") and s.seed < 5:  # still running: 5 of 20 seeds
            records[s.key] = _record(s, 0.80 + wobble, 0.7, "2026-11-29T00:00:00+00:00")
    board = build_dose_board(spec, the_plan, records, {}, claims.mechanism_test)
    cells = {(c.variant, c.task): c for c in board.cells}
    ct = cells[("align-ct", "cora")]
    assert ct.rule == MECHANISM_ONLY and ct.interim
    paper, x10, x100 = ct.levels
    assert (paper.recorded, x10.recorded, x100.recorded) == (20, 20, 5)
    assert not paper.declared_before and x10.declared_before  # the test was declared between the two
    assert x10.mechanism.moved and not paper.mechanism.moved
    assert x10.ratio.mean == pytest.approx(0.7, rel=0.02)
    assert abs(x10.delta.mean) < 0.2 and x10.delta.low < 0 < x10.delta.high
    assert cells[("align-ct", "citeseer")].rule == NOT_YET
    text = render_dose_markdown(board)
    assert "| 1 | `align-ct-lambda-x100` | 5 of 20 |" in text and "no (post hoc)" in text
    assert "`align-ct` on cora: interim, on the seeds recorded so far: not reproduced, mechanism active" in finding_sentence(board)
