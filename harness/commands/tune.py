"""`attnbench tune`: Optuna studies of a variant's own knobs."""

from __future__ import annotations

import argparse
import os

from harness.commands import run_and_tune
from harness.commands.arguments import add_common, add_data_parallel, add_logger, add_precision, parse_sets

NAME = "tune"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="tune a variant's own knobs on a task's validation data with Optuna (or every pair of a suite)")
    p.add_argument("task", nargs="?", help="task name (or use --suite)")
    p.add_argument("variant", nargs="?", help="variant name (or use --suite)")
    p.add_argument("--suite", default=None, help="tune every (task, variant) pair of this suite, each with the same budget")
    p.add_argument("--trials", type=int, default=20, help="finished trials per study (default: 20)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: sqlite:///<runs-dir>/optuna.db; "
                   "postgresql://... on a cluster, journal:<file> on a shared filesystem)")
    p.add_argument("--timeout", type=float, default=None, help="stop starting trials after this many seconds")
    p.add_argument("--tune-optimizer", action="store_true", help="also tune the task's lr and weight_decay")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="task parameter held fixed while tuning")
    p.add_argument("--promote", action="store_true",
                   help="after tuning, copy the result from <runs-dir>/params/ to --params-dir (the committed parameters); "
                        "refused when the one there was tuned with a larger budget, unless --force")
    p.add_argument("--force", action="store_true", help="with --promote: replace a result tuned with a larger budget")
    p.add_argument("--params-dir", default="leaderboards/params",
                   help="where --promote copies the best parameters (default: leaderboards/params); tune itself writes "
                        "only <runs-dir>/params/<task>/<variant>.yaml, beside its study")
    p.add_argument("--dry-run", action="store_true", help="print the studies (finished trials of --trials, estimated time) and exit; writes nothing")
    add_precision(p)
    add_logger(p)
    add_data_parallel(p)
    add_common(p)
    return p


def main(args) -> int:
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.plan.tuned import promote, runs_params_dir
    from harness.results.store import runs_dir
    from harness.studies.tune import TUNE_SEED, export, require_a_search_space, tune, variant_knobs

    params, attention = parse_sets(args.set)
    if attention:
        raise ValueError("tune searches the variant's own knobs: attention.* cannot be fixed with --set")
    if args.force and not args.promote:
        raise ValueError("--force only applies with --promote (replace promoted parameters tuned with a larger budget)")
    if args.suite:
        if args.task or args.variant:
            raise ValueError("give either TASK VARIANT or --suite, not both")
        suite_plan = plan(load_suite(args.suite), args.data_root)
        suite_plan.require_data()
        if not args.dry_run:
            suite_plan.require_checkpoints()
        pairs = sorted({(s.task, s.variant, tuple(sorted(s.params.items()))) for s in suite_plan.specs})
        jobs = [(task, variant, {**dict(suite_params), **params}) for task, variant, suite_params in pairs]
        if not args.tune_optimizer:
            knobless = sorted({variant for _, variant, _ in jobs if not variant_knobs(variant)})
            if knobless:
                print(f"attnbench tune: not tuning {', '.join(knobless)}: no options of their own to search "
                      "(--tune-optimizer also searches the task's lr and weight_decay)")
            jobs = [job for job in jobs if job[1] not in knobless]
    elif args.task and args.variant:
        jobs = [(args.task, args.variant, params)]
        run_and_tune.plan_command_line_runs(args, [(args.task, args.variant, TUNE_SEED, params)], {"command": "tune"})
        require_a_search_space(args.variant, args.tune_optimizer)
    else:
        raise ValueError("name a TASK and a VARIANT (attnbench tune cora bam-weibull) or a --suite")
    from modules.tasks import get_task

    with run_and_tune.values_from_flags():
        for task, _, job_params in jobs:
            get_task(task).params(job_params)
    if args.dry_run:
        return _print_tune_plan(args, jobs)
    if args.strategy == "ddp" and args.storage and args.storage.startswith("journal:"):
        raise ValueError("pruning data-parallel trials needs an RDB storage (sqlite:///... or postgresql://...), not a journal file")
    distribution, _ = run_and_tune.start_processes(args)
    written = runs_params_dir(runs_dir(args.runs_dir))
    for task, variant, job_params in jobs:
        result = tune(task, variant, trials=args.trials, params=job_params, storage=args.storage, timeout=args.timeout,
                      tune_optimizer=args.tune_optimizer, runs=args.runs_dir, data_root=args.data_root, cache_dir=args.cache_dir,
                      distribution=distribution, precision=args.precision)
        if result is None:  # a DDP rank other than 0, or the study's last trials run in other processes
            continue
        print(f"attnbench tune: best parameters written to {export(result, written)}")
        if args.promote:
            print(f"attnbench tune: promoted to {promote(task, variant, written, args.params_dir, force=args.force)}")
        else:
            print(f"attnbench tune: `bench --params tuned --params-dir {written}` runs them; "
                  f"`attnbench tune {task} {variant} --promote` (same flags) copies them to {args.params_dir}")
    return 0


def _print_tune_plan(args, jobs) -> int:
    """One row per study: its finished trials of --trials, read from the storage only where it exists."""
    from harness.report.preview import PreviewRow, format_table
    from harness.studies.tune import TUNE_SEED

    rows = []
    for task, variant, job_params in jobs:
        name, finished, mean_trial_s = study_progress(task, variant, job_params, args.storage, args.runs_dir, args.tune_optimizer,
                                                      args.precision)
        remaining = max(0, args.trials - finished)
        status = "finished" if remaining == 0 else "pending"
        rows.append(PreviewRow(task, f"{variant} ({finished}/{args.trials} trials)", TUNE_SEED, name, status,
                               mean_trial_s * remaining if mean_trial_s and remaining else None))
    print(format_table(rows, noun="studies"))
    return 0


def study_progress(task: str, variant: str, params, storage: str | None, runs: str | None, tune_optimizer: bool,
                   precision: str = "32"):
    """(study name, finished trials, mean seconds per finished trial or None) without creating anything: a
    default SQLite file or a journal file that is not there yet means a study with no trials."""
    import dataclasses

    from harness.results.store import runs_dir
    from harness.studies.tune import open_storage, study_name
    from modules.tasks import get_task

    name = study_name(task, variant, dataclasses.asdict(get_task(task).params(params)), tune_optimizer)
    name += f"/{precision}" if precision != "32" else ""  # as tune() names it
    if storage is None:
        path = runs_dir(runs) / "optuna.db"
        if not path.is_file():
            return name, 0, None
        storage = f"sqlite:///{path}"
    elif storage.startswith("journal:") and not os.path.isfile(os.path.expanduser(storage.removeprefix("journal:"))):
        return name, 0, None  # opening a journal creates its file
    import optuna
    from optuna.trial import TrialState

    try:
        study = optuna.load_study(study_name=name, storage=open_storage(storage))
    except KeyError:  # no such study in the storage yet
        return name, 0, None
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    seconds = [t.duration.total_seconds() for t in done if t.duration is not None]
    return name, len(done), (sum(seconds) / len(seconds) if seconds else None)
