"""The claims board (harness/report/claims.py): every verdict branch on synthetic paper-gat records, the
baseline note, a malformed claims file's error, the committed claims file, and the under-training warning.
The rendered board is pinned byte for byte by tests/test_fixture_boards.py (expected/claims/)."""

import math
from pathlib import Path

import pytest
import yaml

from harness.report.board import epoch_cap_hits, epoch_cap_sentence
from harness.report.claims import (CLAIMS_FILE, CONTRADICTED, INCONCLUSIVE, NOT_RUN_HERE, NOT_RUN_YET, REPRODUCED, ClaimsError,
                                   load_claims, measure_claims, render_claims_markdown, verdict_for)
from harness.results.record import Record
from tests.fixtures.make_fixtures import claim_records

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plans(shared_data):
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    return {suite: plan(load_suite(suite), str(shared_data)) for suite in ("paper-gat", "glue-minilm", "vl-paper")}


@pytest.fixture(scope="module")
def paper_gat(plans):
    return plans["paper-gat"]


@pytest.fixture(scope="module")
def claims():
    return load_claims()


def _board(claims, plans, records):
    return measure_claims(claims, plans, {suite: records for suite in plans})


def _by_id(board):
    return {row["claim"]["id"]: row for row in board["rows"]}


@pytest.fixture(scope="module")
def measured(claims, plans, paper_gat):
    records = {r["key"]: Record.from_dict(r) for r in claim_records(paper_gat)}
    return _by_id(_board(claims, plans, records)), records


def test_every_verdict_branch_on_synthetic_records(measured):
    rows, _ = measured
    assert rows["aa-gat-cora-gan"]["verdict"] == REPRODUCED                  # CI excludes 0, the paper's sign
    assert rows["aa-gat-cora-ct"]["verdict"] == INCONCLUSIVE                 # CI holds 0 and +0.80
    assert rows["aa-gat-citeseer-gan"]["verdict"] == CONTRADICTED            # significant, opposite sign
    assert rows["aa-gat-citeseer-gan"]["detail"] == "significant effect of the opposite sign"
    assert rows["aa-gat-citeseer-ct"]["verdict"] == CONTRADICTED             # holds 0, excludes +0.99
    assert rows["aa-gat-citeseer-ct"]["detail"] == "the CI excludes the paper's Δ"
    assert rows["aa-gat-pubmed-gan"]["verdict"] == NOT_RUN_HERE              # the suite's optional task was skipped
    assert "pubmed" in rows["aa-gat-pubmed-gan"]["reason"]
    assert rows["aa-glue-rte-gan"]["verdict"] == NOT_RUN_HERE
    assert "glue-paper" in rows["aa-glue-rte-gan"]["reason"] and "GPU" in rows["aa-glue-rte-gan"]["reason"]
    assert rows["bam-translation"]["verdict"] == NOT_RUN_HERE
    assert rows["bam-cora-weibull"]["verdict"] == REPRODUCED                 # direction claims: the sign only
    assert rows["bam-citeseer-weibull"]["verdict"] == CONTRADICTED
    assert rows["bam-citeseer-weibull"]["interim"] == "20 of 36 seeds"   # the suite's 20 common seeds, not CiteSeer's own 16
    assert rows["bam-citeseer-weibull"]["measure"]["n"] == 20
    assert rows["bam-citeseer-lognormal"]["verdict"] == NOT_RUN_YET
    assert rows["bam-citeseer-lognormal"]["reason"] == "34 of 36 seeds"  # two of the common seeds left out
    assert "interim" not in rows["aa-gat-citeseer-ct"]
    assert rows["gat-cora"]["verdict"] == REPRODUCED and rows["gat-citeseer"]["verdict"] == CONTRADICTED
    assert rows["fenchel-dual"]["verdict"] == "structural"


def test_our_delta_is_the_paired_mean_difference_with_a_paired_t_interval(measured, paper_gat):
    from scipy import stats

    rows, records = measured
    by = {(s.task, s.variant, s.seed): records[s.key] for s in paper_gat.specs if s.key in records}
    diffs = [100 * (by["cora", "align-gan", seed].metrics["test/acc"]["value"] - by["cora", "softmax", seed].metrics["test/acc"]["value"])
             for seed in paper_gat.suite.seeds]
    low, high = stats.t.interval(0.95, len(diffs) - 1, loc=sum(diffs) / len(diffs), scale=stats.sem(diffs))
    measure = rows["aa-gat-cora-gan"]["measure"]
    assert measure["n"] == len(diffs) == 20
    assert math.isclose(measure["mean"], sum(diffs) / len(diffs), rel_tol=1e-12)
    assert math.isclose(measure["ci_low"], low, rel_tol=1e-9) and math.isclose(measure["ci_high"], high, rel_tol=1e-9)
    assert 0 < rows["aa-gat-cora-gan"]["resolution"] < 0.5


def test_a_baseline_outside_our_softmax_interval_is_named(measured):
    rows, _ = measured
    assert "differs from the paper's baseline 72.50" in rows["aa-gat-citeseer-gan"]["baseline_note"]
    assert "baseline_note" not in rows["aa-gat-cora-gan"]  # Cora's softmax holds 83.00


def test_with_no_records_paper_gat_claims_are_not_run_yet_with_counts(claims, plans, paper_gat):
    rows = _by_id(_board(claims, plans, {}))
    seeds = len(paper_gat.suite.seeds)
    for claim_id in ("gat-cora", "aa-gat-cora-gan", "bam-cora-weibull"):
        assert (rows[claim_id]["verdict"], rows[claim_id]["reason"]) == (NOT_RUN_YET, f"0 of {seeds} seeds")
    assert rows["aa-gat-citeseer-ct"]["reason"] == "0 of 36 seeds"  # CiteSeer's own seeds
    text = render_claims_markdown(_board(claims, plans, {}))
    assert f"not run yet: 0 of {seeds} seeds" in text and "reproduced 0, contradicted 0, inconclusive 0" in text


def test_the_html_page_shows_the_same_cells(claims, plans, paper_gat):
    from harness.report.html_page import render_claims_html

    records = {r["key"]: Record.from_dict(r) for r in claim_records(paper_gat)}
    board = _board(claims, plans, records)
    page = render_claims_html(board)
    assert page.count("<tr><td") == sum(1 for row in board["rows"] if row["claim"]["kind"] != "structural")
    assert "<span class=\"verdict-reproduced\">reproduced</span>" in page
    assert "<span class=\"verdict-contradicted\">contradicted: significant effect of the opposite sign</span>" in page
    assert "<code>paper-gat</code> / <code>cora</code> / <code>align-gan</code>" in page
    assert "`" not in page.split("<body>")[1]  # every Markdown code span became <code>


def test_the_align_weight_is_compared_with_the_papers_lambda(measured):
    rows, _ = measured
    setting = rows["aa-gat-cora-gan"]["setting"]
    assert setting["name"] == "weight" and setting["paper"] == 0.01 and setting["ours"] > 0


@pytest.mark.parametrize("summary, claim, verdict", [
    ({"n": 5, "mean": 1.0, "ci_low": 0.5, "ci_high": 1.5}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, REPRODUCED),
    ({"n": 5, "mean": 0.2, "ci_low": 0.1, "ci_high": 0.3}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, REPRODUCED),
    ({"n": 5, "mean": -1.0, "ci_low": -1.5, "ci_high": -0.5}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 79}}, REPRODUCED),
    ({"n": 5, "mean": 0.0, "ci_low": -0.3, "ci_high": 0.3}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, CONTRADICTED),
    ({"n": 5, "mean": 0.0, "ci_low": -2.0, "ci_high": 2.0}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, INCONCLUSIVE),
    ({"n": 5, "mean": -1.0, "ci_low": -1.5, "ci_high": -0.5}, {"kind": "direction", "sign": 1}, CONTRADICTED),
    ({"n": 5, "mean": 0.0, "ci_low": -0.1, "ci_high": 0.1}, {"kind": "direction", "sign": 1}, INCONCLUSIVE),
    ({"n": 5, "mean": 83.0, "ci_low": 82.5, "ci_high": 83.5}, {"kind": "baseline", "value": {"mean": 83.2}}, REPRODUCED),
    ({"n": 5, "mean": 81.0, "ci_low": 80.5, "ci_high": 81.5}, {"kind": "baseline", "value": {"mean": 83.0}}, CONTRADICTED),
    ({"n": 1, "mean": 1.0, "ci_low": None, "ci_high": None}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, INCONCLUSIVE),
])
def test_the_verdict_rule(summary, claim, verdict):
    assert verdict_for(claim, summary)["verdict"] == verdict


def test_a_gain_of_the_papers_sign_but_smaller_says_so():
    found = verdict_for({"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, {"n": 5, "mean": 0.2, "ci_low": 0.1, "ci_high": 0.3})
    assert found["detail"] == "the sign only: smaller than the paper's Δ, which the CI excludes"


def test_the_committed_claims_file_covers_issue_26(claims):
    ids = {c["id"] for c in claims["claims"]}
    for task in ("cora", "citeseer", "pubmed"):
        assert f"gat-{task}" in ids and f"aa-gat-{task}-gan" in ids and f"aa-gat-{task}-ct" in ids
    for task in ("mrpc", "cola", "rte", "mnli", "qnli", "qqp", "sst2", "stsb"):
        assert {f"aa-glue-{task}-{v}" for v in ("gan", "ot", "ct")} <= ids
    by_id = {c["id"]: c for c in claims["claims"]}
    assert (by_id["aa-gat-citeseer-ct"]["baseline"]["mean"], by_id["aa-gat-citeseer-ct"]["method"]["mean"]) == (72.50, 73.49)
    assert by_id["aa-gat-cora-gan"]["measured_by"] == {"suite": "paper-gat", "task": "cora", "variant": "align-gan", "metric": "test/acc", "scale": 100}
    assert claims["papers"]["aa"]["setting"]["paper"] == 0.01
    assert all(c.get("not_here") for c in claims["claims"] if c.get("measured_by", {}).get("suite") in ("glue-minilm", "vl-paper"))


def _write(tmp_path, data) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True) if not isinstance(data, str) else data)
    return path


def _one(**changes):
    claim = {"id": "x", "paper": "p", "kind": "gain", "table": "T", "task": "Cora", "host": "GAT", "metric": "acc",
             "baseline": {"name": "GAT", "mean": 83.0}, "method": {"name": "AA", "mean": 83.8},
             "measured_by": {"suite": "paper-gat", "task": "cora", "variant": "align-gan", "metric": "test/acc", "scale": 100}}
    claim.update(changes)
    return {"papers": {"p": {"title": "P", "source": "arXiv 0000.00000"}}, "claims": [claim]}


@pytest.mark.parametrize("data, message", [
    ("papers: [\n", "is not valid YAML"),
    ({"claims": []}, "must be a mapping with `papers`"),
    ({**_one(), "claims": [{k: v for k, v in _one()["claims"][0].items() if k != "method"}]}, "claim 'x': field `method` is missing"),
    (_one(method={"name": "AA", "mean": "high"}), "claim 'x': field `method`: field `mean` must be a finite number, got 'high'"),
    (_one(kind="opinion"), "field `kind` must be one of baseline, gain, direction, structural"),
    (_one(paper="q"), "field `paper` names 'q', which is not under `papers`"),
    (_one(measured_by={"suite": "paper-gta", "task": "cora", "variant": "align-gan", "metric": "test/acc", "scale": 100}),
     "field `measured_by.suite` names 'paper-gta', not a built-in suite"),
    (_one(colour="red"), "unknown field `colour`"),
    ({**_one(), "claims": _one()["claims"] * 2}, "field `id` is used twice"),
    ({"papers": {"p": {"title": "P", "source": "s"}}, "claims": [{"id": "s", "paper": "p", "kind": "structural", "claim": "c",
                                                                  "evidence": ["tests/attention/test_contract.py::test_no_such_test"]}]},
     "defines no test test_no_such_test"),
    ({"papers": {"p": {"title": "P", "source": "s"}}, "claims": [{"id": "s", "paper": "p", "kind": "structural", "claim": "c",
                                                                  "evidence": ["tests/no_such_file.py"]}]},
     "no file tests/no_such_file.py"),
])
def test_a_malformed_claims_file_names_the_bad_field(tmp_path, data, message):
    with pytest.raises(ClaimsError, match=None) as caught:
        load_claims(_write(tmp_path, data), repo=REPO)
    assert message in str(caught.value)
    assert str(tmp_path / "claims.yaml") in str(caught.value)


def test_a_malformed_claims_file_exits_2_through_the_cli(tmp_path, capsys):
    from harness.cli import main

    assert main(["claims", "--claims-file", str(_write(tmp_path, _one(kind="opinion")))]) == 2
    assert "field `kind` must be one of" in capsys.readouterr().err


def test_the_claims_verb_prints_the_board(tmp_path, capsys):
    from harness.cli import main

    assert main(["claims", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# The papers' claims, measured here") and "aa-gat-cora-gan" in out
    assert not list(tmp_path.iterdir())  # read-only: nothing written


def test_the_claims_file_is_the_committed_one():
    assert CLAIMS_FILE == REPO / "harness" / "claims.yaml"


# ---- under-training ----------------------------------------------------------------------------------------


def _capped(best_epoch, cap, status="ok"):
    return Record.from_dict({"key": f"k{best_epoch}-{cap}-{status}", "status": status, "best_epoch": best_epoch,
                             "spec": {"params": {"max_epochs": cap}}, "metrics": {}})


def test_best_epochs_within_5_percent_of_the_cap_are_counted():
    # best_epoch counts from 0: 284 is the 285th epoch, 15 (5% of 300) from the cap; 283 is 16 from it
    found = epoch_cap_hits([_capped(299, 300), _capped(284, 300), _capped(283, 300), _capped(10, 300), _capped(299, 300, "failed")])
    assert (found["hits"], found["runs"], found["caps"]) == (2, 4, [300])
    sentence = epoch_cap_sentence({"epoch_cap": found})
    assert "Best epoch within 5% of the cap (300 epochs) in 2 of 4 runs" in sentence
    assert epoch_cap_sentence({"epoch_cap": epoch_cap_hits([_capped(100, 300)])}) is None
    assert epoch_cap_hits([Record.from_dict({"key": "a", "status": "ok", "metrics": {}})]) is None


def test_the_committed_quick_board_warns_that_it_is_under_trained():
    text = (REPO / "leaderboards" / "quick.md").read_text()
    assert text.count("Best epoch within 5% of the cap (300 epochs) in") == 2


def test_a_reason_not_to_run_is_written_once_for_every_claim_it_covers(claims, plans):
    text = render_claims_markdown(_board(claims, plans, {}))
    glue_reason = next(c["not_here"] for c in claims["claims"] if c["id"] == "aa-glue-rte-gan")
    assert text.count(glue_reason) == 2  # once under the alignment table, once under BAM's
    line = next(line for line in text.splitlines() if line.endswith(glue_reason) and "`aa-glue-mrpc-gan`" in line)
    assert all(f"`aa-glue-{task}-{v}`" in line for task in ("mrpc", "cola", "rte", "mnli", "qnli", "qqp", "sst2", "stsb") for v in ("gan", "ot", "ct"))
    assert "| not run here (why: below the table) |" in text


def test_a_borderline_verdict_says_it_does_not_survive_the_boards_holm_correction(claims, plans, paper_gat):
    """bam-weibull on CiteSeer nudged to +0.45 points (uncorrected p about 0.02): its CI excludes 0, so the claim
    reads reproduced, but the paper-gat table tests 10 variants against softmax and Holm lifts p above 0.05."""
    found = {r["key"]: r for r in claim_records(paper_gat)}
    softmax = {s.seed: found[s.key]["metrics"]["test/acc"]["value"] for s in paper_gat.specs
               if s.task == "citeseer" and s.variant == "softmax" and s.key in found}
    for spec in paper_gat.specs:
        if spec.task == "citeseer" and spec.variant == "bam-weibull" and spec.key in found:
            found[spec.key]["metrics"]["test/acc"]["value"] = softmax[spec.seed] + 0.0045 + 0.008 * (-1) ** spec.seed
    rows = _by_id(_board(claims, plans, {k: Record.from_dict(r) for k, r in found.items()}))
    row = rows["bam-citeseer-weibull"]
    assert row["verdict"] == REPRODUCED and row["measure"]["ci_low"] > 0
    assert "Holm-corrected" in row["multiplicity_note"]
    assert float(row["multiplicity_note"].split()[0]) >= 0.05
    assert "multiplicity_note" not in rows["aa-gat-cora-gan"]  # reproduced with a Holm p far below 0.05
    text = render_claims_markdown(_board(claims, plans, {k: Record.from_dict(r) for k, r in found.items()}))
    assert "`bam-citeseer-weibull`: Significant on its own (the 95% CI excludes 0), but p = " in text
