"""Did the alignment regularisers align anything on paper-gat? (leaderboards/studies/alignment-mechanism.md)

Reads the committed paper-gat records (or `--runs-dir`) and prints, per task and alignment row, over the seeds whose
records carry the evidence at the evaluated weights (the test pass on the weights the stopping rule kept):
the discriminator's accuracy there (align-gan), the query/key distance (`qk_distance`, relative sliced Wasserstein-1;
`test/diag/*`, or the test pass's `test/attn/*` in records made before that key, never a training or validation value)
and its ratio to softmax's at the same seed, the figure the claims board's mechanism rule reads
(modules/attention/mechanism.py), the share of the seeds where that ratio is under the rule's 0.8, and softmax's
attention entropy as a share of the uniform distribution's (how much the host's attention expresses at all), and the
declared mechanism test's uncorrected p (one-sided Wilcoxon on the log ratios; the claims page corrects it over the page).
Medians with the range over seeds. Records without the evidence are counted apart, never read at their last epoch.

    python -m harness.studies.alignment_mechanism [--runs-dir leaderboards] [--data-root ../shared/data]
"""

from __future__ import annotations

import argparse
import statistics

from harness.report.evidence import evidence_record
from harness.report.mechanism_test import log_ratios, wilcoxon_of_ratios
from harness.results.store import RecordStore
from modules.attention.mechanism import evaluated

ROWS = ("softmax", "align-gan", "align-ct-paper-lambda", "align-ct", "align-ot")


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def summary(the_plan, store: RecordStore) -> list[dict]:
    loaded = store.load(s.key for s in the_plan.specs)
    records = {**loaded.records, **{k: evidence_record(c) for k, c in loaded.executions.items() if c}}
    by_row: dict[tuple[str, str], dict[int, object]] = {}
    for spec in the_plan.specs:
        if spec.display in ROWS and spec.key in records and not spec.extra.get("tuning"):
            by_row.setdefault((spec.task, spec.display), {})[spec.seed] = records[spec.key]
    out = []
    for (task, row), seeds in sorted(by_row.items()):
        base = by_row.get((task, "softmax"), {})
        discs, finals, ratios, uniform = [], [], [], []
        for seed, record in seeds.items():
            values = record.diagnostics or {}
            if evaluated(record, "disc_acc") is not None:
                discs.append(evaluated(record, "disc_acc"))
            if values.get("test/attn/uniform_entropy"):
                uniform.append(values["test/attn/entropy"] / values["test/attn/uniform_entropy"])
            qk = evaluated(record, "qk_distance")
            if qk is None:
                continue
            finals.append(qk)
            reference = evaluated(base[seed], "qk_distance") if seed in base else None
            if reference and row != "softmax":
                ratios.append(qk / reference)
        logs = log_ratios({seed: evaluated(r, "qk_distance") for seed, r in seeds.items()},
                          {seed: evaluated(r, "qk_distance") for seed, r in base.items()}) if row != "softmax" else {}
        out.append({"task": task, "row": row, "seeds": len(finals), "without": len(seeds) - len(finals), "disc": discs,
                    "qk": finals, "qk_ratio": ratios, "active": sum(1 for r in ratios if r < 0.8), "uniform": uniform,
                    "p": wilcoxon_of_ratios(logs, "less")[0] if logs else None})
    return out


def table(rows: list[dict]) -> str:
    lines = ["| task | row | seeds with evidence (without) | discriminator's accuracy | qk_distance | ÷ softmax's, same seed | "
             "seeds under x0.8 | entropy ÷ uniform's | one-sided Wilcoxon p (closer than softmax's) |",
             "|---|---|---:|---|---|---|---:|---|---:|"]
    for r in rows:
        active = f"{r['active']} of {len(r['qk_ratio'])}" if r["qk_ratio"] else "—"
        lines.append(f"| {r['task']} | {r['row']} | {r['seeds']} ({r['without']}) | {_spread(r['disc'])} | {_spread(r['qk'])} | "
                     f"{_spread(r['qk_ratio'])} | {active} | {_spread(r['uniform'])} | "
                     f"{'—' if r.get('p') is None else format(r['p'], '.3f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", default="leaderboards")
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args(argv)
    print(table(summary(plan(load_suite("paper-gat"), args.data_root), RecordStore(args.runs_dir))))


if __name__ == "__main__":
    main()
