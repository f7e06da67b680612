"""The claims board (harness/report/claims.py): every verdict branch on synthetic paper-gat records, the
baseline note, a malformed claims file's error, the committed claims file, and the under-training warning.
The rendered board is pinned byte for byte by tests/test_fixture_boards.py (expected/claims/)."""

import math
from pathlib import Path

import pytest
import yaml

from harness.report.claims import (CLAIMS_FILE, INCONCLUSIVE, NOT_JUDGED, NOT_REPRODUCED, NOT_RUN_HERE, NOT_RUN_YET, OPPOSITE, REPRODUCED,
                                   ClaimsError, load_claims, measure_claims, render_claims_markdown, row_cells, verdict_for)
from harness.results.record import Record
from tests.fixtures.make_fixtures import CLAIM_MISSING, claim_records

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plans(shared_data):
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    suites = sorted({c["measured_by"]["suite"] for c in load_claims()["claims"] if "measured_by" in c})
    return {suite: plan(load_suite(suite), str(shared_data)) for suite in suites}


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


def test_every_verdict_branch_on_synthetic_records(measured, paper_gat):
    rows, _ = measured
    assert rows["aa-gat-cora-gan"]["verdict"] == REPRODUCED                  # CI excludes 0, the paper's sign, Holm p < 0.05
    assert rows["aa-gat-cora-ct"]["verdict"] == INCONCLUSIVE                 # CI holds 0 and +0.80
    assert rows["aa-gat-citeseer-gan"]["verdict"] == OPPOSITE                # significant after Holm, the other sign
    assert rows["aa-gat-citeseer-ct"]["verdict"] == NOT_REPRODUCED           # holds 0, excludes +0.99
    assert rows["aa-gat-citeseer-ct"]["detail"] == "the CI excludes the paper's Δ"
    assert rows["aa-gat-citeseer-ct"]["label"] == "not reproduced in this setup"  # our CiteSeer softmax is below GAT's 72.5
    assert rows["aa-gat-cora-ct-default-lambda"]["verdict"] == NOT_JUDGED    # attnbench's default λ: shown, never judged
    assert rows["aa-gat-cora-ct-default-lambda"]["measure"]["n"] == 20
    assert rows["aa-gat-pubmed-gan"]["verdict"] == NOT_RUN_HERE              # the suite's optional task was skipped
    assert "pubmed" in rows["aa-gat-pubmed-gan"]["reason"]
    assert rows["aa-glue-rte-gan"]["verdict"] == NOT_RUN_HERE
    assert "albert-base-v2" in rows["aa-glue-rte-gan"]["reason"] and "SUITE=glue-albert" in rows["aa-glue-rte-gan"]["reason"]
    assert rows["aa-glue-rte-gan-proxy"]["verdict"] == NOT_RUN_HERE and "glue-minilm" in rows["aa-glue-rte-gan-proxy"]["reason"]
    assert rows["bam-translation"]["verdict"] == NOT_RUN_HERE
    for claim_id, task, variant in (("bam-cora-weibull", "cora", "bam-weibull"), ("bam-citeseer-lognormal", "citeseer", "bam-lognormal")):
        # a tuned claim is measured once the committed parameters plan its "(tuned)" row, and then from that row
        tuned = [s for s in paper_gat.specs if s.task == task and s.label == f"{variant} (tuned)"]
        if not tuned:
            assert rows[claim_id]["verdict"] == NOT_RUN_YET
            continue
        assert rows[claim_id]["attention"] == dict(tuned[0].attention)
        # measured, unless the fixture leaves out some of the common seeds (CLAIM_MISSING: citeseer's lognormal)
        left_out = CLAIM_MISSING.get((task, variant), set()) & set(range(20))
        assert (rows[claim_id]["verdict"] == NOT_RUN_YET) == bool(left_out)
        if left_out:
            assert rows[claim_id]["reason"] == f"{len(tuned) - len(left_out)} of {len(tuned)} seeds"
    assert rows["gat-cora"]["verdict"] == REPRODUCED and rows["gat-citeseer"]["verdict"] == NOT_REPRODUCED
    assert rows["fenchel-dual"]["verdict"] == "structural"


def test_a_tuned_claim_without_committed_parameters_is_not_run_yet_and_says_how(claims, plans, shared_data, tmp_path):
    """The tuned rows read their parameters from a folder with none (as before `tune --promote`): every BAM
    graph claim then waits, naming the command, whatever this checkout has committed."""
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    untuned = plan(load_suite("paper-gat"), str(shared_data), tuned_dir=tmp_path)
    records = {r["key"]: Record.from_dict(r) for r in claim_records(untuned)}
    rows = _by_id(_board(claims, {**plans, "paper-gat": untuned}, records))
    for claim_id in ("bam-cora-weibull", "bam-cora-lognormal", "bam-citeseer-weibull", "bam-citeseer-lognormal"):
        assert rows[claim_id]["verdict"] == NOT_RUN_YET, claim_id
        assert "attnbench tune" in rows[claim_id]["reason"] and "--promote" in rows[claim_id]["reason"]


def test_every_measured_claim_row_names_its_configuration_source(measured):
    rows, _ = measured
    for row in rows.values():
        if row["claim"]["kind"] == "structural":
            continue
        cells = row_cells(row)
        if row["claim"].get("measured_by"):
            assert cells["config"].split(" ")[0] in ("paper", "tuned", "default"), row["claim"]["id"]
        else:
            assert cells["config"] == "—"


def test_a_tuned_configuration_names_its_budget_and_the_failed_trials_apart():
    """The budget is the finished trials, as `tune` counts it; trials of a killed process (retried) or diverged
    configurations are named beside it, so that two tuned rows with equal budgets read as equal."""
    from harness.report.claims import config_text

    tuned = {"config": "tuned", "tuning": {"trials": 20, "failed": 5, "metric": "val/loss", "kept_defaults": False}}
    assert config_text(tuned) == "tuned (20 trials, val/loss; 5 more failed (killed and retried, or diverged))"
    assert config_text({**tuned, "tuning": {**tuned["tuning"], "failed": 0}}) == "tuned (20 trials, val/loss)"


def test_a_negative_verdict_stands_with_the_mechanism_reported_beside_it(claims, plans, paper_gat):
    """align-gan on CiteSeer loses significantly: "opposite effect", judged on the claim as stated whatever its
    mechanism did; with queries and keys no closer than softmax's at the evaluated weights, the verdict's words say so
    with the declared test's p, and the notes cite the kernel rule's median figure over the seeds with evidence."""
    found = {r["key"]: r for r in claim_records(paper_gat)}
    for spec in paper_gat.specs:
        if spec.task == "citeseer" and spec.display in ("align-gan", "align-ct-paper-lambda") and spec.key in found:
            found[spec.key]["diagnostics"] = {"test/diag/qk_distance": 1.0, "test/diag/disc_acc": 0.9}
    rows = _by_id(_board(claims, plans, {k: Record.from_dict(r) for k, r in found.items()}))
    for claim_id, verdict in (("aa-gat-citeseer-gan", OPPOSITE), ("aa-gat-citeseer-ct", NOT_REPRODUCED)):
        row = rows[claim_id]
        assert row["verdict"] == verdict and not row.get("withheld")
        assert row["mechanism"]["active"] is False
        assert row["mechanism"]["evidence"].startswith("active at the evaluated weights in 0 of 36 seeds with evidence")
        assert "median qk_distance ratio to softmax's 1 (range 1–1) over 36 seeds (rule: qk_distance ratio to softmax's < 0.8)" in row["mechanism"]["evidence"]
        words = row_cells(row)["verdict"]
        assert "at the paper's λ = 0.01, queries and keys did not move closer than softmax's" in words and "one-sided Wilcoxon p" in words
    # records from before the evidence at the evaluated weights, with training and validation values only: nothing
    # falls back to them, and the verdict on the claim stands as it was
    for record in found.values():
        record["diagnostics"] = {**{k.replace("test/", "val/"): v for k, v in (record.get("diagnostics") or {}).items()},
                                 "diag/qk_distance": 0.1}
    rows = _by_id(_board(claims, plans, {k: Record.from_dict(r) for k, r in found.items()}))
    assert rows["aa-gat-citeseer-gan"]["verdict"] == OPPOSITE
    assert rows["aa-gat-citeseer-gan"]["mechanism"]["evidence"].startswith("no evidence at the evaluated weights in any of 36 records")
    assert rows["aa-gat-citeseer-gan"]["mechanism_test"].n == 0
    assert "has no evidence at the evaluated weights" in row_cells(rows["aa-gat-citeseer-gan"])["verdict"]
    assert rows["aa-gat-cora-gan"]["verdict"] == REPRODUCED


def test_mechanism_evidence_comes_from_a_re_execution_of_the_same_evaluated_weights(claims, plans, paper_gat):
    """A key re-run to record its evidence keeps its key (issues 35, 51): the board shows the earliest execution's
    numbers, and the evidence it lacks comes from an execution that evaluated the same weights (same kept epoch,
    monitored value and test metrics). One that took another trajectory, or whose test metrics differ, is never read."""
    from harness.report.evidence import evidence_record

    found = {r["key"]: r for r in claim_records(paper_gat)}
    diagnosed, elsewhere, other_test = {}, {}, {}
    for spec in paper_gat.specs:
        if spec.task == "citeseer" and spec.display in ("align-gan", "softmax") and spec.key in found:
            found[spec.key].pop("diagnostics", None), found[spec.key].pop("history", None)  # made before the evidence
            again = {**found[spec.key], "finished": "2099-01-01T00:00:00+00:00",
                     "diagnostics": {"test/diag/qk_distance": 1.0, "test/diag/disc_acc": 0.5}}
            copies = [Record.from_dict(found[spec.key]), Record.from_dict(again)]
            chosen = evidence_record(copies)
            assert dict(chosen.diagnostics) == again["diagnostics"] and chosen.finished == found[spec.key]["finished"]
            diagnosed[spec.key] = chosen
            other = {**again, "best_epoch": again["best_epoch"] + 3}  # another trajectory: another kept epoch
            elsewhere[spec.key] = evidence_record([Record.from_dict(found[spec.key]), Record.from_dict(other)])
            assert not elsewhere[spec.key].diagnostics
            metrics = {name: {**m, "value": m["value"] + 0.01} for name, m in again["metrics"].items()}
            moved = {**again, "metrics": metrics}  # same kept epoch and monitored value, other test numbers
            other_test[spec.key] = evidence_record([Record.from_dict(found[spec.key]), Record.from_dict(moved)])
            assert not other_test[spec.key].diagnostics
    records = {k: Record.from_dict(r) for k, r in found.items()}
    plain = _by_id(_board(claims, plans, records))["aa-gat-citeseer-gan"]
    board = measure_claims(claims, plans, {suite: records for suite in plans}, {"paper-gat": diagnosed})
    row = _by_id(board)["aa-gat-citeseer-gan"]
    assert plain["mechanism"]["active"] is None
    assert row["mechanism"]["evidence"].startswith("active at the evaluated weights in 0 of 36 seeds with evidence")
    assert row["measure"] == plain["measure"]  # the numbers are still the shown execution's
    for evidence in (elsewhere, other_test):
        other = _by_id(measure_claims(claims, plans, {suite: records for suite in plans}, {"paper-gat": evidence}))
        assert other["aa-gat-citeseer-gan"]["mechanism"]["active"] is None


def test_the_shown_records_own_evidence_is_never_narrowed_to_the_matched_re_executions(claims, plans, paper_gat):
    """align-gan's shown records carry test/attn/qk_distance from their own test pass: every seed counts, and a
    re-execution of the same weights adds only what a shown record lacks (no subset of matched seeds)."""
    from harness.report.evidence import evidence_record

    found = {r["key"]: r for r in claim_records(paper_gat)}
    evidence = {}
    for spec in paper_gat.specs:
        if spec.task == "cora" and spec.display in ("align-gan", "softmax") and spec.key in found:
            own = 0.5 if spec.display == "align-gan" else 1.0
            found[spec.key]["diagnostics"] = {"test/attn/qk_distance": own, "diag/qk_distance": 5.0, "val/diag/qk_distance": 5.0}
            if spec.seed < 5:  # a re-execution of the same weights for 5 seeds, with a test/diag value of its own
                again = {**found[spec.key], "finished": "2099-01-01T00:00:00+00:00", "diagnostics": {"test/diag/qk_distance": 9.0}}
                evidence[spec.key] = evidence_record([Record.from_dict(found[spec.key]), Record.from_dict(again)])
    records = {k: Record.from_dict(r) for k, r in found.items()}
    row = _by_id(measure_claims(claims, plans, {suite: records for suite in plans}, {"paper-gat": evidence}))["aa-gat-cora-gan"]
    assert row["mechanism"]["evidence"].startswith("active at the evaluated weights in 20 of 20 seeds with evidence")
    assert row["mechanism_test"].n == 20 and abs(row["mechanism_test"].median_ratio - 0.5) < 1e-9


def test_active_seeds_are_counted_over_the_seeds_with_evidence(claims, plans, paper_gat):
    """8 of 20 Cora seeds carry the evidence, all of them active: active in 8 of 8 seeds with evidence (12 without),
    never 8 of 20, which would also turn the rule's majority to inactive."""
    found = {r["key"]: r for r in claim_records(paper_gat)}
    for spec in paper_gat.specs:
        if spec.task == "cora" and spec.display in ("align-gan", "softmax") and spec.key in found:
            found[spec.key]["diagnostics"] = ({"test/diag/qk_distance": 0.5 if spec.display == "align-gan" else 1.0}
                                              if spec.seed < 8 else {"val/diag/qk_distance": 0.5, "diag/qk_distance": 0.5})
    row = _by_id(_board(claims, plans, {k: Record.from_dict(r) for k, r in found.items()}))["aa-gat-cora-gan"]
    assert row["mechanism"]["active"] is True
    assert row["mechanism"]["evidence"].startswith("active at the evaluated weights in 8 of 8 seeds with evidence (12 without evidence)")
    assert row["mechanism_test"].n == 8 and row["mechanism_test"].without == 12


def test_a_threshold_declared_after_the_records_is_marked_post_hoc(claims, plans, paper_gat):
    """claims.yaml dates each kernel threshold; moved to a commit after the records finished, the page says post hoc,
    and before them it does not."""
    import dataclasses

    from harness.report.claims_schema import Declared

    found = {r["key"]: r for r in claim_records(paper_gat)}
    for spec in paper_gat.specs:
        if spec.task == "cora" and spec.display in ("align-gan", "softmax") and spec.key in found:
            found[spec.key]["diagnostics"] = {"test/diag/qk_distance": 0.5 if spec.display == "align-gan" else 1.0}
            found[spec.key]["finished"] = "2026-01-01T00:00:00+00:00"
    records = {k: Record.from_dict(r) for k, r in found.items()}

    def page(at: str) -> tuple[dict, str]:
        moved = tuple(dataclasses.replace(t, declared=Declared("abc1234", at)) if t.variant == "align-gan" else t for t in claims.thresholds)
        changed = dataclasses.replace(claims, thresholds=moved)
        board = _board(changed, plans, records)
        return _by_id(board)["aa-gat-cora-gan"], render_claims_markdown(board)

    row, text = page("2026-06-01T00:00:00+00:00")
    assert row["mechanism"]["post_hoc"][0]["post_hoc"] and "post hoc" in text
    assert "hreshold of qk_distance declared at abc1234 (2026-06-01), after 20 of 20 of these runs had finished: *post hoc*" in text
    row, text = page("2025-06-01T00:00:00+00:00")
    assert not row["mechanism"]["post_hoc"][0]["post_hoc"]
    assert "hreshold of qk_distance declared at abc1234 (2025-06-01), before these runs finished" in text


def test_the_first_declared_seeds_verdict_is_judged_on_those_seeds(claims, plans, paper_gat):
    """CiteSeer grew from 20 to 36 seeds: the verdict on the first 20 is computed on those 20, and the mechanism never
    changes either verdict."""
    found = {r["key"]: r for r in claim_records(paper_gat)}
    for spec in paper_gat.specs:
        if spec.task == "citeseer" and spec.display == "align-ct-paper-lambda" and spec.key in found:
            distance = 0.5 if spec.seed < 16 else 1.0  # softmax's is 1.0 in the fixture: active in 16 of the first 20
            found[spec.key]["diagnostics"] = {"test/diag/qk_distance": distance}
    row = _by_id(_board(claims, plans, {k: Record.from_dict(r) for k, r in found.items()}))["aa-gat-citeseer-ct"]
    assert row["mechanism"]["evidence"].startswith("active at the evaluated weights in 16 of 36 seeds") and row["verdict"] == NOT_REPRODUCED
    first = row["first_seeds"]
    assert first["seeds"] == 20 and first["verdict"] == NOT_REPRODUCED


def test_a_verdict_resting_on_seeds_added_later_is_marked_with_both_verdicts(claims, plans, paper_gat):
    """paper-gat's CiteSeer grew from 20 to 36 seeds (its seed_history): an effect carried by seeds 20-35 alone."""
    found = {r["key"]: r for r in claim_records(paper_gat)}
    softmax = {s.seed: found[s.key]["metrics"]["test/acc"]["value"] for s in paper_gat.specs
               if s.task == "citeseer" and s.variant == "softmax" and s.key in found}
    for spec in paper_gat.specs:
        if spec.task == "citeseer" and spec.display == "align-gan" and spec.key in found:
            shift = 0.02 if spec.seed >= 20 else 0.0
            found[spec.key]["metrics"]["test/acc"]["value"] = softmax[spec.seed] + shift + 0.002 * (-1) ** spec.seed
    row = _by_id(_board(claims, plans, {k: Record.from_dict(r) for k, r in found.items()}))["aa-gat-citeseer-gan"]
    assert row["verdict"] == REPRODUCED and row["rests_on_added_seeds"]
    assert row["first_seeds"]["seeds"] == 20 and row["first_seeds"]["verdict"] == NOT_REPRODUCED
    text = render_claims_markdown(_board(claims, plans, {k: Record.from_dict(r) for k, r in found.items()}))
    assert "rests on seeds added later (on the first 20 declared: not reproduced)" in text
    assert "- `aa-gat-citeseer-gan`: On the first 20 declared seeds: " in text
    assert "the verdict rests on seeds added after the first declared ones: `aa-gat-citeseer-gan`" in text


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
    assert "Baselines: the paper's 72.50 (GAT); ours, `softmax`, " in rows["aa-gat-citeseer-gan"]["baseline_note"]
    assert rows["aa-gat-citeseer-gan"]["label"] == "opposite effect in this setup"
    assert "baseline_note" not in rows["aa-gat-cora-gan"]  # Cora's softmax holds 83.00


def test_with_no_records_paper_gat_claims_are_not_run_yet_with_counts(claims, plans, paper_gat):
    rows = _by_id(_board(claims, plans, {}))
    seeds = len(paper_gat.suite.seeds)
    for claim_id in ("gat-cora", "aa-gat-cora-gan"):
        assert (rows[claim_id]["verdict"], rows[claim_id]["reason"]) == (NOT_RUN_YET, f"0 of {seeds} seeds")
    assert rows["aa-gat-citeseer-ct"]["reason"] == "0 of 36 seeds"  # CiteSeer's own seeds
    text = render_claims_markdown(_board(claims, plans, {}))
    assert f"not run yet: 0 of {seeds} seeds" in text and "reproduced 0, not reproduced 0, opposite effect 0, inconclusive 0" in text


def test_the_html_page_shows_the_same_cells(claims, plans, paper_gat):
    from harness.report.html_page import render_claims_html

    records = {r["key"]: Record.from_dict(r) for r in claim_records(paper_gat)}
    board = _board(claims, plans, records)
    page = render_claims_html(board)
    assert page.count("<tr><td") == sum(1 for row in board["rows"] if row["claim"]["kind"] != "structural")
    assert "<span class=\"verdict-reproduced\">reproduced" in page
    assert "opposite effect in this setup: Holm p " in page
    assert "<code>paper-gat</code> / <code>cora</code> / <code>align-gan</code>" in page
    assert "`" not in page.split("<body>")[1]  # every Markdown code span became <code>


def test_the_align_weight_is_compared_with_the_papers_lambda(measured):
    rows, _ = measured
    setting = rows["aa-gat-cora-gan"]["setting"]
    assert setting["name"] == "weight" and setting["paper"] == 0.01 and setting["ours"] > 0


SIGNIFICANT = {"p": 0.001, "p_holm": 0.01, "family": 12}
ALONE = {"p": 0.01, "p_holm": 0.12, "family": 12}


@pytest.mark.parametrize("summary, claim, family, verdict", [
    ({"n": 5, "mean": 1.0, "ci_low": 0.5, "ci_high": 1.5}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, SIGNIFICANT, REPRODUCED),
    ({"n": 5, "mean": 0.2, "ci_low": 0.1, "ci_high": 0.3}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, SIGNIFICANT, REPRODUCED),
    ({"n": 5, "mean": -1.0, "ci_low": -1.5, "ci_high": -0.5}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 79}}, SIGNIFICANT, REPRODUCED),
    ({"n": 5, "mean": 1.0, "ci_low": 0.5, "ci_high": 1.5}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, ALONE, INCONCLUSIVE),
    ({"n": 5, "mean": 0.0, "ci_low": -0.3, "ci_high": 0.3}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, None, NOT_REPRODUCED),
    ({"n": 5, "mean": 2.0, "ci_low": 1.5, "ci_high": 2.5}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, ALONE, INCONCLUSIVE),
    ({"n": 5, "mean": 0.0, "ci_low": -2.0, "ci_high": 2.0}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, None, INCONCLUSIVE),
    ({"n": 5, "mean": -1.0, "ci_low": -1.5, "ci_high": -0.5}, {"kind": "direction", "sign": 1}, SIGNIFICANT, OPPOSITE),
    ({"n": 5, "mean": -1.0, "ci_low": -1.5, "ci_high": -0.5}, {"kind": "direction", "sign": 1}, ALONE, INCONCLUSIVE),
    ({"n": 5, "mean": 0.0, "ci_low": -0.1, "ci_high": 0.1}, {"kind": "direction", "sign": 1}, None, INCONCLUSIVE),
    ({"n": 5, "mean": 83.0, "ci_low": 82.5, "ci_high": 83.5}, {"kind": "baseline", "value": {"mean": 83.2}}, None, REPRODUCED),
    ({"n": 5, "mean": 81.0, "ci_low": 80.5, "ci_high": 81.5}, {"kind": "baseline", "value": {"mean": 83.0}}, None, NOT_REPRODUCED),
    ({"n": 1, "mean": 1.0, "ci_low": None, "ci_high": None}, {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, None, INCONCLUSIVE),
])
def test_the_verdict_rule(summary, claim, family, verdict):
    assert verdict_for(claim, summary, family, (True, "active"))["verdict"] == verdict


def test_a_positive_verdict_whose_corrected_p_is_not_below_alpha_is_not_reproduced():
    claim = {"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}
    found = verdict_for(claim, {"n": 20, "mean": 1.0, "ci_low": 0.01, "ci_high": 2.0}, {"p": 0.0495, "p_holm": 0.545, "family": 11})
    assert found["verdict"] == INCONCLUSIVE
    assert found["detail"] == f"significant alone (p {0.0495:.3f}) but not after Holm over the table's 11 comparisons (p 0.545)"
    # the opposite sign, significant alone only: the verdict rests on the CI excluding the paper's Δ, and says why
    found = verdict_for(claim, {"n": 20, "mean": -0.31, "ci_low": -0.59, "ci_high": -0.02}, {"p": 0.037, "p_holm": 0.261, "family": 12}, (True, "on"))
    assert found["verdict"] == NOT_REPRODUCED and found["detail"].startswith("the CI excludes the paper's Δ; significant alone")


def test_a_gain_of_the_papers_sign_but_smaller_says_so():
    found = verdict_for({"kind": "gain", "baseline": {"mean": 80}, "method": {"mean": 81}}, {"n": 5, "mean": 0.2, "ci_low": 0.1, "ci_high": 0.3}, SIGNIFICANT)
    assert found["detail"] == "the sign only: smaller than the paper's Δ, which the CI excludes, Holm p 0.010"


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
    assert all(c.get("not_here") for c in claims["claims"] if c.get("measured_by", {}).get("suite") in ("glue-albert", "glue-minilm", "vl-paper"))
    assert all(by_id[f"aa-glue-{task}-{v}"]["measured_by"]["suite"] == "glue-albert" and by_id[f"aa-glue-{task}-{v}-proxy"]["measured_by"]["suite"] == "glue-minilm"
               for task in ("mrpc", "cola", "rte", "mnli", "qnli", "qqp", "sst2", "stsb") for v in ("gan", "ot", "ct"))


def _write(tmp_path, data) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True) if not isinstance(data, str) else data)
    return path


def _one(**changes):
    claim = {"id": "x", "paper": "p", "kind": "gain", "table": "T", "task": "Cora", "host": "GAT", "metric": "acc",
             "baseline": {"name": "GAT", "mean": 83.0}, "method": {"name": "AA", "mean": 83.8},
             "measured_by": {"suite": "paper-gat", "task": "cora", "variant": "align-gan", "metric": "test/acc", "scale": 100},
             "config": {"source": "paper"}}
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
    (_one(config={"source": "guessed"}), "field `config.source` must be one of paper, tuned, default"),
    ({**_one(), "claims": [{k: v for k, v in _one()["claims"][0].items() if k != "config"}]}, "field `config` is missing"),
    (_one(baseline={"name": "GAT", "mean": 83.0, "from": "gta"}), "field `baseline.from` names 'gta', not a paper"),
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


def test_a_reason_not_to_run_is_written_once_for_every_claim_it_covers(claims, plans):
    text = render_claims_markdown(_board(claims, plans, {}))
    glue_reason = next(c["not_here"] for c in claims["claims"] if c["id"] == "aa-glue-rte-gan")
    shared = [line for line in text.splitlines() if line.endswith(": not run here: " + glue_reason)]
    assert len(shared) == 2  # once under the alignment table, once under BAM's
    line = next(line for line in shared if "`aa-glue-mrpc-gan`" in line)
    assert all(f"`aa-glue-{task}-{v}`" in line for task in ("mrpc", "cola", "rte", "sst2", "stsb") for v in ("gan", "ot", "ct"))
    # the tasks whose data lacks the training files say so first (issue 51: 18 rows said only "needs albert-base-v2")
    for task, missing in (("mnli", "glue/MNLI/train.tsv"), ("qnli", "glue/QNLI/train.tsv"), ("qqp", "glue/QQP/train.tsv")):
        line = next(line for line in text.splitlines() if f"`aa-glue-{task}-gan`" in line and "not run here" in line)
        assert f"the suite's task `glue-{task}` was skipped: GLUE {task.upper()} is missing" in line and missing in line
        assert line.endswith(glue_reason)
    assert "| not run here (why: below the table) |" in text


def test_a_reason_of_cost_is_the_measured_time_per_run(claims, plans):
    """`{cost:<suite>}` in a reason becomes that suite's measured time per run (issue 51: "hours" where MiniLM on RTE
    took a median 23.9 min), from its records; without records the page says there is nothing to measure by."""
    from harness.report.claims import _with_measured_costs, measured_cost
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    minilm = plan(load_suite("minilm-rte"), plans["paper-gat"].data_root)
    records = {spec.key: Record.from_dict({"key": spec.key, "status": "ok", "spec": spec.to_dict(), "wall_time_s": 60.0 * (10 + spec.seed),
                                           "hardware": {"label": "CPU x"}}) for spec in minilm.specs}
    assert measured_cost("minilm-rte", minilm, records) == f"a median {10 + (len(minilm.specs) - 1) / 2:.1f} min per run of suite `minilm-rte` ({len(minilm.specs)} runs, CPU x)"
    filled = _with_measured_costs(claims, {"minilm-rte": minilm}, {"minilm-rte": {}})
    proxy = next(c for c in filled["claims"] if c["id"] == "aa-glue-rte-gan-proxy")
    assert "{cost:" not in proxy["not_here"] and "no run of suite `minilm-rte` recorded to measure the cost by" in proxy["not_here"]


def test_a_borderline_verdict_says_it_does_not_survive_the_boards_holm_correction(claims, plans, paper_gat):
    """align-gan on Cora nudged to +0.45 points (uncorrected p about 0.02): its CI excludes 0, but the paper-gat table tests
    every variant against softmax and Holm lifts p above 0.05, so it is not "reproduced"; the family is the board's."""
    from harness.report.board import build_board

    found = {r["key"]: r for r in claim_records(paper_gat)}
    softmax = {s.seed: found[s.key]["metrics"]["test/acc"]["value"] for s in paper_gat.specs
               if s.task == "cora" and s.variant == "softmax" and s.key in found}
    for spec in paper_gat.specs:
        if spec.task == "cora" and spec.display == "align-gan" and spec.key in found:
            found[spec.key]["metrics"]["test/acc"]["value"] = softmax[spec.seed] + 0.0045 + 0.008 * (-1) ** spec.seed
    records = {k: Record.from_dict(r) for k, r in found.items()}
    row = _by_id(_board(claims, plans, records))["aa-gat-cora-gan"]
    assert row["verdict"] == INCONCLUSIVE and row["measure"]["ci_low"] > 0
    assert "not after Holm over the table's" in row["detail"]
    board = build_board(paper_gat.suite, paper_gat, records)
    (table,) = [t for g in board["groups"] for t in g["tasks"] if t["task"] == "cora"]
    (board_row,) = [r for r in table["rows"] if r["variant"] == "align-gan"]
    holm_p = board_row["metrics"]["test/acc"]["vs_baseline"]["p_holm"]
    assert holm_p >= 0.05 and f"(p {holm_p:.3f})" in row["detail"]  # the claims board's family is the leaderboard's


def test_the_page_states_how_near_uniform_the_hosts_own_attention_is(claims, plans, paper_gat):
    """Issue 51: GAT's attention on Cora is essentially uniform over each neighbourhood, which bounds what any variant
    can change there; the page says so from softmax's records at the evaluated weights (per layer), and only where it
    holds (the fixture's CiteSeer is not near uniform)."""
    from harness.report.claims import NEAR_UNIFORM, host_attention, host_attention_line

    records = {r["key"]: Record.from_dict(r) for r in claim_records(paper_gat)}
    found = host_attention({"paper-gat": paper_gat}, {"paper-gat": records}, {"paper-gat": {}})
    assert [(row["task"], row["seeds"]) for row in found] == [("citeseer", 36), ("cora", 20)]
    cora = next(row for row in found if row["task"] == "cora")
    assert cora["layers"] == [pytest.approx(1.40 / 1.41)] * 2 and cora["layers"][0] >= NEAR_UNIFORM
    line = host_attention_line(found)
    assert "`cora` (`paper-gat`, 20 seeds) layer 1 99.3%, layer 2 99.3%" in line
    assert "On `cora` it is near uniform" in line and "`citeseer` it is" not in line
    assert host_attention_line([]) is None  # records without the uniform reference: no statement
