"""The declared mechanism test (harness/claims.yaml `mechanism_test`) and its null.

Did a variant move its diagnostic away from what the same host gives without it? Per seed, the log ratio of the
variant's diagnostic at its evaluated weights to the baseline's (softmax) at the same task and seed; a one-sided
Wilcoxon signed-rank test of those log ratios against 0, in the direction the kernel's rule declares ('below-baseline':
less), Holm-corrected over every mechanism test on the page. A seed counts only where both records carry the value at
their evaluated weights (report/evidence.py): seeds without evidence are named, never filled from training curves.

Its null: softmax against softmax. Each draw shuffles a task's softmax seeds with the declared rng seed and pairs the
first half with the second; the share of draws in which the uncorrected one-sided test rejects is the test's
false-active rate on these data, which the page shows beside the declared ceiling."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping

from harness.report.stats import holm, wilcoxon_signed_rank_p

ALTERNATIVES = {"below-baseline": "less"}
"""The kernel rules that compare with the baseline's value, and the direction their test takes."""


@dataclass(frozen=True)
class MechanismTest:
    """One row's mechanism test: the paired log ratios' Wilcoxon p, and after the page's Holm correction, p_holm and
    whether the diagnostic moved (p_holm < alpha). `post_hoc`: the test was declared after these records finished."""

    diagnostic: str
    baseline: str
    alternative: str
    n: int
    without: int
    median_ratio: float | None
    p: float
    alpha: float
    declared: str
    post_hoc: bool
    p_holm: float | None = None

    @property
    def moved(self) -> bool | None:
        return None if self.p_holm is None or self.n == 0 else self.p_holm < self.alpha


def log_ratios(own: Mapping[int, float | None], base: Mapping[int, float | None]) -> dict[int, float]:
    """Per seed both carry a positive value: log(own / base)."""
    return {seed: math.log(value / base[seed]) for seed, value in sorted(own.items())
            if value is not None and value > 0 and base.get(seed) is not None and base[seed] > 0}


def wilcoxon_of_ratios(ratios: Mapping[int, float], alternative: str) -> tuple[float, int]:
    """(p, n): the one-sided Wilcoxon signed-rank test of the log ratios against 0."""
    return wilcoxon_signed_rank_p(list(ratios.values()), alternative)


def corrected(tests: Iterable[tuple[str, MechanismTest]]) -> dict[str, MechanismTest]:
    """Holm over every test given (the page's family), keyed as given; a test without seeds stays uncorrected."""
    tests = dict(tests)
    ready = {key: test.p for key, test in tests.items() if test.n > 0}
    adjusted = holm(ready)
    return {key: _with(test, p_holm=adjusted.get(key)) for key, test in tests.items()}


def _with(test: MechanismTest, **changes) -> MechanismTest:
    from dataclasses import replace

    return replace(test, **changes)


def median_ratio(ratios: Mapping[int, float]) -> float | None:
    return math.exp(statistics.median(ratios.values())) if ratios else None


@dataclass(frozen=True)
class NullRate:
    """The test's false-active rate under softmax against softmax on one task."""

    suite: str
    task: str
    seeds: int
    pairs: int
    draws: int
    rejected: int
    ceiling: float

    @property
    def rate(self) -> float:
        return self.rejected / self.draws if self.draws else 0.0

    @property
    def within(self) -> bool:
        return self.rate <= self.ceiling


def null_rate(values: Mapping[int, float], alternative: str, alpha: float, draws: int, rng_seed: int) -> tuple[int, int]:
    """(rejected draws, pairs per draw): each draw shuffles the seeds (random.Random(rng_seed), one generator for the
    task's draws) and pairs the first half with the second, log(first / second), and counts a rejection of the
    uncorrected one-sided test at `alpha`."""
    seeds = sorted(seed for seed, value in values.items() if value is not None and value > 0)
    half = len(seeds) // 2
    if half < 1:
        return 0, 0
    rng = random.Random(rng_seed)
    rejected = 0
    for _ in range(draws):
        order = seeds[:]
        rng.shuffle(order)
        diffs = [math.log(values[a] / values[b]) for a, b in zip(order[:half], order[half:2 * half])]
        p, n = wilcoxon_signed_rank_p(diffs, alternative)
        rejected += n > 0 and p < alpha
    return rejected, half
