"""The statistics of a board: summaries over seeds, the paired test against the baseline, Holm's correction.

- mean, sample standard deviation (ddof 1) and a `CONFIDENCE` Student-t interval over the seeds that finished;
- against the baseline: a two-sided paired t-test over the seeds both finished, Holm-corrected across the
  variants of a table (one family per table and metric); significant when the Holm p is below `ALPHA`."""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping

from scipy import stats

ALPHA = 0.05
CONFIDENCE = 0.95


def summarize(values: list[float]) -> dict[str, Any]:
    """n, mean, sample std and the Student-t confidence interval of the mean; spread is None below 2 values."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci_low": None, "ci_high": None}
    mean = statistics.fmean(values)
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "ci_low": None, "ci_high": None}
    std = statistics.stdev(values)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half}


def paired_p(diffs: list[float]) -> float:
    """Two-sided paired t-test p of variant - baseline over seeds. A t-test is undefined when the
    differences do not vary: equal everywhere is no evidence (p = 1), a constant non-zero shift on every
    seed is as strong as evidence gets (p = 0). Float noise in the subtraction (1e-17) must not turn a
    constant shift into a huge but arbitrary t, hence the tolerance."""
    scale = max(1.0, max(abs(d) for d in diffs))
    if max(diffs) - min(diffs) <= 1e-12 * scale:
        return 1.0 if all(abs(d) <= 1e-12 * scale for d in diffs) else 0.0
    return float(stats.ttest_rel(diffs, [0.0] * len(diffs)).pvalue)


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment (controls the family-wise error rate without assuming independence).
    Written here because scipy has none (`false_discovery_control` is Benjamini-Hochberg/Yekutieli, which
    controls the false discovery rate instead) and statsmodels would be a heavy dependency for five lines."""
    ordered = sorted(p_values.items(), key=lambda item: (item[1], item[0]))
    m = len(ordered)
    adjusted, running = {}, 0.0
    for i, (name, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - i) * p))
        adjusted[name] = running
    return adjusted
