"""The verdict rules: pure functions from our measurement (a summary of paired differences, the board's comparison
of the row with softmax) and the paper's numbers to a verdict. No records, no files: each rule is unit-tested on
its own (tests/harness/test_verdict_rules.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from harness.report.stats import ALPHA

REPRODUCED, NOT_REPRODUCED, OPPOSITE, INCONCLUSIVE, NOT_JUDGED, NOT_RUN_HERE, NOT_RUN_YET = (
    "reproduced", "not reproduced", "opposite effect", "inconclusive", "not judged", "not run here", "not run yet")
NEGATIVE = (NOT_REPRODUCED, OPPOSITE)
"""Verdicts that say a paper's claim does not hold here, by the same rules as a positive one: the mechanism is reported
beside them, never withholding them."""


def paper_delta(claim: Mapping[str, Any]) -> float | None:
    """The paper's Δ in its own units; None for claims without one (direction, baseline, structural)."""
    if claim["kind"] != "gain":
        return None
    return claim["method"]["mean"] - claim["baseline"]["mean"]


@dataclass(frozen=True)
class Verdict(Mapping):
    """A claim's verdict: its word, the detail that says why, the label shown where it differs from the word ("not
    reproduced in this setup"). Reads like the mapping the claims board stores it as (`verdict["detail"]`)."""

    verdict: str
    detail: str | None = None
    label: str | None = None
    in_this_setup: bool = False

    def _items(self) -> dict[str, Any]:
        found = {"verdict": self.verdict, "detail": self.detail}
        if self.label is not None:
            found["label"] = self.label
        if self.in_this_setup:
            found["in_this_setup"] = True
        return found

    def __getitem__(self, name: str) -> Any:
        return self._items()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())


def verdict_for(claim: Mapping[str, Any], measure: Mapping[str, Any], family: Mapping[str, Any] | None = None,
                baselines_differ: bool = False) -> Verdict:
    """The verdict on the claim as stated, by VERDICT_RULE, from our summary (`summarize` of the paired differences, or
    of softmax's values for a baseline claim) and the row's comparison in its table's Holm family ({"p", "p_holm",
    "family"}, board.paired_comparisons). The same rules for both signs of the paper's Δ and of ours; the mechanism is
    reported beside the verdict, never in it. Fewer than 2 pairs leave no CI: inconclusive."""
    low, high = measure["ci_low"], measure["ci_high"]
    if low is None:
        return Verdict(INCONCLUSIVE, f"{measure['n']} finished pair(s): no confidence interval")
    if claim["kind"] == "baseline":
        target = claim["value"]["mean"]
        if low <= target <= high:
            return Verdict(REPRODUCED)
        return Verdict(NOT_REPRODUCED, f"our softmax is {measure['mean'] - target:+.2f} from the paper's {target:.2f}")
    expected = claim["sign"] if claim["kind"] == "direction" else math.copysign(1.0, paper_delta(claim))
    delta = paper_delta(claim)
    excludes_zero = not low <= 0.0 <= high
    p_holm = (family or {}).get("p_holm")
    corrected = excludes_zero and p_holm is not None and p_holm < ALPHA
    alone = None
    if excludes_zero and not corrected:
        alone = (f"significant alone (p {family['p']:.3f}) but not after Holm over the table's {family['family']} comparisons "
                 f"(p {p_holm:.3f})" if p_holm is not None else "significant alone; no family to correct over")
    verdict, detail = INCONCLUSIVE, alone
    if corrected:
        sign = 1.0 if low > 0 else -1.0
        if sign == expected:
            verdict = REPRODUCED
            if delta is not None and not low <= delta <= high:
                size = "smaller" if abs(high if sign > 0 else low) < abs(delta) else "larger"
                detail = f"the sign only: {size} than the paper's Δ, which the CI excludes"
            else:
                detail = None
            detail = ", ".join(part for part in (detail, f"Holm p {p_holm:.3f}") if part)
        else:
            verdict, detail = OPPOSITE, f"Holm p {p_holm:.3f}"
    elif delta is not None and (high < delta if delta > 0 else low > delta):
        verdict = NOT_REPRODUCED
        detail = "the CI excludes the paper's Δ" + (f"; {alone}" if alone else "")
    if verdict in NEGATIVE and baselines_differ:
        return Verdict(verdict, detail, label=f"{verdict} in this setup", in_this_setup=True)
    return Verdict(verdict, detail)
