"""The verdict rules as pure functions (harness/report/verdicts.py, mechanism_test.py, dose_response.finding): each
rule on both signs, so a rule made one-sided again (a gate on negative verdicts only, a test that looks one way, a
finding that reads only gains) fails here."""

import math

import pytest

from harness.report.claims_schema import Declared
from harness.report.dose_response import ACCURACY_RISES, MECHANISM_ONLY, NOT_YET, STRUCTURAL, DoseLevel, Interval, finding
from harness.report.mechanism_test import MechanismTest, corrected, log_ratios, null_rate, wilcoxon_of_ratios
from harness.report.stats import summarize, wilcoxon_signed_rank_p
from harness.report.verdicts import INCONCLUSIVE, NOT_REPRODUCED, OPPOSITE, REPRODUCED, Verdict, verdict_for


def _gain(delta: float) -> dict:
    return {"kind": "gain", "baseline": {"name": "GAT", "mean": 80.0}, "method": {"name": "X", "mean": 80.0 + delta}}


def _measure(diffs: list[float]) -> dict:
    return summarize(diffs)


SIGNIFICANT = {"p": 0.001, "p_holm": 0.002, "family": 3}
NOT_AFTER_HOLM = {"p": 0.02, "p_holm": 0.09, "family": 3}
EFFECT = [0.9, 1.1, 1.0, 0.95, 1.05, 1.0]          # mean +1.0, tight: excludes 0
SMALL = [0.1, -0.1, 0.05, -0.05, 0.0, 0.02]          # holds 0, excludes ±1.0


@pytest.mark.parametrize("sign", [1, -1])
def test_a_gain_of_the_papers_sign_is_reproduced_either_way(sign):
    verdict = verdict_for(_gain(sign * 1.0), _measure([sign * d for d in EFFECT]), SIGNIFICANT)
    assert isinstance(verdict, Verdict) and verdict.verdict == REPRODUCED


@pytest.mark.parametrize("sign", [1, -1])
def test_a_significant_effect_of_the_other_sign_is_an_opposite_effect_either_way(sign):
    verdict = verdict_for(_gain(sign * 1.0), _measure([-sign * d for d in EFFECT]), SIGNIFICANT)
    assert verdict.verdict == OPPOSITE


@pytest.mark.parametrize("sign", [1, -1])
def test_a_ci_that_excludes_the_papers_delta_is_not_reproduced_either_way(sign):
    verdict = verdict_for(_gain(sign * 1.0), _measure([sign * d for d in SMALL]), NOT_AFTER_HOLM)
    assert verdict.verdict == NOT_REPRODUCED and verdict.detail.startswith("the CI excludes the paper's Δ")


@pytest.mark.parametrize("sign", [1, -1])
def test_significant_alone_but_not_after_holm_is_inconclusive_either_way(sign):
    verdict = verdict_for(_gain(sign * 1.0), _measure([sign * d for d in EFFECT]), NOT_AFTER_HOLM)
    assert verdict.verdict == INCONCLUSIVE and "not after Holm" in verdict.detail


@pytest.mark.parametrize("sign", [1, -1])
def test_a_direction_claim_follows_the_corrected_sign_either_way(sign):
    claim = {"kind": "direction", "sign": sign}
    assert verdict_for(claim, _measure([sign * d for d in EFFECT]), SIGNIFICANT).verdict == REPRODUCED
    assert verdict_for(claim, _measure([-sign * d for d in EFFECT]), SIGNIFICANT).verdict == OPPOSITE
    assert verdict_for(claim, _measure(SMALL), SIGNIFICANT).verdict == INCONCLUSIVE


@pytest.mark.parametrize("verdict_word", [NOT_REPRODUCED, OPPOSITE])
def test_a_baseline_that_differs_labels_either_negative_verdict_in_this_setup(verdict_word):
    diffs = SMALL if verdict_word == NOT_REPRODUCED else [-d for d in EFFECT]
    verdict = verdict_for(_gain(1.0), _measure(diffs), SIGNIFICANT if verdict_word == OPPOSITE else NOT_AFTER_HOLM, baselines_differ=True)
    assert verdict.verdict == verdict_word and verdict.label == f"{verdict_word} in this setup" and verdict["in_this_setup"]


def test_the_verdict_takes_no_mechanism_argument():
    """The mechanism is reported beside the verdict, never in it: the rule has no parameter through which it could
    withhold one sign."""
    import inspect

    assert "mechanism" not in inspect.signature(verdict_for).parameters


@pytest.mark.parametrize("alternative,shift", [("less", -1.0), ("greater", 1.0)])
def test_the_wilcoxon_test_rejects_in_its_declared_direction_only(alternative, shift):
    diffs = [shift * (0.5 + 0.1 * i) for i in range(10)]
    p, n = wilcoxon_signed_rank_p(diffs, alternative)
    assert n == 10 and p == pytest.approx(1 / 1024)
    other = "greater" if alternative == "less" else "less"
    assert wilcoxon_signed_rank_p(diffs, other)[0] == 1.0


def test_the_wilcoxon_test_matches_scipys_exact_test_on_both_sides():
    from scipy.stats import wilcoxon

    diffs = [0.3, -0.1, 0.25, -0.4, 0.05, 0.6, -0.2, 0.15, 0.33, -0.07, 0.41, 0.12]
    for alternative in ("less", "greater"):
        assert wilcoxon_signed_rank_p(diffs, alternative)[0] == pytest.approx(
            wilcoxon(diffs, alternative=alternative, method="exact").pvalue, rel=1e-12)


def test_a_mechanism_test_moves_only_after_the_pages_holm_correction():
    base = MechanismTest("qk_distance", "softmax", "less", 20, 0, 0.9, 0.03, 0.05, "abc", False)
    alone = corrected([("a", base)])
    assert alone["a"].moved is True
    family = corrected([("a", base), ("b", MechanismTest("qk_distance", "softmax", "less", 20, 0, 0.9, 0.04, 0.05, "abc", False))])
    assert family["a"].p_holm == pytest.approx(0.06) and family["a"].moved is False


def test_log_ratios_pair_only_seeds_both_records_carry():
    ratios = log_ratios({0: 0.5, 1: 1.0, 2: None, 3: 2.0}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert ratios == {0: math.log(0.5), 1: 0.0}
    p, _ = wilcoxon_of_ratios(ratios, "less")
    assert 0 < p <= 1


def test_the_null_rate_is_reproducible_and_of_the_declared_draws():
    values = {seed: 1.0 + 0.01 * ((seed * 7) % 13) for seed in range(20)}
    first = null_rate(values, "less", 0.05, 200, 0)
    assert first == null_rate(values, "less", 0.05, 200, 0)
    rejected, pairs = first
    assert pairs == 10 and 0 <= rejected <= 200


def test_a_declaration_after_a_record_is_post_hoc_and_one_before_is_not():
    declared = Declared("abc1234", "2026-11-27T16:17:48+00:00")
    assert declared.after("2026-11-26T17:52:48+00:00")
    assert not declared.after("2026-11-27T17:35:54+00:00")


def _level(lam, delta_mean, p_holm, moved, n=20):
    test = MechanismTest("qk_distance", "softmax", "less", n, 0, 0.9, 0.01, 0.05, "abc", False, p_holm=0.01 if moved else 0.5)
    return DoseLevel(f"x{lam}", lam, n, n, Interval(0.9, 0.8, 1.0, n), test, Interval(delta_mean, None, None, n), 0.01, p_holm)


def test_the_dose_findings_in_their_declared_order():
    assert finding((_level(0.01, -0.1, 0.9, False), _level(0.1, 0.8, 0.01, True)), 0.05)[0] == ACCURACY_RISES
    assert finding((_level(0.01, -0.1, 0.9, False), _level(0.1, -0.2, 0.5, True)), 0.05)[0] == MECHANISM_ONLY
    assert finding((_level(0.01, -0.1, 0.9, False), _level(0.1, 0.1, 0.5, False)), 0.05)[0] == STRUCTURAL
    # a significant fall in accuracy is not a rise: the rule reads the sign
    assert finding((_level(0.01, -0.8, 0.01, False), _level(0.1, -0.9, 0.01, False)), 0.05)[0] == STRUCTURAL
    assert finding((_level(0.01, -0.1, 0.9, False), _level(0.1, 0.0, None, False, n=0)), 0.05)[0] == NOT_YET
