"""Seed-batched vs lone training on Cora: the same seeds trained both ways, compared seed by seed.

    python -m harness.studies.seed_batch_study [--seeds 20] [--variants softmax,bam-weibull] [--out runs/seed-batch-study]
    python -m harness.studies.seed_batch_study --max-epochs 100000 --lone-from leaderboards --out leaderboards/studies/seed-batch-cora
        (the committed study: paper-gat's Cora records as the lone side, the batched records beside them)

For each variant, seeds 0..S-1 run alone (one `runner.execute` each) and as one seed batch
(`seed_batch.execute_batch`), at the task's full budget. A seed's lone and batched record share one key
(seed batching is execution, not identity), so the two sides write to two stores, <out>/lone and
<out>/batched; a re-run resumes from them. Per variant it prints the mean test accuracy of both sides, the
mean of the per-seed differences, their mean absolute value, and a paired t-test (scipy) of the differences.
Passes (exit 0) when every variant's difference is not significant (p >= 0.05) and mean |Δ| <= 0.3 points.
Full size: 2 variants x 20 seeds x 2 sides of ~200-epoch Cora runs; `--seeds 2 --max-epochs 5` checks it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MAX_MEAN_ABS_DELTA = 0.3
"""Points of test accuracy."""


def compare(lone: list[float], batched: list[float]) -> dict[str, float]:
    """Paired comparison of per-seed accuracies (fractions) -> points."""
    from scipy import stats

    deltas = [100 * (b - a) for a, b in zip(lone, batched)]
    p = float(stats.ttest_rel(batched, lone).pvalue) if len(deltas) > 1 and any(deltas) else 1.0
    return {"lone": 100 * sum(lone) / len(lone), "batched": 100 * sum(batched) / len(batched),
            "mean_delta": sum(deltas) / len(deltas), "mean_abs_delta": sum(abs(d) for d in deltas) / len(deltas),
            "p": p if p == p else 1.0}  # all-equal differences give NaN: no evidence of a difference


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--variants", default="softmax,bam-weibull")
    parser.add_argument("--task", default="cora")
    parser.add_argument("--max-epochs", type=int, default=None, help="override the task's budget (a quick check only)")
    parser.add_argument("--out", default="runs/seed-batch-study")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--lone-from", default=None, metavar="DIR",
                        help="a store whose finished records are the lone side where it has them (leaderboards: the "
                             "committed paper-gat Cora runs have the study's keys at --max-epochs 100000); the rest run into OUT/lone")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 for a paired test")

    from harness.plan.spec import make_spec
    from harness.results.record import Status
    from harness.results.store import RecordStore
    from harness.run.runner import execute, quiet_lightning
    from harness.run.seed_batch import execute_batch

    quiet_lightning()
    params = {"max_epochs": args.max_epochs} if args.max_epochs else {}
    lone_store, batch_store = RecordStore(Path(args.out) / "lone"), RecordStore(Path(args.out) / "batched")
    given = RecordStore(args.lone_from) if args.lone_from else None

    def lone_record(spec):
        if given is not None and given.finished(spec.key):
            return given.read(spec.key)
        if not lone_store.finished(spec.key):
            lone_store.write(execute(spec, data_root=args.data_root))
        return lone_store.read(spec.key)

    passed = True
    print(f"| variant | seeds | lone acc | batched acc | mean Δ | mean abs Δ | paired t p | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for variant in [v.strip() for v in args.variants.split(",")]:
        specs = [make_spec(args.task, variant, seed, params) for seed in range(args.seeds)]
        lone = [lone_record(spec) for spec in specs]
        todo = [s for s in specs if not batch_store.finished(s.key)]
        if todo:
            execute_batch(todo, data_root=args.data_root, on_record=batch_store.write)
        batched = [batch_store.read(s.key) for s in specs]
        failed = [r for r in lone + batched if r.status is not Status.OK]
        if failed:
            print(f"| {variant} | {args.seeds} | | | | | | FAILED: {failed[0].error} |")
            passed = False
            continue
        c = compare([r.metrics["test/acc"]["value"] for r in lone], [r.metrics["test/acc"]["value"] for r in batched])
        ok = c["p"] >= 0.05 and c["mean_abs_delta"] <= MAX_MEAN_ABS_DELTA
        passed &= ok
        print(f"| {variant} | {args.seeds} | {c['lone']:.2f} | {c['batched']:.2f} | {c['mean_delta']:+.2f} | {c['mean_abs_delta']:.2f} | "
              f"{c['p']:.3f} | {'pass' if ok else 'FAIL'} |")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
