"""The λ dose-response page (leaderboards/dose-response.md): harness/claims.yaml `dose_response` against its suite's
records. Per variant, task and λ: the q/k distance ratio to softmax's at the same seed (geometric mean, with the
t-interval of the mean log ratio) and the declared mechanism test; Δ accuracy against softmax (mean paired
difference, paired-t CI) and its paired test; then the finding by the declared rules, first that holds:

- accuracy-rises: Δ accuracy > 0 at some λ (Holm over the page's accuracy tests) -> the claim holds at that λ;
- mechanism-only: the distance falls at some λ (the mechanism test, Holm over the page's mechanism tests) and
  accuracy rises at none -> not reproduced, mechanism active;
- structural: the distance falls at no λ -> the regulariser cannot move queries and keys through GAT's additive score.

Seeds still running are named: a level with fewer records than planned is interim, and a finding resting on one is
marked so. Everything is built once into frozen values and rendered from them alone."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from harness.report.mechanism_test import MechanismTest, corrected, log_ratios, median_ratio, wilcoxon_of_ratios
from harness.report.stats import holm, paired_p, summarize
from harness.results.record import Record, Status

PAGE = "dose-response.md"
ACCURACY_RISES, MECHANISM_ONLY, STRUCTURAL, NOT_YET = "accuracy-rises", "mechanism-only", "structural", "not run yet"


@dataclass(frozen=True)
class Interval:
    mean: float | None
    low: float | None
    high: float | None
    n: int


@dataclass(frozen=True)
class DoseLevel:
    """One λ of one variant on one task."""

    label: str
    lam: float
    planned: int
    recorded: int
    ratio: Interval
    mechanism: MechanismTest | None
    delta: Interval
    p: float | None
    p_holm: float | None = None
    declared_before: bool = False


@dataclass(frozen=True)
class DoseCell:
    variant: str
    task: str
    levels: tuple[DoseLevel, ...]
    rule: str
    finding: str
    interim: bool


@dataclass(frozen=True)
class DoseBoard:
    suite: str
    baseline: str
    metric: str
    declared: Any
    cells: tuple[DoseCell, ...]
    accuracy_family: int
    mechanism_family: int


def finding(levels: tuple[DoseLevel, ...], alpha: float) -> tuple[str, str]:
    """(rule, words) by the declared finding rules, first that holds. Until every λ has paired seeds the finding is
    NOT_YET (naming the λ without records), unless accuracy already rises at a recorded λ: no later level can undo that."""
    rising = [level for level in levels if level.p_holm is not None and level.p_holm < alpha and (level.delta.mean or 0) > 0]
    if rising:
        return ACCURACY_RISES, f"the claim holds at λ = {rising[0].lam:g} (Δ accuracy {_signed(rising[0].delta.mean)}, Holm p {rising[0].p_holm:.3f})"
    missing = [level for level in levels if not level.delta.n]
    if missing:
        return NOT_YET, f"no finding yet: λ = {', '.join(f'{level.lam:g}' for level in missing)} not recorded"
    falling = [level for level in levels if level.mechanism is not None and level.mechanism.moved]
    if falling:
        return MECHANISM_ONLY, (f"not reproduced, mechanism active: queries and keys moved closer at λ = "
                                f"{', '.join(f'{level.lam:g}' for level in falling)}, and accuracy rose at no λ")
    return STRUCTURAL, (f"the distance fell at no λ up to {max(level.lam for level in levels):g} after the page's Holm correction: "
                        "by the declared rule, the regulariser cannot move queries and keys through GAT's additive score here")


def _interval(values: list[float]) -> Interval:
    found = summarize(values)
    return Interval(found["mean"], found["ci_low"], found["ci_high"], found["n"])


def _metric(record: Record | None, metric: str) -> float | None:
    if record is None or record.status is not Status.OK or metric not in (record.metrics or {}):
        return None
    value = record.metrics[metric].get("value")
    return float(value) * 100 if value is not None and math.isfinite(float(value)) else None


def build_dose_board(spec, the_plan, records: Mapping[str, Record], evidence: Mapping[str, Record], mechanism_spec) -> DoseBoard:
    """The page's model from the suite's plan, its records (the metrics) and evidence records (the diagnostics)."""
    from modules.attention.mechanism import evaluated

    read = {**records, **evidence}
    cells = []
    for task in [t.name for t in the_plan.suite.tasks if any(s.task == t.name for s in the_plan.specs)]:
        base_specs = [s for s in the_plan.specs if s.task == task and s.display == spec.baseline]
        base_acc = {s.seed: _metric(records.get(s.key), spec.metric) for s in base_specs}
        base_diag = {s.seed: evaluated(read[s.key], spec.diagnostic) for s in base_specs if s.key in read
                     and read[s.key].status is Status.OK}
        for variant, rows in spec.rows.items():
            levels = []
            for label, lam in rows.items():
                own = [s for s in the_plan.specs if s.task == task and s.display == label]
                acc = {s.seed: _metric(records.get(s.key), spec.metric) for s in own}
                shared = [seed for seed, value in sorted(acc.items()) if value is not None and base_acc.get(seed) is not None]
                diffs = [acc[seed] - base_acc[seed] for seed in shared]
                ratios = log_ratios({s.seed: evaluated(read[s.key], spec.diagnostic) for s in own if s.key in read
                                     and read[s.key].status is Status.OK}, base_diag)
                logs = _interval(list(ratios.values()))
                ratio = Interval(*(math.exp(v) if v is not None else None for v in (logs.mean, logs.low, logs.high)), logs.n)
                judged = [records[s.key] for s in own if s.key in records]
                before = bool(judged) and all(not spec.declared.after(r.finished) for r in judged)
                test = None
                if ratios:
                    p, _ = wilcoxon_of_ratios(ratios, "less")
                    n = len(ratios)
                    test = MechanismTest(spec.diagnostic, spec.baseline, "less", n, len(own) - len(ratios), median_ratio(ratios), p,
                                         mechanism_spec.alpha if mechanism_spec else spec.alpha, spec.declared.commit, not before)
                levels.append(DoseLevel(label, lam, len(own), len(judged), ratio, test, _interval(diffs),
                                        paired_p(diffs) if len(diffs) >= 2 else None, declared_before=before))
            cells.append((variant, task, levels))
    # Holm over the page: the accuracy tests together, the mechanism tests together
    accuracy = holm({(v, t, level.label): level.p for v, t, levels in cells for level in levels if level.p is not None})
    mechanism = corrected(((v, t, level.label), level.mechanism) for v, t, levels in cells for level in levels if level.mechanism)
    built = []
    for variant, task, levels in cells:
        levels = tuple(replace(level, p_holm=accuracy.get((variant, task, level.label)),
                               mechanism=mechanism.get((variant, task, level.label), level.mechanism)) for level in levels)
        rule, words = finding(levels, spec.alpha)
        built.append(DoseCell(variant, task, levels, rule, words, any(level.recorded < level.planned for level in levels)))
    # A structural finding names its limits: where the same variant did move the distance on another task of the page,
    # the host's score alone cannot be why, and the page says so beside the declared words.
    for index, cell in enumerate(built):
        if cell.rule != STRUCTURAL:
            continue
        elsewhere = [other.task for other in built if other.variant == cell.variant and other.task != cell.task
                     and any(level.mechanism is not None and level.mechanism.moved for level in other.levels)]
        if elsewhere:
            built[index] = replace(cell, finding=cell.finding + f" (though on {', '.join(elsewhere)} the same variant in the same host "
                                                                "did move them, so GAT's score alone does not explain it)")
    return DoseBoard(spec.suite, spec.baseline, spec.metric, spec.declared, tuple(built), len(accuracy),
                     sum(1 for test in mechanism.values() if test.n > 0))


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def _fixed(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def finding_sentence(board: DoseBoard, lead: bool = True) -> str:
    """The page's one sentence: each variant and task's finding, those resting on seeds still running marked interim."""
    parts = [f"`{cell.variant}` on {cell.task}: " + ("interim, on the seeds recorded so far: " if cell.interim and cell.rule != NOT_YET else "")
             + cell.finding for cell in board.cells]
    return ("**Finding.** " if lead else "") + "; ".join(parts) + "."


def render_dose_markdown(board: DoseBoard) -> str:
    out = io.StringIO()
    out.write("# Alignment attention: a λ dose-response on GAT\n\n")
    out.write(f"{finding_sentence(board)}\n\n")
    out.write(f"Generated by `attnbench leaderboard --claims` (`make leaderboard`) from `harness/claims.yaml` (`dose_response`, declared at "
              f"{board.declared.commit}, {board.declared.at[:10]}) and the records of suite `{board.suite}`; do not edit by hand.\n\n")
    out.write(f"Per λ: **q/k distance ÷ softmax's** is the geometric mean over seeds of the variant's query/key distance at its "
              f"evaluated weights over `{board.baseline}`'s at the same seed, with the 95% t-interval of the mean log ratio; "
              f"**mechanism p** is the declared one-sided Wilcoxon signed-rank test of the log ratios (the distance is lower), "
              f"Holm over the page's {board.mechanism_family} mechanism tests. **Δ accuracy** is the mean paired difference "
              f"from `{board.baseline}` in `{board.metric}` (points), with its 95% paired-t CI; **p** the paired t-test, Holm over "
              f"the page's {board.accuracy_family} accuracy tests. **declared before** says whether the test was declared before "
              "the level's runs finished (the paper's λ rows are paper-gat's earlier runs: their tests are post hoc). Finding "
              "rules, first that holds: accuracy rises at some λ (the claim holds there); the distance falls at some λ and "
              "accuracy at none (not reproduced, mechanism active); the distance falls at no λ (structural: the regulariser "
              "cannot act through GAT's additive score here).\n\n")
    for cell in board.cells:
        out.write(f"## `{cell.variant}` on {cell.task}\n\n")
        out.write(f"Finding ({cell.rule}): {cell.finding}" + (". Interim: some seeds are still running; the finding may change when "
                                                               "they are in." if cell.interim else ".") + "\n\n")
        out.write("| λ | row | seeds recorded | q/k distance ÷ softmax's [95% CI] | seeds paired | mechanism p (Holm) | "
                  "Δ accuracy [95% CI] | n | p (Holm) | declared before |\n")
        out.write("|---:|---|---:|---|---:|---|---|---:|---|---|\n")
        for level in cell.levels:
            ratio = (f"×{level.ratio.mean:.3f} [{_fixed(level.ratio.low)}, {_fixed(level.ratio.high)}]" if level.ratio.mean is not None else "—")
            test = level.mechanism
            mech = f"{test.p:.3f} ({_fixed(test.p_holm)})" if test is not None and test.n else "—"
            delta = (f"{_signed(level.delta.mean)} [{_signed(level.delta.low)}, {_signed(level.delta.high)}]"
                     if level.delta.mean is not None else "—")
            p = f"{level.p:.3f} ({_fixed(level.p_holm)})" if level.p is not None else "—"
            out.write(f"| {level.lam:g} | `{level.label}` | {level.recorded} of {level.planned} | {ratio} | "
                      f"{test.n if test else 0} | {mech} | {delta} | {level.delta.n} | {p} | "
                      f"{'yes' if level.declared_before else 'no (post hoc)' if level.recorded else '—'} |\n")
        out.write("\n")
    return out.getvalue()


def dose_board_from_store(spec, runs, data_root, mechanism_spec) -> DoseBoard:
    """Plan the declared suite and read its records and evidence from the store `runs` (report/loading.py)."""
    from harness.report.loading import load_suite_records, open_store

    loaded = load_suite_records(spec.suite, open_store(runs), data_root)
    return build_dose_board(spec, loaded.plan, loaded.records, loaded.evidence, mechanism_spec)
