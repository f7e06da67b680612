"""The board's statistics against scipy's own tests and distributions, at the edges each function names:
two seeds against three, a lower-is-better metric, a baseline rate outside (0, 1), perfect correlations,
float noise against a real spread, and the exact power of the paired t-test behind a table's resolution."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from harness.report.stats import above_chance_p, correlation_above_zero_p, detectable_difference, holm, metric_kind, paired_p


def test_above_chance_with_two_or_more_seeds_is_scipys_one_sided_one_sample_t_test():
    assert above_chance_p([0.61, 0.66], 0.5, True) == (pytest.approx(stats.ttest_1samp([0.11, 0.16], 0.0, alternative="greater").pvalue, rel=1e-12), "t")
    # lower is better (an error rate, a loss): the distance below the baseline is what is tested
    assert above_chance_p([0.2, 0.3, 0.25], 0.5, False) == (
        pytest.approx(stats.ttest_1samp([0.3, 0.2, 0.25], 0.0, alternative="greater").pvalue, rel=1e-12), "t")
    assert above_chance_p([0.7, 0.8, 0.75], 0.5, False)[0] > 0.99  # far above a lower-is-better baseline: worse than chance


def test_constant_seeds_above_chance_are_certain_and_at_or_below_it_are_no_evidence():
    assert above_chance_p([0.7, 0.7], 0.5, True) == (0.0, "t")
    assert above_chance_p([0.4, 0.4], 0.5, True) == (1.0, "t")
    assert above_chance_p([0.5, 0.5, 0.5], 0.5, True) == (1.0, "t")
    assert above_chance_p([0.6, 0.6], 0.5, False) == (1.0, "t")
    # equal up to float noise relative to the values' scale: still constant (a shortcut, not a t statistic of 1e11)
    assert above_chance_p([5.0, 5.0 + 4e-12], 0.0, True) == (0.0, "t")
    # a spread of 1.5e-12 on values below 1 is a spread, not noise: the t-test decides (tiny but positive p)
    p, test = above_chance_p([0.5, 0.5 + 1.5e-12], 0.0, True)
    assert test == "t" and 0.0 < p == pytest.approx(stats.ttest_1samp([0.5, 0.5 + 1.5e-12], 0.0, alternative="greater").pvalue, rel=1e-6)


def test_one_seed_of_an_accuracy_is_an_exact_binomial_test_in_the_direction_of_better():
    assert above_chance_p([0.56], 0.5, True, 200) == (pytest.approx(stats.binomtest(112, 200, 0.5, alternative="greater").pvalue, rel=1e-12), "binomial")
    assert above_chance_p([0.1], 0.5, False, 100) == (pytest.approx(stats.binomtest(10, 100, 0.5, alternative="less").pvalue, rel=1e-12), "binomial")
    assert above_chance_p([0.9], 0.5, False, 100)[0] > 0.99
    # a baseline that always (or never) succeeds leaves nothing to test against; a rate above 1 is not a rate
    for rate in (0.0, 1.0, 1.5):
        assert above_chance_p([0.7], rate, True, 100) is None


def test_paired_p_is_scipys_paired_t_test_and_constant_shifts_are_certain():
    diffs = [0.01, 0.03, 0.02, -0.005]
    assert paired_p(diffs) == pytest.approx(stats.ttest_rel(diffs, [0.0] * 4).pvalue, rel=1e-12)
    assert paired_p([0.02, 0.02, 0.02]) == 0.0
    assert paired_p([0.0, 1e-13, -1e-13]) == 1.0
    assert paired_p([3.0, 3.0 + 2e-12, 3.0]) == 0.0  # noise relative to a shift of 3 is still a constant shift


def test_holm_matches_its_step_down_definition_with_ties_and_a_cap_at_one():
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.04, "e": 0.5})
    # sorted 0.01, 0.03, 0.04, 0.04, 0.5 -> 5·0.01, 4·0.03, max(0.12, 3·0.04), max(0.12, 2·0.04) (monotone), min(1, 0.5)
    assert adjusted == pytest.approx({"a": 0.05, "c": 0.12, "b": 0.12, "d": 0.12, "e": 0.5})
    assert holm({"a": 0.4, "b": 0.6}) == pytest.approx({"a": 0.8, "b": 0.8})  # 2·0.4, then max(0.8, 1·0.6)
    assert holm({"a": 0.7, "b": 0.9}) == {"a": 1.0, "b": 1.0}


@pytest.mark.parametrize("name, kind", [("test/mcc", "correlation"), ("mcc", "correlation"), ("val/mm_pearson", "correlation"),
                                        ("test/spearman", "correlation"), ("test/f1", "other"), ("test/mcc_loss", "other"), ("acc", "other")])
def test_metric_kind_reads_the_metrics_own_name(name, kind):
    assert metric_kind(name) == kind


def test_correlation_p_at_three_examples_and_at_perfect_correlations():
    # three examples are the fewest a correlation test has: one degree of freedom
    r = 0.5
    assert correlation_above_zero_p(r, 3, "test/pearson") == pytest.approx(stats.t.sf(r * math.sqrt(1 / (1 - r * r)), 1), rel=1e-12)
    x, y = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 4.0])
    assert correlation_above_zero_p(stats.pearsonr(x, y).statistic, 4, "pearson") == pytest.approx(
        stats.pearsonr(x, y, alternative="greater").pvalue, rel=1e-9)
    assert correlation_above_zero_p(1.0, 10, "test/pearson") == 0.0
    assert correlation_above_zero_p(-1.0, 10, "test/spearman") == 1.0
    assert correlation_above_zero_p(1.0, 25, "test/mcc") == pytest.approx(stats.norm.sf(5.0), rel=1e-12)
    assert correlation_above_zero_p(-1.0, 25, "test/mcc") == pytest.approx(stats.norm.cdf(5.0), rel=1e-12)
    for value in (-1.0001, 1.0001, -1.5):
        assert correlation_above_zero_p(value, 100, "test/pearson") is None


@pytest.mark.parametrize("n", [3, 5, 10])
def test_detectable_difference_has_exactly_the_stated_power_under_the_noncentral_t(n):
    effect = detectable_difference(1.0, n)
    df, critical = n - 1, stats.t.ppf(0.975, n - 1)
    shift = effect * math.sqrt(n)
    power = stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift)  # both tails reject
    assert power == pytest.approx(0.8, abs=1e-9)


def test_detectable_difference_at_two_seeds_by_simulation_and_none_without_a_spread():
    effect = detectable_difference(1.0, 2)  # scipy's noncentral t is NaN out here, so simulate the test itself
    assert 10.0 < effect < 13.0
    rng = np.random.default_rng(1)
    diffs = rng.normal(effect, 1.0, size=(400_000, 2))
    t = diffs.mean(axis=1) / (diffs.std(axis=1, ddof=1) / math.sqrt(2))
    assert np.mean(np.abs(t) > stats.t.ppf(0.975, 1)) == pytest.approx(0.8, abs=0.003)
    assert detectable_difference(0.0, 5) is None and detectable_difference(-1.0, 5) is None
    assert detectable_difference(1.0, 1) is None


def test_the_special_function_forms_give_scipy_stats_numbers():
    """stats.py calls scipy.special directly (scipy.stats costs 0.35 s to import): the same p-values and quantiles."""
    from harness.report.stats import t_quantile, t_sf

    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        diffs = rng.normal(rng.normal(0, 0.02), rng.uniform(1e-4, 0.05), size=n).tolist()
        assert paired_p(diffs) == pytest.approx(stats.ttest_rel(diffs, [0.0] * n).pvalue, rel=1e-12, abs=1e-300)
        chance = float(rng.uniform(-0.05, 0.05))
        assert above_chance_p(diffs, chance, True)[0] == pytest.approx(
            stats.ttest_1samp(diffs, chance, alternative="greater").pvalue, rel=1e-12, abs=1e-300)
        assert t_quantile(0.975, n - 1) == pytest.approx(stats.t.ppf(0.975, n - 1), rel=1e-12)
        x = float(rng.normal() * 3)
        assert t_sf(x, n - 1) == pytest.approx(stats.t.sf(x, n - 1), rel=1e-12, abs=1e-300)
        assert correlation_above_zero_p(0.1, n + 10, "test/mcc") == pytest.approx(stats.norm.sf(0.1 * math.sqrt(n + 10)), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 20, 36, 100])
def test_the_table_of_detectable_effects_is_the_computation(n):
    from harness.report.stats import _effects_table, solve_detectable_effect

    assert _effects_table()[n] == pytest.approx(solve_detectable_effect(n), rel=1e-9)


def test_a_board_s_statistics_import_neither_scipy_stats_nor_its_integrator():
    """The quick board's render spent half its time on the resolution's root-finding and a fifth importing scipy.stats."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from harness.report.stats import summarize, paired_p, above_chance_p, detectable_difference; "
            "summarize([0.8, 0.81, 0.79]); paired_p([0.01, 0.02, -0.005]); above_chance_p([0.8, 0.81], 0.13, True); "
            "detectable_difference(0.01, 3); detectable_difference(0.01, 36); "
            "print(sorted(m for m in ('scipy.stats', 'scipy.integrate', 'scipy.optimize') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
