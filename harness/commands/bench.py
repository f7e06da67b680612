"""`attnbench bench`: run a suite and write its leaderboard."""

from __future__ import annotations

import argparse
import sys

from harness.commands.arguments import add_common, add_launcher_arguments, add_logger, add_precision

NAME = "bench"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="run a suite (skipping finished runs) and write its leaderboard")
    p.add_argument("--suite", default="quick", help="built-in suite name or a suite .yaml path (default: quick)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: --workers-per-gpu on each GPU, else one per CPU core)")
    p.add_argument("--devices", dest="bench_devices", type=int, default=None, help=argparse.SUPPRESS)  # renamed: see arguments.RENAMED
    p.add_argument("--workers-per-gpu", type=int, default=None, metavar="K",
                   help="K workers share each GPU (default: what the suite's tasks declare from a measurement, e.g. 4 for "
                        "launch-bound Cora, 1 for text; --dry-run prints the rule)")
    p.add_argument("--retry-failed", action="store_true", help="run failed runs again instead of keeping their records")
    p.add_argument("--variants", default=None, metavar="PATTERN", help="only the rows whose board label matches one of these comma-separated globs, e.g. 'softmax,bam-*' "
                        "(a variant's name also selects its '(tuned)' row; 'bam-weibull (tuned)' selects that row alone)")
    p.add_argument("--leaderboard-dir", default=None,
                   help="where the board of your runs goes (default: <runs-dir>/leaderboard; the committed boards in leaderboards/ "
                        "change only through `make leaderboard`, from the committed records)")
    p.add_argument("--params", choices=["default", "tuned"], default="default",
                   help="tuned: also run each variant with its tuned parameters (from --params-dir), as its own row")
    p.add_argument("--params-dir", default="leaderboards/params")
    p.add_argument("--dry-run", action="store_true", help="print the plan (every run, finished/failed/pending, estimated time) and exit; writes nothing")
    p.add_argument("--force", action="store_true", help="write the leaderboard even if it has fewer finished records than the board on disk")
    p.add_argument("--no-seed-batch", dest="seed_batch", action="store_false",
                   help="run every seed in its own run (default: the seeds of one configuration train as one seed-batched "
                        "model where the task allows, split over the workers)")
    add_precision(p)
    add_logger(p)
    add_launcher_arguments(p)
    add_common(p)
    return p


def main(args) -> int:
    from harness.bench import run_suite
    from harness.run.job_array import options_from_args
    from harness.run.worker_pool import default_workers

    if args.workers_per_gpu is not None and args.workers_per_gpu < 1:
        raise ValueError(f"--workers-per-gpu must be at least 1, got {args.workers_per_gpu}")
    rule = choose_workers_per_gpu(args)
    if args.workers is None:
        args.workers = default_workers(args.workers_per_gpu)
    if args.dry_run:
        return _print_bench_plan(args, rule)
    outcome = run_suite(
        args.suite,
        workers=args.workers,
        runs=args.runs_dir,
        data_root=args.data_root,
        cache_dir=args.cache_dir,
        plugin_files=args.plugin,
        retry_failed=args.retry_failed,
        variant_filter=args.variants,
        leaderboard_dir=args.leaderboard_dir,
        tuned_params_dir=args.params_dir if args.params == "tuned" else None,
        launcher=args.launcher,
        submitit_options=options_from_args(args),
        precision=args.precision,
        force_board=args.force,
        workers_per_gpu=args.workers_per_gpu,
        seed_batch=args.seed_batch,
    )
    if outcome.get("failed_in_selection"):
        print(f"attnbench: {outcome['failed_in_selection']} run(s) of the selection failed (see the leaderboard's errors); exit status 1",
              file=sys.stderr)
        return 1
    return 0


def choose_workers_per_gpu(args) -> str:
    """Set args.workers_per_gpu when the command line left it out, from the suite's tasks (machine.py
    workers_per_gpu_rule), and check --workers against it; returns the rule in one line."""
    from harness.plan.machine import Machine, workers_per_gpu_rule
    from harness.plan.suite import load_suite
    from modules.tasks import get_task

    machine = Machine.here()
    if args.workers_per_gpu is not None:
        rule = f"{args.workers_per_gpu} per GPU (--workers-per-gpu)" if machine.gpus else "no GPU: one worker per CPU core"
    elif args.launcher != "workers":
        args.workers_per_gpu, rule = 1, f"one GPU per submitit task ({args.launcher})"
    else:
        tasks = {task.name for task in load_suite(args.suite).tasks}
        args.workers_per_gpu, rule = workers_per_gpu_rule({name: get_task(name).runs_per_gpu for name in tasks}, machine)
    if args.workers is not None and args.launcher == "workers":
        problem = machine.worker_problem(args.workers, args.workers_per_gpu)
        if problem:
            raise ValueError(f"{problem} ({rule})")
    return rule


def _print_bench_plan(args, rule: str = "") -> int:
    from harness.plan.planner import plan
    from harness.report.preview import NO_CHECKPOINT, format_table, preview_runs, read_records, this_device
    from harness.plan.suite import load_suite
    from harness.results.store import runs_dir

    the_plan = plan(load_suite(args.suite), args.data_root, args.variants,
                    tuned_dir=args.params_dir if args.params == "tuned" else None, precision=args.precision)
    for task_name, why in the_plan.skipped_tasks.items():
        print(f"attnbench: skipping optional task {task_name}: {why}")
    for pair in the_plan.tuned_budget:
        print(f"attnbench: warning: {pair}; its tuned parameters may not carry over to this suite's budget")
    the_plan.require_data()
    if not the_plan.specs:
        raise ValueError(f"suite {the_plan.suite.name}: the selection (--variants {args.variants!r}) has no run")
    # A missing checkpoint blocks runs, not the plan: the dry run still lists them, marked, and says what a real
    # bench would refuse with (a dry run trains nothing, so it exits 0).
    missing = the_plan.missing_checkpoints()
    rows = preview_runs(the_plan.specs, read_records(runs_dir(args.runs_dir)), this_device(), args.retry_failed, missing)
    # the rule ends the summary line, which scripts read as the table's last line
    print(format_table(rows, args.workers) + (f"; workers: {args.workers} ({rule})" if rule else ""))
    blocked = [r.key for r in rows if r.status == NO_CHECKPOINT]
    if blocked:
        print(f"attnbench: {len(blocked)} run(s) marked '{NO_CHECKPOINT}': without their checkpoint a real bench refuses the suite "
              f"before anything runs:\n{the_plan.checkpoint_report(blocked)}")
    return 0
