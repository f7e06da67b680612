"""Did the alignment regularisers align anything on paper-gat? (issue 35; README "align-gan on graphs").

Reads the committed paper-gat records (or `--runs-dir`) and prints, per task and alignment row, over the seeds that
recorded the mechanism diagnostics: the discriminator's peak training accuracy (align-gan), the final validation
query/key distance (`qk_distance`, relative sliced Wasserstein-1) and its ratio to softmax's at the same seed, the
figure the claims board's mechanism rule reads (modules/attention/mechanism.py). Medians with the range over seeds.

    python -m harness.studies.alignment_mechanism [--runs-dir leaderboards] [--data-root ../shared/data]
"""

from __future__ import annotations

import argparse
import statistics

from harness.results.store import RecordStore, diagnosed_execution

ROWS = ("softmax", "align-gan", "align-ct-paper-lambda", "align-ct", "align-ot")


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def summary(the_plan, store: RecordStore) -> list[dict]:
    loaded = store.load(s.key for s in the_plan.specs)
    records = {**loaded.records, **{k: diagnosed_execution(c) for k, c in loaded.executions.items()}}
    by_row: dict[tuple[str, str], dict[int, object]] = {}
    for spec in the_plan.specs:
        if spec.display in ROWS and spec.key in records and not spec.extra.get("tuning"):
            by_row.setdefault((spec.task, spec.display), {})[spec.seed] = records[spec.key]
    out = []
    for (task, row), seeds in sorted(by_row.items()):
        base = by_row.get((task, "softmax"), {})
        peaks, finals, ratios = [], [], []
        for seed, record in seeds.items():
            history, final = record.history or {}, record.diagnostics or {}
            disc = [v for v in history.get("diag/disc_acc") or [] if v is not None]
            if disc:
                peaks.append(max(disc))
            qk = final.get("val/diag/qk_distance")
            if qk is None:
                continue
            finals.append(qk)
            reference = (base.get(seed).diagnostics or {}).get("val/diag/qk_distance") if seed in base else None
            if reference and row != "softmax":
                ratios.append(qk / reference)
        out.append({"task": task, "row": row, "seeds": len(finals), "disc_peak": peaks, "qk": finals, "qk_ratio": ratios})
    return out


def table(rows: list[dict]) -> str:
    lines = ["| task | row | seeds with diagnostics | discriminator's peak accuracy | final val qk_distance | ÷ softmax's, same seed |",
             "|---|---|---:|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['row']} | {r['seeds']} | {_spread(r['disc_peak'])} | {_spread(r['qk'])} | {_spread(r['qk_ratio'])} |")
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
