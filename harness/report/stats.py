"""The statistics of a board: summaries over seeds, the paired test against the baseline, Holm's correction.

- mean, sample standard deviation (ddof 1) and a `CONFIDENCE` Student-t interval over the seeds that finished;
- against the baseline: a two-sided paired t-test over the seeds both finished, Holm-corrected across the
  variants of a table (one family per table and metric); significant when the Holm p is below `ALPHA`;
- against the task's trivial baseline (a fixed number): a one-sided test that the row is better than it
  (`above_chance_p`; for correlations, that it is above 0 with `correlation_above_zero_p` from one seed),
  and a table's resolution, the smallest paired difference its seeds can detect
  (`detectable_difference`).

The distribution functions come from scipy.special, which is what scipy.stats' t, normal and t-test call (the
same numbers bit for bit: tests/harness/test_stats.py compares them): importing scipy.stats costs 0.35 s more,
a fifth of rendering the quick board, so it is imported only where a function needs more (the binomial test of one
seed, and solving for a resolution not in the table of detectable effects)."""

from __future__ import annotations

import functools
import json
import math
import statistics
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from scipy import special

BASELINE = "softmax"
"""The row every other row of a table is tested against (paired over seeds)."""
ALPHA = 0.05
CONFIDENCE = 0.95
POWER = 0.8
MIN_SEEDS_TO_RANK = 3
"""Below this many finished seeds a row shows its values but gets no rank and no mark: with two seeds a
paired t-test has one degree of freedom, and the spread it rests on is itself a guess."""


def summarize(values: list[float]) -> dict[str, Any]:
    """n, mean, sample std and the Student-t confidence interval of the mean; spread is None below 2 values."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci_low": None, "ci_high": None}
    mean = statistics.fmean(values)
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "ci_low": None, "ci_high": None}
    std = statistics.stdev(values)
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half}


def paired_p(diffs: list[float]) -> float:
    """Two-sided paired t-test p of variant - baseline over seeds. A t-test is undefined when the
    differences do not vary: equal everywhere is no evidence (p = 1), a constant non-zero shift on every
    seed is as strong as evidence gets (p = 0). Float noise in the subtraction (1e-17) must not turn a
    constant shift into a huge but arbitrary t, hence the tolerance."""
    scale = max(1.0, max(abs(d) for d in diffs))
    if max(diffs) - min(diffs) <= 1e-12 * scale:
        return 1.0 if all(abs(d) <= 1e-12 for d in diffs) else 0.0  # all within 1e-12·scale means scale is 1
    t, df = t_statistic(diffs)
    return 2 * t_sf(abs(t), df)


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile (scipy.stats.t.ppf)."""
    return float(special.stdtrit(df, q))


def t_sf(t: float, df: int) -> float:
    """Student's t survival function P(T > t) (scipy.stats.t.sf)."""
    return float(special.stdtr(df, -t))


def t_statistic(values: list[float]) -> tuple[float, int]:
    """(t, degrees of freedom) of a one-sample t-test of `values` against 0, computed as scipy.stats.ttest_1samp
    computes it (mean over the standard error from the ddof-1 variance), so its p-values are scipy's bit for bit."""
    a = np.asarray(values, dtype=np.float64)
    n = a.shape[0]
    variance = np.mean((a - np.mean(a, keepdims=True)) ** 2) * (np.float64(n) / (np.float64(n) - 1))
    return float(np.mean(a) / np.sqrt(variance / n)), n - 1


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment (controls the family-wise error rate without assuming independence).
    Written here because scipy has none (`false_discovery_control` is Benjamini-Hochberg/Yekutieli, which
    controls the false discovery rate instead) and statsmodels would be a heavy dependency for five lines."""
    ordered = sorted(p_values.items(), key=lambda item: item[1])  # tied p-values get the same adjusted value in any order
    m = len(ordered)
    adjusted, running = {}, 0.0
    for i, (name, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - i) * p))
        adjusted[name] = running
    return adjusted


def above_chance_p(values: list[float], chance: float, higher_is_better: bool, test_size: int | None = None) -> tuple[float, str] | None:
    """(p, test) for "this row is better than the trivial baseline's value `chance`", one-sided; None when
    no test applies. With >= 2 values a one-sample t-test over seeds (the baseline is a fixed number, so the
    seeds' spread is the only noise); with one value that is a fraction of `test_size` correct predictions,
    an exact binomial test of its count against the baseline's rate. Constant values have no t statistic:
    all beyond chance is as strong as evidence gets (p = 0), anything else is none (p = 1)."""
    if len(values) >= 2:
        beyond = [(v - chance) if higher_is_better else (chance - v) for v in values]
        scale = max(1.0, max(abs(b) for b in beyond))
        if max(beyond) - min(beyond) <= 1e-12 * scale:
            return (0.0 if min(beyond) > 1e-12 else 1.0), "t"
        t, df = t_statistic(beyond)
        return t_sf(t, df), "t"
    if len(values) == 1 and test_size and 0.0 < chance < 1.0:
        from scipy import stats

        correct = round(values[0] * test_size)
        return float(stats.binomtest(correct, test_size, chance, alternative="greater" if higher_is_better else "less").pvalue), "binomial"
    return None


CORRELATIONS = ("mcc", "pearson", "spearman")
"""Metrics that measure association with the labels: 0 means none, which is what any input-blind predictor
has (a constant prediction leaves them undefined), so they are tested against 0 rather than a baseline value."""


def metric_kind(name: str) -> str:
    """"correlation" for MCC, Pearson and Spearman ("test/mcc", "test/mm_pearson"), else "other"."""
    return "correlation" if name.endswith(CORRELATIONS) else "other"


def correlation_above_zero_p(value: float, n: int, metric: str) -> float | None:
    """One-sided p of "the association is positive" from one correlation over `n` test examples (higher is
    better). MCC (the phi coefficient of two classes): n·MCC² is the chi-square statistic of independence,
    so under independence MCC·√n is about standard normal. Pearson and Spearman: r·√((n−2)/(1−r²)) follows
    Student's t with n−2 degrees of freedom under no correlation, the test scipy's pearsonr and spearmanr
    use. None below 3 examples or for a value outside [−1, 1] (not a correlation)."""
    if n < 3 or not -1.0 <= value <= 1.0:
        return None
    if metric.endswith("mcc"):
        return float(special.ndtr(-value * math.sqrt(n)))  # the standard normal's survival function
    if abs(value) == 1.0:  # a perfect (anti-)correlation: the t statistic is infinite
        return 0.0 if value > 0 else 1.0
    return t_sf(value * math.sqrt((n - 2) / (1.0 - value * value)), n - 2)


def detectable_difference(spread: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest true mean difference a two-sided paired t-test over `n` pairs detects with probability
    `power` at level `alpha`, when the paired differences have standard deviation `spread`. Exact, from the
    noncentral t distribution of the statistic (the normal approximation is far off at 3 seeds). None below
    2 pairs (no spread to test with)."""
    if n < 2 or not spread > 0:
        return None
    return detectable_effect(n, alpha, power) * spread


EFFECTS_FILE = Path(__file__).with_name("detectable_effects.json")
"""detectable_effect at ALPHA and POWER for 2 to 100 pairs, written by `python -m harness.report.stats` (each is a
root-finding over a numerical integral, ~0.1 s, and needs scipy.stats, scipy.integrate and scipy.optimize: half a
second to import); tests/harness/test_stats.py checks the table against the computation."""


@functools.lru_cache(maxsize=None)
def _effects_table() -> dict[int, float]:
    try:
        found = json.loads(EFFECTS_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {int(n): float(effect) for n, effect in found["effects"].items()} if (found["alpha"], found["power"]) == (ALPHA, POWER) else {}


@functools.lru_cache(maxsize=None)
def detectable_effect(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """`detectable_difference` in units of the paired spread: it depends on n, alpha and power alone (the test
    statistic is scale-free), so it is solved once per seed count, or read from EFFECTS_FILE, which holds this
    function's own values for the usual ones. Cached because each root-finding integrates the power a dozen
    times (~0.1 s): uncached, the quick board's eight resolutions were half of its render time."""
    if (alpha, power) == (ALPHA, POWER) and n in _effects_table():
        return _effects_table()[n]
    return solve_detectable_effect(n, alpha, power)


def solve_detectable_effect(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest standardized mean difference a two-sided paired t-test over `n` pairs detects with `power` at
    level `alpha` (see detectable_difference)."""
    from scipy import integrate, stats
    from scipy.optimize import brentq

    df = n - 1
    critical = float(stats.t.ppf(1 - alpha / 2, df))

    def shortfall(effect: float) -> float:
        # P(|T| > critical) for T = (Z + shift) / sqrt(V / df), V ~ chi2(df): integrated over V, because
        # scipy's noncentral t returns NaN in the far tail at df = 1 (two seeds), where this is needed.
        shift = effect * math.sqrt(n)

        def rejecting(v: float) -> float:
            scaled = critical * math.sqrt(v / df)
            return (stats.norm.sf(scaled - shift) + stats.norm.cdf(-scaled - shift)) * stats.chi2.pdf(v, df)

        return float(integrate.quad(rejecting, 0.0, math.inf, limit=200)[0]) - power

    high = 1.0
    while shortfall(high) < 0:
        high *= 2
    return float(brentq(shortfall, 0.0, high, xtol=1e-10))


FRACTIONS = ("acc", "accuracy", "f1", "ece", "pavpu", "bleu4", "rouge_l")
"""Metrics stored as fractions in [0, 1] (accuracies, F1, calibration error, BLEU, ROUGE-L, PAvPU)."""
NON_NEGATIVE = ("loss", "nll", "cider", "perplexity", "time_s")
"""Metrics that cannot go below 0 and have no upper bound (losses, CIDEr-D, times)."""


def metric_range(name: str) -> tuple[float | None, float | None]:
    """(lowest, highest) value `name` can take, None where unbounded: a t interval over few seeds knows nothing
    of these bounds (two seeds of an accuracy gave [-131.5, 200.2] points), so the boards clip to them."""
    if metric_kind(name) == "correlation":
        return (-1.0, 1.0)
    if name.endswith(FRACTIONS):
        return (0.0, 1.0)
    if name.endswith(NON_NEGATIVE):
        return (0.0, None)
    return (None, None)


def clip_interval(low: float | None, high: float | None, bounds: tuple[float | None, float | None]) -> tuple[float | None, float | None, bool]:
    """(low, high, clipped): the interval cut to `bounds`; clipped is True when either end moved."""
    if low is None or high is None:
        return low, high, False
    lowest, highest = bounds
    new_low = low if lowest is None else max(low, lowest)
    new_high = high if highest is None else min(high, highest)
    return new_low, new_high, (new_low, new_high) != (low, high)


def write_effects_table(largest: int = 100) -> Path:
    """EFFECTS_FILE from solve_detectable_effect, for 2 to `largest` pairs (about 10 s)."""
    effects = {str(n): solve_detectable_effect(n) for n in range(2, largest + 1)}
    EFFECTS_FILE.write_text(json.dumps({"alpha": ALPHA, "power": POWER, "effects": effects}, indent=0) + "\n")
    return EFFECTS_FILE


if __name__ == "__main__":
    print(write_effects_table())


@functools.lru_cache(maxsize=256)
def _signed_rank_null(doubled_ranks: tuple[int, ...]) -> tuple[int, ...]:
    """Counts of every attainable sum of the positive ranks (doubled, so tied half-ranks are integers) over the 2^n
    sign patterns the null treats as equally likely: the exact null distribution of Wilcoxon's W+ given the ranks."""
    counts = [1] + [0] * sum(doubled_ranks)
    reach = 0
    for rank in doubled_ranks:
        reach += rank
        for total in range(reach, rank - 1, -1):
            counts[total] += counts[total - rank]
    return tuple(counts)


def wilcoxon_signed_rank_p(diffs: list[float], alternative: str) -> tuple[float, int]:
    """(p, n) of the exact Wilcoxon signed-rank test of `diffs` against a median of 0, one-sided: `alternative`
    'less' (the differences tend below 0) or 'greater'. Zero differences are dropped (Wilcoxon's own rule), ties
    share their average rank and the null is exact given those ranks (every sign pattern equally likely), so no
    normal approximation enters at the seed counts a board has. p = 1 with n = 0 when no difference is non-zero."""
    if alternative not in ("less", "greater"):
        raise ValueError(f"alternative must be 'less' or 'greater', got {alternative!r}")
    nonzero = [d for d in diffs if d != 0.0 and math.isfinite(d)]
    n = len(nonzero)
    if n == 0:
        return 1.0, 0
    order = sorted(range(n), key=lambda i: abs(nonzero[i]))
    doubled = [0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(nonzero[order[j + 1]]) == abs(nonzero[order[i]]):
            j += 1
        for k in range(i, j + 1):
            doubled[order[k]] = i + j + 2  # twice the average of ranks i+1 .. j+1
        i = j + 1
    w_plus = sum(rank for rank, d in zip(doubled, nonzero) if d > 0)
    counts = _signed_rank_null(tuple(sorted(doubled)))
    total = float(2 ** n)
    tail = sum(counts[: w_plus + 1]) if alternative == "less" else sum(counts[w_plus:])
    return min(1.0, tail / total), n
